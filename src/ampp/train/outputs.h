#pragma once
// Internal to ampp: what rank 0 writes: metrics, the model, the summary, the doctor's report.
#include "run.h"

namespace ampp::train::detail {

void log_step(Run& run, int64_t epoch, const StepResult& step, double images_per_sec);

// Rank 0 under TrainOptions::doctor: doctor.json, the picture, and the recommendation on the terminal.
void write_doctor_outputs(const Run& run);

void open_outputs(Run& run);

Summary summarize(const Run& run);

// Every rank's StepPhases, on every rank (one allreduce: each rank fills its own row).
std::vector<StepPhases> gather_step_phases(const Run& run);

// Rank 0: model.pt, the summary line and file, the summary table and the plots. Every file is
// written atomically, summary.json last: its presence means the outputs are complete.
void write_outputs(Run& run, const Summary& summary, bool write_model = true);

}  // namespace ampp::train::detail
