// Subcommand registry. Each src/cli/cmd_*.cpp registers its subcommand with a static
// CommandRegistration, so adding a command means adding one file:
//
//   static forja::cli::CommandRegistration reg{"inspect", 30, [](CLI::App& app) {
//     auto* cmd = app.add_subcommand("inspect", "...");
//     ... options ...
//     return [=]() -> int { if (!cmd->parsed()) return -1; ...; return 0; };
//   }};
//
// Throw forja::UserError for bad input: main prints "forja: <message>" and exits 2.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace forja::cli {

// Returns the exit code, or -1 when its subcommand was not the one on the command line.
using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App& app)>;

struct CommandEntry {
  std::string name;
  int order;  // position in --help (lower first)
  CommandSetup setup;
};

std::vector<CommandEntry>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, int order, CommandSetup setup) {
    command_registry().push_back({std::move(name), order, std::move(setup)});
  }
};

}  // namespace forja::cli
