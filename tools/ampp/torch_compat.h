#pragma once
// What the command-line tool needs from LibTorch beyond the library's layers.
#include <ampp/util/torch_version.h>

// c10::Event::elapsedTime, the GPU's own clock between two events (bench_command.cpp): LibTorch 2.8 and newer.
#define AMPP_HAS_EVENT_ELAPSED_TIME AMPP_TORCH_AT_LEAST(2, 8)
