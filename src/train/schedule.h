// Learning-rate schedules (formats.md 6.4, transformers' get_*_schedule_with_warmup): the
// multiplier on the base learning rate at optimizer step `step` (0-based) of `total` steps with
// `warmup` linear warm-up steps.
#pragma once
#include <cstdint>
#include <string>

namespace forja::train {

enum class Schedule { constant, linear, cosine };

Schedule parse_schedule(const std::string& name);  // UserError naming the valid ones
const char* schedule_name(Schedule s);
double lr_multiplier(Schedule s, int64_t step, int64_t warmup, int64_t total);

}  // namespace forja::train
