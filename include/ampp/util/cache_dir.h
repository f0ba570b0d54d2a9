#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Where ampp keeps what it can rebuild (layout measurements, decompressed datasets): the user's cache
// folder, as the XDG base directory specification defines it.
#include <string>

namespace ampp {

/// $XDG_CACHE_HOME/ampp when set, else $HOME/.cache/ampp, else /tmp/.cache/ampp. Not created here.
std::string user_cache_dir();

}  // namespace ampp
