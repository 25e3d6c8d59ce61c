#include "train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "dist/world.h"
#include "gpu/context.h"
#include "gpu/vk_check.h"
#include "io/adapter.h"
#include "io/atomic_file.h"
#include "io/run_lock.h"
#include "io/safetensors.h"
#include "model/base_weights.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/memory_plan.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "ops/attention_gemm.h"
#include "train/checkpoint.h"
#include "train/metrics_log.h"
#include "train/optimizer.h"
#include "train/report.h"
#include "train/run_record.h"
#include "train/schedule.h"
#include "train/step.h"
#include "train/token_batch.h"
#include "util/error.h"
#include "util/kill_point.h"
#include "util/test_hooks.h"

namespace forja::train {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

volatile sig_atomic_t g_stop_requested = 0;

void on_stop_signal(int) {
  if (g_stop_requested) _exit(130);  // second signal: at once (checkpoints on disk are whole)
  g_stop_requested = 1;
}

// SIGUSR1 too: mpirun forwards it to every rank at once, while on Ctrl-C (SIGINT) it ends the
// ranks itself (Open MPI: SIGTERM, then SIGKILL a second later), too soon to finish a step.
struct SignalGuard {
  struct sigaction old_int{}, old_term{}, old_usr1{};
  SignalGuard() {
    g_stop_requested = 0;
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGUSR1, &old_usr1, nullptr);
  }
};

// Test hook: FORJA_TEST_FAIL_RANK=R:N makes rank R fail after step N with an error (R:N:kill: it
// SIGKILLs itself; R:N:stop: it gets SIGUSR1, the stop request, alone), so the tests can check
// that one failing rank ends the whole job and that one rank's stop request stops all
// (util/test_hooks.h).
void maybe_fail_rank_for_test(int rank, int64_t step) {
  const auto& f = test_hooks().fail_rank;
  if (!f || f->rank != rank || f->step != step) return;
  if (f->mode == "kill") ::kill(::getpid(), SIGKILL);
  if (f->mode == "stop") {
    ::raise(SIGUSR1);
    return;
  }
  throw std::runtime_error("test failure injected after step " + std::to_string(step));
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

std::string duration(double s) {
  char buf[32];
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

// Files a run writes into OUT (what --overwrite may remove, and what marks OUT as a run).
bool is_run_file(const fs::path& p) {
  const std::string n = p.filename().string();
  return n == "config.yaml" || n == "metrics.jsonl" || n == "adapter_model.safetensors" ||
         n == "adapter_config.json" || n.starts_with("checkpoint-") || n.starts_with(".checkpoint-") ||
         n.starts_with(".adapter_") || n.starts_with(".metrics.jsonl") || n.starts_with(".config.yaml") ||
         n == "report.html" || n == "run.json" || n.starts_with(".report.html") || n.starts_with(".run.json");
}

// Inputs that must exist, checked before anything is written.
void check_input_paths(const RunConfig& c) {
  if (!fs::is_directory(c.model)) throw UserError(c.model.string() + ": no such model directory (--model)");
  if (!fs::is_regular_file(c.data)) throw UserError(c.data.string() + ": no such data file (--data)");
  if (!c.eval_data.empty() && !fs::is_regular_file(c.eval_data))
    throw UserError(c.eval_data.string() + ": no such evaluation data file (--eval-data)");
  if (!c.init_adapter.empty() && !fs::is_regular_file(c.init_adapter / "adapter_config.json"))
    throw UserError(c.init_adapter.string() + ": no adapter_config.json there (--init-adapter wants a PEFT adapter directory)");
}

// Creates OUT (or accepts an existing directory).
void ensure_out_dir(const RunConfig& c) {
  std::error_code ec;
  if (fs::exists(c.out) && !fs::is_directory(c.out))
    throw UserError(c.out.string() + ": exists and is not a directory; choose another --out");
  fs::create_directories(c.out, ec);
  if (ec) throw OutputError(c.out.string() + ": cannot create the run directory (" + ec.message() + ")");
}

// Makes OUT ready for a fresh run: refuses one that holds another run unless --overwrite.
void prepare_fresh_out(const RunConfig& c) {
  std::error_code ec;
  std::vector<fs::path> previous;
  for (const auto& e : fs::directory_iterator(c.out))
    if (is_run_file(e.path())) previous.push_back(e.path());
  if (previous.empty()) return;
  if (!c.overwrite)
    throw UserError(c.out.string() + ": holds another run (" + previous.front().filename().string() +
                    "); continue it with --resume " + c.out.string() + ", replace it with --overwrite, or choose another --out");
  for (const auto& p : previous) fs::remove_all(p, ec);
}

// The stream of micro-batches over epochs (see trainer.h).
class BatchStream {
 public:
  BatchStream(const data::Dataset& d, int32_t batch) : d_(d), batch_(batch) {}
  void seek(int64_t epoch, int64_t index) {
    epoch_ = epoch;
    index_ = index;
  }
  data::Batch next() {
    while (index_ >= d_.num_batches(epoch_, batch_)) {
      ++epoch_;
      index_ = 0;
    }
    return d_.batch(epoch_, index_++, batch_);
  }
  // Position of the next micro-batch (normalised to the next epoch when this one is done).
  std::pair<int64_t, int64_t> position() {
    if (index_ >= d_.num_batches(epoch_, batch_)) return {epoch_ + 1, 0};
    return {epoch_, index_};
  }
  double fractional_epoch() {
    auto [e, i] = position();
    return double(e) + double(i) / double(std::max<int64_t>(1, d_.num_batches(e, batch_)));
  }

 private:
  const data::Dataset& d_;
  int32_t batch_;
  int64_t epoch_ = 0, index_ = 0;
};

model::LoraSettings lora_settings_of(const RunConfig& c) {
  model::LoraSettings s;
  s.rank = c.lora_rank;
  s.alpha = c.lora_alpha;
  s.dropout = c.lora_dropout;
  s.rslora = c.rslora;
  s.targets.fill(false);
  for (const auto& t : c.lora_targets)
    for (model::LinearKind k : model::kAllLinears)
      if (t == model::linear_name(k)) s.targets[size_t(k)] = true;
  return s;
}

std::string targets_text(const model::LoraSettings& s) {
  std::string out;
  for (model::LinearKind k : model::kAllLinears)
    if (s.targets[size_t(k)]) out += (out.empty() ? "" : ",") + std::string(model::linear_name(k));
  return out;
}

class Run {
 public:
  explicit Run(const RunConfig& c) : c_(c) {}
  int execute();
  // What a GPU failure leaves: "the last checkpoint, OUT/checkpoint-N, is intact; ..." or that
  // there is none yet.
  std::string what_is_safe() const;

 private:
  void load();
  double evaluate();
  void save(bool final_adapter);
  void save_unguarded(bool final_adapter);
  [[noreturn]] void stop_on_output_error(const OutputError& e);
  void log_step(double loss, double grad_norm, double lr);
  double sum_over_ranks(double loss_sum);
  bool agree_to_stop();
  void check_step_shape(const fs::path& checkpoint) const;
  void report(const char* state);

  RunConfig c_;
  dist::World& world_ = dist::World::get();
  std::vector<float> grads_host_;  // the gradients on their way through the all-reduce
  std::unique_ptr<gpu::Context> ctx_;
  model::ModelConfig mc_;
  std::optional<data::Tokenizer> tokenizer_;
  std::optional<data::Dataset::Split> data_;
  std::optional<model::BaseWeights> base_;
  std::unique_ptr<model::LoraSet> lora_;
  std::unique_ptr<model::Transformer> tf_;
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<io::RunLock> lock_;  // rank 0 holds OUT for the whole run
  std::optional<BatchStream> stream_;
  gpu::Buffer loss_sum_;
  io::LoraTargetShapes shapes_;
  TrainerState st_;
  std::string config_yaml_;
  bool tty_ = false;
  int64_t last_saved_step_ = -1, last_eval_step_ = -1;
  // for tokens/s over the last logging interval
  Clock::time_point interval_start_;
  int64_t interval_tokens_ = 0;
  double elapsed_before_ = 0;
  int64_t steps_at_start_ = 0;  // training time of earlier sessions (resume)
  Clock::time_point session_start_;
};

void Run::load() {
  mc_ = model::load_model_config(c_.model);
  shapes_ = model::lora_target_shapes(mc_);
  // Token-id data needs no tokenizer; the dataset asks for one when a line holds text.
  if (fs::exists(c_.model / "tokenizer.json")) tokenizer_.emplace(data::Tokenizer::load(c_.model));

  // Data first: its errors (bad lines) are the most likely and cost nothing on the GPU.
  data::DatasetOptions dopt;
  dopt.seq_len = int32_t(c_.seq_len);
  dopt.train_on_inputs = c_.train_on_inputs;
  if (c_.packing != Toggle::automatic) dopt.packing = c_.packing == Toggle::on;
  dopt.seed = c_.seed;
  dopt.shuffle = !c_.no_shuffle;
  dopt.eval_split = c_.eval_split;
  dopt.eval_file = c_.eval_data;
  dopt.chat_template = c_.chat_template;
  dopt.vocab_size = int32_t(mc_.vocab_size);
  dopt.tokenizer_file = c_.model / "tokenizer.json";
  data_.emplace(data::Dataset::load(c_.data, tokenizer_ ? &*tokenizer_ : nullptr, dopt));
  std::printf("%s\n", data_->train.stats().summary().c_str());
  if (data_->train.num_examples() == 0) throw UserError(c_.data.string() + ": no usable training example");

  // Steps: the epochs' micro-batches in steps of grad_accum, unless --max-steps says otherwise.
  int64_t micro = 0;
  for (int64_t e = 0; e < c_.epochs; ++e) micro += data_->train.num_batches(e, int32_t(c_.batch_size));
  const int64_t per_step = c_.grad_accum * world_.size();
  const int64_t from_epochs = (micro + per_step - 1) / per_step;
  if (st_.total_steps == 0) st_.total_steps = c_.max_steps > 0 ? c_.max_steps : from_epochs;

  // One GPU per rank of this machine (--device overrides); only rank 0 prints notices.
  ctx_ = gpu::Context::create(c_.device, !world_.is_root(), world_.local_rank());
  // --precision auto becomes what this device runs best; config.yaml records the result.
  std::printf("%s\n", model::describe_precision_choice(c_.precision, *ctx_).c_str());
  const model::Precision precision = model::resolve_precision(c_.precision, *ctx_);
  c_.precision = precision;
  config_yaml_ = c_.to_yaml();
  std::printf("model: %s, %lld layers, hidden %lld, vocab %lld\n", mc_.model_type.c_str(), (long long)mc_.num_layers,
              (long long)mc_.hidden_size, (long long)mc_.vocab_size);
  model::TrainingSettings ts;
  ts.batch = c_.batch_size;
  ts.seq_len = c_.seq_len;
  ts.lora_rank = c_.lora_rank;
  ts.double_quant = c_.double_quant;
  ts.checkpointing = c_.checkpointing();
  ts.lora_dropout = c_.lora_dropout;
  ts.dense_weight_bytes = precision == model::Precision::mixed ? 2 : 4;
  ts.fused_attention_backward = precision == model::Precision::mixed &&
                                ops::attention_fused_backward_enabled(*ctx_, static_cast<uint32_t>(mc_.head_dim));
  ts.attention_qk_f16 = model::attention_keeps_fp16_qk(*ctx_, mc_, static_cast<uint32_t>(ts.batch),
                                                       static_cast<uint32_t>(ts.seq_len), ts.fused_attention_backward);
  ts.nf4 = c_.quant == model::BaseQuant::nf4;
  ts.targets.clear();
  for (model::LinearKind k : model::kAllLinears)
    if (lora_settings_of(c_).targets[size_t(k)]) ts.targets.push_back(k);
  model::choose_kept_activations(mc_, ts, ctx_->info().device_local_bytes());
  const model::MemoryPlan plan = model::plan_training_memory(mc_, ts);
  std::printf("memory plan (estimate): %s\n", gib(plan.total()).c_str());
  for (const auto& p : plan.parts) std::printf("  %-28s %10s  %s\n", p.name.c_str(), gib(p.bytes).c_str(), p.note.c_str());

  const auto checkpoint = io::SafetensorsCheckpoint::open(c_.model);
  model::BaseWeightOptions bo;
  bo.quant = c_.quant;
  bo.double_quant = c_.double_quant;
  bo.dense_dtype = model::dense_dtype_for(precision);
  std::printf("loading the base model (%s)...\n", c_.quant == model::BaseQuant::nf4 ? "quantising to NF4" : "16-bit");
  std::fflush(stdout);
  base_.emplace(model::load_base_weights(*ctx_, checkpoint, mc_, bo));

  model::LoraSettings ls = lora_settings_of(c_);
  std::optional<io::Adapter> start;
  if (!c_.resume.empty()) {
    // set by execute()
  } else if (!c_.init_adapter.empty()) {
    start = io::load_adapter(c_.init_adapter, shapes_);
    const model::LoraSettings from = model::LoraSettings::from_peft(start->config);
    // The adapter decides rank, alpha and targets; flags that contradict it are an error.
    auto clash = [&](const char* key, bool differs) {
      if (differs && c_.explicitly_set.count(key))
        throw UserError("--" + std::string(key) + " differs from the --init-adapter's adapter_config.json; leave it out");
    };
    clash("lora-rank", from.rank != ls.rank);
    clash("lora-alpha", from.alpha != ls.alpha);
    clash("lora-targets", from.targets != ls.targets);
    clash("rslora", from.rslora != ls.rslora);
    ls.rank = from.rank;
    ls.alpha = from.alpha;
    ls.targets = from.targets;
    ls.rslora = from.rslora;
  }
  std::printf("LoRA: r %lld, alpha %g (scale %g%s), dropout %g, targets %s\n", (long long)ls.rank, ls.alpha,
              ls.scale(), ls.rslora ? ", rsLoRA" : "", ls.dropout, targets_text(ls).c_str());
  lora_ = std::make_unique<model::LoraSet>(*ctx_, mc_, ls);
  if (start) lora_->load(*start);
  else lora_->init_peft(c_.seed);
  std::printf("trainable parameters: %llu\n", (unsigned long long)lora_->parameter_count());

  model::TransformerOptions transformer_options{precision};
  transformer_options.keep_attention = ts.keep_attention;
  transformer_options.keep_lora_inputs = ts.keep_lora_inputs;
  tf_ = std::make_unique<model::Transformer>(*ctx_, *base_, *lora_, uint32_t(c_.batch_size), uint32_t(c_.seq_len),
                                             c_.checkpointing(), transformer_options);
  OptimizerSettings os;
  os.lr = c_.lr;
  os.beta1 = c_.adam_beta1;
  os.beta2 = c_.adam_beta2;
  os.eps = c_.adam_eps;
  os.weight_decay = c_.weight_decay;
  os.max_grad_norm = c_.max_grad_norm;
  os.schedule = c_.lr_schedule;
  os.total_steps = st_.total_steps;
  os.warmup_steps = c_.warmup_for(st_.total_steps);
  adamw_ = std::make_unique<AdamW>(*ctx_, *lora_, os);
  loss_sum_ = ctx_->alloc(16, "loss sum");
  stream_.emplace(data_->train, int32_t(c_.batch_size));
  std::printf("GPU memory in use after loading: %s\n", gib(ctx_->arena().bytes_in_use()).c_str());
}

double Run::evaluate() {
  if (!data_->eval) return NAN;
  const data::Dataset& ev = *data_->eval;
  const int64_t n = ev.num_batches(0, int32_t(c_.batch_size));
  uint64_t targets = 0;
  ctx_->fill(loss_sum_, 0);
  // Each rank evaluates every size()-th batch; the sums meet in one all-reduce.
  for (int64_t i = world_.rank(); i < n; i += world_.size()) {
    const model::TokenBatch b = to_token_batch(ev.batch(0, i, int32_t(c_.batch_size)));
    targets += b.target_count();
    tf_->run(b, 1.0f, loss_sum_, false);
  }
  double sums[2] = {double(ctx_->download<float>(loss_sum_, 1)[0]), double(targets)};
  world_.sum(std::span<double>(sums, 2));
  targets = uint64_t(sums[1]);
  const double loss = sums[0] / double(std::max<uint64_t>(1, targets));
  last_eval_step_ = st_.step;
  const double ppl = std::exp(loss);
  if (tty_) std::fprintf(stderr, "\r\033[K");
  std::printf("eval step %lld: loss %.4f, perplexity %.3f (%llu tokens)\n", (long long)st_.step, loss, ppl,
              (unsigned long long)targets);
  std::fflush(stdout);
  if (metrics_) metrics_->append(json{{"step", st_.step}, {"eval_loss", loss}, {"eval_ppl", ppl}});
  return loss;
}

void Run::save(bool final_adapter) {
  if (!world_.is_root()) return;  // the ranks hold the same adapter and moments: rank 0 writes
  if (last_saved_step_ == st_.step && !final_adapter) return;
  try {
    save_unguarded(final_adapter);
  } catch (const OutputError& e) {
    stop_on_output_error(e);
  }
}

// Disk full and the like: say what is still good and how to go on (exit 3, cli/main.cpp).
void Run::stop_on_output_error(const OutputError& e) {
  const auto all = list_checkpoints(c_.out);
  if (tty_) std::fprintf(stderr, "\r\033[K");
  throw OutputError(std::string(e.what()) + "; training stopped at step " + std::to_string(st_.step) +
                    ". The last good checkpoint is " + (all.empty() ? std::string("none") : all.back().string()) +
                    "; make room (or fix --out) and continue with forja train --resume " + c_.out.string());
}

void Run::save_unguarded(bool final_adapter) {
  const io::Adapter adapter = lora_->to_adapter(fs::absolute(c_.model).string());
  if (last_saved_step_ != st_.step) {
    Checkpoint ck;
    ck.state = st_;
    auto [e, i] = stream_->position();
    ck.state.epoch = e;
    ck.state.batch_in_epoch = i;
    ck.state.elapsed_s = elapsed_before_ + std::chrono::duration<double>(Clock::now() - session_start_).count();
    ck.adapter = adapter;
    ck.adam_m = lora_->to_slot_order(ctx_->download<float>(adamw_->m(), lora_->parameter_count()));
    ck.adam_v = lora_->to_slot_order(ctx_->download<float>(adamw_->v(), lora_->parameter_count()));
    const fs::path dir = save_checkpoint(c_.out, ck, shapes_, config_yaml_);
    prune_checkpoints(c_.out, c_.keep_checkpoints);
    last_saved_step_ = st_.step;
    if (tty_) std::fprintf(stderr, "\r\033[K");
    std::printf("saved %s\n", dir.string().c_str());
    std::fflush(stdout);
  }
  if (final_adapter) {
    io::save_adapter(c_.out, adapter, shapes_);
    std::printf("adapter written to %s (adapter_model.safetensors, adapter_config.json)\n", c_.out.string().c_str());
  }
}

void Run::log_step(double loss, double grad_norm, double lr) {
  const auto now = Clock::now();
  const double interval = std::chrono::duration<double>(now - interval_start_).count();
  const double tps = interval > 0 ? double(interval_tokens_) / interval : 0.0;
  const double elapsed = elapsed_before_ + std::chrono::duration<double>(now - session_start_).count();
  const double epoch = stream_->fractional_epoch();
  const bool logged = st_.step % c_.log_every == 0 || st_.step == st_.total_steps || st_.step == 1;
  const double per_step = std::chrono::duration<double>(now - session_start_).count() /
                          double(std::max<int64_t>(1, st_.step - steps_at_start_));
  char line[320];
  const std::string ranks = world_.distributed() ? " on " + std::to_string(world_.size()) + " ranks" : "";
  std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s%s | ETA %s | GPU %s",
                (long long)st_.step, (long long)st_.total_steps, loss, lr, grad_norm, tps, ranks.c_str(),
                duration(per_step * double(st_.total_steps - st_.step)).c_str(),
                gib(ctx_->arena().peak_bytes()).c_str());
  if (tty_) std::fprintf(stderr, "\r\033[K%s", line);
  if (logged) {
    if (tty_) std::fprintf(stderr, "\r\033[K");
    std::printf("%s\n", line);
    std::fflush(stdout);
    if (metrics_) metrics_->append(json{{"step", st_.step},
                          {"epoch", epoch},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", grad_norm},
                          {"tokens", st_.tokens},
                          {"tokens_per_s", tps},
                          {"elapsed_s", elapsed},
                          {"gpu_mem_gib", double(ctx_->arena().peak_bytes()) / double(1ull << 30)}});
    interval_start_ = now;
    interval_tokens_ = 0;
  }
}

// The step's hook for data-parallel runs (train/step.h): sums the LoRA gradients over all ranks
// in place (each rank holds those of its own micro-batches) and returns the sum of every rank's
// loss sum; the gradients on every rank then equal those one process would have accumulated
// over all the micro-batches.
double Run::sum_over_ranks(double loss_sum) {
  const gpu::Buffer g = lora_->grads();
  grads_host_.resize(g.size / sizeof(float));
  ctx_->download(g, grads_host_.data(), g.size);
  world_.sum(std::span<float>(grads_host_));
  ctx_->upload(g, grads_host_.data(), g.size);
  world_.sum(std::span<double>(&loss_sum, 1));
  return loss_sum;
}

// Whether any rank was asked to stop (SIGINT/SIGTERM): all ranks stop after the same step.
bool Run::agree_to_stop() {
  int64_t flag = g_stop_requested ? 1 : 0;
  world_.max(std::span<int64_t>(&flag, 1));
  return flag != 0;
}

// A resumed run continues exactly only with steps of the same micro-batches: same batch size
// and ranks x --grad-accum as the checkpoint's (any split between the two is fine).
void Run::check_step_shape(const fs::path& checkpoint) const {
  const int64_t per_step = c_.grad_accum * world_.size();
  if (st_.micro_batches_per_step == 0) return;  // an earlier version's checkpoint: not recorded
  if (st_.batch_size != 0 && st_.batch_size != c_.batch_size)
    throw UserError(checkpoint.string() + ": written with --batch-size " + std::to_string(st_.batch_size) +
                    ", this run has " + std::to_string(c_.batch_size) + "; resume with --batch-size " +
                    std::to_string(st_.batch_size));
  if (st_.micro_batches_per_step == per_step) return;
  const int64_t ckpt = st_.micro_batches_per_step;
  std::string fix = ckpt % world_.size() == 0
                        ? "pass --grad-accum " + std::to_string(ckpt / world_.size()) + " to continue exactly with " +
                              std::to_string(world_.size()) + (world_.size() == 1 ? " process" : " ranks")
                        : "use a number of ranks that divides " + std::to_string(ckpt);
  throw UserError(checkpoint.string() + ": written by " + std::to_string(st_.world_size) +
                  (st_.world_size == 1 ? " process" : " ranks") + " taking " + std::to_string(ckpt) +
                  " micro-batches per step; this run takes " + std::to_string(world_.size()) + " x --grad-accum " +
                  std::to_string(c_.grad_accum) + " = " + std::to_string(per_step) + "; " + fix);
}

// OUT/run.json (device, state) and OUT/report.html from OUT's files (train/report.h); rank 0's.
void Run::report(const char* state) {
  if (!world_.is_root()) return;
  const gpu::DeviceInfo& d = ctx_->info();
  try {
    write_run_status(c_.out, {d.name, d.type_name(), d.driver_name + " " + d.driver_info, state, st_.step,
                              st_.total_steps});
    update_run_report(c_.out);
  } catch (const OutputError& e) {
    stop_on_output_error(e);
  }
  if (std::string_view(state) != "running")
    std::printf("report written to %s\n", (c_.out / "report.html").string().c_str());
}

int Run::execute() {
  world_.join();
  if (!world_.is_root()) {
    // Ranks other than 0 print nothing but errors (stderr).
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("cannot silence stdout on this rank");
  }
  const bool root = world_.is_root();
  tty_ = root && isatty(fileno(stderr)) != 0;
  std::optional<Checkpoint> resume_from;
  fs::path resume_dir;
  if (!c_.resume.empty()) {
    resume_dir = resolve_resume(c_.resume);
    if (c_.out.empty()) c_.out = resume_dir.parent_path();
  }
  c_.validate();
  check_input_paths(c_);
  // Only rank 0 touches OUT; the others read the checkpoint they resume from (every rank must
  // see OUT: one machine, or a shared filesystem).
  if (root) {
    ensure_out_dir(c_);
    lock_ = std::make_unique<io::RunLock>(c_.out);  // before anything in OUT is removed or written
    if (resume_dir.empty()) prepare_fresh_out(c_);
    else remove_partial_checkpoints(c_.out);
  }
  config_yaml_ = c_.to_yaml();
  std::printf("configuration:\n%s", config_yaml_.c_str());
  if (world_.distributed()) {
    std::printf("distributed: %s\n", world_.describe().c_str());
    // Open MPI answers Ctrl-C by sending the ranks SIGCONT, SIGTERM a second later and SIGKILL
    // a second after that (odls_base_sigkill_timeout): too soon to finish a step and save.
    if (std::getenv("OMPI_COMM_WORLD_SIZE"))
      std::printf("to stop and save, send SIGUSR1 to mpirun (pkill -USR1 mpirun); Ctrl-C on mpirun ends the ranks "
                  "without saving (the last checkpoint stays good)\n");
  }
  load();
  if (root) io::write_file_atomic(c_.out / "config.yaml", config_yaml_);
  if (!resume_dir.empty()) {
    resume_from = load_checkpoint(resume_dir, shapes_);
    st_ = resume_from->state;
    check_step_shape(resume_dir);
    if (c_.explicitly_set.count("max-steps") && c_.max_steps > 0) st_.total_steps = c_.max_steps;
    lora_->load(resume_from->adapter);
    if (resume_from->adam_m.size() != lora_->parameter_count())
      throw UserError(resume_dir.string() + ": its optimizer state does not fit this adapter; the checkpoint belongs to another configuration");
    ctx_->upload(adamw_->m(), lora_->from_slot_order(resume_from->adam_m));
    ctx_->upload(adamw_->v(), lora_->from_slot_order(resume_from->adam_v));
    stream_->seek(st_.epoch, st_.batch_in_epoch);
    elapsed_before_ = st_.elapsed_s;
    last_saved_step_ = st_.step;
    std::printf("resuming from %s at step %lld of %lld\n", resume_dir.string().c_str(), (long long)st_.step,
                (long long)st_.total_steps);
  }
  st_.seed = c_.seed;
  const int64_t per_rank = c_.grad_accum;
  const int64_t per_step = per_rank * world_.size();
  st_.world_size = world_.size();
  st_.micro_batches_per_step = per_step;
  st_.batch_size = c_.batch_size;
  if (root) metrics_ = std::make_unique<MetricsLog>(c_.out / "metrics.jsonl", st_.step);
  // The schedule's total must be the run's total (resume may have changed it via --max-steps).
  adamw_->set_schedule_length(st_.total_steps, c_.warmup_for(st_.total_steps));
  const std::string ranks = world_.distributed() ? std::to_string(world_.size()) + " ranks x " : "";
  std::printf("training %lld steps of %s%lld x %lld micro-batches of %lld tokens (warm-up %lld, %s schedule)\n",
              (long long)st_.total_steps, ranks.c_str(), (long long)c_.grad_accum, (long long)c_.batch_size,
              (long long)c_.seq_len, (long long)adamw_->settings().warmup_steps, schedule_name(c_.lr_schedule));
  std::fflush(stdout);

  report("running");
  std::printf("training report: %s (rewritten at each checkpoint)\n", (c_.out / "report.html").string().c_str());
  SignalGuard signals;
  session_start_ = interval_start_ = Clock::now();
  steps_at_start_ = st_.step;
  bool stop = false;
  while (st_.step < st_.total_steps && !stop) {
    // A step is the next per_step micro-batches of the stream, in order; rank r trains on the
    // r-th run of --grad-accum of them. Every rank walks the whole step (cheap, on the CPU), so
    // all know its loss-token count and keep the same stream position.
    std::vector<model::TokenBatch> mine;
    std::vector<uint64_t> place;  // each one's position in the step: picks its dropout stream
    StepInput in;
    in.step = st_.step;
    in.dropout_seed = c_.seed;
    int64_t tokens = 0;
    for (int64_t j = 0; j < per_step; ++j) {
      const data::Batch b = stream_->next();
      tokens += b.tokens;
      model::TokenBatch tb = to_token_batch(b);
      in.targets += tb.target_count();
      if (j / per_rank != world_.rank()) continue;
      mine.push_back(std::move(tb));
      place.push_back(uint64_t(j));
    }
    for (size_t j = 0; j < mine.size(); ++j) in.micro_batches.push_back({&mine[j], place[j]});
    StepHooks hooks;
    hooks.after_micro_batch = [] { kill_point("step: a micro-batch's forward and backward"); };
    if (world_.distributed()) hooks.reduce = [this](double loss_sum) { return sum_over_ranks(loss_sum); };
    const StepResult r = train::step({*ctx_, *tf_, *lora_, *adamw_, loss_sum_}, in, hooks);
    const double loss = r.loss, norm = r.grad_norm;
    // Every rank sees the same reduced loss and norm, so all take the same branch below.
    if (!r.applied) {
      // In mixed precision, which base product input (if any) went beyond fp16's range.
      const std::string overflow = tf_->fp16_range_report();
      if (!c_.skip_nonfinite) {
        if (tty_) std::fprintf(stderr, "\r\033[K");
        const auto all = list_checkpoints(c_.out);
        if (root)
          std::fprintf(stderr,
                       "forja: step %lld: the loss (%g) or gradient norm (%g) is not finite; training stopped, the "
                       "adapter was not updated. Last good checkpoint: %s. Lower --lr, raise --warmup-steps, or pass "
                       "--skip-nonfinite to skip such steps.%s\n",
                       (long long)st_.step + 1, loss, norm, all.empty() ? "none" : all.back().string().c_str(),
                       !overflow.empty() ? (" The cause: " + overflow + "; resume with --precision fp32.").c_str()
                       : c_.precision == model::Precision::mixed
                           ? " With --precision mixed an activation beyond fp16's range (65504) entering a matrix "
                             "product does this too: resume with --precision fp32."
                           : "");
        report("failed");
        return 3;
      }
      ++st_.skipped_nonfinite;
      if (tty_) std::fprintf(stderr, "\r\033[K");
      std::printf("step %lld: loss or gradients not finite, skipped (%lld so far)%s\n", (long long)st_.step + 1,
                  (long long)st_.skipped_nonfinite, overflow.empty() ? "" : ("; " + overflow).c_str());
    }
    kill_point("step: the optimizer's update");
    ++st_.step;
    st_.tokens += tokens;
    st_.last_loss = loss;
    interval_tokens_ += tokens;
    log_step(loss, norm, r.lr);
    // Test hooks (util/test_hooks.h): FORJA_TEST_SIGTERM_AFTER_STEP=N sends this process SIGTERM
    // after step N, so the tests can check the stop-and-save path without racing a fast GPU from
    // outside; FORJA_TEST_DEVICE_LOST_AFTER_STEP=N fails the next submit after step N as a lost
    // device does (VK_ERROR_DEVICE_LOST), which lavapipe cannot be made to do.
    if (test_hooks().sigterm_after_step == st_.step) ::raise(SIGTERM);
    if (test_hooks().device_lost_after_step == st_.step)
      gpu::vk_fail(VK_ERROR_DEVICE_LOST, "vkQueueSubmit (FORJA_TEST_DEVICE_LOST_AFTER_STEP)", __FILE__, __LINE__);
    maybe_fail_rank_for_test(world_.rank(), st_.step);
    if (data_->eval && c_.eval_every > 0 && st_.step % c_.eval_every == 0) evaluate();
    if (c_.save_every > 0 && st_.step % c_.save_every == 0) {
      save(false);
      report("running");
    }
    stop = agree_to_stop();
  }
  if (tty_) std::fprintf(stderr, "\r\033[K");
  if (stop && st_.step < st_.total_steps) {
    save(false);
    report("stopped");
    std::printf("stopped by a signal at step %lld of %lld; continue with: forja train --resume %s\n",
                (long long)st_.step, (long long)st_.total_steps, c_.out.string().c_str());
    return 0;
  }
  if (data_->eval && last_eval_step_ != st_.step) evaluate();
  save(true);
  report("finished");
  const double elapsed = elapsed_before_ + std::chrono::duration<double>(Clock::now() - session_start_).count();
  std::printf("done: %lld steps, %lld tokens in %s, final loss %.4f%s; peak GPU memory %s\n", (long long)st_.step,
              (long long)st_.tokens, duration(elapsed).c_str(), st_.last_loss,
              st_.skipped_nonfinite ? (", " + std::to_string(st_.skipped_nonfinite) + " non-finite steps skipped").c_str() : "",
              gib(ctx_->arena().peak_bytes()).c_str());
  return 0;
}

std::string Run::what_is_safe() const {
  if (c_.out.empty() || !world_.is_root()) return "";
  const auto all = list_checkpoints(c_.out);
  if (all.empty()) return " No checkpoint had been written yet.";
  return " The last checkpoint, " + all.back().string() + ", is intact: continue with forja train --resume " +
         c_.out.string() + ".";
}

}  // namespace

// GPU failures (cli/main.cpp gives each its exit code): what happened, what to change, and what
// of the run is safe.
int run_training(const RunConfig& config) {
  Run run(config);
  try {
    return run.execute();
  } catch (const gpu::OutOfMemory& e) {
    throw gpu::OutOfMemory(std::string(e.what()) +
                           "; lower --batch-size or --seq-len, turn --grad-checkpointing on, use --quant nf4, or "
                           "a smaller --lora-rank (a resumed run keeps its --batch-size)." + run.what_is_safe());
  } catch (const gpu::DeviceLost& e) {
    throw gpu::DeviceLost(std::string(e.what()) +
                          "; check the driver's log (dmesg), update the driver, or lower the load (--batch-size, "
                          "--seq-len)." + run.what_is_safe());
  }
}

}  // namespace forja::train
