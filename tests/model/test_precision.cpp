// --precision parsing and the dense dtype each precision implies.
#include <gtest/gtest.h>

#include <cstdlib>

#include "model/precision.h"
#include "support/gpu_fixture.h"
#include "util/error.h"

namespace forja::model {
namespace {

TEST(Precision, ParsesBothNamesAndRefusesOthers) {
  EXPECT_EQ(parse_precision("fp32"), Precision::fp32);
  EXPECT_EQ(parse_precision("mixed"), Precision::mixed);
  EXPECT_STREQ(precision_name(Precision::fp32), "fp32");
  EXPECT_STREQ(precision_name(Precision::mixed), "mixed");
  EXPECT_THROW(parse_precision("fp16"), UserError);
  EXPECT_THROW(parse_precision(""), UserError);
  EXPECT_EQ(dense_dtype_for(Precision::fp32), ops::DType::f32);
  EXPECT_EQ(dense_dtype_for(Precision::mixed), ops::DType::f16);
}

// auto: mixed exactly where the GEMM has a matrix-core family on this device (lavapipe: none,
// so fp32), and the explicit names pass through unchanged. FORJA_NO_COOPMAT forces the
// no-matrix-core answer on any device.
class PrecisionAuto : public test::GpuTest {};

TEST_F(PrecisionAuto, MixedExactlyWhereMatrixCoresAreUsed) {
  const bool cores = ops::gemm_kernel_for(ctx(), ops::DType::f16) != ops::GemmKernel::scalar;
  EXPECT_EQ(resolve_precision("auto", ctx()), cores ? Precision::mixed : Precision::fp32);
  EXPECT_EQ(resolve_precision("fp32", ctx()), Precision::fp32);
  EXPECT_EQ(resolve_precision("mixed", ctx()), Precision::mixed);
  EXPECT_THROW(resolve_precision("bf16", ctx()), UserError);
  EXPECT_NE(describe_precision_choice("auto", ctx()).find("auto"), std::string::npos);
  setenv("FORJA_NO_COOPMAT", "1", 1);
  EXPECT_EQ(resolve_precision("auto", ctx()), Precision::fp32);
  unsetenv("FORJA_NO_COOPMAT");
}

}  // namespace
}  // namespace forja::model
