// Turning Vulkan result codes into exceptions with the call that failed. Out-of-memory results
// become OutOfMemory so the trainer can say what to lower.
#pragma once
#include <vulkan/vulkan.h>

#include <stdexcept>
#include <string>

namespace forja::gpu {

class OutOfMemory : public std::runtime_error {
 public:
  explicit OutOfMemory(const std::string& what) : std::runtime_error(what) {}
};

const char* vk_result_name(VkResult r);
[[noreturn]] void vk_fail(VkResult r, const char* call, const char* file, int line);

}  // namespace forja::gpu

#define VK_CHECK(call)                                                    \
  do {                                                                    \
    VkResult vk_check_result_ = (call);                                   \
    if (vk_check_result_ != VK_SUCCESS)                                   \
      ::forja::gpu::vk_fail(vk_check_result_, #call, __FILE__, __LINE__); \
  } while (0)
