#include "train/parity_support.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>

#include "io/adapter.h"
#include "model/config.h"
#include "model/nf4.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace forja::test {

namespace fs = std::filesystem;
using nlohmann::json;

void run_once(const std::function<void()>& action, const fs::path& marker) {
  fs::create_directories(marker.parent_path());
  const std::string lock_path = marker.string() + ".lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + lock_path);
  try {
    if (!fs::exists(marker)) {
      action();
      std::ofstream(marker) << "ok\n";
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // releases the lock
}

void run_once(const std::string& command, const fs::path& marker) {
  run_once([&] {
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  }, marker);
}

const fs::path& parity_cases_dir() {
  static const fs::path dir = [] {
    const char* env = std::getenv("FORJA_PARITY_DIR");
    if (env && *env) return fs::path(env);
    const fs::path d = fs::path(FORJA_BINARY_DIR) / "parity_cases";
    run_once("rm -rf " + d.string() + " && /usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) +
                 "/tests/reference/parity_cases.py --out " + d.string() + " > " + d.string() + ".log 2>&1",
             fs::path(FORJA_BINARY_DIR) / "parity_cases.done");
    return d;
  }();
  return dir;
}

fs::path parity_case_dir(const std::string& name) {
  const fs::path d = parity_cases_dir() / name;
  // A build directory that generated its cases before `name` was added makes just that case.
  if (!fs::exists(d / "case.json"))
    run_once("/usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) + "/tests/reference/parity_cases.py --out " +
                 parity_cases_dir().string() + " --cases " + name + " > " + d.string() + ".log 2>&1",
             fs::path(FORJA_BINARY_DIR) / ("parity_case_" + name + ".done"));
  return d;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return json::parse(f);
}

std::vector<model::TokenBatch> read_batches(const fs::path& p) {
  std::vector<model::TokenBatch> out;
  const json file = read_json(p);  // kept alive: a range-for over a temporary's member dangles
  for (const json& mb : file.at("micro_batches")) {
    model::TokenBatch b;
    const auto& ids = mb.at("input_ids");
    b.batch = static_cast<uint32_t>(ids.size());
    b.seq = static_cast<uint32_t>(ids[0].size());
    for (uint32_t r = 0; r < b.batch; ++r)
      for (uint32_t t = 0; t < b.seq; ++t) {
        b.input_ids.push_back(ids[r][t].get<int32_t>());
        // the target of position t is the label of t + 1 (the loss shifts inside)
        b.targets.push_back(t + 1 < b.seq ? mb.at("labels")[r][t + 1].get<int32_t>() : -100);
        b.positions.push_back(mb.contains("position_ids") ? mb["position_ids"][r][t].get<int32_t>() : int32_t(t));
        b.segments.push_back(mb.contains("segment_ids") ? mb["segment_ids"][r][t].get<int32_t>() : 1);
      }
    out.push_back(std::move(b));
  }
  return out;
}

std::pair<uint32_t, uint32_t> max_batch_shape(const std::vector<model::TokenBatch>& batches) {
  uint32_t max_b = 0, max_s = 0;
  for (const auto& b : batches) {
    max_b = std::max(max_b, b.batch);
    max_s = std::max(max_s, b.seq);
  }
  return {max_b, max_s};
}

void expect_losses_match(const std::vector<double>& losses, const fs::path& losses_json, double tol) {
  const auto ref = read_json(losses_json).at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), ref.size());
  double worst = 0;
  size_t worst_step = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref[i], tol * std::abs(ref[i])) << "step " << i;
    const double rel = std::abs(losses[i] - ref[i]) / std::max(std::abs(ref[i]), 1e-30);
    if (rel > worst) {
      worst = rel;
      worst_step = i;
    }
  }
  std::printf("[parity] %zu step losses: max relative difference %.3g (step %zu, tolerance %.0e)\n", losses.size(),
              worst, worst_step, tol);
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

namespace {

// Every LoRA gradient in lora.grads() against the reference's (relative error < tol per tensor).
void expect_gradients_match(gpu::Context& ctx, model::LoraSet& lora, const io::SafetensorsFile& ref, double tol) {
  double worst = 0;
  std::string worst_key;
  const std::vector<float> grads = ctx.download<float>(lora.grads(), lora.parameter_count());
  for (const model::LoraSlot& s : lora.slots()) {
    const std::string module = std::string(model::linear_module(s.kind)) + "." + model::linear_name(s.kind);
    for (char which : {'A', 'B'}) {
      const std::string key = io::lora_tensor_name(s.layer, module, which);
      const uint64_t off = which == 'A' ? s.a_offset : s.b_offset;
      const uint64_t len = which == 'A' ? uint64_t(s.rank) * s.in : uint64_t(s.out) * s.rank;
      const std::vector<float> got(grads.begin() + off, grads.begin() + off + len);
      const std::vector<float> want = ref.tensor(key).to_float();
      EXPECT_EQ(got.size(), want.size()) << key;
      if (got.size() == want.size()) {
        const double e = rel_error(got, want);
        EXPECT_LT(e, tol) << key;
        if (e >= worst) {
          worst = e;
          worst_key = key;
        }
      }
    }
  }
  std::printf("[parity] step-0 LoRA gradients: max relative error %.3g (%s, tolerance %.0e)\n", worst,
              worst_key.c_str(), tol);
}

}  // namespace

std::vector<double> train_like_reference(gpu::Context& ctx, model::Transformer& tf, model::LoraSet& lora,
                                         const std::vector<model::TokenBatch>& batches, const json& run,
                                         const io::SafetensorsFile& step0_grads, double grad_tol) {
  train::OptimizerSettings os;
  os.lr = run.at("lr").get<double>();
  os.beta1 = run.at("betas")[0].get<double>();
  os.beta2 = run.at("betas")[1].get<double>();
  os.eps = run.at("eps").get<double>();
  os.weight_decay = run.at("weight_decay").get<double>();
  os.max_grad_norm = run.at("max_grad_norm").get<double>();
  os.schedule = train::parse_schedule(run.at("schedule").get<std::string>());
  os.warmup_steps = run.at("warmup").get<int64_t>();
  os.total_steps = run.at("steps").get<int64_t>();
  train::AdamW adamw(ctx, lora, os);
  const int64_t accum = run.at("grad_accum").get<int64_t>();
  // LoRA dropout masks: forja's stream (seed, step, micro-batch j of the step), as
  // reference_run.py --dropout-rng hash applies them (no effect when the adapter's p is 0).
  const uint64_t dropout_seed = run.value("seed", uint64_t{0});

  gpu::Buffer loss_sum = ctx.alloc(16);
  const train::StepEngine engine{ctx, tf, lora, adamw, loss_sum};
  std::vector<double> losses;
  for (int64_t step = 0; step < os.total_steps; ++step) {
    // step s uses micro-batches (s * accum + j) mod M, as reference_run.py does
    train::StepInput in;
    in.step = step;
    in.dropout_seed = dropout_seed;
    for (int64_t j = 0; j < accum; ++j) {
      const model::TokenBatch& b = batches[(step * accum + j) % batches.size()];
      in.micro_batches.push_back({&b, static_cast<uint64_t>(j)});
      in.targets += b.target_count();
    }
    train::StepHooks hooks;
    if (step == 0) hooks.gradients_ready = [&] { expect_gradients_match(ctx, lora, step0_grads, grad_tol); };
    losses.push_back(train::step(engine, in, hooks).loss);
  }
  ctx.free(loss_sum);
  return losses;
}

namespace {

// Writes `out` (config.json, model.safetensors) with every projection weight of `src` replaced
// by dequant(quant(W)) in F32, the weights forja's NF4 base multiplies by.
void write_dequantized_model(const fs::path& src, const fs::path& out) {
  const model::ModelConfig config = model::load_model_config(src);
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src);
  std::set<std::string> linears;
  for (int64_t i = 0; i < config.num_layers; ++i)
    for (model::LinearKind k : model::kAllLinears) linears.insert(model::linear_path(i, k) + ".weight");
  const std::vector<std::string> names = ck.names();
  std::vector<std::vector<float>> storage;  // reserved: the spans below point into it
  storage.reserve(names.size());
  std::vector<io::TensorToWrite> tensors;
  for (const std::string& name : names) {
    const io::TensorView t = ck.tensor(name);
    if (linears.count(name)) {
      quant::Nf4Tensor q = model::nf4_quantize_tensor(t, quant::Nf4Options{true, 1});
      storage.push_back(quant::nf4_dequantize(q));
    } else {
      storage.push_back(t.to_float());
    }
    tensors.push_back({name, io::Dtype::F32, t.shape(), std::as_bytes(std::span(storage.back())), {}});
  }
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  io::write_safetensors(out / "model.safetensors", std::move(tensors));
}

}  // namespace

fs::path nf4_parity_case(const std::string& name) {
  const fs::path src_case = parity_cases_dir() / name;
  const fs::path dir = parity_cases_dir() / ("nf4-" + name);
  if (fs::exists(dir / "ref" / "losses.json") && fs::exists(dir / "ref.done")) return dir;
  const json run = read_json(src_case / "ref" / "run.json");
  const std::string model_dir = (dir / "model").string();
  run_once([&] { write_dequantized_model(src_case / "model", dir / "model"); }, dir / "model.done");
  run_once("/usr/bin/python3 " + std::string(FORJA_SOURCE_DIR) + "/tests/reference/reference_run.py" +
               " --model " + model_dir + " --batch " + (src_case / "batch.json").string() + " --adapter " +
               (src_case / "ref" / "initial_adapter").string() + " --out " + (dir / "ref").string() + " --steps " +
               std::to_string(run.at("steps").get<int>()) + " --lr " + std::to_string(run.at("lr").get<double>()) +
               " --schedule " + run.at("schedule").get<std::string>() + " --warmup " +
               std::to_string(run.at("warmup").get<int>()) + " --grad-accum " +
               std::to_string(run.at("grad_accum").get<int>()) + " --weight-decay " +
               std::to_string(run.at("weight_decay").get<double>()) + " --max-grad-norm " +
               std::to_string(run.at("max_grad_norm").get<double>()) + " > " + (dir / "ref.log").string() + " 2>&1",
           dir / "ref.done");
  return dir;
}

void run_parity(gpu::Context& ctx, const ParityRun& r) {
  const fs::path src_case = parity_cases_dir() / r.name;
  const fs::path ref = (r.quant == model::BaseQuant::nf4 ? nf4_parity_case(r.name) : src_case) / "ref";
  std::printf("[parity] %s, base %s, precision %s, kernel %s%s\n", r.name.c_str(),
              r.quant == model::BaseQuant::nf4 ? "nf4" : "dense", model::precision_name(r.options.precision),
              ops::gemm_kernel_name(r.options.base_kernel).c_str(), r.checkpointing ? ", checkpointing" : "");

  const model::ModelConfig config = model::load_model_config(src_case / "model");
  const io::SafetensorsCheckpoint ck = io::SafetensorsCheckpoint::open(src_case / "model");
  model::BaseWeightOptions bo;
  bo.quant = r.quant;
  bo.double_quant = true;
  bo.dense_dtype = model::dense_dtype_for(r.options.precision);
  model::BaseWeights base = model::load_base_weights(ctx, ck, config, bo);
  const io::Adapter initial = io::load_adapter(src_case / "ref" / "initial_adapter", model::lora_target_shapes(config));
  model::LoraSet lora(ctx, config, model::LoraSettings::from_peft(initial.config));
  lora.load(initial);

  const std::vector<model::TokenBatch> batches = read_batches(src_case / "batch.json");
  const auto [max_b, max_s] = max_batch_shape(batches);
  {
    model::Transformer tf(ctx, base, lora, max_b, max_s, r.checkpointing, r.options);
    const std::vector<double> losses =
        train_like_reference(ctx, tf, lora, batches, read_json(src_case / "ref" / "run.json"),
                             io::SafetensorsFile::open(ref / "step0_grads.safetensors"), r.tol);
    expect_losses_match(losses, ref / "losses.json", r.tol);
  }
  model::free_base_weights(ctx, base);
}

}  // namespace forja::test
