// An independent GGUF v3 reader for the tests (written from ggml's docs/gguf.md, not from forja's
// writer): parses the whole file, checking the magic, the version, every key-value type, the
// tensor infos, that each tensor's offset is a multiple of the alignment, that the data section
// starts at the aligned end of the header and that the file ends where the last tensor (padded)
// does. Throws std::runtime_error on any defect.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace forja::test {

struct GgufValue {
  std::uint32_t type = 0;  // gguf value type; for arrays, 9 and elem_type holds the element type
  std::uint32_t elem_type = 0;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string> scalar;
  std::vector<std::string> strings;  // string arrays
  std::vector<std::int64_t> ints;    // integer arrays
  std::uint64_t u() const { return std::get<std::uint64_t>(scalar); }
  double f() const { return std::get<double>(scalar); }
  const std::string& s() const { return std::get<std::string>(scalar); }
  bool b() const { return std::get<bool>(scalar); }
};

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;  // ne[0] fastest
  std::uint32_t type = 0;         // 0 f32, 1 f16, 30 bf16
  std::uint64_t offset = 0;
  std::vector<std::byte> data;
};

struct GgufFile {
  std::uint32_t version = 0;
  std::vector<std::string> key_order;
  std::map<std::string, GgufValue> kv;
  std::vector<GgufTensorInfo> tensors;
  std::uint64_t alignment = 32;
  const GgufTensorInfo* tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::vector<float> floats(const std::string& name) const;  // f32/f16/bf16 widened
};

namespace gguf_detail {
struct Cursor {
  const std::vector<std::byte>& bytes;
  std::size_t pos = 0;
  void need(std::size_t n) const {
    if (pos + n > bytes.size()) throw std::runtime_error("gguf: truncated at byte " + std::to_string(pos));
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes.data() + pos), n);
    pos += n;
    return s;
  }
};

inline GgufValue read_value(Cursor& c, std::uint32_t type) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case 0: v.scalar = std::uint64_t(c.get<std::uint8_t>()); break;
    case 1: v.scalar = std::int64_t(c.get<std::int8_t>()); break;
    case 2: v.scalar = std::uint64_t(c.get<std::uint16_t>()); break;
    case 3: v.scalar = std::int64_t(c.get<std::int16_t>()); break;
    case 4: v.scalar = std::uint64_t(c.get<std::uint32_t>()); break;
    case 5: v.scalar = std::int64_t(c.get<std::int32_t>()); break;
    case 6: v.scalar = double(c.get<float>()); break;
    case 7: {
      const auto b = c.get<std::uint8_t>();
      if (b > 1) throw std::runtime_error("gguf: bool that is neither 0 nor 1");
      v.scalar = b == 1;
      break;
    }
    case 8: v.scalar = c.str(); break;
    case 10: v.scalar = c.get<std::uint64_t>(); break;
    case 11: v.scalar = c.get<std::int64_t>(); break;
    case 12: v.scalar = c.get<double>(); break;
    case 9: {
      v.elem_type = c.get<std::uint32_t>();
      const auto n = c.get<std::uint64_t>();
      for (std::uint64_t i = 0; i < n; ++i) {
        const GgufValue e = read_value(c, v.elem_type);
        if (v.elem_type == 8) v.strings.push_back(e.s());
        else if (std::holds_alternative<std::int64_t>(e.scalar)) v.ints.push_back(std::get<std::int64_t>(e.scalar));
        else if (std::holds_alternative<std::uint64_t>(e.scalar)) v.ints.push_back(std::int64_t(e.u()));
        else throw std::runtime_error("gguf: array of an element type the tests do not read");
      }
      break;
    }
    default: throw std::runtime_error("gguf: unknown value type " + std::to_string(type));
  }
  return v;
}

inline float half_to_float(std::uint16_t h, bool bf16) {
  if (bf16) {
    std::uint32_t u = std::uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const std::uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v = exp == 0 ? std::ldexp(float(man), -24) : exp == 31 ? (man ? NAN : INFINITY)
                                                               : std::ldexp(float(man | 1024), int(exp) - 25);
  return sign ? -v : v;
}
}  // namespace gguf_detail

inline std::vector<float> GgufFile::floats(const std::string& name) const {
  const GgufTensorInfo* t = tensor(name);
  if (!t) throw std::runtime_error("gguf: no tensor " + name);
  std::vector<float> out;
  const std::size_t es = t->type == 0 ? 4 : 2;
  for (std::size_t i = 0; i < t->data.size() / es; ++i) {
    if (t->type == 0) {
      float f;
      std::memcpy(&f, t->data.data() + 4 * i, 4);
      out.push_back(f);
    } else {
      std::uint16_t h;
      std::memcpy(&h, t->data.data() + 2 * i, 2);
      out.push_back(gguf_detail::half_to_float(h, t->type == 30));
    }
  }
  return out;
}

inline GgufFile read_gguf(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  gguf_detail::Cursor c{bytes};
  GgufFile f;
  if (c.get<std::uint32_t>() != 0x46554747u) throw std::runtime_error("gguf: bad magic");
  f.version = c.get<std::uint32_t>();
  const auto n_tensors = c.get<std::uint64_t>();
  const auto n_kv = c.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str();
    const auto type = c.get<std::uint32_t>();
    if (f.kv.count(key)) throw std::runtime_error("gguf: duplicate key " + key);
    f.kv[key] = gguf_detail::read_value(c, type);
    f.key_order.push_back(key);
  }
  if (f.kv.count("general.alignment")) f.alignment = f.kv["general.alignment"].u();
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.str();
    const auto dims = c.get<std::uint32_t>();
    for (std::uint32_t d = 0; d < dims; ++d) t.ne.push_back(c.get<std::uint64_t>());
    t.type = c.get<std::uint32_t>();
    t.offset = c.get<std::uint64_t>();
    if (t.type != 0 && t.type != 1 && t.type != 30) throw std::runtime_error("gguf: tensor type not f32/f16/bf16");
    if (t.offset % f.alignment != 0) throw std::runtime_error("gguf: tensor " + t.name + " offset not aligned");
    f.tensors.push_back(std::move(t));
  }
  const std::size_t data_start = (c.pos + f.alignment - 1) / f.alignment * f.alignment;
  for (std::size_t p = c.pos; p < data_start && p < bytes.size(); ++p)
    if (bytes[p] != std::byte{0}) throw std::runtime_error("gguf: non-zero padding before the data");
  std::uint64_t end = 0;
  for (auto& t : f.tensors) {
    std::uint64_t n = t.type == 0 ? 4 : 2;
    for (auto d : t.ne) n *= d;
    if (data_start + t.offset + n > bytes.size()) throw std::runtime_error("gguf: tensor " + t.name + " past the end");
    t.data.assign(bytes.begin() + std::ptrdiff_t(data_start + t.offset),
                  bytes.begin() + std::ptrdiff_t(data_start + t.offset + n));
    end = std::max<std::uint64_t>(end, t.offset + (n + f.alignment - 1) / f.alignment * f.alignment);
  }
  if (data_start + end != bytes.size())
    throw std::runtime_error("gguf: the file does not end at the last tensor's padded end");
  return f;
}

}  // namespace forja::test
