#include "util/test_hooks.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace forja {

namespace {

std::optional<int64_t> step_of(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return int64_t(std::atoll(v));
}

TestHooks read_test_hooks() {
  TestHooks h;
  if (const char* v = std::getenv("FORJA_TEST_KILL_AT"); v && *v) {
    if (std::strcmp(v, "list") == 0)
      h.list_kill_points = true;
    else
      h.kill_at = std::atoll(v);
  }
  h.kill_in_checkpoint = step_of("FORJA_TEST_KILL_IN_CHECKPOINT");
  h.sigterm_after_step = step_of("FORJA_TEST_SIGTERM_AFTER_STEP");
  h.device_lost_after_step = step_of("FORJA_TEST_DEVICE_LOST_AFTER_STEP");
  if (const char* v = std::getenv("FORJA_TEST_FAIL_RANK")) {
    int r = -1;
    long long n = -1;
    char mode[8] = "";
    if (std::sscanf(v, "%d:%lld:%7s", &r, &n, mode) >= 2) h.fail_rank = TestHooks::FailRank{r, int64_t(n), mode};
  }
  if (const char* v = std::getenv("FORJA_TEST_GPU_MEMORY_MIB"); v && *v)
    h.gpu_memory_limit_bytes = uint64_t(std::strtoull(v, nullptr, 10)) << 20;
  return h;
}

}  // namespace

const TestHooks& test_hooks() {
  static const TestHooks hooks = read_test_hooks();
  return hooks;
}

}  // namespace forja
