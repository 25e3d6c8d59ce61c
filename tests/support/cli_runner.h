// Running the forja binary from tests: where it is (FORJA_TEST_PROGRAM, else the build's), and a
// shell command's exit status and standard output.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace forja::test {

inline std::string program() {
  if (const char* p = std::getenv("FORJA_TEST_PROGRAM")) return p;
  return std::string(FORJA_BINARY_DIR) + "/forja";
}

struct ShellResult {
  int exit_code = -1;  // a child killed by signal N is reported by the shell as 128 + N
  std::string output;  // standard output (redirect stderr in `command` to get it too)
};

inline ShellResult run_shell(const std::string& command) {
  ShellResult r;
  FILE* f = ::popen(command.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) r.output.append(buf, n);
  const int status = ::pclose(f);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace forja::test
