// Embedding reference. See embedding_ref.h.
#include "ops/ref/embedding_ref.h"

#include <stdexcept>
#include <string>

#include "ops/ref/check_ref.h"

namespace forja::ref {

namespace {

void check_ids(const char* func, const int32_t* ids, int64_t tokens, int64_t vocab) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      throw std::out_of_range(std::string("forja::ref::") + func + ": token id " +
                              std::to_string(ids[t]) + " at position " + std::to_string(t) +
                              " is outside [0, " + std::to_string(vocab) + ")");
    }
  }
}

}  // namespace

void embedding_forward(double* y, const int32_t* ids, const double* table, int64_t tokens,
                       int64_t vocab, int64_t hidden) {
  detail::require_dims("embedding_forward", {tokens, vocab, hidden});
  check_ids("embedding_forward", ids, tokens, vocab);
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = table + static_cast<int64_t>(ids[t]) * hidden;
    for (int64_t c = 0; c < hidden; ++c) y[t * hidden + c] = row[c];
  }
}

void embedding_backward(double* dtable, const double* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t hidden) {
  detail::require_dims("embedding_backward", {tokens, vocab, hidden});
  check_ids("embedding_backward", ids, tokens, vocab);
  for (int64_t t = 0; t < tokens; ++t) {
    double* row = dtable + static_cast<int64_t>(ids[t]) * hidden;
    for (int64_t c = 0; c < hidden; ++c) row[c] += dy[t * hidden + c];
  }
}

}  // namespace forja::ref
