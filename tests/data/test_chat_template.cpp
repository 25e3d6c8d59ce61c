// Chat template tests: our renders equal those of transformers' apply_chat_template on the real
// Qwen3 and Llama 3 templates (tests/fixtures/tokenizer/chat_*.json), the trainable/prompt split,
// detection from tokenizer_config.json, and the errors that say how to choose a template.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "tokenizer_fixtures.h"
#include "util/error.h"

namespace forja::data {
namespace {

using nlohmann::json;
using test::fixture_dir;
using test::read_text;
using test::real_tokenizer;

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> m;
  for (const auto& x : j) {
    ChatMessage msg{x.at("role"), x.at("content"), std::nullopt};
    if (x.contains("reasoning_content")) msg.reasoning_content = x.at("reasoning_content");
    m.push_back(msg);
  }
  return m;
}

std::string trainable_text(const std::vector<ChatSegment>& segs) {
  std::string s;
  for (const auto& x : segs)
    if (x.trainable) s += x.text;
  return s;
}

TEST(ChatTemplateFixture, Qwen3RendersLikeTransformers) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const auto tmpl = ChatTemplate::detect(tok.config());
  ASSERT_EQ(tmpl.name(), "qwen3");
  const json fx = json::parse(read_text(fixture_dir() / "chat_qwen3.json"));
  int checked = 0;
  for (const auto& c : fx.at("cases")) {
    if (c.at("text").is_null()) continue;
    ChatRenderOptions o;
    o.add_generation_prompt = c.at("add_generation_prompt");
    if (!c.at("enable_thinking").is_null()) o.enable_thinking = c.at("enable_thinking").get<bool>();
    const auto msgs = messages_of(c.at("messages"));
    EXPECT_EQ(tmpl.render_text(msgs, o), c.at("text").get<std::string>())
        << c.at("name") << " gen=" << o.add_generation_prompt;
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(ChatTemplateFixture, Llama3RendersLikeTransformers) {
  const Tokenizer& tok = real_tokenizer("llama3");
  const auto tmpl = ChatTemplate::detect(tok.config());
  ASSERT_EQ(tmpl.name(), "llama3");
  const std::string header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  const json fx = json::parse(read_text(fixture_dir() / "chat_llama3.json"));
  int checked = 0;
  for (const auto& c : fx.at("cases")) {
    if (c.at("text").is_null()) continue;
    ChatRenderOptions o;
    o.add_generation_prompt = c.at("add_generation_prompt");
    std::string want = c.at("text");
    // The original template always ends with the assistant header; forja only when asked.
    ASSERT_GE(want.size(), header.size());
    ASSERT_EQ(want.substr(want.size() - header.size()), header);
    if (!o.add_generation_prompt) want.resize(want.size() - header.size());
    const auto msgs = messages_of(c.at("messages"));
    EXPECT_EQ(tmpl.render_text(msgs, o, *tok.config().bos_token), want) << c.at("name");
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

// Mistral Instruct v0.1/v0.2 ("v1") and v0.3 ("v3") templates: renders and their ids equal
// transformers' apply_chat_template and tokenizers on the same files; the template's errors
// (roles that do not alternate, tool messages) are UserErrors here.
void expect_mistral_renders(const std::string& name, const std::string& family) {
  const Tokenizer& tok = real_tokenizer(name);
  const auto tmpl = ChatTemplate::detect(tok.config());
  ASSERT_EQ(tmpl.name(), family);
  const json fx = json::parse(read_text(fixture_dir() / ("chat_" + name + ".json")));
  int rendered = 0, refused = 0;
  for (const auto& c : fx.at("cases")) {
    ChatRenderOptions o;
    o.add_generation_prompt = c.at("add_generation_prompt");
    const auto msgs = messages_of(c.at("messages"));
    if (c.at("text").is_null()) {
      EXPECT_THROW(tmpl.render(msgs, o, *tok.config().bos_token), UserError) << c.at("name");
      ++refused;
      continue;
    }
    const std::string text = tmpl.render_text(msgs, o, *tok.config().bos_token);
    EXPECT_EQ(text, c.at("text").get<std::string>()) << c.at("name");
    EXPECT_EQ(tok.encode(text), c.at("ids").get<std::vector<int32_t>>()) << c.at("name");
    ++rendered;
  }
  EXPECT_GE(rendered, 18);
  EXPECT_GE(refused, 4);
}

TEST(ChatTemplateFixture, MistralV1RendersLikeTransformers) {
  expect_mistral_renders("mistral-v0.1", "mistral");
}
TEST(ChatTemplateFixture, MistralV3RendersLikeTransformers) {
  expect_mistral_renders("mistral-v0.3", "mistral-v3");
}

TEST(ChatTemplateMask, MistralTrainsOnAnswersWithTheirSpace) {
  const std::vector<ChatMessage> m = {{"system", "Be brief.", {}}, {"user", "Q1", {}},
                                      {"assistant", "A1 ", {}}, {"user", "Q2", {}},
                                      {"assistant", "A2", {}}};
  const auto v1 = ChatTemplate::by_name("mistral").render(m, {}, "<s>");
  EXPECT_EQ(trainable_text(v1), " A1 </s> A2</s>");
  const auto v3 = ChatTemplate::by_name("mistral-v0.3").render(m, {}, "<s>");
  EXPECT_EQ(trainable_text(v3), " A1</s> A2</s>");
  // v3 puts the system message before the last message only when that is a user message.
  std::string text;
  for (const auto& s : v3) text += s.text;
  EXPECT_EQ(text.find("Be brief."), std::string::npos);
  EXPECT_EQ(ChatTemplate::by_name("mistral-v3").render_text(std::span(m).first(4), {}, "<s>"),
            "<s>[INST] Q1[/INST] A1</s>[INST] Be brief.\n\nQ2[/INST]");
  EXPECT_EQ(ChatTemplate::by_name("mistral").turn_end(), "</s>");
}

TEST(ChatTemplateMask, Qwen3TrainsOnAnswersOnly) {
  const auto t = ChatTemplate::by_name("qwen3");
  std::vector<ChatMessage> m = {{"user", "Q1", {}}, {"assistant", "A1", {}},
                                {"user", "Q2", {}}, {"assistant", "A2", {}}};
  auto segs = t.render(m);
  EXPECT_EQ(trainable_text(segs), "A1<|im_end|>A2<|im_end|>");  // empty think block masked
  ChatRenderOptions o;
  o.train_empty_think = true;
  EXPECT_EQ(trainable_text(t.render(m, o)), "A1<|im_end|><think>\n\n</think>\n\nA2<|im_end|>");
  m.back().reasoning_content = "hmm";
  EXPECT_EQ(trainable_text(t.render(m)), "A1<|im_end|><think>\nhmm\n</think>\n\nA2<|im_end|>");
  // Segments alternate and concatenate to the full text.
  segs = t.render(m);
  for (size_t i = 1; i < segs.size(); ++i) EXPECT_NE(segs[i].trainable, segs[i - 1].trainable);
}

TEST(ChatTemplateMask, ChatmlFamiliesAndLlama3) {
  const std::vector<ChatMessage> m = {{"user", "hi", {}}, {"assistant", "hello", {}}};
  EXPECT_EQ(ChatTemplate::by_name("qwen2.5").render_text(m),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello"
            "<|im_end|>\n");
  EXPECT_EQ(ChatTemplate::by_name("chatml").render_text(m),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n");
  EXPECT_EQ(trainable_text(ChatTemplate::by_name("qwen2").render(m)), "hello<|im_end|>");
  const auto l = ChatTemplate::by_name("llama3").render(m, {}, "<|begin_of_text|>");
  EXPECT_EQ(trainable_text(l), "hello<|eot_id|>");
}

TEST(ChatTemplateMask, Llama31DatedSystemTurnAndTools) {
  // As rendered by transformers with Llama 3.1's template (date fallback "26 Jul 2024").
  const std::vector<ChatMessage> m = {{"system", " Be brief. ", {}},
                                      {"user", "Weather?", {}},
                                      {"assistant", "Checking.", {}},
                                      {"tool", "sunny \"22\"", {}},
                                      {"assistant", " Sunny. ", {}}};
  const auto t = ChatTemplate::by_name("llama3.1");
  EXPECT_EQ(t.render_text(m, {}, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nChecking.<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny \\\"22\\\"\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nSunny.<|eot_id|>");
  EXPECT_EQ(trainable_text(t.render(m)), "Checking.<|eot_id|>Sunny.<|eot_id|>");
  TokenizerConfig cfg;
  cfg.chat_template = "{{- bos_token }}... Cutting Knowledge Date: December 2023 ...<|start_header_id|>"
                      "...<|eot_id|>";
  EXPECT_EQ(ChatTemplate::detect(cfg).name(), "llama3.1");
}

TEST(ChatTemplateErrors, UnknownNamesRolesAndTemplates) {
  try {
    ChatTemplate::by_name("vicuna");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos);
  }
  const std::vector<ChatMessage> bad = {{"robot", "x", {}}};
  EXPECT_THROW(ChatTemplate::by_name("qwen3").render(bad), UserError);
  TokenizerConfig cfg;
  cfg.path = "m/tokenizer_config.json";
  EXPECT_THROW(ChatTemplate::detect(cfg), UserError);  // no template at all
  cfg.chat_template = "{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}";
  try {
    ChatTemplate::detect(cfg);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("m/tokenizer_config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos);
  }
  EXPECT_EQ(ChatTemplate::choose("llama3", cfg).name(), "llama3");
}

TEST(ChatTemplateMask, EncodePartsKeepsIdsAndLabelsTheParts) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const auto t = ChatTemplate::by_name("qwen3");
  // Content that starts with newlines and combining marks: the boundary tokens must still be
  // those of the whole text.
  const std::vector<ChatMessage> m = {{"user", "e\xCC\x81t\xC3\xA9?", {}},
                                      {"assistant", "\n\n  caf\x65\xCC\x81 \xF0\x9F\x98\x80", {}}};
  const auto segs = t.render(m);
  std::vector<std::string_view> parts;
  std::string whole;
  for (const auto& s : segs) {
    parts.push_back(s.text);
    whole += s.text;
  }
  std::vector<int32_t> ids, part;
  tok.encode_parts(parts, ids, part);
  EXPECT_EQ(ids, tok.encode(whole));
  ASSERT_EQ(part.size(), ids.size());
  std::vector<int32_t> trainable_ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_GE(part[i], 0);
    ASSERT_LT(part[i], int32_t(segs.size()));
    if (i) {
      EXPECT_GE(part[i], part[i - 1]);
    }
    if (segs[size_t(part[i])].trainable) trainable_ids.push_back(ids[i]);
  }
  EXPECT_EQ(tok.decode(trainable_ids), "  caf\xC3\xA9 \xF0\x9F\x98\x80<|im_end|>");
}

}  // namespace
}  // namespace forja::data
