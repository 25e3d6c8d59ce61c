// OUT/metrics.jsonl: one JSON object per logged step ({"step","epoch","loss","lr","grad_norm",
// "tokens","tokens_per_s","elapsed_s","gpu_mem_gib"}; gpu_mem_gib = the GPU memory arena's peak so
// far, GiB) or evaluation ({"step","eval_loss","eval_ppl"}), flushed line by line so that a crash
// loses at most the line being written. train/run_record.h reads it back for the report.
#pragma once
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace forja::train {

class MetricsLog {
 public:
  // Opens `path` for appending. Rows of steps after `resume_step` (written after the checkpoint
  // being resumed from, and about to be redone) are dropped first, so the file reads as one run.
  MetricsLog(const std::filesystem::path& path, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void append(const nlohmann::json& row);

 private:
  std::filesystem::path path_;
  std::FILE* f_ = nullptr;
};

}  // namespace forja::train
