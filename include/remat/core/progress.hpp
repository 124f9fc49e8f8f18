// remat/core/progress.hpp — the one way long work in remat reports progress: a callback that
// receives one human-readable line at a time (solvers, profiling, capture, the CLI's stderr).
#pragma once

#include <functional>
#include <string>

namespace remat {

/// Receives progress lines; empty means silence. Called on the thread doing the work.
using ProgressCallback = std::function<void(const std::string&)>;

/// Sends `line` to `progress` when there is one.
inline void report_progress(const ProgressCallback& progress, const std::string& line) {
    if (progress) progress(line);
}

}  // namespace remat
