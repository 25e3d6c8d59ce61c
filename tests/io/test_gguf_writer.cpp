// io::GgufWriter against the independent reader (tests/io/gguf_reader.h): every value type,
// key order, tensor shapes written reversed (ne), offsets and data aligned to 32 with zero
// padding, f16/bf16 data, atomic output, and duplicate keys refused.
#include <gtest/gtest.h>

#include <cstring>

#include "io/file_helpers.h"
#include "io/float16.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"

namespace forja::io {
namespace {

TEST(GgufWriter, WritesWhatAnIndependentReaderReads) {
  const auto dir = test::scratch_dir();
  GgufWriter w;
  w.add_string("general.architecture", "qwen3");
  w.add_u32("qwen3.block_count", 2);
  w.add_i32("some.int", -7);
  w.add_f32("adapter.lora.alpha", 32.5f);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "Ġb", "<|im_end|>"});
  w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  w.add_tensor("t.f32", GgmlType::f32, {2, 3}, [&](std::span<std::byte> out) {
    ASSERT_EQ(out.size(), 24u);
    std::memcpy(out.data(), a.data(), 24);
  });
  w.add_tensor("t.f16", GgmlType::f16, {5}, [&](std::span<std::byte> out) {
    for (int i = 0; i < 5; ++i) {
      const std::uint16_t h = float_to_f16(0.5f * float(i));
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  });
  w.add_tensor("t.bf16", GgmlType::bf16, {3, 1}, [&](std::span<std::byte> out) {
    for (int i = 0; i < 3; ++i) {
      const std::uint16_t h = float_to_bf16(-1.0f - float(i));
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  });
  EXPECT_THROW(w.add_u32("qwen3.block_count", 3), std::logic_error);
  w.write(dir / "x.gguf");
  EXPECT_EQ(std::filesystem::file_size(dir / "x.gguf") % 32, 0u);

  const test::GgufFile f = test::read_gguf(dir / "x.gguf");
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.key_order, (std::vector<std::string>{"general.architecture", "qwen3.block_count", "some.int",
                                                   "adapter.lora.alpha", "tokenizer.ggml.add_bos_token",
                                                   "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}));
  EXPECT_EQ(f.kv.at("general.architecture").type, 8u);
  EXPECT_EQ(f.kv.at("general.architecture").s(), "qwen3");
  EXPECT_EQ(f.kv.at("qwen3.block_count").type, 4u);
  EXPECT_EQ(f.kv.at("qwen3.block_count").u(), 2u);
  EXPECT_EQ(f.kv.at("some.int").type, 5u);
  EXPECT_EQ(f.kv.at("adapter.lora.alpha").type, 6u);
  EXPECT_EQ(f.kv.at("adapter.lora.alpha").f(), 32.5);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.add_bos_token").type, 7u);
  EXPECT_TRUE(f.kv.at("tokenizer.ggml.add_bos_token").b());
  EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens").elem_type, 8u);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens").strings, (std::vector<std::string>{"a", "Ġb", "<|im_end|>"}));
  EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type").elem_type, 5u);
  EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type").ints, (std::vector<std::int64_t>{1, 1, 3}));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].ne, (std::vector<std::uint64_t>{3, 2}));  // [2, 3] row-major -> ne [3, 2]
  EXPECT_EQ(f.tensors[0].offset, 0u);
  EXPECT_EQ(f.tensors[1].offset, 32u);  // 24 bytes padded to 32
  EXPECT_EQ(f.tensors[2].ne, (std::vector<std::uint64_t>{1, 3}));
  EXPECT_EQ(f.tensors[2].type, 30u);
  EXPECT_EQ(f.floats("t.f32"), a);
  EXPECT_EQ(f.floats("t.f16"), (std::vector<float>{0, 0.5f, 1, 1.5f, 2}));
  EXPECT_EQ(f.floats("t.bf16"), (std::vector<float>{-1, -2, -3}));
}

}  // namespace
}  // namespace forja::io
