// forja train: fine-tune a LoRA adapter (see train/trainer.h). Settings come from defaults, then
// --resume's checkpoint config, then --config FILE, then flags: later wins.
#include <map>
#include <memory>

#include "cli/command.h"
#include "train/checkpoint.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace {

forja::cli::CommandRegistration train_registration{"train", 10, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Fine-tune a LoRA adapter on a model (QLoRA by default)");
  cmd->footer("Every setting can also be given in --config FILE (YAML, same names without the dashes); flags win.");
  auto config_file = std::make_shared<std::string>();
  cmd->add_option("--config", *config_file, "YAML file of settings (e.g. a previous run's config.yaml)");
  auto values = std::make_shared<std::map<std::string, std::string>>();
  auto options = std::make_shared<std::map<std::string, CLI::Option*>>();
  for (const auto& key : forja::train::config_keys()) {
    const std::string name = key.name;
    auto* opt = cmd->add_option("--" + name, (*values)[name], key.help);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
    if (std::string_view(key.value_hint).empty()) {
      opt->expected(0, 1);  // `--rslora` alone means on; `--rslora off` is accepted too
    } else {
      opt->type_name(key.value_hint);
    }
    (*options)[name] = opt;
  }
  return [=]() -> int {
    if (!cmd->parsed()) return -1;
    forja::train::RunConfig config;
    const auto given = [&](const std::string& k) { return (*options)[k]->count() > 0; };
    std::filesystem::path resolved;  // the checkpoint --resume chose (verified once, here)
    if (given("resume")) {
      // --resume-fallback decides which checkpoint, so it is read before anything else.
      forja::train::RunConfig probe;
      if (given("resume-fallback")) probe.set("resume-fallback", (*values)["resume-fallback"], "--resume-fallback");
      const auto ckpt = forja::train::resolve_resume((*values)["resume"], probe.resume_fallback);
      if (std::filesystem::exists(ckpt / "config.yaml")) config.load_yaml(ckpt / "config.yaml");
      // The run continues in the folder that holds the checkpoint, not in the `out` its
      // config.yaml names: the folder may have been moved or copied since (--out still wins).
      config.out = ckpt.parent_path();
      resolved = ckpt;
    }
    if (!config_file->empty()) config.load_yaml(*config_file);
    for (const auto& key : forja::train::config_keys())
      if (given(key.name)) config.set(key.name, (*values)[key.name], "--" + std::string(key.name));
    if (!resolved.empty()) config.resume = resolved;
    return forja::train::run_training(config);
  };
}};

}  // namespace
