// Shapes and argument checks shared by the two attention implementations (ops/attention.h, the
// fp32 tiled kernels, and ops/attention_gemm.h, through the GEMM kernels); both take the same
// layouts: q-like fp32 [B*S, nh, d], kv-like [B*S, nkv, d], segments [B*S], lse [B, nh, S].
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/context.h"
#include "ops/chunking.h"

namespace forja::ops {

struct AttentionDims {
  uint32_t batch, seq, nh, nkv, d;
  uint32_t rep() const { return nh / nkv; }                     // query heads per kv head
  uint64_t q_seq() const { return uint64_t(seq) * nh * d; }     // q-like elements per sequence
  uint64_t kv_seq() const { return uint64_t(seq) * nkv * d; }   // kv-like elements per sequence
  uint64_t stat_seq() const { return uint64_t(seq) * nh; }      // per-row statistics per sequence
};

inline void check_attention_buffer(const char* op, const char* name, const gpu::Buffer& b, uint64_t elements) {
  if (b.size < elements * 4)
    throw std::invalid_argument(std::string(op) + ": buffer '" + name + "' has " + std::to_string(b.size) +
                                " bytes, the shape needs " + std::to_string(elements * 4));
}

inline void check_attention_heads(const char* op, const AttentionDims& m) {
  if (m.nh == 0 || m.nkv == 0 || m.nh % m.nkv != 0)
    throw std::invalid_argument(std::string(op) + ": n_heads (" + std::to_string(m.nh) +
                                ") must be a positive multiple of n_kv_heads (" + std::to_string(m.nkv) + ")");
  if (m.d == 0) throw std::invalid_argument(std::string(op) + ": head_dim is 0");
}

// out: fp32 [B*S, nh, d], or with out_f16_ld > 0 fp16 rows of that many halves per token
// (AttentionGemmOptions::out_f16_ld: even, at least nh * d, d even).
inline void check_attention_out(const char* op, const AttentionDims& m, const gpu::Buffer& out, uint32_t out_f16_ld) {
  if (out_f16_ld == 0) return check_attention_buffer(op, "out", out, m.q_seq() * m.batch);
  if (out_f16_ld < m.nh * m.d || out_f16_ld % 2 || m.d % 2 || out.size < uint64_t(m.seq) * m.batch * out_f16_ld * 2)
    throw std::invalid_argument(std::string(op) + ": the fp16 out needs rows of an even number of halves >= heads x " +
                                "head_dim (even), " + std::to_string(out_f16_ld) + " given, in " +
                                std::to_string(out.size) + " bytes");
}

// The forward's operands (the backward's too, which adds dout, dq, dk, dv).
// out_f16_ld > 0: out is fp16 in rows of that many halves per token (AttentionGemmOptions::out_f16_ld).
inline void check_attention_operands(const char* op, const AttentionDims& m, const gpu::Buffer& q,
                                     const gpu::Buffer& k, const gpu::Buffer& v, const gpu::Buffer& segments,
                                     const gpu::Buffer& out, const gpu::Buffer& lse, uint32_t out_f16_ld = 0) {
  check_attention_buffer(op, "q", q, m.q_seq() * m.batch);
  check_attention_buffer(op, "k", k, m.kv_seq() * m.batch);
  check_attention_buffer(op, "v", v, m.kv_seq() * m.batch);
  check_attention_buffer(op, "segments", segments, uint64_t(m.seq) * m.batch);
  check_attention_out(op, m, out, out_f16_ld);
  check_attention_buffer(op, "lse", lse, m.stat_seq() * m.batch);
}

inline void check_attention_gradients(const char* op, const AttentionDims& m, const gpu::Buffer& dout,
                                      const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv) {
  check_attention_buffer(op, "dout", dout, m.q_seq() * m.batch);
  check_attention_buffer(op, "dq", dq, m.q_seq() * m.batch);
  check_attention_buffer(op, "dk", dk, m.kv_seq() * m.batch);
  check_attention_buffer(op, "dv", dv, m.kv_seq() * m.batch);
}

// Sequences per dispatch so that the largest binding (plus alignment slack) fits the device.
inline uint32_t sequences_per_dispatch(const gpu::Context& ctx, const char* op, const AttentionDims& m) {
  const uint64_t range = ctx.info().max_storage_buffer_range;
  const uint64_t slack = std::max<uint64_t>(256, ctx.info().min_storage_offset_alignment);
  const uint64_t per_seq = std::max({m.q_seq(), m.kv_seq(), m.stat_seq()}) * 4;
  if (per_seq + slack > range)
    throw std::invalid_argument(std::string(op) + ": one sequence of q (" + std::to_string(per_seq) +
                                " bytes) exceeds the device's maxStorageBufferRange; lower the sequence length");
  return static_cast<uint32_t>(std::min<uint64_t>({(range - slack) / per_seq, m.batch, 65535}));
}

// The operands of sequences [b0, b0 + nb) as bindings (one dispatch's group of sequences).
struct AttentionBindings {
  Bound q, k, v, segments, out, lse;
};
inline AttentionBindings bind_attention(const gpu::Context& ctx, const AttentionDims& m, uint32_t b0, uint32_t nb,
                                        const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                                        const gpu::Buffer& segments, const gpu::Buffer& out, const gpu::Buffer& lse,
                                        bool bind_out = true) {
  return {bind_elements(ctx, q, b0 * m.q_seq(), nb * m.q_seq()),
          bind_elements(ctx, k, b0 * m.kv_seq(), nb * m.kv_seq()),
          bind_elements(ctx, v, b0 * m.kv_seq(), nb * m.kv_seq()),
          bind_elements(ctx, segments, uint64_t(b0) * m.seq, uint64_t(nb) * m.seq),
          bind_out ? bind_elements(ctx, out, b0 * m.q_seq(), nb * m.q_seq()) : Bound{},
          bind_elements(ctx, lse, b0 * m.stat_seq(), nb * m.stat_seq())};
}
// The backward's: dout, dq, dk, dv and the per-row statistic D = rowsum(dout * out).
struct AttentionGradBindings {
  Bound dout, dq, dk, dv, drow;
};
inline AttentionGradBindings bind_attention_grads(const gpu::Context& ctx, const AttentionDims& m, uint32_t b0,
                                                  uint32_t nb, const gpu::Buffer& dout, const gpu::Buffer& dq,
                                                  const gpu::Buffer& dk, const gpu::Buffer& dv,
                                                  const gpu::Buffer& drow) {
  return {bind_elements(ctx, dout, b0 * m.q_seq(), nb * m.q_seq()),
          bind_elements(ctx, dq, b0 * m.q_seq(), nb * m.q_seq()),
          bind_elements(ctx, dk, b0 * m.kv_seq(), nb * m.kv_seq()),
          bind_elements(ctx, dv, b0 * m.kv_seq(), nb * m.kv_seq()),
          bind_elements(ctx, drow, b0 * m.stat_seq(), nb * m.stat_seq())};
}

// A backward kernel's nine bindings with their element offsets (the push constants' off[9]),
// in the order the tiled and the flash kernels both declare them:
//   dq:   q k v segments out lse dout (read), dq drow (written)
//   dkdv: q k v segments lse dout drow (read), dk dv (written)
struct BackwardKernelArgs {
  std::vector<gpu::Binding> bindings;
  std::array<uint32_t, 9> offsets;
};
inline BackwardKernelArgs backward_kernel_args(const std::array<const Bound*, 7>& read,
                                               const std::array<const Bound*, 2>& written) {
  BackwardKernelArgs a;
  size_t i = 0;
  for (const Bound* b : read) {
    a.bindings.push_back({b->buffer, gpu::Access::read});
    a.offsets[i++] = b->offset;
  }
  for (const Bound* b : written) {
    a.bindings.push_back({b->buffer, gpu::Access::write});
    a.offsets[i++] = b->offset;
  }
  return a;
}
inline BackwardKernelArgs dq_kernel_args(const AttentionBindings& f, const AttentionGradBindings& g) {
  return backward_kernel_args({&f.q, &f.k, &f.v, &f.segments, &f.out, &f.lse, &g.dout}, {&g.dq, &g.drow});
}
inline BackwardKernelArgs dkdv_kernel_args(const AttentionBindings& f, const AttentionGradBindings& g,
                                           const Bound& dk, const Bound& dv) {
  return backward_kernel_args({&f.q, &f.k, &f.v, &f.segments, &f.lse, &g.dout, &g.drow}, {&dk, &dv});
}

}  // namespace forja::ops
