#pragma once
// Which CUDA libraries this process loaded, and their versions: ampp's side and Python's can load
// different cuBLAS or cuDNN builds (the toolkit's or the wheel's), and then run different kernels.
#include <nlohmann/json.hpp>

namespace ampp::bench {

/// [{"library": "cublasLt", "path": "/.../libcublasLt.so.13", "version": "13.0.2"}, ...]: every mapped
/// cudart, cuBLAS, cuBLASLt, cuDNN and NCCL, the version asked of the library itself. Empty on a CPU.
nlohmann::json loaded_cuda_libraries();

}  // namespace ampp::bench
