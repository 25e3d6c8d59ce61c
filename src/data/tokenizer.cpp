// Encoding and decoding with a parsed tokenizer.json (Tokenizer::Impl, read by
// tokenizer_parse.cpp): added tokens, pre-tokenizers, BPE merges, decoders; see tokenizer.h for
// the pipelines and docs/formats.md 5.1 and 5.4.
#include "data/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <queue>
#include <span>

#include "data/tokenizer_impl.h"
#include "data/utf8.h"
#include "util/error.h"

namespace forja::data {
namespace {

using detail::DecodeStep;
using detail::PairMap;
using detail::Pcre2MatchDataDeleter;

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}

// s with every occurrence of `from` (not empty) replaced by `to`.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  for (size_t p; (p = s.find(from, at)) != std::string_view::npos; at = p + from.size()) {
    out.append(s.substr(at, p - at));
    out.append(to);
  }
  out.append(s.substr(at));
  return out;
}

}  // namespace

// The merge loop shared by both families (tokenizers' Word::merge_all): repeatedly merge the
// adjacent pair of lowest rank, leftmost on ties, until no pair is in the merge table. ids[0..n)
// are the symbols; the result is written back to ids[0..return value). lens (may be null) holds
// each symbol's length in normalised bytes and is merged alongside.
size_t Tokenizer::Impl::merge_all(int32_t* ids, uint32_t* lens, size_t n) const {
  if (n < 2) return n;
  constexpr int32_t kNone = INT32_MAX;
  if (n <= 128) {
    // Short words: keep the rank of each adjacent pair, merge the lowest (leftmost on ties).
    int32_t ranks[128], merged[128];
    size_t len = n;
    auto rank_at = [&](size_t i) {
      const PairMap::Entry* e = merges.find(ids[i], ids[i + 1]);
      ranks[i] = e ? e->rank : kNone;
      merged[i] = e ? e->merged : -1;
    };
    for (size_t i = 0; i + 1 < len; ++i) rank_at(i);
    while (len > 1) {
      size_t best = 0;
      int32_t best_rank = kNone;
      for (size_t i = 0; i + 1 < len; ++i)
        if (ranks[i] < best_rank) best_rank = ranks[i], best = i;
      if (best_rank == kNone) break;
      ids[best] = merged[best];
      if (lens) lens[best] += lens[best + 1];
      for (size_t i = best + 1; i + 1 < len; ++i) {
        ids[i] = ids[i + 1];
        if (lens) lens[i] = lens[i + 1];
        ranks[i] = ranks[i + 1];
        merged[i] = merged[i + 1];
      }
      --len;
      if (best > 0) rank_at(best - 1);
      if (best + 1 < len) rank_at(best);
    }
    return len;
  }
  // Long words: a heap of candidate merges over a linked list of symbols, O(n log n).
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> sym(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = Sym{ids[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  struct Cand {
    int32_t rank, pos, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    if (const PairMap::Entry* e = merges.find(sym[size_t(pos)].id, sym[size_t(nx)].id))
      heap.push(Cand{e->rank, pos, e->merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = sym[size_t(c.pos)];
    if (!s.alive || s.next < 0) continue;
    Sym& nx = sym[size_t(s.next)];
    const PairMap::Entry* e = merges.find(s.id, nx.id);
    if (!e || e->merged != c.merged || e->rank != c.rank) continue;  // stale candidate
    s.id = c.merged;
    if (lens) lens[size_t(c.pos)] += lens[size_t(s.next)];
    nx.alive = false;
    s.next = nx.next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  size_t len = 0;
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) {
    ids[len] = sym[size_t(i)].id;
    if (lens) lens[len] = lens[size_t(i)];  // len <= i: compacting forwards is safe
    ++len;
  }
  return len;
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n <= 128) {
    int32_t ids[128];
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[uint8_t(piece[i])];
    out.insert(out.end(), ids, ids + merge_all(ids, nullptr, n));
    return;
  }
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = byte_id[uint8_t(piece[i])];
  ids.resize(merge_all(ids.data(), nullptr, n));
  out.insert(out.end(), ids.begin(), ids.end());
}

// SentencePiece-style word (tokenizers' BPE::merge_word): each character is its vocabulary id;
// one that is not in the vocabulary becomes its bytes' <0xNN> tokens when byte_fallback is on
// and all of them exist, else <unk> (consecutive ones fused into one with fuse_unk). As in
// tokenizers, a pending <unk> is only flushed by the next in-vocabulary character, so byte
// tokens that follow it come first (only files lacking some <0xNN> tokens can show this).
void Tokenizer::Impl::sp_word(std::string_view piece, std::vector<int32_t>& out,
                              std::vector<uint32_t>* lens_out) const {
  std::vector<int32_t> ids;
  std::vector<uint32_t> lens;
  ids.reserve(piece.size());
  lens.reserve(piece.size());
  int32_t unk_len = 0;  // > 0: an <unk> of that many bytes is pending
  auto flush_unk = [&] {
    if (unk_len > 0) {
      ids.push_back(unk_id);
      lens.push_back(uint32_t(unk_len));
      unk_len = 0;
    }
  };
  for (size_t i = 0; i < piece.size();) {
    const size_t n = std::max<size_t>(1, utf8_sequence_length(piece, i));
    const std::string_view ch = piece.substr(i, n);
    i += n;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      flush_unk();
      ids.push_back(it->second);
      lens.push_back(uint32_t(n));
      continue;
    }
    if (byte_fallback &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return fallback_id[uint8_t(c)] >= 0; })) {
      for (char c : ch) {
        ids.push_back(fallback_id[uint8_t(c)]);
        lens.push_back(1);
      }
      continue;
    }
    if (unk_id < 0)
      throw UserError(origin + ": the character \"" + std::string(ch) +
                      "\" is not in the vocabulary and the file has neither byte_fallback tokens "
                      "for it nor an unk_token; this tokenizer.json cannot encode the text");
    if (unk_len > 0 && !fuse_unk) flush_unk();
    unk_len += int32_t(n);
  }
  flush_unk();
  const size_t len = merge_all(ids.data(), lens.data(), ids.size());
  out.insert(out.end(), ids.begin(), ids.begin() + ptrdiff_t(len));
  if (lens_out) lens_out->insert(lens_out->end(), lens.begin(), lens.begin() + ptrdiff_t(len));
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  constexpr size_t kMaxCached = 64;
  const bool cacheable = piece.size() <= kMaxCached;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), cache_ids.begin() + it->second.first,
                 cache_ids.begin() + it->second.first + it->second.second);
      return;
    }
  }
  const size_t start = out.size();
  bool done = false;
  if (ignore_merges) {
    std::string mapped;
    if (!sentencepiece) {
      mapped.reserve(piece.size() * 2);
      for (char c : piece) mapped += byte_str[uint8_t(c)];
    }
    auto it = vocab.find(sentencepiece ? piece : std::string_view(mapped));
    if (it != vocab.end()) {
      out.push_back(it->second);
      done = true;
    }
  }
  if (!done) {
    if (sentencepiece)
      sp_word(piece, out, nullptr);
    else
      bpe(piece, out);
  }
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= (1u << 20) || cache_ids.size() >= (1u << 24)) {
      cache.clear();
      cache_ids.clear();
    }
    const auto off = uint32_t(cache_ids.size());
    cache_ids.insert(cache_ids.end(), out.begin() + ptrdiff_t(start), out.end());
    cache.emplace(std::string(piece), std::make_pair(off, uint32_t(out.size() - start)));
  }
}

void Tokenizer::Impl::emit_piece(std::string_view piece, size_t start,
                                 std::vector<int32_t>& out, Track* track,
                                 const std::vector<std::pair<size_t, size_t>>* map) const {
  const size_t first = out.size();
  encode_piece(piece, out);
  if (!track) return;
  // Each token's bytes are consecutive in the piece; map normalised offsets back to raw ones
  // through the (normalised start, raw start) list of sub-segments when NFC changed the text.
  size_t off = start;
  for (size_t k = first; k < out.size(); ++k) {
    size_t raw = off;
    if (map) {
      auto it = std::upper_bound(map->begin(), map->end(), std::make_pair(off, SIZE_MAX));
      --it;
      raw = it->second + (off - it->first);
      if (it + 1 != map->end()) raw = std::min(raw, (it + 1)->second - 1);
    }
    track->starts->push_back(uint32_t(raw));
    off += id_to_bytes[size_t(out[k])].size();
  }
}

void Tokenizer::Impl::encode_segment(std::string_view text, size_t raw_base,
                                     std::vector<int32_t>& out, pcre2_match_data* md,
                                     Track* track) const {
  if (text.empty()) return;
  // NFC. Text whose code points are all below U+0300 (no lead byte >= 0xCC) is already NFC.
  std::string normalized;
  std::vector<std::pair<size_t, size_t>> offset_map;  // (normalised offset, raw offset)
  bool changed = false;
  if (nfc) {
    bool may_change = false;
    for (char c : text)
      if (uint8_t(c) >= 0xCC) {
        may_change = true;
        break;
      }
    if (may_change) {
      // With tracking, each part is normalised on its own so that tokens keep their part.
      std::vector<size_t> subs = {0};
      if (track)
        for (size_t c : *track->cuts)
          if (c > raw_base && c < raw_base + text.size()) subs.push_back(c - raw_base);
      subs.push_back(text.size());
      for (size_t k = 0; k + 1 < subs.size(); ++k) {
        const std::string_view sub = text.substr(subs[k], subs[k + 1] - subs[k]);
        utf8proc_uint8_t* buf = nullptr;
        const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(sub.data()),
                                      utf8proc_ssize_t(sub.size()), &buf,
                                      utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (len < 0) throw UserError(origin + ": NFC normalisation failed: " +
                                     utf8proc_errmsg(len) + "; the text is not valid UTF-8");
        offset_map.emplace_back(normalized.size(), raw_base + subs[k]);
        normalized.append(reinterpret_cast<char*>(buf), size_t(len));
        std::free(buf);
      }
      offset_map.emplace_back(normalized.size(), raw_base + text.size());
      changed = normalized != text;
      if (changed) text = normalized;
    }
  }
  const std::vector<std::pair<size_t, size_t>>* map = changed ? &offset_map : nullptr;
  const size_t base = map ? 0 : raw_base;  // offsets below are normalised ones when mapped
  std::string prefixed;
  size_t shift = 0;
  if (prefix_space && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
    shift = 1;
  }
  auto piece_at = [&](size_t s, size_t e) {
    const size_t start = s >= shift ? s - shift : 0;
    emit_piece(text.substr(s, e - s), base + start, out, track, map);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;  // end of the last piece emitted
  size_t at = 0;   // where to search from
  while (at < text.size()) {
    const int rc = pcre2_match(regex.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK, md,
                               nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(origin + ": pre-tokenizer regex failed: " +
                               reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // empty match: step one character (the patterns in use never do this)
      at = e + std::max<size_t>(1, utf8_sequence_length(text, e));
      continue;
    }
    if (s > pos) piece_at(pos, s);  // the gap before the match: Isolated keeps it
    piece_at(s, e);
    pos = at = e;
  }
  if (pos < text.size()) piece_at(pos, text.size());
}

// One segment of a SentencePiece-style file (the text between added tokens, starting at raw
// offset raw_base): the normalizer's Prepend/Replace steps, then Metaspace, then BPE per piece.
// map[i] is the raw offset of normalised byte i, so that tracked tokens find their part.
void Tokenizer::Impl::encode_segment_sp(std::string_view text, size_t raw_base,
                                        std::vector<int32_t>& out, Track* track) const {
  if (text.empty()) return;
  std::string norm(text);
  std::vector<uint32_t> map(text.size());
  for (size_t i = 0; i < map.size(); ++i) map[i] = uint32_t(raw_base + i);
  // Replace `from` by `to` everywhere; the bytes of `to` map to where `from` began.
  auto replace = [&](std::string_view from, std::string_view to) {
    if (norm.find(from) == std::string::npos) return;
    std::string s;
    std::vector<uint32_t> m;
    s.reserve(norm.size() + norm.size() / 2);
    m.reserve(s.capacity());
    for (size_t i = 0; i < norm.size();) {
      if (norm.compare(i, from.size(), from) == 0) {
        s.append(to);
        m.insert(m.end(), to.size(), map[i]);
        i += from.size();
      } else {
        s.push_back(norm[i]);
        m.push_back(map[i]);
        ++i;
      }
    }
    norm.swap(s);
    map.swap(m);
  };
  auto prepend = [&](std::string_view p) {
    norm.insert(0, p);
    map.insert(map.begin(), p.size(), map.empty() ? uint32_t(raw_base) : map.front());
  };
  for (const NormStep& step : sp_normalizer) {
    if (step.prepend) {
      if (!norm.empty()) prepend(step.to);  // tokenizers' Prepend skips empty text
    } else {
      replace(step.from, step.to);
    }
  }
  std::vector<std::pair<size_t, size_t>> pieces;  // [start, end) in norm
  if (metaspace) {
    replace(" ", metaspace_replacement);
    // "first": only the segment that starts the text (tokenizers checks the segment's offset
    // in the original text), and never twice.
    const bool want = metaspace_prepend == Prepend::always ||
                      (metaspace_prepend == Prepend::first && raw_base == 0);
    if (want && norm.compare(0, metaspace_replacement.size(), metaspace_replacement) != 0)
      prepend(metaspace_replacement);
    if (metaspace_split) {  // split before every replacement (MergedWithNext)
      size_t begin = 0;
      for (size_t p = norm.find(metaspace_replacement, 1); p != std::string::npos;
           p = norm.find(metaspace_replacement, p + 1)) {
        pieces.emplace_back(begin, p);
        begin = p;
      }
      pieces.emplace_back(begin, norm.size());
    }
  }
  if (pieces.empty()) pieces.emplace_back(0, norm.size());
  std::vector<uint32_t> lens;
  for (const auto& [b, e] : pieces) {
    if (e == b) continue;
    const std::string_view piece = std::string_view(norm).substr(b, e - b);
    const size_t first = out.size();
    encode_piece(piece, out);
    if (!track) continue;
    // Token lengths follow from the ids, except for <unk>, whose length the word knows.
    lens.clear();
    bool has_unk = false;
    for (size_t k = first; k < out.size(); ++k) {
      has_unk |= out[k] == unk_id;
      lens.push_back(norm_len[size_t(out[k])]);
    }
    if (has_unk) {
      out.resize(first);
      lens.clear();
      sp_word(piece, out, &lens);
    }
    size_t off = b;
    for (uint32_t len : lens) {
      track->starts->push_back(map[std::min(off, map.size() - 1)]);
      off += len;
    }
  }
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out,
                                  Track* track) const {
  if (const size_t bad = utf8_first_invalid(text); bad != std::string_view::npos)
    throw UserError("text is not valid UTF-8 (byte " + std::to_string(bad) +
                    "); fix the encoding of the input");
  std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> md(
      regex ? pcre2_match_data_create_from_pattern(regex.get(), nullptr) : nullptr);
  auto segment = [&](size_t start, size_t len) {
    if (sentencepiece)
      encode_segment_sp(text.substr(start, len), start, out, track);
    else
      encode_segment(text.substr(start, len), start, out, md.get(), track);
  };
  // Cut out added tokens: at the leftmost position where one matches, the longest one.
  size_t seg_start = 0, i = 0;
  const size_t n = text.size();
  while (i < n && !added.empty()) {
    if (!added_first_byte[uint8_t(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    size_t hit_len = 0;
    for (size_t len : added_lengths) {
      if (i + len > n) continue;
      auto it = added_by_content.find(text.substr(i, len));
      if (it != added_by_content.end()) {
        hit = &added[it->second];
        hit_len = len;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t s = i, e = i + hit_len;
    if (hit->single_word && ((s > 0 && is_word_byte(uint8_t(text[s - 1]))) ||
                             (e < n && is_word_byte(uint8_t(text[e]))))) {
      i = e;  // not a whole word: leave it to the BPE
      continue;
    }
    if (hit->lstrip)
      while (s > seg_start && is_ascii_space(text[s - 1])) --s;
    if (hit->rstrip)
      while (e < n && is_ascii_space(text[e])) ++e;
    segment(seg_start, s - seg_start);
    out.push_back(hit->id);
    if (track) track->starts->push_back(uint32_t(i));
    seg_start = i = e;
  }
  segment(seg_start, text.size() - seg_start);
}

// tokenizers' decode for a SentencePiece-style file: the strings of the ids (special ones dropped
// first when asked), each decoder step over the whole list in order, then concatenation.
std::string Tokenizer::Impl::decode_sp(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids)
    if (!skip_special || !(id_flags[size_t(id)] & 4)) toks.push_back(id_to_token[size_t(id)]);
  if (!has_decoder) {  // tokenizers joins the token strings with spaces
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  auto first_char = [](std::string_view s, size_t i, size_t* len) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    utf8proc_ssize_t(s.size() - i), &cp);
    *len = n > 0 ? size_t(n) : 1;
    return char32_t(cp);
  };
  for (const DecodeStep& step : decoder) {
    switch (step.kind) {
      case DecodeStep::Kind::replace:
        for (auto& t : toks) t = replace_all(t, step.from, step.to);
        break;
      case DecodeStep::Kind::byte_fallback: {
        // A run of <0xNN> tokens becomes its bytes if they are valid UTF-8, else one U+FFFD per
        // token (not per maximal subpart: tokenizers' ByteFallback).
        std::vector<std::string> next;
        std::string run;
        size_t run_tokens = 0;
        auto flush = [&] {
          if (!run_tokens) return;
          if (utf8_first_invalid(run) == std::string_view::npos) {
            next.push_back(run);
          } else {
            for (size_t k = 0; k < run_tokens; ++k) next.emplace_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_tokens = 0;
        };
        for (auto& t : toks) {
          unsigned v = 0;
          if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
              std::isxdigit(uint8_t(t[3])) && std::isxdigit(uint8_t(t[4])) &&
              std::sscanf(t.c_str() + 3, "%2x", &v) == 1) {
            run.push_back(char(v));
            ++run_tokens;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(next);
        break;
      }
      case DecodeStep::Kind::fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecodeStep::Kind::strip:
        for (auto& t : toks) {
          size_t b = 0, len = 0;
          for (size_t k = 0; k < step.start && b < t.size(); ++k) {
            if (first_char(t, b, &len) != step.strip_char) break;
            b += len;
          }
          size_t e = t.size();
          for (size_t k = 0; k < step.stop && e > b; ++k) {
            size_t start = e - 1;  // back up to the last character's lead byte
            while (start > b && (uint8_t(t[start]) & 0xC0) == 0x80) --start;
            if (first_char(t, start, &len) != step.strip_char) break;
            e = start;
          }
          t = t.substr(b, e - b);
        }
        break;
      case DecodeStep::Kind::metaspace:
        // Every replacement character becomes a space, except in the first string, where
        // (unless prepend_scheme is "never") all of them are dropped.
        for (size_t i = 0; i < toks.size(); ++i)
          toks[i] = replace_all(toks[i], step.from, i == 0 && step.metaspace_prepends ? "" : " ");
        break;
    }
  }
  std::string s;
  for (const auto& t : toks) s += t;
  return s;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  impl_->encode_text(text, out, nullptr);
}

void Tokenizer::encode_parts(std::span<const std::string_view> parts, std::vector<int32_t>& ids,
                             std::vector<int32_t>& part_of_token) const {
  std::string joined;
  std::vector<size_t> cuts;  // raw offset where each part begins
  for (const auto& p : parts) {
    cuts.push_back(joined.size());
    joined += p;
  }
  std::vector<uint32_t> starts;
  Impl::Track track{&starts, &cuts};
  const size_t first = ids.size();
  impl_->encode_text(joined, ids, &track);
  for (size_t k = 0; k < ids.size() - first; ++k) {
    // The part holding the token's first byte (the last part that begins at or before it).
    const auto it = std::upper_bound(cuts.begin(), cuts.end(), size_t(starts[k]));
    part_of_token.push_back(int32_t(it - cuts.begin()) - 1);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  for (int32_t id : ids)
    if (id < 0 || id >= impl_->vocab_size || !(impl_->id_flags[size_t(id)] & 1))
      throw UserError("token id " + std::to_string(id) + " is not in the vocabulary of " +
                      impl_->origin + " (ids 0.." + std::to_string(impl_->vocab_size - 1) + ")");
  if (impl_->sentencepiece) return impl_->decode_sp(ids, skip_special);
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && (impl_->id_flags[size_t(id)] & 4)) continue;
    bytes += impl_->id_to_bytes[size_t(id)];
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end())
    return impl_->added[it->second].id;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size)
    throw UserError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                    impl_->origin);
  return impl_->id_to_token[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && (impl_->id_flags[size_t(id)] & 4);
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }
const std::string& Tokenizer::origin() const { return impl_->origin; }

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->config.bos_token ? token_id(*impl_->config.bos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->config.eos_token ? token_id(*impl_->config.eos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->config.pad_token ? token_id(*impl_->config.pad_token) : std::nullopt;
}

}  // namespace forja::data
