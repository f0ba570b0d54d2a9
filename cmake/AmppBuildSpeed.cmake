# LibTorch headers cost ~20 s per translation unit; ccache and one shared precompiled header
# bring a warm rebuild down to seconds (times in docs/build.md).
find_program(AMPP_CCACHE ccache)
# BASEDIR: relative paths let build trees beside each other share cache entries.
get_filename_component(AMPP_CCACHE_BASEDIR ${PROJECT_SOURCE_DIR} DIRECTORY)
if(AMPP_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # pch_defines/time_macros: required for ccache to cache translation units that use a PCH.
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${AMPP_CCACHE_BASEDIR}
      ${AMPP_CCACHE})
endif()

if(AMPP_SANITIZE)
  # Instrument ampp's own code only; LibTorch is not rebuilt.
  add_compile_options(-fsanitize=${AMPP_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  # -O1 -g1 (after the build type's -O2 -g, so they win): AddressSanitizer's recommended level, and
  # line tables are all its reports need. Halves the instrumented compile (reducer.cpp without the
  # PCH: 102 s at -O2 -g, 44 s at -O1 -g1; docs/build.md).
  add_compile_options(-O1 -g1)
  add_link_options(-fsanitize=${AMPP_SANITIZE})
endif()

# Debug information of optimised builds: line tables (-g1) give backtraces, perf and sanitizer
# reports their file:line and shrink the shared PCH (855 -> 703 MB, 47 -> 33 s to build) and every
# translation unit; full -g (local variables) is one flag away or a Debug build.
set(AMPP_OPTIMIZED_DEBUG_INFO -g1 CACHE STRING "Debug-info flag of RelWithDebInfo builds (-g1 or -g)")
if(CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo")
  add_compile_options(${AMPP_OPTIMIZED_DEBUG_INFO})  # after the build type's -g, so it wins
endif()
