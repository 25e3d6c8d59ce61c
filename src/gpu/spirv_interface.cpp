#include "gpu/spirv_interface.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

namespace forja::gpu {

namespace {

// The few opcodes, decorations and storage classes the interface needs (SPIR-V specification 3.x).
enum : uint32_t {
  kOpTypeInt = 21, kOpTypeFloat = 22, kOpTypeVector = 23, kOpTypeArray = 28, kOpTypeStruct = 30,
  kOpTypePointer = 32, kOpConstant = 43, kOpVariable = 59, kOpDecorate = 71, kOpMemberDecorate = 72,
  kDecArrayStride = 6, kDecBinding = 33, kDecDescriptorSet = 34, kDecOffset = 35,
  kStorageUniform = 2, kStoragePushConstant = 9, kStorageBuffer = 12,
};

struct Module {
  std::map<uint32_t, std::vector<uint32_t>> types;  // result id -> the type instruction's words
  std::map<uint32_t, uint32_t> constants;           // result id -> value (32-bit OpConstant)
  std::map<uint32_t, uint32_t> binding, set, stride;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> offset;  // (struct, member) -> Offset
  const std::string* what = nullptr;

  uint32_t size_of(uint32_t type) const {
    const auto it = types.find(type);
    if (it == types.end()) throw std::runtime_error(*what + ": push-constant block of an unknown type");
    const std::vector<uint32_t>& t = it->second;
    switch (t[0] & 0xFFFFu) {
      case kOpTypeInt:
      case kOpTypeFloat: return t[2] / 8;
      case kOpTypeVector: return size_of(t[2]) * t[3];
      case kOpTypeArray: {
        const auto s = stride.find(t[1]);
        const auto n = constants.find(t[3]);
        if (s == stride.end() || n == constants.end()) break;
        return s->second * n->second;
      }
      case kOpTypeStruct: {
        uint32_t end = 0;
        for (uint32_t m = 0; m + 2 < t.size(); ++m) {
          const auto o = offset.find({t[1], m});
          if (o == offset.end()) throw std::runtime_error(*what + ": push-constant member without an Offset");
          end = std::max(end, o->second + size_of(t[m + 2]));
        }
        return end;
      }
      default: break;
    }
    throw std::runtime_error(*what + ": push-constant block holds a type forja does not size");
  }
};

}  // namespace

SpirvInterface spirv_interface(const uint32_t* words, size_t word_count, const std::string& what) {
  if (word_count < 5 || words[0] != 0x07230203u) throw std::runtime_error(what + ": not a SPIR-V module");
  Module m;
  m.what = &what;
  std::vector<std::vector<uint32_t>> variables;  // (type, id, storage class)
  for (size_t i = 5; i < word_count;) {
    const uint32_t count = words[i] >> 16, op = words[i] & 0xFFFFu;
    if (count == 0 || i + count > word_count) throw std::runtime_error(what + ": truncated SPIR-V");
    const uint32_t* w = words + i;
    switch (op) {
      case kOpTypeInt: case kOpTypeFloat: case kOpTypeVector: case kOpTypeArray: case kOpTypeStruct:
      case kOpTypePointer:
        m.types[w[1]].assign(w, w + count);
        break;
      case kOpConstant:
        if (count == 4) m.constants[w[2]] = w[3];
        break;
      case kOpVariable:
        variables.push_back({w[1], w[2], w[3]});
        break;
      case kOpDecorate:
        if (count >= 4 && w[2] == kDecBinding) m.binding[w[1]] = w[3];
        if (count >= 4 && w[2] == kDecDescriptorSet) m.set[w[1]] = w[3];
        if (count >= 4 && w[2] == kDecArrayStride) m.stride[w[1]] = w[3];
        break;
      case kOpMemberDecorate:
        if (count >= 5 && w[3] == kDecOffset) m.offset[{w[1], w[2]}] = w[4];
        break;
      default: break;
    }
    i += count;
  }
  SpirvInterface out;
  for (const std::vector<uint32_t>& v : variables) {
    const uint32_t type = v[0], id = v[1], storage = v[2];
    if (storage == kStorageBuffer || storage == kStorageUniform) {
      const auto b = m.binding.find(id);
      const auto s = m.set.find(id);
      if (b != m.binding.end() && (s == m.set.end() || s->second == 0)) out.bindings = std::max(out.bindings, b->second + 1);
    } else if (storage == kStoragePushConstant) {
      const auto p = m.types.find(type);  // a pointer to the block's struct
      if (p == m.types.end() || p->second.size() < 4) throw std::runtime_error(what + ": push constant without a type");
      out.push_bytes = m.size_of(p->second[3]);
    }
  }
  return out;
}

}  // namespace forja::gpu
