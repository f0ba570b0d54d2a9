#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// What `ampp train` reports: its records (one per logged step and per epoch, in metrics.jsonl), a
// per-epoch progress bar on rank 0, the final summary table and gnuplot PNGs. Their JSON form is
// internal (src/ampp/train/report_json.h): a program reads the files.
#include <ampp/train/memory_report.h>
#include <ampp/train/op_profile.h>
#include <ampp/train/step_phases.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ampp::train {

struct StepRecord {
  int64_t epoch = 0;
  int64_t step = 0;                     // optimizer iterations since the start of training (1-based)
  double loss = 0;                      // this rank's batch loss (unscaled)
  double loss_scale = 1;                // scale after this step's update (1 when no scaler)
  bool skipped = false;                 // the optimizer step was skipped (inf/NaN gradients)
  std::vector<std::string> overflowed;  // skipped: the parameters whose gradients were inf/NaN
  int64_t skipped_total = 0;
  double lr = 0;
  double images_per_sec = 0;  // global images per second over the last logging interval
  double elapsed = 0;         // seconds since training started
};

struct EpochRecord {
  int64_t epoch = 0;
  int64_t steps = 0;
  double train_loss = 0;
  double train_accuracy = 0;  // percent
  double test_loss = 0;
  double test_accuracy = 0;  // percent
  double seconds = 0;
  double images_per_sec = 0;
  int64_t skipped_total = 0;
  double loss_scale = 1;
  double lr = 0;
};

// One epoch's progress on one line: a redrawn bar on a terminal, plain lines otherwise
// (every ~10% of the epoch, so logs stay short).
class ProgressBar {
 public:
  ProgressBar(int64_t epoch, int64_t epochs, int64_t total_steps, bool is_tty, std::FILE* out = stdout);
  // step: 1-based position in the epoch.
  void update(int64_t step, double images_per_sec, double loss, double loss_scale, int64_t skipped);
  // Ends the line (a terminal keeps the final bar).
  void finish(const std::string& tail);

 private:
  std::string line(int64_t step, double images_per_sec, double loss, double loss_scale, int64_t skipped) const;
  int64_t epoch_, epochs_, total_;
  bool tty_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_ = -1;
  int64_t last_plain_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

// True when `f` is a terminal (isatty).
bool is_terminal(std::FILE* f);

struct Summary {
  std::string model, data, precision, compute;
  int world_size = 1;
  int64_t epochs = 0, steps = 0, skipped_steps = 0;
  double test_accuracy = 0, test_loss = 0, train_loss = 0;
  double seconds = 0, final_scale = 1, peak_rss_mb = 0;
  // Steady state: the steps after warm-up, without evaluation and checkpoints (steady_steps of them; 0:
  // too few steps, and images_per_sec is the wall-time rate). wall_images_per_sec: all steps over `seconds`.
  double images_per_sec = 0, wall_images_per_sec = 0;
  int64_t steady_steps = 0;
  // Text (a GPT): images_per_sec counts sequences; the tokens, and the validation loss of the training
  // text's token frequencies (the loss a model that ignores context gets), beside test_loss.
  std::optional<double> tokens_per_sec, unigram_loss;
  std::vector<StepPhases> step_phases;  // per rank, the steps this process ran (empty: none ran)
  std::optional<MemoryReport> memory;   // rank 0's tensors by kind (TrainOptions::profile only)
  std::optional<OpProfile> ops;         // rank 0's operators over a window of steps (TrainOptions::profile only)
};

// The summary as an aligned text table.
std::string summary_table(const Summary& s);

// Peak resident set size of this process in MiB (getrusage).
double peak_rss_mb();

// Writes loss_accuracy.png, loss_scale.png and throughput.png into `out_dir` from the
// records in metrics.jsonl (gnuplot, pngcairo or png terminal). Returns the files written;
// throws with the gnuplot error if gnuplot is missing or fails.
std::vector<std::string> write_plots(const std::string& metrics_jsonl, const std::string& out_dir);

// A gnuplot single-quoted string.
std::string gnuplot_quoted(const std::string& s);

// Runs gnuplot on `script`, which must write each of `pngs` as "<png>.tmp"; then moves them into place
// (atomically: a reader never sees half a picture). Throws with gnuplot's message, or how to install it.
void run_gnuplot(const std::string& script, const std::vector<std::string>& pngs);

}  // namespace ampp::train
