// remat/exec/executor.hpp — the execution engine: runs any simulator-checked schedule of any
// problem, step by step, through a framework's backend (backend.hpp). Standard library only.
//
// docs/design.md §6 (execution engine). A training step is a plan in two phases — up to the
// loss when the model is called, the rest when the caller back-propagates — and the engine
// owns everything that does not depend on the framework:
//   - the phases, with the loss boundary between them, and the order they may be called in;
//   - which forward really runs: a forward with grad whose saved state is already live
//     rewrites its missing activations without grad when that costs no more overhead, else
//     it rewrites the saved state too; one whose activations are all live does nothing; live
//     data are released before they are rewritten (the simulator counts them once), outside
//     the measured window;
//   - random-number replay: the generators' state is read before the measured window at the
//     first run of a unit the plan recomputes, and put back around each recomputation; when a
//     plan runs random units out of the model's order, their states are drawn ahead in the
//     model's order (DrawsLike) and replayed at every run (these two in unit_runs.hpp, which
//     the offloading engine's backend adapter shares);
//   - the plan's timeline against measured memory: the probe's peak while each op runs, minus
//     the parameter gradients collected so far and what the caller holds, on the simulator's
//     scale (the step's start plus the inputs);
//   - waiting for the device only at the end of each phase, so that the host queues ops ahead
//     of an asynchronous device as plain autograd does (time_each_op: around each op, timed);
//   - parameter gradients handed over only when the step completes (Backend::commit);
//   - on any failure: rollback (buffers; the generators too in the forward phase, when the
//     caller has not drawn from them since), everything freed, and an exception naming the
//     plan step, its op and unit, and the phase — an ExecutionError, or InvalidInput when the
//     backend blamed the input.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "backend.hpp"
#include "plan.hpp"
#include "report.hpp"
#include "unit_runs.hpp"

namespace remat {

/// Where a two-phase step stands. Each phase runs once: a step frees its activations as it goes.
enum class StepPhase : unsigned char { ready, forward, between, backward, done, failed };

/// The problems and table an executor runs plans of. `planned`: what solvers plan on;
/// `predicting`: the same ops and data with the costs predictions use (the same problem
/// unless a profile measured finer costs than the planner's model).
struct ExecutionModel {
    Problem planned;
    Problem predicting;
    ExecutionTable table;
};

template <ExecutionBackend Backend, MemoryReader Probe>
class ExecutionStep {
public:
    /// `continuous`: the caller runs both phases back to back; otherwise the backward phase
    /// is measured from its own start (the caller's loss in between is the caller's).
    ExecutionStep(std::shared_ptr<const ExecutionModel> model, ExecutionPlan plan, Backend backend, Probe& probe,
                  bool continuous)
        : model_(std::move(model)), plan_(std::move(plan)), backend_(std::move(backend)), probe_(&probe),
          continuous_(continuous), runs_(model_->predicting, model_->table, plan_.prepared()) {
        report_.predicted_peak = plan_.predicted_peak();
        report_.planned_peak = plan_.planned_peak();
        report_.predicted_time = plan_.predicted_time();
        report_.measured_timeline.assign(plan_.schedule().size(), -1);
    }

    ExecutionStep(ExecutionStep&&) noexcept = default;
    ExecutionStep& operator=(ExecutionStep&&) noexcept = default;
    ExecutionStep(const ExecutionStep&) = delete;
    ExecutionStep& operator=(const ExecutionStep&) = delete;
    /// A step dropped half-way frees what it holds; it does not roll back (the forward's
    /// buffer updates stand, as they do when a plain forward is never back-propagated).
    ~ExecutionStep() { backend_.clear(); }

    /// Before forward(): wait for the device before and after each op and time it on the
    /// backend's clock (step_seconds()). Off by default, so that on an asynchronous device
    /// (CUDA) the host queues ops ahead of the device as plain autograd does: the engine then
    /// waits only at the end of each phase. The measured memory is the same either way (an allocator counts
    /// at allocation, on the host). What changes is where an asynchronous device error shows:
    /// at the op that caused it with this on, else at a later op or the phase's end.
    void time_each_op(bool on) {
        if (phase_ != StepPhase::ready) throw ExecutionError("step: time_each_op() after forward(); set it before");
        time_each_op_ = on;
        step_seconds_.assign(on ? plan_.schedule().size() : 0, 0.0);
    }

    /// Runs the plan up to `loss`.
    void forward() {
        if (phase_ != StepPhase::ready)
            throw ExecutionError("step: forward() was already called; start a new step for a new forward");
        backend_.begin_step();
        phase_ = StepPhase::forward;
        const Stopwatch clock;
        try {
            runs_.chain_random_draws(backend_);
        } catch (...) {
            fail(0, " (drawing the units' random numbers in the model's order before the forward)");
        }
        report_.forward_peak = model_->predicting.initial_bytes();
        forward_reference_ = probe_->current() - model_->predicting.initial_bytes();
        for (std::size_t i = 0; i < loss_step(); ++i) execute(i, forward_reference_, report_.forward_peak);
        sync_or_fail(loss_step());
        // After a chained forward the generators stand where the model's forward leaves them.
        if (runs_.chain_end()) backend_.restore_rng(*runs_.chain_end());
        report_.forward_seconds = clock.seconds();
        phase_ = StepPhase::between;
    }

    /// Runs the rest of the plan (the backend holds the loss's gradients by now) and hands the
    /// parameter gradients over.
    void backward() {
        if (phase_ != StepPhase::between)
            throw ExecutionError(phase_ == StepPhase::done || phase_ == StepPhase::failed
                                     ? "step: backward() was already called (or the step failed); a step back-propagates once"
                                     : "step: backward() before forward()");
        phase_ = StepPhase::backward;
        const Stopwatch clock;
        const Bytes after_loss = plan_.simulation().timeline.at(loss_step()).after;
        const Bytes now = probe_->current();
        report_.caller_bytes = (now - forward_reference_) - after_loss;
        report_.backward_peak = after_loss;
        const Bytes reference = continuous_ ? forward_reference_ : now - after_loss;
        runs_.mark_written(plan_.schedule()[loss_step()].op());
        const Schedule& schedule = plan_.schedule();
        for (std::size_t i = loss_step() + 1; i < schedule.size(); ++i) execute(i, reference, report_.backward_peak);
        sync_or_fail(schedule.size());
        try {
            backend_.commit();
        } catch (...) {
            fail(schedule.size(), " (handing the parameter gradients over)");
        }
        report_.backward_seconds = clock.seconds();
        report_.measured_peak = std::max(report_.forward_peak, report_.backward_peak);
        report_.completed = true;
        phase_ = StepPhase::done;
        backend_.clear();
    }

    /// Gives up a step between (or before) its phases — the caller's loss failed: the backend
    /// rolls back (not the generators: the caller may have drawn from them) and frees everything.
    void abort() noexcept {
        if (phase_ == StepPhase::done || phase_ == StepPhase::failed) return;
        if (phase_ != StepPhase::ready) backend_.rollback(false);
        phase_ = StepPhase::failed;
        backend_.clear();
    }

    [[nodiscard]] StepPhase phase() const noexcept { return phase_; }
    [[nodiscard]] const StepReport& report() const noexcept { return report_; }
    /// Per schedule step, the seconds its op took on the backend's clock (0 where it has none,
    /// and for frees and the loss); empty unless time_each_op(true) was called.
    [[nodiscard]] const std::vector<double>& step_seconds() const noexcept { return step_seconds_; }
    [[nodiscard]] const ExecutionPlan& plan() const noexcept { return plan_; }
    [[nodiscard]] Backend& backend() noexcept { return backend_; }
    [[nodiscard]] const Backend& backend() const noexcept { return backend_; }
    /// Whether a data is live at this point of the step (the simulator's view).
    [[nodiscard]] bool live(DataId d) const { return runs_.live(d); }

private:
    [[nodiscard]] std::size_t loss_step() const noexcept { return plan_.prepared().loss_step; }
    [[nodiscard]] const ExecutionTable& table() const noexcept { return model_->table; }

    [[nodiscard]] Bytes held_outside() const { return backend_.pending_gradient_bytes() + backend_.caller_bytes(); }

    void execute(std::size_t index, Bytes reference, Bytes& peak) {
        const Step& step = plan_.schedule()[index];
        if (step.is_free()) {
            try {
                runs_.release(backend_, step.data());
            } catch (...) {
                fail(index, "");
            }
            report_.measured_timeline[index] = probe_->current() - held_outside() - reference;
            return;
        }
        const std::size_t k = step.op().index;
        const ExecOpRole role = table().op_role[k];
        if (role == ExecOpRole::loss) return;
        const std::size_t unit = table().op_unit[k];
        // Before the measured window: what a forward must really run, the release of what it
        // rewrites (the caller may keep an output it rewrites: that memory is the caller's),
        // and the generators' state (reading it may allocate for a moment). The window then
        // holds the op alone, as profiling measured it.
        std::optional<bool> with_grad;
        std::optional<typename Backend::RngState> rng_now;
        if (role != ExecOpRole::backward) {
            try {
                with_grad = runs_.forward_to_run(backend_, OpId{k}, role == ExecOpRole::forward_grad);
            } catch (...) {
                fail(index, backend_.describe(unit));
            }
            if (!with_grad) {
                report_.measured_timeline[index] = probe_->current() - held_outside() - reference;
                return;
            }
            rng_now = runs_.rng_for(backend_, unit);
        }
        const Bytes outside_before = held_outside();
        probe_->reset_peak();
        double t0 = 0.0;
        try {
            if (time_each_op_) {
                backend_.synchronize();  // the work queued before (the caller's loss) is not the op's
                if constexpr (HasClock<Backend>) t0 = backend_.now();
            }
            if (role == ExecOpRole::backward) {
                runs_.run_backward(backend_, OpId{k}, unit);
            } else {
                ++report_.forward_runs;
                runs_.run_forward(backend_, OpId{k}, unit, *with_grad, std::move(rng_now));
            }
            if (time_each_op_) backend_.synchronize();
        } catch (...) {
            fail(index, backend_.describe(unit));
        }
        if constexpr (HasClock<Backend>)
            if (time_each_op_) step_seconds_[index] = backend_.now() - t0;
        const Bytes during = probe_->peak() - outside_before - reference;
        report_.measured_timeline[index] = during;
        peak = std::max(peak, during);
    }

    void sync_or_fail(std::size_t index) {
        try {
            backend_.synchronize();
        } catch (...) {
            fail(index, time_each_op_ ? " (waiting for the device)"
                                      : " (waiting for the device: an error an earlier op left there shows now; "
                                        "time_each_op(true) names that op)");
        }
    }

    [[nodiscard]] std::string error_text(const std::exception& e) const {
        if constexpr (WordsErrors<Backend>)
            return backend_.error_text(e);
        else
            return e.what();
    }

    // Rolls back, frees everything and rethrows what is being handled, naming the plan step.
    [[noreturn]] void fail(std::size_t index, const std::string& unit_text) {
        const bool in_forward = phase_ == StepPhase::forward;
        // The generators go back only in the forward phase: later, the caller's loss may have
        // drawn from them.
        backend_.rollback(in_forward);
        phase_ = StepPhase::failed;
        backend_.clear();
        const Schedule& schedule = plan_.schedule();
        const std::string what = index < schedule.size() ? describe(model_->predicting, schedule[index]) : std::string("the end");
        const std::string context = "step " + std::to_string(index) + " of the plan, " + what + unit_text +
                                    " failed during the " + (in_forward ? "forward" : "backward") +
                                    " phase; parameters, gradients and buffers are as before the step: ";
        try {
            throw;
        } catch (const InvalidInput& e) {
            std::throw_with_nested(InvalidInput(context + e.what()));
        } catch (const Error& e) {
            std::throw_with_nested(ExecutionError(context + e.what()));
        } catch (const std::exception& e) {
            std::throw_with_nested(ExecutionError(context + error_text(e)));
        } catch (...) {
            std::throw_with_nested(ExecutionError(context + "unknown exception"));
        }
    }

    std::shared_ptr<const ExecutionModel> model_;
    ExecutionPlan plan_;
    Backend backend_;
    Probe* probe_;
    bool continuous_ = false;
    StepPhase phase_ = StepPhase::ready;
    UnitRuns<Backend> runs_;
    Bytes forward_reference_ = 0;
    StepReport report_;
    bool time_each_op_ = false;
    std::vector<double> step_seconds_;
};

/// Runs plans of one problem through `Backend`s: checks plans and starts steps.
template <ExecutionBackend Backend, MemoryReader Probe>
class Executor {
public:
    /// `predicting` may be the same as `planned` (pass it twice).
    Executor(Problem planned, Problem predicting, ExecutionTable table)
        : model_(std::make_shared<ExecutionModel>(ExecutionModel{std::move(planned), std::move(predicting), std::move(table)})) {
        model_->table.check(model_->predicting);
        if (model_->planned.op_count() != model_->predicting.op_count() ||
            model_->planned.data_count() != model_->predicting.data_count())
            throw InvalidInput("executor: the planned and the predicting problems of '" + model_->planned.name() +
                               "' differ in their ops or data");
    }

    [[nodiscard]] const Problem& problem() const noexcept { return model_->planned; }
    [[nodiscard]] const Problem& predicting_problem() const noexcept { return model_->predicting; }
    [[nodiscard]] const ExecutionTable& table() const noexcept { return model_->table; }

    /// Checks a plan (the simulator must accept it on both problems) and prepares it.
    [[nodiscard]] ExecutionPlan prepare(Plan plan) const {
        return prepare_execution(model_->planned, model_->predicting, model_->table, std::move(plan));
    }
    [[nodiscard]] ExecutionPlan prepare(Schedule schedule) const { return prepare(hand_written_plan(std::move(schedule))); }

    /// A step of `plan` run through `backend` (its state for this step), measured by `probe`.
    [[nodiscard]] ExecutionStep<Backend, Probe> start(ExecutionPlan plan, Backend backend, Probe& probe,
                                                      bool continuous = true) const {
        return ExecutionStep<Backend, Probe>(model_, std::move(plan), std::move(backend), probe, continuous);
    }

private:
    std::shared_ptr<ExecutionModel> model_;
};

}  // namespace remat
