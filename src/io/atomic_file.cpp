// Atomic file output: temporary in the same directory, fsync, rename, fsync of the directory.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "util/error.h"
#include "util/kill_point.h"

namespace forja::io {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// A name unique within this process and across processes writing into the same directory.
std::filesystem::path temp_name_for(const std::filesystem::path& path) {
  static std::atomic<unsigned> counter{0};
  std::string name = "." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(counter.fetch_add(1));
  return path.parent_path() / name;
}

}  // namespace

void sync_directory(const std::filesystem::path& dir) {
  const std::string d = dir.empty() ? std::string(".") : dir.string();
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // some filesystems do not allow opening directories; the rename happened
  ::fsync(fd);         // errors here are not actionable: the data itself is already synced
  ::close(fd);
}

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  if (path_.filename().empty())
    throw UserError(path_.string() + ": cannot write a file to a directory path; give a file name");
  temp_path_ = temp_name_for(path_);
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    throw OutputError(
        path_.string() + ": cannot create a file in " +
        (path_.parent_path().empty() ? std::string(".") : path_.parent_path().string()) + " (" +
        errno_text(err) + "); check that the directory exists and is writable");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, std::size_t size) {
  if (fd_ < 0) throw OutputError(path_.string() + ": write after the file was committed or failed");
  const char* p = static_cast<const char*>(data);
  const bool first = written_ == 0;
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      throw OutputError(
          path_.string() + ": writing failed after " + std::to_string(written_) + " bytes (" +
          errno_text(err) +
          "); free disk space or write elsewhere. The previous file, if any, is intact");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
    written_ += static_cast<std::size_t>(n);
  }
  if (first && kill_points_enabled()) kill_point((path_.filename().string() + ": half-written").c_str());
}

void AtomicFile::commit() {
  if (fd_ < 0) throw OutputError(path_.string() + ": commit after the file was committed or failed");
  if (::fsync(fd_) != 0) {
    int err = errno;
    throw OutputError(path_.string() + ": flushing to disk failed (" + errno_text(err) +
                    "); free disk space or write elsewhere. The previous file, if any, is intact");
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int err = errno;
    throw OutputError(path_.string() + ": closing failed (" + errno_text(err) +
                    "); the previous file, if any, is intact");
  }
  if (kill_points_enabled()) kill_point((path_.filename().string() + ": written, before its rename").c_str());
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    throw OutputError(path_.string() + ": cannot replace the file (" + errno_text(err) +
                    "); check permissions of the directory and that the path is not a directory");
  }
  committed_ = true;
  if (kill_points_enabled()) kill_point((path_.filename().string() + ": renamed into place").c_str());
  sync_directory(path_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  AtomicFile out(path);
  out.write(contents);
  out.commit();
}

}  // namespace forja::io
