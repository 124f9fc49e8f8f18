// remat/torch/detail/step.hpp — the machinery of one planned training step that the chain
// executor (executor.hpp) and the op-level executor (graph_executor.hpp) share.
//
// Both run a simulator-checked schedule (DESIGN.md §4.6) as a step in two phases: the plan up
// to `loss`, then the rest with the loss's gradients. What does not depend on the problem's
// shape lives here, so that the two executors keep the same contract: a prepared plan and
// its landmarks, the order in which a step's phases may be called, the parameter gradients
// it holds back until its end, and how a failure undoes the step and names the plan step
// that failed. (How a step fills its StepReport is next to that type, in executor.hpp.)
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
#include "runtime.hpp"

namespace remat::torch::detail {

// ------------------------------------------------------------------------------------ plans

/// A plan checked against an executor's problem, with what its steps look up at run time.
struct PreparedPlan {
    Plan plan;
    /// On the problem predictions use (the chain executor's measured problem).
    SimulationReport simulation;
    /// The simulator's peak on the problem the solver planned with; the chain executor's
    /// only (its measured problem differs from the planned one).
    Bytes planned_peak = 0;
    std::size_t loss_step = 0;
    /// Per unit (chain stage or op group): how many forwards the plan runs. A unit run more
    /// than once is recomputed, so its random numbers are kept at its first run.
    std::vector<std::size_t> forward_runs;
};

/// What the plan handles of both executors (ExecutablePlan, ScriptPlan) show of a prepared
/// plan; each adds what only its executor has, and only its executor makes one.
class PlanView {
public:
    [[nodiscard]] const Plan& plan() const noexcept { return prepared_->plan; }
    [[nodiscard]] const Schedule& schedule() const noexcept { return prepared_->plan.schedule; }
    /// The simulator's peak on the problem predictions use: what the executor should reach.
    [[nodiscard]] Bytes predicted_peak() const noexcept { return prepared_->simulation.peak; }
    [[nodiscard]] double predicted_time() const noexcept { return prepared_->simulation.time; }
    [[nodiscard]] const SimulationReport& simulation() const noexcept { return prepared_->simulation; }

protected:
    explicit PlanView(std::shared_ptr<const PreparedPlan> prepared) : prepared_(std::move(prepared)) {}
    std::shared_ptr<const PreparedPlan> prepared_;
};

/// What preparing a plan needs to know of one of its ops.
struct PlanOpRole {
    bool is_loss = false;
    bool is_forward = false;  ///< with or without autograd
    std::size_t unit = 0;     ///< the stage or op group it runs
};

/// Simulates `schedule` on `problem` and refuses a schedule the simulator rejects: the
/// executors run only what the simulator accepted, which is what keeps freeing memory
/// behind autograd's back safe (DESIGN.md §6). `subject` names the problem in the message.
[[nodiscard]] inline SimulationReport checked_simulation(const Problem& problem, const Schedule& schedule,
                                                         const std::string& subject) {
    SimulationReport report = simulate(problem, schedule);
    if (!report.valid) throw InvalidInput("the plan is not a valid schedule of " + subject + ": " + report.error);
    return report;
}

/// Finds the plan's `loss` step (where the two phases meet) and counts the forwards of each
/// of its `units`; `role_of(OpId)` says what an op is. `simulation`: see PreparedPlan.
template <class RoleOf>
[[nodiscard]] std::shared_ptr<const PreparedPlan> prepare_plan(Plan plan, SimulationReport simulation,
                                                               Bytes planned_peak, std::size_t units,
                                                               const RoleOf& role_of) {
    auto prepared = std::make_shared<PreparedPlan>();
    prepared->simulation = std::move(simulation);
    prepared->planned_peak = planned_peak;
    prepared->forward_runs.assign(units, 0);
    bool found_loss = false;
    for (std::size_t i = 0; i < plan.schedule.size(); ++i) {
        const Step& step = plan.schedule[i];
        if (!step.is_run()) continue;
        const PlanOpRole role = role_of(step.op());
        if (role.is_loss) {
            prepared->loss_step = i;
            found_loss = true;
        } else if (role.is_forward) {
            ++prepared->forward_runs[role.unit];
        }
    }
    if (!found_loss) throw InvalidInput("the plan never runs 'loss'");
    prepared->plan = std::move(plan);
    return prepared;
}

/// A schedule written by hand, as a plan: what prepare(Schedule) overloads wrap.
[[nodiscard]] inline Plan hand_written_plan(Schedule schedule) {
    Plan plan;
    plan.schedule = std::move(schedule);
    plan.stats.solver = "hand-written";
    return plan;
}

// ----------------------------------------------------------------------------------- phases

/// Where a two-phase step stands. A step runs each phase once: it frees its activations as
/// it goes, so neither phase can be run again.
enum class StepPhase : unsigned char { ready, forward, between, backward, done, failed };

/// Refuses a second forward. `step_name` ("chain step", "script step") starts the message.
inline void check_forward_allowed(StepPhase phase, const std::string& step_name) {
    if (phase != StepPhase::ready)
        throw ExecutionError(step_name + ": forward() was already called; start a new step for a new forward");
}

/// Refuses a backward before the forward, or a second one.
inline void check_backward_allowed(StepPhase phase, const std::string& step_name) {
    if (phase == StepPhase::between) return;
    throw ExecutionError(phase == StepPhase::done || phase == StepPhase::failed
                             ? step_name + ": backward() was already called (or the step failed); a step back-propagates once"
                             : step_name + ": backward() before forward()");
}

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
    [[nodiscard]] std::vector<at::Tensor> take() noexcept {
        std::vector<at::Tensor> sums = std::move(sums_);
        clear();
        return sums;
    }

    void clear() noexcept {
        sums_.clear();
        bytes_ = 0;
    }

private:
    std::vector<at::Tensor> sums_;
    Bytes bytes_ = 0;
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

/// The start of a failed plan step's message: which step, what it ran (`op_name`, e.g. the
/// stage or op group), in which phase, and that the step left no trace.
[[nodiscard]] inline std::string step_failure_context(std::size_t index, const Problem& problem, const Step& step,
                                                      const std::string& op_name, bool in_forward) {
    return "step " + std::to_string(index) + " of the plan, " + describe(problem, step) + op_name +
           " failed during the " + (in_forward ? "forward" : "backward") +
           " phase; parameters, gradients and buffers are as before the step: ";
}

[[nodiscard]] inline std::string exception_text(const std::exception& e) { return e.what(); }

/// Rethrows the exception being handled as an ExecutionError that starts with `context`,
/// with the original nested: callers see which plan step failed, and the original error
/// stays available. `message_of` words a non-remat exception (e.g. without LibTorch's
/// backtrace). Call only inside a catch block.
[[noreturn]] inline void rethrow_as_execution_error(const std::string& context,
                                                    std::string (*message_of)(const std::exception&) = exception_text) {
    try {
        throw;
    } catch (const Error& e) {
        std::throw_with_nested(ExecutionError(context + e.what()));
    } catch (const std::exception& e) {
        std::throw_with_nested(ExecutionError(context + message_of(e)));
    } catch (...) {
        std::throw_with_nested(ExecutionError(context + "unknown exception"));
    }
}

}  // namespace remat::torch::detail
