// Line charts as inline SVG (see svg_plot.h): nice axes, grid, tick labels, one polyline and
// one circle per point for each series, a tooltip per point (<title>, no script needed).
#include "train/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/html_escape.h"

namespace forja::train {
namespace {

// viewBox and the plot frame inside it (room for the title above, tick labels left and below)
constexpr double kWidth = 560, kHeight = 300;
constexpr double kLeft = 66, kRight = 544, kTop = 36, kBottom = 252;

// Fixed-point text of a coordinate or value: enough digits that the browser test can recompute
// positions to 0.01 viewBox units, short enough that a long run's page stays small.
std::string num(double v, int decimals = 2) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}
// A value as data: round-trips through the page (%.9g is exact enough for float metrics).
std::string value_text(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string superscript(int e) {
  static const char* digits[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
  std::string out = e < 0 ? "⁻" : "";
  const std::string d = std::to_string(std::abs(e));
  for (char c : d) out += digits[c - '0'];
  return out;
}

}  // namespace

std::string run_colour(int i) {
  // Tableau 10's first eight: distinct for most colour-blind readers too, dark enough on white.
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                  "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
  return palette[((i % 8) + 8) % 8];
}

Axis nice_axis(double lo, double hi, int target, bool integer) {
  Axis a;
  if (!(hi > lo)) {  // one point, or all equal: widen the range so it has an extent
    if (integer) {
      hi = lo + 1;
    } else {
      const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double nice = 10;
  for (double c : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (norm <= c * (1 + 1e-9)) {
      nice = c;
      break;
    }
  double step = nice * mag;
  if (integer) step = std::max(1.0, std::round(step));
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  for (int k = 0;; ++k) {
    const double t = a.lo + k * step;
    if (t > a.hi + step * 1e-6) break;
    a.ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  // Very small or large values (learning rates, token counts on big GPUs) get a common factor.
  const double biggest = std::max(std::abs(a.lo), std::abs(a.hi));
  if (!integer && biggest > 0 && (biggest < 1e-2 || biggest >= 1e5))
    a.exponent = int(std::floor(std::log10(biggest)));
  const double scaled_step = step / std::pow(10.0, a.exponent);
  a.decimals = std::max(0, int(-std::floor(std::log10(scaled_step) + 1e-9)));
  if (nice == 2.5 && a.decimals >= 0 && scaled_step < 10) ++a.decimals;
  if (integer) a.decimals = 0;
  return a;
}

std::string tick_label(double v, const Axis& axis) {
  return num(v / std::pow(10.0, axis.exponent), axis.decimals);
}

std::string render_plot(const PlotSpec& spec, const std::vector<PlotSeries>& series) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  size_t points = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
      ++points;
    }
  if (points == 0) x_lo = x_hi = y_lo = y_hi = 0;
  if (spec.from_zero) y_lo = std::min(y_lo, 0.0);
  // Headroom, so that the highest and lowest points do not sit on the frame.
  // Values that are all >= 0 (losses, rates) keep an axis that starts at 0 at the lowest.
  const double pad = (y_hi - y_lo) * 0.04;
  if (!spec.from_zero || y_lo < 0) y_lo = y_lo >= 0 ? std::max(0.0, y_lo - pad) : y_lo - pad;
  y_hi += pad;
  const Axis ax = nice_axis(std::min(x_lo, 0.0), x_hi, 6, true);  // steps from 0
  const Axis ay = nice_axis(y_lo, y_hi, 5, false);
  auto px = [&](double x) { return kLeft + (x - ax.lo) / (ax.hi - ax.lo) * (kRight - kLeft); };
  auto py = [&](double y) { return kBottom - (y - ay.lo) / (ay.hi - ay.lo) * (kBottom - kTop); };

  std::string o;
  o += "<svg class=\"plot\" id=\"plot-" + html_escape(spec.metric) + "\" data-metric=\"" + html_escape(spec.metric) +
       "\" viewBox=\"0 0 " + num(kWidth, 0) + " " + num(kHeight, 0) + "\" width=\"" + num(kWidth, 0) +
       "\" height=\"" + num(kHeight, 0) + "\" role=\"img\" aria-label=\"" + html_escape(spec.title) +
       " against step\" data-x-min=\"" + value_text(ax.lo) + "\" data-x-max=\"" + value_text(ax.hi) +
       "\" data-y-min=\"" + value_text(ay.lo) + "\" data-y-max=\"" + value_text(ay.hi) + "\" data-left=\"" +
       num(kLeft) + "\" data-right=\"" + num(kRight) + "\" data-top=\"" + num(kTop) + "\" data-bottom=\"" +
       num(kBottom) + "\" data-points=\"" + std::to_string(points) + "\">\n";
  o += "<text class=\"title\" x=\"" + num(kLeft) + "\" y=\"22\">" + html_escape(spec.title) + "</text>\n";

  // grid and tick labels (none on an empty plot: its axes would be made up)
  const std::vector<double> no_ticks;
  const std::vector<double>& xt = points ? ax.ticks : no_ticks;
  const std::vector<double>& yt = points ? ay.ticks : no_ticks;
  o += "<g class=\"grid\">";
  for (double t : yt)
    o += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kRight) + "\" y1=\"" + num(py(t)) + "\" y2=\"" + num(py(t)) +
         "\"/>";
  for (double t : xt)
    o += "<line y1=\"" + num(kTop) + "\" y2=\"" + num(kBottom) + "\" x1=\"" + num(px(t)) + "\" x2=\"" + num(px(t)) +
         "\"/>";
  o += "</g>\n<g class=\"ticks\">";
  for (double t : yt)
    o += "<text class=\"ytick\" x=\"" + num(kLeft - 6) + "\" y=\"" + num(py(t) + 4) + "\">" + tick_label(t, ay) +
         "</text>";
  for (double t : xt)
    o += "<text class=\"xtick\" x=\"" + num(px(t)) + "\" y=\"" + num(kBottom + 16) + "\">" + tick_label(t, ax) +
         "</text>";
  o += "</g>\n";
  o += "<rect class=\"frame\" x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kRight - kLeft) +
       "\" height=\"" + num(kBottom - kTop) + "\"/>\n";
  o += "<text class=\"xlabel\" x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num(kBottom + 36) + "\">step</text>\n";
  std::string y_label = spec.y_label;
  if (ay.exponent != 0) y_label += " (×10" + superscript(ay.exponent) + ")";
  o += "<text class=\"ylabel\" transform=\"translate(16 " + num((kTop + kBottom) / 2) + ") rotate(-90)\">" +
       html_escape(y_label) + "</text>\n";

  if (points == 0 && !spec.empty_note.empty())
    o += "<text class=\"empty\" x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num((kTop + kBottom) / 2) + "\">" +
         html_escape(spec.empty_note) + "</text>\n";

  if (spec.line_style_key) {  // which line is which: solid train, dashed eval
    const double x = kRight - 150, y = 22;
    o += "<g class=\"key\"><line x1=\"" + num(x) + "\" x2=\"" + num(x + 22) + "\" y1=\"" + num(y - 4) + "\" y2=\"" +
         num(y - 4) + "\"/><text x=\"" + num(x + 27) + "\" y=\"" + num(y) +
         "\">train</text><line class=\"dashed\" x1=\"" + num(x + 75) + "\" x2=\"" + num(x + 97) + "\" y1=\"" +
         num(y - 4) + "\" y2=\"" + num(y - 4) + "\"/><circle cx=\"" + num(x + 86) + "\" cy=\"" + num(y - 4) +
         "\" r=\"2.5\"/><text x=\"" + num(x + 102) + "\" y=\"" + num(y) + "\">eval</text></g>\n";
  }

  for (const auto& s : series) {
    if (s.points.empty()) continue;
    // Dots are what the eye reads for sparse series; on long runs they shrink to the line.
    const size_t n = s.points.size();
    const double r = s.dashed ? 3.0 : n <= 60 ? 2.5 : n <= 300 ? 1.5 : 0.8;
    o += "<g class=\"series\" data-run=\"" + html_escape(s.run) + "\" data-series=\"" + html_escape(s.metric) +
         "\" data-label=\"" + html_escape(s.label) + "\" style=\"color:" + run_colour(s.colour) + "\">";
    o += "<polyline" + std::string(s.dashed ? " class=\"dashed\"" : "") + " points=\"";
    for (size_t i = 0; i < n; ++i) o += (i ? " " : "") + num(px(s.points[i].first)) + "," + num(py(s.points[i].second));
    o += "\"/>";
    for (const auto& [x, y] : s.points) {
      o += "<circle class=\"pt\" cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"" + num(r, 1) +
           "\" data-step=\"" + value_text(x) + "\" data-value=\"" + value_text(y) + "\"><title>" +
           html_escape(s.label) + ", step " + value_text(x) + ": " + value_text(y) + "</title></circle>";
    }
    o += "</g>\n";
  }
  o += "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" + num(kTop) + "\" y2=\"" + num(kBottom) +
       "\" visibility=\"hidden\"/>\n";
  o += "</svg>";
  return o;
}

}  // namespace forja::train
