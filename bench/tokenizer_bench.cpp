// Tokenizer speed benchmark, a stand-alone program (no CMake target builds it; see below).
// Encodes every {"text"} document of a JSONL file on one thread, like make_fixtures.py --bench
// does with Hugging Face tokenizers, and prints MB/s, the token count and the sha256 of all ids
// (little-endian int32) so both can be compared for exactness over the whole text.
//
// Build (from the repo root; see docs/benchmarks.md, "Tokenizer"):
//   g++ -std=c++20 -O2 -DNDEBUG -Isrc bench/tokenizer_bench.cpp src/data/tokenizer.cpp \
//       src/data/utf8.cpp -o build-data/tokenizer_bench -Wl,-Bstatic -lpcre2-8 -lutf8proc \
//       -Wl,-Bdynamic -static-libstdc++ -static-libgcc
// Run: build-data/tokenizer_bench MODEL_DIR BENCH.jsonl [HF_BENCH.json]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace {

// SHA-256 (FIPS 180-4), enough for a checksum of the ids.
struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf[64];
  size_t fill = 0;
  uint64_t bits = 0;
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 |
             uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    bits += uint64_t(n) * 8;
    while (n) {
      const size_t take = std::min(n, 64 - fill);
      std::memcpy(buf + fill, p, take);
      fill += take, p += take, n -= take;
      if (fill == 64) block(buf), fill = 0;
    }
  }
  std::string hex() {
    const uint64_t total = bits;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(total >> (56 - 8 * i));
    update(len, 8);
    std::string s;
    char x[9];
    for (uint32_t v : h) std::snprintf(x, sizeof x, "%08x", v), s += x;
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR BENCH.jsonl [HF_BENCH.json]\n", argv[0]);
    return 2;
  }
  try {
    auto t_load = std::chrono::steady_clock::now();
    const auto tok = forja::data::Tokenizer::load(argv[1]);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::vector<std::string> docs;
    size_t bytes = 0;
    std::ifstream in(argv[2], std::ios::binary);
    for (std::string line; std::getline(in, line);) {
      docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += docs.back().size();
    }
    auto cpu_now = [] {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    };
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    std::vector<std::vector<int32_t>> all(docs.size());
    for (size_t i = 0; i < docs.size(); ++i) all[i] = tok.encode(docs[i]);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_now() - c0;
    Sha256 sha;
    size_t tokens = 0;
    for (const auto& ids : all) {
      static_assert(std::endian::native == std::endian::little);
      sha.update(ids.data(), ids.size() * sizeof(int32_t));
      tokens += ids.size();
    }
    const std::string digest = sha.hex();
    std::printf(
        "{\"tokenizer\": \"%s\", \"load_seconds\": %.3f, \"documents\": %zu, \"bytes\": %zu, "
        "\"seconds\": %.3f, \"MB_per_s\": %.3f, \"cpu_seconds\": %.3f, \"tokens\": %zu, "
        "\"sha256_ids\": \"%s\"}\n",
        argv[1], load_s, docs.size(), bytes, sec, double(bytes) / sec / 1e6, cpu, tokens,
        digest.c_str());
    if (argc > 3) {
      std::ifstream hf(argv[3]);
      const auto j = nlohmann::json::parse(hf);
      const auto& r = j.at("encode_loop");
      const bool same = r.at("sha256_ids").get<std::string>() == digest &&
                        r.at("tokens").get<size_t>() == tokens;
      std::printf("HF tokenizers %s: %.3f MB/s (%.3f s); ids %s\n",
                  j.at("tokenizers_version").get<std::string>().c_str(),
                  r.at("MB_per_s").get<double>(), r.at("seconds").get<double>(),
                  same ? "IDENTICAL" : "DIFFER");
      return same ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
