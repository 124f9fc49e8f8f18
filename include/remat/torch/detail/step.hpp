// remat/torch/detail/step.hpp — what LibTorch's execution backends (executor.hpp for chains,
// graph_executor.hpp for captured modules) share below the engine of remat/exec/executor.hpp:
// the parameter gradients a step collects until it completes, and what it puts back when it
// fails (buffers, random generators).
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "../../core/simulate.hpp"
#include "../../core/solver.hpp"
#include "../gradient_hooks.hpp"
#include "runtime.hpp"

namespace remat::torch::detail {

// ------------------------------------------------------------------------------- memory

/// A torch memory probe as the engine of exec/executor.hpp reads it (current, peak, reset),
/// for every backend.
template <class Probe>
struct ProbeReader {
    Probe* probe;
    [[nodiscard]] Bytes current() const { return probe->current(); }
    [[nodiscard]] Bytes peak() const { return probe->peak(); }
    void reset_peak() { probe->reset_peak(); }
};

// ------------------------------------------------------------------------------- gradients

/// The parameter gradients a step has collected. They are handed over only at the end of the
/// step (so that a failure leaves the parameters' gradients as they were) and are not
/// activations, so the step's measurements subtract their bytes.
class PendingGradients {
public:
    void reset(std::size_t parameters) {
        sums_.assign(parameters, at::Tensor());
        bytes_ = 0;
    }

    /// With hooks: `units_of[p]` units write parameter p's gradient; once that many have
    /// reported (unit_done), the gradient is final and hooks.on_final hears of it.
    void watch(std::shared_ptr<const GradientHooks> hooks, std::vector<std::size_t> units_of) {
        hooks_ = std::move(hooks);
        remaining_ = std::move(units_of);
        announced_ = false;
    }

    /// Whether hooks hear of final gradients: they may then change them in place while the
    /// backward goes on, so a gradient must not share memory with any other tensor the step uses.
    [[nodiscard]] bool announces() const noexcept { return hooks_ && hooks_->on_final; }

    /// A unit's backward has run: its parameters' gradients have one writer fewer to wait for.
    void unit_done(const std::vector<std::size_t>& parameters) {
        if (!hooks_ || !hooks_->on_final) return;
        for (const std::size_t p : parameters) {
            if (p >= remaining_.size() || remaining_[p] == 0 || --remaining_[p] > 0) continue;
            announced_ = true;
            hooks_->on_final(p, sums_[p]);
        }
    }

    /// Adds out of place: `grad` may share memory with another gradient (autograd hands some
    /// through unchanged), which an in-place sum would change.
    void add_copying(std::size_t parameter, at::Tensor grad) {
        at::Tensor& sum = sums_[parameter];
        sum = sum.defined() ? sum + grad : std::move(grad);
    }

    /// Adds in place when the sum's layout allows it (no transient copy): for gradients with
    /// memory of their own.
    void add_owned(std::size_t parameter, at::Tensor grad) {
        at::Tensor& sum = sums_[parameter];
        if (!sum.defined())
            sum = std::move(grad);
        else if (sum.is_non_overlapping_and_dense())
            sum.add_(grad);
        else
            sum = sum + grad;
    }

    /// Counts the sums' memory again; call after the adds of one backward.
    void recount() { bytes_ = distinct_storage_bytes(sums_); }

    [[nodiscard]] Bytes bytes() const noexcept { return bytes_; }

    /// The sums, per parameter (undefined where no backward reached it), for the step's end.
    /// With hooks, before_hand_over sees them first (and may throw: nothing is taken then).
    [[nodiscard]] std::vector<at::Tensor> take() {
        if (hooks_ && hooks_->before_hand_over) hooks_->before_hand_over(sums_);
        std::vector<at::Tensor> sums = std::move(sums_);
        announced_ = false;
        clear();
        return sums;
    }

    /// Drops the sums; a step that announced gradients and did not hand them over tells the
    /// hooks to forget them.
    void clear() noexcept {
        sums_.clear();
        bytes_ = 0;
        if (announced_ && hooks_ && hooks_->on_abandon) {
            try {
                hooks_->on_abandon();
            } catch (...) {
                // Forgetting is best effort: the step's own error is the one the caller hears.
            }
        }
        announced_ = false;
    }

private:
    std::vector<at::Tensor> sums_;
    Bytes bytes_ = 0;
    std::shared_ptr<const GradientHooks> hooks_;
    std::vector<std::size_t> remaining_;  // per parameter, the units still to write its gradient
    bool announced_ = false;              // on_final was called this step
};

// ------------------------------------------------------------------------------- failures

/// What a step puts back when it fails or is given up: the buffers (batch-norm running
/// statistics) as they were before it and, when the caller has not drawn from them since,
/// the random generators. `Units` is the executor's stages or op groups, each with the
/// `buffers` its forward updates.
class StepRollback {
public:
    /// Taken at the start of the forward phase, before its memory baseline: these copies
    /// exist for the step, not for the plan.
    template <class Units>
    void save(const Units& units, const c10::Device& device) {
        for (const auto& unit : units) buffers_.emplace_back(unit.buffers);
        rng_ = RngState::capture(device);
    }

    /// Puts the buffers back; with `generators_too`, the random generators as well.
    template <class Units>
    void undo(const Units& units, bool generators_too) noexcept {
        try {
            std::size_t i = 0;
            for (const auto& unit : units) {
                if (i == buffers_.size()) break;
                buffers_[i++].restore(unit.buffers);
            }
            if (generators_too && !rng_.empty()) rng_.restore();
        } catch (...) {
            // Copying a few buffers back failed (out of memory): nothing better is left to do,
            // and the error the caller hears about is the one that made the step fail.
        }
    }

    /// Drops the copies (the step is over).
    void clear() noexcept { buffers_.clear(); }

private:
    std::vector<BufferSnapshot> buffers_;
    RngState rng_;
};

}  // namespace remat::torch::detail
