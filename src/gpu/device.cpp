#include "gpu/device.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "gpu/vk_check.h"
#include "util/error.h"

// Debian 12's headers (1.3.239) predate VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2;
// their structures and queries are declared here. Values from the Vulkan registry (vk.xml).
namespace {
constexpr VkStructureType kStructureTypeCoopMatFeaturesKHR = static_cast<VkStructureType>(1000506000);
constexpr VkStructureType kStructureTypeCoopMatPropsKHR = static_cast<VkStructureType>(1000506001);
constexpr VkStructureType kStructureTypeCoopMat2FeaturesNV = static_cast<VkStructureType>(1000593000);
constexpr VkStructureType kStructureTypeCoopMatFlexPropsNV = static_cast<VkStructureType>(1000593001);
constexpr VkStructureType kStructureTypeCoopMat2PropsNV = static_cast<VkStructureType>(1000593002);
constexpr uint32_t kScopeSubgroup = 3, kScopeWorkgroup = 2;  // VkScopeKHR
struct CoopMatFeaturesKHR {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
};
struct CoopMatPropsKHR {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize, NSize, KSize;
  VkComponentTypeNV AType, BType, CType, ResultType;
  VkBool32 saturatingAccumulation;
  uint32_t scope;
};
struct CoopMat2FeaturesNV {
  VkStructureType sType;
  void* pNext;
  VkBool32 workgroupScope, flexibleDimensions, reductions, conversions, perElementOperations, tensorAddressing,
      blockLoads;
};
struct CoopMat2PropsNV {
  VkStructureType sType;
  void* pNext;
  uint32_t workgroupScopeMaxWorkgroupSize, flexibleDimensionsMaxDimension, workgroupScopeReservedSharedMemory;
};
struct CoopMatFlexPropsNV {
  VkStructureType sType;
  void* pNext;
  uint32_t MGranularity, NGranularity, KGranularity;
  VkComponentTypeNV AType, BType, CType, ResultType;
  VkBool32 saturatingAccumulation;
  uint32_t scope;
  uint32_t workgroupInvocations;
};
using PFN_GetCoopMatPropsKHR = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*, CoopMatPropsKHR*);
using PFN_GetCoopMatFlexPropsNV = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*, CoopMatFlexPropsNV*);
}  // namespace

namespace forja::gpu {

const char* vk_result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_INCOMPLETE: return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult(other)";
  }
}

void vk_fail(VkResult r, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << call << " failed with " << vk_result_name(r) << " (" << static_cast<int>(r) << ") at "
     << file << ":" << line;
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
    throw OutOfMemory(os.str());
  if (r == VK_ERROR_DEVICE_LOST)
    throw DeviceLost(os.str() + ": the GPU was lost (a driver reset, a hang or a GPU fault)");
  if (r == VK_ERROR_FEATURE_NOT_PRESENT || r == VK_ERROR_EXTENSION_NOT_PRESENT || r == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw Unsupported(os.str() + ": the driver lacks what forja needs; update it, or choose another device "
                      "(--device, see forja devices)");
  throw std::runtime_error(os.str());
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

bool env_flag_default_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

namespace {

std::atomic<uint64_t> g_validation_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                              VkDebugUtilsMessageTypeFlagsEXT,
                                              const VkDebugUtilsMessengerCallbackDataEXT* data,
                                              void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    g_validation_messages.fetch_add(1);
    std::fprintf(stderr, "forja: Vulkan validation: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

const char* component_name(VkComponentTypeNV t) {
  switch (t) {
    case VK_COMPONENT_TYPE_FLOAT16_NV: return "f16";
    case VK_COMPONENT_TYPE_FLOAT32_NV: return "f32";
    case VK_COMPONENT_TYPE_FLOAT64_NV: return "f64";
    case VK_COMPONENT_TYPE_SINT8_NV: return "s8";
    case VK_COMPONENT_TYPE_SINT32_NV: return "s32";
    case VK_COMPONENT_TYPE_UINT8_NV: return "u8";
    case VK_COMPONENT_TYPE_UINT32_NV: return "u32";
    default:
      // VK_COMPONENT_TYPE_BFLOAT16_KHR, newer than Debian 12's headers
      return static_cast<uint32_t>(t) == 1000141000u ? "bf16" : "other";
  }
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

std::vector<VkExtensionProperties> device_extensions(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
  return exts;
}

DeviceInfo probe(VkInstance instance, VkPhysicalDevice pd, uint32_t index) {
  DeviceInfo d;
  d.index = index;
  auto exts = device_extensions(pd);

  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceSubgroupSizeControlProperties sgctl{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES};
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &subgroup;
  subgroup.pNext = &driver;
  driver.pNext = &m3;
  m3.pNext = &sgctl;
  VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
  VkPhysicalDeviceShaderCorePropertiesAMD amd{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
  void** tail = &sgctl.pNext;
  if (has_extension(exts, "VK_NV_shader_sm_builtins")) {
    *tail = &sm;
    tail = &sm.pNext;
  }
  if (has_extension(exts, "VK_AMD_shader_core_properties")) *tail = &amd;
  vkGetPhysicalDeviceProperties2(pd, &props);
  d.compute_units = sm.shaderSMCount ? sm.shaderSMCount
                                     : amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray;
  const VkPhysicalDeviceLimits& lim = props.properties.limits;

  d.name = props.properties.deviceName;
  d.type = props.properties.deviceType;
  d.vendor_id = props.properties.vendorID;
  d.api_version = props.properties.apiVersion;
  d.driver_name = driver.driverName;
  d.driver_info = driver.driverInfo;
  d.subgroup_size = subgroup.subgroupSize;
  d.min_subgroup_size = sgctl.minSubgroupSize ? sgctl.minSubgroupSize : subgroup.subgroupSize;
  d.max_subgroup_size = sgctl.maxSubgroupSize ? sgctl.maxSubgroupSize : subgroup.subgroupSize;
  d.max_shared_memory = lim.maxComputeSharedMemorySize;
  d.max_storage_buffer_range = lim.maxStorageBufferRange;
  d.max_allocation_size = m3.maxMemoryAllocationSize;
  d.min_storage_offset_alignment = lim.minStorageBufferOffsetAlignment;
  d.max_push_constants = lim.maxPushConstantsSize;
  for (int i = 0; i < 3; ++i) d.max_workgroup_count[i] = lim.maxComputeWorkGroupCount[i];
  d.max_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
  d.timestamp_period_ns = lim.timestampPeriod;
  d.timestamps = lim.timestampComputeAndGraphics;
  d.max_buffer_size = d.max_allocation_size;

  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceSubgroupSizeControlFeatures fsg{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fcm{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  f11.pNext = &f12;
  f12.pNext = &fsg;
  const bool nv_ext = has_extension(exts, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  if (nv_ext) fsg.pNext = &fcm;
  vkGetPhysicalDeviceFeatures2(pd, &feats);
  d.shader_float16 = f12.shaderFloat16;
  d.storage_buffer_16bit = f11.storageBuffer16BitAccess;
  d.shader_int64 = feats.features.shaderInt64;
  d.vulkan_memory_model = f12.vulkanMemoryModel;
  d.subgroup_size_control = fsg.subgroupSizeControl;
  d.compute_full_subgroups = fsg.computeFullSubgroups;
  d.push_descriptor = has_extension(exts, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  d.memory_budget_ext = has_extension(exts, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  if (has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fpe{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &fpe};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    d.pipeline_executable_info = fpe.pipelineExecutableInfo;
  }

  if (nv_ext && fcm.cooperativeMatrix) {
    auto fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    if (fn) {
      uint32_t n = 0;
      fn(pd, &n, nullptr);
      std::vector<VkCooperativeMatrixPropertiesNV> shapes(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
      fn(pd, &n, shapes.data());
      d.nv_coopmat = true;
      for (const auto& s : shapes) {
        CoopMatShape c{s.MSize, s.NSize, s.KSize, component_name(s.AType), component_name(s.BType),
                       component_name(s.CType), component_name(s.DType), s.scope == VK_SCOPE_SUBGROUP_NV};
        d.nv_coopmat_shapes.push_back(c);
        if (c.m == 16 && c.n == 16 && c.k == 16 && c.a_type == "f16" && c.b_type == "f16" &&
            c.c_type == "f32" && c.result_type == "f32" && c.subgroup_scope)
          d.nv_coopmat_f16_f32_16x16x16 = true;
      }
    }
  }
  const bool api13 = VK_API_VERSION_MINOR(d.api_version) >= 3 || VK_API_VERSION_MAJOR(d.api_version) > 1;
  if (api13 && has_extension(exts, "VK_KHR_cooperative_matrix")) {
    CoopMatFeaturesKHR fk{kStructureTypeCoopMatFeaturesKHR, nullptr, VK_FALSE, VK_FALSE};
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &fk};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    auto fn = reinterpret_cast<PFN_GetCoopMatPropsKHR>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    if (fn && fk.cooperativeMatrix) {
      uint32_t n = 0;
      fn(pd, &n, nullptr);
      std::vector<CoopMatPropsKHR> shapes(n);
      for (auto& s : shapes) s = CoopMatPropsKHR{kStructureTypeCoopMatPropsKHR, nullptr};
      fn(pd, &n, shapes.data());
      d.khr_coopmat = true;
      for (const auto& s : shapes)
        d.khr_coopmat_shapes.push_back({s.MSize, s.NSize, s.KSize, component_name(s.AType),
                                        component_name(s.BType), component_name(s.CType),
                                        component_name(s.ResultType), s.scope == kScopeSubgroup});
    }
  }
  if (d.khr_coopmat) d.khr_fragment = choose_khr_fragment(d.khr_coopmat_shapes, d.subgroup_size);
  if (d.khr_coopmat && has_extension(exts, "VK_NV_cooperative_matrix2")) {
    CoopMat2FeaturesNV f{kStructureTypeCoopMat2FeaturesNV};
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    CoopMat2PropsNV p{kStructureTypeCoopMat2PropsNV};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &p};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    auto fn = reinterpret_cast<PFN_GetCoopMatFlexPropsNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"));
    // forja's kernels need workgroup-scope matrices of flexible size, tensor addressing and
    // conversions (fp32 A to fp16).
    if (fn && f.workgroupScope && f.flexibleDimensions && f.tensorAddressing && f.conversions) {
      d.nv_coopmat2 = true;
      d.nv_coopmat2_max_workgroup = p.workgroupScopeMaxWorkgroupSize;
      d.nv_coopmat2_max_dimension = p.flexibleDimensionsMaxDimension;
      uint32_t n = 0;
      fn(pd, &n, nullptr);
      std::vector<CoopMatFlexPropsNV> flex(n);
      for (auto& e : flex) e = CoopMatFlexPropsNV{kStructureTypeCoopMatFlexPropsNV, nullptr};
      fn(pd, &n, flex.data());
      for (const auto& e : flex) {
        if (e.scope != kScopeWorkgroup) continue;
        d.nv_coopmat2_workgroup_shapes.push_back({e.MGranularity, e.NGranularity, e.KGranularity,
                                                  component_name(e.AType), component_name(e.BType),
                                                  component_name(e.CType), component_name(e.ResultType), false,
                                                  e.workgroupInvocations});
      }
    }
  }
  // A coopmat kernel written for subgroups of 32 only runs where that is the subgroup size.
  if (d.subgroup_size != 32) d.nv_coopmat_f16_f32_16x16x16 = false;

  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mem{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (d.memory_budget_ext) mem.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(pd, &mem);
  for (uint32_t i = 0; i < mem.memoryProperties.memoryHeapCount; ++i) {
    MemoryHeapInfo h;
    h.size = mem.memoryProperties.memoryHeaps[i].size;
    h.device_local = mem.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
    h.budget = d.memory_budget_ext ? budget.heapBudget[i] : h.size;
    d.heaps.push_back(h);
  }
  return d;
}

std::string version_string(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) +
         "." + std::to_string(VK_API_VERSION_PATCH(v));
}

std::string bytes_string(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / double(1ull << 20));
  return buf;
}

}  // namespace

KhrFragment choose_khr_fragment(const std::vector<CoopMatShape>& shapes, uint32_t subgroup_size) {
  KhrFragment best;
  auto volume = [](const KhrFragment& f) { return uint64_t(f.m) * f.n * f.k; };
  for (const CoopMatShape& s : shapes) {
    if (!s.subgroup_scope || s.a_type != "f16" || s.b_type != "f16" || s.c_type != "f32" || s.result_type != "f32")
      continue;
    auto side_ok = [](uint32_t x) { return x == 8 || x == 16 || x == 32; };  // divides the kernels' tiles
    if (!side_ok(s.m) || !side_ok(s.n) || !side_ok(s.k) || subgroup_size == 0 || (s.m * s.n) % subgroup_size)
      continue;
    const KhrFragment f{s.m, s.n, s.k, subgroup_size};
    const bool square16 = f.m == 16 && f.n == 16 && f.k == 16;
    if (best.m == 0 || volume(f) > volume(best) || (volume(f) == volume(best) && square16)) best = f;
  }
  return best;
}

std::string DeviceInfo::type_name() const {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

uint64_t DeviceInfo::device_local_bytes() const {
  uint64_t total = 0;
  for (const auto& h : heaps)
    if (h.device_local) total += h.size;
  return total;
}

std::string DeviceInfo::describe() const {
  std::ostringstream os;
  os << "device " << index << ": " << name << " (" << type_name() << ")\n";
  os << "  Vulkan " << version_string(api_version) << ", driver " << driver_name << " " << driver_info << "\n";
  os << "  fp16 arithmetic: " << (shader_float16 ? "yes" : "no")
     << ", 16-bit storage: " << (storage_buffer_16bit ? "yes" : "no")
     << ", push descriptors: " << (push_descriptor ? "yes" : "no") << "\n";
  os << "  subgroup size " << subgroup_size;
  if (min_subgroup_size != max_subgroup_size) os << " (" << min_subgroup_size << ".." << max_subgroup_size << ")";
  os << ", shared memory " << max_shared_memory / 1024 << " KiB, max storage buffer range "
     << bytes_string(max_storage_buffer_range);
  if (compute_units) os << ", " << compute_units << " compute units";
  os << "\n";
  os << "  memory heaps:";
  for (size_t i = 0; i < heaps.size(); ++i)
    os << (i ? "," : "") << " " << bytes_string(heaps[i].size) << (heaps[i].device_local ? " device-local" : " host")
       << (memory_budget_ext ? " (budget " + bytes_string(heaps[i].budget) + ")" : "");
  os << "\n";
  auto shapes = [&](const char* label, bool have, const std::vector<CoopMatShape>& v) {
    os << "  " << label << " cooperative matrix: ";
    if (!have) {
      os << "no\n";
      return;
    }
    if (v.empty()) os << "yes";
    for (const auto& s : v)
      os << "[" << s.m << "x" << s.n << "x" << s.k << " " << s.a_type << "*" << s.b_type << "+" << s.c_type
         << "->" << s.result_type << "] ";
    os << "\n";
  };
  shapes("NV", nv_coopmat, nv_coopmat_shapes);
  shapes("KHR", khr_coopmat, khr_coopmat_shapes);
  os << "  NV cooperative matrix 2: ";
  if (!nv_coopmat2) {
    os << "no\n";
  } else {
    os << "workgroup scope up to " << nv_coopmat2_max_workgroup << " invocations, dimensions up to "
       << nv_coopmat2_max_dimension << "; ";
    for (const auto& s : nv_coopmat2_workgroup_shapes)
      os << "[" << s.m << "x" << s.n << "x" << s.k << " " << s.a_type << "*" << s.b_type << "+" << s.c_type << "->"
         << s.result_type << " @" << s.workgroup_invocations << "] ";
    os << "\n";
  }
  return os.str();
}

// ------------------------------------------------------------------------------ Instance

Instance::Instance(bool validation) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "forja";
  // 1.3: the KHR / NV2 cooperative-matrix kernels are SPIR-V 1.6. The device's own version
  // still bounds what is used (the other kernels are SPIR-V 1.5).
  app.apiVersion = VK_API_VERSION_1_3;

  std::vector<const char*> layers, extensions;
  if (validation) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, nullptr);
    std::vector<VkLayerProperties> avail(n);
    vkEnumerateInstanceLayerProperties(&n, avail.data());
    bool found = std::any_of(avail.begin(), avail.end(), [](const VkLayerProperties& l) {
      return std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
    });
    if (!found)
      throw UserError("FORJA_VALIDATE is set but the Vulkan validation layer is not installed "
                      "(Debian/Ubuntu: apt-get install vulkan-validationlayers)");
    layers.push_back("VK_LAYER_KHRONOS_validation");
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  ci.ppEnabledExtensionNames = extensions.data();
  VkResult r = vkCreateInstance(&ci, nullptr, &instance_);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
    throw Unsupported(std::string("no Vulkan driver found (vkCreateInstance: ") + vk_result_name(r) +
                    "); install your GPU's Vulkan driver, or Mesa's CPU driver lavapipe "
                    "(Debian/Ubuntu: apt-get install mesa-vulkan-drivers)");
  VK_CHECK(r);
  validation_ = validation;

  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = debug_callback;
    if (create) VK_CHECK(create(instance_, &mi, nullptr, &messenger_));
  }

  uint32_t n = 0;
  VK_CHECK(vkEnumeratePhysicalDevices(instance_, &n, nullptr));
  physical_.resize(n);
  VK_CHECK(vkEnumeratePhysicalDevices(instance_, &n, physical_.data()));
  for (uint32_t i = 0; i < n; ++i) devices_.push_back(probe(instance_, physical_[i], i));
  if (devices_.empty())
    throw Unsupported("the Vulkan loader found no device; install your GPU's Vulkan driver, or Mesa's CPU "
                    "driver lavapipe (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)");
}

Instance::~Instance() {
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

uint64_t Instance::validation_messages() const { return g_validation_messages.load(); }

uint32_t Instance::choose(int requested, int slot) const {
  const uint32_t n = static_cast<uint32_t>(devices_.size());
  auto list = [&] {
    std::string s;
    for (const auto& d : devices_) s += (s.empty() ? "" : ", ") + std::to_string(d.index) + " = " + d.name;
    return s;
  };
  if (requested < 0) {
    if (const char* env = std::getenv("FORJA_DEVICE"); env && *env) {
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (*end || v < 0)
        throw UserError(std::string("FORJA_DEVICE=") + env + " is not a device index; devices: " + list());
      requested = static_cast<int>(v);
    }
  }
  if (requested >= 0) {
    if (static_cast<uint32_t>(requested) >= n)
      throw UserError("device " + std::to_string(requested) + " does not exist; found " + std::to_string(n) +
                      " Vulkan device" + (n == 1 ? "" : "s") + ": " + list() + " (see forja devices)");
    return static_cast<uint32_t>(requested);
  }
  for (VkPhysicalDeviceType t : {VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
                                 VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU}) {
    std::vector<uint32_t> of_kind;
    for (const auto& d : devices_)
      if (d.type == t) of_kind.push_back(d.index);
    if (!of_kind.empty()) return of_kind[size_t(std::max(slot, 0)) % of_kind.size()];
  }
  return 0;
}

// ------------------------------------------------------------------------------ Device

std::shared_ptr<Device> Device::open(int requested, bool quiet, int slot) {
  auto instance = std::make_shared<Instance>(env_flag("FORJA_VALIDATE"));
  uint32_t index = instance->choose(requested, slot);
  if (!quiet && instance->devices()[index].is_cpu())
    std::fprintf(stderr,
                 "forja: using %s, which is the CPU (Mesa lavapipe): fine for tests and tiny models, "
                 "slow for real ones\n",
                 instance->devices()[index].name.c_str());
  return std::make_shared<Device>(instance, index);
}

Device::Device(std::shared_ptr<Instance> instance, uint32_t index)
    : instance_(std::move(instance)), physical_(instance_->physical(index)), info_(instance_->devices()[index]) {
  if (!info_.push_descriptor)
    throw Unsupported("device " + info_.name + " lacks VK_KHR_push_descriptor, which forja needs; update its driver");
  if (VK_API_VERSION_MINOR(info_.api_version) < 2 && VK_API_VERSION_MAJOR(info_.api_version) == 1)
    throw Unsupported("device " + info_.name + " supports only Vulkan " + version_string(info_.api_version) +
                    "; forja needs Vulkan 1.2 (update the driver)");

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
  // Prefer a compute queue family without graphics (dedicated compute), else any with compute.
  int chosen = -1;
  for (uint32_t i = 0; i < nq; ++i)
    if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) {
      chosen = static_cast<int>(i);
      break;
    }
  if (chosen < 0)
    for (uint32_t i = 0; i < nq; ++i)
      if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
        chosen = static_cast<int>(i);
        break;
      }
  if (chosen < 0) throw Unsupported("device " + info_.name + " has no compute queue");
  queue_family_ = static_cast<uint32_t>(chosen);
  if (qf[queue_family_].timestampValidBits == 0) info_.timestamps = false;

  float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;

  std::vector<const char*> exts = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  if (info_.memory_budget_ext) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);

  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceSubgroupSizeControlFeatures fsg{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fcm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  f11.pNext = &f12;
  f11.storageBuffer16BitAccess = info_.storage_buffer_16bit;
  f12.shaderFloat16 = info_.shader_float16;
  f12.vulkanMemoryModel = info_.vulkan_memory_model;
  feats.features.shaderInt64 = info_.shader_int64;
  void** tail = &f12.pNext;
  if (info_.subgroup_size_control && VK_API_VERSION_MINOR(info_.api_version) >= 3) {
    fsg.subgroupSizeControl = VK_TRUE;
    fsg.computeFullSubgroups = info_.compute_full_subgroups;
    *tail = &fsg;
    tail = &fsg.pNext;
  }
  if (info_.nv_coopmat) {
    exts.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    fcm.cooperativeMatrix = VK_TRUE;
    *tail = &fcm;
    tail = &fcm.pNext;
  }
  CoopMatFeaturesKHR fkhr{kStructureTypeCoopMatFeaturesKHR, nullptr, VK_TRUE, VK_FALSE};
  if (info_.khr_coopmat) {
    exts.push_back("VK_KHR_cooperative_matrix");
    *tail = &fkhr;
    tail = &fkhr.pNext;
  }
  // The compiler's statistics only when asked for: capturing them may cost pipeline creation time.
  const char* ir_dir = std::getenv("FORJA_PIPELINE_IR");
  const bool want_ir = ir_dir && *ir_dir;
  const bool pipeline_stats = info_.pipeline_executable_info && (env_flag("FORJA_PIPELINE_STATS") || want_ir);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fpe{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (pipeline_stats) {
    exts.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    fpe.pipelineExecutableInfo = VK_TRUE;
    *tail = &fpe;
    tail = &fpe.pNext;
  }
  CoopMat2FeaturesNV fnv2{kStructureTypeCoopMat2FeaturesNV};
  if (info_.nv_coopmat2) {
    exts.push_back("VK_NV_cooperative_matrix2");
    fnv2.workgroupScope = fnv2.flexibleDimensions = fnv2.tensorAddressing = fnv2.conversions = VK_TRUE;
    *tail = &fnv2;
    tail = &fnv2.pNext;
  }

  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &feats;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  di.ppEnabledExtensionNames = exts.data();
  VK_CHECK(vkCreateDevice(physical_, &di, nullptr, &device_));
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
  cmd_push_descriptor_set =
      reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(vkGetDeviceProcAddr(device_, "vkCmdPushDescriptorSetKHR"));
  if (!cmd_push_descriptor_set)
    throw Unsupported("device " + info_.name + ": the driver does not provide vkCmdPushDescriptorSetKHR; update it");
  if (pipeline_stats) {
    get_pipeline_executables = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
        vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
    get_pipeline_statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
    if (!get_pipeline_executables || !get_pipeline_statistics) get_pipeline_executables = nullptr;
    if (want_ir && get_pipeline_executables) {
      get_pipeline_representations = reinterpret_cast<PFN_vkGetPipelineExecutableInternalRepresentationsKHR>(
          vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableInternalRepresentationsKHR"));
      if (get_pipeline_representations) pipeline_ir_dir = ir_dir;
    }
  } else if (env_flag("FORJA_PIPELINE_STATS") || want_ir) {
    std::fprintf(stderr, "forja: FORJA_PIPELINE_STATS/_IR: %s does not offer VK_KHR_pipeline_executable_properties\n",
                 info_.name.c_str());
  }
}

Device::~Device() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    vkDestroyDevice(device_, nullptr);
  }
}

int Device::find_memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const {
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i)
    if ((type_bits & (1u << i)) && (mem_props_.memoryTypes[i].propertyFlags & want) == want)
      return static_cast<int>(i);
  return -1;
}

uint64_t Device::device_local_budget() const {
  if (!info_.memory_budget_ext) return info_.device_local_bytes();
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mem{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  mem.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &mem);
  uint64_t total = 0;
  for (uint32_t i = 0; i < mem.memoryProperties.memoryHeapCount; ++i)
    if (mem.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      total += budget.heapBudget[i] > budget.heapUsage[i] ? budget.heapBudget[i] - budget.heapUsage[i] : 0;
  return total;
}

}  // namespace forja::gpu
