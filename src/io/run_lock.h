// One writer per run directory. `forja train` holds OUT/.forja-train.lock with an exclusive
// flock(2) for its whole life, so a second run into the same OUT is refused at once with the
// holder's pid, host and start time (which the file holds). The kernel drops the lock when the
// holder exits or is killed, so a lock left by a killed run is taken over by the next one with
// no stale-pid guessing.
#pragma once
#include <filesystem>
#include <string>

namespace forja::io {

class RunLock {
 public:
  // Takes the lock of `dir` (which must exist); UserError naming the holder when another process
  // has it, or when the lock file cannot be created.
  explicit RunLock(const std::filesystem::path& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  static constexpr const char* kFileName = ".forja-train.lock";

 private:
  int fd_ = -1;
};

}  // namespace forja::io
