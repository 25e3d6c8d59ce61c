#include "train/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "io/atomic_file.h"
#include "util/error.h"
#include "util/kill_point.h"

namespace forja::train {

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t resume_step) : path_(path) {
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      // a torn last line (killed mid-write) does not parse: drop it
      const auto row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_discarded() || !row.is_object() || !row.contains("step")) continue;
      if (row["step"].is_number_integer() && row["step"].get<int64_t>() <= resume_step) kept += line + "\n";
    }
    io::write_file_atomic(path, kept);
  }
  f_ = std::fopen(path.c_str(), "a");
  if (!f_) throw OutputError(path.string() + ": cannot open for writing");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::append(const nlohmann::json& row) {
  std::string line = row.dump() + "\n";
  if (kill_points_enabled()) {
    // The kill-anywhere test: a row torn half-way, as a kill during the write would leave it.
    const std::size_t half = line.size() / 2;
    if (std::fwrite(line.data(), 1, half, f_) != half || std::fflush(f_) != 0)
      throw OutputError(path_.string() + ": cannot append a row (" + std::strerror(errno) + ")");
    kill_point("a metrics row half-written");
    line.erase(0, half);
  }
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw OutputError(path_.string() + ": cannot append a row (" + std::strerror(errno) + ")");
}

}  // namespace forja::train
