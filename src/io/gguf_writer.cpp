// GGUF v3 serialisation (see io/gguf_writer.h for the layout and its sources).
#include "io/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "io/atomic_file.h"
#include "util/error.h"

namespace forja::io {
namespace {

template <typename T>
void put(std::string& out, T value) {
  // Little-endian hosts only (x86-64, arm64): the bytes of the value are its LE encoding.
  static_assert(std::endian::native == std::endian::little);
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<std::uint64_t>(out, s.size());
  out += s;
}

std::uint64_t padded(std::uint64_t n) { return (n + kGgufAlignment - 1) / kGgufAlignment * kGgufAlignment; }

}  // namespace

std::size_t ggml_type_size(GgmlType t) { return t == GgmlType::f32 ? 4 : 2; }

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::f32:
      return "f32";
    case GgmlType::f16:
      return "f16";
    case GgmlType::bf16:
      return "bf16";
  }
  return "?";
}

std::uint64_t GgufWriter::Tensor::bytes() const {
  std::uint64_t n = ggml_type_size(type);
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

void GgufWriter::key(const std::string& k, GgufValueType type) {
  if (std::find(keys_.begin(), keys_.end(), k) != keys_.end())
    throw std::logic_error("gguf writer: key '" + k + "' added twice");
  keys_.push_back(k);
  put_string(kv_, k);
  put<std::uint32_t>(kv_, static_cast<std::uint32_t>(type));
}

void GgufWriter::add_string(const std::string& k, const std::string& value) {
  key(k, GgufValueType::string);
  put_string(kv_, value);
}
void GgufWriter::add_u32(const std::string& k, std::uint32_t value) {
  key(k, GgufValueType::uint32);
  put(kv_, value);
}
void GgufWriter::add_i32(const std::string& k, std::int32_t value) {
  key(k, GgufValueType::int32);
  put(kv_, value);
}
void GgufWriter::add_f32(const std::string& k, float value) {
  key(k, GgufValueType::float32);
  put(kv_, value);
}
void GgufWriter::add_bool(const std::string& k, bool value) {
  key(k, GgufValueType::boolean);
  put<std::uint8_t>(kv_, value ? 1 : 0);
}
void GgufWriter::add_string_array(const std::string& k, const std::vector<std::string>& values) {
  key(k, GgufValueType::array);
  put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufValueType::string));
  put<std::uint64_t>(kv_, values.size());
  for (const std::string& v : values) put_string(kv_, v);
}
void GgufWriter::add_i32_array(const std::string& k, const std::vector<std::int32_t>& values) {
  key(k, GgufValueType::array);
  put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufValueType::int32));
  put<std::uint64_t>(kv_, values.size());
  for (std::int32_t v : values) put(kv_, v);
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<std::int64_t> shape,
                            std::function<void(std::span<std::byte>)> fill) {
  for (const Tensor& t : tensors_)
    if (t.name == name) throw std::logic_error("gguf writer: tensor '" + name + "' added twice");
  if (shape.empty()) throw std::logic_error("gguf writer: tensor '" + name + "' has no dimensions");
  tensors_.push_back({name, type, std::move(shape), std::move(fill)});
}

void GgufWriter::write(const std::filesystem::path& path) const {
  std::string head;
  head += "GGUF";
  put<std::uint32_t>(head, kGgufVersion);
  put<std::uint64_t>(head, tensors_.size());
  put<std::uint64_t>(head, keys_.size());
  head += kv_;
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<std::uint32_t>(head, static_cast<std::uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put<std::uint64_t>(head, *d);
    put<std::uint32_t>(head, static_cast<std::uint32_t>(t.type));
    put<std::uint64_t>(head, offset);
    offset += padded(t.bytes());
  }
  head.append(padded(head.size()) - head.size(), '\0');

  AtomicFile out(path);
  out.write(head);
  std::vector<std::byte> buffer;
  for (const Tensor& t : tensors_) {
    buffer.assign(padded(t.bytes()), std::byte{0});
    t.fill(std::span<std::byte>(buffer.data(), t.bytes()));
    out.write(buffer.data(), buffer.size());
  }
  out.commit();
}

}  // namespace forja::io
