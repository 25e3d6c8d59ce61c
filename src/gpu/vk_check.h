// Turning Vulkan result codes into exceptions with the call that failed. The failures a user
// can act on have their own types and exit codes (cli/main.cpp, README "Exit codes"):
// OutOfMemory (4: the trainer says what to lower), DeviceLost (5: a driver reset, hang or GPU
// fault; resume from the last checkpoint), Unsupported (6: no Vulkan driver, or a device without
// what forja needs).
#pragma once
#include <vulkan/vulkan.h>

#include <stdexcept>
#include <string>

#include "util/error.h"

namespace forja::gpu {

class OutOfMemory : public std::runtime_error {
 public:
  explicit OutOfMemory(const std::string& what) : std::runtime_error(what) {}
};

class DeviceLost : public std::runtime_error {
 public:
  explicit DeviceLost(const std::string& what) : std::runtime_error(what) {}
};

// A UserError too: code that catches those (to report them per line or per file) sees it as one.
class Unsupported : public UserError {
 public:
  explicit Unsupported(const std::string& what) : UserError(what) {}
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
