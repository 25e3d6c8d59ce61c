// A training run directory read back for its report: OUT/metrics.jsonl (the rows the trainer
// logged, train/metrics_log.h), OUT/config.yaml (the resolved settings) and OUT/run.json, which
// holds what only the trainer knows: the device it ran on and where the run stands. The trainer
// rewrites run.json (atomically) whenever it updates the report, so `forja report RUN` rebuilds
// exactly the page the trainer wrote.
//
// OUT/run.json: {"device": "NVIDIA H200", "device_type": "discrete GPU", "driver": "...",
//                "state": "running" | "finished" | "stopped" | "failed", "step": 120,
//                "total_steps": 500, "updated": "2026-12-04T21:30:00Z"}
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace forja::train {

struct RunStatus {
  std::string device, device_type, driver;
  std::string state;  // running, finished, stopped (by a signal), failed (a non-finite loss)
  int64_t step = 0, total_steps = 0;
  std::string updated;  // UTC, ISO 8601; write_run_status fills it in
};

// Writes OUT/run.json atomically.
void write_run_status(const std::filesystem::path& out, RunStatus status);

struct RunRecord {
  std::filesystem::path dir;
  std::string name;  // for legends and tables: the directory's name
  // metric -> (step, value) in file order, for every row that holds the metric as a number.
  // Metrics: loss, lr, grad_norm, tokens, tokens_per_s, elapsed_s, epoch, gpu_mem_gib (training
  // rows) and eval_loss, eval_ppl (evaluation rows). A null value (a non-finite loss the run
  // skipped; JSON has no NaN) is left out.
  std::map<std::string, std::vector<std::pair<double, double>>> metrics;
  int64_t rows = 0;          // lines of metrics.jsonl read
  std::string config_yaml;   // "" when config.yaml is missing
  std::optional<RunStatus> status;  // none when run.json is missing (a run of an older forja)
  std::vector<std::string> notes;   // what the reader left out and why, shown on the page
  const std::vector<std::pair<double, double>>* series(const std::string& metric) const;
};

// Reads a run directory. UserError (naming the file, the line and the fix) when DIR holds no
// metrics.jsonl or a line of it is not a metrics row; an incomplete last line (the process was
// killed while writing it) is left out with a note.
RunRecord read_run(const std::filesystem::path& dir);

}  // namespace forja::train
