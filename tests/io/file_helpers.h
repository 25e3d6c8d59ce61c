// Helpers shared by the io and model tests: a fresh scratch directory per test, and writing
// hand-built files byte by byte (to create malformed safetensors the writer never would).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "util/error.h"

namespace forja::test {

// A new empty directory under the build tree, named after the running test.
inline std::filesystem::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(FORJA_BINARY_DIR) / "test-scratch" /
                              (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors image from a header text and data bytes; `declared_length` overrides the
// 8-byte length field when given.
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     std::int64_t declared_length = -1) {
  std::uint64_t n =
      declared_length < 0 ? header.size() : static_cast<std::uint64_t>(declared_length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Runs `fn`, expects it to throw forja::UserError, and returns the message ("" if none thrown).
template <typename Fn>
std::string user_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const forja::UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

}  // namespace forja::test
