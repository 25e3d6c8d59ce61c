// What the libFuzzer targets share (docs/fuzzing.md): an input cut into the parts of a
// multi-file input, a scratch folder in memory for parsers that read files, and the tiny example
// model (train/example.h) whose config and tokenizer the targets parse inputs against.
//
// The contract every target checks: a parser given any bytes either accepts them or throws
// UserError (a message for the user). Any other exception escapes to std::terminate, and it, a
// crash, a sanitizer report, a leak or a timeout is a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "train/example.h"

namespace forja::fuzz {

// Separates the files of one input ("config\n--forja-fuzz-part--\nweights"), so the seeds stay
// readable and a mutation can still grow or shrink each part. Missing parts are empty.
inline constexpr std::string_view kPartSeparator = "\n--forja-fuzz-part--\n";

inline std::vector<std::string_view> split_parts(const std::uint8_t* data, std::size_t size,
                                                 std::size_t count) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < count) {
    const std::size_t at = rest.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(rest);
  parts.resize(count);
  return parts;
}

// A folder of this process in /dev/shm (RAM, so that a file per input costs little), created on
// first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  // Never destroyed, so the exit handler below can still read it.
  static const std::filesystem::path* dir = [] {
    std::filesystem::path base = "/dev/shm";
    if (!std::filesystem::is_directory(base)) base = std::filesystem::temp_directory_path();
    auto* d = new std::filesystem::path(base / ("forja_fuzz_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*d);
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

inline void write_bytes(const std::filesystem::path& file, std::string_view bytes) {
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The example model of `forja example` (seed 1, the default shape), written once per process;
// fuzz/make_seeds.py builds the seeds from the same files.
inline const std::filesystem::path& example_model_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = scratch_dir() / "example-model";
    forja::train::write_example_model(d);
    return d;
  }();
  return dir;
}

}  // namespace forja::fuzz
