// loaded_libraries.h: /proc/self/maps for the paths, each library's own version call through dlsym (the
// same calls as python_side.py makes through ctypes).
#include "loaded_libraries.h"

#include <dlfcn.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace ampp::bench {
namespace {

// The library a mapped file is, by the start of its name ("" when none of those asked about).
std::string library_of(const std::string& path) {
  const std::string base = path.substr(path.rfind('/') + 1);
  for (const char* name : {"libcublasLt.so", "libcublas.so", "libcudnn.so", "libnccl.so", "libcudart.so"})
    if (base.rfind(name, 0) == 0) return std::string(name).substr(3, std::string(name).size() - 6);
  return "";
}

// major.minor.patch from one integer, as each library encodes it.
std::string dotted(long v, long major_div, long minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string(v % major_div / minor_div) + "." +
         std::to_string(v % minor_div);
}

std::string version_of(const std::string& library, const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return "?";
  std::string version = "?";
  if (library == "cublasLt" || library == "cudnn") {
    using Get = size_t (*)();
    if (auto f = reinterpret_cast<Get>(dlsym(handle, library == "cudnn" ? "cudnnGetVersion" : "cublasLtGetVersion")))
      version = dotted(static_cast<long>(f()), 10000, 100);  // both: major * 10000 + minor * 100 + patch
  } else if (library == "cublas") {
    using Get = int (*)(int, int*);  // cublasGetProperty(MAJOR_VERSION = 0, MINOR = 1, PATCH = 2)
    if (auto f = reinterpret_cast<Get>(dlsym(handle, "cublasGetProperty"))) {
      int part[3] = {-1, -1, -1};
      for (int i = 0; i < 3; ++i) f(i, &part[i]);
      version = std::to_string(part[0]) + "." + std::to_string(part[1]) + "." + std::to_string(part[2]);
    }
  } else {
    using Get = int (*)(int*);
    const char* symbol = library == "nccl" ? "ncclGetVersion" : "cudaRuntimeGetVersion";
    int v = -1;
    if (auto f = reinterpret_cast<Get>(dlsym(handle, symbol)); f && f(&v) == 0)
      version = library == "nccl" ? dotted(v, 10000, 100) : dotted(v, 1000, 10);
  }
  dlclose(handle);
  return version;
}

}  // namespace

nlohmann::json loaded_cuda_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> paths;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && !library_of(line.substr(slash)).empty()) paths.insert(line.substr(slash));
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& path : paths) {
    const std::string library = library_of(path);
    out.push_back({{"library", library}, {"path", path}, {"version", version_of(library, path)}});
  }
  return out;
}

}  // namespace ampp::bench
