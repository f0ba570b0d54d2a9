#pragma once
// LibTorch's unpickler turns `collections.OrderedDict()` into None (it only expects one as a tensor's
// empty backward-hooks argument), so a torch.save file holding a module's state_dict() (an OrderedDict
// with a `_metadata` attribute) fails to load in C++ ("Expected GenericDict but got None").
// plain_dicts() rewrites such a pickle (protocol 2, what torch.save writes) so that every
// OrderedDict() becomes an empty dict, and every BUILD(obj, state) (which LibTorch's unpickler cannot
// apply to a dict; torch.save uses it here to set `_metadata`) becomes the pair (obj, state), which
// without_metadata() unwraps after loading; and every SETITEM and APPEND (which LibTorch 1.13's
// unpickler does not know; Python writes them for one item) becomes MARK ... SETITEMS / APPENDS.
// Everything else is copied byte for byte, and LibTorch's own unpickler reads the result.
#include <ATen/core/ivalue.h>

#include <string>

namespace ampp::detail {

std::string plain_dicts(const std::string& pickle);

// `value` with every (dict, {"_metadata": ...}) pair replaced by the dict; any other pair made from
// a BUILD cannot be told from a real tuple, so only that exact shape is unwrapped.
c10::IValue without_metadata(const c10::IValue& value);

}  // namespace ampp::detail
