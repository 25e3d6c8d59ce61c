#include "io/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "util/error.h"

namespace forja::io {

RunLock::RunLock(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kFileName;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw UserError(file.string() + ": cannot create the run's lock file (" + std::strerror(errno) +
                    "); check that --out is writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw UserError(file.string() + ": cannot lock the run directory (" + std::strerror(err) + ")");
    std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string("another process");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    throw UserError(dir.string() + ": another forja train is using this run directory (" + who +
                    "); wait for it to end, or choose another --out");
  }
  // Who holds it, for the message above.
  char host[128] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string text = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) < 0) {
    // The lock itself holds; only the description is missing.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace forja::io
