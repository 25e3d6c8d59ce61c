// Reading a run directory back (metrics.jsonl, config.yaml, run.json) and writing run.json.
#include "train/run_record.h"

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/atomic_file.h"
#include "util/error.h"

namespace forja::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw UserError(p.string() + ": cannot open; check permissions");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string string_field(const json& j, const char* key, const fs::path& file) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string())
    throw UserError(file.string() + ": \"" + key + "\" is not a string; the file was not written by forja train "
                    "(delete it and forja report will leave the run's device out)");
  return j[key].get<std::string>();
}

}  // namespace

void write_run_status(const fs::path& out, RunStatus s) {
  s.updated = utc_now();
  const json j = {{"device", s.device}, {"device_type", s.device_type}, {"driver", s.driver},
                  {"state", s.state},   {"step", s.step},               {"total_steps", s.total_steps},
                  {"updated", s.updated}};
  io::write_file_atomic(out / "run.json", j.dump(2) + "\n");
}

const std::vector<std::pair<double, double>>* RunRecord::series(const std::string& metric) const {
  auto it = metrics.find(metric);
  return it == metrics.end() ? nullptr : &it->second;
}

RunRecord read_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError(dir.string() + ": no such run directory; give the --out directory of a forja train run");
  RunRecord r;
  r.dir = dir;
  r.name = fs::absolute(dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();

  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics, ec))
    throw UserError(metrics.string() + ": not found; give the --out directory of a forja train run (it writes "
                    "metrics.jsonl from its first logged step)");
  const std::string text = read_text(metrics);
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  const bool ends_with_newline = !text.empty() && text.back() == '\n';
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = metrics.string() + ":" + std::to_string(line_no);
    const bool last = in.peek() == std::char_traits<char>::eof();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json row = json::parse(line, nullptr, false);
    if (row.is_discarded() && last && !ends_with_newline) {
      // MetricsLog writes whole lines; one without its newline was cut by a kill or a full disk.
      r.notes.push_back(where + ": incomplete last line (the run was stopped while writing it); left out");
      break;
    }
    if (row.is_discarded() || !row.is_object())
      throw UserError(where + ": not a JSON object; metrics.jsonl holds one row per line as forja train writes "
                      "them (restore the file, or delete the line)");
    if (!row.contains("step") || !row["step"].is_number_integer() || row["step"].get<int64_t>() < 0)
      throw UserError(where + ": no integer \"step\" >= 0; metrics.jsonl holds one row per line as forja train "
                      "writes them (restore the file, or delete the line)");
    const double step = double(row["step"].get<int64_t>());
    for (auto it = row.begin(); it != row.end(); ++it) {
      if (it.key() == "step" || it->is_null()) continue;
      if (!it->is_number())
        throw UserError(where + ": \"" + it.key() + "\" is " + std::string(it->type_name()) +
                        ", not a number; restore the file, or delete the line");
      r.metrics[it.key()].emplace_back(step, it->get<double>());
    }
    ++r.rows;
  }

  if (fs::is_regular_file(dir / "config.yaml", ec)) r.config_yaml = read_text(dir / "config.yaml");
  else r.notes.push_back((dir / "config.yaml").string() + ": not found; the settings are not shown");

  const fs::path status = dir / "run.json";
  if (fs::is_regular_file(status, ec)) {
    const json j = json::parse(read_text(status), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw UserError(status.string() + ": not valid JSON; it is rewritten by forja train (delete it and forja "
                      "report will leave the run's device out)");
    RunStatus s;
    s.device = string_field(j, "device", status);
    s.device_type = string_field(j, "device_type", status);
    s.driver = string_field(j, "driver", status);
    s.state = string_field(j, "state", status);
    s.updated = string_field(j, "updated", status);
    if (j.contains("step") && j["step"].is_number_integer()) s.step = j["step"].get<int64_t>();
    if (j.contains("total_steps") && j["total_steps"].is_number_integer())
      s.total_steps = j["total_steps"].get<int64_t>();
    r.status = s;
  } else {
    r.notes.push_back(status.string() + ": not found (a run of an older forja); the device is not known");
  }
  return r;
}

}  // namespace forja::train
