// GPU memory: a few large device-local blocks, each bound to one VkBuffer, sub-allocated with
// alignment (first fit, coalescing frees). A Buffer is a view (VkBuffer, offset, size) into a
// block; kernels bind views, never whole blocks, and no binding may exceed the device's
// maxStorageBufferRange (128 MiB on lavapipe): ops split larger tensors.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.h"

namespace forja::gpu {

// A range of device memory. Cheap to copy; does not own memory (the Arena does).
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0;  // bytes from the start of `buffer`
  uint64_t size = 0;    // bytes
  uint32_t block = 0;   // arena block index (for free)

  bool valid() const { return buffer != VK_NULL_HANDLE; }
  // A sub-range [offset, offset + size) of this view, in bytes.
  Buffer slice(uint64_t byte_offset, uint64_t byte_size) const;
};

class Arena {
 public:
  // `block_bytes`: size of ordinary blocks (larger requests get a block of their own).
  explicit Arena(std::shared_ptr<Device> device, uint64_t block_bytes = 0);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // A view of at least `bytes`: the size is rounded up to the storage-offset alignment (and
  // 16), so vector loads never leave the binding. Throws OutOfMemory.
  Buffer alloc(uint64_t bytes, const std::string& what = "");
  void free(const Buffer& b);

  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t peak_bytes() const { return peak_; }
  // With FORJA_ARENA_PEAK=1 in the environment when the arena was made: what was live at the
  // peak, bytes per allocation name (alloc's `what`; "" unnamed), largest first. Empty otherwise.
  // For checking the memory plan (model/memory_plan.h) against what the engine allocates.
  std::vector<std::pair<std::string, uint64_t>> peak_breakdown() const;
  uint64_t bytes_reserved() const;  // sum of block sizes
  uint64_t alignment() const { return alignment_; }

 private:
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    uint64_t size = 0;
    std::map<uint64_t, uint64_t> free_ranges;  // offset -> size
    std::map<uint64_t, uint64_t> used;         // offset -> size
  };
  uint32_t new_block(uint64_t bytes);

  std::shared_ptr<Device> device_;
  uint64_t block_bytes_ = 0;
  uint64_t alignment_ = 16;
  std::vector<Block> blocks_;
  uint64_t in_use_ = 0, peak_ = 0;
  // FORJA_ARENA_PEAK: the name of every live allocation (block, offset), and the live bytes per
  // name at the last new peak.
  bool track_names_ = false;
  std::map<std::pair<uint32_t, uint64_t>, std::string> names_;
  std::map<std::string, uint64_t> peak_names_;
  void note_peak();
  mutable std::mutex mutex_;
};

// Host-visible memory for transfers to and from the device.
class StagingBuffer {
 public:
  StagingBuffer(std::shared_ptr<Device> device, uint64_t bytes);
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  VkBuffer buffer() const { return buffer_; }
  void* data() const { return mapped_; }
  uint64_t size() const { return size_; }

 private:
  std::shared_ptr<Device> device_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace forja::gpu
