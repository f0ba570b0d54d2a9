#pragma once
// TensorBoard `Event` messages serialized (protobuf, tensorboard_event.proto). Built into a library of
// its own, without LibTorch's include folders: the torch wheel ships protobuf headers of another
// version, which would shadow the system's that protoc's code needs.
#include <ampp/train/tensorboard.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ampp::train::detail {

/// The first event of a file: its format version ("brain.Event:2").
std::string file_version_event(double wall_time);
/// One event of float32 scalars (TensorBoard's simple_value) at `step`.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& values);
/// One event of a histogram at `step`.
std::string histogram_event(double wall_time, int64_t step, const std::string& tag, const TensorBoardHistogram& h);

}  // namespace ampp::train::detail
