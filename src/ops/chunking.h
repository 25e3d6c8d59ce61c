// Helpers shared by the ops that split a tensor larger than the device's storage-buffer binding
// limit into several dispatches (rmsnorm, rope, embedding): each dispatch binds a window of the
// buffer that starts at an offset the device accepts (a multiple of the storage-buffer offset
// alignment, at least 16 bytes) and ends at a 16-byte boundary; the kernel is told, in
// elements, where the chunk's data starts inside the window.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/context.h"

namespace forja::ops {

// The alignment of every binding's start: the device's minimum storage-buffer offset
// alignment, and never less than 16 bytes.
inline uint64_t offset_alignment(const gpu::Context& ctx) {
  return std::max<uint64_t>(16, ctx.info().min_storage_offset_alignment);
}

// Bytes of data one binding may cover, leaving room for the shift down to an aligned start
// and the 16-byte round-up of window(): rows per chunk = usable_binding_bytes / row bytes.
inline uint64_t usable_binding_bytes(const gpu::Context& ctx) {
  return ctx.info().max_storage_buffer_range - offset_alignment(ctx) - 16;
}

// A binding that covers bytes [begin, begin + bytes) of `b` from an offset the device accepts;
// `first` is the number of `elem_bytes` elements between the binding's start and `begin`.
struct Window {
  gpu::Buffer view;
  uint32_t first;
};
inline Window window(const gpu::Context& ctx, const gpu::Buffer& b, uint64_t begin, uint64_t bytes,
                     uint32_t elem_bytes = 4) {
  const uint64_t align = offset_alignment(ctx);
  const uint64_t start = begin / align * align;
  const uint64_t end = std::min<uint64_t>((begin + bytes + 15) / 16 * 16, b.size);
  return {b.slice(start, end - start), static_cast<uint32_t>((begin - start) / elem_bytes)};
}

// window() in 4-byte elements: a binding of `count` (at least one) elements of `b` from element
// `first`; the kernel adds `offset` (in elements) to its indices.
struct Bound {
  gpu::Buffer buffer;
  uint32_t offset;
};
inline Bound bind_elements(const gpu::Context& ctx, const gpu::Buffer& b, uint64_t first, uint64_t count) {
  const Window w = window(ctx, b, first * 4, std::max<uint64_t>(count, 1) * 4);
  return {w.view, w.first};
}

// Throws std::logic_error ("<op>: <name> ...") unless `b` holds at least `bytes` and starts at
// an aligned offset (so that every window() of it does too).
inline void check_buffer(const gpu::Context& ctx, const char* op, const char* name, const gpu::Buffer& b,
                         uint64_t bytes) {
  if (b.size < bytes)
    throw std::logic_error(std::string(op) + ": " + name + " holds " + std::to_string(b.size) + " bytes, the shape needs " +
                           std::to_string(bytes));
  if (b.offset % offset_alignment(ctx) != 0)
    throw std::logic_error(std::string(op) + ": " + name + " starts at offset " + std::to_string(b.offset) +
                           ", not a multiple of the storage-buffer offset alignment");
}

}  // namespace forja::ops
