#pragma once
// Checks an untrusted pickle before LibTorch's unpickler sees it. That unpickler trusts its input:
// it grows its memo table to any index a file names (std::bad_alloc), resolves globals through
// TorchScript's type parser, and builds objects of any nesting depth, which C++ then destroys and
// walks recursively (a stack overflow). check_pickle() walks the opcodes once, iteratively, with a
// model of the objects they build, and refuses:
//   - opcodes outside the binary protocol-2 subset torch.save writes, and arguments past the end;
//   - memo indices out of order (LibTorch numbers its memo by arrival, as Python's pickler writes it);
//   - globals other than those a tensor state dict needs (kAllowedGlobals in pickle_guard.cpp);
//   - objects nested deeper than kMaxPickleDepth, and containers changed after they were nested
//     (the only way a pickle can make a cycle, which the checks above could not bound);
//   - anything after STOP, or a missing STOP.
// Errors are c10::Error with one line saying what and where (the byte offset).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace ampp::detail {

/// Whose pickle it is: torch.save's (tensors, numbers, strings and containers), or a torch::serialize
/// archive's data.pkl, which also names the archive's module classes (`__torch__.Module`,
/// `__torch__.___torch_mangle_<n>.Module`) and tags typed containers (torch.jit._pickle.restore_type_tag).
enum class PickleSource { kTorchSave, kArchive };

/// Far above what checkpoints use (a model's state dict inside a training checkpoint is 4 deep).
constexpr size_t kMaxPickleDepth = 256;

/// Each storage's location as the pickle names it ("cpu", "cuda:0"), by its record key ("0" for data/0).
using StorageLocations = std::map<std::string, std::string>;

/// Refuses the pickle (c10::Error) or returns where its storages were saved.
StorageLocations check_pickle(const std::string& pickle, PickleSource source = PickleSource::kTorchSave);

/// Bytes of the argument of opcode `op` that starts at `at` (after the opcode byte); refuses opcodes
/// check_pickle() does not accept and arguments whose length runs past the end.
size_t pickle_argument_length(char op, const std::string& pickle, size_t at);
/// The memo index argument of BINPUT/LONG_BINPUT/BINGET/LONG_BINGET at `at`.
uint32_t pickle_memo_index(char op, const std::string& pickle, size_t at);

}  // namespace ampp::detail
