// Tokenizer tests: ids and decoded text identical to Hugging Face tokenizers on the real Qwen3 and
// Llama 3 tokenizer.json over tests/fixtures/tokenizer/corpus.json, plus the BPE rules on small
// hand-made tokenizers (merge order, ties, both merge encodings, ignore_merges, errors).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/utf8.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace forja::data {
namespace {

using nlohmann::json;
using test::fixture_dir;
using test::read_text;
using test::real_tokenizer;

std::string show_ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// The byte-level alphabet's symbol of byte b (GPT-2 bytes_to_unicode), as UTF-8.
std::string byte_symbol(uint8_t b) {
  int next = 0x100;
  for (int x = 0; x < 256; ++x) {
    const bool direct = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    const char32_t cp = direct ? char32_t(x) : char32_t(next++);
    if (x == b) {
      std::string s;
      utf8_append(s, cp);
      return s;
    }
  }
  return {};
}

void expect_matches_fixture(const std::string& name) {
  const Tokenizer& tok = real_tokenizer(name);
  const json fx = json::parse(read_text(fixture_dir() / (name + ".json")));
  const auto& cases = fx.at("cases");
  ASSERT_GT(cases.size(), 100u);
  int id_fail = 0, decode_fail = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got != want && ++id_fail <= 10)
      ADD_FAILURE() << name << " ids differ for " << json(text).dump() << "\n  want "
                    << show_ids(want) << "\n  got  " << show_ids(got);
    const std::string decoded = tok.decode(want);
    if (decoded != c.at("decoded").get<std::string>() && ++decode_fail <= 10)
      ADD_FAILURE() << name << " decode differs for " << json(text).dump() << ": got "
                    << json(decoded).dump();
  }
  EXPECT_EQ(id_fail, 0) << "of " << cases.size();
  EXPECT_EQ(decode_fail, 0) << "of " << cases.size();
}

TEST(TokenizerFixture, Qwen3IdsAndDecodeMatchHuggingFace) { expect_matches_fixture("qwen3"); }
TEST(TokenizerFixture, Llama3IdsAndDecodeMatchHuggingFace) { expect_matches_fixture("llama3"); }

TEST(TokenizerFixture, Qwen3SpecialTokensAndConfig) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  EXPECT_EQ(tok.vocab_size(), 151669);  // formats.md 5.2: ids 0..151668 used
  EXPECT_EQ(tok.eos_id(), 151645);      // <|im_end|>
  EXPECT_EQ(tok.pad_id(), 151643);      // <|endoftext|>
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.token_id("<think>"), 151667);
  EXPECT_TRUE(tok.is_special(151644));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is special=false
  EXPECT_TRUE(tok.config().chat_template.has_value());
  // Inline special tokens become their ids, never BPE pieces.
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "user\nhi");
}

TEST(TokenizerFixture, Llama3SpecialTokensAndConfig) {
  const Tokenizer& tok = real_tokenizer("llama3");
  EXPECT_EQ(tok.vocab_size(), 128256);
  EXPECT_EQ(tok.bos_id(), 128000);  // <|begin_of_text|>
  EXPECT_EQ(tok.token_id("<|eot_id|>"), 128009);
  // Digits go in groups of up to three for Llama 3, one by one for Qwen.
  EXPECT_EQ(real_tokenizer("llama3").encode("1234567").size(), 3u);
  EXPECT_EQ(real_tokenizer("qwen3").encode("1234567").size(), 7u);
}

TEST(TokenizerFixture, DecodeInvalidUtf8Replaces) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  // "€" is three bytes; its byte tokens alone are partial UTF-8.
  const std::string euro = "\xE2\x82\xAC";
  std::vector<int32_t> bytes;
  for (char c : euro) bytes.push_back(*tok.token_id(byte_symbol(uint8_t(c))));
  EXPECT_EQ(tok.decode(bytes), euro);
  EXPECT_EQ(tok.decode(std::span(bytes).first(2)), "\xEF\xBF\xBD");  // one U+FFFD for E2 82
  std::vector<int32_t> odd = {bytes[1], bytes[0]};                    // 82 E2
  EXPECT_EQ(tok.decode(odd), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{tok.vocab_size()}), UserError);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), UserError);
}

TEST(TokenizerFixture, EncodeRejectsInvalidUtf8) {
  EXPECT_THROW(real_tokenizer("qwen3").encode("ok \xC3\x28 bad"), UserError);
}

TEST(TokenizerFixture, RoundTripOfLongMixedText) {
  // Long pieces take the heap path of the BPE; decode(encode(x)) == NFC(x) for NFC input.
  const Tokenizer& tok = real_tokenizer("qwen3");
  std::string text;
  for (int i = 0; i < 300; ++i) text += "abc\xE4\xBD\xA0" + std::to_string(i % 7);
  for (const auto* name : {"qwen3", "llama3"}) {
    const Tokenizer& t = real_tokenizer(name);
    EXPECT_EQ(t.decode(t.encode(text)), text) << name;
  }
  EXPECT_LT(tok.encode(text).size(), text.size());
}

// A tiny byte-level tokenizer: vocab holds the 256 byte symbols plus merged symbols.
std::string tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                           bool array_merges, bool ignore_merges,
                           const std::vector<std::string>& extra_vocab = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(uint8_t(b))] = b;  // id = byte value
  int id = 256;
  json jm = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    if (array_merges)
      jm.push_back(json::array({a, b}));
    else
      jm.push_back(a + " " + b);
  }
  for (const auto& s : extra_vocab)
    if (!vocab.contains(s)) vocab[s] = id++;
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", id}, {"content", "<|x|>"}, {"special", true}},
                                    {{"id", id + 1}, {"content", "<|xy|>"}, {"special", true}}})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+)"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", jm}}}};
  return j.dump();
}

TEST(TokenizerBpe, LowestRankFirstThenLeftmost) {
  // "abc": merges (b,c) rank 0 and (a,b) rank 1 -> a + bc, not ab + c.
  auto t = Tokenizer::from_json(tiny_tokenizer({{"b", "c"}, {"a", "b"}}, true, false), "tiny");
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{'a', *t.token_id("bc")}));
  // Tie on the same rank: "aaa" with (a,a) -> aa + a (leftmost first).
  auto t2 = Tokenizer::from_json(tiny_tokenizer({{"a", "a"}}, true, false), "tiny");
  EXPECT_EQ(t2.encode("aaa"), (std::vector<int32_t>{*t2.token_id("aa"), 'a'}));
  // Long piece (heap path) agrees with the rule: 301 a's -> 150 "aa" + "a".
  const auto ids = t2.encode(std::string(301, 'a'));
  ASSERT_EQ(ids.size(), 151u);
  EXPECT_EQ(ids.back(), 'a');
  EXPECT_EQ(ids.front(), *t2.token_id("aa"));
}

TEST(TokenizerBpe, BothMergeEncodingsGiveTheSameIds) {
  const std::vector<std::pair<std::string, std::string>> m = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  auto a = Tokenizer::from_json(tiny_tokenizer(m, true, false), "array");
  auto s = Tokenizer::from_json(tiny_tokenizer(m, false, false), "string");
  for (const char* text : {"hello world", "hellohello", "  hello\n", "ll he"})
    EXPECT_EQ(a.encode(text), s.encode(text)) << text;
  EXPECT_EQ(a.encode("hello"), (std::vector<int32_t>{*a.token_id("hello")}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholePieceFromVocab) {
  // "abcd" is in the vocab but no merge chain builds it.
  const std::vector<std::pair<std::string, std::string>> m = {{"a", "b"}, {"c", "d"}};
  auto with = Tokenizer::from_json(tiny_tokenizer(m, true, true, {"abcd"}), "with");
  auto without = Tokenizer::from_json(tiny_tokenizer(m, true, false, {"abcd"}), "without");
  EXPECT_EQ(with.encode("abcd"), (std::vector<int32_t>{*with.token_id("abcd")}));
  EXPECT_EQ(without.encode("abcd"),
            (std::vector<int32_t>{*without.token_id("ab"), *without.token_id("cd")}));
}

TEST(TokenizerBpe, AddedTokensLeftmostLongestAndNfc) {
  auto t = Tokenizer::from_json(tiny_tokenizer({}, true, false), "tiny");
  const int32_t x = *t.token_id("<|x|>"), xy = *t.token_id("<|xy|>");
  EXPECT_EQ(t.encode("a<|xy|>b<|x|>"), (std::vector<int32_t>{'a', xy, 'b', x}));
  EXPECT_EQ(t.decode(t.encode("a<|xy|>b")), "a<|xy|>b");
  EXPECT_EQ(t.decode(t.encode("a<|xy|>b"), true), "ab");
  // NFC: e + combining acute becomes U+00E9 (bytes C3 A9).
  EXPECT_EQ(t.encode("e\xCC\x81"), t.encode("\xC3\xA9"));
}

TEST(TokenizerBpe, BadFilesAreUserErrors) {
  EXPECT_THROW(Tokenizer::from_json("{not json", "bad.json"), UserError);
  EXPECT_THROW(Tokenizer::from_json("{}", "empty.json"), UserError);
  // A number beyond double's range is nlohmann's out_of_range, not a parse_error (the crash the
  // fuzzers found in generation_config.json, fixed in every JSON reader).
  EXPECT_THROW(Tokenizer::from_json(R"({"version": 1e999})", "big.json"), UserError);
  json j = json::parse(tiny_tokenizer({{"a", "b"}}, true, false));
  j["model"]["merges"] = json::array({"a b c"});
  EXPECT_THROW(Tokenizer::from_json(j.dump(), "m.json"), UserError);
  j["model"]["merges"] = json::array({"a zz"});
  EXPECT_THROW(Tokenizer::from_json(j.dump(), "m.json"), UserError);
  // Ids that are not integers: a float beyond int64's range was undefined behaviour when cast (a
  // fuzzer finding), a float in range was truncated. Ids from 2^24 on (config.json's bound): one
  // id near 2^30 made tables of gigabytes (a fuzzer finding: out of memory).
  for (const json& bad : {json(2.5e35), json(3.5), json(-1), json("7"), json(1 << 24), json(1073741823)}) {
    j = json::parse(tiny_tokenizer({}, true, false));
    j["model"]["vocab"]["a"] = bad;
    EXPECT_THROW(Tokenizer::from_json(j.dump(), "v.json"), UserError) << bad.dump();
    j = json::parse(tiny_tokenizer({}, true, false));
    j["added_tokens"][0]["id"] = bad;
    EXPECT_THROW(Tokenizer::from_json(j.dump(), "a.json"), UserError) << bad.dump();
  }
  // Ids far beyond the token count (a fuzzer input with one id of 3.7 million among 400 tokens
  // took a second and 120 MB): refused; a small gap is fine.
  j = json::parse(tiny_tokenizer({}, true, false));
  const int64_t count = int64_t(j["model"]["vocab"].size() + j["added_tokens"].size());
  j["model"]["vocab"]["far"] = 2 * (count + 1) + 1024;  // count + 1 tokens with "far"
  EXPECT_THROW(Tokenizer::from_json(j.dump(), "gap.json"), UserError);
  j["model"]["vocab"]["far"] = count + 100;
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "gap.json").vocab_size(), count + 101);
  j = json::parse(tiny_tokenizer({}, true, false));
  j["model"]["type"] = "WordPiece";
  try {
    Tokenizer::from_json(j.dump(), "wp.json");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("wp.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load("/nonexistent/model"), UserError);
}

TEST(TokenizerBpe, ReadConfigReplacesTheConfigOrLeavesItWhole) {
  auto t = Tokenizer::from_json(tiny_tokenizer({}, true, false), "tiny.json");
  const auto dir = std::filesystem::path(::testing::TempDir()) / "forja_read_config";
  std::filesystem::create_directories(dir);
  const auto file = dir / "tokenizer_config.json";
  const auto write = [&](const std::string& text) { std::ofstream(file, std::ios::binary) << text; };
  write(R"({"eos_token": "<|x|>", "pad_token": {"content": "<|xy|>"}, "add_bos_token": true,
            "chat_template": [{"name": "default", "template": "T"}]})");
  t.read_config(file);
  EXPECT_EQ(t.eos_id(), t.token_id("<|x|>"));
  EXPECT_EQ(t.pad_id(), t.token_id("<|xy|>"));
  EXPECT_TRUE(t.config().add_bos_token);
  EXPECT_EQ(t.config().chat_template, "T");
  EXPECT_EQ(t.config().path, file.string());
  // A token outside the vocabulary, or text that is not JSON: an error naming both files, and the
  // config read before stays as it was.
  write(R"({"eos_token": "<|nope|>"})");
  try {
    t.read_config(file);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tiny.json"), std::string::npos) << e.what();
  }
  write("{not json");
  EXPECT_THROW(t.read_config(file), UserError);
  // A named template list whose entries are not {"name": string, "template": string} (a
  // template given as a list made nlohmann throw its type_error: a crash found by the fuzzer).
  for (const char* bad : {R"({"chat_template": [{"name": "default", "template": [1]}]})",
                          R"({"chat_template": [{"name": 3, "template": "T"}]})", R"({"chat_template": ["T"]})"}) {
    write(bad);
    try {
      t.read_config(file);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(t.eos_id(), t.token_id("<|x|>"));
  EXPECT_EQ(t.config().chat_template, "T");
  // A second good file replaces the whole config: fields it lacks are gone.
  write(R"({"bos_token": "a"})");
  t.read_config(file);
  EXPECT_EQ(t.bos_id(), t.token_id("a"));
  EXPECT_FALSE(t.eos_id().has_value());
  EXPECT_FALSE(t.config().chat_template.has_value());
  EXPECT_FALSE(t.config().add_bos_token);
}

TEST(TokenizerUtf8, LossyMatchesMaximalSubpartRule) {
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\x98" "b"), "a\xEF\xBF\xBD" "b");       // truncated 4-byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");         // overlong
  EXPECT_EQ(utf8_lossy("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
  EXPECT_EQ(utf8_first_invalid("abc\xFF"), 3u);
}

}  // namespace
}  // namespace forja::data
