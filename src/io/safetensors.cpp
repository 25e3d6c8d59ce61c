// safetensors reading (mmap, strict validation as the reference Rust reader) and writing (the
// reference writer's ordering and padding). See io/safetensors.h and docs/formats.md §2.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/atomic_file.h"
#include "io/float16.h"
#include "io/json_file.h"
#include "util/error.h"

namespace forja::io {
namespace {

using json = nlohmann::json;

constexpr const char* kCorruptFix =
    "; the file is damaged or was not written by a safetensors writer: re-download or re-export it";

[[noreturn]] void corrupt(const std::string& file, const std::string& problem) {
  throw UserError(file + ": " + problem + kCorruptFix);
}

std::optional<Dtype> dtype_from_name(std::string_view name) {
  if (name == "F32") return Dtype::F32;
  if (name == "F16") return Dtype::F16;
  if (name == "BF16") return Dtype::BF16;
  if (name == "U8") return Dtype::U8;
  if (name == "I8") return Dtype::I8;
  return std::nullopt;
}

// Valid in safetensors (ST-RS Dtype, including the newer 8/6/4-bit float names) but not
// something forja computes with.
bool is_other_safetensors_dtype(std::string_view name) {
  static const std::set<std::string_view> other = {
      "BOOL", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "I16",
      "U16",  "I32",     "U32",     "F64",     "I64",     "U64",     "C64"};
  return other.count(name) > 0;
}

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

// JSON non-negative integer (what serde's usize accepts), else an error naming the field.
std::uint64_t as_count(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned())
    corrupt(file, what + " must be a non-negative integer, got " + v.dump());
  return v.get<std::uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const json& entry, const std::string& file) {
  const std::string where = "tensor '" + name + "'";
  if (!entry.is_object()) corrupt(file, where + " is not a JSON object but " + entry.dump());
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end())
    corrupt(file, where + " lacks one of the fields \"dtype\", \"shape\", \"data_offsets\"");
  if (!dtype_it->is_string()) corrupt(file, where + " has a dtype that is not a string");

  TensorInfo info;
  info.name = name;
  const std::string& dtype = dtype_it->get_ref<const std::string&>();
  if (auto d = dtype_from_name(dtype)) {
    info.dtype = *d;
  } else if (is_other_safetensors_dtype(dtype)) {
    throw UserError(file + ": " + where + " has dtype " + dtype +
                    ", which forja does not read (it reads F32, F16 and BF16); convert the "
                    "checkpoint to bf16 or fp32, e.g. load it in transformers and save_pretrained "
                    "with torch_dtype=torch.bfloat16");
  } else {
    corrupt(file, where + " has unknown dtype \"" + dtype + "\" (not a safetensors dtype)");
  }

  if (!shape_it->is_array()) corrupt(file, where + " has a shape that is not an array");
  for (const json& d : *shape_it) {
    std::uint64_t dim = as_count(d, file, where + " shape entry");
    if (dim > static_cast<std::uint64_t>(INT64_MAX))
      corrupt(file, where + " has a dimension too large");
    info.shape.push_back(static_cast<std::int64_t>(dim));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2)
    corrupt(file, where + " data_offsets must be an array [begin, end], got " + offsets_it->dump());
  info.begin = as_count((*offsets_it)[0], file, where + " data_offsets begin");
  info.end = as_count((*offsets_it)[1], file, where + " data_offsets end");
  return info;
}

// Bytes the shape needs, or nullopt on overflow.
std::optional<std::uint64_t> needed_bytes(const TensorInfo& t) {
  std::uint64_t n = dtype_size(t.dtype);
  for (std::int64_t d : t.shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

}  // namespace

std::size_t dtype_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::F32:
      return 4;
    case Dtype::F16:
    case Dtype::BF16:
      return 2;
    case Dtype::U8:
    case Dtype::I8:
      return 1;
  }
  return 0;
}

bool is_float_dtype(Dtype dtype) {
  return dtype == Dtype::F32 || dtype == Dtype::F16 || dtype == Dtype::BF16;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::F32:
      return "F32";
    case Dtype::F16:
      return "F16";
    case Dtype::BF16:
      return "BF16";
    case Dtype::U8:
      return "U8";
    case Dtype::I8:
      return "I8";
  }
  return "?";
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& file_name) {
  if (file.size() < 8)
    corrupt(file_name, "the file is " + std::to_string(file.size()) +
                           " bytes, too short for the 8-byte header length (truncated?)");
  SafetensorsHeader out;
  out.header_size = read_u64_le(file.data());
  if (out.header_size > kMaxHeaderSize)
    corrupt(file_name, "header length " + std::to_string(out.header_size) +
                           " exceeds the safetensors limit of 100000000 bytes");
  if (out.header_size > file.size() - 8)
    corrupt(file_name, "header length " + std::to_string(out.header_size) +
                           " runs past the end of the file (" + std::to_string(file.size()) +
                           " bytes): the file is truncated");
  out.data_size = file.size() - 8 - out.header_size;

  std::string_view text(reinterpret_cast<const char*>(file.data() + 8), out.header_size);
  // Depth 3 is the deepest a valid header goes: top object > tensor entry > shape array.
  json header = parse_json_strict(text, file_name, 3);
  if (!header.is_object()) corrupt(file_name, "the header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) corrupt(file_name, "__metadata__ is not a JSON object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          corrupt(file_name, "__metadata__ value of \"" + m.key() + "\" is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(parse_entry(it.key(), *it, file_name));
  }

  // The reference reader's checks: sorted by offsets, tensors must tile the data buffer exactly.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t position = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : out.tensors) {
    const std::string offsets = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.end < t.begin)
      corrupt(file_name, "tensor '" + t.name + "' has data_offsets " + offsets +
                             " that end before they begin");
    if (t.begin > position) {
      corrupt(file_name, previous ? "gap of " + std::to_string(t.begin - position) +
                                        " bytes between tensor '" + previous->name + "' (ends at " +
                                        std::to_string(position) + ") and tensor '" + t.name +
                                        "' (begins at " + std::to_string(t.begin) + ")"
                                  : "gap: the first tensor '" + t.name + "' begins at byte " +
                                        std::to_string(t.begin) + " of the data, not at 0");
    }
    if (t.begin < position)
      corrupt(file_name, "tensor '" + t.name + "' (data_offsets " + offsets +
                             ") overlaps tensor '" + previous->name + "' (ends at " +
                             std::to_string(position) + ")");
    auto need = needed_bytes(t);
    if (!need)
      corrupt(file_name,
              "tensor '" + t.name + "' has shape " + shape_text(t.shape) + " whose size overflows");
    if (*need != t.end - t.begin)
      corrupt(file_name, "tensor '" + t.name + "' has " + std::to_string(t.end - t.begin) +
                             " bytes (data_offsets " + offsets + ") but shape " +
                             shape_text(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
                             std::to_string(*need) + " bytes");
    position = t.end;
    previous = &t;
  }
  if (position > out.data_size)
    corrupt(file_name, "tensors need " + std::to_string(position) +
                           " data bytes but the file has " + std::to_string(out.data_size) +
                           " after the header: the file is truncated");
  if (position < out.data_size)
    corrupt(file_name, "the file has " + std::to_string(out.data_size - position) +
                           " bytes after the last tensor's end (data_offsets cover " +
                           std::to_string(position) + " of " + std::to_string(out.data_size) + ")");
  return out;
}

// ---- TensorView ----

void TensorView::to_float(std::span<float> out, std::int64_t first) const {
  const std::size_t count = out.size();
  if (first < 0 || static_cast<std::uint64_t>(first) + count > static_cast<std::uint64_t>(numel()))
    throw std::out_of_range("TensorView::to_float: range past the end of tensor " + name());
  if (!is_float_dtype(dtype()))
    throw UserError("tensor '" + name() + "' holds " + dtype_name(dtype()) +
                    " integers (quantised data), not floating-point weights; a bitsandbytes "
                    "8-bit checkpoint or a damaged one: use the model's 16-bit release or its "
                    "bnb-4bit (NF4) one");
  const std::size_t esize = dtype_size(dtype());
  const std::byte* src = bytes_.data() + static_cast<std::size_t>(first) * esize;
  switch (dtype()) {
    case Dtype::F32:
      std::memcpy(out.data(), src, count * 4);
      break;
    case Dtype::BF16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);  // the data has no alignment promise
        out[i] = bf16_to_float(h);
      }
      break;
    case Dtype::F16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_float(h);
      }
      break;
    case Dtype::U8:
    case Dtype::I8:
      break;  // refused above
  }
}

std::vector<float> TensorView::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(numel()));
  to_float(out);
  return out;
}

// ---- SafetensorsFile ----

struct SafetensorsFile::State {
  std::filesystem::path path;
  void* map = nullptr;
  std::size_t map_size = 0;
  SafetensorsHeader header;
  const std::byte* data = nullptr;  // start of the byte buffer
  std::map<std::string, std::size_t, std::less<>> index;

  ~State() {
    if (map) ::munmap(map, map_size);
  }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<State> state) : state_(std::move(state)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto state = std::make_unique<State>();
  state->path = path;
  const std::string name = path.string();
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw UserError(name + ": cannot open (" + std::strerror(err) + "); check the path");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(
        name + ": not a regular file; give the path of a .safetensors file or model directory");
  }
  state->map_size = static_cast<std::size_t>(st.st_size);
  if (state->map_size > 0) {
    void* p = ::mmap(nullptr, state->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw UserError(name + ": cannot memory-map the file (" + std::strerror(err) + ")");
    }
    state->map = p;
  }
  ::close(fd);  // the mapping keeps the file alive

  std::span<const std::byte> bytes(static_cast<const std::byte*>(state->map), state->map_size);
  state->header = parse_safetensors(bytes, name);
  state->data = bytes.data() + 8 + state->header.header_size;
  for (std::size_t i = 0; i < state->header.tensors.size(); ++i)
    state->index.emplace(state->header.tensors[i].name, i);
  return SafetensorsFile(std::move(state));
}

const std::filesystem::path& SafetensorsFile::path() const { return state_->path; }
const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return state_->header.tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return state_->header.metadata;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = state_->index.find(name);
  return it == state_->index.end() ? nullptr : &state_->header.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  return TensorView(&info, {state_->data + info.begin, static_cast<std::size_t>(info.byte_size())});
}

TensorView SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info)
    throw UserError(path().string() + ": has no tensor '" + std::string(name) +
                    "'; the checkpoint does not match the model's config.json");
  return view(*info);
}

void SafetensorsFile::release(const TensorInfo& info) const {
  // Only whole pages inside the tensor: the neighbours' bytes may still be wanted.
  const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(state_->data + info.begin);
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(state_->data + info.end);
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  // The mapping is private and never written, so dropping pages loses nothing; failure is harmless.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// ---- SafetensorsCheckpoint ----

namespace {

std::string index_problem(const std::filesystem::path& index, const std::string& problem) {
  return index.string() + ": " + problem;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  std::error_code ec;
  fs::path index_path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors", ec)) {
      ck.files_.push_back(SafetensorsFile::open(path / "model.safetensors"));
    } else if (fs::exists(path / "model.safetensors.index.json", ec)) {
      index_path = path / "model.safetensors.index.json";
    } else {
      throw UserError(path.string() +
                      ": has neither model.safetensors nor "
                      "model.safetensors.index.json; point at a Hugging Face model directory "
                      "with safetensors weights (convert .bin weights with transformers first)");
    }
  } else if (path.filename().string().ends_with(".index.json")) {
    index_path = path;
  } else {
    ck.files_.push_back(SafetensorsFile::open(path));
  }

  if (!index_path.empty()) {
    json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw UserError(index_problem(index_path,
                                    "has no \"weight_map\" object; the index is "
                                    "damaged: re-download model.safetensors.index.json"));
    // Group the tensors by shard, opening each shard once, in name order for determinism.
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string())
        throw UserError(index_problem(
            index_path, "weight_map entry for '" + it.key() + "' is not a file name string"));
      const std::string& shard = it->get_ref<const std::string&>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw UserError(index_problem(index_path, "weight_map names '" + shard + "' for tensor '" +
                                                      it.key() +
                                                      "', which is not a plain file name "
                                                      "in the model directory"));
      by_shard[shard].push_back(it.key());
    }
    if (by_shard.empty())
      throw UserError(index_problem(index_path, "weight_map is empty; the index is damaged"));
    const fs::path dir = index_path.parent_path();
    for (const auto& [shard, names] : by_shard) {
      const fs::path shard_path = dir / shard;
      if (!fs::exists(shard_path, ec))
        throw UserError(index_problem(
            index_path, "names shard '" + shard + "' (for tensor '" + names.front() + "') but " +
                            shard_path.string() + " does not exist; download the missing shard"));
      ck.files_.push_back(SafetensorsFile::open(shard_path));
      const SafetensorsFile& file = ck.files_.back();
      for (const std::string& name : names)
        if (!file.find(name))
          throw UserError(index_problem(index_path, "says tensor '" + name + "' is in '" + shard +
                                                        "' but that shard has no such tensor; the "
                                                        "index and the shards do not match: "
                                                        "re-download the model"));
    }
  }

  for (std::size_t f = 0; f < ck.files_.size(); ++f) {
    for (const TensorInfo& t : ck.files_[f].tensors()) {
      auto [it, inserted] = ck.by_name_.emplace(t.name, Location{f, &t});
      if (!inserted)
        throw UserError(ck.files_[f].path().string() + ": tensor '" + t.name +
                        "' also appears in " + ck.files_[it->second.file].path().string() +
                        "; a checkpoint must hold each tensor once: re-download the model");
    }
  }
  return ck;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, loc] : by_name_) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.info;
}

TensorView SafetensorsCheckpoint::tensor(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::string where = files_.size() == 1 ? files_[0].path().string()
                        : files_.empty()   ? std::string("checkpoint")
                                           : files_[0].path().parent_path().string();
    throw UserError(where + ": has no tensor '" + std::string(name) +
                    "'; the checkpoint does not match the model's config.json");
  }
  return files_[it->second.file].view(*it->second.info);
}

void SafetensorsCheckpoint::release(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) files_[it->second.file].release(*it->second.info);
}

const std::filesystem::path& SafetensorsCheckpoint::path_of(std::string_view name) const {
  static const std::filesystem::path none;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return files_[it->second.file].path();
  return files_.empty() ? none : files_[0].path();
}

std::uint64_t SafetensorsCheckpoint::total_tensor_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [name, loc] : by_name_) total += loc.info->byte_size();
  return total;
}

// ---- Writing ----

std::uint64_t TensorToWrite::byte_size() const {
  std::uint64_t n = dtype_size(dtype);
  for (std::int64_t d : shape) {
    if (d < 0)
      throw UserError("safetensors writer: tensor '" + name + "' has a negative dimension");
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

std::string build_safetensors_header(std::vector<TensorToWrite>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  // The reference writer's order: larger element size first, then by name, so every tensor is
  // aligned to its element size without padding between tensors.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const TensorToWrite& a, const TensorToWrite& b) {
                     std::size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
                     return sa != sb ? sa > sb : a.name < b.name;
                   });
  for (std::size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].name == tensors[i - 1].name)
      throw UserError("safetensors writer: tensor name '" + tensors[i].name + "' given twice");

  auto quote = [](const std::string& s) {
    try {
      return json(s).dump();
    } catch (const json::type_error&) {
      throw UserError("safetensors writer: name or metadata \"" + s + "\" is not valid UTF-8");
    }
  };
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");  // transformers' loaders expect it (formats.md §2.1)
  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : meta) {
    h += (first ? "" : ",") + quote(k) + ":" + quote(v);
    first = false;
  }
  h += "}";
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::uint64_t size = t.byte_size();
    h += "," + quote(t.name) + ":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + size) +
         "]}";
    offset += size;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const TensorToWrite& t : tensors)
    if (!t.fill && t.data.size() != t.byte_size())
      throw UserError(path.string() + ": tensor '" + t.name + "' has " +
                      std::to_string(t.data.size()) + " bytes of data but shape " +
                      shape_text(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
                      std::to_string(t.byte_size()) + " (a bug in the caller)");
  const std::string header = build_safetensors_header(tensors, metadata);
  AtomicFile out(path);
  unsigned char length[8];
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(length, 8);
  out.write(header);
  std::vector<std::byte> buffer;
  for (const TensorToWrite& t : tensors) {
    if (t.fill) {
      buffer.assign(t.byte_size(), std::byte{0});
      t.fill(buffer);
      out.write(buffer.data(), buffer.size());
    } else {
      out.write(t.data.data(), t.data.size());
    }
  }
  out.commit();
}

std::vector<std::filesystem::path> write_safetensors_sharded(const std::filesystem::path& dir,
                                                             std::vector<TensorToWrite> tensors,
                                                             std::uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir.string() + ": cannot create the directory (" + ec.message() + ")");

  // Greedy split in the given order, as huggingface_hub's split_torch_state_dict_into_shards.
  std::vector<std::vector<TensorToWrite>> shards(1);
  std::uint64_t shard_bytes = 0, total = 0;
  for (TensorToWrite& t : tensors) {
    const std::uint64_t size = t.byte_size();
    if (!shards.back().empty() && shard_bytes + size > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += size;
    total += size;
    shards.back().push_back(std::move(t));
  }
  if (shards.size() == 1) {
    write_safetensors(dir / "model.safetensors", std::move(shards[0]));
    return {dir / "model.safetensors"};
  }
  std::vector<fs::path> written;
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
    write_safetensors(dir / name, std::move(shards[i]));
    written.push_back(dir / name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  written.push_back(dir / "model.safetensors.index.json");
  return written;
}

}  // namespace forja::io
