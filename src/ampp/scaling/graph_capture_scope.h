#pragma once
// Internal to ampp: whether this thread is inside CudaGraphStep's capture. A captured graph replays the
// decisions its host code made while capturing, so code that decides on the host from what it has seen
// so far (GradScaler's bound on the scale) must take the choice that is right for every replay.
namespace ampp::scaling::detail {

bool capturing_a_graph();

// Marks this thread as capturing while alive.
class GraphCaptureScope {
 public:
  GraphCaptureScope();
  ~GraphCaptureScope();
  GraphCaptureScope(const GraphCaptureScope&) = delete;
  GraphCaptureScope& operator=(const GraphCaptureScope&) = delete;

 private:
  bool before_;
};

}  // namespace ampp::scaling::detail
