#pragma once
// The JSON form of `ampp train`'s reports: metrics.jsonl's records, summary.json (with the step
// phases, the memory report and the operator profile), their readers, and the doctor's report.
// Internal: ampp's public headers carry no JSON type, so a program using ampp needs no nlohmann-json.
#include <ampp/train/memory_report.h>
#include <ampp/train/metrics.h>
#include <ampp/train/op_profile.h>
#include <ampp/train/step_phases.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace ampp::train {

nlohmann::json to_json(const StepRecord& r);
nlohmann::json to_json(const EpochRecord& r);
nlohmann::json to_json(const Summary& s);
nlohmann::json to_json(const StepPhases& phases);  // {"data": ms per step, ..., "step": ms, "steps": n}
nlohmann::json to_json(const OpProfile& profile);
nlohmann::json to_json(const MemoryReport& report);

// The inverses of to_json (each throws naming the record when a key is missing).
Summary summary_from_json(const nlohmann::json& j);
StepPhases step_phases_from_json(const nlohmann::json& j);
OpProfile op_profile_from_json(const nlohmann::json& j);
MemoryReport memory_report_from_json(const nlohmann::json& j);

// Appends one line per record to `path` (flushed per line, so a killed run keeps its log).
class MetricsWriter {
 public:
  // append=false truncates (a fresh run); true continues (a resumed run).
  MetricsWriter(const std::string& path, bool append);
  void write(const StepRecord& r) { write_line(to_json(r)); }
  void write(const EpochRecord& r) { write_line(to_json(r)); }
  void write_line(const nlohmann::json& j);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Parses a metrics.jsonl file (throws naming the line on malformed JSON).
std::vector<nlohmann::json> read_jsonl(const std::string& path);

}  // namespace ampp::train
