#pragma once
// The module classes a torch::serialize archive declares in its code/ records, and of each the attributes
// that are parameters and buffers: the one fact read_archive() takes from the TorchScript source, read line
// by line from the `class` lines and the `__parameters__ = [...]` and `__buffers__ = [...]` lists that
// LibTorch's exporter writes. Nothing else in the source is read, compiled or run.
#include "zip_records.h"

#include <map>
#include <set>
#include <string>

namespace ampp::detail {

struct ArchiveClass {
  std::set<std::string> parameters, buffers;
};

/// By qualified name: "__torch__.Module", "__torch__.___torch_mangle_3.Module".
using ArchiveClasses = std::map<std::string, ArchiveClass>;

ArchiveClasses archive_classes(ZipRecords& zip);

}  // namespace ampp::detail
