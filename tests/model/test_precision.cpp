// --precision parsing and the dense dtype each precision implies.
#include <gtest/gtest.h>

#include "model/precision.h"
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

}  // namespace
}  // namespace forja::model
