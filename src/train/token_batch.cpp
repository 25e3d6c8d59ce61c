#include "train/token_batch.h"

namespace forja::train {

model::TokenBatch to_token_batch(const data::Batch& b) {
  model::TokenBatch t;
  t.batch = uint32_t(b.batch_size);
  t.seq = uint32_t(b.seq_len);
  t.input_ids = b.input_ids;
  t.positions = b.position_ids;
  t.segments = b.segment_ids;
  t.targets.resize(b.labels.size());
  const size_t S = size_t(b.seq_len);
  for (size_t r = 0; r < size_t(b.batch_size); ++r)
    for (size_t i = 0; i < S; ++i)
      // The first token of each packed document is labelled -100 by the dataset, so a document's
      // last token never learns to predict the next document's first.
      t.targets[r * S + i] = i + 1 < S ? b.labels[r * S + i + 1] : data::kIgnoreLabel;
  return t;
}

}  // namespace forja::train
