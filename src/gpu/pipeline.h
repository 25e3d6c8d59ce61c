// Compute pipelines from the embedded SPIR-V (src/kernels, cmake/shaders.cmake), created once
// per (variant, specialization constants) and cached. Every kernel binds its buffers as storage
// buffers 0..n-1 of set 0 through push descriptors, and takes one push-constant block; both
// counts come from the kernel table (kernels/kernel.h), read from the shader's own SPIR-V.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "kernels/kernel.h"

namespace forja::gpu {

struct Pipeline {
  std::string name;  // variant name, used for profiling
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  uint32_t bindings = 0;
  uint32_t push_bytes = 0;
};

class PipelineCache {
 public:
  explicit PipelineCache(std::shared_ptr<Device> device);
  ~PipelineCache();
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  // The pipeline of `kernel` with specialization constants 0..n-1 = `spec`. Throws when the
  // variant was not built into this binary. `subgroup_size` > 0 requires that subgroup size
  // (and full subgroups) where the device lets the application choose (subgroup size control):
  // kernels whose cooperative matrices assume it pass the size they were specialised for.
  const Pipeline& get(const kernels::Kernel& kernel, const std::vector<uint32_t>& spec = {},
                      uint32_t subgroup_size = 0);

 private:
  VkDescriptorSetLayout set_layout(uint32_t bindings);

  std::shared_ptr<Device> device_;
  std::map<uint32_t, VkDescriptorSetLayout> set_layouts_;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
  std::map<std::string, VkShaderModule> modules_;
  std::mutex mutex_;
};

}  // namespace forja::gpu
