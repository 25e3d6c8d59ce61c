// The test hooks: FORJA_TEST_* environment variables that make the program fail on purpose, at a
// chosen place, the way a kill, a driver or another rank would, so the tests can check what forja
// does then (tests/train/test_kill_anywhere.cpp, test_gpu_failures.cpp, test_run_safety.cpp,
// test_distributed_train.cpp, test_train_cli.cpp). This is the only place that reads them: once,
// at the first call of test_hooks(); the code that acts on one asks test_hooks() for its field.
// In a real run none is set, every field is off, and each check costs a load and a branch.
//
// variable                               field: what happens (where it is acted on)
// -------------------------------------- -------------------------------------------------------------------------
// FORJA_TEST_KILL_AT=N                   kill_at: SIGKILL at the N-th kill point passed (from 1, in the order the
//                                        main thread passes them; util/kill_point.h)
// FORJA_TEST_KILL_AT=list                list_kill_points: print "forja: kill point N: WHERE" to stderr at each kill
//                                        point (util/kill_point.h)
// FORJA_TEST_KILL_IN_CHECKPOINT=STEP     kill_in_checkpoint: SIGKILL half-way through writing step STEP's
//                                        checkpoint, some files written, before the rename (train/checkpoint.cpp)
// FORJA_TEST_SIGTERM_AFTER_STEP=N        sigterm_after_step: raise SIGTERM after step N, the stop-and-save path
//                                        without racing a fast GPU from outside (train/trainer.cpp)
// FORJA_TEST_DEVICE_LOST_AFTER_STEP=N    device_lost_after_step: after step N, fail as the next submit does on a
//                                        lost device (VK_ERROR_DEVICE_LOST), which lavapipe cannot be made to do
//                                        (train/trainer.cpp)
// FORJA_TEST_FAIL_RANK=R:N[:kill|:stop]  fail_rank: rank R, after step N, throws an error; with :kill it SIGKILLs
//                                        itself, with :stop it raises SIGUSR1 (the stop request) alone
//                                        (train/trainer.cpp)
// FORJA_TEST_GPU_MEMORY_MIB=N            gpu_memory_limit_bytes: every allocation that would take the arena past N
//                                        MiB fails as the driver fails it (VK_ERROR_OUT_OF_DEVICE_MEMORY); lavapipe
//                                        has all of the machine's memory (gpu/memory.cpp)
//
// Parsing: a step is std::atoll of the value, so a variable that is set but empty or not a number
// means step 0; FORJA_TEST_KILL_AT and FORJA_TEST_GPU_MEMORY_MIB are off when empty;
// FORJA_TEST_FAIL_RANK is off unless at least R:N parse.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace forja {

// One field per hook (the table above); unset: off.
struct TestHooks {
  struct FailRank {
    int rank = -1;
    int64_t step = -1;
    std::string mode;  // what follows R:N: "kill", "stop", else throw
  };
  int64_t kill_at = 0;                            // FORJA_TEST_KILL_AT=N; 0: off
  bool list_kill_points = false;                  // FORJA_TEST_KILL_AT=list
  std::optional<int64_t> kill_in_checkpoint;      // FORJA_TEST_KILL_IN_CHECKPOINT
  std::optional<int64_t> sigterm_after_step;      // FORJA_TEST_SIGTERM_AFTER_STEP
  std::optional<int64_t> device_lost_after_step;  // FORJA_TEST_DEVICE_LOST_AFTER_STEP
  std::optional<FailRank> fail_rank;              // FORJA_TEST_FAIL_RANK
  uint64_t gpu_memory_limit_bytes = 0;            // FORJA_TEST_GPU_MEMORY_MIB << 20; 0: off
};

// The hooks of this process, read from its environment at the first call.
const TestHooks& test_hooks();

}  // namespace forja
