// The training report page (see report.h): figures table, plots, configuration, notes, script.
#include "train/report.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

#include "io/atomic_file.h"
#include "train/svg_plot.h"
#include "util/error.h"
#include "util/html_escape.h"

namespace forja::train {
namespace fs = std::filesystem;

namespace {

using Points = std::vector<std::pair<double, double>>;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string thousands(int64_t v) {
  std::string d = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string report_duration(double s) {
  const auto t = int64_t(s + 0.5);
  char buf[48];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh %02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm %02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

const Points& points_of(const RunRecord& r, const std::string& metric) {
  static const Points none;
  const Points* p = r.series(metric);
  return p ? *p : none;
}

std::string last_or_dash(const RunRecord& r, const std::string& metric, const char* f) {
  const Points& p = points_of(r, metric);
  return p.empty() ? "–" : fmt(f, p.back().second);
}

// Scalar settings of a config.yaml, for "settings that differ" between runs.
std::map<std::string, std::string> settings_of(const RunRecord& r) {
  std::map<std::string, std::string> out;
  if (r.config_yaml.empty()) return out;
  YAML::Node root;
  try {
    root = YAML::Load(r.config_yaml);
  } catch (const YAML::Exception& e) {
    throw UserError((r.dir / "config.yaml").string() + ": not valid YAML (" + e.what() +
                    "); it is written by forja train: restore it or delete it");
  }
  if (!root.IsMap()) return out;
  for (const auto& kv : root)
    if (kv.first.IsScalar() && kv.second.IsScalar()) out[kv.first.Scalar()] = kv.second.Scalar();
  return out;
}

std::string state_text(const RunRecord& r) {
  if (!r.status) return "unknown";
  const RunStatus& s = *r.status;
  std::string t = s.state.empty() ? "unknown" : s.state;
  if (s.total_steps > 0) t += ", step " + thousands(s.step) + " of " + thousands(s.total_steps);
  return t;
}

std::string device_text(const RunRecord& r) {
  if (!r.status || r.status->device.empty()) return "unknown";
  std::string t = r.status->device;
  if (!r.status->device_type.empty()) t += " (" + r.status->device_type + ")";
  return t;
}

std::string swatch(int i) {
  return "<span class=\"swatch\" style=\"background:" + run_colour(i) + "\"></span>";
}

std::string figures_table(const std::vector<RunRecord>& runs) {
  // Settings that differ between the runs (every run's value shown), "out" aside: it always does.
  std::vector<std::map<std::string, std::string>> settings;
  std::set<std::string> keys;
  for (const auto& r : runs) {
    settings.push_back(settings_of(r));
    for (const auto& [k, v] : settings.back()) keys.insert(k);
  }
  std::vector<std::string> differing;
  if (runs.size() > 1)
    for (const auto& k : keys) {
      if (k == "out") continue;
      std::set<std::string> values;
      for (const auto& s : settings) values.insert(s.count(k) ? s.at(k) : "(unset)");
      if (values.size() > 1) differing.push_back(k);
    }

  std::string o = "<table class=\"figures\">\n<thead><tr><th>run</th><th>state</th><th>device</th><th>steps</th>"
                  "<th>tokens</th><th>train loss</th><th>eval loss</th><th>eval ppl</th><th>tokens/s (mean)</th>"
                  "<th>peak GPU memory</th><th>time</th>";
  if (!differing.empty()) o += "<th class=\"differ\">settings that differ</th>";
  o += "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    const Points& loss = points_of(r, "loss");
    const Points& tokens = points_of(r, "tokens");
    const Points& elapsed = points_of(r, "elapsed_s");
    const Points& mem = points_of(r, "gpu_mem_gib");
    double peak = -1;
    for (const auto& [s, v] : mem) peak = std::max(peak, v);
    std::string tps = "–";
    if (!tokens.empty() && !elapsed.empty() && elapsed.back().second > 0)
      tps = thousands(int64_t(tokens.back().second / elapsed.back().second + 0.5));
    o += "<tr data-run=\"" + html_escape(r.name) + "\"><td class=\"name\">" + swatch(int(i)) + html_escape(r.name) +
         "</td><td>" + html_escape(state_text(r)) + "</td><td>" + html_escape(device_text(r)) + "</td><td>" +
         (loss.empty() ? "–" : thousands(int64_t(loss.back().first))) + "</td><td>" +
         (tokens.empty() ? "–" : thousands(int64_t(tokens.back().second))) + "</td><td>" +
         last_or_dash(r, "loss", "%.4f") + "</td><td>" + last_or_dash(r, "eval_loss", "%.4f") + "</td><td>" +
         last_or_dash(r, "eval_ppl", "%.3f") + "</td><td>" + tps + "</td><td>" +
         (peak < 0 ? "–" : peak < 1 ? fmt("%.1f MiB", peak * 1024) : fmt("%.2f GiB", peak)) + "</td><td>" +
         (elapsed.empty() ? "–" : report_duration(elapsed.back().second)) + "</td>";
    if (!differing.empty()) {
      std::string d;
      for (const auto& k : differing)
        d += (d.empty() ? "" : ", ") + k + ": " + (settings[i].count(k) ? settings[i].at(k) : "(unset)");
      o += "<td class=\"differ\">" + html_escape(d) + "</td>";
    }
    o += "</tr>\n";
  }
  o += "</tbody></table>\n";
  return o;
}

struct PlotDef {
  const char* metric;  // metrics.jsonl field
  const char* title;
  const char* y_label;
  const char* empty_note;
  bool from_zero;
};

std::string plots(const std::vector<RunRecord>& runs) {
  const PlotDef defs[] = {
      {"loss", "Loss", "loss", "no logged step yet", false},
      {"eval_loss", "Evaluation loss", "eval loss", "no evaluation (--eval-split or --eval-data turn it on)", false},
      {"lr", "Learning rate", "learning rate", "no logged step yet", true},
      {"grad_norm", "Gradient norm (before clipping)", "norm", "no logged step yet", true},
      {"tokens_per_s", "Throughput", "tokens/s", "no logged step yet", true},
      {"gpu_mem_gib", "GPU memory (peak so far)", "GiB", "not logged (metrics.jsonl of an older forja)", true},
  };
  const bool several = runs.size() > 1;
  std::string o = "<div class=\"plots\">\n";
  for (const PlotDef& d : defs) {
    PlotSpec spec;
    spec.metric = d.metric;
    spec.title = d.title;
    spec.y_label = d.y_label;
    spec.empty_note = d.empty_note;
    spec.from_zero = d.from_zero;
    std::vector<PlotSeries> series;
    for (size_t i = 0; i < runs.size(); ++i) {
      auto add = [&](const std::string& metric, const std::string& what, bool dashed) {
        PlotSeries s;
        s.run = runs[i].name;
        s.colour = int(i);
        s.metric = metric;
        s.label = several ? runs[i].name + " " + what : what;
        s.dashed = dashed;
        s.points = points_of(runs[i], metric);
        series.push_back(std::move(s));
      };
      if (spec.metric == "loss") {
        add("loss", "train loss", false);
        if (!points_of(runs[i], "eval_loss").empty()) {
          add("eval_loss", "eval loss", true);
          spec.line_style_key = true;
        }
      } else {
        add(d.metric, d.y_label, spec.metric == "eval_loss");
      }
    }
    o += "<figure>" + render_plot(spec, series) + "<figcaption class=\"readout\">&nbsp;</figcaption></figure>\n";
  }
  o += "</div>\n";
  return o;
}

const char* kStyle = R"(
body { font: 14px/1.4 "DejaVu Sans", system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 1180px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.sub { color: #666; margin: 0; }
.live { background: #fff6d5; border: 1px solid #e8d48b; padding: 6px 10px; margin: 10px 0; }
table.figures { border-collapse: collapse; margin-top: 8px; }
table.figures td { white-space: nowrap; }
table.figures th, table.figures td { border-bottom: 1px solid #ddd; padding: 4px 10px 4px 0; text-align: right; vertical-align: top; }
table.figures th { font-weight: 600; color: #444; }
table.figures th:nth-child(-n+3), table.figures td:nth-child(-n+3), table.figures .differ { text-align: left; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px; vertical-align: -1px; }
.legend span.item { margin-right: 18px; white-space: nowrap; }
.plots { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 8px 24px; }
figure { margin: 0; }
svg.plot { width: 100%; height: auto; display: block; }
svg.plot text { font-size: 12px; fill: #333; }
svg.plot .title { font-size: 14px; font-weight: 600; }
svg.plot .ytick { text-anchor: end; }
svg.plot .xtick, svg.plot .xlabel, svg.plot .ylabel, svg.plot .empty { text-anchor: middle; }
svg.plot .empty { fill: #888; }
svg.plot .grid line { stroke: #e6e6e6; }
svg.plot .frame { fill: none; stroke: #999; }
svg.plot polyline { fill: none; stroke: currentColor; stroke-width: 1.6; }
svg.plot .dashed { stroke-dasharray: 5 3; }
svg.plot circle.pt { fill: currentColor; }
svg.plot .key line { stroke: #444; stroke-width: 1.6; }
svg.plot .key circle { fill: #444; }
svg.plot .cursor { stroke: #777; stroke-dasharray: 3 3; }
figcaption.readout { color: #444; font-size: 12px; min-height: 1.4em; padding-left: 66px; }
pre { background: #f6f6f6; padding: 8px 12px; overflow-x: auto; font: 12px/1.35 "DejaVu Sans Mono", monospace; }
details summary { cursor: pointer; }
)";

// Hover readout: the values of every series at the step nearest the pointer. Read-only over the
// SVG the server built; the marker at the end tells the browser test the script ran through.
const char* kScript = R"(
window.addEventListener('error', function (e) {
  document.documentElement.setAttribute('data-report-error', String(e.message));
});
(function () {
  var total = 0;
  document.querySelectorAll('svg.plot').forEach(function (svg) {
    var pts = Array.prototype.slice.call(svg.querySelectorAll('circle.pt'));
    total += pts.length;
    var readout = svg.parentNode.querySelector('.readout');
    var cursor = svg.querySelector('.cursor');
    if (!pts.length) return;
    svg.addEventListener('mousemove', function (ev) {
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) * svg.viewBox.baseVal.width / box.width;
      var best = pts[0];
      pts.forEach(function (p) {
        if (Math.abs(p.cx.baseVal.value - x) < Math.abs(best.cx.baseVal.value - x)) best = p;
      });
      var step = best.getAttribute('data-step');
      cursor.setAttribute('x1', best.getAttribute('cx'));
      cursor.setAttribute('x2', best.getAttribute('cx'));
      cursor.setAttribute('visibility', 'visible');
      var parts = pts.filter(function (p) { return p.getAttribute('data-step') === step; }).map(function (p) {
        return p.parentNode.getAttribute('data-label') + ' ' + Number(p.getAttribute('data-value')).toPrecision(5);
      });
      readout.textContent = 'step ' + step + ': ' + parts.join(', ');
    });
    svg.addEventListener('mouseleave', function () {
      cursor.setAttribute('visibility', 'hidden');
      readout.innerHTML = '&nbsp;';
    });
  });
  document.documentElement.setAttribute('data-report-ready', String(total));
})();
)";

std::string report_time() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

std::string render_report(const std::vector<RunRecord>& runs_in) {
  if (runs_in.empty()) throw UserError("forja report: give at least one run directory");
  // Names label legends, table rows and data-run attributes: make them unique.
  std::vector<RunRecord> runs = runs_in;
  std::map<std::string, int> seen;
  for (auto& r : runs) seen[r.name]++;
  for (auto& r : runs)
    if (seen[r.name] > 1) r.name = r.dir.lexically_normal().string();
  bool live = false;
  for (const auto& r : runs) live |= r.status && r.status->state == "running";

  std::string title;
  if (runs.size() == 1) title = "Training report: " + runs[0].name;
  else {
    title = "Training runs compared: ";
    for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].name;
  }

  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  if (live) o += "<meta http-equiv=\"refresh\" content=\"30\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" + html_escape(title) +
       "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  o += "<header><h1>" + html_escape(title) + "</h1><p class=\"sub\">Written by forja at " + report_time() + " from ";
  for (size_t i = 0; i < runs.size(); ++i)
    o += (i ? ", " : "") + html_escape(fs::absolute(runs[i].dir).lexically_normal().string());
  o += "</p></header>\n";
  if (live)
    o += "<p class=\"live\">In progress: forja train rewrites this page at every checkpoint and at the end; it "
         "reloads itself every 30 s.</p>\n";

  o += "<h2>Final figures</h2>\n" + figures_table(runs);
  o += "<h2>Against step</h2>\n<p class=\"legend\">";
  for (size_t i = 0; i < runs.size(); ++i)
    o += "<span class=\"item\">" + swatch(int(i)) + html_escape(runs[i].name) + "</span>";
  o += "</p>\n" + plots(runs);

  o += "<h2>Configuration</h2>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    o += "<details" + std::string(runs.size() == 1 ? " open" : "") + "><summary>" + swatch(int(i)) +
         html_escape(r.name) + ": " + html_escape((r.dir / "config.yaml").string()) + ", device " +
         html_escape(device_text(r)) + (r.status && !r.status->driver.empty() ? ", driver " + html_escape(r.status->driver) : "") +
         "</summary><pre>" + html_escape(r.config_yaml.empty() ? "(config.yaml not found)" : r.config_yaml) +
         "</pre></details>\n";
  }
  std::vector<std::string> notes;
  for (const auto& r : runs) notes.insert(notes.end(), r.notes.begin(), r.notes.end());
  if (!notes.empty()) {
    o += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const auto& n : notes) o += "<li>" + html_escape(n) + "</li>\n";
    o += "</ul>\n";
  }
  o += "<script>" + std::string(kScript) + "</script>\n</body>\n</html>\n";
  return o;
}

void write_report(const fs::path& file, const std::vector<RunRecord>& runs) {
  io::write_file_atomic(file, render_report(runs));
}

void update_run_report(const fs::path& out) { write_report(out / "report.html", {read_run(out)}); }

}  // namespace forja::train
