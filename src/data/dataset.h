// JSONL datasets for fine-tuning: one example per line in any of
//   {"text": "..."}                                  loss on every token
//   {"prompt": "...", "completion": "..."}           loss on the completion (+ EOS)
//   {"prompt": [msgs], "completion": [msgs]}         rendered as one conversation
//   {"messages": [{"role": ..., "content": ...}]}    chat template; loss on assistant turns
//   {"input_ids": [...], "labels": [...]}            taken as is (labels optional, -100 = none);
//                                                    the only format that needs no tokenizer
// turned into fixed-shape batches [B, S] for the trainer.
//
// Memory: opening a file reads it once, line by line, to validate and tokenize every example and
// keeps an index (byte offset, line number, token count per example). The token ids themselves
// are kept only while they fit options.max_cached_tokens; beyond that each batch re-reads its
// lines from the file (pread) and tokenizes them again, so a multi-GB file never sits in memory.
//
// Labels follow transformers' causal-LM convention (docs/formats.md 6.1): aligned with input_ids,
// not shifted, -100 where there is no loss. The first token of every document has label -100
// (nothing predicts it; in a packed row the previous document's last token must not).
//
// Packing (default on when every example is {"text"}): examples, in the epoch's shuffled order,
// are placed whole into rows of seq_len tokens until the next does not fit (no example is split
// across rows). Documents in a row must not attend to each other: each batch carries
// segment_ids (1, 2, ... per document in the row, 0 on padding) and position_ids that restart
// at 0 for each document; attention must mask keys whose segment differs from the query's.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace forja::data {

constexpr int32_t kIgnoreLabel = -100;

struct DatasetOptions {
  int32_t seq_len = 2048;
  bool train_on_inputs = false;         // loss on prompts and user turns too
  std::optional<bool> packing;          // default: on if every example is {"text"}
  uint64_t seed = 42;                   // shuffling; each epoch reshuffles with (seed, epoch)
  bool shuffle = true;
  double eval_split = 0.0;              // fraction of examples held out for evaluation
  std::filesystem::path eval_file;      // or a separate evaluation file
  bool skip_bad_lines = false;          // skip bad lines (reported by kind) instead of failing
  std::string chat_template;            // --chat-template NAME; "" = detect from the tokenizer
  ChatRenderOptions chat;               // e.g. train_empty_think
  bool add_eos = true;                  // EOS after {"text"} and completions
  int32_t vocab_size = 0;               // ids must be below this; 0 = the tokenizer's
  // Without a tokenizer (Dataset::load with nullptr): where tokenizer.json was looked for, named
  // in the error a text/messages/prompt-completion line gets (only {"input_ids"} lines need none).
  std::filesystem::path tokenizer_file;
  int64_t max_cached_tokens = 64 << 20; // keep tokenized examples in memory up to this many
};

struct TokenizedExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // -100 = no loss
};

struct DatasetStats {
  std::string path;
  int64_t lines = 0;                      // lines in the file
  int64_t examples = 0;                   // usable examples (train + eval)
  int64_t tokens = 0;                     // after truncation
  int64_t loss_tokens = 0;                // labels != -100, after truncation
  int64_t truncated = 0;                  // examples longer than seq_len, cut at the end
  int64_t truncated_tokens = 0;           // tokens cut
  int64_t without_loss = 0;               // examples left with no loss token
  std::map<std::string, int64_t> formats; // format name -> examples
  std::map<std::string, int64_t> skipped; // kind of bad line -> lines skipped
  std::vector<std::string> skipped_examples;  // the first few skip messages
  int64_t skipped_total() const;
  std::string summary() const;  // several lines for the log
};

// One batch, row-major [batch_size, seq_len].
struct Batch {
  int32_t batch_size = 0;
  int32_t seq_len = 0;
  std::vector<int32_t> input_ids;     // [B, S]; padding = pad id
  std::vector<int32_t> labels;        // [B, S]; -100 = no loss (padding, prompts, doc starts)
  std::vector<int32_t> position_ids;  // [B, S]; 0.. per document, 0 on padding
  std::vector<int32_t> segment_ids;   // [B, S]; 1.. per document in its row, 0 = padding
  int32_t rows = 0;                   // rows holding data (the rest are all padding)
  int32_t documents = 0;
  int64_t tokens = 0;                 // non-padding tokens
  int64_t loss_tokens = 0;            // labels != -100
};

class Dataset {
 public:
  // Train split of `file` and, when options ask for one, the eval split (a fraction of the same
  // file, or options.eval_file).
  struct Split;
  static Split load(const std::filesystem::path& file, const Tokenizer& tokenizer,
                    const DatasetOptions& options);
  // tokenizer may be null: then every line must be {"input_ids"[, "labels"]} (checked against
  // options.vocab_size, which must be set) and padding uses id 0 (masked: label -100, segment 0).
  static Split load(const std::filesystem::path& file, const Tokenizer* tokenizer,
                    const DatasetOptions& options);

  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;
  ~Dataset();

  int64_t num_examples() const;
  int32_t seq_len() const;
  bool packing() const;
  // Statistics of the whole file (shared by both splits).
  const DatasetStats& stats() const;
  // Tokens and loss tokens of this split.
  int64_t tokens() const;
  int64_t loss_tokens() const;
  // The i-th example of this split in file order, truncated to seq_len, and its line number.
  TokenizedExample example(int64_t i) const;
  int64_t line_of(int64_t i) const;

  // Rows (sequences) in an epoch; with packing it depends on the epoch's order.
  int64_t num_rows(int64_t epoch) const;
  int64_t num_batches(int64_t epoch, int32_t batch_size) const;
  // The index-th batch of an epoch, always [batch_size, seq_len]; rows past the epoch's end are
  // padding. The eval split is never shuffled. Thread-safe: a loader thread may call it while
  // the trainer runs (each call re-reads or copies its examples; the tokenizer must outlive it).
  Batch batch(int64_t epoch, int64_t index, int32_t batch_size) const;

 private:
  struct Source;
  struct Plan;
  Dataset(std::shared_ptr<Source> src, std::vector<uint32_t> examples, bool shuffled);
  std::shared_ptr<const Plan> plan(int64_t epoch) const;
  std::shared_ptr<Source> src_;
  std::vector<uint32_t> examples_;  // indices into the source's examples, file order
  bool shuffled_;
  mutable std::shared_ptr<const Plan> plan_;  // the last epoch's, shared with callers
  mutable std::unique_ptr<std::mutex> plan_mutex_;
};

struct Dataset::Split {
  Dataset train;
  std::optional<Dataset> eval;
};

inline Dataset::Split Dataset::load(const std::filesystem::path& file, const Tokenizer& tokenizer,
                                    const DatasetOptions& options) {
  return load(file, &tokenizer, options);
}

// A bad dataset line. kind is one of: "invalid JSON", "invalid UTF-8", "not an object",
// "unknown format", "missing field", "wrong type", "bad role", "token id out of range",
// "labels length", "empty example", "no assistant turn", "blank line".
class BadLineError : public UserError {
 public:
  BadLineError(std::string kind, const std::string& message)
      : UserError(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

// Tokenizes one JSONL line's example (what Dataset does per line), not truncated. Throws
// BadLineError "where: problem; fix" for bad input; `where` is e.g. "data.jsonl:12". `chat` may
// be null when no chat template is known: a conversation is then a UserError saying how to
// choose one.
// `tokenizer` may be null (see Dataset::load).
TokenizedExample tokenize_line(std::string_view line, const std::string& where,
                               const Tokenizer* tokenizer, const ChatTemplate* chat,
                               const DatasetOptions& options, std::string* format_name = nullptr);
inline TokenizedExample tokenize_line(std::string_view line, const std::string& where,
                                      const Tokenizer& tokenizer, const ChatTemplate* chat,
                                      const DatasetOptions& options,
                                      std::string* format_name = nullptr) {
  return tokenize_line(line, where, &tokenizer, chat, options, format_name);
}

}  // namespace forja::data
