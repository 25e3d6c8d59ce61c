// forja bench attention: speed of the causal attention implementations, forward and backward
// alone, at one shape (default: one sequence of 2048 tokens, 32 query heads, 8 kv heads, head_dim
// 128, the issue-14 shape): flash (ops/flash_attention.h, on cooperative matrices where present),
// fused (ops/attention_gemm.h with its fused forward kernel, where the device runs it),
// fused-backward (its fused backward kernels too), gemm (the GEMM path with the forward through
// the GEMM kernels too) and tiled (ops/attention.h, fp32). Wall
// clock over back-to-back calls after a warm-up, best of several repetitions; TFLOP/s count the
// causal half of the products as FlashAttention-2 does: forward 2, backward 5 products of
// 2 B nh (S(S+1)/2) d.
//
// Checks, so that a fast wrong kernel cannot report a number: sampled forward rows against a
// CPU double-precision computation, and every output (out, lse, dq, dk, dv) of each
// implementation against the fp32 tiled kernels (max |a - b| / max |b| per tensor).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "gpu/context.h"
#include "ops/attention.h"
#include "ops/attention_gemm.h"
#include "ops/elementwise.h"
#include "ops/flash_attention.h"
#include "util/error.h"

namespace {

using namespace forja;

struct AttnBenchOptions {
  uint32_t batch = 1, seq = 2048, heads = 32, kv_heads = 8, head_dim = 128;
  uint32_t block_q = 0, block_k = 0, dkdv_split = 0;
  int reps = 5, device = -1;
  std::string impls = "flash,fused,fused-backward,gemm,tiled", flash_kernel = "automatic";
  std::string fused_forward_tiles;   // "WARPS,KEYS,PREFETCH"; empty: the defaults
  std::string fused_backward_tiles;  // "DQ_WARPS,DQ_KEYS,KV_WARPS,KV_QUERIES"; empty: the defaults
  int paired = -1;                   // the fused kernels' paired row tiles: 0, 1; -1: the default
  int dkv_split_target = -1;         // < 0: the default
  bool packed = false;
  bool model_inputs = false;  // fused-backward: q, k and the backward's out in fp16, as training keeps them
  uint32_t dq_ds_warps = 0;   // fused-backward's dq-from-dS workgroups; 0: the default
  int dq_ds_quad = -1;        // fused-backward's dq from dS by subgroups 2 x 2: 0, 1; -1: the default
  int pingpong = -1;          // the fused forward's ping-pong schedule: 0, 1; -1: the default
};

struct Buffers {
  gpu::Buffer q, k, v, seg, out, lse, dout, dq, dk, dv;
};

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

ops::FlashKernel parse_flash_kernel(const std::string& s) {
  if (s == "automatic") return ops::FlashKernel::automatic;
  if (s == "coopmat") return ops::FlashKernel::coopmat;
  if (s == "emulated") return ops::FlashKernel::coopmat_emulated;
  if (s == "f32") return ops::FlashKernel::f32;
  throw UserError("--flash-kernel: '" + s + "' is not automatic, coopmat, emulated or f32");
}

// max |a - b| / max |b| over finite entries (lse of padding rows is -inf in both).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    if (std::isfinite(b[i])) den = std::max(den, std::abs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

int run(const AttnBenchOptions& o) {
  auto ctx = gpu::Context::create(o.device);
  const uint32_t B = o.batch, S = o.seq, nh = o.heads, nkv = o.kv_heads, d = o.head_dim;
  if (B == 0 || S == 0 || nh == 0 || nkv == 0 || d == 0 || nh % nkv != 0)
    throw UserError("bench attention: --batch, --seq-len, --heads, --kv-heads, --head-dim must be positive and "
                    "--heads a multiple of --kv-heads");
  const uint64_t nq = uint64_t(B) * S * nh * d, nkvv = uint64_t(B) * S * nkv * d, nstat = uint64_t(B) * S * nh;
  const float scale = 1.0f / std::sqrt(float(d));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](uint64_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  const std::vector<float> q = random(nq), k = random(nkvv), v = random(nkvv), dout = random(nq);
  // --packed: four documents per sequence (the masks of packing); else one causal sequence.
  std::vector<int32_t> seg(uint64_t(B) * S, 1);
  if (o.packed)
    for (uint64_t i = 0; i < seg.size(); ++i) seg[i] = 1 + int32_t((i % S) * 4 / S);
  Buffers g;
  auto alloc = [&](uint64_t n) { return ctx->alloc(n * 4); };
  g.q = alloc(nq), g.k = alloc(nkvv), g.v = alloc(nkvv), g.seg = alloc(seg.size()), g.dout = alloc(nq);
  g.out = alloc(nq), g.lse = alloc(nstat), g.dq = alloc(nq), g.dk = alloc(nkvv), g.dv = alloc(nkvv);
  ctx->upload(g.q, q), ctx->upload(g.k, k), ctx->upload(g.v, v), ctx->upload(g.seg, seg), ctx->upload(g.dout, dout);

  ops::FlashAttentionOptions fo{parse_flash_kernel(o.flash_kernel), o.block_q, o.block_k, o.dkdv_split};
  std::vector<std::string> impls;
  {
    std::stringstream ss(o.impls);
    std::string item;
    while (std::getline(ss, item, ','))
      if (item == "flash" || item == "fused" || item == "fused-backward" || item == "gemm" || item == "tiled")
        impls.push_back(item);
      else
        throw UserError("--impl: '" + item + "' is not flash, fused, fused-backward, gemm or tiled");
  }
  ops::AttentionGemmOptions fused, fused_backward, unfused;
  fused.fused_backward = false;  // "fused": the fused forward with the GEMM path's backward
  // Comma-separated numbers of a --fused-*-tiles option; `what` names the expected ones.
  auto numbers = [](const std::string& text, size_t count, const std::string& what) {
    std::stringstream ss(text);
    std::vector<uint32_t> v;
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        v.push_back(static_cast<uint32_t>(std::stoul(item)));
      } catch (const std::exception&) {
        v.clear();
        break;
      }
    }
    if (v.size() != count) throw UserError(what);
    return v;
  };
  if (!o.fused_forward_tiles.empty()) {
    const auto v = numbers(o.fused_forward_tiles, 3,
                           "--fused-forward-tiles: give three numbers WARPS,KEYS,PREFETCH (e.g. 8,64,1)");
    for (ops::AttentionGemmOptions* g : {&fused, &fused_backward}) g->fused_forward_tiles = {v[0], v[1], v[2] != 0};
  }
  if (!o.fused_backward_tiles.empty()) {
    const auto v = numbers(o.fused_backward_tiles, 4,
                           "--fused-backward-tiles: give four numbers DQ_WARPS,DQ_KEYS,KV_WARPS,KV_QUERIES (e.g. 4,64,4,32)");
    fused_backward.fused_backward_tiles = {v[0], v[1], v[2], v[3]};
  }
  // After the tile options, which give every field they leave out its default.
  if (o.paired >= 0) {
    for (ops::AttentionGemmOptions* g : {&fused, &fused_backward}) {
      g->fused_forward_tiles.paired = o.paired != 0;
      g->fused_backward_tiles.paired = o.paired != 0;
    }
  }
  if (o.pingpong >= 0)
    for (ops::AttentionGemmOptions* g : {&fused, &fused_backward}) g->fused_forward_tiles.pingpong = o.pingpong != 0;
  if (o.dq_ds_warps) fused_backward.dq_ds_warps = o.dq_ds_warps;
  if (o.dq_ds_quad >= 0) fused_backward.dq_ds_quad = o.dq_ds_quad != 0;
  if (o.dkv_split_target >= 0) fused_backward.dkv_split_target = static_cast<uint32_t>(o.dkv_split_target);
  unfused.fused_forward = false;
  unfused.fused_backward = false;
  auto gemm_options = [&](const std::string& impl) {
    return impl == "fused" ? fused : impl == "fused-backward" ? fused_backward : unfused;
  };
  auto on_gemm_path = [](const std::string& impl) {
    return impl == "fused" || impl == "fused-backward" || impl == "gemm";
  };
  // --model-inputs: fused-backward as the training step runs it (model/transformer.cpp): q and k
  // arrive as fp16 copies (the q/k norm and RoPE pass writes them) and the backward reads the
  // fp16 copy of out that o_proj read, so neither call converts them. The copies are made here,
  // outside the timing: q and k once, out after each forward.
  const bool model_inputs = o.model_inputs && fused_backward.fused_backward;
  gpu::Buffer q16, k16, out16;
  if (model_inputs) {
    fused_backward.qk_f16 = true;
    fused_backward.out_f16_ld = nh * d;
    // (at fp32 sizes: the ops check q and k as fp32 whatever they hold, as the model's buffers are)
    q16 = ctx->alloc(uint64_t(B) * S * nh * d * 4, "bench q fp16");
    k16 = ctx->alloc(uint64_t(B) * S * nkv * d * 4, "bench k fp16");
    out16 = ctx->alloc((uint64_t(B) * S * nh * d + 7) / 8 * 16, "bench out fp16");
    ops::to_f16_block(*ctx, g.q, 0, nh * d, q16, 0, nh * d, B * S, nh * d, nh * d);
    ops::to_f16_block(*ctx, g.k, 0, nkv * d, k16, 0, nkv * d, B * S, nkv * d, nkv * d);
  }
  auto as_model = [&](const std::string& impl) { return model_inputs && impl == "fused-backward"; };
  auto forward = [&](const std::string& impl) {
    if (impl == "flash")
      ops::flash_attention_forward(*ctx, g.q, g.k, g.v, g.seg, g.out, g.lse, B, S, nh, nkv, d, scale, fo);
    else if (on_gemm_path(impl))
      ops::attention_gemm_forward(*ctx, as_model(impl) ? q16 : g.q, as_model(impl) ? k16 : g.k, g.v, g.seg, g.out,
                                  g.lse, B, S, nh, nkv, d, scale, gemm_options(impl));
    else
      ops::attention_forward(*ctx, g.q, g.k, g.v, g.seg, g.out, g.lse, B, S, nh, nkv, d, scale);
  };
  auto backward = [&](const std::string& impl) {
    if (impl == "flash")
      ops::flash_attention_backward(*ctx, g.q, g.k, g.v, g.seg, g.out, g.lse, g.dout, g.dq, g.dk, g.dv, B, S, nh, nkv,
                                    d, scale, fo);
    else if (as_model(impl))
      ops::attention_gemm_backward(*ctx, q16, k16, g.v, g.seg, out16, g.lse, g.dout, g.dq, g.dk, g.dv, B, S, nh, nkv,
                                   d, scale, gemm_options(impl));
    else if (on_gemm_path(impl))
      ops::attention_gemm_backward(*ctx, g.q, g.k, g.v, g.seg, g.out, g.lse, g.dout, g.dq, g.dk, g.dv, B, S, nh, nkv,
                                   d, scale, gemm_options(impl));
    else
      ops::attention_backward(*ctx, g.q, g.k, g.v, g.seg, g.out, g.lse, g.dout, g.dq, g.dk, g.dv, B, S, nh, nkv, d,
                              scale);
  };
  auto outputs = [&] {
    return Outputs{ctx->download<float>(g.out, nq), ctx->download<float>(g.lse, nstat),
                   ctx->download<float>(g.dq, nq), ctx->download<float>(g.dk, nkvv), ctx->download<float>(g.dv, nkvv)};
  };
  // Best seconds per call of f.
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  auto time = [&](const std::function<void()>& f) {
    const auto warm0 = clock::now();
    int warm = 0;
    while (seconds_since(warm0) < 0.3 || warm < 2) {
      f();
      ctx->finish();
      ++warm;
    }
    const int n = std::max(1, static_cast<int>(0.05 / (seconds_since(warm0) / warm)) + 1);
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < o.reps; ++r) {
      const auto t0 = clock::now();
      for (int i = 0; i < n; ++i) f();
      ctx->finish();
      best = std::min(best, seconds_since(t0) / n);
    }
    return best;
  };

  const double product = 2.0 * B * nh * (0.5 * S * (S + 1.0)) * d;
  std::printf("forja bench attention on %s: B %u, S %u, %u query heads, %u kv heads, head_dim %u, %s\n",
              ctx->info().name.c_str(), B, S, nh, nkv, d, o.packed ? "4 packed documents per sequence" : "causal");
  for (const char* impl : {"fused", "fused-backward"}) {
    if (std::find(impls.begin(), impls.end(), impl) == impls.end()) continue;
    const std::string why = ops::attention_fused_forward_unsupported(*ctx, d);
    std::printf("%s: %s\n", impl, why.empty() ? "the fused kernels run here" : ("not here: " + why).c_str());
    if (!why.empty()) impls.erase(std::find(impls.begin(), impls.end(), impl));
  }
  if (std::find(impls.begin(), impls.end(), "flash") != impls.end()) {
    ops::FlashTiles t;
    try {
      t = ops::flash_attention_tiles(*ctx, d, fo);
    } catch (const std::invalid_argument& e) {
      throw UserError(std::string("bench attention: ") + e.what() + "; pick another --flash-kernel, --head-dim or "
                      "--impl");
    }
    std::printf("flash: kernel %s, tiles (queries x keys) forward %ux%u, dq %ux%u, dk/dv %ux%u, dk/dv workgroups "
                "per kv head %u\n",
                ops::flash_kernel_name(ops::flash_kernel_for(*ctx, fo.kernel)).c_str(), t.fwd_q, t.fwd_k, t.dq_q,
                t.dq_k, t.dkdv_q, t.dkdv_k, ops::flash_attention_dkdv_split(*ctx, B, S, nh, nkv, d, fo));
  }
  // The reference outputs: the fp32 tiled kernels (after flash's support was checked).
  forward("tiled");
  backward("tiled");
  ctx->finish();
  const Outputs want = outputs();

  std::printf("TFLOP/s count causal products: forward 2, backward 5 (recomputation not counted)\n");
  if (model_inputs) std::printf("fused-backward: q, k and the backward's out given in fp16 (--model-inputs)\n");
  std::printf("%-6s %10s %8s %10s %8s %10s %8s  %s\n", "impl", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "f+b ms",
              "TFLOP/s", "max rel diff to tiled fp32 (out lse dq dk dv)");
  bool all_ok = true;
  for (const std::string& impl : impls) {
    // The fp16 copy of out the backward reads under --model-inputs (untimed).
    auto copy_out = [&] {
      if (as_model(impl)) ops::to_f16_block(*ctx, g.out, 0, nh * d, out16, 0, nh * d, B * S, nh * d, nh * d);
    };
    try {
      forward(impl);
      copy_out();
      backward(impl);
    } catch (const std::invalid_argument& e) {  // a shape or tile the implementation does not take
      throw UserError("bench attention: " + impl + ": " + e.what());
    }
    ctx->finish();
    const Outputs got = outputs();
    const double diffs[5] = {rel_diff(got.out, want.out), rel_diff(got.lse, want.lse), rel_diff(got.dq, want.dq),
                             rel_diff(got.dk, want.dk), rel_diff(got.dv, want.dv)};
    // fp16 operands (flash, gemm) against fp32: ~1e-3 expected; a masking or tiling error is O(1).
    bool ok = true;
    for (double x : diffs) ok = ok && x < 2e-2;
    // Sampled forward rows against a double-precision CPU computation.
    std::uniform_int_distribution<uint32_t> pick_row(0, S - 1), pick_head(0, nh - 1), pick_b(0, B - 1);
    for (int sample = 0; sample < 8; ++sample) {
      const uint32_t b = pick_b(rng), i = pick_row(rng), h = pick_head(rng), gkv = h / (nh / nkv);
      const int32_t si = seg[uint64_t(b) * S + i];
      std::vector<double> s(i + 1, -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (uint32_t j = 0; j <= i; ++j) {
        if (seg[uint64_t(b) * S + j] != si) continue;
        double dot = 0;
        for (uint32_t c = 0; c < d; ++c)
          dot += double(q[((uint64_t(b) * S + i) * nh + h) * d + c]) * k[((uint64_t(b) * S + j) * nkv + gkv) * d + c];
        s[j] = scale * dot;
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      std::vector<double> row(d, 0.0);
      for (uint32_t j = 0; j <= i; ++j) {
        if (std::isinf(s[j])) continue;
        const double p = std::exp(s[j] - mx);
        l += p;
        for (uint32_t c = 0; c < d; ++c) row[c] += p * v[((uint64_t(b) * S + j) * nkv + gkv) * d + c];
      }
      for (uint32_t c = 0; c < d; ++c)
        if (std::abs(got.out[((uint64_t(b) * S + i) * nh + h) * d + c] - row[c] / l) > 2e-2) ok = false;
    }
    const double f = time([&] { forward(impl); });
    const double bw = time([&] { backward(impl); });
    std::printf("%-6s %10.3f %8.1f %10.3f %8.1f %10.3f %8.1f  %.1e %.1e %.1e %.1e %.1e %s\n", impl.c_str(), f * 1e3,
                2 * product / f * 1e-12, bw * 1e3, 5 * product / bw * 1e-12, (f + bw) * 1e3,
                7 * product / (f + bw) * 1e-12, diffs[0], diffs[1], diffs[2], diffs[3], diffs[4],
                ok ? "ok" : "WRONG");
    std::fflush(stdout);
    all_ok = all_ok && ok;
  }
  for (const gpu::Buffer& b : {g.q, g.k, g.v, g.seg, g.out, g.lse, g.dout, g.dq, g.dk, g.dv}) ctx->free(b);
  if (model_inputs)
    for (const gpu::Buffer& b : {q16, k16, out16}) ctx->free(b);
  return all_ok ? 0 : 1;
}

// A 0/1 option of the fused kernels; left out (-1), the library's default (which its variable may
// set) stands.
void add_switch(CLI::App* cmd, const std::string& name, int& value, const std::string& help) {
  cmd->add_option(name, value, help + "; default: the library's")->check(CLI::Range(0, 1));
}

// A subcommand of `bench`, which cmd_bench_train.cpp registers (order 80, set up before this).
forja::cli::CommandRegistration bench_attention_registration{"bench-attention", 82, [](CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto* cmd = bench->add_subcommand("attention", "Causal attention forward/backward throughput (TFLOP/s) "
                                                 "of flash, gemm and tiled");
  auto o = std::make_shared<AttnBenchOptions>();
  cmd->add_option("--batch", o->batch, "Sequences")->check(CLI::Range(1u, 65535u));
  cmd->add_option("--seq-len", o->seq, "Tokens per sequence")->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--heads", o->heads, "Query heads");
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads");
  cmd->add_option("--head-dim", o->head_dim, "Head dimension");
  cmd->add_option("--impl", o->impls, "Comma-separated implementations: flash, fused, fused-backward, gemm, tiled");
  cmd->add_option("--flash-kernel", o->flash_kernel, "flash's kernel: automatic, coopmat, emulated, f32");
  cmd->add_option("--block-q", o->block_q, "flash's query rows per tile (0: automatic)");
  cmd->add_option("--block-k", o->block_k, "flash's keys per tile (0: automatic)");
  cmd->add_option("--dkdv-split", o->dkdv_split,
                  "flash's dk/dv workgroups per kv head (a divisor of heads / kv-heads; 0: automatic)");
  cmd->add_flag("--packed", o->packed, "Four packed documents per sequence instead of one");
  cmd->add_option("--fused-forward-tiles", o->fused_forward_tiles,
                  "the fused forward's workgroups: WARPS,KEYS,PREFETCH (subgroups 1/2/4/8, tiles 16/32/64, prefetch 0/1; "
                  "default 8,64,0)");
  cmd->add_option("--fused-backward-tiles", o->fused_backward_tiles,
                  "fused-backward's workgroups: DQ_WARPS,DQ_KEYS,KV_WARPS,KV_QUERIES (subgroups 1/2/4/8, tiles "
                  "16/32/64; default 4,64,4,32)");
  add_switch(cmd, "--paired", o->paired,
             "the fused kernels' workgroups take row tiles w and n - 1 - w (1) or tile w alone (0)");
  cmd->add_option("--dkv-split-target", o->dkv_split_target,
                  "fused-backward's dk/dv kernel: workgroups below which a kv head's query heads are split "
                  "across workgroups (0: never; default 1024)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--dq-ds-warps", o->dq_ds_warps,
                  "fused-backward's dq from dS: subgroups of 16 query rows per workgroup (1, 2, 4, 8; default 4)")
      ->check(CLI::IsMember({1u, 2u, 4u, 8u}));
  add_switch(cmd, "--dq-ds-quad", o->dq_ds_quad,
             "fused-backward's dq from dS: subgroups 2 x 2, 32 rows by half of head_dim each (1), or 16 rows by "
             "all of it (0)");
  add_switch(cmd, "--pingpong", o->pingpong,
             "the fused forward's ping-pong schedule: half of the subgroups on their products while the other half "
             "runs its softmax (1), or all in step (0)");
  cmd->add_flag("--model-inputs", o->model_inputs,
                "fused-backward as training runs it: q, k and the backward's out given in fp16 (copied outside "
                "the timing), so neither call converts them");
  cmd->add_option("--reps", o->reps, "Timed repetitions (best is reported)")->check(CLI::Range(1, 1000));
  cmd->add_option("--device", o->device, "Vulkan device index");
  return [o, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    return run(*o);
  };
}};

}  // namespace
