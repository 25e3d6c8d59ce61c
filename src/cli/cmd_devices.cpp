// forja devices: every Vulkan device with its probed capabilities, which one forja uses, and
// which kernels each precision runs there.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "gpu/context.h"
#include "gpu/device.h"
#include "model/precision.h"
#include "ops/attention_gemm.h"
#include "ops/gemm.h"

namespace {

forja::cli::CommandRegistration devices_registration{"devices", 10, [](CLI::App& app) {
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
    // What each precision runs on the chosen device (opening it runs the one-time layout probe of
    // the fused attention kernels).
    auto ctx = forja::gpu::Context::create(static_cast<int>(chosen), true);
    namespace ops = forja::ops;
    std::printf("kernels there: %s\n", forja::model::describe_precision_choice("auto", *ctx).c_str());
    std::printf("  fp32:  scalar fp32 kernels; attention in fp32 tiles\n");
    const std::string fused = ops::attention_fused_forward_unsupported(*ctx, 128);
    std::printf("  mixed: base products on %s; attention through the GEMM kernels, %s\n",
                ops::gemm_kernel_name(ops::gemm_kernel_for(*ctx, ops::DType::f16)).c_str(),
                fused.empty() ? (ops::attention_fused_backward_enabled(*ctx, 128)
                                     ? "its forward and backward fused (head_dim 128)"
                                     : "its forward fused (head_dim 128; the fused backward is off: "
                                       "FORJA_NO_FUSED_ATTENTION_BACKWARD is set)")
                              : ("no fused forward (" + fused + ")").c_str());
    return 0;
  };
}};

}  // namespace
