#pragma once
// Internal to ampp (its layers, CLI and tests): not part of the API that <ampp/ampp.h> is; may change.
// Files that are either the old version or the new one, never half of either: every output ampp
// writes (checkpoints, model.pt, summary.json, plots) goes through here.
#include <string>
#include <string_view>
#include <vector>

namespace ampp {

/// Writes `bytes` to `path`: a temporary file in the same folder, write, fsync, rename over `path`,
/// fsync of the folder. A crash or a full disk at any point leaves the previous file (or none) and
/// no temporary file; errors are one line (c10::Error) naming `path` and the cause. Creates the
/// folder when missing.
void write_file_atomic(const std::string& path, std::string_view bytes);
/// The same for a file made of several pieces, written one after the other (no joined copy in memory).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

/// The temporary file write_file_atomic(path, ...) of this process writes before the rename:
/// `<path>.tmp.<pid>`. Leftovers of killed writers are removed by the next successful write.
std::string temporary_path_for(const std::string& path);

/// Moves the finished file `from` (written by someone else, e.g. gnuplot) over `to` in the same
/// folder: fsync, rename, fsync of the folder. Removes `from` on failure.
void commit_file(const std::string& from, const std::string& to);

/// Checks now, before hours of work, that files can be created in `folder` (creating it if
/// needed): throws a one-line c10::Error starting with `what` otherwise, e.g. "TrainOptions::out".
void check_writable_folder(const std::string& folder, const std::string& what);

}  // namespace ampp
