// Atomic file output. A checkpoint, adapter or merged model must never be seen half-written: a
// crash, kill or full disk at any moment leaves either the previous file whole or the new one
// whole. The bytes go to a temporary file in the destination's directory (same filesystem, so
// the rename is atomic), which is fsync'ed, renamed over the destination, and then the
// directory is fsync'ed so the rename itself survives a power loss.
//
//   forja::io::AtomicFile out("out/adapter_model.safetensors");
//   out.write(header.data(), header.size());
//   out.write(data.data(), data.size());
//   out.commit();          // without commit(), the destructor deletes the temporary
#pragma once
#include <cstddef>
#include <filesystem>
#include <string_view>

namespace forja::io {

class AtomicFile {
 public:
  // Creates the temporary file next to `path`. Throws UserError when the directory is missing or
  // not writable.
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();  // removes the temporary if commit() was not reached
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes. Throws UserError on a write failure (disk full, quota, I/O error).
  void write(const void* data, std::size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  std::size_t bytes_written() const { return written_; }

  // Flushes to disk, renames over the destination and syncs the directory. After this the
  // object is spent; further writes throw.
  void commit();

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  int fd_ = -1;
  std::size_t written_ = 0;
  bool committed_ = false;
};

// fsyncs a directory so that renames and creations inside it survive a power loss (best effort:
// some filesystems cannot open directories).
void sync_directory(const std::filesystem::path& dir);

// Writes the whole of `contents` to `path` atomically (see AtomicFile).
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

}  // namespace forja::io
