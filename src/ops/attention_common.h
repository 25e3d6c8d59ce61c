// Shapes and argument checks shared by the two attention implementations (ops/attention.h, the
// fp32 tiled kernels, and ops/attention_gemm.h, through the GEMM kernels); both take the same
// layouts: q-like fp32 [B*S, nh, d], kv-like [B*S, nkv, d], segments [B*S], lse [B, nh, S].
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/context.h"

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

// The forward's operands (the backward's too, which adds dout, dq, dk, dv).
inline void check_attention_operands(const char* op, const AttentionDims& m, const gpu::Buffer& q,
                                     const gpu::Buffer& k, const gpu::Buffer& v, const gpu::Buffer& segments,
                                     const gpu::Buffer& out, const gpu::Buffer& lse) {
  check_attention_buffer(op, "q", q, m.q_seq() * m.batch);
  check_attention_buffer(op, "k", k, m.kv_seq() * m.batch);
  check_attention_buffer(op, "v", v, m.kv_seq() * m.batch);
  check_attention_buffer(op, "segments", segments, uint64_t(m.seq) * m.batch);
  check_attention_buffer(op, "out", out, m.q_seq() * m.batch);
  check_attention_buffer(op, "lse", lse, m.stat_seq() * m.batch);
}

inline void check_attention_gradients(const char* op, const AttentionDims& m, const gpu::Buffer& dout,
                                      const gpu::Buffer& dq, const gpu::Buffer& dk, const gpu::Buffer& dv) {
  check_attention_buffer(op, "dout", dout, m.q_seq() * m.batch);
  check_attention_buffer(op, "dq", dq, m.q_seq() * m.batch);
  check_attention_buffer(op, "dk", dk, m.kv_seq() * m.batch);
  check_attention_buffer(op, "dv", dv, m.kv_seq() * m.batch);
}

}  // namespace forja::ops
