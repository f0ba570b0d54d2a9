#include <ampp/train/metrics.h>
#include <ampp/util/atomic_file.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "report_json.h"

namespace fs = std::filesystem;

namespace ampp::train {

nlohmann::json to_json(const StepRecord& r) {
  nlohmann::json j = {{"type", "step"},
                      {"epoch", r.epoch},
                      {"step", r.step},
                      {"loss", r.loss},
                      {"loss_scale", r.loss_scale},
                      {"skipped", r.skipped},
                      {"skipped_total", r.skipped_total},
                      {"lr", r.lr},
                      {"images_per_sec", r.images_per_sec},
                      {"elapsed", r.elapsed}};
  if (r.skipped) j["overflowed"] = r.overflowed;
  return j;
}

nlohmann::json to_json(const EpochRecord& r) {
  return {{"type", "epoch"},
          {"epoch", r.epoch},
          {"steps", r.steps},
          {"train_loss", r.train_loss},
          {"train_accuracy", r.train_accuracy},
          {"test_loss", r.test_loss},
          {"test_accuracy", r.test_accuracy},
          {"seconds", r.seconds},
          {"images_per_sec", r.images_per_sec},
          {"skipped_total", r.skipped_total},
          {"loss_scale", r.loss_scale},
          {"lr", r.lr}};
}

nlohmann::json to_json(const Summary& s) {
  nlohmann::json j = {{"type", "summary"},
                      {"model", s.model},
                      {"data", s.data},
                      {"precision", s.precision},
                      {"world_size", s.world_size},
                      {"epochs", s.epochs},
                      {"steps", s.steps},
                      {"skipped_steps", s.skipped_steps},
                      {"test_accuracy", s.test_accuracy},
                      {"test_loss", s.test_loss},
                      {"train_loss", s.train_loss},
                      {"seconds", s.seconds},
                      {"images_per_sec", s.images_per_sec},
                      {"wall_images_per_sec", s.wall_images_per_sec},
                      {"steady_steps", s.steady_steps},
                      {"final_loss_scale", s.final_scale},
                      {"peak_rss_mb", s.peak_rss_mb},
                      {"compute", s.compute}};
  if (s.tokens_per_sec) j["tokens_per_sec"] = *s.tokens_per_sec;
  if (s.unigram_loss) j["unigram_loss"] = *s.unigram_loss;
  if (s.memory) j["memory_bytes"] = to_json(*s.memory);
  if (s.ops) j["operators"] = to_json(*s.ops);
  if (s.step_phases.empty()) return j;
  auto& ranks = j["step_phases_ms"] = nlohmann::json::array();
  for (const auto& p : s.step_phases) ranks.push_back(to_json(p));
  return j;
}

Summary summary_from_json(const nlohmann::json& j) {
  TORCH_CHECK(j.value("type", "") == "summary", "not a summary record: ", j.dump());
  Summary s;
  s.model = j.at("model").get<std::string>();
  s.data = j.at("data").get<std::string>();
  s.precision = j.at("precision").get<std::string>();
  s.compute = j.value("compute", "");
  s.world_size = j.at("world_size").get<int>();
  s.epochs = j.at("epochs").get<int64_t>();
  s.steps = j.at("steps").get<int64_t>();
  s.skipped_steps = j.at("skipped_steps").get<int64_t>();
  s.test_accuracy = j.at("test_accuracy").get<double>();
  s.test_loss = j.at("test_loss").get<double>();
  s.train_loss = j.at("train_loss").get<double>();
  s.seconds = j.at("seconds").get<double>();
  s.images_per_sec = j.at("images_per_sec").get<double>();
  s.wall_images_per_sec = j.value("wall_images_per_sec", s.images_per_sec);
  s.steady_steps = j.value("steady_steps", int64_t{0});
  s.final_scale = j.at("final_loss_scale").get<double>();
  s.peak_rss_mb = j.at("peak_rss_mb").get<double>();
  for (const auto& p : j.value("step_phases_ms", nlohmann::json::array()))
    s.step_phases.push_back(step_phases_from_json(p));
  if (j.contains("tokens_per_sec")) s.tokens_per_sec = j.at("tokens_per_sec").get<double>();
  if (j.contains("unigram_loss")) s.unigram_loss = j.at("unigram_loss").get<double>();
  if (j.contains("memory_bytes")) s.memory = memory_report_from_json(j.at("memory_bytes"));
  if (j.contains("operators")) s.ops = op_profile_from_json(j.at("operators"));
  return s;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  TORCH_CHECK(out_, "cannot open '", path, "' for writing; check that TrainOptions::out is a writable folder");
}

void MetricsWriter::write_line(const nlohmann::json& j) {
  errno = 0;
  out_ << j.dump() << '\n';
  out_.flush();
  // A full disk must stop the run, not cut the log off silently.
  TORCH_CHECK(out_.good(), "writing '", path_, "' failed: ", errno != 0 ? std::strerror(errno) : "stream error",
              "; free disk space or choose another TrainOptions::out");
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "cannot open '", path, "'");
  std::vector<nlohmann::json> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      lines.push_back(nlohmann::json::parse(line));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, path, ":", n, ": not valid JSON (", e.what(), ")");
    }
  }
  return lines;
}

bool is_terminal(std::FILE* f) { return ::isatty(::fileno(f)) == 1; }

ProgressBar::ProgressBar(int64_t epoch, int64_t epochs, int64_t total_steps, bool is_tty, std::FILE* out)
    : epoch_(epoch),
      epochs_(epochs),
      total_(std::max<int64_t>(total_steps, 1)),
      tty_(is_tty),
      out_(out),
      start_(std::chrono::steady_clock::now()) {}

namespace {
// "81234 images/s (steady, 480 steps; 61234 over the whole run)".
std::string throughput_text(const Summary& s) {
  const double per_image = s.tokens_per_sec ? *s.tokens_per_sec / std::max(s.images_per_sec, 1e-9) : 1.0;
  const std::string unit = s.tokens_per_sec ? "tokens/s" : "images/s";
  if (s.steady_steps == 0) return fmt::format("{:.0f} {}", s.images_per_sec * per_image, unit);
  return fmt::format("{:.0f} {} (steady, {} steps; {:.0f} over the whole run)", s.images_per_sec * per_image, unit,
                     s.steady_steps, s.wall_images_per_sec * per_image);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{:02}:{:02}", s / 60, s % 60);
}
}  // namespace

std::string ProgressBar::line(int64_t step, double ips, double loss, double scale, int64_t skipped) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = step - std::max<int64_t>(start_step_, 0);
  const double eta = done_here > 0 ? elapsed / done_here * (total_ - step) : NAN;
  std::string bar;
  if (tty_) {
    constexpr int width = 24;
    const int filled = static_cast<int>(width * step / total_);
    bar = "|" + std::string(filled, '#') + std::string(width - filled, '.') + "| ";
  }
  return fmt::format("epoch {}/{} {}step {}/{} | {:.0f} img/s | loss {:.4f} | scale {:g} | skipped {} | ETA {}",
                     epoch_ + 1, epochs_, bar, step, total_, ips, loss, scale, skipped, format_duration(eta));
}

void ProgressBar::update(int64_t step, double ips, double loss, double scale, int64_t skipped) {
  if (start_step_ < 0) start_step_ = step - 1;  // a resumed epoch starts mid-way
  if (tty_) {
    // Redraw at most ~10 times a second; always draw the last step.
    const auto now = std::chrono::steady_clock::now();
    if (step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::fprintf(out_, "\r\033[K%s", line(step, ips, loss, scale, skipped).c_str());
  } else {
    const int64_t every = std::max<int64_t>(total_ / 10, 1);
    if (step - last_plain_ < every && step != total_) return;
    last_plain_ = step;
    std::fprintf(out_, "%s\n", line(step, ips, loss, scale, skipped).c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish(const std::string& tail) {
  std::fprintf(out_, tty_ ? "\n%s\n" : "%s\n", tail.c_str());
  std::fflush(out_);
}

std::string summary_table(const Summary& s) {
  std::vector<std::pair<std::string, std::string>> rows{
      {"model", s.model},
      {"data", s.data},
      {"precision", s.precision},
      {"workers", std::to_string(s.world_size)},
      {"compute threads (rank 0)", s.compute},
      {"epochs / steps", fmt::format("{} / {}", s.epochs, s.steps)},
      {"test accuracy", fmt::format("{:.2f} %", s.test_accuracy)},
      {"test loss", fmt::format("{:.4f}", s.test_loss)},
      {"train loss (last epoch)", fmt::format("{:.4f}", s.train_loss)},
      {"training time", fmt::format("{:.1f} s", s.seconds)},
      {"throughput", throughput_text(s)},
      {"skipped steps", std::to_string(s.skipped_steps)},
      {"final loss scale", fmt::format("{:g}", s.final_scale)},
      {"peak memory (RSS, rank 0)", fmt::format("{:.0f} MiB", s.peak_rss_mb)},
  };
  if (s.unigram_loss) {  // text: the accuracy is per token; the loss is read against the frequency baseline
    rows[6] = {"test accuracy (next token)", fmt::format("{:.2f} %", s.test_accuracy)};
    rows[7] = {"test loss (perplexity)", fmt::format("{:.4f} ({:.2f})", s.test_loss, std::exp(s.test_loss))};
    rows.insert(rows.begin() + 8,
                {"unigram baseline loss", fmt::format("{:.4f} ({:.2f})", *s.unigram_loss, std::exp(*s.unigram_loss))});
  }
  size_t kw = 0, vw = 0;
  for (const auto& [k, v] : rows) kw = std::max(kw, k.size()), vw = std::max(vw, v.size());
  const std::string rule = fmt::format("+-{}-+-{}-+\n", std::string(kw, '-'), std::string(vw, '-'));
  std::string out = rule;
  for (const auto& [k, v] : rows) out += fmt::format("| {:<{}} | {:<{}} |\n", k, kw, v, vw);
  return out + rule;
}

double peak_rss_mb() {
  // VmHWM, this process's own high-water mark. getrusage's ru_maxrss would do on its own, but Linux
  // carries it across exec: a worker spawned by a larger launcher would report the launcher's peak.
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    }
    std::fclose(f);
    if (kib >= 0) return static_cast<double>(kib) / 1024.0;
  }
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

namespace {

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// epochs.dat, steps.dat and skipped.dat for gnuplot; returns the number of skipped steps.
int64_t write_plot_data(const fs::path& data, const std::map<int64_t, nlohmann::json>& steps,
                        const std::map<int64_t, nlohmann::json>& epochs) {
  {
    std::ostringstream f;
    f << "# epoch train_loss test_loss train_accuracy test_accuracy\n";
    for (const auto& [e, j] : epochs)
      f << e + 1 << ' ' << j["train_loss"] << ' ' << j["test_loss"] << ' ' << j["train_accuracy"] << ' '
        << j["test_accuracy"] << '\n';
    write_file_atomic((data / "epochs.dat").string(), f.str());
  }
  int64_t n_skipped = 0;
  {
    std::ostringstream f, s;
    f << "# step loss_scale images_per_sec loss\n";
    s << "# step loss_scale (after the backoff)\n";
    for (const auto& [step, j] : steps) {
      f << step << ' ' << j["loss_scale"] << ' ' << j["images_per_sec"] << ' ' << j["loss"] << '\n';
      if (j.value("skipped", false)) s << step << ' ' << j["loss_scale"] << '\n', ++n_skipped;
    }
    write_file_atomic((data / "steps.dat").string(), f.str());
    write_file_atomic((data / "skipped.dat").string(), s.str());
  }
  return n_skipped;
}

}  // namespace

std::string gnuplot_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

void run_gnuplot(const std::string& script, const std::vector<std::string>& pngs) {
  const std::string err = script + ".err";
  const int rc = std::system(fmt::format("gnuplot {} 2> {}", shell_quoted(script), shell_quoted(err)).c_str());
  std::ifstream e(err);
  const std::string err_text((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  TORCH_CHECK(rc == 0, "gnuplot failed (exit status ", rc, ")",
              rc == 127 * 256 ? ": gnuplot is not installed; `sudo apt install gnuplot-nox`" : "",
              err_text.empty() ? "" : ": " + err_text, " (script: ", script, ")");
  for (const auto& png : pngs) commit_file(png + ".tmp", png);  // gnuplot wrote the .tmp names
}

std::vector<std::string> write_plots(const std::string& metrics_jsonl, const std::string& out_dir) {
  // A resumed run may log a step or epoch twice (work redone after the last checkpoint):
  // keep the last record of each.
  std::map<int64_t, nlohmann::json> steps, epochs;
  for (auto& j : read_jsonl(metrics_jsonl)) {
    const auto type = j.value("type", "");
    if (type == "step") steps[j["step"].get<int64_t>()] = j;
    if (type == "epoch") epochs[j["epoch"].get<int64_t>()] = j;
  }
  TORCH_CHECK(!steps.empty() || !epochs.empty(), "no step or epoch records in '", metrics_jsonl, "' to plot");
  const fs::path data = fs::path(out_dir) / "plot_data";
  const int64_t n_skipped = write_plot_data(data, steps, epochs);
  const std::string d = data.string() + "/";
  const fs::path png_la = fs::path(out_dir) / "loss_accuracy.png";
  const fs::path png_sc = fs::path(out_dir) / "loss_scale.png";
  const fs::path png_tp = fs::path(out_dir) / "throughput.png";
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1200,500 font 'sans,10'\n"
     << "set grid\nset key inside box opaque\nset autoscale xfix\n";
  std::vector<std::string> written;
  if (!epochs.empty()) {
    gp << "set output " << gnuplot_quoted(png_la.string() + ".tmp") << "\n"
       << "set multiplot layout 1,2 title 'ampp train: loss and accuracy by epoch'\n"
       << "set xlabel 'epoch'\nset ylabel 'cross-entropy loss'\nset xtics 1\nset offsets graph 0.03, graph 0.03, graph "
          "0.1, graph 0.1\nset key top right\n"
       << "plot " << gnuplot_quoted(d + "epochs.dat")
       << " using 1:2 with linespoints lw 2 pt 7 title 'train', '' using 1:3 with linespoints lw 2 pt 5 title 'test'\n"
       << "set ylabel 'accuracy (%)'\nset key bottom right\n"
       << "plot " << gnuplot_quoted(d + "epochs.dat")
       << " using 1:4 with linespoints lw 2 pt 7 title 'train', '' using 1:5 with linespoints lw 2 pt 5 title 'test'\n"
       << "unset multiplot\nset xtics autofreq\nset offsets 0, 0, 0, 0\n";
    written.push_back(png_la.string());
  }
  if (!steps.empty()) {
    gp << "set output " << gnuplot_quoted(png_sc.string() + ".tmp") << "\n"
       << "set title 'loss scale over steps (" << n_skipped << " skipped steps marked)'\n"
       << "set xlabel 'step'\nset ylabel 'loss scale'\nset logscale y 2\nset format y '2^{%L}'\nset key top right\n"
       << "set offsets graph 0.01, 0, graph 0.1, graph 0.1\n"
       << "plot " << gnuplot_quoted(d + "steps.dat") << " using 1:2 with steps lw 2 title 'loss scale'"
       << (n_skipped > 0
               ? ", " + gnuplot_quoted(d + "skipped.dat") +
                     " using 1:2 with points pt 6 ps 1.5 lc rgb 'red' title 'skipped step (inf/NaN gradients)'"
               : "")
       << "\nunset logscale y\nset format y '%g'\nset offsets 0, 0, 0, 0\nset key bottom right\n"
       << "set output " << gnuplot_quoted(png_tp.string() + ".tmp") << "\n"
       << "set title 'throughput over steps'\nset ylabel 'images / s (all workers)'\nset yrange [0:*]\n"
       << "plot " << gnuplot_quoted(d + "steps.dat") << " using 1:3 with lines lw 1.5 title 'images/s'\n";
    written.push_back(png_sc.string());
    written.push_back(png_tp.string());
  }
  const fs::path script = data / "plots.gp";
  write_file_atomic(script.string(), gp.str());
  run_gnuplot(script.string(), written);
  return written;
}

}  // namespace ampp::train
