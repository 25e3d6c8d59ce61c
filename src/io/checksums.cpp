#include "io/checksums.h"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>

#include "io/atomic_file.h"
#include "util/error.h"

namespace forja::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSumsFile = "SHA256SUMS";

struct DigestDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// Incremental SHA-256 through OpenSSL's EVP interface.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("OpenSSL: SHA-256 is not available");
  }
  void add(const void* data, size_t size) {
    if (EVP_DigestUpdate(ctx_.get(), data, size) != 1) throw std::runtime_error("OpenSSL: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &n) != 1) throw std::runtime_error("OpenSSL: SHA-256 final failed");
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; ++i) {
      out += digits[md[i] >> 4];
      out += digits[md[i] & 15];
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> ctx_;
};

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string sha256_of(const void* data, std::size_t size) {
  Sha256 h;
  h.add(data, size);
  return h.hex();
}

std::string sha256_of_file(const fs::path& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) throw UserError(file.string() + ": cannot be read for its checksum");
  Sha256 h;
  std::vector<char> buf(size_t(4) << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.add(buf.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw UserError(file.string() + ": read error while computing its checksum");
  return h.hex();
}

void write_sha256sums(const fs::path& dir, const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += sha256_of_file(dir / n) + "  " + n + "\n";
  write_file_atomic(dir / kSumsFile, text);
}

std::optional<std::string> verify_sha256sums(const fs::path& dir) {
  const fs::path sums = dir / kSumsFile;
  if (!fs::exists(sums)) return std::nullopt;
  std::ifstream in(sums);
  if (!in) return sums.string() + ": cannot be read";
  std::string line;
  int line_no = 0, files = 0;
  while (std::getline(in, line)) {
    ++line_no;
    // "<hex>  <name>" (two spaces: sha256sum's text mode)
    const std::string hex = line.substr(0, 64);
    if (line.size() < 67 || !is_hex64(hex) || line.compare(64, 2, "  ") != 0)
      return sums.string() + ":" + std::to_string(line_no) + ": not a sha256sum line; the checkpoint is damaged";
    const std::string name = line.substr(66);
    if (name.find('/') != std::string::npos || name == "." || name == "..")
      return sums.string() + ":" + std::to_string(line_no) + ": names a file outside the checkpoint";
    const fs::path file = dir / name;
    std::error_code ec;  // a name the filesystem refuses (too long, ...) is as missing as an absent file
    if (!fs::is_regular_file(file, ec)) return file.string() + ": missing (listed in " + sums.string() + ")";
    if (sha256_of_file(file) != hex) return file.string() + ": its SHA-256 differs from " + sums.string();
    ++files;
  }
  if (files == 0) return sums.string() + ": lists no file; the checkpoint is damaged";
  return std::nullopt;
}

}  // namespace forja::io
