// remat/torch/detail/op_clock.hpp — the clock ops are timed with, by capture's profiler and
// by the executor's per-step timings alike (so that the two can be compared op by op).
//
// docs/design.md §8 (LibTorch notes): with one intra-op thread on the CPU, the thread's own CPU time is immune to
// other processes taking the machine; with several threads or on CUDA only the wall clock
// measures the work.
#pragma once

#include <chrono>

#include <time.h>

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

namespace remat::torch::detail {

/// Seconds on a clock for timing ops: the calling thread's CPU time when every op runs on
/// this thread (CPU tensors, one intra-op thread), and the wall clock otherwise.
class OpClock {
public:
    explicit OpClock(const c10::Device& device)
        : thread_time_(device.is_cpu() && at::get_num_threads() == 1 && thread_clock_works()) {}

    [[nodiscard]] double now() const {
#if defined(CLOCK_THREAD_CPUTIME_ID)
        if (thread_time_) {
            timespec t{};
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
            return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
        }
#endif
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
    /// Whether now() reads the thread's CPU time.
    [[nodiscard]] bool thread_time() const noexcept { return thread_time_; }

private:
    static bool thread_clock_works() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
        timespec t{};
        return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0;
#else
        return false;
#endif
    }
    bool thread_time_;
};

}  // namespace remat::torch::detail
