#include "gpu/memory.h"

#include <algorithm>
#include <stdexcept>

#include "gpu/vk_check.h"
#include "util/test_hooks.h"

namespace forja::gpu {

namespace {
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string mib(uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; }

// Test hook: FORJA_TEST_GPU_MEMORY_MIB=N makes every allocation that would take the arena past
// N MiB fail as the driver fails it (VK_ERROR_OUT_OF_DEVICE_MEMORY), so the tests can check
// what a GPU out of memory does on lavapipe, which has all of the machine's memory
// (util/test_hooks.h).
uint64_t test_memory_limit() { return test_hooks().gpu_memory_limit_bytes; }
}  // namespace

Buffer Buffer::slice(uint64_t byte_offset, uint64_t byte_size) const {
  if (byte_offset + byte_size > size)
    throw std::out_of_range("Buffer::slice [" + std::to_string(byte_offset) + ", +" + std::to_string(byte_size) +
                            ") outside a view of " + std::to_string(size) + " bytes");
  Buffer b = *this;
  b.offset += byte_offset;
  b.size = byte_size;
  return b;
}

Arena::Arena(std::shared_ptr<Device> device, uint64_t block_bytes) : device_(std::move(device)) {
  const DeviceInfo& info = device_->info();
  alignment_ = std::max<uint64_t>(16, info.min_storage_offset_alignment);
  // Ordinary blocks: 1 GiB, or the allocation limit when that is smaller.
  block_bytes_ = block_bytes ? block_bytes : std::min<uint64_t>(1ull << 30, info.max_allocation_size);
  track_names_ = env_flag("FORJA_ARENA_PEAK");
}

Arena::~Arena() {
  for (auto& b : blocks_) {
    vkDestroyBuffer(device_->handle(), b.buffer, nullptr);
    vkFreeMemory(device_->handle(), b.memory, nullptr);
  }
}

uint32_t Arena::new_block(uint64_t bytes) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  Block block;
  block.size = bytes;
  VK_CHECK(vkCreateBuffer(device_->handle(), &bi, nullptr, &block.buffer));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_->handle(), block.buffer, &req);
  int type = device_->find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  if (type < 0) type = device_->find_memory_type(req.memoryTypeBits, 0);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = static_cast<uint32_t>(type);
  const uint64_t limit = test_memory_limit();
  VkResult r = limit && bytes_reserved() + req.size > limit
                   ? VK_ERROR_OUT_OF_DEVICE_MEMORY
                   : vkAllocateMemory(device_->handle(), &ai, nullptr, &block.memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(device_->handle(), block.buffer, nullptr);
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
      throw OutOfMemory("GPU out of memory allocating a block of " + mib(bytes) + " (" + mib(bytes_reserved()) +
                        " already reserved)");
    VK_CHECK(r);
  }
  VK_CHECK(vkBindBufferMemory(device_->handle(), block.buffer, block.memory, 0));
  block.free_ranges[0] = bytes;
  blocks_.push_back(std::move(block));
  return static_cast<uint32_t>(blocks_.size() - 1);
}

Buffer Arena::alloc(uint64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t need = round_up(std::max<uint64_t>(bytes, 1), alignment_);
  if (need > device_->info().max_allocation_size)
    throw OutOfMemory("a buffer of " + mib(need) + (what.empty() ? "" : " for " + what) +
                      " exceeds the device's largest allocation (" + mib(device_->info().max_allocation_size) + ")");
  auto take = [&](uint32_t bi) -> Buffer {
    Block& b = blocks_[bi];
    for (auto it = b.free_ranges.begin(); it != b.free_ranges.end(); ++it) {
      if (it->second < need) continue;
      uint64_t off = it->first, len = it->second;
      b.free_ranges.erase(it);
      if (len > need) b.free_ranges[off + need] = len - need;
      b.used[off] = need;
      in_use_ += need;
      if (track_names_) names_[{bi, off}] = what;
      if (in_use_ > peak_) {
        peak_ = in_use_;
        if (track_names_) note_peak();
      }
      return Buffer{b.buffer, off, need, bi};  // whole aligned extent: kernels may read it
    }
    return Buffer{};
  };
  for (uint32_t i = 0; i < blocks_.size(); ++i) {
    Buffer b = take(i);
    if (b.valid()) return b;
  }
  try {
    uint32_t bi = new_block(std::max(need, block_bytes_));
    return take(bi);
  } catch (const OutOfMemory&) {
    if (need < block_bytes_) {  // a smaller block may still fit
      uint32_t bi = new_block(need);
      return take(bi);
    }
    throw;
  }
}

void Arena::free(const Buffer& buf) {
  if (!buf.valid()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Block& b = blocks_.at(buf.block);
  auto it = b.used.find(buf.offset);
  if (it == b.used.end()) throw std::logic_error("Arena::free of a buffer it did not allocate");
  uint64_t off = it->first, len = it->second;
  b.used.erase(it);
  in_use_ -= len;
  if (track_names_) names_.erase({buf.block, off});
  auto next = b.free_ranges.lower_bound(off);
  if (next != b.free_ranges.end() && next->first == off + len) {
    len += next->second;
    next = b.free_ranges.erase(next);
  }
  if (next != b.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  b.free_ranges[off] = len;
}

void Arena::note_peak() {
  peak_names_.clear();
  for (const auto& [where, name] : names_) peak_names_[name] += blocks_[where.first].used.at(where.second);
}

std::vector<std::pair<std::string, uint64_t>> Arena::peak_breakdown() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, uint64_t>> v(peak_names_.begin(), peak_names_.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

uint64_t Arena::bytes_reserved() const {
  uint64_t total = 0;
  for (const auto& b : blocks_) total += b.size;
  return total;
}

StagingBuffer::StagingBuffer(std::shared_ptr<Device> device, uint64_t bytes) : device_(std::move(device)), size_(bytes) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  VK_CHECK(vkCreateBuffer(device_->handle(), &bi, nullptr, &buffer_));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_->handle(), buffer_, &req);
  // Cached host memory reads back fast; coherent avoids explicit flushes.
  int type = device_->find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                               VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                                               VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  if (type < 0)
    type = device_->find_memory_type(req.memoryTypeBits,
                                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  if (type < 0) throw std::runtime_error("no host-visible coherent memory type for staging");
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = static_cast<uint32_t>(type);
  VK_CHECK(vkAllocateMemory(device_->handle(), &ai, nullptr, &memory_));
  VK_CHECK(vkBindBufferMemory(device_->handle(), buffer_, memory_, 0));
  VK_CHECK(vkMapMemory(device_->handle(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_));
}

StagingBuffer::~StagingBuffer() {
  if (mapped_) vkUnmapMemory(device_->handle(), memory_);
  vkDestroyBuffer(device_->handle(), buffer_, nullptr);
  vkFreeMemory(device_->handle(), memory_, nullptr);
}

}  // namespace forja::gpu
