// safetensors: write-then-read round trips, the reference writer's layout, sharding, and every
// malformed file the reader must reject with a message naming the file and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/file_helpers.h"
#include "io/float16.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace forja::io {
namespace {

using test::safetensors_bytes;
using test::scratch_dir;
using test::user_error_of;
using test::write_bytes;

std::span<const std::byte> as_bytes_of(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}
std::span<const std::byte> as_bytes_of(const std::vector<std::uint16_t>& v) {
  return std::as_bytes(std::span(v));
}

std::string four_floats() {
  float v[4] = {1, 2, 3, 4};
  return std::string(reinterpret_cast<const char*>(v), 16);
}

TEST(SafetensorsFloat16, KnownValues) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
}

TEST(SafetensorsFloat16, F16RoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(SafetensorsFloat16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // halfway 1.0078125..1.015625 -> even (0x82)
  EXPECT_EQ(float_to_bf16(std::nextafter(1.00390625f, 2.0f)), 0x3f81);  // above halfway: up
  // f16: 1 + 2^-11 is halfway between 1.0 and 1 + 2^-10.
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)),
            0x0000);  // halfway to the smallest subnormal: even
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(SafetensorsWrite, HeaderMatchesReferenceLayout) {
  std::vector<float> data(6, 0.0f);
  std::vector<TensorToWrite> tensors = {{"attn.0", Dtype::F32, {1, 2, 3}, as_bytes_of(data), {}}};
  std::string header = build_safetensors_header(tensors, {});
  std::string body =
      R"({"__metadata__":{"format":"pt"},"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_GE(header.size(), body.size());
  EXPECT_EQ(header.substr(0, body.size()), body);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.size() - body.size(), (8 - body.size() % 8) % 8);
  EXPECT_EQ(header.find_first_not_of(' ', body.size()), std::string::npos);
}

TEST(SafetensorsWrite, OrdersByAlignmentThenName) {
  std::vector<float> f(2);
  std::vector<std::uint16_t> h(3);
  std::vector<TensorToWrite> tensors = {{"b16", Dtype::BF16, {3}, as_bytes_of(h), {}},
                                        {"z32", Dtype::F32, {2}, as_bytes_of(f), {}},
                                        {"a16", Dtype::F16, {3}, as_bytes_of(h), {}},
                                        {"a32", Dtype::F32, {2}, as_bytes_of(f), {}}};
  build_safetensors_header(tensors, {});
  std::vector<std::string> order;
  for (auto& t : tensors) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"a32", "z32", "a16", "b16"}));
}

TEST(SafetensorsWrite, RoundTripAllDtypes) {
  auto dir = scratch_dir();
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 1e-20f, -0.0f, 7.0f};
  std::vector<std::uint16_t> bf16, f16;
  std::vector<float> src16 = {0.5f, -1.0f, 3.140625f, 65504.0f, 1e-7f};
  for (float v : src16) {
    bf16.push_back(float_to_bf16(v));
    f16.push_back(float_to_f16(v));
  }
  std::vector<float> scalar = {42.0f};
  write_safetensors(dir / "t.safetensors",
                    {{"w.f32", Dtype::F32, {2, 3}, as_bytes_of(f32), {}},
                     {"w.bf16", Dtype::BF16, {5}, as_bytes_of(bf16), {}},
                     {"w.f16", Dtype::F16, {5, 1}, as_bytes_of(f16), {}},
                     {"scalar", Dtype::F32, {}, as_bytes_of(scalar), {}},
                     {"empty", Dtype::BF16, {0, 4}, {}, {}}},
                    {{"note", "hello"}});

  auto file = SafetensorsFile::open(dir / "t.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "hello");
  ASSERT_EQ(file.tensors().size(), 5u);
  for (const TensorInfo& t : file.tensors()) EXPECT_EQ(t.begin % dtype_size(t.dtype), 0u) << t.name;

  auto a = file.tensor("w.f32");
  EXPECT_EQ(a.dtype(), Dtype::F32);
  EXPECT_EQ(a.shape(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.to_float(), f32);
  auto b = file.tensor("w.bf16").to_float();
  auto c = file.tensor("w.f16").to_float();
  for (std::size_t i = 0; i < src16.size(); ++i) {
    EXPECT_EQ(b[i], bf16_to_float(bf16[i]));
    EXPECT_EQ(c[i], f16_to_float(f16[i]));
    EXPECT_NEAR(b[i], src16[i], std::fabs(src16[i]) / 128);
  }
  EXPECT_EQ(file.tensor("scalar").shape().size(), 0u);
  EXPECT_EQ(file.tensor("scalar").to_float(), scalar);
  EXPECT_EQ(file.tensor("empty").numel(), 0);
  EXPECT_EQ(file.find("nope"), nullptr);
  std::string msg = user_error_of([&] { file.tensor("nope"); });
  EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;

  // Partial conversion starting mid-tensor.
  std::vector<float> part(2);
  a.to_float(part, 3);
  EXPECT_EQ(part[0], f32[3]);
  EXPECT_EQ(part[1], f32[4]);
}

TEST(SafetensorsWrite, FillCallbackStreamsBytes) {
  auto dir = scratch_dir();
  TensorToWrite t{"gen", Dtype::F32, {4, 4}, {}, [](std::span<std::byte> out) {
                    ASSERT_EQ(out.size(), 64u);
                    for (int i = 0; i < 16; ++i) {
                      float v = static_cast<float>(i) * 0.5f;
                      std::memcpy(out.data() + 4 * i, &v, 4);
                    }
                  }};
  write_safetensors(dir / "g.safetensors", {t});
  auto v = SafetensorsFile::open(dir / "g.safetensors").tensor("gen").to_float();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(v[i], static_cast<float>(i) * 0.5f);
}

TEST(SafetensorsWrite, RejectsDuplicateAndWrongSizedTensors) {
  auto dir = scratch_dir();
  std::vector<float> d(4);
  std::string msg = user_error_of([&] {
    write_safetensors(dir / "x.safetensors", {{"a", Dtype::F32, {4}, as_bytes_of(d), {}},
                                              {"a", Dtype::F32, {4}, as_bytes_of(d), {}}});
  });
  EXPECT_NE(msg.find("'a' given twice"), std::string::npos) << msg;
  msg = user_error_of([&] {
    write_safetensors(dir / "x.safetensors", {{"a", Dtype::F32, {5}, as_bytes_of(d), {}}});
  });
  EXPECT_NE(msg.find("needs 20"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
}

TEST(SafetensorsWrite, AtomicFileLeavesPreviousFileOnAbort) {
  auto dir = scratch_dir();
  write_file_atomic(dir / "f.txt", "old");
  {
    AtomicFile out(dir / "f.txt");
    out.write("new contents");
    // no commit: simulates a crash or an exception mid-write
  }
  std::ifstream in(dir / "f.txt");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(s, "old");
  int files = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1) << "the temporary file was not removed";
  write_file_atomic(dir / "f.txt", "new");
  std::ifstream in2(dir / "f.txt");
  std::string s2((std::istreambuf_iterator<char>(in2)), {});
  EXPECT_EQ(s2, "new");
  std::string msg = user_error_of([&] { AtomicFile bad(dir / "missing-dir" / "f.txt"); });
  EXPECT_NE(msg.find("missing-dir"), std::string::npos) << msg;
}

TEST(SafetensorsWrite, ShardedRoundTrip) {
  auto dir = scratch_dir();
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 5; ++i) data.push_back(std::vector<float>(10 + i, static_cast<float>(i)));
  for (int i = 0; i < 5; ++i)
    tensors.push_back(
        {"layer." + std::to_string(i), Dtype::F32, {10 + i}, as_bytes_of(data[i]), {}});
  // 100-byte shards of 40..56-byte tensors, greedy: [40, 44] [48, 52] [56], then the index.
  auto files = write_safetensors_sharded(dir, tensors, 100);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].filename(), "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[2].filename(), "model-00003-of-00003.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));

  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), 4u * (10 + 11 + 12 + 13 + 14));
  EXPECT_EQ(index["weight_map"]["layer.0"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.2"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.4"], "model-00003-of-00003.safetensors");

  auto ck = SafetensorsCheckpoint::open(dir);
  EXPECT_EQ(ck.files().size(), 3u);
  EXPECT_EQ(ck.names().size(), 5u);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(ck.tensor("layer." + std::to_string(i)).to_float(), data[i]);
  EXPECT_EQ(ck.total_tensor_bytes(), 4u * (10 + 11 + 12 + 13 + 14));
  // The index file itself is also accepted as the path.
  EXPECT_EQ(SafetensorsCheckpoint::open(dir / "model.safetensors.index.json").names().size(), 5u);
}

TEST(SafetensorsWrite, SmallModelWritesOneFileWithoutIndex) {
  auto dir = scratch_dir();
  std::vector<float> d(3, 1.0f);
  auto files = write_safetensors_sharded(dir, {{"w", Dtype::F32, {3}, as_bytes_of(d), {}}});
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename(), "model.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(SafetensorsCheckpoint::open(dir).tensor("w").to_float(), d);
}

// ---- malformed files ----

// Writes `bytes` as bad.safetensors, opens it, returns the error message.
std::string open_error(const std::string& bytes) {
  auto dir = scratch_dir();
  write_bytes(dir / "bad.safetensors", bytes);
  std::string msg = user_error_of([&] { SafetensorsFile::open(dir / "bad.safetensors"); });
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos)
      << "message does not name the file: " << msg;
  return msg;
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

const std::string kOne = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";

TEST(SafetensorsMalformed, ValidBaselineOpens) {
  auto dir = scratch_dir();
  write_bytes(dir / "ok.safetensors", safetensors_bytes(kOne, four_floats()));
  EXPECT_EQ(SafetensorsFile::open(dir / "ok.safetensors").tensor("a").to_float(),
            (std::vector<float>{1, 2, 3, 4}));
}

TEST(SafetensorsMalformed, TruncatedData) {
  std::string msg = open_error(safetensors_bytes(kOne, four_floats().substr(0, 10)));
  EXPECT_HAS(msg, "truncated");
}

TEST(SafetensorsMalformed, TooShortForLength) {
  std::string msg = open_error("abc");
  EXPECT_HAS(msg, "too short");
}

TEST(SafetensorsMalformed, EmptyFile) { EXPECT_HAS(open_error(""), "too short"); }

TEST(SafetensorsMalformed, HeaderLengthPastEnd) {
  std::string msg = open_error(safetensors_bytes(kOne, four_floats(), 5000));
  EXPECT_HAS(msg, "header length 5000 runs past the end");
}

TEST(SafetensorsMalformed, HeaderLengthOverLimit) {
  std::string msg = open_error(safetensors_bytes(kOne, four_floats(), 100'000'001));
  EXPECT_HAS(msg, "exceeds the safetensors limit");
}

TEST(SafetensorsMalformed, GapBetweenTensors) {
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string msg = open_error(safetensors_bytes(h, four_floats()));
  EXPECT_HAS(msg, "gap of 4 bytes between tensor 'a'");
  EXPECT_HAS(msg, "tensor 'b'");
}

TEST(SafetensorsMalformed, GapAtStart) {
  std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())),
             "begins at byte 4 of the data, not at 0");
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string msg = open_error(safetensors_bytes(h, four_floats()));
  EXPECT_HAS(msg, "tensor 'b'");
  EXPECT_HAS(msg, "overlaps tensor 'a'");
}

TEST(SafetensorsMalformed, WrongByteCount) {
  std::string h = R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})";
  std::string msg = open_error(safetensors_bytes(h, four_floats()));
  EXPECT_HAS(msg, "tensor 'a' has 16 bytes");
  EXPECT_HAS(msg, "of BF16 needs 8 bytes");
}

TEST(SafetensorsMalformed, ExtraBytesAfterLastTensor) {
  EXPECT_HAS(open_error(safetensors_bytes(kOne, four_floats() + "xyz")),
             "3 bytes after the last tensor");
}

TEST(SafetensorsMalformed, UnknownDtype) {
  std::string h = R"({"a":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "unknown dtype \"F33\"");
}

TEST(SafetensorsMalformed, UnsupportedDtypeNamed) {
  std::string h = R"({"a":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})";
  std::string msg = open_error(safetensors_bytes(h, four_floats()));
  EXPECT_HAS(msg, "dtype I32");
  EXPECT_HAS(msg, "F32, F16 and BF16");
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  EXPECT_HAS(open_error(safetensors_bytes("[1,2,3] ", four_floats())), "not a JSON object");
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  EXPECT_HAS(open_error(safetensors_bytes("{\"a\":", four_floats())), "not valid JSON");
}

TEST(SafetensorsMalformed, HeaderNotUtf8) {
  std::string h = "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "not valid JSON");
}

TEST(SafetensorsMalformed, NumberOverflowInHeader) {
  // Found by the fuzzer: nlohmann reports this as out_of_range, not parse_error.
  std::string h = R"({"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "not valid JSON");
}

TEST(SafetensorsMalformed, DuplicateTensorNames) {
  std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "duplicate key \"a\"");
}

TEST(SafetensorsMalformed, DuplicateFieldInEntry) {
  std::string h = R"({"a":{"dtype":"F32","dtype":"F16","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "duplicate key \"dtype\"");
}

TEST(SafetensorsMalformed, MissingField) {
  std::string h = R"({"a":{"dtype":"F32","data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "lacks one of the fields");
}

TEST(SafetensorsMalformed, NegativeOrFractionalShape) {
  std::string h = R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "non-negative integer");
  h = R"({"a":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "non-negative integer");
}

TEST(SafetensorsMalformed, OffsetsEndBeforeBegin) {
  std::string h = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "end before they begin");
}

TEST(SafetensorsMalformed, ShapeOverflow) {
  std::string h = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "overflows");
}

TEST(SafetensorsMalformed, MetadataMustBeStrings) {
  std::string h =
      R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(safetensors_bytes(h, four_floats())), "__metadata__ value of \"format\"");
}

TEST(SafetensorsMalformed, DeepNestingRejected) {
  std::string h = "{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
  EXPECT_HAS(open_error(safetensors_bytes(h, "")), "nested deeper");
}

// ---- sharded checkpoints ----

void write_two_shards(const std::filesystem::path& dir) {
  std::vector<float> d(4, 1.0f);
  write_safetensors(dir / "s1.safetensors", {{"a", Dtype::F32, {4}, as_bytes_of(d), {}}});
  write_safetensors(dir / "s2.safetensors", {{"b", Dtype::F32, {4}, as_bytes_of(d), {}}});
}

TEST(SafetensorsSharded, IndexNamingMissingFile) {
  auto dir = scratch_dir();
  write_two_shards(dir);
  write_bytes(
      dir / "model.safetensors.index.json",
      R"({"metadata":{"total_size":32},"weight_map":{"a":"s1.safetensors","b":"s3.safetensors"}})");
  std::string msg = user_error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_HAS(msg, "model.safetensors.index.json");
  EXPECT_HAS(msg, "names shard 's3.safetensors'");
  EXPECT_HAS(msg, "does not exist");
}

TEST(SafetensorsSharded, IndexNamingMissingTensor) {
  auto dir = scratch_dir();
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})");
  std::string msg = user_error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_HAS(msg, "model.safetensors.index.json");
  EXPECT_HAS(msg, "tensor 'c' is in 's2.safetensors' but that shard has no such tensor");
}

TEST(SafetensorsSharded, IndexWithoutWeightMap) {
  auto dir = scratch_dir();
  write_bytes(dir / "model.safetensors.index.json", R"({"metadata":{}})");
  std::string msg = user_error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_HAS(msg, "model.safetensors.index.json");
  EXPECT_HAS(msg, "weight_map");
}

TEST(SafetensorsSharded, IndexPathTraversalRejected) {
  auto dir = scratch_dir();
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  EXPECT_HAS(user_error_of([&] { SafetensorsCheckpoint::open(dir); }), "not a plain file name");
}

TEST(SafetensorsSharded, TensorInTwoShards) {
  auto dir = scratch_dir();
  std::vector<float> d(4, 1.0f);
  write_safetensors(dir / "s1.safetensors", {{"a", Dtype::F32, {4}, as_bytes_of(d), {}}});
  write_safetensors(dir / "s2.safetensors", {{"a", Dtype::F32, {4}, as_bytes_of(d), {}},
                                             {"b", Dtype::F32, {4}, as_bytes_of(d), {}}});
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  EXPECT_HAS(user_error_of([&] { SafetensorsCheckpoint::open(dir); }),
             "tensor 'a' also appears in");
}

TEST(SafetensorsSharded, EmptyDirectory) {
  auto dir = scratch_dir();
  std::string msg = user_error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_HAS(msg, dir.string());
  EXPECT_HAS(msg, "neither model.safetensors nor");
}

TEST(SafetensorsSharded, PrefersSingleFileOverIndex) {
  auto dir = scratch_dir();
  std::vector<float> d(4, 2.0f);
  write_safetensors(dir / "model.safetensors", {{"w", Dtype::F32, {4}, as_bytes_of(d), {}}});
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"x":"gone.safetensors"}})");
  EXPECT_EQ(SafetensorsCheckpoint::open(dir).tensor("w").to_float(), d);
}

}  // namespace
}  // namespace forja::io

namespace forja::io {
namespace {

TEST(SafetensorsWrite, ReleaseKeepsDataReadable) {
  auto dir = test::scratch_dir();
  std::vector<float> big(300000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  std::vector<float> small = {1, 2, 3};
  write_safetensors(dir / "r.safetensors",
                    {{"big", Dtype::F32, {300000}, std::as_bytes(std::span(big)), {}},
                     {"small", Dtype::F32, {3}, std::as_bytes(std::span(small)), {}}});
  auto ck = SafetensorsCheckpoint::open(dir / "r.safetensors");
  EXPECT_EQ(ck.tensor("big").to_float(), big);
  ck.release("big");
  ck.release("no-such-tensor");                     // harmless
  EXPECT_EQ(ck.tensor("small").to_float(), small);  // a neighbour is untouched
  EXPECT_EQ(ck.tensor("big").to_float(), big);      // and the released one faults back in
}

}  // namespace
}  // namespace forja::io
