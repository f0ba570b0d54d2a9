#pragma once
// ampp's version, the one place it is written (CMakeLists.txt reads it for find_package(ampp 0.2)).
// The policy (docs/changelog.md): within 0.x a minor version may break the API, and a public name that is
// removed or renamed stays one more minor version as a [[deprecated("use ...")]] alias; each version's
// breaking changes are listed under its own heading in the changelog.
#define AMPP_VERSION_MAJOR 0
#define AMPP_VERSION_MINOR 2
#define AMPP_VERSION_PATCH 0

/// True when the ampp compiled against is `major.minor.patch` or newer: #if AMPP_VERSION_AT_LEAST(0, 2, 0).
#define AMPP_VERSION_AT_LEAST(major, minor, patch)                                                    \
  (AMPP_VERSION_MAJOR > (major) || (AMPP_VERSION_MAJOR == (major) && AMPP_VERSION_MINOR > (minor)) || \
   (AMPP_VERSION_MAJOR == (major) && AMPP_VERSION_MINOR == (minor) && AMPP_VERSION_PATCH >= (patch)))

namespace ampp {

/// "major.minor.patch" of the library linked (which a program built against older headers may differ from).
const char* version();

}  // namespace ampp
