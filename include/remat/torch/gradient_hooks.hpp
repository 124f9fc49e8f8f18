// remat/torch/gradient_hooks.hpp — what a planned step does with its parameter gradients
// besides handing them over: the hooks through which a data-parallel wrapper
// (torch/distributed/data_parallel.hpp) reduces them across processes inside the step, so that
// the reduction is part of the step's all-or-nothing hand-over.
//
// A step collects its parameter gradients and hands them over once, at its end (torch/step.hpp).
// With hooks, every parameter's gradient is announced as soon as it is final — every unit that
// uses the parameter has run its backward, which the plan's order decides — and the gradients
// pass through one last hook before the hand-over. That hook may throw: the step then fails as a
// whole (buffers go back, no gradient reaches a parameter), exactly like a unit that throws.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace remat::torch {

struct GradientHooks {
    /// During the backward phase, in the plan's order: parameter `index` (in the executor's
    /// parameters() order) has its final gradient for this step. `gradient` is the step's own
    /// tensor, undefined when no backward reached the parameter; the hook may set it (the step
    /// counts it as a pending gradient) and may start work that changes it in place, to finish
    /// in before_hand_over.
    std::function<void(std::size_t index, at::Tensor& gradient)> on_final;
    /// At the end of a step that has succeeded so far, before its gradients are handed over (in
    /// the executor's parameters() order, undefined where no backward reached one): may change
    /// them in place, or throw to fail the step.
    std::function<void(std::vector<at::Tensor>& gradients)> before_hand_over;
    /// A step that announced gradients failed or was dropped before its hand-over: the hook
    /// forgets what it started for that step.
    std::function<void()> on_abandon;
};

}  // namespace remat::torch
