// forja bench gemm: TFLOP/s of each GEMM kernel variant (fp32, fp16 and NF4 weights) at 4096^3
// and at the Qwen3-4B projection shapes (M = 2048 tokens), measured by the wall clock over back-to-back
// dispatches (after a warm-up), best of several repetitions. Results are spot-checked against
// a CPU dot product so a fast wrong kernel cannot report a number.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "gpu/context.h"
#include "io/float16.h"
#include "quant/nf4.h"
#include "ops/gemm.h"
#include "ops/nf4.h"
#include "util/error.h"

namespace {

using forja::ops::DType;
using forja::ops::GemmKernel;

struct BenchSize {
  uint32_t m, n, k;
  std::string label;
};

std::vector<BenchSize> parse_sizes(const std::string& list) {
  std::vector<BenchSize> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    unsigned m, n, k;
    if (std::sscanf(item.c_str(), "%ux%ux%u", &m, &n, &k) != 3 || !m || !n || !k)
      throw forja::UserError("--sizes: '" + item + "' is not MxNxK (e.g. 2048x4096x2560)");
    out.push_back({m, n, k, ""});
  }
  return out;
}

std::vector<BenchSize> default_sizes(bool small) {
  if (small) return {{256, 256, 256, "256^3"}, {512, 512, 512, "512^3"}, {128, 1024, 256, "128x1024x256"}};
  return {{4096, 4096, 4096, "4096^3"},
          {8192, 8192, 8192, "8192^3"},
          {2048, 4096, 2560, "q_proj/o^T (4B)"},
          {2048, 1024, 2560, "k,v_proj (4B)"},
          {2048, 2560, 4096, "o_proj (4B)"},
          {2048, 9728, 2560, "gate,up (4B)"},
          {2048, 2560, 9728, "down (4B)"}};
}

struct Variant {
  std::string name;
  DType dtype;
  GemmKernel kernel;
  bool trans_b;
  bool nf4 = false;  // B is an NF4 weight (ops/nf4.h): NT y = x W^T, NN dx = dy W; A fp32
  // Mixed precision's products: A fp32 rounded to fp16 on load, B fp16 (dtype f16; nf4: the
  // decoded W rounded to fp16 too).
  bool mixed = false;
};

// Best seconds per product.
double run_one(forja::gpu::Context& ctx, const BenchSize& s, const Variant& v, int iters, int reps, bool& ok) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const DType a_dtype = v.mixed ? DType::f32 : v.dtype;
  const uint64_t na = uint64_t(s.m) * s.k, nb = uint64_t(s.n) * s.k;
  std::vector<float> a(na), b(nb);
  for (auto& x : a) x = uni(rng);
  for (auto& x : b) x = uni(rng);
  auto round16 = [](float x) { return forja::io::f16_to_float(forja::io::float_to_f16(x)); };
  auto upload = [&](std::vector<float>& host, DType dtype) {
    forja::gpu::Buffer buf = ctx.alloc(host.size() * forja::ops::dtype_bytes(dtype));
    if (dtype == DType::f32) {
      ctx.upload(buf, host);
    } else {
      std::vector<uint16_t> h(host.size());
      for (size_t i = 0; i < host.size(); ++i) {
        h[i] = forja::io::float_to_f16(host[i]);
        host[i] = forja::io::f16_to_float(h[i]);
      }
      ctx.upload(buf, h);
    }
    return buf;
  };
  forja::ops::Nf4Weight w;
  forja::gpu::Buffer ga = upload(a, a_dtype), gb, gc = ctx.alloc(uint64_t(s.m) * s.n * 4);
  if (v.mixed)  // the check multiplies the values the GPU multiplies
    for (auto& x : a) x = round16(x);
  if (v.nf4) {
    // W [N, K] (NT) or [K, N] (NN), double-quantised as QLoRA does; the check uses its
    // dequantised values.
    const int64_t rows = v.trans_b ? s.n : s.k, cols = v.trans_b ? s.k : s.n;
    const forja::quant::Nf4Tensor t = forja::quant::nf4_quantize(b, {rows, cols});
    b = forja::quant::nf4_dequantize(t);
    if (v.mixed)
      for (auto& x : b) x = round16(x);
    w = forja::ops::upload_nf4(ctx, t);
  } else {
    gb = upload(b, v.dtype);
  }
  forja::ops::GemmShape shape{s.m, s.n, s.k, false, v.trans_b};
  // trans_b = false reads B as [K, N]: the same random numbers, another layout.
  const uint32_t ldb = v.trans_b ? s.k : s.n;
  const DType nf4_operands = v.mixed ? DType::f16 : DType::f32;
  auto once = [&] {
    if (v.nf4 && v.trans_b)
      forja::ops::nf4_gemm_xwt(ctx, ga, w, gc, s.m, 1.0f, 0.0f, nf4_operands, v.kernel);
    else if (v.nf4)
      forja::ops::nf4_gemm_dyw(ctx, ga, w, gc, s.m, 1.0f, 0.0f, nf4_operands, v.kernel);
    else
      forja::ops::gemm(ctx, shape, {ga, a_dtype, 0, s.k}, {gb, v.dtype, 0, ldb}, {gc, DType::f32, 0, s.n}, v.kernel);
  };
  // Warm up for a while: an idle GPU runs at low clocks and takes a moment to ramp up.
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const auto warm0 = clock::now();
  int warm_iters = 0;
  while (seconds_since(warm0) < 0.3) {
    once();
    ctx.finish();
    ++warm_iters;
  }
  // Enough back-to-back products per repetition to run >= 50 ms, so launch gaps do not count.
  const double per_product = seconds_since(warm0) / warm_iters;
  const int n = std::max(iters, static_cast<int>(0.05 / per_product) + 1);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock::now();
    for (int i = 0; i < n; ++i) once();
    ctx.finish();
    times.push_back(seconds_since(t0) / n);
  }
  std::sort(times.begin(), times.end());
  const double best = times.front();
  // Spot check 16 outputs against a double-precision dot product of the values the GPU saw.
  auto c = ctx.download<float>(gc, uint64_t(s.m) * s.n);
  ok = true;
  std::uniform_int_distribution<uint32_t> pm(0, s.m - 1), pn(0, s.n - 1);
  for (int t = 0; t < 16; ++t) {
    uint32_t i = pm(rng), j = pn(rng);
    double want = 0;
    for (uint32_t k = 0; k < s.k; ++k)
      want += double(a[uint64_t(i) * s.k + k]) * (v.trans_b ? b[uint64_t(j) * s.k + k] : b[uint64_t(k) * s.n + j]);
    if (std::abs(c[uint64_t(i) * s.n + j] - want) > 1e-3 * std::sqrt(double(s.k)) + 1e-3) ok = false;
  }
  ctx.free(ga);
  if (v.nf4)
    forja::ops::free_nf4(ctx, w);
  else
    ctx.free(gb);
  ctx.free(gc);
  return best;
}

// A subcommand of `bench`, which cmd_bench_train.cpp registers (order 80, set up before this).
forja::cli::CommandRegistration bench_gemm_registration{"bench-gemm", 81, [](CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand("gemm", "GEMM throughput of each kernel variant (TFLOP/s)");
  struct Opts {
    std::string sizes;
    int iters = 10, reps = 5, device = -1;
    bool small = false, tiles = false;
    std::string only;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--sizes", o->sizes, "Comma-separated MxNxK list (default: 4096^3, 8192^3, Qwen3-4B projections)");
  cmd->add_option("--iters", o->iters, "Minimum products per timed repetition (more when needed to run 50 ms)")->check(CLI::Range(1, 10000));
  cmd->add_option("--reps", o->reps, "Timed repetitions (best is reported)")->check(CLI::Range(1, 1000));
  cmd->add_flag("--small", o->small, "Small sizes (for CPU drivers such as lavapipe)");
  cmd->add_flag("--tiles", o->tiles, "Also each scalar tile on its own (t64, t128), besides the automatic choice");
  cmd->add_option("--only", o->only, "Only variants whose name contains this");
  cmd->add_option("--device", o->device, "Vulkan device index");
  return [o, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    auto ctx = forja::gpu::Context::create(o->device);
    std::vector<BenchSize> sizes = o->sizes.empty() ? default_sizes(o->small) : parse_sizes(o->sizes);
    std::vector<Variant> variants;
    for (DType dt : {DType::f32, DType::f16})
      for (bool tb : {true, false}) {
        const std::string name = std::string("scalar ") + (dt == DType::f32 ? "f32 " : "f16 ") + (tb ? "NT" : "NN");
        variants.push_back({name, dt, GemmKernel::scalar, tb});
        if (o->tiles) {
          variants.push_back({name + " t64", dt, GemmKernel::scalar_t64, tb});
          variants.push_back({name + " t128", dt, GemmKernel::scalar_t128, tb});
        }
      }
    for (bool tb : {true, false}) {
      const std::string name = std::string("scalar nf4 ") + (tb ? "NT" : "NN");
      variants.push_back({name, DType::f32, GemmKernel::scalar, tb, true});
      if (o->tiles) {
        variants.push_back({name + " t64", DType::f32, GemmKernel::scalar_t64, tb, true});
        variants.push_back({name + " t128", DType::f32, GemmKernel::scalar_t128, tb, true});
      }
    }
    // The scalar kernels' mixed-operand variants (mixed precision without cooperative matrices).
    for (bool nf4 : {false, true})
      for (bool tb : {true, false}) {
        const std::string name = std::string(nf4 ? "mixed nf4 " : "mixed f32f16 ") + (tb ? "NT" : "NN");
        variants.push_back({name, DType::f16, GemmKernel::scalar, tb, nf4, true});
        if (o->tiles) {
          variants.push_back({name + " t64", DType::f16, GemmKernel::scalar_t64, tb, nf4, true});
          variants.push_back({name + " t128", DType::f16, GemmKernel::scalar_t128, tb, nf4, true});
        }
      }
    // Every matrix-core family the device offers, fp16 and mixed (fp32 A rounded on load).
    for (GemmKernel k : {GemmKernel::nv_coopmat2, GemmKernel::khr_coopmat, GemmKernel::coopmat}) {
      if (!forja::ops::gemm_kernel_available(*ctx, k)) continue;
      const std::string family = forja::ops::gemm_kernel_name(k);
      variants.push_back({family + " f16 NT", DType::f16, k, true});
      variants.push_back({family + " f16 NN", DType::f16, k, false});
      variants.push_back({family + " mixed NT", DType::f16, k, true, false, true});
      variants.push_back({family + " mixed NN", DType::f16, k, false, false, true});
    }
    std::printf("forja bench gemm on %s: C[M,N] fp32 = A[M,K] * op(B), NT: B stored [N,K] (y = x W^T), "
                "NN: B stored [K,N] (dx = dy W); nf4: B an NF4 weight, A fp32; mixed: A fp32 rounded to fp16 on load, "
                "B fp16 (nf4: decoded and rounded)\n",
                ctx->info().name.c_str());
    std::printf("%-18s %-16s %-24s %10s %10s %10s %6s\n", "MxNxK", "shape", "variant", "ms", "TFLOP/s", "GFLOP/s",
                "check");
    for (const auto& s : sizes)
      for (const auto& v : variants) {
        if (!o->only.empty() && v.name.find(o->only) == std::string::npos) continue;
        bool ok = false;
        const double seconds = run_one(*ctx, s, v, o->iters, o->reps, ok);
        const double tf = 2.0 * s.m * s.n * s.k / seconds / 1e12;
        char dims[64];
        std::snprintf(dims, sizeof dims, "%ux%ux%u", s.m, s.n, s.k);
        std::printf("%-18s %-16s %-24s %10.3f %10.2f %10.2f %6s\n", dims, s.label.c_str(), v.name.c_str(),
                    seconds * 1e3, tf, tf * 1e3, ok ? "ok" : "WRONG");
        std::fflush(stdout);
        if (!ok) return 1;
      }
    return 0;
  };
}};

}  // namespace
