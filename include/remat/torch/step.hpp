// remat/torch/step.hpp — PlannedStep: one training step of a plan in two phases, the one step
// type of every LibTorch backend, whichever front end made the program.
//
// A chain's stages (executor.hpp: a Sequential or functors) and a captured program's op
// groups (graph_executor.hpp: TorchScript or a torch.export program) differ in what they run,
// which their backend says (exec/backend.hpp, plus the hand-over below). The step around the
// engine (exec/executor.hpp) is the same: forward() runs the plan up to `loss` and returns
// the outputs, backward(grads) runs the rest and returns the gradients, and a step that
// throws undoes itself (buffers; the random generators in the forward phase) and frees
// everything, the exception an ExecutionError naming the plan step and the stage or op.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "../exec/executor.hpp"
#include "../exec/report.hpp"
#include "detail/step.hpp"
#include "memory.hpp"

namespace remat::torch {

/// What a LibTorch backend adds to the engine's backend for a step driven by hand or by an
/// autograd function: the outputs after the forward phase (the caller's from then on), the
/// gradients of the loss with respect to them, and the step's gradients at its end.
template <class B>
concept StepBackend = requires(B& backend, typename B::OutputGradients grads) {
    backend.expose_outputs();
    backend.set_output_gradients(std::move(grads));
    backend.output_gradients_from_autograd();
    backend.take_result();
};

template <class Backend, MemoryProbe Probe>
    requires StepBackend<Backend>
class PlannedStep {
    using Reader = detail::ProbeReader<Probe>;

public:
    using Engine = Executor<Backend, Reader>;
    using OutputGradients = typename Backend::OutputGradients;

    /// `continuous`: the caller runs both phases back to back (the backward phase is measured
    /// from the start of the step, not calibrated at its own start).
    PlannedStep(const std::shared_ptr<const Engine>& engine, ExecutionPlan plan, Backend backend, Probe* probe,
                bool continuous)
        : reader_(std::make_unique<Reader>(Reader{probe})),
          step_(engine->start(std::move(plan), std::move(backend), *reader_, continuous)) {}

    PlannedStep(PlannedStep&&) noexcept = default;
    PlannedStep& operator=(PlannedStep&&) noexcept = default;

    /// Runs the plan up to `loss`; returns the outputs (without autograd history; the caller
    /// may keep them).
    auto forward() {
        step_.forward();
        return step_.backend().expose_outputs();
    }

    /// Runs the rest of the plan with the gradients of the loss with respect to the outputs.
    /// The executor keeps no reference to them beyond the plan's frees. `from_autograd`: they
    /// come from autograd into a custom Function's backward (which may then give their memory
    /// back where the plan frees them although autograd still references them, detail/runtime.hpp).
    auto backward(OutputGradients grads, bool from_autograd = false) {
        if (step_.phase() == StepPhase::between) {
            step_.backend().set_output_gradients(std::move(grads));
            if (from_autograd) step_.backend().output_gradients_from_autograd();
        }
        step_.backward();
        return step_.backend().take_result();
    }

    /// Gives up a step between its phases (the caller's loss failed): buffers go back to
    /// their values before the step and everything is freed.
    void abort() noexcept { step_.abort(); }

    /// Before forward(): wait for the device around each op and time it (step_seconds()), for
    /// comparing a plan's predicted times with reality op by op, or to have an asynchronous
    /// CUDA error named at the op that caused it. Off by default: on a GPU the host then
    /// queues the ops ahead of the device, as plain autograd does, and the step waits for it
    /// only at the end of each phase (the measured memory is the same either way).
    void time_each_op(bool on = true) { step_.time_each_op(on); }

    [[nodiscard]] const StepReport& report() const noexcept { return step_.report(); }
    /// Per schedule step, the seconds its op took (0 for frees and the loss): the calling
    /// thread's CPU time on the CPU with one intra-op thread (as profiling times ops there),
    /// else the wall clock between waits for the device (profiling uses CUDA events on a GPU,
    /// so there these include the launch); empty unless time_each_op() was called before forward().
    [[nodiscard]] const std::vector<double>& step_seconds() const noexcept { return step_.step_seconds(); }

private:
    std::unique_ptr<Reader> reader_;  // the engine's step keeps a reference: stable address
    ExecutionStep<Backend, Reader> step_;
};

}  // namespace remat::torch
