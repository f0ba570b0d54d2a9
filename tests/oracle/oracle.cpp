// See oracle.h.

#include "oracle/oracle.h"

#include <ampp/util/remove_tree.h>
#include <c10/util/Exception.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace ampp_oracle {
namespace {

namespace fs = std::filesystem;

// Exit code of oracle_common.import_torch() when `import torch` fails.
constexpr int kTorchMissingExit = 3;

std::string& skip_reason() {
  static std::string reason;
  return reason;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory per call: concurrent ctest processes never share files.
fs::path make_work_dir() {
  static std::atomic<int> counter{0};
  const fs::path dir =
      fs::temp_directory_path() / ("ampp_oracle_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  return dir;
}

// Integer view with the dtype's element size (bits are moved through it).
c10::ScalarType int_view(int64_t element_size) {
  switch (element_size) {
    case 1:
      return torch::kUInt8;
    case 2:
      return torch::kShort;
    case 4:
      return torch::kInt;
    case 8:
      return torch::kLong;
  }
  TORCH_CHECK(false, "ampp_oracle: no integer view for element size ", element_size);
}

uint64_t mask_of(int64_t element_size) {
  return element_size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * element_size)) - 1;
}

std::string describe_element(const torch::Tensor& t, int64_t i) {
  std::ostringstream os;
  const auto flat = t.reshape(-1);
  const auto bits =
      static_cast<uint64_t>(flat.view(int_view(t.element_size()))[i].item<int64_t>()) & mask_of(t.element_size());
  if (c10::isComplexType(t.scalar_type()))
    os << "complex";
  else if (t.scalar_type() == torch::kBool)
    os << flat[i].item<bool>();
  else
    os << std::setprecision(17) << flat[i].item<double>();
  os << " (0x" << std::hex << bits << ")";
  return os.str();
}

}  // namespace

std::optional<json> run(const std::string& script, const json& input) {
  const std::string python = AMPP_ORACLE_PYTHON;
  if (::access(python.c_str(), X_OK) != 0) {
    skip_reason() = "not an executable file";
    return std::nullopt;
  }
  const fs::path dir = make_work_dir();
  const fs::path in = dir / "in.json", out = dir / "out.json", err = dir / "stderr.txt";
  {
    std::ofstream f(in);
    f << input.dump();
    TORCH_CHECK(f.good(), "ampp_oracle: cannot write ", in.string());
  }
  const std::string command = "AMPP_ORACLE_TORCH=" + std::string(AMPP_ORACLE_TORCH_VERSION) + " " +
                              shell_quote(python) + " " + shell_quote(std::string(AMPP_ORACLE_DIR) + "/" + script) +
                              " " + shell_quote(in.string()) + " " + shell_quote(out.string()) + " 2>" +
                              shell_quote(err.string());
  const int status = std::system(command.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::string stderr_text = read_text(err);
  if (code == kTorchMissingExit) {
    skip_reason() = stderr_text;
    ampp::remove_tree(dir.string());
    return std::nullopt;
  }
  TORCH_CHECK(code == 0, "ampp_oracle: `", command, "` failed (status ", status, ", exit code ", code,
              "); its stderr:\n", stderr_text, "\n(case file kept in ", dir.string(), ")");
  json result = json::parse(read_text(out));
  ampp::remove_tree(dir.string());
  return result;
}

std::vector<torch::Tensor> randn_tensors(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> tensors;
  for (const auto& shape : shapes) tensors.push_back(torch::randn(shape, gen));
  return tensors;
}

std::string skip_message() {
  return std::string("no Python oracle for LibTorch ") + AMPP_ORACLE_TORCH_VERSION + " at " + AMPP_ORACLE_PYTHON +
         ": " + skip_reason() +
         " (without torch: run scripts/install-deps.sh, or configure with "
         "-DAMPP_PYTHON=<a python with that torch>)";
}

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return "float32";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kHalf:
      return "float16";
    case torch::kDouble:
      return "float64";
    case torch::kLong:
      return "int64";
    case torch::kInt:
      return "int32";
    case torch::kBool:
      return "bool";
    case torch::kComplexFloat:
      return "complex64";
    default:
      break;
  }
  TORCH_CHECK(false, "ampp_oracle: dtype ", c10::toString(type), " has no oracle name; add it to dtype_name");
}

c10::ScalarType dtype_from_name(const std::string& name) {
  for (auto t : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble, torch::kLong, torch::kInt, torch::kBool,
                 torch::kComplexFloat})
    if (dtype_name(t) == name) return t;
  TORCH_CHECK(false, "ampp_oracle: unknown dtype name '", name, "' from the oracle");
}

json encode(const torch::Tensor& t) {
  const auto c = t.detach().contiguous().cpu();
  const auto ints = c.view(int_view(c.element_size())).reshape(-1).to(torch::kLong);
  const auto mask = mask_of(c.element_size());
  std::vector<uint64_t> bits(static_cast<size_t>(ints.numel()));
  const int64_t* p = ints.data_ptr<int64_t>();
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint64_t>(p[i]) & mask;
  return {{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()}, {"bits", bits}};
}

torch::Tensor decode(const json& j) {
  const auto type = dtype_from_name(j.at("dtype").get<std::string>());
  const auto bits = j.at("bits").get<std::vector<uint64_t>>();
  const auto shape = j.at("shape").get<std::vector<int64_t>>();
  std::vector<int64_t> as_long(bits.begin(), bits.end());  // two's complement: the low bits survive
  const auto size = c10::elementSize(type);
  const auto ints = torch::tensor(as_long, torch::kLong).to(int_view(static_cast<int64_t>(size)));
  return ints.view(type).reshape(shape).clone();
}

uint64_t double_bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

double bits_double(uint64_t bits) {
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

::testing::AssertionResult same_bits(const torch::Tensor& ampp, const torch::Tensor& oracle) {
  if (ampp.scalar_type() != oracle.scalar_type())
    return ::testing::AssertionFailure() << "dtype: ampp " << dtype_name(ampp.scalar_type()) << ", torch "
                                         << dtype_name(oracle.scalar_type());
  if (ampp.sizes() != oracle.sizes())
    return ::testing::AssertionFailure() << "shape: ampp " << ampp.sizes() << ", torch " << oracle.sizes();
  const auto view = int_view(ampp.element_size());
  const auto a = ampp.detach().contiguous().view(view).reshape(-1);
  const auto b = oracle.detach().contiguous().view(view).reshape(-1);
  const auto differ = torch::nonzero(a != b).reshape(-1);
  if (differ.numel() == 0) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << differ.numel() << " of " << a.numel() << " elements differ";
  for (int64_t k = 0; k < std::min<int64_t>(differ.numel(), 4); ++k) {
    const int64_t i = differ[k].item<int64_t>();
    failure << "\n  [" << i << "] ampp " << describe_element(ampp.contiguous(), i) << ", torch "
            << describe_element(oracle.contiguous(), i);
  }
  return failure;
}

}  // namespace ampp_oracle
