// tests/support/faulty_compute.hpp — a StepCompute (remat/exec/offload_step.hpp) that throws
// at a chosen op, around a framework's own, for the offloading engine's fault tests.
#pragma once

#include <cstddef>
#include <stdexcept>

#include <remat/core/problem.hpp>

namespace remat_test {

/// Runs `inner`'s ops until the run at position `fail_at` (counting every run), which throws
/// "injected fault"; passes releases and abort_step() on.
template <class Inner>
struct FaultyCompute {
    Inner* inner;
    std::size_t fail_at;
    std::size_t runs = 0;
    void run(remat::OpId op) {
        if (runs++ == fail_at) throw std::runtime_error("injected fault");
        inner->run(op);
    }
    void release(remat::DataId d) { inner->release(d); }
    void abort_step() { inner->abort_step(); }
};

/// Runs `inner`'s ops, and throws "late device fault" at the wait for the device number
/// `fail_at_wait` (counting from 0), as an asynchronous device (CUDA) reports an op's error
/// only when the host waits for it; counts the waits.
template <class Inner>
struct LateFaultCompute {
    Inner* inner;
    std::size_t fail_at_wait;
    std::size_t waits = 0;
    void run(remat::OpId op) { inner->run(op); }
    void release(remat::DataId d) { inner->release(d); }
    void abort_step() { inner->abort_step(); }
    void synchronize() {
        if (waits++ == fail_at_wait) throw std::runtime_error("late device fault");
    }
};

}  // namespace remat_test
