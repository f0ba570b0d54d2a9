// read_archive() (archive_reader.h): an archive's module tree rebuilt from its data.pkl without compiling
// its code/, then exported by LibTorch and loaded from those trusted bytes.
#include <ampp/io/archive_reader.h>

#include "archive_classes.h"
#include "pickle_guard.h"
#include "records_unpickler.h"
#include "zip_records.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/mobile/type_parser.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

namespace ampp {
namespace {

// The type of a tagged container ("Dict[str, Tensor]", "List[int]"), parsed by LibTorch's type parser as
// the unpickler would, once the string is known to name no class and to nest shallowly: that parser
// recurses on the nesting.
c10::TypePtr container_type(const std::string& text) {
  size_t depth = 0, deepest = 0;
  for (const char c : text) {
    TORCH_CHECK(std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_[], ", c) != nullptr,
                "data.pkl builds a '", text.substr(0, 80),
                "', which is neither a container type nor a module class "
                "the archive declares in code/");
    depth += c == '[';
    depth -= c == ']' && depth > 0;
    deepest = std::max(deepest, depth);
  }
  TORCH_CHECK(text.size() <= 256 && deepest <= 8, "data.pkl tags a container with a type nested ", deepest, " deep (",
              text.size(), " characters); ampp's archives nest a few levels");
  return c10::parseType(text);
}

// An attribute's name goes into the TorchScript that LibTorch's exporter writes (`name : Type`, or
// `__annotations__["name"] = Type`), which torch::jit::load then compiles: only the characters of the names
// LibTorch's archives use (module paths, "param_groups/0") may reach it, so no name can end the string or
// the line it is written in.
void check_attribute_name(const std::string& module, const std::string& name) {
  const bool safe = !name.empty() && name.size() <= 256 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./-", c) != nullptr;
  });
  if (safe) return;
  std::string shown = name.substr(0, 80);
  for (char& c : shown)
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  TORCH_CHECK(false, "module ", module, " has an attribute named '", shown,
              "': names are letters, digits and _ . / - (at most 256)");
}

// Resolves the module classes data.pkl names to fresh class types, and builds each module object from
// the attribute dict the pickle gives it, typed by its values.
class ModuleTreeBuilder {
 public:
  explicit ModuleTreeBuilder(detail::ArchiveClasses classes)
      : classes_(std::move(classes)), unit_(std::make_shared<torch::jit::CompilationUnit>()) {}

  c10::StrongTypePtr resolve(const c10::QualifiedName& name) {
    const auto known = types_.find(name.qualifiedName());
    if (known != types_.end()) return {unit_, known->second};
    if (!classes_.count(name.qualifiedName())) return {unit_, container_type(name.qualifiedName())};
    auto type = c10::ClassType::create(name, unit_, /*is_module=*/true);
    unit_->register_type(type);
    types_.emplace(name.qualifiedName(), type);
    return {unit_, type};
  }

  c10::intrusive_ptr<c10::ivalue::Object> build(const c10::StrongTypePtr& strong, const c10::IValue& state) {
    const auto type = strong.type_->expect<c10::ClassType>();
    const std::string name = type->name()->qualifiedName();
    TORCH_CHECK(state.isGenericDict(), "module ", name, " is built from a ", state.tagKind(), ", not a dict");
    const auto& declared = classes_.at(name);
    const auto attributes = state.toGenericDict();
    auto object = c10::ivalue::Object::create(strong, attributes.size());
    for (const auto& item : attributes) {
      TORCH_CHECK(item.key().isString(), "module ", name, " has an attribute named by a ", item.key().tagKind());
      const std::string& key = item.key().toStringRef();
      check_attribute_name(name, key);
      const bool parameter = declared.parameters.count(key) > 0, buffer = declared.buffers.count(key) > 0;
      TORCH_CHECK(!(parameter || buffer) || item.value().isTensor(), "module ", name, " declares '", key,
                  "' a parameter or buffer, but it holds a ", item.value().tagKind());
      const size_t slot = type->addOrCheckAttribute(key, c10::unshapedType(item.value().type()), parameter, buffer);
      object->setSlot(slot, item.value());
    }
    TORCH_CHECK(type->numAttributes() == attributes.size(), "two modules of class ", name,
                " hold different attributes");
    return object;
  }

 private:
  detail::ArchiveClasses classes_;
  std::shared_ptr<torch::jit::CompilationUnit> unit_;
  std::map<std::string, c10::ClassTypePtr> types_;
};

// `to_saved_devices`: storages saved off the CPU go back there; else every tensor stays on the CPU.
torch::jit::Module module_tree(detail::ZipRecords& zip, bool to_saved_devices) {
  ModuleTreeBuilder builder(detail::archive_classes(zip));
  const std::string pickle = zip.read_string("data.pkl");
  const auto locations = detail::check_pickle(pickle, detail::PickleSource::kArchive);
  detail::UnpickleOptions options;
  options.types = [&](const c10::QualifiedName& name) { return builder.resolve(name); };
  options.objects = [&](const c10::StrongTypePtr& type, c10::IValue state) { return builder.build(type, state); };
  if (to_saved_devices) options.locations = &locations;
  const c10::IValue root = detail::unpickle_with_records(zip, pickle, std::move(options));
  TORCH_CHECK(root.isObject() && root.toObjectRef().type()->is_module(), "data.pkl holds a ", root.tagKind(),
              ", not an archive's module");
  return torch::jit::Module(root.toObject());
}

}  // namespace

// Memory: the untrusted bytes are freed once the tree is built, and the tree once it is exported, so at
// most two copies of the archive's tensors are alive at a time (three while the export is copied out).
void read_archive(torch::serialize::InputArchive& archive, std::string bytes, std::optional<c10::Device> map_location) {
  std::string trusted;
  {
    const torch::jit::Module tree = [&] {
      auto zip = detail::ZipRecords::of_bytes(std::move(bytes));
      return module_tree(zip, /*to_saved_devices=*/!map_location);
    }();
    std::ostringstream exported;
    tree.save(exported);
    trusted = exported.str();
  }
  archive.load_from(trusted.data(), trusted.size(), map_location);
}

void read_archive_file(torch::serialize::InputArchive& archive, const std::string& path,
                       std::optional<c10::Device> map_location) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open '", path, "' to read an archive");
  try {
    read_archive(archive, std::string(std::istreambuf_iterator<char>(in), {}), map_location);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    TORCH_CHECK(false, "cannot read '", path, "' as a torch::serialize archive: ", what.substr(0, what.find('\n')));
  }
}

}  // namespace ampp
