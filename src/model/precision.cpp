#include "model/precision.h"

#include "util/error.h"

namespace forja::model {

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::fp32;
  if (text == "mixed") return Precision::mixed;
  throw UserError("--precision " + text + ": expected fp32 or mixed");
}

const char* precision_name(Precision p) { return p == Precision::mixed ? "mixed" : "fp32"; }

}  // namespace forja::model
