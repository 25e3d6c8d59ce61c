// Errors. A UserError is a problem with what the user gave us (a path, a flag, a file's
// contents): the CLI prints its one-line message and exits with code 2, never a stack trace.
// Anything else that escapes is a bug or a device failure and exits with code 1.
#pragma once
#include <stdexcept>
#include <string>

namespace forja {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace forja
