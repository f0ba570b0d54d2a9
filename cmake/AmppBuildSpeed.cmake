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
