#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.h"

namespace forja::train {

Schedule parse_schedule(const std::string& name) {
  if (name == "constant") return Schedule::constant;
  if (name == "linear") return Schedule::linear;
  if (name == "cosine") return Schedule::cosine;
  throw UserError("unknown learning-rate schedule '" + name + "'; choose constant, linear or cosine");
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::constant: return "constant";
    case Schedule::linear: return "linear";
    case Schedule::cosine: return "cosine";
  }
  return "?";
}

double lr_multiplier(Schedule s, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  switch (s) {
    case Schedule::constant:
      return 1.0;
    case Schedule::linear:
      return std::max(0.0, double(total - step) / double(std::max<int64_t>(1, total - warmup)));
    case Schedule::cosine: {
      const double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress)));
    }
  }
  return 1.0;
}

}  // namespace forja::train
