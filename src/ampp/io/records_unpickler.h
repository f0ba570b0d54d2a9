#pragma once
// LibTorch's unpickler over a pickle that check_pickle() (pickle_guard.h) has passed, with every storage
// read from the zip's "data/<key>" record onto the CPU and the file's format version ("version" or
// ".data/version") applied; then every tensor, inside containers and objects alike, is checked against
// its record: dense, on the CPU, inside its storage, and the storage exactly as long as its record.
#include "pickle_guard.h"
#include "zip_records.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <string>

namespace ampp::detail {

struct UnpickleOptions {
  /// Resolve and build the classes a pickle names (an archive's modules); without them a class is an error.
  torch::jit::TypeResolver types = nullptr;
  torch::jit::ObjLoader objects = nullptr;
  /// Where each storage was saved (check_pickle() reads it): once every tensor has passed its checks on
  /// the CPU, storages saved elsewhere ("cuda:0") move there, views of one storage still sharing it.
  /// Without it every tensor stays on the CPU (map_location="cpu").
  const StorageLocations* locations = nullptr;
};

c10::IValue unpickle_with_records(ZipRecords& zip, const std::string& pickle, UnpickleOptions options = {});

}  // namespace ampp::detail
