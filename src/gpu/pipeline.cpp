#include "gpu/pipeline.h"

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>

#include "gpu/vk_check.h"
#include "kernels/spirv.h"

namespace forja::gpu {

namespace {

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
  char buf[64];
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: std::snprintf(buf, sizeof buf, "%" PRId64, s.value.i64); break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: std::snprintf(buf, sizeof buf, "%" PRIu64, s.value.u64); break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: std::snprintf(buf, sizeof buf, "%g", s.value.f64); break;
    default: return "?";
  }
  return buf;
}

// Calls f(properties, info) for every executable of `pipeline` the driver lists.
template <typename F>
void for_each_executable(const Device& device, VkPipeline pipeline, F f) {
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pi.pipeline = pipeline;
  uint32_t n = 0;
  if (device.get_pipeline_executables(device.handle(), &pi, &n, nullptr) != VK_SUCCESS) return;
  std::vector<VkPipelineExecutablePropertiesKHR> exes(n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR});
  device.get_pipeline_executables(device.handle(), &pi, &n, exes.data());
  for (uint32_t i = 0; i < n; ++i) {
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    ei.pipeline = pipeline;
    ei.executableIndex = i;
    f(exes[i], ei);
  }
}

// One line per executable of `pipeline` on stderr: its key (variant and specialization
// constants) and every statistic the driver reports, e.g. NVIDIA's register count, which decides
// how many workgroups share a multiprocessor.
void print_statistics(const Device& device, VkPipeline pipeline, const std::string& key) {
  for_each_executable(device, pipeline, [&](const VkPipelineExecutablePropertiesKHR& exe,
                                            const VkPipelineExecutableInfoKHR& ei) {
    uint32_t m = 0;
    if (device.get_pipeline_statistics(device.handle(), &ei, &m, nullptr) != VK_SUCCESS) return;
    std::vector<VkPipelineExecutableStatisticKHR> stats(m, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    device.get_pipeline_statistics(device.handle(), &ei, &m, stats.data());
    std::string line = "forja: pipeline " + key + " [" + exe.name + ", subgroup " +
                       std::to_string(exe.subgroupSize) + "]:";
    for (const auto& s : stats) line += std::string(" ") + s.name + "=" + statistic_value(s) + ";";
    std::fprintf(stderr, "%s\n", line.c_str());
  });
}

// Every internal representation of `pipeline` (FORJA_PIPELINE_IR) as
// <dir>/<key>.<executable>.<representation>.txt (.bin where not text), names reduced to
// [A-Za-z0-9_,.-].
void write_representations(const Device& device, VkPipeline pipeline, const std::string& key) {
  auto clean = [](std::string s) {
    for (char& c : s)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ',' && c != '.' && c != '-') c = '_';
    return s;
  };
  for_each_executable(device, pipeline, [&](const VkPipelineExecutablePropertiesKHR& exe,
                                            const VkPipelineExecutableInfoKHR& ei) {
    uint32_t m = 0;
    if (device.get_pipeline_representations(device.handle(), &ei, &m, nullptr) != VK_SUCCESS) return;
    std::vector<VkPipelineExecutableInternalRepresentationKHR> reps(
        m, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR});
    if (device.get_pipeline_representations(device.handle(), &ei, &m, reps.data()) != VK_SUCCESS) return;
    std::vector<std::vector<char>> data(m);
    for (uint32_t r = 0; r < m; ++r) {
      data[r].resize(reps[r].dataSize);
      reps[r].pData = data[r].data();
    }
    if (device.get_pipeline_representations(device.handle(), &ei, &m, reps.data()) != VK_SUCCESS) return;
    for (uint32_t r = 0; r < m; ++r) {
      const std::string path = device.pipeline_ir_dir + "/" + clean(key) + "." + clean(exe.name) + "." +
                               clean(reps[r].name) + (reps[r].isText ? ".txt" : ".bin");
      if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
        std::size_t size = reps[r].dataSize;
        if (reps[r].isText && size > 0 && data[r][size - 1] == '\0') --size;
        std::fwrite(data[r].data(), 1, size, f);
        std::fclose(f);
      } else {
        std::fprintf(stderr, "forja: FORJA_PIPELINE_IR: cannot write %s\n", path.c_str());
      }
    }
  });
}

}  // namespace

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
  if (device_->get_pipeline_executables) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  if (device_->get_pipeline_representations) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
  VK_CHECK(vkCreateComputePipelines(device_->handle(), VK_NULL_HANDLE, 1, &ci, nullptr, &p->pipeline));
  if (device_->get_pipeline_executables) print_statistics(*device_, p->pipeline, key);
  if (device_->get_pipeline_representations) write_representations(*device_, p->pipeline, key);
  const Pipeline& ref = *p;
  pipelines_[key] = std::move(p);
  return ref;
}

}  // namespace forja::gpu
