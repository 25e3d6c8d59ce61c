// The GPU context every op records into: the device, its memory arena, the pipeline cache, and
// one command stream.
//
// Recording: dispatches, fills and copies are appended to the current command buffer. Before
// each one the context compares the ranges it reads and writes with those written (or read)
// since the last barrier and inserts a compute barrier only on a real hazard (read-after-write,
// write-after-read, write-after-write). A command buffer is submitted after `max_batch`
// commands so no single submit runs for seconds; finish() waits for everything.
//
// FORJA_PROFILE=1 writes a GPU timestamp around every dispatch and prints, at exit, per op name
// the count, total ms and GFLOP/s (when the op passed its FLOP count). FORJA_PROFILE=shapes does
// the same and files each product under its shape too (ops::gemm: "gemm_cm2 2048x4096x2624 NT").
// Each op's interval runs from the end of everything recorded before it to its own end, so the
// intervals add up to the GPU's busy time; where dispatches overlap (no hazard between them: a
// dequantisation beside a product) the time they share goes to the earlier one.
// FORJA_PROFILE=serial is shapes with a barrier before every dispatch: each op runs alone, so its
// time is its own (with the wait for the barrier). Both change what they measure: on NVIDIA's
// driver a timestamp waits for the work before it, so dispatches that would overlap run one after
// the other (a profiled Qwen3-4B 1x2048 step takes 331 ms against 285; docs/benchmarks.md).
//
// FORJA_SKIP_OPS=prefix[,prefix...] (measuring only: every result is wrong) records no dispatch
// whose op name starts with one of the prefixes, so a step's time with and without an op, at
// full overlap, says what the op costs it.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/memory.h"
#include "gpu/pipeline.h"

namespace forja::gpu {

enum class Access { read, write, read_write };

struct Binding {
  Buffer buffer;
  Access access = Access::read;
};

struct ProfileEntry {
  uint64_t count = 0;
  double total_ns = 0;
  double flops = 0;
};

class Context {
 public:
  explicit Context(std::shared_ptr<Device> device);
  // Opens the chosen device (see Device::open).
  // (Device::open's arguments.)
  static std::unique_ptr<Context> create(int requested_device = -1, bool quiet = false, int slot = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device& device() { return *device_; }
  const DeviceInfo& info() const { return device_->info(); }
  Arena& arena() { return *arena_; }
  PipelineCache& pipelines() { return *pipelines_; }

  Buffer alloc(uint64_t bytes, const std::string& what = "") { return arena_->alloc(bytes, what); }
  void free(const Buffer& b) { arena_->free(b); }

  // Records one dispatch of `pipeline` over `groups` workgroups. `op` names it in profiles;
  // `flops` is its floating-point operation count (0 when not meaningful).
  void dispatch(const Pipeline& pipeline, const std::vector<Binding>& bindings, const void* push,
                uint32_t push_bytes, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1, const char* op = nullptr,
                double flops = 0);
  template <typename Push>
  void dispatch(const Pipeline& pipeline, const std::vector<Binding>& bindings, const Push& push, uint32_t gx,
                uint32_t gy = 1, uint32_t gz = 1, const char* op = nullptr, double flops = 0) {
    dispatch(pipeline, bindings, &push, sizeof(Push), gx, gy, gz, op, flops);
  }
  // Fills `b` with the 32-bit pattern `value` (size must be a multiple of 4).
  void fill(const Buffer& b, uint32_t value);
  void copy(const Buffer& src, const Buffer& dst);

  // Blocking transfers through staging memory (everything recorded before them completes first).
  void upload(const Buffer& dst, const void* src, uint64_t bytes);
  void download(const Buffer& src, void* dst, uint64_t bytes);
  template <typename T>
  void upload(const Buffer& dst, const std::vector<T>& v) { upload(dst, v.data(), v.size() * sizeof(T)); }
  template <typename T>
  std::vector<T> download(const Buffer& src, size_t count) {
    std::vector<T> v(count);
    download(src, v.data(), count * sizeof(T));
    return v;
  }

  // Small writes recorded into the command stream (vkCmdUpdateBuffer, 64 KiB per command): no
  // wait, so a training step's token arrays reach the GPU without draining it. bytes and dst's
  // offset must be multiples of 4.
  void update(const Buffer& dst, const void* src, uint64_t bytes);
  template <typename T>
  void update(const Buffer& dst, const std::vector<T>& v) { update(dst, v.data(), v.size() * sizeof(T)); }
  // Several small reads in one wait (together at most the staging buffer, 64 MiB).
  struct HostRead {
    Buffer src;
    void* dst;
    uint64_t bytes;
  };
  void download(std::initializer_list<HostRead> reads);

  void submit();  // submits what was recorded, does not wait
  void finish();  // submits and waits for all work
  // How many times the host has waited for the GPU to run dry (finish() with work outstanding,
  // blocking transfers included): a training step should add one (train/step.h).
  uint64_t drains() const { return drains_; }

  // Maximum number of commands in one submitted command buffer.
  void set_max_batch(uint32_t n) { max_batch_ = n; }
  bool profiling() const { return profiling_; }
  bool profiling_shapes() const { return profile_shapes_; }  // FORJA_PROFILE=shapes or serial
  // FORJA_SKIP_OPS's prefixes (empty: every dispatch runs), and the dispatches it left out.
  const std::vector<std::string>& skipped_ops() const { return skip_ops_; }
  uint64_t dispatches_skipped() const { return skipped_; }
  const std::map<std::string, ProfileEntry>& profile() const { return profile_; }
  void print_profile() const;
  uint64_t barriers_recorded() const { return barriers_; }

 private:
  struct Batch {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkQueryPool queries = VK_NULL_HANDLE;
    bool recording = false, in_flight = false;
    uint32_t commands = 0;
    std::vector<std::pair<std::string, double>> timed;  // op name, flops per timestamp pair
  };
  struct Range {
    VkBuffer buffer;
    uint64_t begin, end;
  };

  Batch& current();
  void wait(Batch& b);
  void before_command(const std::vector<Binding>& bindings, VkPipelineStageFlags stage);
  void after_command();

  std::shared_ptr<Device> device_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<PipelineCache> pipelines_;
  std::unique_ptr<StagingBuffer> staging_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  std::vector<Batch> batches_;
  size_t active_ = 0;
  uint32_t max_batch_ = 512;
  uint32_t max_timed_ = 512;
  bool profiling_ = false;
  bool profile_shapes_ = false;
  bool profile_serial_ = false;  // FORJA_PROFILE=serial: a barrier before every dispatch
  std::vector<std::string> skip_ops_;  // FORJA_SKIP_OPS
  uint64_t skipped_ = 0;
  // Hazard tracking since the last barrier.
  std::vector<Range> written_, read_;
  uint64_t barriers_ = 0;
  uint64_t drains_ = 0;
  std::map<std::string, ProfileEntry> profile_;
};

}  // namespace forja::gpu
