// model::LoraSet's parameter layout: per layer the A's first (projection order), then the B's, so
// that projections sharing an input have one stacked A (shared_input_run), and the conversion of
// params-layout vectors to the slot order that checkpoints keep (to_slot_order/from_slot_order).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "support/gpu_fixture.h"

namespace forja::test {
namespace {

using model::LinearKind;

model::ModelConfig small_config(int64_t hidden) {
  model::ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = hidden;
  c.intermediate_size = 40;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  return c;
}

model::LoraSettings settings(int64_t rank, std::initializer_list<LinearKind> targets) {
  model::LoraSettings s;
  s.rank = rank;
  s.targets.fill(false);
  for (LinearKind k : targets) s.targets[static_cast<int>(k)] = true;
  return s;
}

class LoraLayout : public GpuTest {};

TEST_F(LoraLayout, ALayerKeepsItsAsTogetherThenItsBs) {
  const model::LoraSettings all = settings(4, {LinearKind::Q, LinearKind::K, LinearKind::V, LinearKind::O,
                                               LinearKind::Gate, LinearKind::Up, LinearKind::Down});
  model::LoraSet lora(ctx(), small_config(24), all);
  ASSERT_EQ(lora.slots().size(), 14u);
  for (int64_t layer = 0; layer < 2; ++layer) {
    uint64_t last_a_end = 0, first_b = UINT64_MAX;
    for (const model::LoraSlot& s : lora.slots()) {
      if (s.layer != layer) continue;
      last_a_end = std::max<uint64_t>(last_a_end, s.a_offset + uint64_t(s.rank) * s.in);
      first_b = std::min<uint64_t>(first_b, s.b_offset);
    }
    EXPECT_LE(last_a_end, first_b) << "layer " << layer;
    EXPECT_EQ(lora.shared_input_run(layer, {LinearKind::Q, LinearKind::K, LinearKind::V}), 3u);
    EXPECT_EQ(lora.shared_input_run(layer, {LinearKind::Gate, LinearKind::Up}), 2u);
    const model::LoraSlot& q = *lora.find(layer, LinearKind::Q);
    EXPECT_EQ(lora.find(layer, LinearKind::V)->a_offset, q.a_offset + 2ull * q.rank * q.in);
  }
}

TEST_F(LoraLayout, SharedInputRunsStopAtAGapOrAMissingTarget) {
  // k not a target: q alone; q not a target: nothing.
  model::LoraSet qv(ctx(), small_config(24), settings(4, {LinearKind::Q, LinearKind::V, LinearKind::Up}));
  EXPECT_EQ(qv.shared_input_run(0, {LinearKind::Q, LinearKind::K, LinearKind::V}), 1u);
  EXPECT_EQ(qv.shared_input_run(0, {LinearKind::Gate, LinearKind::Up}), 0u);
  // rank * in = 3 * 25 is not a multiple of 4: each A is padded, so the A's are not one matrix.
  model::LoraSet padded(ctx(), small_config(25), settings(3, {LinearKind::Q, LinearKind::K, LinearKind::V}));
  EXPECT_EQ(padded.shared_input_run(1, {LinearKind::Q, LinearKind::K, LinearKind::V}), 1u);
}

TEST_F(LoraLayout, SlotOrderIsTheEarlierLayoutAndRoundTrips) {
  for (int64_t hidden : {24, 25}) {
    model::LoraSet lora(ctx(), small_config(hidden),
                        settings(3, {LinearKind::Q, LinearKind::K, LinearKind::O, LinearKind::Gate, LinearKind::Up,
                                     LinearKind::Down}));
    const uint64_t n = lora.parameter_count();
    // A params-layout vector with a distinct value in every tensor element, zero in the padding.
    std::vector<float> here(n, 0.0f);
    float next = 1.0f;
    for (const model::LoraSlot& s : lora.slots()) {
      for (uint64_t i = 0; i < uint64_t(s.rank) * s.in; ++i) here[s.a_offset + i] = next++;
      for (uint64_t i = 0; i < uint64_t(s.out) * s.rank; ++i) here[s.b_offset + i] = next++;
    }
    const std::vector<float> slot_order = lora.to_slot_order(here);
    // Slot order: each slot's A then B, from multiples of 4 floats, so the values come out in
    // the order they were numbered, with zeros only in the alignment gaps.
    uint64_t at = 0;
    float expect = 1.0f;
    for (const model::LoraSlot& s : lora.slots())
      for (uint64_t len : {uint64_t(s.rank) * s.in, uint64_t(s.out) * s.rank}) {
        for (uint64_t i = 0; i < len; ++i) ASSERT_EQ(slot_order[at + i], expect++) << "hidden " << hidden;
        for (uint64_t i = len; i % 4 != 0; ++i) EXPECT_EQ(slot_order[at + i], 0.0f);
        at += (len + 3) / 4 * 4;
      }
    EXPECT_EQ(at, n);
    EXPECT_EQ(lora.from_slot_order(slot_order), here);
    EXPECT_THROW(lora.to_slot_order(std::vector<float>(n + 1)), std::logic_error);
  }
}

}  // namespace
}  // namespace forja::test
