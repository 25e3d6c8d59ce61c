// What keeps a run's folder safe: one writer per OUT (a lock the kernel drops when its holder
// dies), checkpoints checked against their SHA256SUMS before a resume trusts them (refused, or
// passed over with --resume-fallback), and a full disk or file-size limit that stops training
// with exit 3, leaves no half checkpoint and keeps the earlier ones resumable.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/checksums.h"
#include "io/run_lock.h"
#include "support/cli_runner.h"
#include "support/example_run.h"
#include "train/example.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;
using forja::test::program;

using Example = forja::test::ExampleFiles;
const Example& example() {
  static const Example files = forja::test::make_example_files("run_safety", 2);
  return files;
}

forja::test::ShellResult forja_cmd(const std::string& args, const std::string& prefix = "") {
  return forja::test::run_shell(prefix + " " + program() + " " + args + " 2>&1");
}

std::string train_args(const fs::path& out, int steps = 6) {
  return "train --model " + example().model.string() + " --data " + example().data.string() + " --out " +
         out.string() + " --seq-len 48 --batch-size 2 --grad-accum 1 --max-steps " + std::to_string(steps) +
         " --lr 3e-3 --warmup-steps 1 --save-every 2 --keep-checkpoints 0 --log-every 1 --lora-rank 4";
}

std::map<int64_t, double> losses(const fs::path& out) { return forja::test::logged_losses(out); }

bool has_partial(const fs::path& out) {
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().ends_with(".partial")) return true;
  return false;
}

TEST(Checksums, Sha256MatchesTheStandardVectorsAndCoreutils) {
  EXPECT_EQ(io::sha256_of("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(io::sha256_of("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const fs::path dir = example().dir / "sums";
  fs::create_directories(dir);
  std::ofstream(dir / "a.bin") << std::string(5 << 20, 'x');  // more than one read buffer
  std::ofstream(dir / "b.txt") << "hello\n";
  io::write_sha256sums(dir, {"a.bin", "b.txt"});
  EXPECT_FALSE(io::verify_sha256sums(dir).has_value());
  EXPECT_EQ(forja::test::run_shell("cd " + dir.string() + " && sha256sum --quiet -c SHA256SUMS 2>&1").exit_code, 0);
  std::ofstream(dir / "b.txt") << "hellO\n";
  const auto damage = io::verify_sha256sums(dir);
  ASSERT_TRUE(damage.has_value());
  EXPECT_NE(damage->find("b.txt: its SHA-256 differs"), std::string::npos) << *damage;
  std::ofstream(dir / "SHA256SUMS") << "not a checksum line\n";
  EXPECT_TRUE(io::verify_sha256sums(dir).has_value());
  // A name the filesystem refuses (longer than NAME_MAX) is a missing file, not an exception
  // (found by fuzz_checkpoint: fuzz/corpus/checkpoint/regress_name_too_long).
  std::ofstream(dir / "SHA256SUMS") << std::string(64, 'a') << "  " << std::string(300, 'f') << "\n";
  const auto too_long = io::verify_sha256sums(dir);
  ASSERT_TRUE(too_long.has_value());
  EXPECT_NE(too_long->find("missing"), std::string::npos) << *too_long;
}

TEST(RunSafety, SecondRunOnOneOutIsRefusedAndAStaleLockIsTakenOver) {
  const fs::path out = example().dir / "locked";
  fs::create_directories(out);
  {
    io::RunLock held(out);  // as a running forja train would hold it
    const auto r = forja_cmd(train_args(out, 1));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("another forja train is using this run directory (pid " + std::to_string(::getpid())),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(out / "config.yaml")) << "the refused run wrote into OUT";
  }
  // A holder killed by SIGKILL leaves the file but not the lock: the next run takes it over.
  const pid_t child = ::fork();
  if (child == 0) {
    io::RunLock held(out);
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(out / io::RunLock::kFileName));
  const auto r = forja_cmd(train_args(out, 1));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(RunSafety, DamagedCheckpointIsRefusedOrPassedOverOnRequest) {
  const fs::path whole = example().dir / "whole", run = example().dir / "damaged";
  auto r = forja_cmd(train_args(whole));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = forja_cmd(train_args(run), "FORJA_TEST_SIGTERM_AFTER_STEP=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(run / "checkpoint-4" / "SHA256SUMS"));
  EXPECT_EQ(forja::test::run_shell("cd " + (run / "checkpoint-2").string() + " && sha256sum --quiet -c SHA256SUMS").exit_code,
            0);
  // One flipped byte in the newest checkpoint's optimizer state.
  {
    std::fstream f(run / "checkpoint-4" / "optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(char(c ^ 0x10));
  }
  r = forja_cmd("train --resume " + run.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint-4/optimizer.safetensors: its SHA-256 differs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--resume " + (run / "checkpoint-2").string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--resume-fallback"), std::string::npos) << r.output;
  r = forja_cmd("train --resume " + run.string() + " --resume-fallback");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from " + (run / "checkpoint-2").string()), std::string::npos) << r.output;
  EXPECT_EQ(losses(run), losses(whole)) << r.output;
}

// RLIMIT_FSIZE (ulimit -f, no root needed): the checkpoint's files (80-160 KiB here) cannot be written.
TEST(RunSafety, FileSizeLimitStopsWithExitThreeAndNoHalfCheckpoint) {
  const fs::path out = example().dir / "fsize";
  const auto r = forja_cmd(train_args(out), "ulimit -f 48 &&");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training stopped at step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--resume"), std::string::npos) << r.output;
  EXPECT_FALSE(has_partial(out));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
}

// A real full filesystem (a small tmpfs; needs root, as in CI): two checkpoints fit, the third
// does not. The run stops with exit 3, the two stay whole, and after making room the run
// resumes and ends with the losses of an uninterrupted run.
TEST(RunSafety, FullDiskKeepsEarlierCheckpointsResumable) {
  const fs::path whole = example().dir / "whole_disk", mnt = example().dir / "tmpfs";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=280k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  auto r = forja_cmd(train_args(whole));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path out = mnt / "run";
  r = forja_cmd(train_args(out));
  ASSERT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("The last good checkpoint is " + (out / "checkpoint-").string()), std::string::npos)
      << r.output;
  EXPECT_FALSE(has_partial(out));
  ASSERT_TRUE(fs::exists(out / "checkpoint-2"));
  for (const auto& c : {"checkpoint-2", "checkpoint-4"})
    if (fs::exists(out / c)) {
      EXPECT_FALSE(io::verify_sha256sums(out / c).has_value()) << c;
    }
  ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", MS_REMOUNT, "size=4m"), 0) << std::strerror(errno);
  r = forja_cmd("train --resume " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(out), losses(whole)) << r.output;
}

}  // namespace
}  // namespace forja::train
