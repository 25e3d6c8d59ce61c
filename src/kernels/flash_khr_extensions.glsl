// The extensions of the fused attention kernels (flash_forward_khr.comp, flash_backward_khr.comp):
// subgroup-scope KHR cooperative matrices with NV cooperative matrix 2's conversions between uses,
// or none of them for the EMULATE variants (flash_khr_common.glsl), which any Vulkan 1.2 device
// runs, lavapipe included, so CI covers the kernels' tiling, masking and softmax logic.
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_vote : require
#if !defined(EMULATE)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
