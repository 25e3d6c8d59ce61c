// Shared by the parity tests: the cases made by tests/reference/parity_cases.py (generated once,
// under a file lock, since CTest runs tests as parallel processes), reading their batches, and
// the training loop the reference runs (accumulation, AdamW, schedule) with its comparisons.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gpu/context.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/transformer.h"

namespace forja::test {

// FORJA_PARITY_DIR when set (cases made elsewhere), else <build>/parity_cases, generated on
// first use.
const std::filesystem::path& parity_cases_dir();
// Runs `command` (a shell line) once for `marker`: under an exclusive lock on marker + ".lock",
// skipped when `marker` exists, which it creates on success. Throws on failure.
void run_once(const std::string& command, const std::filesystem::path& marker);

// parity_cases_dir() / name, making that case alone when the directory predates it.
std::filesystem::path parity_case_dir(const std::string& name);

nlohmann::json read_json(const std::filesystem::path& p);
// batch.json -> micro-batches with targets shifted from the labels.
std::vector<model::TokenBatch> read_batches(const std::filesystem::path& p);
// The largest batch and sequence length among `batches` (what the Transformer must plan for).
std::pair<uint32_t, uint32_t> max_batch_shape(const std::vector<model::TokenBatch>& batches);
// Each loss within 1e-4 relative of the reference's losses.json.
void expect_losses_match(const std::vector<double>& losses, const std::filesystem::path& losses_json);
double rel_error(const std::vector<float>& got, const std::vector<float>& want);

// Trains as the reference did (run.json: lr, betas, eps, weight decay, clipping, schedule,
// warm-up, accumulation, steps) and returns the loss of each step. After step 0's backward,
// every LoRA gradient is compared with `step0_grads` (relative error < 1e-4 per tensor).
std::vector<double> train_like_reference(gpu::Context& ctx, model::Transformer& tf, model::LoraSet& lora,
                                         const std::vector<model::TokenBatch>& batches, const nlohmann::json& run,
                                         const io::SafetensorsFile& step0_grads);

}  // namespace forja::test
