// Shared by the parity tests: the cases made by tests/reference/parity_cases.py (generated once,
// under a file lock, since CTest runs tests as parallel processes), reading their batches, and
// the training loop the reference runs (accumulation, AdamW, schedule) with its comparisons.
#pragma once
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gpu/context.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/lora.h"
#include "model/transformer.h"

namespace forja::test {

// FORJA_PARITY_DIR when set (cases made elsewhere), else <build>/parity_cases, generated on
// first use.
const std::filesystem::path& parity_cases_dir();
// Runs `command` (a shell line) once for `marker`: under an exclusive lock on marker + ".lock",
// skipped when `marker` exists, which it creates on success. Throws on failure.
void run_once(const std::string& command, const std::filesystem::path& marker);
// The same for an action in this process.
void run_once(const std::function<void()>& action, const std::filesystem::path& marker);

// parity_cases_dir() / name, making that case alone when the directory predates it.
std::filesystem::path parity_case_dir(const std::string& name);

nlohmann::json read_json(const std::filesystem::path& p);
// batch.json -> micro-batches with targets shifted from the labels.
std::vector<model::TokenBatch> read_batches(const std::filesystem::path& p);
// The largest batch and sequence length among `batches` (what the Transformer must plan for).
std::pair<uint32_t, uint32_t> max_batch_shape(const std::vector<model::TokenBatch>& batches);
// Each loss within `tol` relative of the reference's losses.json; prints the largest relative
// difference measured.
void expect_losses_match(const std::vector<double>& losses, const std::filesystem::path& losses_json,
                         double tol = 1e-4);
double rel_error(const std::vector<float>& got, const std::vector<float>& want);

// Trains as the reference did (run.json: lr, betas, eps, weight decay, clipping, schedule,
// warm-up, accumulation, steps) and returns the loss of each step. After step 0's backward,
// every LoRA gradient is compared with `step0_grads` (relative error < grad_tol per tensor; the
// largest measured is printed).
std::vector<double> train_like_reference(gpu::Context& ctx, model::Transformer& tf, model::LoraSet& lora,
                                         const std::vector<model::TokenBatch>& batches, const nlohmann::json& run,
                                         const io::SafetensorsFile& step0_grads, double grad_tol = 1e-4);

// One parity run: standard case `name` (its model, batch, initial adapter and run settings)
// trained by forja with the base quantised as `quant` (nf4: against nf4_parity_case(name)) and
// the given engine options; losses and step-0 gradients within `tol` relative.
struct ParityRun {
  std::string name;
  model::BaseQuant quant = model::BaseQuant::none;
  model::TransformerOptions options;
  bool checkpointing = false;
  double tol = 1e-4;
};
void run_parity(gpu::Context& ctx, const ParityRun& run);

// The QLoRA parity case of standard case `name`: <parity_cases_dir()>/nf4-<name>, holding model/
// (every projection weight replaced by dequant(quant(W)), double quantisation, in F32) and ref/
// (reference_run.py on it with the standard case's batch, adapter and run settings). Made on
// first use (needs /usr/bin/python3 with torch) unless it is already there, so a case directory
// made on one machine (FORJA_PARITY_DIR) serves another without python.
std::filesystem::path nf4_parity_case(const std::string& name);

}  // namespace forja::test
