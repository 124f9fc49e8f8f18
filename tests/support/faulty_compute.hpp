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

}  // namespace remat_test
