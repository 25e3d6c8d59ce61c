// GGUF files (llama.cpp's format, version 3; ggml docs/gguf.md, gguf-py gguf_writer.py and
// constants.py): what forja's `export --format gguf` writes for llama.cpp, ollama and LM Studio.
//
// Layout, little-endian throughout:
//   "GGUF" magic (0x46554747 as a u32), u32 version = 3, u64 tensor count, u64 key-value count
//   key-value pairs: gguf string key, u32 value type, value
//     (string = u64 byte length + UTF-8 bytes, no terminator; array = u32 element type, u64
//     count, elements)
//   tensor infos: gguf string name, u32 n_dims, u64 ne[n_dims] (ne[0] the fastest-varying
//     dimension: a row-major PyTorch [out, in] weight has ne = [in, out]), u32 ggml type, u64
//     offset of its data from the start of the data section (a multiple of the alignment)
//   zero padding to the alignment (general.alignment, default 32), then the tensor data, each
//     tensor zero-padded to the alignment.
// Key-value pairs and tensors are written in the order they were added, as GGUFWriter does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace forja::io {

// gguf-py GGUFValueType.
enum class GgufValueType : std::uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7,
  string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12
};

// ggml's tensor types that forja writes (ggml.h GGML_TYPE_*).
enum class GgmlType : std::uint32_t { f32 = 0, f16 = 1, bf16 = 30 };
std::size_t ggml_type_size(GgmlType t);  // 4, 2, 2
const char* ggml_type_name(GgmlType t);  // "f32", "f16", "bf16"

inline constexpr std::uint32_t kGgufVersion = 3;
inline constexpr std::uint64_t kGgufAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, std::uint32_t value);
  void add_i32(const std::string& key, std::int32_t value);
  void add_f32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  void add_string_array(const std::string& key, const std::vector<std::string>& values);
  void add_i32_array(const std::string& key, const std::vector<std::int32_t>& values);

  // A tensor of PyTorch shape `shape` (row-major, written as ne = reversed shape) whose bytes
  // `fill` produces when the file is written (exactly numel * type size bytes), so that large
  // tensors are made one at a time.
  void add_tensor(const std::string& name, GgmlType type, std::vector<std::int64_t> shape,
                  std::function<void(std::span<std::byte>)> fill);

  std::size_t tensor_count() const { return tensors_.size(); }

  // Writes the file atomically (io/atomic_file.h). Throws UserError on duplicate keys or tensor
  // names, a tensor `fill` problem, or an I/O failure.
  void write(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<std::int64_t> shape;
    std::function<void(std::span<std::byte>)> fill;
    std::uint64_t bytes() const;
  };
  void key(const std::string& k, GgufValueType type);
  std::string kv_;  // the serialised key-value section
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
};

}  // namespace forja::io
