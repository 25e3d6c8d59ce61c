// Errors. A UserError is a problem with what the user gave us (a path, a flag, a file's
// contents): the CLI prints its one-line message and exits with code 2, never a stack trace.
// GPU failures have their own exception types (gpu/vk_check.h); anything else that escapes is a
// bug and exits with code 1.
// Exit codes (README "Exit codes"): 0 done, 1 internal error, 2 bad input or flags, 3 stopped
// with the outputs so far intact (an output could not be written; a non-finite loss in
// training), 4 GPU out of memory, 5 GPU lost, 6 no usable Vulkan driver or device.
#pragma once
#include <stdexcept>
#include <string>

namespace forja {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

// An output that could not be written (disk full, quota, file size limit, permissions, I/O
// error). The CLI exits with code 3: what was written before (earlier checkpoints) is intact.
class OutputError : public UserError {
 public:
  explicit OutputError(const std::string& message) : UserError(message) {}
};

}  // namespace forja
