#include "train/parity_support.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "io/adapter.h"
#include "model/config.h"
#include "train/optimizer.h"

namespace forja::test {

namespace fs = std::filesystem;
using nlohmann::json;

void run_once(const std::string& command, const fs::path& marker) {
  fs::create_directories(marker.parent_path());
  const std::string lock_path = marker.string() + ".lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + lock_path);
  try {
    if (!fs::exists(marker)) {
      if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
      std::ofstream(marker) << "ok\n";
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // releases the lock
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

void expect_losses_match(const std::vector<double>& losses, const fs::path& losses_json) {
  const auto ref = read_json(losses_json).at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ref[i], 1e-4 * std::abs(ref[i])) << "step " << i;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

std::vector<double> train_like_reference(gpu::Context& ctx, model::Transformer& tf, model::LoraSet& lora,
                                         const std::vector<model::TokenBatch>& batches, const json& run,
                                         const io::SafetensorsFile& step0_grads) {
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
  std::vector<double> losses;
  for (int64_t step = 0; step < os.total_steps; ++step) {
    // step s uses micro-batches (s * accum + j) mod M, as reference_run.py does
    uint64_t n = 0;
    for (int64_t j = 0; j < accum; ++j) n += batches[(step * accum + j) % batches.size()].target_count();
    lora.zero_grads();
    ctx.fill(loss_sum, 0);
    for (int64_t j = 0; j < accum; ++j) {
      tf.set_dropout_seed(dropout_seed, static_cast<uint64_t>(step), static_cast<uint64_t>(j));
      tf.run(batches[(step * accum + j) % batches.size()], static_cast<float>(1.0 / double(n)), loss_sum, true);
    }
    losses.push_back(ctx.download<float>(loss_sum, 1)[0] / double(n));

    if (step == 0) {
      const std::vector<float> grads = ctx.download<float>(lora.grads(), lora.parameter_count());
      for (const model::LoraSlot& s : lora.slots()) {
        const std::string module = std::string(model::linear_module(s.kind)) + "." + model::linear_name(s.kind);
        for (char which : {'A', 'B'}) {
          const std::string key = io::lora_tensor_name(s.layer, module, which);
          const uint64_t off = which == 'A' ? s.a_offset : s.b_offset;
          const uint64_t len = which == 'A' ? uint64_t(s.rank) * s.in : uint64_t(s.out) * s.rank;
          const std::vector<float> got(grads.begin() + off, grads.begin() + off + len);
          const std::vector<float> want = step0_grads.tensor(key).to_float();
          EXPECT_EQ(got.size(), want.size()) << key;
          if (got.size() == want.size()) {
            EXPECT_LT(rel_error(got, want), 1e-4) << key;
          }
        }
      }
    }
    adamw.step(step);
  }
  ctx.free(loss_sum);
  return losses;
}

}  // namespace forja::test
