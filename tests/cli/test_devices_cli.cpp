// `forja devices` on the CI device: it lists the devices, says which one forja uses, and for
// that one which kernels each precision runs (the GEMM family, whether attention's forward is
// fused and, where not, why).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/cli_runner.h"

namespace forja::cli {
namespace {

using forja::test::program;

TEST(DevicesCli, SaysWhichKernelsEachPrecisionRuns) {
  if (!std::filesystem::exists(program())) GTEST_SKIP() << program() << " not built";
  const forja::test::ShellResult r = forja::test::run_shell(program() + " devices 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("forja uses device "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kernels there: precision: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  fp32:  scalar fp32 kernels"), std::string::npos) << r.output;
  const size_t mixed = r.output.find("  mixed: base products on ");
  ASSERT_NE(mixed, std::string::npos) << r.output;
  const std::string line = r.output.substr(mixed, r.output.find('\n', mixed) - mixed);
  // Either the fused forward runs or the line says why not.
  EXPECT_TRUE(line.find("its forward fused") != std::string::npos ||
              line.find("no fused forward (") != std::string::npos)
      << line;
}

}  // namespace
}  // namespace forja::cli
