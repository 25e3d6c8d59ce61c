// safetensors checkpoints (docs/formats.md §2): a strict, memory-mapped reader for single files
// and sharded models, and a writer whose files the reference (Rust) reader accepts.
//
// File layout: u64 little-endian header length N, N bytes of UTF-8 JSON (an object mapping
// tensor names to {dtype, shape, data_offsets}, plus an optional "__metadata__" string map),
// then the packed row-major tensor bytes. The reader checks everything the reference reader
// checks (formats.md §2.1) and names the file, the tensor and the fix when something is wrong.
//
// forja computes with F32, F16 and BF16 tensors; U8 and I8 are read as raw bytes only (the
// packed codes and quantisation state of bitsandbytes checkpoints, model/bnb4.h), and
// TensorView::to_float refuses them. Any other valid safetensors dtype is rejected by name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forja::io {

enum class Dtype : std::uint8_t { F32, F16, BF16, U8, I8 };

std::size_t dtype_size(Dtype dtype);  // bytes per element: 4, 2, 2, 1, 1
const char* dtype_name(Dtype dtype);  // "F32", "F16", "BF16", "U8", "I8" as spelled in headers
bool is_float_dtype(Dtype dtype);     // F32, F16, BF16
// A shape as messages print it: "[4, 64]".
std::string shape_text(const std::vector<std::int64_t>& shape);

// The largest header the reference reader accepts (ST-RS MAX_HEADER_SIZE).
inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;  // row-major; [] for a scalar
  std::uint64_t begin = 0;          // byte offsets into the data buffer (after the header),
  std::uint64_t end = 0;            // end exclusive
  std::int64_t numel() const;
  std::uint64_t byte_size() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // sorted by data offset (file order)
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  std::uint64_t header_size = 0;                // N, the JSON length
  std::uint64_t data_size = 0;                  // bytes after the header
};

// Parses and validates a complete safetensors file image (header length, header, data size).
// `file_name` only names the file in error messages. Throws UserError on any defect. This is the
// function the fuzz target drives; it never reads outside `file`.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& file_name);

// A read-only view of one tensor's bytes inside a mapped file. Valid while the file is open.
class TensorView {
 public:
  TensorView(const TensorInfo* info, std::span<const std::byte> bytes)
      : info_(info), bytes_(bytes) {}
  const std::string& name() const { return info_->name; }
  Dtype dtype() const { return info_->dtype; }
  const std::vector<std::int64_t>& shape() const { return info_->shape; }
  std::int64_t numel() const { return info_->numel(); }
  std::span<const std::byte> bytes() const { return bytes_; }  // no alignment promised

  // Converts elements [first, first + out.size()) to float32 (bf16/f16 widened exactly). An
  // integer tensor (U8, I8: quantised data) throws UserError naming it.
  void to_float(std::span<float> out, std::int64_t first = 0) const;
  std::vector<float> to_float() const;

 private:
  const TensorInfo* info_;
  std::span<const std::byte> bytes_;
};

// One memory-mapped .safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);  // throws UserError
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const;
  const std::vector<TensorInfo>& tensors() const;  // file order
  const std::map<std::string, std::string>& metadata() const;
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  TensorView view(const TensorInfo& info) const;
  TensorView tensor(std::string_view name) const;  // throws UserError when absent

  // Tells the kernel this tensor's pages will not be read again soon (after quantising or
  // uploading it), so they leave the process's resident set instead of accumulating until the
  // whole checkpoint is resident. Reading the tensor again still works (it faults back in).
  void release(const TensorInfo& info) const;

 private:
  struct State;
  explicit SafetensorsFile(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A model's weights as one set of named tensors: a single model.safetensors, or the shards that
// model.safetensors.index.json names. Each shard's own header is authoritative for dtype, shape
// and offsets; the index must agree with the shards about which tensor lives where.
class SafetensorsCheckpoint {
 public:
  // `path` is a model directory (model.safetensors preferred, else the index), an index file, or
  // a single .safetensors file. Throws UserError naming the file and the fix.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);

  std::vector<std::string> names() const;               // sorted
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  TensorView tensor(std::string_view name) const;       // throws UserError when absent
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::uint64_t total_tensor_bytes() const;
  void release(std::string_view name) const;  // SafetensorsFile::release for that tensor
  // The file that holds the tensor (for error messages); the first file when absent.
  const std::filesystem::path& path_of(std::string_view name) const;

 private:
  struct Location {
    std::size_t file;
    const TensorInfo* info;
  };
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Location, std::less<>> by_name_;
};

// ---- Writing ----

// One tensor to write: its bytes come either from `data` or, to stream large tensors one at a
// time (merges), from `fill`, which is called with a buffer of exactly the tensor's byte size.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
  std::function<void(std::span<std::byte>)> fill;
  std::uint64_t byte_size() const;
};

// Builds the header JSON the reference writer would: "__metadata__" first ({"format":"pt"} is
// always included), tensors ordered by dtype size descending then name, offsets packed from 0,
// padded with spaces so its length is a multiple of 8. Reorders `tensors` into that order.
std::string build_safetensors_header(std::vector<TensorToWrite>& tensors,
                                     const std::map<std::string, std::string>& metadata);

// Writes one .safetensors file atomically (see io/atomic_file.h). Throws UserError on duplicate
// names, a data size that does not match the shape, or an I/O failure.
void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a model as Hugging Face does: model.safetensors when everything fits in one shard of
// `max_shard_bytes`, else model-00001-of-0000N.safetensors ... plus model.safetensors.index.json
// ({"metadata": {"total_size": ...}, "weight_map": {...}}). Tensors keep the given order across
// shards; a tensor larger than the limit gets a shard of its own. Every file is written
// atomically, the index last. Returns the files written.
inline constexpr std::uint64_t kDefaultMaxShardBytes = 5'000'000'000;
std::vector<std::filesystem::path> write_safetensors_sharded(
    const std::filesystem::path& dir, std::vector<TensorToWrite> tensors,
    std::uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace forja::io
