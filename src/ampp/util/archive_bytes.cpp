// archive_bytes.h: an OutputArchive through a string stream.
#include <ampp/util/archive_bytes.h>

#include <ampp/util/atomic_file.h>

#include <sstream>

namespace ampp {

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path) {
  write_file_atomic(path, archive_bytes(archive));
}

}  // namespace ampp
