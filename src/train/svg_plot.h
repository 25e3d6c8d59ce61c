// Line charts of a metric against the training step, drawn here as inline SVG (no script, no
// network, so a report renders the same in any browser and opens from disk or a mail).
//
// Every point of a series becomes a <circle class="pt"> at the exact position the axes map it to,
// and the <svg class="plot"> carries its mapping: data-x-min/data-x-max/data-y-min/data-y-max
// (the axis domain) and data-left/data-right/data-top/data-bottom (the plot frame in viewBox
// units), so
//   cx = left + (step - x_min) / (x_max - x_min) * (right - left)
//   cy = bottom - (value - y_min) / (y_max - y_min) * (bottom - top)
// which is what the report's browser test checks against metrics.jsonl.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace forja::train {

struct PlotSeries {
  std::string run;     // the run's name (data-run; shown in the point's tooltip)
  int colour = 0;      // index into the run palette (run_colour)
  std::string metric;  // data-series, e.g. "loss", "eval_loss"
  std::string label;   // tooltip / readout text, e.g. "run-a eval loss"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (step, value), finite, in step order
};

struct PlotSpec {
  std::string metric;   // data-metric and the element id "plot-<metric>"
  std::string title;    // "Loss"
  std::string y_label;  // "loss", "GiB", ...
  bool line_style_key = false;  // draw "— train  - - eval" (the loss plot)
  std::string empty_note;       // shown when no series has a point
  bool from_zero = false;       // the y axis starts at 0 (rates, norms, memory), else at the data
};

// One plot as an <svg> element (viewBox 560 x 300), followed by nothing else.
std::string render_plot(const PlotSpec& spec, const std::vector<PlotSeries>& series);

// The colour of run number i (a palette readable on white that cycles after 8 runs).
std::string run_colour(int i);

// An axis: a domain [lo, hi] rounded outwards to "nice" ticks (1, 2, 2.5, 5 x 10^k), about
// `target` of them; integer axes (steps) get integer ticks. A degenerate range is widened.
struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  int decimals = 0;  // for the tick labels
  int exponent = 0;  // labels are value / 10^exponent; the axis label then says x10^exponent
};
Axis nice_axis(double lo, double hi, int target, bool integer);
std::string tick_label(double v, const Axis& axis);

}  // namespace forja::train
