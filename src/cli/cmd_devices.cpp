// forja devices: every Vulkan device with its probed capabilities, and which one forja uses.
#include <cstdio>

#include "cli/command.h"
#include "gpu/device.h"

namespace {

forja::cli::CommandRegistration reg{"devices", 10, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List Vulkan devices, their capabilities, and which forja would use");
  auto device = std::make_shared<int>(-1);
  cmd->add_option("--device", *device, "Device index to mark as chosen (default: FORJA_DEVICE, else automatic)");
  return [device, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    forja::gpu::Instance instance(forja::gpu::env_flag("FORJA_VALIDATE"));
    const uint32_t chosen = instance.choose(*device);
    for (const auto& d : instance.devices()) std::printf("%s", d.describe().c_str());
    const auto& c = instance.devices()[chosen];
    std::printf("forja uses device %u: %s%s\n", chosen, c.name.c_str(),
                c.is_cpu() ? " (the CPU, through Mesa lavapipe: fine for tests and tiny models)" : "");
    return 0;
  };
}};

}  // namespace
