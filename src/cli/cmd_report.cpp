// forja report: rebuilds a run's training report (train/report.h) from its directory, or
// compares several runs on one page.
//   forja report RUN                          writes RUN/report.html (what forja train writes)
//   forja report RUN1 RUN2 ... --out FILE     one page, the runs' curves overlaid
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "train/report.h"
#include "util/error.h"

namespace {

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
};

int run_report(const ReportArgs& a) {
  namespace fs = std::filesystem;
  if (a.runs.empty()) throw forja::UserError("forja report: give one or more run directories (forja train's --out)");
  fs::path out = a.out;
  if (out.empty()) {
    // Several runs have no one directory the page belongs to; do not guess where to write it.
    if (a.runs.size() > 1)
      throw forja::UserError("forja report: " + std::to_string(a.runs.size()) +
                             " runs compared need --out FILE (for example --out compare.html)");
    out = fs::path(a.runs[0]) / "report.html";
  }
  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw forja::UserError("--out " + out.string() + ": is a directory; give a file name such as " +
                           (out / "report.html").string());
  std::vector<forja::train::RunRecord> runs;
  for (const auto& r : a.runs) runs.push_back(forja::train::read_run(r));
  forja::train::write_report(out, runs);
  std::fprintf(stderr, "forja: wrote %s\n", out.c_str());
  return 0;
}

forja::cli::CommandRegistration report_registration{"report", 15, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Rebuild a run's report.html, or compare several runs on one page");
  auto a = std::make_shared<ReportArgs>();
  cmd->add_option("runs", a->runs, "Run directories (forja train's --out)")->required();
  cmd->add_option("--out", a->out, "HTML file to write (default RUN/report.html; needed for several runs)");
  return [a, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    return run_report(*a);
  };
}};

}  // namespace
