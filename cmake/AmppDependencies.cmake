include(${CMAKE_CURRENT_LIST_DIR}/AmppTorch.cmake)  # AMPP_TORCH: wheel or debian
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
# The wheel ships fmt's headers (12.x) in torch/include, which come first on the include path, so
# ampp then uses fmt header-only: compiling against one fmt and linking Debian's libfmt (9.x)
# would mix two versions. (With Debian's LibTorch, TORCH_INSTALL_PREFIX is /usr and the test also
# holds: header-only Debian fmt, the same version either way.)
# No public header includes fmt (nor nlohmann-json): header-only, they stay inside ampp's build
# (BUILD_INTERFACE) and an installed ampp does not ask for them. A linked libfmt has to be exported.
if(EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/format.h")
  set(AMPP_FMT $<BUILD_INTERFACE:fmt::fmt-header-only>)
  set(AMPP_EXPORTS_FMT OFF)
  add_compile_definitions(FMT_HEADER_ONLY)  # every target alike, so the shared PCH stays valid
else()
  set(AMPP_FMT fmt::fmt)
  set(AMPP_EXPORTS_FMT ON)
endif()
find_package(nlohmann_json REQUIRED)
# c10d's Gloo headers come from libgloo-dev.
find_path(AMPP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
if(NOT AMPP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers not found: install libgloo-dev (scripts/install-deps.sh does)")
endif()
if(AMPP_BUILD_TOOLS OR AMPP_BUILD_EXAMPLES)
  find_package(CLI11 REQUIRED)
endif()
if(AMPP_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(AMPP_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
