// Token embedding: gather rows of the table (formats.md 1.3 step 1; no sqrt(H) scaling).
// Double-precision reference.
#pragma once
#include <cstdint>

namespace forja::ref {

// y[tokens, hidden] = table[ids[t], :]; table [vocab, hidden]; ids [tokens].
// Throws std::out_of_range naming the position when an id is outside [0, vocab).
void embedding_forward(double* y, const int32_t* ids, const double* table, int64_t tokens,
                       int64_t vocab, int64_t hidden);

// dtable[vocab, hidden] += dy[t, :] scattered to row ids[t] (a parameter gradient: accumulates;
// forja keeps the embedding frozen, this exists for completeness and tests). Ids are validated.
void embedding_backward(double* dtable, const double* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t hidden);

}  // namespace forja::ref
