# Finds LibTorch. One switch, AMPP_TORCH, says which one (docs/build.md, "Supported LibTorch"):
#   wheel  (default) the torch==2.13.0 wheel in the checkout's .venv (scripts/install-deps.sh makes it);
#          CMake finds it through torch.utils.cmake_prefix_path of AMPP_PYTHON.
#   cuda   the same for a CUDA wheel (torch==2.14.1+cu130 in .venv-cuda): AMPP_PYTHON names its Python.
#          Any wheel built with CUDA (also AMPP_TORCH=wheel with such a torch, as on a GPU machine)
#          gets CUDA's toolkit from the nvcc on the PATH (or CUDAToolkit_ROOT).
#   debian whatever find_package(Torch) finds on its own: a LibTorch archive named with -DTorch_DIR=...
#          (Debian's own libtorch-dev, 1.13 on Debian 12, is older than ampp supports: refused below).
set(AMPP_TORCH "wheel" CACHE STRING "Which LibTorch to build against: wheel or debian")
set_property(CACHE AMPP_TORCH PROPERTY STRINGS wheel cuda debian)
set(AMPP_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python whose torch package provides LibTorch (AMPP_TORCH=wheel) and the oracle tests")

# The CUDA wheel's Caffe2Config looks for CUDA's toolkit, which the wheel-only search below cannot
# see: name it. nvcc says where its toolkit is (`TOP=` of a dry run), also when the nvcc on the
# PATH is a wrapper script elsewhere.
function(ampp_point_at_cuda_toolkit torch_cuda_version)
  if(NOT CUDAToolkit_ROOT)
    find_program(_nvcc nvcc HINTS ENV CUDA_HOME PATH_SUFFIXES bin)
    if(NOT _nvcc)
      message(FATAL_ERROR "This torch was built with CUDA ${torch_cuda_version}, and CMake needs CUDA's toolkit "
        "to use it. Fix: put the toolkit's nvcc on the PATH, or pass -DCUDAToolkit_ROOT=<toolkit folder>.")
    endif()
    execute_process(COMMAND ${_nvcc} -v --dryrun -x cu -c /dev/null -o /dev/null
                    OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(NOT _out MATCHES "#\\$ TOP=([^\n]*)")
      message(FATAL_ERROR "'${_nvcc}' did not say where its toolkit is; pass -DCUDAToolkit_ROOT=<toolkit folder>.")
    endif()
    get_filename_component(_root "${CMAKE_MATCH_1}" REALPATH)
    set(CUDAToolkit_ROOT "${_root}" CACHE PATH "CUDA toolkit of the CUDA LibTorch")
  endif()
  set(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_ROOT}" CACHE PATH "CUDA toolkit (FindCUDA's name)")
  set(CMAKE_CUDA_COMPILER "${CUDAToolkit_ROOT}/bin/nvcc" CACHE FILEPATH "nvcc of the CUDA toolkit")
  message(STATUS "ampp: CUDA ${torch_cuda_version} LibTorch; toolkit ${CUDAToolkit_ROOT}")
endfunction()

if(AMPP_TORCH STREQUAL "wheel" OR AMPP_TORCH STREQUAL "cuda")
  execute_process(COMMAND ${AMPP_PYTHON} -c
                  "import glob, os, torch.utils, torch.version; print(torch.utils.cmake_prefix_path); print(torch.version.cuda or 'none'); print(';'.join(sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), 'nvidia', '*', 'include')))))"
                  OUTPUT_VARIABLE _prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_VARIABLE _error RESULT_VARIABLE _result)
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "AMPP_TORCH=wheel: '${AMPP_PYTHON}' cannot import torch (${_error}).\n"
      "Fix: run scripts/install-deps.sh (it creates .venv with torch==2.13.0), point -DAMPP_PYTHON at a "
      "Python that has torch, or build against a LibTorch archive with -DAMPP_TORCH=debian -DTorch_DIR=....")
  endif()
  string(REPLACE "\n" ";" _prefix "${_prefix}")
  list(GET _prefix 1 AMPP_TORCH_CUDA_VERSION)
  set(AMPP_NVIDIA_INCLUDE_DIRS "")
  list(LENGTH _prefix _lines)
  if(_lines GREATER 2)  # a CPU wheel prints no third line
    list(SUBLIST _prefix 2 -1 AMPP_NVIDIA_INCLUDE_DIRS)
  endif()
  list(GET _prefix 0 _prefix)
  if(AMPP_TORCH_CUDA_VERSION STREQUAL "none")
    unset(AMPP_TORCH_CUDA_VERSION)
  endif()
  if(AMPP_TORCH_CUDA_VERSION)
    ampp_point_at_cuda_toolkit(${AMPP_TORCH_CUDA_VERSION})
  elseif(AMPP_TORCH STREQUAL "cuda")
    message(FATAL_ERROR "AMPP_TORCH=cuda, but the torch of '${AMPP_PYTHON}' was built without CUDA. Fix: "
      "AMPP_TORCH=cuda scripts/install-deps.sh (torch==2.14.1 in .venv-cuda), or -DAMPP_PYTHON=<a CUDA torch's Python>.")
  endif()
  # The CUDA runtime that the wheel's libtorch_cuda loads in Python (nvidia/*/lib), not the toolkit's:
  # ampp's programs then run on the same CUDA libraries as Python's torch (bench/gpu/compare.py prints
  # them). FindCUDAToolkit keeps this cached choice.
  if(AMPP_TORCH_CUDA_VERSION AND AMPP_NVIDIA_INCLUDE_DIRS AND NOT CUDA_cudart_LIBRARY)
    set(_wheel_lib_dirs ${AMPP_NVIDIA_INCLUDE_DIRS})
    list(TRANSFORM _wheel_lib_dirs REPLACE "/include$" "/lib")
    string(REGEX MATCH "^[0-9]+" _cuda_major "${AMPP_TORCH_CUDA_VERSION}")
    find_library(CUDA_cudart_LIBRARY NAMES libcudart.so.${_cuda_major} PATHS ${_wheel_lib_dirs} NO_DEFAULT_PATH)
    if(NOT CUDA_cudart_LIBRARY)
      unset(CUDA_cudart_LIBRARY CACHE)  # no runtime in the wheel's folders: the toolkit's, as before
    endif()
  endif()
  # TorchConfig's own look-ups (Caffe2, libtorch, libc10) search the system paths first, so with
  # Debian's libtorch-dev also installed they silently mix 1.13 into the build: search only the wheel.
  set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH OFF)
  set(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH OFF)
  find_package(Torch REQUIRED PATHS ${_prefix}/Torch NO_DEFAULT_PATH)
  unset(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH)
  unset(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH)
  # A CUDA wheel's headers include cuSPARSE's, cuBLAS's and NCCL's, which come with the nvidia-* wheels
  # beside torch, not always with the toolkit (a minimal one has no cusparse.h): after the toolkit's.
  if(AMPP_TORCH_CUDA_VERSION AND AMPP_NVIDIA_INCLUDE_DIRS)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${AMPP_NVIDIA_INCLUDE_DIRS})
  else()
    set(AMPP_NVIDIA_INCLUDE_DIRS "")
  endif()
  foreach(_found Caffe2_DIR TORCH_LIBRARY c10_LIBRARY)
    if(${_found} AND NOT ${_found} MATCHES "^${TORCH_INSTALL_PREFIX}")
      message(FATAL_ERROR "AMPP_TORCH=wheel, but ${_found}=${${_found}} is outside the wheel "
        "(${TORCH_INSTALL_PREFIX}). Fix: remove the build folder's CMakeCache.txt and configure again.")
    endif()
  endforeach()
elseif(AMPP_TORCH STREQUAL "debian")
  find_package(Torch REQUIRED)
else()
  message(FATAL_ERROR "AMPP_TORCH='${AMPP_TORCH}' is not known: use wheel (the default), cuda or debian")
endif()

# TORCH_INSTALL_PREFIX is set by TorchConfig.cmake; the version comes from TorchConfigVersion.cmake.
set(AMPP_TORCH_VERSION ${Torch_VERSION})
message(STATUS "ampp: LibTorch ${AMPP_TORCH_VERSION} (AMPP_TORCH=${AMPP_TORCH}) from ${TORCH_INSTALL_PREFIX}")
# What is built and tested: 2.13 (the CPU wheel, every test) and 2.14 (the CUDA wheel, compiled). Older
# LibTorch lacks what ampp compiles against (the float8 dtypes: 2.1; fused optimizer kernels: 2.4), so it
# is refused here rather than deep in a translation unit (Debian 12's libtorch-dev is 1.13).
if(AMPP_TORCH_VERSION VERSION_LESS 2.1)
  message(FATAL_ERROR "LibTorch ${AMPP_TORCH_VERSION} (${TORCH_INSTALL_PREFIX}) is too old for ampp, which "
    "needs 2.1+ and is tested with 2.13 and 2.14. Fix: use the default wheel (bash scripts/install-deps.sh, "
    "no AMPP_TORCH), or pass -DTorch_DIR=<a LibTorch 2.13+ archive>/share/cmake/Torch.")
elseif(AMPP_TORCH_VERSION VERSION_LESS 2.13)
  message(WARNING "ampp: LibTorch ${AMPP_TORCH_VERSION} is untested; ampp is built and tested with 2.13 and 2.14.")
endif()

# LibTorch 2.14 and later require C++20; earlier ones accept C++17, ampp's default.
if(AMPP_TORCH_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
  message(STATUS "ampp: LibTorch ${AMPP_TORCH_VERSION} needs C++20: CMAKE_CXX_STANDARD set to 20")
  set(CMAKE_CXX_STANDARD 20)
endif()

# The wheel links Gloo statically into libtorch_cpu and ships no Gloo headers: ampp compiles against
# libgloo-dev's headers but must never link Debian's libgloo next to it (two Gloos in one process).
# Debian's LibTorch links libgloo.so itself; only then does ampp link it too (AMPP_LINK_GLOO).
set(AMPP_LINK_GLOO OFF)
if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so")
  set(_torch_cpu "${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so")
else()
  find_library(_torch_cpu torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib")
endif()
if(_torch_cpu)
  execute_process(COMMAND readelf -d "${_torch_cpu}" OUTPUT_VARIABLE _dynamic ERROR_QUIET)
  if(_dynamic MATCHES "NEEDED[^\n]*libgloo")
    set(AMPP_LINK_GLOO ON)
  endif()
endif()

# OpenMP runtime of ampp's parallel loops (numerics/parallel_chunks.cpp, which calls GNU's OpenMP ABI
# itself, so that gcc and clang builds both run on LibTorch's pool): the one LibTorch runs on. The wheel
# bundles its own libgomp.so.1; linking another next to it would give two OpenMP pools. Debian's LibTorch
# runs on the system's libgomp (gcc's, which clang finds too).
if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
  set(AMPP_OPENMP_LIBRARIES "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
else()
  set(AMPP_OPENMP_LIBRARIES gomp)
endif()

# Installed programs must find the LibTorch they were linked with, also where it is on no default
# search path (the wheel's torch/lib): without this, the loader would pick Debian's libtorch when
# both are installed, and fail on the first missing symbol.
if(NOT TORCH_INSTALL_PREFIX STREQUAL "/usr")
  list(APPEND CMAKE_INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")
endif()
