// The training report end to end: a short real `forja train` run (the tiny example model, with an
// eval split) writes OUT/report.html; Debian's chromium renders it headless to a PNG and dumps the
// DOM after the page's script ran, and the DOM must hold one plotted point per metrics.jsonl
// value, at the coordinates the plot's axes give it. `forja report` rebuilds the same page and
// compares two runs (one with HTML-special characters in its name); bad input exits 2.
//
// The browser: $FORJA_CHROMIUM, else chromium or chromium-browser on PATH, else the one CMake
// found at configure time. Without one the browser test is skipped, unless it is required:
// FORJA_REQUIRE_BROWSER=1, or CMake found chromium (scripts/setup installs it, so CI has it);
// then a missing browser fails it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "support/cli_runner.h"
#include "support/example_run.h"
#include "train/example.h"

namespace forja::train {
namespace {
namespace fs = std::filesystem;

using forja::test::program;

forja::test::ShellResult run(const std::string& args) {
  return forja::test::run_shell(program() + " " + args + " 2>&1");
}

std::string sh(const std::string& p) {  // quoted for the shell; the test's paths hold no single quote
  return "'" + p + "'";
}
std::string sh(const fs::path& p) { return sh(p.string()); }

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

using Setup = forja::test::ExampleFiles;
const Setup& setup() {
  static const Setup files = forja::test::make_example_files("report_cli", 3);
  return files;
}

// A short run with evaluation and checkpoints; every step logged.
fs::path train(const std::string& name, const std::string& extra) {
  const Setup& s = setup();
  const fs::path out = s.dir / name;
  const auto r = run("train --model " + sh(s.model) + " --data " + sh(s.data) + " --out " + sh(out) +
                     " --seq-len 48 --batch-size 4 --grad-accum 1 --log-every 1 --eval-split 0.1 --eval-every 3"
                     " --save-every 3 --lora-rank 4 " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return out;
}

// metric -> (step, value) of metrics.jsonl, for the metrics the report plots.
using Series = std::map<std::string, std::vector<std::pair<double, double>>>;
Series metrics_of(const fs::path& out) {
  Series m;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    for (const char* k : {"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "gpu_mem_gib"})
      if (j.contains(k) && j[k].is_number())
        m[k].emplace_back(j["step"].get<double>(), j[k].get<double>());
  }
  return m;
}

std::map<std::string, std::string> attributes(const std::string& tag) {
  std::map<std::string, std::string> a;
  static const std::regex attr(R"re(([\w:-]+)="([^"]*)")re");
  for (auto it = std::sregex_iterator(tag.begin(), tag.end(), attr); it != std::sregex_iterator(); ++it)
    a[(*it)[1]] = (*it)[2];
  return a;
}

double number(const std::map<std::string, std::string>& a, const std::string& key) {
  auto it = a.find(key);
  EXPECT_NE(it, a.end()) << key;
  return it == a.end() ? NAN : std::stod(it->second);
}

// Checks every plot of the DOM against metrics.jsonl: the points of each series, in order, with
// their step, value and position. Returns the number of points checked.
size_t check_plots(const std::string& dom, const Series& want, const std::string& run_name) {
  static const std::regex svg_re(R"re(<svg class="plot"[^>]*>[\s\S]*?</svg>)re");
  static const std::regex series_re(R"re(<g class="series"[^>]*>[\s\S]*?</g>)re");
  static const std::regex circle_re(R"re(<circle class="pt"[^>]*>)re");
  std::map<std::string, bool> plots_seen;
  size_t checked = 0;
  for (auto p = std::sregex_iterator(dom.begin(), dom.end(), svg_re); p != std::sregex_iterator(); ++p) {
    const std::string svg = p->str();
    const auto frame = attributes(svg.substr(0, svg.find('>')));
    const std::string metric = frame.at("data-metric");
    plots_seen[metric] = true;
    const double x0 = number(frame, "data-x-min"), x1 = number(frame, "data-x-max");
    const double y0 = number(frame, "data-y-min"), y1 = number(frame, "data-y-max");
    const double left = number(frame, "data-left"), right = number(frame, "data-right");
    const double top = number(frame, "data-top"), bottom = number(frame, "data-bottom");
    // The series this plot must hold: its metric, and on the loss plot the eval loss too.
    std::map<std::string, bool> expected = {{metric, true}};
    if (metric == "loss" && want.count("eval_loss")) expected["eval_loss"] = true;
    std::map<std::string, bool> found;
    for (auto s = std::sregex_iterator(svg.begin(), svg.end(), series_re); s != std::sregex_iterator(); ++s) {
      const std::string g = s->str();
      const auto ga = attributes(g.substr(0, g.find('>')));
      if (ga.at("data-run") != run_name) continue;
      const std::string series = ga.at("data-series");
      found[series] = true;
      EXPECT_TRUE(expected.count(series)) << metric << " plot holds " << series;
      if (!want.count(series)) continue;
      const auto& rows = want.at(series);
      size_t k = 0;
      for (auto c = std::sregex_iterator(g.begin(), g.end(), circle_re); c != std::sregex_iterator(); ++c, ++k) {
        const auto ca = attributes(c->str());
        if (k >= rows.size()) {
          ADD_FAILURE() << metric << "/" << series << ": more points than metrics.jsonl rows";
          break;
        }
        const auto [step, value] = rows[k];
        EXPECT_EQ(number(ca, "data-step"), step) << series << " point " << k;
        EXPECT_NEAR(number(ca, "data-value"), value, 1e-7 * std::max(1.0, std::abs(value))) << series << " " << k;
        const double cx = left + (step - x0) / (x1 - x0) * (right - left);
        const double cy = bottom - (value - y0) / (y1 - y0) * (bottom - top);
        EXPECT_NEAR(number(ca, "cx"), cx, 0.011) << series << " point " << k;
        EXPECT_NEAR(number(ca, "cy"), cy, 0.011) << series << " point " << k;
        EXPECT_TRUE(cx >= left && cx <= right && cy >= top && cy <= bottom) << series << " point " << k << " outside";
        ++checked;
      }
      EXPECT_EQ(k, rows.size()) << metric << "/" << series << ": one point per metrics.jsonl row";
    }
    for (const auto& [series, _] : expected) EXPECT_TRUE(found.count(series)) << metric << " plot lacks " << series;
  }
  for (const char* m : {"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "gpu_mem_gib"})
    EXPECT_TRUE(plots_seen.count(m)) << "no plot of " << m;
  return checked;
}

std::string find_browser() {
  if (const char* c = std::getenv("FORJA_CHROMIUM"); c && *c) return c;
  for (const char* name : {"chromium", "chromium-browser"}) {
    const auto r = forja::test::run_shell(std::string("command -v ") + name + " 2>/dev/null");
    if (r.exit_code == 0 && !r.output.empty()) return r.output.substr(0, r.output.find('\n'));
  }
#ifdef FORJA_CHROMIUM_FOUND
  if (fs::exists(FORJA_CHROMIUM_FOUND)) return FORJA_CHROMIUM_FOUND;
#endif
  return "";
}

bool browser_required() {
#ifdef FORJA_CHROMIUM_FOUND
  return true;
#else
  const char* require = std::getenv("FORJA_REQUIRE_BROWSER");
  return require && std::string(require) == "1";
#endif
}

// Width and height from a PNG's IHDR chunk (0 when the file is not a PNG).
std::pair<uint32_t, uint32_t> png_size(const std::string& png) {
  if (png.size() < 24 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || png.compare(12, 4, "IHDR") != 0)
    return {0, 0};
  auto be32 = [&](size_t at) {
    return uint32_t(uint8_t(png[at])) << 24 | uint32_t(uint8_t(png[at + 1])) << 16 |
           uint32_t(uint8_t(png[at + 2])) << 8 | uint32_t(uint8_t(png[at + 3]));
  };
  return {be32(16), be32(20)};
}

TEST(ReportCli, ChromiumRendersEveryMetricsPointOfARealRun) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const std::string browser = find_browser();
  if (browser.empty()) {
    if (browser_required())
      FAIL() << "no chromium found, but it is required (FORJA_REQUIRE_BROWSER=1, or CMake found one at "
                "configure time); run scripts/setup, or set FORJA_CHROMIUM";
    GTEST_SKIP() << "no chromium (scripts/setup installs it; FORJA_REQUIRE_BROWSER=1 makes this a failure)";
  }
  const fs::path out = train("run_a", "--max-steps 6 --lr 3e-3");
  const fs::path report = out / "report.html";
  ASSERT_TRUE(fs::exists(report));
  const Series want = metrics_of(out);
  ASSERT_EQ(want.at("loss").size(), 6u);
  ASSERT_EQ(want.at("eval_loss").size(), 2u);  // steps 3 and 6
  ASSERT_EQ(want.at("gpu_mem_gib").size(), 6u);

  // Self-contained: nothing to fetch.
  const std::string html = read_text(report);
  for (const char* fetch : {"http://", "https://", " src=", " href="}) EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;

  const fs::path profile = setup().dir / "chromium-profile";
  const std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" +
                            sh(profile) + " --window-size=1280,2200 ";
  const fs::path png = setup().dir / "report.png";
  auto r = forja::test::run_shell(sh(browser) + flags + "--screenshot=" + sh(png) + " " +
                                  sh("file://" + report.string()) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string image = read_text(png);
  EXPECT_EQ(png_size(image), std::make_pair(1280u, 2200u));
  // A blank page of this size compresses to a few kB; text and six plots take well over 50.
  EXPECT_GT(image.size(), 50000u);

  r = forja::test::run_shell(sh(browser) + flags + "--dump-dom " + sh("file://" + report.string()) +
                             " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0);
  const std::string& dom = r.output;
  // The markers are attributes of <html> (the script's own text names them too).
  std::smatch html_tag;
  ASSERT_TRUE(std::regex_search(dom, html_tag, std::regex("<html[^>]*>"))) << dom.substr(0, 500);
  const auto html_attrs = attributes(html_tag.str());
  EXPECT_FALSE(html_attrs.count("data-report-error")) << "the page's script failed: " << html_tag.str();
  ASSERT_TRUE(html_attrs.count("data-report-ready")) << "the page's script did not run to its end: " << html_tag.str();
  const size_t checked = check_plots(dom, want, "run_a");
  size_t rows = want.at("eval_loss").size();  // eval loss is drawn twice: on the loss plot and alone
  for (const auto& [m, v] : want) rows += v.size();
  EXPECT_EQ(checked, rows);
  EXPECT_EQ(std::stoul(html_attrs.at("data-report-ready")), rows) << "points the script found";
  EXPECT_NE(dom.find("finished, step 6 of 6"), std::string::npos);
}

TEST(ReportCli, RebuildsComparesAndRejectsBadInput) {
  if (!fs::exists(program())) GTEST_SKIP() << program() << " not built";
  const fs::path a = train("run_c", "--max-steps 3");
  // A name with HTML in it must come out as text.
  const fs::path b = train("run <i>&\"b\"", "--max-steps 2 --lr 1e-3");

  // forja report RUN rebuilds the page the trainer wrote (the time it was written aside).
  const std::string trainer_page = read_text(a / "report.html");
  auto r = run("report " + sh(a));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex written("Written by forja at [^<]* from");
  EXPECT_EQ(std::regex_replace(read_text(a / "report.html"), written, ""), std::regex_replace(trainer_page, written, ""));

  const fs::path cmp = setup().dir / "compare.html";
  r = run("report " + sh(a) + " " + sh(b) + " --out " + sh(cmp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string page = read_text(cmp);
  EXPECT_EQ(page.find("<i>"), std::string::npos) << "an unescaped run name";
  EXPECT_NE(page.find("run &lt;i&gt;&amp;&quot;b&quot;"), std::string::npos);
  EXPECT_NE(page.find("<tr data-run=\"run_c\">"), std::string::npos);
  EXPECT_NE(page.find("<tr data-run=\"run &lt;i&gt;&amp;&quot;b&quot;\">"), std::string::npos);
  // both runs' series on the loss plot, and the settings that differ named
  EXPECT_NE(page.find("<g class=\"series\" data-run=\"run_c\" data-series=\"loss\""), std::string::npos);
  EXPECT_NE(page.find("data-run=\"run &lt;i&gt;&amp;&quot;b&quot;\" data-series=\"loss\""), std::string::npos);
  EXPECT_NE(page.find("lr: 0.001"), std::string::npos);
  EXPECT_NE(page.find("max-steps: 2"), std::string::npos);

  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const auto e = run(args);
    EXPECT_EQ(e.exit_code, 2) << args << "\n" << e.output;
    EXPECT_NE(e.output.find(needle), std::string::npos) << args << "\n" << e.output;
  };
  expect_error("report " + sh(a) + " " + sh(b), "--out FILE");
  expect_error("report " + sh(setup().dir / "nope"), "no such run directory");
  const fs::path broken = setup().dir / "broken";
  fs::create_directories(broken);
  std::ofstream(broken / "metrics.jsonl") << R"({"step": 1, "loss": 2.0})" "\n" << R"({"step": 2, "loss": "x"})" "\n";
  expect_error("report " + sh(broken), "metrics.jsonl:2");
}

}  // namespace
}  // namespace forja::train
