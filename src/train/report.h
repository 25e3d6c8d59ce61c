// The training report: one self-contained HTML page (no network, no external file) showing one
// run, or several compared. Every `forja train` run writes OUT/report.html at its start, at each
// checkpoint and at the end; `forja report RUN [RUN...] --out FILE` rebuilds it from the run
// directories' files (train/run_record.h).
//
// The page: a table of each run's final figures (state, device, steps, tokens, last train and
// eval loss, perplexity, mean tokens/s, peak GPU memory, time, and for several runs the settings
// that differ), plots against step of the loss (train, with eval overlaid), the eval loss alone,
// the learning rate, the gradient norm, tokens/s and GPU memory (inline SVG built here, one
// <circle class="pt"> per metrics.jsonl value: train/svg_plot.h), each run's config.yaml, and
// notes on anything left out. A small inline script adds a hover readout of the values at a step;
// when it has run it sets data-report-ready on <html> to the number of points it found (and an
// error in it sets data-report-error), which the browser test reads. While a run is in progress
// the page reloads itself every 30 s.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "train/run_record.h"

namespace forja::train {

// The page for these runs (at least one). Every string from the runs is HTML-escaped.
std::string render_report(const std::vector<RunRecord>& runs);

// Writes render_report(runs) to `file` atomically (a browser reloading it never sees half).
void write_report(const std::filesystem::path& file, const std::vector<RunRecord>& runs);

// The trainer's call: OUT/report.html from OUT's own files.
void update_run_report(const std::filesystem::path& out);

}  // namespace forja::train
