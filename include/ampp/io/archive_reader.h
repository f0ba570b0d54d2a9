#pragma once
// torch::serialize archives (what torch::save and OutputArchive::save_to write: checkpoint.ampp's payload,
// FSDP's sharded files) read from untrusted bytes. LibTorch's InputArchive::load_from hands the bytes to
// torch::jit::load, which trusts the zip and the pickle and compiles the TorchScript in the archive's code/
// records, so a crafted file reaches the TorchScript compiler and LibTorch's unchecked readers.
//
// read_archive() reads an archive as ampp reads torch.save files (pytorch_checkpoint.h): its own zip
// reader (bounds and CRC-32 checked), the pickle guard (opcodes, globals, memo, nesting; the only classes
// it lets through are the archive's modules), every tensor checked against its record on the CPU and then
// put on the device the caller names (map_location), or returned to the device it was saved on. Of the code/ records it
// reads one fact, which attributes each module class declares as parameters and buffers; nothing there is compiled or
// run. The module tree it builds is then written by LibTorch's own exporter and loaded into `archive`: torch::jit::load
// sees only bytes that LibTorch wrote in this process. Costs a second copy of the archive in memory while it loads.
#include <torch/serialize/input-archive.h>

#include <optional>
#include <string>

namespace ampp {

/// Fills `archive` from the bytes of a torch::serialize archive. Throws c10::Error with one line naming
/// the problem (the caller names the file). Tensors go to `map_location` when given, as torch.load's
/// map_location (one rank per GPU loads onto its own device, copied there once from the checked CPU
/// bytes); without it each goes back to the device it was saved on.
void read_archive(torch::serialize::InputArchive& archive, std::string bytes,
                  std::optional<c10::Device> map_location = std::nullopt);

/// The same from a file.
void read_archive_file(torch::serialize::InputArchive& archive, const std::string& path,
                       std::optional<c10::Device> map_location = std::nullopt);

}  // namespace ampp
