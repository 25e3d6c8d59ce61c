// Test hook for the kill-anywhere test (tests/train/test_kill_anywhere.cpp). The places where a
// kill would leave the most behind (inside a training step, between the files of a checkpoint,
// half-way through a file or a metrics row, before and after each rename) call kill_point().
// With FORJA_TEST_KILL_AT=N the process SIGKILLs itself at the N-th point it passes (counted from
// 1, in the order the main thread passes them, the same in every run of one configuration); with
// FORJA_TEST_KILL_AT=list it prints "forja: kill point N: WHERE" to stderr at each, so the test
// knows how many there are (util/test_hooks.h reads the variable). Without the variable a kill
// point costs one load and a branch.
#pragma once
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "util/test_hooks.h"

namespace forja {

namespace detail {
struct KillPoints {
  int64_t kill_at = 0;  // 0: off
  bool list = false;
  std::atomic<int64_t> passed{0};
  KillPoints() : kill_at(test_hooks().kill_at), list(test_hooks().list_kill_points) {}
};
inline KillPoints& kill_points() {
  static KillPoints k;
  return k;
}
}  // namespace detail

inline bool kill_points_enabled() {
  const auto& k = detail::kill_points();
  return k.list || k.kill_at > 0;
}

inline void kill_point(const char* where) {
  auto& k = detail::kill_points();
  if (!k.list && k.kill_at <= 0) return;
  const int64_t n = ++k.passed;
  if (k.list) std::fprintf(stderr, "forja: kill point %lld: %s\n", static_cast<long long>(n), where);
  if (n == k.kill_at) ::kill(::getpid(), SIGKILL);
}

}  // namespace forja
