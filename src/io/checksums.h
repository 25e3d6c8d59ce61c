// SHA-256 checksums of the files of a directory, kept in that directory as SHA256SUMS in the
// format of coreutils' sha256sum ("<64 hex digits>  <name>" per line), so `sha256sum -c
// SHA256SUMS` checks a checkpoint by hand too. Checkpoints carry one (train/checkpoint.h): a
// damaged file is found before a resume trusts it.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace forja::io {

// Hex SHA-256 of a file's bytes; UserError naming the file when it cannot be read.
std::string sha256_of_file(const std::filesystem::path& file);
// Hex SHA-256 of bytes in memory.
std::string sha256_of(const void* data, std::size_t size);

// Writes dir/SHA256SUMS (atomically) for the given files of `dir`.
void write_sha256sums(const std::filesystem::path& dir, const std::vector<std::string>& names);

// Checks every file dir/SHA256SUMS lists. nullopt: all match; else what is wrong, naming the
// file ("…/optimizer.safetensors: its SHA-256 differs from SHA256SUMS"). A directory without
// SHA256SUMS (written by an earlier version) passes, as does nothing else: a SHA256SUMS that does
// not parse is damage too.
std::optional<std::string> verify_sha256sums(const std::filesystem::path& dir);

}  // namespace forja::io
