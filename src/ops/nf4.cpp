#include "ops/nf4.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernel_table.h"
#include "ops/chunking.h"

namespace forja::ops {

namespace {

// nf4_f16's packed words per invocation (kernels/nf4.comp), a workgroup apart. On an H100 four
// of them against one took the Qwen3-4B 1x2048 step's dequantisation from 85.1 to 80.9 ms over
// six steps; four consecutive ones (one 16-byte load, four 16-byte stores 64 bytes apart from
// lane to lane) took 126.8 (docs/benchmarks.md, run 15).
constexpr uint32_t kDequantWords = 4;

// Must match Nf4Push in kernels/nf4.comp.
struct DequantPush {
  uint32_t first, count, groups_x;
  float absmax_offset;
  uint32_t cols, ld;
  uint32_t ext_rows, ext_width, ext_at;
  uint32_t ext_src_off, ext_src_ld, ext_valid_rows, ext_cols;
  float ext_scale;
  uint32_t ext_lead;
};

// Must match Nf4GemmPush in kernels/nf4_gemm.comp and nf4_gemm_coopmat.comp.
struct Nf4GemmPush {
  uint32_t m, n, k;
  uint32_t lda, ldc;
  uint32_t a_offset, c_offset;
  float alpha, beta;
  float absmax_offset;
};
static_assert(kernels::push_block_matches<DequantPush>(kernels::nf4, kernels::nf4_f16),
              "DequantPush differs from kernels/nf4.comp's push-constant block");
static_assert(kernels::push_block_matches<Nf4GemmPush>(kernels::nf4_gemm_t64, kernels::nf4_gemm_t128,
                                                       kernels::nf4_gemm_f16_t64, kernels::nf4_gemm_f16_t128,
                                                       kernels::nf4_gemm_nvcm, kernels::nf4_gemm_nvcm_emu),
              "Nf4GemmPush differs from kernels/nf4_gemm.comp's push-constant block");

// Uploads `bytes` bytes padded with zeros to a multiple of 4 (the kernels read uint words).
gpu::Buffer upload_bytes(gpu::Context& ctx, const void* data, uint64_t bytes, const std::string& what) {
  const uint64_t padded = (bytes + 3) / 4 * 4;
  gpu::Buffer b = ctx.alloc(std::max<uint64_t>(padded, 16), what);
  std::vector<uint8_t> host(padded, 0);
  std::copy_n(static_cast<const uint8_t*>(data), bytes, host.begin());
  ctx.upload(b, host.data(), padded);
  return b;
}

void check_binding(const gpu::Context& ctx, uint64_t bytes, const std::string& what) {
  const uint64_t range = ctx.info().max_storage_buffer_range;
  if (bytes > range)
    throw std::logic_error("nf4: " + what + " of " + std::to_string(bytes) +
                           " bytes exceeds the device's binding limit (maxStorageBufferRange) of " +
                           std::to_string(range) + " bytes; split the weight by rows before quantising");
}

void check_weight(const Nf4Weight& w, const char* op) {
  if (!w.packed.valid() || !w.absmax.valid() || w.rows == 0 || w.cols == 0)
    throw std::logic_error(std::string(op) + ": the NF4 weight is not uploaded");
  if (w.double_quant && (!w.nested_absmax.valid() || !w.code8.valid()))
    throw std::logic_error(std::string(op) + ": double-quantised weight without nested absmax or code table");
}

// Bindings 0..3 of the NF4 kernels (nf4_common.glsl). Without double quantisation the nested
// absmax and code table are unused; the absmax buffer stands in for them.
std::vector<gpu::Binding> weight_bindings(const Nf4Weight& w) {
  const gpu::Buffer& nested = w.double_quant ? w.nested_absmax : w.absmax;
  const gpu::Buffer& code8 = w.double_quant ? w.code8 : w.absmax;
  return {{w.packed, gpu::Access::read},
          {w.absmax, gpu::Access::read},
          {nested, gpu::Access::read},
          {code8, gpu::Access::read}};
}

// A binding covering bytes [first, first + bytes) of `b`, starting at an offset the device
// accepts; `elem_offset` receives the fp32 elements between the binding's start and `first`.
gpu::Buffer bind_range(const gpu::Context& ctx, const gpu::Buffer& b, uint64_t first, uint64_t bytes,
                       uint32_t& elem_offset) {
  const uint64_t align = offset_alignment(ctx);
  const uint64_t begin = first / align * align;
  elem_offset = static_cast<uint32_t>((first - begin) / 4);
  return b.slice(begin, first + bytes - begin);
}

bool nf4_coopmat_available(const gpu::Context& ctx) {
  return ctx.info().nv_coopmat_f16_f32_16x16x16 && kernels::nf4_gemm_nvcm.built &&
         !gpu::env_flag("FORJA_NO_COOPMAT");
}

// C [M, N] = alpha * A [M, K] · op(W) + beta * C with op(W) = W^T (trans_w, W [N, K]) or W
// (W [K, N]). Splits M so that no binding of A or C exceeds the device's limit.
void fused_gemm(gpu::Context& ctx, const gpu::Buffer& a, const Nf4Weight& w, const gpu::Buffer& c, uint32_t m,
                uint32_t n, uint32_t k, bool trans_w, float alpha, float beta, DType operands, GemmKernel kernel,
                const char* op) {
  check_weight(w, op);
  if (uint64_t(m) * k * 4 > a.size || uint64_t(m) * n * 4 > c.size)
    throw std::logic_error(std::string(op) + ": input or output buffer too small for " + std::to_string(m) +
                           " rows of the " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " weight");
  if (m == 0) return;
  if (kernel == GemmKernel::automatic) kernel = nf4_gemm_kernel_for(ctx, operands);
  const bool scalar =
      kernel == GemmKernel::scalar || kernel == GemmKernel::scalar_t64 || kernel == GemmKernel::scalar_t128;
  if (!scalar && operands != DType::f16)
    throw std::logic_error(std::string(op) + ": the cooperative-matrix kernel takes fp16 operands");
  if (kernel == GemmKernel::coopmat && !nf4_coopmat_available(ctx))
    throw std::logic_error(std::string(op) + ": the cooperative-matrix kernel is not available on this device");

  const uint64_t align = offset_alignment(ctx);
  const uint64_t range = ctx.info().max_storage_buffer_range;
  const uint64_t row_bytes = uint64_t(std::max(n, k)) * 4;
  if (row_bytes + align > range) throw std::logic_error(std::string(op) + ": one row exceeds the binding limit");
  const uint64_t max_rows = std::min<uint64_t>((range - align) / row_bytes, 65535ull * 64);

  // Bindings: 0 A, 1..4 the weight, 5 C.
  std::vector<gpu::Binding> bindings = weight_bindings(w);
  bindings.insert(bindings.begin(), gpu::Binding{});
  bindings.emplace_back();
  for (uint64_t m0 = 0; m0 < m; m0 += max_rows) {
    const uint32_t mp = static_cast<uint32_t>(std::min<uint64_t>(max_rows, m - m0));
    Nf4GemmPush push{mp, n, k, k, n, 0, 0, alpha, beta, w.double_quant ? w.absmax_offset : 0.0f};
    bindings[0] = {bind_range(ctx, a, m0 * k * 4, uint64_t(mp) * k * 4, push.a_offset), gpu::Access::read};
    bindings[5] = {bind_range(ctx, c, m0 * n * 4, uint64_t(mp) * n * 4, push.c_offset),
                   beta != 0.0f ? gpu::Access::read_write : gpu::Access::write};
    const double flops = 2.0 * mp * n * k;
    const std::vector<uint32_t> spec = {trans_w ? 1u : 0u, w.double_quant ? 1u : 0u};
    if (scalar) {
      // Tile choice as for ops::gemm's scalar kernel (see scalar_tile in gemm.cpp).
      const uint64_t groups128 = uint64_t((n + 127) / 128) * ((mp + 127) / 128);
      const bool small = kernel == GemmKernel::scalar_t64 ||
                         (kernel == GemmKernel::scalar &&
                          (mp < 128 || n < 128 || (!ctx.info().is_cpu() && groups128 < 128)));
      const uint32_t tile = small ? 64 : 128;
      // 4-element chunks (see nf4_gemm.comp): A's rows and offset, W's stored rows, C's rows.
      const uint32_t vec_a = k % 4 == 0 && push.a_offset % 4 == 0, vec_b = w.cols % 4 == 0;
      const uint32_t vec_c = n % 4 == 0 && push.c_offset % 4 == 0;
      const kernels::Kernel& variant = operands == DType::f16
                                           ? (small ? kernels::nf4_gemm_f16_t64 : kernels::nf4_gemm_f16_t128)
                                           : (small ? kernels::nf4_gemm_t64 : kernels::nf4_gemm_t128);
      const auto& p = ctx.pipelines().get(variant, {spec[0], spec[1], vec_a, vec_b, vec_c});
      ctx.dispatch(p, bindings, push, (n + tile - 1) / tile, (mp + tile - 1) / tile, 1, op, flops);
    } else {
      // Workgroup tile BM = BN = 128 where that still gives the device enough workgroups, else
      // 64 (and always 64 when emulated); BK = 32, 2 x 2 subgroups. Shared memory at 128:
      // 2 stages x (128 + 128) rows x 5 chunks x 16 B + 4 KiB epilogue = 45 KiB.
      const bool emulated = kernel == GemmKernel::coopmat_emulated;
      const kernels::Kernel& variant = emulated ? kernels::nf4_gemm_nvcm_emu : kernels::nf4_gemm_nvcm;
      const uint64_t groups128 = uint64_t((n + 127) / 128) * ((mp + 127) / 128);
      const uint32_t tile = !emulated && groups128 >= 120 && ctx.info().max_shared_memory >= 48 * 1024 ? 128 : 64;
      const uint32_t vec_a = k % 8 == 0 && push.a_offset % 4 == 0, vec_b = w.cols % 8 == 0;
      const auto& p = ctx.pipelines().get(variant, {128, tile, tile, 32, 2, 2, spec[0], spec[1], vec_a, vec_b});
      ctx.dispatch(p, bindings, push, (n + tile - 1) / tile, (mp + tile - 1) / tile, 1, op, flops);
    }
  }
}

}  // namespace

Nf4Weight upload_nf4(gpu::Context& ctx, const quant::Nf4Tensor& t) {
  Nf4Weight w;
  if (t.shape.size() == 2) {
    if (t.shape[0] <= 0 || t.shape[1] <= 0) throw std::logic_error("upload_nf4: empty weight");
    w.rows = static_cast<uint32_t>(t.shape[0]);
    w.cols = static_cast<uint32_t>(t.shape[1]);
  } else if (t.shape.size() == 1 && t.shape[0] > 0) {
    w.rows = 1;
    w.cols = static_cast<uint32_t>(t.shape[0]);
  } else {
    throw std::logic_error("upload_nf4: expected a 2-D [rows, cols] (or non-empty 1-D) tensor");
  }
  if (int64_t(w.rows) * w.cols != t.numel || t.numel >= (int64_t(1) << 31))
    throw std::logic_error("upload_nf4: numel " + std::to_string(t.numel) +
                           " does not match the shape or is 2^31 or more");
  const uint64_t blocks = static_cast<uint64_t>(t.num_blocks());
  if (t.packed.size() != static_cast<size_t>((t.numel + 1) / 2))
    throw std::logic_error("upload_nf4: packed size does not match numel");
  check_binding(ctx, t.packed.size(), "packed weight");
  w.double_quant = t.double_quant;
  w.packed = upload_bytes(ctx, t.packed.data(), t.packed.size(), "nf4 packed");
  if (!t.double_quant) {
    if (t.absmax.size() != blocks) throw std::logic_error("upload_nf4: absmax size does not match the blocks");
    check_binding(ctx, blocks * 4, "absmax");
    w.absmax = upload_bytes(ctx, t.absmax.data(), blocks * 4, "nf4 absmax");
    return w;
  }
  const uint64_t nested = (blocks + quant::kNf4NestedBlockSize - 1) / quant::kNf4NestedBlockSize;
  if (t.absmax_q.size() != blocks || t.nested_absmax.size() != nested)
    throw std::logic_error("upload_nf4: absmax codes or nested absmax do not match the blocks");
  w.absmax = upload_bytes(ctx, t.absmax_q.data(), blocks, "nf4 absmax codes");
  w.nested_absmax = upload_bytes(ctx, t.nested_absmax.data(), nested * 4, "nf4 nested absmax");
  if (!t.code8.empty() && t.code8.size() != 256)
    throw std::logic_error("upload_nf4: a code8 table needs 256 entries");
  const float* code8 = t.code8.empty() ? quant::dynamic_map_signed().data() : t.code8.data();
  w.code8 = upload_bytes(ctx, code8, 256 * 4, "nf4 code8");
  w.absmax_offset = t.absmax_offset;
  return w;
}

void free_nf4(gpu::Context& ctx, Nf4Weight& w) {
  for (gpu::Buffer* b : {&w.packed, &w.absmax, &w.nested_absmax, &w.code8})
    if (b->valid()) ctx.free(*b);
  w = Nf4Weight{};
}

void nf4_dequantize(gpu::Context& ctx, const Nf4Weight& w, const gpu::Buffer& out, DType out_dtype, uint32_t out_ld,
                    const Nf4Beside* beside) {
  check_weight(w, "nf4_dequantize");
  const uint64_t n = uint64_t(w.rows) * w.cols;
  const uint64_t es = dtype_bytes(out_dtype);
  if (out_ld == 0) out_ld = w.cols;
  uint64_t span = uint64_t(w.rows - 1) * out_ld + w.cols;
  if (out_dtype == DType::f16 && n % 8 != 0)
    throw std::logic_error("nf4_dequantize: fp16 output needs rows x cols to be a multiple of 8");
  if (beside) {
    if (out_dtype != DType::f16 || out_ld == w.cols || !beside->src.valid() || beside->width % 8 || beside->dst_first % 8 ||
        uint64_t(beside->lead) + beside->cols > beside->width ||
        (beside->valid_rows > 1 && beside->cols > beside->src_ld))
      throw std::logic_error("nf4_dequantize: a block beside W needs fp16 with a row stride, width and start multiples of 8");
    if (beside->rows > 0) span = std::max<uint64_t>(span, beside->dst_first + uint64_t(beside->rows - 1) * out_ld + beside->width);
  }
  if (out.size < span * es) throw std::logic_error("nf4_dequantize: output buffer smaller than its rows");
  if (out_ld != w.cols && (out_dtype != DType::f16 || out_ld < w.cols || w.cols % 8 || out_ld % 8 ||
                           span * es > ctx.info().max_storage_buffer_range))
    throw std::logic_error("nf4_dequantize: a row stride needs fp16, cols and stride multiples of 8, one binding");
  // Elements per dispatch: within the binding limit, a multiple of 8 (one packed word per
  // invocation) and of the offset alignment.
  const uint64_t step = std::max<uint64_t>(8, offset_alignment(ctx) / es);
  const uint64_t chunk = ctx.info().max_storage_buffer_range / es / step * step;
  std::vector<gpu::Binding> bindings = weight_bindings(w);
  const bool f16 = out_dtype == DType::f16;
  bindings.resize(f16 ? 6 : 5);
  // The block beside W: its source rows as one binding (or any readable buffer when there is none).
  Bound ext{w.packed, 0};
  const bool has_ext = beside && beside->rows > 0;
  if (has_ext && beside->valid_rows > 0 && beside->cols > 0)
    ext = bind_elements(ctx, beside->src, beside->src_first,
                        uint64_t(beside->valid_rows - 1) * beside->src_ld + beside->cols);
  if (f16) bindings[5] = {ext.buffer, gpu::Access::read};
  const uint64_t ext_halves = has_ext ? uint64_t(beside->rows) * beside->width : 0;
  const auto& p = ctx.pipelines().get(f16 ? kernels::nf4_f16 : kernels::nf4, {w.double_quant ? 1u : 0u, kDequantWords});
  for (uint64_t first = 0; first < n; first += chunk) {
    const uint64_t count = std::min(chunk, n - first);
    bindings[4] = {out_ld == w.cols ? out.slice(first * es, count * es) : out.slice(0, span * es), gpu::Access::write};
    // nf4_f16: kDequantWords words per invocation, then one 8-half chunk of the block beside W each.
    const uint64_t groups = f16 ? (count / 8 + 256 * kDequantWords - 1) / (256 * kDequantWords) + (ext_halves / 8 + 255) / 256
                                : (count + 8 * 256 - 1) / (8 * 256);
    const uint32_t gx = static_cast<uint32_t>(std::min<uint64_t>(groups, 65535));
    const uint32_t gy = static_cast<uint32_t>((groups + gx - 1) / gx);
    DequantPush push{static_cast<uint32_t>(first), static_cast<uint32_t>(count), gx,
                     w.double_quant ? w.absmax_offset : 0.0f, w.cols, out_ld};
    if (has_ext) {
      push.ext_rows = beside->rows, push.ext_width = beside->width;
      push.ext_at = static_cast<uint32_t>(beside->dst_first);
      push.ext_src_off = ext.offset, push.ext_src_ld = beside->src_ld;
      push.ext_valid_rows = beside->valid_rows, push.ext_cols = beside->cols, push.ext_scale = beside->scale;
      push.ext_lead = beside->lead;
    }
    ctx.dispatch(p, bindings, push, gx, gy, 1, "nf4_dequantize");
  }
}

GemmKernel nf4_gemm_kernel_for(const gpu::Context& ctx, DType operands) {
  return operands == DType::f16 && nf4_coopmat_available(ctx) ? GemmKernel::coopmat : GemmKernel::scalar;
}

void nf4_gemm_xwt(gpu::Context& ctx, const gpu::Buffer& x, const Nf4Weight& w, const gpu::Buffer& y, uint32_t m,
                  float alpha, float beta, DType operands, GemmKernel kernel) {
  fused_gemm(ctx, x, w, y, m, w.rows, w.cols, true, alpha, beta, operands, kernel, "nf4_gemm_xwt");
}

void nf4_gemm_dyw(gpu::Context& ctx, const gpu::Buffer& dy, const Nf4Weight& w, const gpu::Buffer& dx, uint32_t m,
                  float alpha, float beta, DType operands, GemmKernel kernel) {
  fused_gemm(ctx, dy, w, dx, m, w.cols, w.rows, false, alpha, beta, operands, kernel, "nf4_gemm_dyw");
}

}  // namespace forja::ops
