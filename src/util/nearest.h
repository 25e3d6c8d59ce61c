// "Did you mean ...?" for unknown flags and config keys: the candidate closest to what was typed
// by edit distance, when it is close enough to be a plausible typo.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace forja {

// Levenshtein distance (insertions, deletions, substitutions each cost 1).
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The nearest candidate, or "" when none is within a third of the typed length (at least 2 edits
// are always allowed), so that unrelated words get no suggestion.
inline std::string nearest_name(std::string_view typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(typed, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace forja
