// remat/torch/detail/op_clock.hpp — the clock ops are timed with, by capture's profiler and
// by the executor's per-step timings alike (so that the two can be compared op by op), and
// the interval timer of the profilers (CUDA events on a GPU).
//
// docs/design.md §8 (LibTorch notes): with one intra-op thread on the CPU, the thread's own CPU time is immune to
// other processes taking the machine; with several threads or on CUDA only the wall clock
// measures the work.
#pragma once

#include <chrono>
#include <optional>

#include <time.h>

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#include "compat.hpp"
#include "runtime.hpp"

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

/// Times one interval of work on a device. On the CPU: the OpClock above. On CUDA: two events
/// recorded on the device's current stream, so that the interval is the device's own time
/// from the first queued kernel to the last (the gaps where it waits for launches included),
/// and the only synchronisation is waiting for the end event when the time is read.
class IntervalTimer {
public:
    explicit IntervalTimer(const c10::Device& device) : device_(device), clock_(device) {}

    void start() {
#if REMAT_WITH_CUDA
        if (device_.is_cuda()) {
            events_.emplace(cudaEventDefault, cudaEventDefault);
            events_->first.record(stream());
            return;
        }
#endif
        synchronize(device_);
        started_ = clock_.now();
    }

    /// Seconds since start().
    [[nodiscard]] double stop() {
#if REMAT_WITH_CUDA
        if (device_.is_cuda()) {
            events_->second.record(stream());
            events_->second.synchronize();
            return 1e-3 * static_cast<double>(events_->first.elapsed_time(events_->second));
        }
#endif
        synchronize(device_);
        return clock_.now() - started_;
    }

private:
#if REMAT_WITH_CUDA
    [[nodiscard]] c10::cuda::CUDAStream stream() const {
        return c10::cuda::getCurrentCUDAStream(device_.has_index() ? device_.index() : c10::DeviceIndex(-1));
    }
    std::optional<std::pair<compat::CudaEvent, compat::CudaEvent>> events_;
#endif
    c10::Device device_;
    OpClock clock_;
    double started_ = 0.0;
};

}  // namespace remat::torch::detail
