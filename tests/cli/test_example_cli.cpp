// `forja example` end to end on the CI device, shortened to 2 steps: it makes the tiny model and
// data, trains, writes the adapter and ends with a sample from `forja generate` run by the same
// binary (found through /proc/self/exe, quoted for the shell: the output folder has a space and
// a quote in its name here).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "support/cli_runner.h"

namespace forja::cli {
namespace {

namespace fs = std::filesystem;
using forja::test::program;

TEST(ExampleCli, TrainsAndEndsWithASampleFromTheAdapter) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path out = fs::temp_directory_path() / ("forja example's run " + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string quoted_out = "\"" + out.string() + "\"";
  const forja::test::ShellResult r = forja::test::run_shell(program() + " example --steps 2 --out " + quoted_out + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out / "run" / "adapter_model.safetensors")) << r.output;
  const size_t sample = r.output.find("sample: forja generate");
  ASSERT_NE(sample, std::string::npos) << r.output;
  // generate prints the reply after the command line: something beyond it, and no shell error.
  const std::string after = r.output.substr(r.output.find('\n', sample) + 1);
  EXPECT_NE(after.find_first_not_of(" \n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("cannot open"), std::string::npos) << r.output;
  fs::remove_all(out);
}

}  // namespace
}  // namespace forja::cli
