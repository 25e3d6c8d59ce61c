// forja example: the README's main job. Makes the built-in tiny model and chat dataset
// (train/example.h), trains an adapter on them on whatever device is there, and shows the run.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <memory>

#include "cli/command.h"
#include "train/example.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace {

// s in single quotes for /bin/sh (a ' inside becomes '\'').
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct ExampleArgs {
  std::string out = "runs/example";
  int64_t steps = 50;  // 30 left the sample wrong ("The capital of Greece is Mads."), 50 answers it
  int device = -1;
};

forja::cli::CommandRegistration example_registration{"example", 5, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("example", "Make a tiny model and chat dataset, and fine-tune it (a one-minute demo)");
  auto args = std::make_shared<ExampleArgs>();
  cmd->add_option("--out", args->out, "where the model, data and run go")->capture_default_str();
  cmd->add_option("--steps", args->steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--device", args->device, "Vulkan device index (see forja devices)");
  return [=]() -> int {
    if (!cmd->parsed()) return -1;
    namespace fs = std::filesystem;
    const fs::path root = args->out;
    std::printf("making the example model in %s/model and data in %s/data/chat.jsonl\n", root.c_str(), root.c_str());
    forja::train::write_example_model(root / "model");
    const int64_t n = forja::train::write_example_data(root / "data" / "chat.jsonl");
    std::printf("%lld conversations\n\n", (long long)n);

    forja::train::RunConfig c;
    auto set = [&](const char* k, const std::string& v) { c.set(k, v, std::string("forja example: ") + k); };
    set("model", (root / "model").string());
    set("data", (root / "data" / "chat.jsonl").string());
    set("out", (root / "run").string());
    set("seq-len", "48");
    set("batch-size", "16");
    set("grad-accum", "1");
    set("max-steps", std::to_string(args->steps));
    set("lr", "4e-3");
    set("lr-schedule", "cosine");
    set("warmup-steps", "3");
    set("max-grad-norm", "1.0");
    set("save-every", "20");
    set("log-every", "5");
    set("overwrite", "true");
    set("device", std::to_string(args->device));
    const int rc = forja::train::run_training(c);
    if (rc != 0) return rc;
    // A sample from the trained adapter, through forja generate itself (the same binary).
    const std::string question = "What is the capital of France?";
    std::printf("\nsample: forja generate --model %s --adapter %s --prompt \"%s\"\n", (root / "model").c_str(),
                (root / "run").c_str(), question.c_str());
    std::fflush(stdout);
    // The path of this binary, resolved here: inside std::system's shell /proc/self/exe is the shell.
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (ec) {
      std::fprintf(stderr, "forja example: cannot find this program's path (/proc/self/exe: %s); run the command above\n",
                   ec.message().c_str());
      return 1;
    }
    const std::string cmd = shell_quote(self.string()) + " generate --model " + shell_quote((root / "model").string()) +
                            " --adapter " + shell_quote((root / "run").string()) + " --prompt " + shell_quote(question) +
                            " --max-new-tokens 24" +
                            (args->device >= 0 ? " --device " + std::to_string(args->device) : "");
    const int status = std::system(cmd.c_str());
    return status == 0 ? 0 : 1;
  };
}};

}  // namespace
