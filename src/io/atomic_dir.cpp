// Atomic directory output: temporary sibling directory, fsync, rename (or exchange), then the
// old directory's removal. See io/atomic_dir.h.
#include "io/atomic_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "util/error.h"

namespace forja::io {
namespace {

// A fresh directory "<base><suffix>XXXXXX" next to `base` (mkdtemp), returned as its path.
std::filesystem::path make_unique_dir(const std::filesystem::path& base, const char* suffix,
                                      const std::string& flag) {
  std::string pattern = base.string() + suffix + "XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data())) {
    int err = errno;
    throw UserError(flag + " " + base.string() + ": cannot create a directory next to it (" +
                    std::strerror(err) + "); check that the parent directory exists and is writable");
  }
  // mkdtemp makes it 0700; give it the mode a plain mkdir would (0777 less the umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(buffer.data(), 0777 & ~mask);
  return std::filesystem::path(buffer.data());
}

std::filesystem::path parent_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

}  // namespace

bool directory_has_entries(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return false;
  return std::filesystem::directory_iterator(dir, ec) != std::filesystem::directory_iterator();
}

AtomicDirectory::AtomicDirectory(std::filesystem::path destination, bool overwrite,
                                 const std::string& flag)
    : overwrite_(overwrite), flag_(flag) {
  // A trailing slash would make "DEST/" + ".tmp-" a path inside DEST.
  destination_ = destination.has_filename() ? destination : destination.parent_path();
  if (destination_.empty())
    throw UserError(flag + ": give a directory path for the output");
  std::error_code ec;
  const auto status = std::filesystem::symlink_status(destination_, ec);
  if (std::filesystem::exists(status)) {
    if (!std::filesystem::is_directory(status))
      throw UserError(flag + " " + destination_.string() +
                      ": exists and is not a directory; choose another output path");
    if (directory_has_entries(destination_) && !overwrite)
      throw UserError(flag + " " + destination_.string() +
                      ": exists and is not empty; choose another path or add --overwrite to "
                      "replace it (it is replaced only once the new output is complete)");
  }
  temp_ = make_unique_dir(destination_, ".tmp-", flag);
}

AtomicDirectory::~AtomicDirectory() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(temp_, ec);  // best effort: a failure leaves a stray .tmp-*
}

void AtomicDirectory::commit() {
  if (committed_) throw UserError(destination_.string() + ": committed twice (a bug)");
  sync_directory(temp_);
  const std::string from = temp_.string(), to = destination_.string();
  std::error_code ec;
  const bool replacing = directory_has_entries(destination_);
  if (replacing && !overwrite_)
    throw UserError(flag_ + " " + to + ": appeared while the output was being written; "
                    "choose another path or add --overwrite");
  if (!replacing) {
    // A missing destination, or an empty directory, which rename(2) replaces atomically.
    if (::rename(from.c_str(), to.c_str()) != 0) {
      int err = errno;
      throw UserError(flag_ + " " + to + ": cannot move the finished output into place (" +
                      std::strerror(err) + ")");
    }
    committed_ = true;
    sync_directory(parent_of(destination_));
    return;
  }
  // Replace a complete old directory by the complete new one; delete the old one last.
  std::filesystem::path old;
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    old = temp_;  // the exchange left the old directory under the temporary name
  } else {
    int err = errno;
    if (err != EINVAL && err != ENOSYS && err != ENOTSUP)
      throw UserError(flag_ + " " + to + ": cannot swap in the finished output (" +
                      std::strerror(err) + "); it is left complete in " + from);
    old = make_unique_dir(destination_, ".old-", flag_);
    if (::rename(to.c_str(), old.c_str()) != 0) {  // renames over the empty placeholder
      err = errno;
      std::filesystem::remove(old, ec);
      throw UserError(flag_ + " " + to + ": cannot move the old output aside (" +
                      std::strerror(err) + ")");
    }
    if (::rename(from.c_str(), to.c_str()) != 0) {
      err = errno;
      ::rename(old.c_str(), to.c_str());  // put the old one back
      throw UserError(flag_ + " " + to + ": cannot move the finished output into place (" +
                      std::strerror(err) + ")");
    }
  }
  committed_ = true;
  sync_directory(parent_of(destination_));
  std::filesystem::remove_all(old, ec);
  if (ec)
    throw UserError(flag_ + " " + to + ": the new output is in place but the old one could not "
                    "be deleted from " + old.string() + " (" + ec.message() + "); delete it by hand");
}

}  // namespace forja::io
