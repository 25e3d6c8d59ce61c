// Vulkan instance and device: discovery, capability probing, choice of device, and the
// logical device forja computes on (one compute queue).
//
// Choice: --device N or FORJA_DEVICE, else the first discrete GPU, else an integrated one,
// else anything else (lavapipe: a notice says that it is the CPU).
// FORJA_VALIDATE=1 turns the Khronos validation layer on; every message it prints is counted
// (tests fail on any).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace forja::gpu {

// One cooperative-matrix shape the device offers (M x N x K, component types by name).
struct CoopMatShape {
  uint32_t m = 0, n = 0, k = 0;
  std::string a_type, b_type, c_type, result_type;
  bool subgroup_scope = false;
  uint32_t workgroup_invocations = 0;  // NV2 workgroup-scope entries: the workgroup size it needs
};

// The fragment the KHR kernels use: fp16 x fp16 + fp32 -> fp32 at subgroup scope, every side 8,
// 16 or 32 (the kernels stage 8 halves at a time and their tiles are multiples of 32) and the accumulator spread evenly over
// the subgroup; the largest such shape, 16x16x16 first among equals. m == 0: none fits.
struct KhrFragment {
  uint32_t m = 0, n = 0, k = 0;
  uint32_t subgroup_size = 0;
};
KhrFragment choose_khr_fragment(const std::vector<CoopMatShape>& shapes, uint32_t subgroup_size);

struct MemoryHeapInfo {
  uint64_t size = 0;
  uint64_t budget = 0;  // from VK_EXT_memory_budget when present, else size
  bool device_local = false;
};

// Everything forja needs to know about a physical device, probed once.
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t vendor_id = 0;
  uint32_t api_version = 0;
  std::string driver_name, driver_info;
  bool is_cpu() const { return type == VK_PHYSICAL_DEVICE_TYPE_CPU; }
  std::string type_name() const;

  // arithmetic and storage
  bool shader_float16 = false;
  bool storage_buffer_16bit = false;
  bool shader_int64 = false;
  bool vulkan_memory_model = false;
  bool push_descriptor = false;
  bool memory_budget_ext = false;
  bool subgroup_size_control = false;
  bool compute_full_subgroups = false;
  // VK_KHR_pipeline_executable_properties: the compiler's statistics of each pipeline (NVIDIA:
  // registers per invocation, AMD: VGPRs/SGPRs), which FORJA_PIPELINE_STATS prints.
  bool pipeline_executable_info = false;
  // limits
  uint32_t subgroup_size = 0;
  uint32_t min_subgroup_size = 0, max_subgroup_size = 0;
  uint32_t max_shared_memory = 0;
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_buffer_size = 0;
  uint64_t max_allocation_size = 0;
  uint64_t min_storage_offset_alignment = 0;
  uint32_t max_push_constants = 0;
  uint32_t max_workgroup_count[3] = {0, 0, 0};
  uint32_t max_workgroup_invocations = 0;
  // Streaming multiprocessors / compute units, where the driver says (VK_NV_shader_sm_builtins,
  // VK_AMD_shader_core_properties); 0 = unknown. The GEMM's tile choice uses it (ops/gemm.cpp).
  uint32_t compute_units = 0;
  float timestamp_period_ns = 0;
  bool timestamps = false;
  std::vector<MemoryHeapInfo> heaps;
  // matrix cores
  bool nv_coopmat = false;
  bool khr_coopmat = false;
  std::vector<CoopMatShape> nv_coopmat_shapes, khr_coopmat_shapes;
  // Convenience: NV 16x16x16 fp16 x fp16 + fp32 -> fp32 at subgroup scope with subgroup 32.
  bool nv_coopmat_f16_f32_16x16x16 = false;
  KhrFragment khr_fragment;
  // VK_NV_cooperative_matrix2 with workgroup scope, flexible dimensions, tensor addressing and
  // conversions (what kernels/gemm_cm2.comp needs), and its workgroup-scope entries.
  bool nv_coopmat2 = false;
  uint32_t nv_coopmat2_max_workgroup = 0, nv_coopmat2_max_dimension = 0;
  std::vector<CoopMatShape> nv_coopmat2_workgroup_shapes;

  uint64_t device_local_bytes() const;
  std::string describe() const;  // multi-line report for `forja devices`
};

// Instance with the devices it sees. Throws UserError when there is no Vulkan driver at all.
class Instance {
 public:
  explicit Instance(bool validation);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  VkPhysicalDevice physical(uint32_t index) const { return physical_[index]; }
  bool validation() const { return validation_; }
  // Validation messages (warnings and errors) seen so far.
  uint64_t validation_messages() const;

  // The device forja uses: `requested` >= 0 picks by index (UserError if absent), else
  // FORJA_DEVICE, else the preference order above. `slot` picks among several devices of the
  // preferred kind (wrapping around): one process per GPU in a data-parallel job passes its
  // rank on this machine, so 2 ranks on a 2-GPU machine get one GPU each.
  uint32_t choose(int requested, int slot = 0) const;

 private:
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  bool validation_ = false;
  std::vector<VkPhysicalDevice> physical_;
  std::vector<DeviceInfo> devices_;
};

// The logical device and its compute queue.
class Device {
 public:
  // `requested` and `slot` as Instance::choose. Prints a notice on stderr when the choice is the CPU and
  // `quiet` is false.
  static std::shared_ptr<Device> open(int requested = -1, bool quiet = false, int slot = 0);
  Device(std::shared_ptr<Instance> instance, uint32_t index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  const DeviceInfo& info() const { return info_; }
  Instance& instance() { return *instance_; }
  uint64_t validation_messages() const { return instance_->validation_messages(); }

  // Memory type index with the given properties among `type_bits`, or -1.
  int find_memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const;
  // Live memory budget of the device-local heaps (bytes usable now), when reported.
  uint64_t device_local_budget() const;

  PFN_vkCmdPushDescriptorSetKHR cmd_push_descriptor_set = nullptr;
  // Set when FORJA_PIPELINE_STATS asks for the compiler's statistics of every pipeline created
  // (gpu/pipeline.cpp prints them) and the driver offers them.
  PFN_vkGetPipelineExecutablePropertiesKHR get_pipeline_executables = nullptr;
  PFN_vkGetPipelineExecutableStatisticsKHR get_pipeline_statistics = nullptr;
  // Set when FORJA_PIPELINE_IR names a folder: the driver's internal representations of every
  // pipeline (e.g. its assembly) are written there, one file each (gpu/pipeline.cpp).
  PFN_vkGetPipelineExecutableInternalRepresentationsKHR get_pipeline_representations = nullptr;
  std::string pipeline_ir_dir;

 private:
  std::shared_ptr<Instance> instance_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  DeviceInfo info_;
  VkPhysicalDeviceMemoryProperties mem_props_{};
};

// True when the environment variable is set to something other than "" or "0".
bool env_flag(const char* name);
// A setting that is on unless the environment variable is "0" (for measuring with it off).
bool env_flag_default_on(const char* name);

}  // namespace forja::gpu
