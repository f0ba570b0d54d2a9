set(AMPP_LAYER_TARGETS "" CACHE INTERNAL "")

# One precompiled header (LibTorch) built once and reused by every ampp target.
add_library(ampp_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch.cpp)
target_link_libraries(ampp_pch PUBLIC torch)
target_precompile_headers(ampp_pch PRIVATE <torch/torch.h>)

function(ampp_use_pch target)
  target_precompile_headers(${target} REUSE_FROM ampp_pch)
endfunction()

# ampp_add_layer(<layer> [DEPS <other ampp layer targets or libraries>...])
# Builds src/ampp/<layer>/*.cpp into the static library ampp_<layer> (alias ampp::<layer>).
function(ampp_add_layer layer)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/ampp/${layer}/*.cpp)
  set(target ampp_${layer})
  add_library(${target} STATIC ${sources})
  add_library(ampp::${layer} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${layer} OUTPUT_NAME ampp_${layer})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src ${AMPP_GLOO_INCLUDE_DIR})
  target_link_libraries(${target} PUBLIC torch ${ARG_DEPS})
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  # libstdc++ listed before LibTorch in every program that links ampp: the dynamic linker then binds
  # std:: symbols to libstdc++ itself. Some torch wheels (2.11 seen) export their own, incompatible
  # copies of std::filesystem (remove_all there jumped to address 0 when called from ampp).
  target_link_options(${target} INTERFACE
    "$<$<PLATFORM_ID:Linux>:SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state>")
  if(AMPP_SANITIZE)
    # Instrumented objects need the sanitizers' runtime: a program linking an installed sanitized ampp
    # gets it from ampp::ampp, as the programs of this build get it from add_link_options.
    target_link_options(${target} INTERFACE -fsanitize=${AMPP_SANITIZE})
  endif()
  ampp_use_pch(${target})
  # Unity batches of 4 sources: one load of the 0.7 GB PCH (~5.5 s) and one compile of the inline LibTorch
  # code the sources share per batch instead of per source (the wheel's libraries, cold, with -g1 below:
  # 774 s of compile as 59 units, 258 s as 21; docs/build.md).
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  set(AMPP_LAYER_TARGETS ${AMPP_LAYER_TARGETS} ${target} CACHE INTERNAL "")
endfunction()

# ampp_add_test_suite(<name> SOURCES ... LIBS ... [LABELS ...])
# One GoogleTest executable; its tests are discovered when ctest runs (not at build time).
function(ampp_add_test_suite name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS;PROPERTIES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  # Whether LibTorch was built with CUDA (and NCCL): a CUDA wheel without a GPU must otherwise behave as
  # the CPU one, and the tests say where it may not.
  if(AMPP_TORCH_CUDA_VERSION)
    target_compile_definitions(${name} PRIVATE AMPP_TEST_TORCH_HAS_CUDA=1)
  else()
    target_compile_definitions(${name} PRIVATE AMPP_TEST_TORCH_HAS_CUDA=0)
  endif()
  ampp_use_pch(${name})
  # Test code drives the library (built at the build type's level) and need not be optimised itself:
  # -O1 with line tables compiles a suite file in 60% of the time (join_test.cpp: 23.4 s at -O2 -g,
  # 13.9 s at -O1 -g1) and keeps file:line in failures. Unity batches as for the layers.
  target_compile_options(${name} PRIVATE -O1 -g1)
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  if(AMPP_TEST_SHARDS GREATER 0 AND NOT "gpu" IN_LIST ARG_LABELS)
    ampp_add_test_shards(${name} "${ARG_LABELS}")
    return()
  endif()
  # A GTEST_SKIP (no GPU, no Python oracle) shows as skipped in ctest's summary, not as passed.
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${ARG_LABELS}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" ${ARG_PROPERTIES})
endfunction()

# AMPP_TEST_SHARDS=N: the suite as N ctest tests, each one GoogleTest shard (GTEST_SHARD_INDEX) running its
# share of the tests in one process, instead of one process per test. A process that loads LibTorch starts in
# 0.4 s, but in 1.9 s with the CUDA wheel under the sanitizers (its static initialisers through ASan's malloc,
# and the leak check of 1 GB at exit), which is most of what a unit test costs there (CI's sanitizer pass).
# GTEST_FILTER in the environment selects tests. The GPU suite stays one test per process: CI checks that
# each of its tests skips.
function(ampp_add_test_shards name labels)
  math(EXPR last "${AMPP_TEST_SHARDS} - 1")
  foreach(i RANGE ${last})
    add_test(NAME ${name}.shard${i}of${AMPP_TEST_SHARDS} COMMAND ${name} --gtest_brief=1)
    set_tests_properties(${name}.shard${i}of${AMPP_TEST_SHARDS} PROPERTIES LABELS "${labels}" TIMEOUT 1800
      ENVIRONMENT "GTEST_TOTAL_SHARDS=${AMPP_TEST_SHARDS};GTEST_SHARD_INDEX=${i}")
  endforeach()
endfunction()
