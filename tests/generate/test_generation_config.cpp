// generation_config.json: the fields forja honours, absent files, and bad ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/generation_config.h"
#include "util/error.h"

namespace forja::test {
namespace {

namespace fs = std::filesystem;

class GenerationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("forja_gencfg_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "generation_config.json") << text; }
  fs::path dir_;
};

// Found by fuzz/fuzz_generation_config.cpp: a number beyond double's range is nlohmann's
// out_of_range, which escaped as a crash.
TEST_F(GenerationConfigTest, NumberOverflowIsAnInvalidJsonError) {
  write("6333336666666e666663333");
  try {
    model::load_generation_config(dir_);
    ADD_FAILURE() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  write(R"({"temperature": 1e400})");
  EXPECT_THROW(model::load_generation_config(dir_), UserError);
}

TEST_F(GenerationConfigTest, AbsentMeansGreedy) {
  const auto g = model::load_generation_config(dir_);
  EXPECT_TRUE(g.path.empty());
  EXPECT_FALSE(g.do_sample);
  EXPECT_FALSE(g.temperature);
  EXPECT_TRUE(g.eos_token_ids.empty());
}

TEST_F(GenerationConfigTest, ReadsQwen3Defaults) {
  write(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})");
  const auto g = model::load_generation_config(dir_);
  EXPECT_FALSE(g.path.empty());
  EXPECT_TRUE(g.do_sample);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_EQ(*g.top_k, 20);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.95);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  write(R"({"eos_token_id": 2, "temperature": null})");
  const auto one = model::load_generation_config(dir_);
  EXPECT_EQ(one.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_FALSE(one.temperature);
}

TEST_F(GenerationConfigTest, BadFilesAreUserErrors) {
  write("{not json");
  EXPECT_THROW(model::load_generation_config(dir_), UserError);
  write(R"({"top_k": "twenty"})");
  EXPECT_THROW(model::load_generation_config(dir_), UserError);
  write(R"({"eos_token_id": [1, "x"]})");
  EXPECT_THROW(model::load_generation_config(dir_), UserError);
}

// Found by fuzz/fuzz_generation_config.cpp: a negative top_k passed the loader and reached the
// sampler, whose error names a --top-k flag the user never gave. Every sampling field out of the
// sampler's range is the file's error now; 0 (off, greedy) stays valid.
TEST_F(GenerationConfigTest, OutOfRangeSamplingFieldsNameTheFile) {
  for (const char* text : {R"({"top_k": -20})", R"({"temperature": -0.5})", R"({"top_p": 0})", R"({"top_p": 1.5})"}) {
    write(text);
    try {
      model::load_generation_config(dir_);
      ADD_FAILURE() << "accepted " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
    }
  }
  write(R"({"top_k": 0, "temperature": 0, "top_p": 1})");
  const auto g = model::load_generation_config(dir_);
  EXPECT_EQ(*g.top_k, 0);
  EXPECT_EQ(*g.temperature, 0.0);
  EXPECT_EQ(*g.top_p, 1.0);
}

}  // namespace
}  // namespace forja::test
