// A dataset batch (labels aligned with input_ids, transformers' convention) as the engine's
// TokenBatch (targets: the token each position predicts, i.e. the labels shifted left by one).
#pragma once
#include "data/dataset.h"
#include "model/transformer.h"

namespace forja::train {

model::TokenBatch to_token_batch(const data::Batch& b);

}  // namespace forja::train
