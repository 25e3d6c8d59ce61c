// Chat templates: render a conversation exactly as the model's own Jinja chat_template would,
// written out in C++ per family (no Jinja engine), split into segments that say whether they are
// trainable (what the assistant says) or prompt (everything else), so labels can mask prompts.
//
// Families (names for --chat-template):
//   qwen3    ChatML with Qwen3's think-block rules (docs/formats.md 5.3)
//   qwen2.5  ChatML with the default system prompt "You are Qwen, created by Alibaba Cloud. ..."
//   qwen2    ChatML with the default system prompt "You are a helpful assistant."
//   chatml   ChatML, no default system prompt
//   llama3   Llama 3 (<|start_header_id|>role<|end_header_id|>\n\n content|trim <|eot_id|>)
//   llama3.1 Llama 3.1/3.2/3.3: as llama3, after a system turn that always comes first and starts
//            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" (the template's
//            fixed date; 3.2's template takes today's date when rendering, forja keeps the fixed
//            one so that data tokenizes the same every day); tool results are ipython turns
//   mistral  Mistral-7B-Instruct v0.1/v0.2, Mixtral-8x7B-Instruct (Mistral's "v1" template):
//            <s> then " [INST] {user} [/INST]" and " {assistant}</s>" turns; a leading system
//            message goes before the FIRST user message, followed by "\n\n"
//   mistral-v3 Mistral-7B-Instruct v0.3 ("v3"): <s> then "[INST] {user}[/INST]" and
//            " {assistant|trim}</s>"; the system message goes before the LAST message only if that
//            is a user message, so a conversation that ends with an answer loses it (as the
//            official template does: training data renders as transformers renders it)
//   Both: roles must alternate user/assistant after the optional system message, other roles
//   (tool results need tool_call_id, which forja's data does not carry) are a UserError, and
//   add_generation_prompt adds nothing (the prompt already ends with [/INST]).
// detect() picks one from tokenizer_config.json's chat_template text.
//
// Masking choices (the defaults):
//   - trainable: each assistant turn's content (with its think block when it has reasoning) and
//     the token that closes the turn (<|im_end|> / <|eot_id|>); the newline after <|im_end|> and
//     the turn header "<|im_start|>assistant\n" are prompt. Mistral: " {answer}</s>", the space
//     included (SentencePiece puts it into the answer's first token).
//   - Qwen3's EMPTY think block "<think>\n\n</think>\n\n", which the template puts before the last
//     assistant answer when it has no reasoning, is PROMPT (masked): it is what the template itself
//     feeds when thinking is off, and training on it would teach the model to skip thinking.
//     ChatRenderOptions::train_empty_think makes it trainable instead.
//   - Llama 3's template appends "<|start_header_id|>assistant<|end_header_id|>\n\n" even without
//     add_generation_prompt; for training it is emitted only with add_generation_prompt.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace forja::data {

struct ChatMessage {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::optional<std::string> reasoning_content;  // Qwen3 assistant turns
};

struct ChatSegment {
  std::string text;
  bool trainable = false;
};

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // Qwen3: false appends an empty think block to the prompt
  bool train_empty_think = false;       // see the masking choices above
};

class ChatTemplate {
 public:
  enum class Family { qwen3, qwen2_5, qwen2, chatml, llama3, llama3_1, mistral, mistral_v3 };

  // By name (see above). Unknown names are a UserError listing the known ones.
  static ChatTemplate by_name(std::string_view name);
  // From tokenizer_config.json's chat_template; UserError if absent or not recognised, saying
  // to choose one with --chat-template NAME.
  static ChatTemplate detect(const TokenizerConfig& config);
  // `name` if given (not empty), else detect(config).
  static ChatTemplate choose(std::string_view name, const TokenizerConfig& config);
  static std::vector<std::string> names();

  Family family() const { return family_; }
  std::string name() const;
  // Text that closes an assistant turn (<|im_end|>, <|eot_id|> or </s>).
  std::string turn_end() const;

  // Segments in order; adjacent segments with the same flag are merged. Roles other than
  // system/user/assistant/tool are a UserError (and for Mistral, see above). bos_token is the
  // tokenizer's (Llama 3 and Mistral start with it); empty if none.
  std::vector<ChatSegment> render(std::span<const ChatMessage> messages,
                                   const ChatRenderOptions& options = {},
                                   const std::string& bos_token = "") const;
  std::string render_text(std::span<const ChatMessage> messages,
                          const ChatRenderOptions& options = {},
                          const std::string& bos_token = "") const;

 private:
  explicit ChatTemplate(Family f) : family_(f) {}
  Family family_;
};

}  // namespace forja::data
