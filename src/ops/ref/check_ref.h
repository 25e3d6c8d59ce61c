// Argument checks shared by the double-precision CPU references (src/ops/ref/).
//
// The references are test oracles: a bad shape or index is a bug in the caller, so it throws
// std::invalid_argument / std::out_of_range with a message naming the function and the value,
// instead of reading out of bounds.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace forja::ref::detail {

inline void require(bool ok, const char* func, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("forja::ref::") + func + ": " + what);
}

inline void require_dims(const char* func, std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) {
    require(d >= 0, func, "negative dimension " + std::to_string(d));
  }
}

}  // namespace forja::ref::detail
