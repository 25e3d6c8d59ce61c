#include "gpu/pipeline.h"

#include <stdexcept>

#include "gpu/vk_check.h"
#include "kernels/spirv.h"

namespace forja::gpu {

PipelineCache::PipelineCache(std::shared_ptr<Device> device) : device_(std::move(device)) {}

PipelineCache::~PipelineCache() {
  VkDevice dev = device_->handle();
  for (auto& [key, p] : pipelines_) {
    vkDestroyPipeline(dev, p->pipeline, nullptr);
    vkDestroyPipelineLayout(dev, p->layout, nullptr);
  }
  for (auto& [name, m] : modules_) vkDestroyShaderModule(dev, m, nullptr);
  for (auto& [n, l] : set_layouts_) vkDestroyDescriptorSetLayout(dev, l, nullptr);
}

VkDescriptorSetLayout PipelineCache::set_layout(uint32_t bindings) {
  auto it = set_layouts_.find(bindings);
  if (it != set_layouts_.end()) return it->second;
  std::vector<VkDescriptorSetLayoutBinding> b(bindings);
  for (uint32_t i = 0; i < bindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo ci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  ci.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  ci.bindingCount = bindings;
  ci.pBindings = b.data();
  VkDescriptorSetLayout layout;
  VK_CHECK(vkCreateDescriptorSetLayout(device_->handle(), &ci, nullptr, &layout));
  set_layouts_[bindings] = layout;
  return layout;
}

const Pipeline& PipelineCache::get(const kernels::Kernel& kernel, const std::vector<uint32_t>& spec,
                                   uint32_t subgroup_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string variant = kernel.name;
  std::string key = variant;
  for (uint32_t s : spec) key += "," + std::to_string(s);
  if (subgroup_size) key += ";sg" + std::to_string(subgroup_size);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return *it->second;

  const kernels::Spirv* spv = kernel.built ? kernels::find_spirv(variant) : nullptr;
  if (!spv) throw std::runtime_error("kernel variant '" + variant + "' is not built into this forja binary");
  const uint32_t bindings = kernel.bindings, push_bytes = kernel.push_bytes;
  VkShaderModule module;
  auto mit = modules_.find(variant);
  if (mit != modules_.end()) {
    module = mit->second;
  } else {
    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = spv->word_count * sizeof(uint32_t);
    mi.pCode = spv->words;
    VK_CHECK(vkCreateShaderModule(device_->handle(), &mi, nullptr, &module));
    modules_[variant] = module;
  }

  auto p = std::make_unique<Pipeline>();
  p->name = variant;
  p->bindings = bindings;
  p->push_bytes = push_bytes;
  VkDescriptorSetLayout sl = set_layout(bindings);
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  li.setLayoutCount = 1;
  li.pSetLayouts = &sl;
  li.pushConstantRangeCount = push_bytes ? 1 : 0;
  li.pPushConstantRanges = &pcr;
  VK_CHECK(vkCreatePipelineLayout(device_->handle(), &li, nullptr, &p->layout));

  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (uint32_t i = 0; i < spec.size(); ++i) entries[i] = {i, i * 4u, 4u};
  VkSpecializationInfo si{static_cast<uint32_t>(entries.size()), entries.data(), spec.size() * 4u, spec.data()};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = spec.empty() ? nullptr : &si;
  ci.layout = p->layout;
  const DeviceInfo& info = device_->info();
  VkPipelineShaderStageRequiredSubgroupSizeCreateInfo required{
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO};
  if (subgroup_size && info.subgroup_size_control && info.min_subgroup_size != info.max_subgroup_size) {
    required.requiredSubgroupSize = subgroup_size;
    ci.stage.pNext = &required;
    if (info.compute_full_subgroups) ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
  }
  VK_CHECK(vkCreateComputePipelines(device_->handle(), VK_NULL_HANDLE, 1, &ci, nullptr, &p->pipeline));
  const Pipeline& ref = *p;
  pipelines_[key] = std::move(p);
  return ref;
}

}  // namespace forja::gpu
