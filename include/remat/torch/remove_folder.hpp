// remat/torch/remove_folder.hpp — remove_folder(): std::filesystem::remove_all for programs
// that link LibTorch.
//
// The package index's LibTorch (the torch 2.11 wheel) carries its own static copy of
// libstdc++'s std::filesystem and exports it from libtorch.so, which the dynamic linker binds
// before libstdc++'s own. That copy's remove_all calls a null function on any folder that is
// not empty: the program dies of SIGSEGV (docs/guide.md, "LibTorch 2.x with CUDA"; checked
// with torch 2.11.0 and g++ 12). The rest of std::filesystem there works (status, directory
// iteration, remove of one entry), so remove_folder() walks the tree with those.
#pragma once

#include <cstdint>
#include <filesystem>
#include <system_error>

namespace remat::torch {

/// Removes `path` and, when it is a folder, everything in it, without following symbolic
/// links (a link is removed, not what it points to). Returns how many entries it removed (0
/// when `path` does not exist) and sets `error` to the first failure, after which it stops,
/// as std::filesystem::remove_all(path, error) does (which returns -1 on failure).
inline std::uintmax_t remove_folder(const std::filesystem::path& path, std::error_code& error) noexcept {
    namespace fs = std::filesystem;
    error.clear();
    const fs::file_status status = fs::symlink_status(path, error);
    if (error) {
        if (status.type() == fs::file_type::not_found) error.clear();
        return 0;
    }
    std::uintmax_t removed = 0;
    if (status.type() == fs::file_type::directory) {
        fs::directory_iterator entries(path, error);
        for (; !error && entries != fs::directory_iterator(); entries.increment(error)) {
            removed += remove_folder(entries->path(), error);
            if (error) return removed;
        }
        if (error) return removed;
    }
    if (fs::remove(path, error)) ++removed;
    return removed;
}

}  // namespace remat::torch
