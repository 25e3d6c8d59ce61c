// forja: the program's entry point. Builds the command line from the registered subcommands
// (src/cli/cmd_*.cpp), runs the chosen one, and turns errors into exit codes (README "Exit
// codes"): 0 success, 2 user error (one line, names the fix), 3 an output could not be written or
// training stopped on a non-finite loss (what was written before is intact), 4 GPU out of memory,
// 5 GPU lost, 6 no usable Vulkan driver or device, 1 anything else. Under an MPI launcher
// (`mpirun -np N forja train`) an error on any rank is printed with the rank's number and ends
// the whole job with the same code (dist::World::abort_job), so no rank waits forever.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "dist/world.h"
#include "gpu/vk_check.h"
#include "util/error.h"
#include "util/nearest.h"

namespace forja::cli {
std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> registry;
  return registry;
}

namespace {
// "; did you mean '--lr-schedule'?" for the first unknown flag, among the options of the
// innermost subcommand that was given.
// "forja: " on a single process, "forja (rank 1 of 2): " in a distributed job.
std::string error_prefix() {
  const auto& w = forja::dist::World::get();
  if (!w.distributed()) return "forja: ";
  return "forja (rank " + std::to_string(w.rank()) + " of " + std::to_string(w.size()) + "): ";
}

// Prints the error and, in a distributed job, takes every rank down with it.
int fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s%s\n", error_prefix().c_str(), message.c_str());
  std::fflush(stderr);
  forja::dist::World::get().abort_job(code);
  return code;
}

std::string suggestion_for_extras(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (CLI::App* s : sub->get_subcommands())
      if (s->parsed()) {
        sub = s;
        deeper = true;
        break;
      }
  }
  std::vector<std::string> names;
  for (const CLI::Option* o : sub->get_options())
    for (const auto& n : o->get_lnames()) names.push_back("--" + n);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (!a.starts_with("--")) continue;
    a = a.substr(0, a.find('='));
    if (std::find(names.begin(), names.end(), a) != names.end()) continue;
    const std::string near = forja::nearest_name(a, names);
    if (!near.empty()) return "; did you mean '" + near + "'?";
  }
  return "";
}
}  // namespace
}  // namespace forja::cli

int main(int argc, char** argv) {
  using namespace forja::cli;
  // A file over the size limit (ulimit -f) then fails its write with EFBIG, which the writers
  // report as an OutputError, instead of killing the process half-way through a checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"forja: fine-tune LLMs with QLoRA on any GPU through Vulkan compute"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "forja 0.1.0");

  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandEntry& a, const CommandEntry& b) { return a.order < b.order; });
  std::vector<CommandRun> runs;
  for (auto& entry : registry) runs.push_back(entry.setup(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    std::fprintf(stderr, "forja: %s%s (see forja --help)\n", e.what(), suggestion_for_extras(app, argc, argv).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "forja: %s (see forja --help)\n", e.what());
    return 2;
  }

  // Only training runs distributed; any other command started by a launcher would run N
  // times over the same files.
  if (const auto launch = forja::dist::detect_launch(); launch.by_launcher && launch.size_hint > 1) {
    bool training = false;
    for (CLI::App* s : app.get_subcommands()) training = training || s->get_name() == "train";
    if (!training) {
      std::fprintf(stderr, "forja: only `forja train` runs under %s with several ranks; run this command without it\n",
                   launch.launcher.c_str());
      return 2;
    }
  }

  try {
    // Each run returns -1 when its (sub)command was not the one chosen.
    for (auto& run : runs) {
      int rc = run();
      if (rc == -1) continue;
      forja::dist::World::get().leave();
      return rc;
    }
    std::fprintf(stderr, "forja: no command given (see forja --help)\n");
    return 2;
  } catch (const forja::OutputError& e) {
    return fail(3, e.what());
  } catch (const forja::gpu::OutOfMemory& e) {
    const std::string m = e.what();
    return fail(4, m.starts_with("GPU out of memory") ? m : "GPU out of memory: " + m);
  } catch (const forja::gpu::DeviceLost& e) {
    return fail(5, e.what());
  } catch (const forja::gpu::Unsupported& e) {
    return fail(6, e.what());
  } catch (const forja::UserError& e) {
    return fail(2, e.what());
  } catch (const std::exception& e) {
    return fail(1, std::string("internal error: ") + e.what());
  }
}
