#include "train/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/checksums.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/kill_point.h"
#include "util/test_hooks.h"

namespace forja::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

// checkpoint-N -> N, or -1 for anything else
int64_t checkpoint_step(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string prefix = "checkpoint-";
  if (!name.starts_with(prefix) || name.size() == prefix.size()) return -1;
  int64_t n = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

json state_to_json(const TrainerState& s) {
  return json{{"step", s.step},
              {"total_steps", s.total_steps},
              {"epoch", s.epoch},
              {"batch_in_epoch", s.batch_in_epoch},
              {"tokens", s.tokens},
              {"elapsed_s", s.elapsed_s},
              {"skipped_nonfinite", s.skipped_nonfinite},
              {"seed", s.seed},
              {"last_loss", s.last_loss},
              {"world_size", s.world_size},
              {"micro_batches_per_step", s.micro_batches_per_step},
              {"batch_size", s.batch_size},
              {"format", "forja-trainer-state-1"}};
}

}  // namespace

void maybe_kill_for_test(int64_t step) {
  if (test_hooks().kill_in_checkpoint == step) ::kill(::getpid(), SIGKILL);
}

fs::path save_checkpoint(const fs::path& out_dir, const Checkpoint& c, const io::LoraTargetShapes& shapes,
                         const std::string& config_yaml) {
  const std::string name = "checkpoint-" + std::to_string(c.state.step);
  const fs::path final_dir = out_dir / name;
  const fs::path partial = out_dir / ("." + name + ".partial");
  std::error_code ec;
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) throw OutputError(partial.string() + ": cannot create the checkpoint directory (" + ec.message() + ")");

  // A write that fails (disk full) removes the partial directory again, to give the space back;
  // the earlier checkpoints are untouched.
  try {
    kill_point("checkpoint: its partial directory created");
    io::save_adapter(partial, c.adapter, shapes);
    {
      std::vector<io::TensorToWrite> t(2);
      t[0].name = "adam_m";
      t[1].name = "adam_v";
      t[0].shape = {int64_t(c.adam_m.size())};
      t[1].shape = {int64_t(c.adam_v.size())};
      t[0].data = std::as_bytes(std::span(c.adam_m));
      t[1].data = std::as_bytes(std::span(c.adam_v));
      io::write_safetensors(partial / kOptimizerFile, std::move(t), {{"format", "forja-adamw"}});
    }
    maybe_kill_for_test(c.state.step);
    io::write_file_atomic(partial / "config.yaml", config_yaml);
    io::write_file_atomic(partial / kStateFile, state_to_json(c.state).dump(2) + "\n");
    io::write_sha256sums(partial, {"adapter_model.safetensors", "adapter_config.json", kOptimizerFile, "config.yaml",
                                   kStateFile});
    io::sync_directory(partial);
    kill_point("checkpoint: complete, before its rename");
  } catch (...) {
    fs::remove_all(partial, ec);
    throw;
  }

  // A checkpoint of the same step may exist (a resumed run saving again at the step it resumed
  // from): move it aside first, and delete it only once the new one is in place.
  const fs::path old = out_dir / ("." + name + ".old");
  const bool had_old = fs::exists(final_dir);
  if (had_old) {
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) throw OutputError(final_dir.string() + ": cannot replace the checkpoint (" + ec.message() + ")");
    kill_point("checkpoint: the old one of this step moved aside");
  }
  fs::rename(partial, final_dir, ec);
  if (ec) throw OutputError(final_dir.string() + ": cannot move the checkpoint into place (" + ec.message() + ")");
  io::sync_directory(out_dir);
  kill_point("checkpoint: renamed into place");
  if (had_old) fs::remove_all(old, ec);
  return final_dir;
}

Checkpoint load_checkpoint(const fs::path& dir, const io::LoraTargetShapes& shapes) {
  Checkpoint c;
  const json s = io::read_json_file(dir / kStateFile);
  const std::string where = (dir / kStateFile).string();
  try {
    if (s.value("format", "") != "forja-trainer-state-1")
      throw UserError(where + ": not a forja trainer state (format field missing or unknown)");
    // Integers must be JSON integers: nlohmann converts a float (2e46) to int64_t by a cast,
    // undefined behaviour out of range (found by fuzz/fuzz_checkpoint.cpp).
    auto integer = [&](const char* key, std::optional<int64_t> fallback = std::nullopt) -> int64_t {
      if (!s.contains(key) && fallback) return *fallback;
      const json& v = s.at(key);
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
        throw UserError(where + ": damaged trainer state (\"" + key + "\" is not an integer); resume from an earlier checkpoint");
      return v.get<int64_t>();
    };
    c.state.step = integer("step");
    c.state.total_steps = integer("total_steps");
    c.state.epoch = integer("epoch");
    c.state.batch_in_epoch = integer("batch_in_epoch");
    c.state.tokens = integer("tokens");
    c.state.elapsed_s = s.at("elapsed_s").get<double>();
    c.state.skipped_nonfinite = integer("skipped_nonfinite");
    if (!s.at("seed").is_number_unsigned() && !(s.at("seed").is_number_integer() && s.at("seed").get<int64_t>() >= 0))
      throw UserError(where + ": damaged trainer state (\"seed\" is not a non-negative integer); resume from an earlier checkpoint");
    c.state.seed = s.at("seed").get<uint64_t>();
    c.state.last_loss = s.value("last_loss", 0.0);
    c.state.world_size = integer("world_size", 1);
    c.state.micro_batches_per_step = integer("micro_batches_per_step", 0);
    c.state.batch_size = integer("batch_size", 0);
    if (c.state.world_size < 1 || c.state.micro_batches_per_step < 0 || c.state.batch_size < 0)
      throw UserError(where + ": damaged trainer state (world_size, micro_batches_per_step or batch_size out of range)");
  } catch (const json::exception& e) {
    throw UserError(where + ": damaged trainer state (" + e.what() + "); resume from an earlier checkpoint");
  }
  c.adapter = io::load_adapter(dir, shapes);
  const auto opt = io::SafetensorsFile::open(dir / kOptimizerFile);
  c.adam_m = opt.tensor("adam_m").to_float();
  c.adam_v = opt.tensor("adam_v").to_float();
  if (c.adam_m.size() != c.adam_v.size())
    throw UserError((dir / kOptimizerFile).string() + ": adam_m and adam_v differ in size; the checkpoint is damaged");
  return c;
}

std::vector<fs::path> list_checkpoints(const fs::path& out_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const int64_t n = checkpoint_step(e.path());
    if (n >= 0 && e.is_directory()) found.emplace_back(n, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

void prune_checkpoints(const fs::path& out_dir, int64_t keep) {
  if (keep <= 0) return;
  const auto all = list_checkpoints(out_dir);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    fs::remove_all(all[i], ec);
    kill_point("an old checkpoint pruned");
  }
}

void remove_partial_checkpoints(const fs::path& out_dir) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) leftovers.push_back(e.path());
  for (const fs::path& p : leftovers) {
    const std::string n = p.filename().string();
    if (n.starts_with(".checkpoint-") && n.ends_with(".old")) {
      // Killed between moving the old checkpoint of a step aside and moving its replacement in:
      // the old one is complete, put it back (the replacement, if any, is a .partial).
      const fs::path back = out_dir / n.substr(1, n.size() - 1 - 4);
      if (!fs::exists(back, ec)) fs::rename(p, back, ec);
      if (!ec && fs::exists(back, ec)) fs::remove_all(p, ec);
    } else if (n.starts_with(".checkpoint-") && n.ends_with(".partial")) {
      fs::remove_all(p, ec);
    } else if (n.starts_with(".") && n.find(".tmp.") != std::string::npos && fs::is_regular_file(p, ec)) {
      // The temporary of a file being written when a run was killed (io/atomic_file.h:
      // ".NAME.tmp.PID.N"); the run lock says no other writer is at work in OUT.
      fs::remove(p, ec);
    }
  }
}

fs::path resolve_resume(const fs::path& path, bool fallback) {
  if (!fs::is_directory(path)) throw UserError(path.string() + ": no such directory (--resume)");
  // The candidates, newest first: the checkpoint given, or the run directory's checkpoints; with
  // `fallback` the older ones of the same run follow.
  std::vector<fs::path> candidates;
  if (fs::exists(path / kStateFile)) {
    candidates.push_back(path);
    if (fallback) {
      const auto all = list_checkpoints(path.parent_path());
      for (auto it = all.rbegin(); it != all.rend(); ++it)
        if (checkpoint_step(*it) < checkpoint_step(path)) candidates.push_back(*it);
    }
  } else {
    const auto all = list_checkpoints(path);
    if (all.empty())
      throw UserError(path.string() + ": holds no checkpoint-N directory to resume from; give a checkpoint or a run directory");
    candidates.assign(all.rbegin(), all.rend());
    if (!fallback) candidates.resize(1);
  }
  std::string refused;
  for (const auto& c : candidates) {
    const auto damage = io::verify_sha256sums(c);
    if (!damage) {
      if (!refused.empty())
        std::fprintf(stderr, "forja: passing over damaged checkpoints (%s); resuming from %s\n", refused.c_str(),
                     c.string().c_str());
      return c;
    }
    refused += (refused.empty() ? "" : "; ") + *damage;
  }
  if (!fallback) {
    const fs::path run_dir = fs::exists(path / kStateFile) ? path.parent_path() : path;
    std::string earlier;
    for (const auto& c : list_checkpoints(run_dir))
      if (checkpoint_step(c) < checkpoint_step(candidates.front())) earlier = c.string();
    throw UserError(refused + "; the checkpoint is damaged: resume from an earlier one" +
                    (earlier.empty() ? std::string() : " (--resume " + earlier + ")") +
                    ", or pass --resume-fallback to take the newest undamaged one");
  }
  throw UserError("no undamaged checkpoint to resume from (" + refused + ")");
}

}  // namespace forja::train
