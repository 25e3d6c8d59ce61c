#include "gpu/context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "gpu/vk_check.h"

namespace forja::gpu {

namespace {
constexpr uint64_t kStagingBytes = 64ull << 20;
constexpr VkPipelineStageFlags kStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
}  // namespace

std::unique_ptr<Context> Context::create(int requested_device, bool quiet, int slot) {
  return std::make_unique<Context>(Device::open(requested_device, quiet, slot));
}

Context::Context(std::shared_ptr<Device> device) : device_(std::move(device)) {
  arena_ = std::make_unique<Arena>(device_);
  pipelines_ = std::make_unique<PipelineCache>(device_);
  profiling_ = env_flag("FORJA_PROFILE") && device_->info().timestamps;
  const char* profile = std::getenv("FORJA_PROFILE");
  profile_serial_ = profiling_ && std::string_view(profile) == "serial";
  profile_shapes_ = profiling_ && (std::string_view(profile) == "shapes" || profile_serial_);
  if (profiling_) max_batch_ = std::min(max_batch_, max_timed_);
  if (const char* skip = std::getenv("FORJA_SKIP_OPS")) {
    std::string_view rest(skip);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view prefix = rest.substr(0, comma);
      if (!prefix.empty()) skip_ops_.emplace_back(prefix);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }

  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = device_->queue_family();
  VK_CHECK(vkCreateCommandPool(device_->handle(), &pi, nullptr, &pool_));
  // Two command buffers: one records while the other runs.
  batches_.resize(2);
  for (auto& b : batches_) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VK_CHECK(vkAllocateCommandBuffers(device_->handle(), &ai, &b.cmd));
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VK_CHECK(vkCreateFence(device_->handle(), &fi, nullptr, &b.fence));
    if (profiling_) {
      VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = 2 * max_timed_;
      VK_CHECK(vkCreateQueryPool(device_->handle(), &qi, nullptr, &b.queries));
    }
  }
}

Context::~Context() {
  try {
    finish();
  } catch (...) {
    // a lost device at exit: nothing left to save
  }
  if (profiling_) print_profile();
  VkDevice dev = device_->handle();
  for (auto& b : batches_) {
    if (b.queries) vkDestroyQueryPool(dev, b.queries, nullptr);
    vkDestroyFence(dev, b.fence, nullptr);
  }
  vkDestroyCommandPool(dev, pool_, nullptr);
  staging_.reset();
  pipelines_.reset();
  arena_.reset();
}

Context::Batch& Context::current() {
  Batch& b = batches_[active_];
  if (!b.recording) {
    wait(b);
    VK_CHECK(vkResetCommandBuffer(b.cmd, 0));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    VK_CHECK(vkBeginCommandBuffer(b.cmd, &bi));
    if (b.queries) vkCmdResetQueryPool(b.cmd, b.queries, 0, 2 * max_timed_);
    b.recording = true;
    b.commands = 0;
    b.timed.clear();
  }
  return b;
}

void Context::wait(Batch& b) {
  if (!b.in_flight) return;
  VK_CHECK(vkWaitForFences(device_->handle(), 1, &b.fence, VK_TRUE, UINT64_MAX));
  VK_CHECK(vkResetFences(device_->handle(), 1, &b.fence));
  b.in_flight = false;
  if (b.queries && !b.timed.empty()) {
    std::vector<uint64_t> ts(2 * b.timed.size());
    VK_CHECK(vkGetQueryPoolResults(device_->handle(), b.queries, 0, static_cast<uint32_t>(ts.size()),
                                   ts.size() * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
                                   VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    const double period = device_->info().timestamp_period_ns;
    for (size_t i = 0; i < b.timed.size(); ++i) {
      ProfileEntry& e = profile_[b.timed[i].first];
      e.count++;
      e.total_ns += double(ts[2 * i + 1] - ts[2 * i]) * period;
      e.flops += b.timed[i].second;
    }
    b.timed.clear();
  }
}

void Context::before_command(const std::vector<Binding>& bindings, VkPipelineStageFlags) {
  auto overlaps = [](const std::vector<Range>& list, VkBuffer buf, uint64_t begin, uint64_t end) {
    for (const Range& r : list)
      if (r.buffer == buf && r.begin < end && begin < r.end) return true;
    return false;
  };
  bool hazard = profile_serial_;
  for (const Binding& b : bindings) {
    const uint64_t begin = b.buffer.offset, end = b.buffer.offset + b.buffer.size;
    if (overlaps(written_, b.buffer.buffer, begin, end)) hazard = true;  // RAW or WAW
    if (b.access != Access::read && overlaps(read_, b.buffer.buffer, begin, end)) hazard = true;  // WAR
    if (hazard) break;
  }
  Batch& batch = current();
  if (hazard) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(batch.cmd, kStages, kStages, 0, 1, &mb, 0, nullptr, 0, nullptr);
    written_.clear();
    read_.clear();
    barriers_++;
  }
  for (const Binding& b : bindings) {
    Range r{b.buffer.buffer, b.buffer.offset, b.buffer.offset + b.buffer.size};
    if (b.access == Access::read)
      read_.push_back(r);
    else
      written_.push_back(r);
    if (b.access == Access::read_write) read_.push_back(r);
  }
}

void Context::after_command() {
  Batch& b = batches_[active_];
  if (++b.commands >= max_batch_) submit();
}

void Context::dispatch(const Pipeline& p, const std::vector<Binding>& bindings, const void* push,
                       uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz, const char* op, double flops) {
  if (bindings.size() != p.bindings)
    throw std::logic_error(p.name + ": " + std::to_string(bindings.size()) + " bindings given, pipeline has " +
                           std::to_string(p.bindings));
  if (push_bytes != p.push_bytes)
    throw std::logic_error(p.name + ": push constants of " + std::to_string(push_bytes) + " bytes, pipeline has " +
                           std::to_string(p.push_bytes));
  const DeviceInfo& info = device_->info();
  if (gx == 0 || gy == 0 || gz == 0) return;  // nothing to do
  if (!skip_ops_.empty()) {
    const std::string_view name = op ? std::string_view(op) : std::string_view(p.name);
    for (const std::string& prefix : skip_ops_)
      if (name.starts_with(prefix)) {
        ++skipped_;
        return;  // FORJA_SKIP_OPS: not recorded, so no hazard either
      }
  }
  if (gx > info.max_workgroup_count[0] || gy > info.max_workgroup_count[1] || gz > info.max_workgroup_count[2])
    throw std::logic_error(p.name + ": workgroup count " + std::to_string(gx) + "x" + std::to_string(gy) + "x" +
                           std::to_string(gz) + " exceeds the device limit");
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  std::vector<VkWriteDescriptorSet> writes(bindings.size());
  for (size_t i = 0; i < bindings.size(); ++i) {
    const Buffer& b = bindings[i].buffer;
    if (!b.valid()) throw std::logic_error(p.name + ": binding " + std::to_string(i) + " is not a buffer");
    if (b.size > info.max_storage_buffer_range)
      throw std::logic_error(p.name + ": binding " + std::to_string(i) + " of " + std::to_string(b.size) +
                             " bytes exceeds maxStorageBufferRange (" + std::to_string(info.max_storage_buffer_range) +
                             "); the op must split it");
    if (b.offset % info.min_storage_offset_alignment)
      throw std::logic_error(p.name + ": binding " + std::to_string(i) + " offset " + std::to_string(b.offset) +
                             " is not aligned to minStorageBufferOffsetAlignment");
    infos[i] = {b.buffer, b.offset, b.size};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  before_command(bindings, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
  Batch& batch = batches_[active_];
  vkCmdBindPipeline(batch.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  device_->cmd_push_descriptor_set(batch.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0,
                                   static_cast<uint32_t>(writes.size()), writes.data());
  if (push_bytes) vkCmdPushConstants(batch.cmd, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  const bool timed = batch.queries && batch.timed.size() < max_timed_;
  if (timed) {
    uint32_t q = static_cast<uint32_t>(2 * batch.timed.size());
    // Both timestamps at the bottom of the pipe: the start is written when every earlier command
    // has finished, so the intervals tile the timeline and add up to the GPU's busy time. A start
    // at the top of the pipe is written as soon as the command is reached, while the previous
    // dispatch (or the one it waits on behind a barrier) still runs, and charged that time to
    // this op too: run 28's profiles added up to 11% more than the step.
    vkCmdWriteTimestamp(batch.cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, batch.queries, q);
    vkCmdDispatch(batch.cmd, gx, gy, gz);
    vkCmdWriteTimestamp(batch.cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, batch.queries, q + 1);
    batch.timed.emplace_back(op ? op : p.name, flops);
  } else {
    vkCmdDispatch(batch.cmd, gx, gy, gz);
  }
  after_command();
}

void Context::fill(const Buffer& b, uint32_t value) {
  if (b.size % 4) throw std::logic_error("Context::fill: size not a multiple of 4");
  before_command({{b, Access::write}}, VK_PIPELINE_STAGE_TRANSFER_BIT);
  vkCmdFillBuffer(batches_[active_].cmd, b.buffer, b.offset, b.size, value);
  after_command();
}

void Context::copy(const Buffer& src, const Buffer& dst) {
  if (src.size != dst.size) throw std::logic_error("Context::copy: sizes differ");
  before_command({{src, Access::read}, {dst, Access::write}}, VK_PIPELINE_STAGE_TRANSFER_BIT);
  VkBufferCopy region{src.offset, dst.offset, src.size};
  vkCmdCopyBuffer(batches_[active_].cmd, src.buffer, dst.buffer, 1, &region);
  after_command();
}

void Context::upload(const Buffer& dst, const void* src, uint64_t bytes) {
  if (bytes > dst.size) throw std::logic_error("Context::upload: more bytes than the buffer holds");
  if (!staging_) staging_ = std::make_unique<StagingBuffer>(device_, kStagingBytes);
  const auto* p = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min<uint64_t>(bytes - done, staging_->size());
    finish();  // the staging memory is free again
    std::memcpy(staging_->data(), p + done, n);
    Buffer part = dst.slice(done, n);
    before_command({{part, Access::write}}, VK_PIPELINE_STAGE_TRANSFER_BIT);
    VkBufferCopy region{0, part.offset, n};
    vkCmdCopyBuffer(batches_[active_].cmd, staging_->buffer(), part.buffer, 1, &region);
    after_command();
    done += n;
  }
  finish();
}

void Context::update(const Buffer& dst, const void* src, uint64_t bytes) {
  if (bytes > dst.size) throw std::logic_error("Context::update: more bytes than the buffer holds");
  if (bytes % 4 || dst.offset % 4) throw std::logic_error("Context::update: bytes and offset must be multiples of 4");
  constexpr uint64_t kMaxUpdate = 65536;  // vkCmdUpdateBuffer's limit per command
  const auto* p = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes; done += kMaxUpdate) {
    const uint64_t n = std::min(kMaxUpdate, bytes - done);
    const Buffer part = dst.slice(done, n);
    before_command({{part, Access::write}}, VK_PIPELINE_STAGE_TRANSFER_BIT);
    vkCmdUpdateBuffer(batches_[active_].cmd, part.buffer, part.offset, n, p + done);
    after_command();
  }
}

void Context::download(std::initializer_list<HostRead> reads) {
  if (!staging_) staging_ = std::make_unique<StagingBuffer>(device_, kStagingBytes);
  uint64_t at = 0;
  std::vector<uint64_t> places;
  for (const HostRead& r : reads) {
    if (r.bytes > r.src.size) throw std::logic_error("Context::download: more bytes than the buffer holds");
    at = (at + 15) / 16 * 16;
    if (at + r.bytes > staging_->size()) throw std::logic_error("Context::download: the reads exceed the staging buffer");
    const Buffer part = r.src.slice(0, r.bytes);
    before_command({{part, Access::read}}, VK_PIPELINE_STAGE_TRANSFER_BIT);
    const VkBufferCopy region{part.offset, at, r.bytes};
    vkCmdCopyBuffer(batches_[active_].cmd, part.buffer, staging_->buffer(), 1, &region);
    after_command();
    places.push_back(at);
    at += r.bytes;
  }
  // The host reads the staging memory after the fence: make the transfers' writes visible.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(current().cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                       nullptr, 0, nullptr);
  finish();
  size_t i = 0;
  for (const HostRead& r : reads) std::memcpy(r.dst, static_cast<const uint8_t*>(staging_->data()) + places[i++], r.bytes);
}

void Context::download(const Buffer& src, void* dst, uint64_t bytes) {
  if (bytes > src.size) throw std::logic_error("Context::download: more bytes than the buffer holds");
  if (!staging_) staging_ = std::make_unique<StagingBuffer>(device_, kStagingBytes);
  auto* p = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < bytes;) {  // a staging buffer's worth at a time
    const uint64_t n = std::min<uint64_t>(bytes - done, staging_->size());
    download({{src.slice(done, n), p + done, n}});
    done += n;
  }
}

void Context::submit() {
  Batch& b = batches_[active_];
  if (!b.recording) return;
  VK_CHECK(vkEndCommandBuffer(b.cmd));
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &b.cmd;
  VK_CHECK(vkQueueSubmit(device_->queue(), 1, &si, b.fence));
  b.recording = false;
  b.in_flight = true;
  active_ = (active_ + 1) % batches_.size();
}

void Context::finish() {
  submit();
  bool outstanding = false;
  for (const auto& b : batches_) outstanding = outstanding || b.in_flight;
  if (outstanding) ++drains_;
  for (auto& b : batches_) wait(b);
}

void Context::print_profile() const {
  if (profile_.empty()) return;
  std::vector<std::pair<std::string, ProfileEntry>> rows(profile_.begin(), profile_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
  double total = 0;
  for (const auto& r : rows) total += r.second.total_ns;
  std::fprintf(stderr, "forja: GPU profile (%s)\n  %-40s %8s %12s %7s %10s\n", device_->info().name.c_str(), "op",
               "count", "total ms", "share", "GFLOP/s");
  for (const auto& [name, e] : rows) {
    std::fprintf(stderr, "  %-40s %8llu %12.3f %6.1f%%", name.c_str(), static_cast<unsigned long long>(e.count),
                 e.total_ns * 1e-6, 100.0 * e.total_ns / total);
    if (e.flops > 0 && e.total_ns > 0)
      std::fprintf(stderr, " %10.1f\n", e.flops / e.total_ns);
    else
      std::fprintf(stderr, " %10s\n", "-");
  }
}

}  // namespace forja::gpu
