#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// LibTorch's serialized archives as bytes, which every checkpoint writer hands to write_file_atomic.
#include <torch/serialize/output-archive.h>

#include <string>

namespace ampp {

/// The bytes of `archive` as torch::save writes them (LibTorch's save_to is not const, hence no const).
std::string archive_bytes(torch::serialize::OutputArchive& archive);

/// Writes `archive` to `path` through write_file_atomic: the previous file or the new one, never half.
void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path);

}  // namespace ampp
