// Dataset tests: every JSONL format with its labels, the bad-input errors (file:line and what was
// expected) and --skip-bad-lines counts, truncation, packing with segment/position ids, padding,
// deterministic per-epoch shuffling, eval splits, and the streaming (uncached) path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/dataset.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace forja::data {
namespace {

using nlohmann::json;
using test::real_tokenizer;

std::filesystem::path write_file(const std::string& name, const std::string& content) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("forja_dataset_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

std::vector<int32_t> with_loss(const TokenizedExample& ex) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < ex.labels.size(); ++i)
    if (ex.labels[i] != kIgnoreLabel) {
      EXPECT_EQ(ex.labels[i], ex.input_ids[i]);
      v.push_back(ex.labels[i]);
    }
  return v;
}

TEST(DatasetFormats, EachFormatTokenizesAndMasks) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const int32_t eos = *tok.eos_id();
  std::string data;
  data += json({{"text", "Hello world."}}).dump() + "\n";
  data += json({{"prompt", "2+2="}, {"completion", " 4"}}).dump() + "\n";
  data += json({{"messages", {{{"role", "user"}, {"content", "Hi"}},
                              {{"role", "assistant"}, {"content", "Hello!"}}}}})
              .dump() +
          "\r\n";  // CRLF line ends are fine
  data += json({{"input_ids", {1, 2, 3, 4}}, {"labels", {-100, -100, 3, 4}}}).dump() + "\n";
  data += json({{"input_ids", {5, 6, 7}}}).dump();  // no final newline
  DatasetOptions o;
  o.shuffle = false;
  auto split = Dataset::load(write_file("formats.jsonl", data), tok, o);
  const Dataset& ds = split.train;
  ASSERT_EQ(ds.num_examples(), 5);
  EXPECT_FALSE(ds.packing());  // not all {"text"}
  EXPECT_EQ(ds.stats().formats.at("text"), 1);

  auto text = ds.example(0);
  auto want = tok.encode("Hello world.");
  want.push_back(eos);
  EXPECT_EQ(text.input_ids, want);
  EXPECT_EQ(text.labels[0], kIgnoreLabel);  // nothing predicts the first token
  EXPECT_EQ(with_loss(text), std::vector<int32_t>(want.begin() + 1, want.end()));

  auto pc = ds.example(1);
  EXPECT_EQ(tok.decode(pc.input_ids), "2+2= 4<|im_end|>");
  EXPECT_EQ(tok.decode(with_loss(pc)), " 4<|im_end|>");

  auto chat = ds.example(2);
  EXPECT_EQ(tok.decode(chat.input_ids),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "Hello!<|im_end|>\n");
  EXPECT_EQ(tok.decode(with_loss(chat)), "Hello!<|im_end|>");
  EXPECT_EQ(ds.line_of(2), 3);

  auto ids = ds.example(3);
  EXPECT_EQ(ids.input_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(ids.labels, (std::vector<int32_t>{-100, -100, 3, 4}));
  auto ids2 = ds.example(4);
  EXPECT_EQ(ids2.labels, (std::vector<int32_t>{-100, 6, 7}));

  // --train-on-inputs: the prompt has loss too (except the very first token).
  o.train_on_inputs = true;
  auto all = Dataset::load(write_file("formats.jsonl", data), tok, o);
  EXPECT_EQ(with_loss(all.train.example(1)).size(), all.train.example(1).input_ids.size() - 1);
  EXPECT_GT(all.train.loss_tokens(), ds.loss_tokens());
}

TEST(DatasetFormats, Llama3ConversationUsesItsTemplate) {
  const Tokenizer& tok = real_tokenizer("llama3");
  const std::string data =
      json({{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                          {{"role", "user"}, {"content", "Hi"}},
                          {{"role", "assistant"}, {"content", " Hello! "}}}}})
          .dump() +
      "\n";
  auto split = Dataset::load(write_file("llama.jsonl", data), tok, {});
  auto ex = split.train.example(0);
  EXPECT_EQ(ex.input_ids.front(), 128000);  // <|begin_of_text|> from the template
  EXPECT_EQ(tok.decode(with_loss(ex)), "Hello!<|eot_id|>");
}

// Mistral (add_bos_token true): text and prompt/completion start with <s> as transformers'
// tokenizer(text) gives them; a conversation has the template's <s> once; answers keep their
// leading space in the first trainable token.
TEST(DatasetFormats, MistralAddsBosAndMasksItsTemplate) {
  const Tokenizer& tok = real_tokenizer("mistral-v0.3");
  const std::string data =
      json({{"text", "Hello world"}}).dump() + "\n" +
      json({{"prompt", "Q:"}, {"completion", " A"}}).dump() + "\n" +
      json({{"messages", {{{"role", "user"}, {"content", "Capital of France?"}},
                          {{"role", "assistant"}, {"content", "Paris."}}}}})
          .dump() +
      "\n";
  auto split = Dataset::load(write_file("mistral.jsonl", data), tok, {});
  const auto text = split.train.example(0);
  EXPECT_EQ(text.input_ids.front(), 1);
  EXPECT_EQ(std::vector<int32_t>(text.input_ids.begin() + 1, text.input_ids.end() - 1),
            tok.encode("Hello world"));
  EXPECT_EQ(text.input_ids.back(), 2);  // add_eos
  const auto pc = split.train.example(1);
  EXPECT_EQ(pc.input_ids.front(), 1);
  EXPECT_EQ(pc.labels.front(), kIgnoreLabel);
  EXPECT_EQ(tok.decode(with_loss(pc)), "A</s>");
  const auto chat = split.train.example(2);
  EXPECT_EQ(chat.input_ids.front(), 1);
  EXPECT_EQ(std::count(chat.input_ids.begin(), chat.input_ids.end(), 1), 1);
  EXPECT_EQ(chat.input_ids[1], 3);  // [INST]
  EXPECT_EQ(tok.decode(with_loss(chat)), "Paris.</s>");
  EXPECT_EQ(tok.token_text(with_loss(chat).front()), "\xE2\x96\x81Paris");
  // Conversations the template refuses are bad lines, with file:line.
  const std::string two_users =
      json({{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}},
                          {{"role", "assistant"}, {"content", "c"}}}}})
          .dump() +
      "\n";
  try {
    Dataset::load(write_file("mistral_bad.jsonl", data + two_users), tok, {});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("mistral_bad.jsonl:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("alternate"), std::string::npos) << e.what();
  }
}

// Loads `content` expecting a UserError whose message holds every one of `needles`.
void expect_error(const std::string& content, std::vector<std::string> needles,
                  DatasetOptions o = {}) {
  const auto path = write_file("bad.jsonl", content);
  try {
    Dataset::load(path, real_tokenizer("qwen3"), o);
    ADD_FAILURE() << "no error for " << json(content).dump();
  } catch (const UserError& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message: " << e.what() << "\nlacks: " << n;
  }
}

TEST(DatasetErrors, EachBadInputNamesFileLineAndExpectation) {
  const std::string ok = R"({"text": "fine"})" "\n";
  expect_error("", {"bad.jsonl", "empty"});
  expect_error(ok + "{\"text\": \"unterminated}\n", {"bad.jsonl:2", "not valid JSON"});
  // A number too large for a double is nlohmann's out_of_range, not a parse_error (a crash found
  // by fuzzing, docs/fuzzing.md).
  expect_error(ok + "{\"text\": \"x\", \"n\": 1e999}\n", {"bad.jsonl:2", "not valid JSON", "number overflow"});
  expect_error(ok + ok + "[1, 2]\n", {"bad.jsonl:3", "expected a JSON object"});
  expect_error(ok + R"({"prompt": "p"})" "\n", {"bad.jsonl:2", "\"completion\" is missing"});
  expect_error(R"({"text": 5})" "\n", {"bad.jsonl:1", "is an integer; expected a string"});
  expect_error(R"({"messages": [{"role": "robot", "content": "x"}]})" "\n",
               {"bad.jsonl:1", "messages[0].role", "\"robot\"", "system, user, assistant or tool"});
  expect_error(R"({"messages": [{"role": "user"}]})" "\n",
               {"bad.jsonl:1", "messages[0].content is missing"});
  expect_error(R"({"messages": "hi"})" "\n", {"bad.jsonl:1", "expected an array"});
  expect_error(R"({"input_ids": [1, 151669]})" "\n",
               {"bad.jsonl:1", "input_ids[1] = 151669", "outside the vocabulary"});
  expect_error(R"({"input_ids": [1, "2"]})" "\n", {"bad.jsonl:1", "expected an integer"});
  expect_error(R"({"input_ids": [1, 2], "labels": [1]})" "\n",
               {"bad.jsonl:1", "same length"});
  expect_error(ok + "{\"text\": \"caf\xC3\x28\"}\n", {"bad.jsonl:2", "not valid UTF-8"});
  expect_error(R"({"question": "q", "answer": "a"})" "\n",
               {"bad.jsonl:1", "\"question\"", "expected {\"text\"}"});
  expect_error(ok + "\n" + ok, {"bad.jsonl:2", "empty"});
  expect_error(R"({"messages": [{"role": "user", "content": "only a question"}]})" "\n",
               {"bad.jsonl:1", "no assistant message"});
  DatasetOptions o;
  o.vocab_size = 10;  // the model's vocabulary, when smaller than the tokenizer's
  expect_error(R"({"input_ids": [1, 10]})" "\n", {"input_ids[1] = 10"}, o);
  // Text whose tokens fall outside the model's vocabulary: a tokenizer of another model (found
  // by fuzzing: the ids reached the GPU's embedding lookup unchecked).
  expect_error(R"({"text": "fine"})" "\n", {"bad.jsonl:1", "outside the model's vocabulary (vocab_size 10",
                                             "does not belong to this model"}, o);
  expect_error(R"({"prompt": "p", "completion": "c"})" "\n", {"bad.jsonl:1", "vocab_size 10"}, o);
  expect_error(ok, {"not found"}, [] {
    DatasetOptions x;
    x.eval_file = "/nonexistent/eval.jsonl";
    return x;
  }());
  o = {};
  o.chat_template = "vicuna";
  expect_error(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})" "\n",
               {"--chat-template"}, o);
}

TEST(DatasetErrors, SkipBadLinesCountsEachKind) {
  std::string data;
  data += R"({"text": "one"})" "\n";
  data += "not json\n";
  data += R"({"text": 1})" "\n";
  data += R"({"messages": [{"role": "bot", "content": "x"}]})" "\n";
  data += "{\"text\": \"\xFF\"}\n";
  data += "not json either\n";
  data += R"({"text": "two"})" "\n";
  DatasetOptions o;
  o.skip_bad_lines = true;
  auto split = Dataset::load(write_file("skip.jsonl", data), real_tokenizer("qwen3"), o);
  const auto& st = split.train.stats();
  EXPECT_EQ(split.train.num_examples(), 2);
  EXPECT_EQ(st.lines, 7);
  EXPECT_EQ(st.skipped_total(), 5);
  EXPECT_EQ(st.skipped.at("invalid JSON"), 2);
  EXPECT_EQ(st.skipped.at("wrong type"), 1);
  EXPECT_EQ(st.skipped.at("bad role"), 1);
  EXPECT_EQ(st.skipped.at("invalid UTF-8"), 1);
  EXPECT_NE(st.summary().find("skipped 5 bad lines"), std::string::npos) << st.summary();
  EXPECT_NE(st.summary().find("skip.jsonl:2"), std::string::npos) << st.summary();
  // All lines bad: an error even when skipping.
  EXPECT_THROW(Dataset::load(write_file("allbad.jsonl", "x\ny\n"), real_tokenizer("qwen3"), o),
               UserError);
}

std::string text_lines(int n, uint32_t seed) {
  std::string data;
  for (int i = 0; i < n; ++i) {
    std::string words;
    const int len = 1 + int((seed + uint32_t(i) * 7919u) % 23u);
    for (int w = 0; w < len; ++w) words += " w" + std::to_string((i * 31 + w) % 97);
    data += json({{"text", "doc" + std::to_string(i) + words}}).dump() + "\n";
  }
  return data;
}

TEST(DatasetPacking, RowsHoldWholeDocumentsWithSegmentsAndPositions) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  DatasetOptions o;
  o.seq_len = 64;
  o.seed = 7;
  auto split = Dataset::load(write_file("pack.jsonl", text_lines(200, 3)), tok, o);
  const Dataset& ds = split.train;
  ASSERT_TRUE(ds.packing());  // default for {"text"}
  EXPECT_LT(ds.num_rows(0), 200);
  std::multiset<std::vector<int32_t>> seen;
  int64_t tokens = 0, loss = 0;
  const int32_t B = 3, S = 64;
  for (int64_t bi = 0; bi < ds.num_batches(0, B); ++bi) {
    const Batch b = ds.batch(0, bi, B);
    ASSERT_EQ(b.input_ids.size(), size_t(B * S));
    tokens += b.tokens;
    loss += b.loss_tokens;
    for (int32_t r = 0; r < B; ++r) {
      std::vector<int32_t> doc;
      int32_t seg = 0;
      for (int32_t t = 0; t < S; ++t) {
        const size_t k = size_t(r * S + t);
        const int32_t s = b.segment_ids[k];
        if (s == 0) {  // padding runs to the end of the row
          EXPECT_EQ(b.labels[k], kIgnoreLabel);
          for (int32_t u = t; u < S; ++u) EXPECT_EQ(b.segment_ids[size_t(r * S + u)], 0);
          break;
        }
        if (s != seg) {  // a new document: positions restart, its first token has no label
          EXPECT_EQ(s, seg + 1);
          if (!doc.empty()) seen.insert(doc);
          doc.clear();
          seg = s;
          EXPECT_EQ(b.position_ids[k], 0);
          EXPECT_EQ(b.labels[k], kIgnoreLabel);
        } else {
          EXPECT_EQ(b.position_ids[k], b.position_ids[k - 1] + 1);
        }
        doc.push_back(b.input_ids[k]);
      }
      if (!doc.empty()) seen.insert(doc);
    }
  }
  // Every example exactly once per epoch, whole.
  std::multiset<std::vector<int32_t>> want;
  for (int64_t i = 0; i < ds.num_examples(); ++i) want.insert(ds.example(i).input_ids);
  EXPECT_EQ(seen, want);
  EXPECT_EQ(tokens, ds.tokens());
  EXPECT_EQ(loss, ds.loss_tokens());
}

TEST(DatasetShuffle, DeterministicBySeedAndReshuffledPerEpoch) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const auto path = write_file("shuffle.jsonl", text_lines(50, 1));
  DatasetOptions o;
  o.packing = false;
  o.seq_len = 32;
  auto first_ids = [&](const Dataset& d, int64_t epoch) {  // every row of the epoch, in order
    std::vector<std::vector<int32_t>> v;
    for (int64_t i = 0; i < d.num_batches(epoch, 5); ++i) {
      const Batch b = d.batch(epoch, i, 5);
      for (int r = 0; r < 5; ++r)
        v.emplace_back(b.input_ids.begin() + r * 32, b.input_ids.begin() + (r + 1) * 32);
    }
    return v;
  };
  auto a = Dataset::load(path, tok, o);
  auto b = Dataset::load(path, tok, o);
  EXPECT_EQ(first_ids(a.train, 0), first_ids(b.train, 0));
  EXPECT_EQ(first_ids(a.train, 1), first_ids(b.train, 1));
  EXPECT_NE(first_ids(a.train, 0), first_ids(a.train, 1));
  o.seed = 43;
  auto c = Dataset::load(path, tok, o);
  EXPECT_NE(first_ids(a.train, 0), first_ids(c.train, 0));
  auto e0 = first_ids(a.train, 0), e1 = first_ids(a.train, 1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, e1);  // same examples, another order
}

TEST(DatasetPadding, OneExamplePerRowAndTruncationCounted) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  std::string data;
  data += json({{"prompt", "short"}, {"completion", " answer"}}).dump() + "\n";
  data += json({{"prompt", std::string(300, 'x') + " long prompt"},
                {"completion", " answer"}}).dump() + "\n";
  DatasetOptions o;
  o.seq_len = 16;
  o.shuffle = false;
  auto split = Dataset::load(write_file("pad.jsonl", data), tok, o);
  const Dataset& ds = split.train;
  EXPECT_FALSE(ds.packing());
  EXPECT_EQ(ds.stats().truncated, 1);
  EXPECT_GT(ds.stats().truncated_tokens, 0);
  EXPECT_EQ(ds.stats().without_loss, 1);  // the long prompt leaves no room for the answer
  const Batch b = ds.batch(0, 0, 4);
  EXPECT_EQ(b.rows, 2);
  EXPECT_EQ(b.documents, 2);
  const int32_t pad = *tok.pad_id();
  const auto first = ds.example(0);
  for (int32_t t = 0; t < 16; ++t) {
    const size_t k = size_t(t);
    if (t < int32_t(first.input_ids.size())) {
      EXPECT_EQ(b.segment_ids[k], 1);
      EXPECT_EQ(b.position_ids[k], t);
    } else {
      EXPECT_EQ(b.segment_ids[k], 0);
      EXPECT_EQ(b.input_ids[k], pad);
      EXPECT_EQ(b.labels[k], kIgnoreLabel);
    }
  }
  for (int32_t t = 0; t < 16; ++t) EXPECT_EQ(b.segment_ids[size_t(16 + t)], 1);  // truncated: full
  for (int32_t t = 0; t < 32; ++t) EXPECT_EQ(b.segment_ids[size_t(32 + t)], 0);  // empty rows
}

TEST(DatasetSplit, EvalFractionIsDisjointAndEvalFileWorks) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const auto path = write_file("split.jsonl", text_lines(40, 5));
  DatasetOptions o;
  o.eval_split = 0.1;
  auto s = Dataset::load(path, tok, o);
  ASSERT_TRUE(s.eval.has_value());
  EXPECT_EQ(s.eval->num_examples(), 4);
  EXPECT_EQ(s.train.num_examples(), 36);
  std::set<int64_t> lines;
  for (int64_t i = 0; i < s.train.num_examples(); ++i) lines.insert(s.train.line_of(i));
  for (int64_t i = 0; i < s.eval->num_examples(); ++i) lines.insert(s.eval->line_of(i));
  EXPECT_EQ(lines.size(), 40u);
  auto s2 = Dataset::load(path, tok, o);  // the same split again
  EXPECT_EQ(s2.eval->line_of(0), s.eval->line_of(0));
  o.eval_split = 0;
  o.eval_file = write_file("eval.jsonl", text_lines(3, 9));
  auto s3 = Dataset::load(path, tok, o);
  ASSERT_TRUE(s3.eval.has_value());
  EXPECT_EQ(s3.eval->num_examples(), 3);
  o.eval_split = 0.5;
  EXPECT_THROW(Dataset::load(path, tok, o), UserError);  // both given
}

TEST(DatasetStreaming, UncachedLinesGiveTheSameBatches) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  std::string data = "\xEF\xBB\xBF" + text_lines(30, 2);  // with a byte order mark
  data += json({{"messages", {{{"role", "user"}, {"content", "Hi"}},
                              {{"role", "assistant"}, {"content", "Yo"}}}}})
              .dump() +
          "\r\n";
  const auto path = write_file("stream.jsonl", data);
  DatasetOptions o;
  o.seq_len = 48;
  o.packing = true;
  auto cached = Dataset::load(path, tok, o);
  o.max_cached_tokens = 0;
  auto streamed = Dataset::load(path, tok, o);
  ASSERT_EQ(cached.train.num_rows(1), streamed.train.num_rows(1));
  for (int64_t i = 0; i < cached.train.num_batches(1, 2); ++i) {
    const Batch a = cached.train.batch(1, i, 2), b = streamed.train.batch(1, i, 2);
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.segment_ids, b.segment_ids);
  }
}

}  // namespace
}  // namespace forja::data
