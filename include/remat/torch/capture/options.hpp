// remat/torch/capture/options.hpp — what a user can set for capture (script.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "../../core/progress.hpp"

namespace remat::torch {

struct CaptureOptions {
    /// Name of the resulting problem.
    std::string name = "model";
    /// Timed runs per op and pass; the median is kept. On the CPU with one intra-op thread
    /// (at::set_num_threads(1)) ops are timed with the thread's CPU time, which other
    /// processes do not disturb; otherwise with the wall clock.
    std::size_t repeats = 5;
    /// Untimed runs before the timed ones.
    std::size_t warmup = 1;
    /// When capture has run this long, the remaining ops are timed once, without warm-up.
    std::optional<double> time_limit_seconds;
    /// Fold cheap single-use elementwise ops (scalar arithmetic, masked_fill, copies) into
    /// their consumer; off, each of them becomes an op of its own.
    bool fold_cheap_ops = true;
    /// Loops are unrolled at capture; a capture whose loops run more iterations than this in
    /// total is refused (it would plan a graph that large).
    std::size_t max_loop_iterations = 100000;
    /// Replay the captured step once with the store-all plan on the example inputs and compare
    /// its outputs, loss and every parameter gradient with plain autograd's step from the same
    /// random state (capture/verify.hpp); a difference refuses the capture, naming the first op
    /// that differs. It costs about two training steps on the example inputs (docs/guide.md,
    /// "Capturing a TorchScript module"). Buffers and generators are put back afterwards.
    bool verify_replay = true;
    /// The largest difference the replay check accepts, relative to the largest absolute value
    /// of the tensor compared: float noise from another summation order, not another result.
    double replay_tolerance = 1e-4;
    /// Receives one line per phase of capture (interpretation, grouping, profiling, problem)
    /// with its time (core/progress.hpp).
    ProgressCallback progress;
    /// Receives one line per op with what profiling measured (remat-capture --verbose).
    ProgressCallback op_progress;
};

}  // namespace remat::torch
