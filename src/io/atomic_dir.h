// Atomic directory output, for outputs made of several files (a merged model): everything is
// written into a temporary directory next to the destination (DEST.tmp-XXXXXX, same filesystem),
// synced, and only then put in place by a rename. A crash at any moment leaves the previous
// DEST whole (or no DEST) and at worst a stray DEST.tmp-* directory; never a half-written DEST.
//
//   forja::io::AtomicDirectory out("merged", /*overwrite=*/false);   // refuses a non-empty DEST
//   write_file_atomic(out.temp() / "config.json", text);  ...
//   out.commit();          // without commit(), the destructor deletes the temporary directory
//
// Replacing an existing non-empty DEST (overwrite) swaps the two directories with one
// renameat2(RENAME_EXCHANGE), then deletes the old one: the old DEST is removed only after the
// new one is complete and in place. Filesystems without the exchange get two renames instead
// (DEST -> DEST.old-XXXXXX, temp -> DEST), the old one still deleted last.
#pragma once
#include <filesystem>
#include <string>

namespace forja::io {

class AtomicDirectory {
 public:
  // Checks the destination before any work: a non-empty directory is refused unless
  // `overwrite`, a file is always refused (UserError naming `flag`, the option that gave the
  // path). Then creates the temporary directory.
  AtomicDirectory(std::filesystem::path destination, bool overwrite,
                  const std::string& flag = "--out");
  ~AtomicDirectory();  // removes the temporary directory if commit() was not reached
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::filesystem::path& temp() const { return temp_; }
  const std::filesystem::path& destination() const { return destination_; }

  // Syncs the temporary directory (the files in it must already be synced: write them with
  // AtomicFile), puts it in place of the destination, deletes a replaced one and syncs the
  // parent directory.
  void commit();

 private:
  std::filesystem::path destination_;
  std::filesystem::path temp_;
  bool overwrite_ = false;
  std::string flag_;
  bool committed_ = false;
};

// True when `dir` exists and holds at least one entry.
bool directory_has_entries(const std::filesystem::path& dir);

}  // namespace forja::io
