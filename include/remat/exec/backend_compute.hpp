// remat/exec/backend_compute.hpp — BackendCompute: the ops of a training problem run through a
// framework's ExecutionBackend (backend.hpp), for the offloading engine (offload_step.hpp).
// Standard library only.
//
// The training problem is a backend's activation problem with its weights added
// (offload::training_problem(activations, weights, options) with
// TrainingStateOptions::gradients_to_caller): the activation problem's ops and data keep
// their ids, and after them come each weight `w:<name>`, its gradient `gw:<name>` and the
// update `U:<name>`. The weights move through the transfer backend; everything else runs as
// the execution engine runs it (unit_runs.hpp: which forward really runs, random-number
// replay). The updates are the caller's optimizer after the step: they run nothing. The
// gradients are the backend's collected parameter gradients, handed over by finish(); the
// ones the problem models are part of the plan's memory, and any others (a parameter that
// stays outside the problem, e.g. one several units share) are held outside it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../offload/schedule.hpp"
#include "../offload/training_state.hpp"
#include "backend.hpp"
#include "plan.hpp"
#include "unit_runs.hpp"

namespace remat {

/// The activation problem inside a training problem, checked: the same ops and data first.
/// Throws InvalidInput when `training` is not `activations` with weights added after, or when
/// its gradients are not handed to the caller.
inline void check_training_problem(const Problem& training, const Problem& activations) {
    const std::string who = "training problem '" + training.name() + "'";
    const offload::TrainingSplit split = offload::split_training_state(training);
    const Problem& kept = split.activations;
    bool same = kept.op_count() == activations.op_count() && kept.data_count() == activations.data_count();
    for (std::size_t k = 0; same && k < kept.op_count(); ++k)
        same = split.op_in_full[k] == k && kept.op(OpId{k}).name == activations.op(OpId{k}).name;
    for (std::size_t k = 0; same && k < kept.data_count(); ++k)
        same = split.data_in_full[k] == k && kept.data(DataId{k}).name == activations.data(DataId{k}).name;
    if (!same)
        throw InvalidInput(who + " is not '" + activations.name() + "' with weights added after its own ops and data "
                                 "(offload::training_problem(activations, weights, options))");
    for (std::size_t k = activations.data_count(); k < training.data_count(); ++k) {
        const DataId d{k};
        if (!training.updater(d) && !training.is_final(d) && training.data(d).bytes > 0)
            throw InvalidInput(who + ": gradient '" + training.data(d).name +
                               "' is freed inside the step; the optimizer here is the caller's, after the step: "
                               "make the problem with TrainingStateOptions::gradients_to_caller");
    }
}

/// Runs the ops of a training problem through `Backend` (see the top of this header): the
/// StepCompute of OffloadStep, one step at a time. After OffloadStep's forward phase call
/// end_forward(), after its backward finish(); a failed step has been rolled back (abort_step).
template <ExecutionBackend Backend>
class BackendCompute {
public:
    /// `training` and `activations` must outlive the compute; `table`: the activation problem's.
    BackendCompute(const Problem& training, const Problem& activations, const ExecutionTable& table,
                   const offload::OffloadSchedule& schedule, Backend backend)
        : training_(&training), activations_(&activations), table_(&table), backend_(std::move(backend)),
          runs_(activations, table, landmarks(activations, table, schedule)) {
        check_training_problem(training, activations);
    }

    // ---- StepCompute
    /// Before the op's measured window: the step's start (the random draws of a plan that runs
    /// random units out of the model's order), what a forward really runs and the release of
    /// what it rewrites, and the generators' state.
    void prepare(OpId op) {
        if (!started_) start();
        prepared_ = op;
        with_grad_.reset();
        rng_now_.reset();
        if (!is_activation_op(op)) return;
        const ExecOpRole role = table_->op_role[op.index];
        if (role != ExecOpRole::forward && role != ExecOpRole::forward_grad) return;
        with_grad_ = runs_.forward_to_run(backend_, op, role == ExecOpRole::forward_grad);
        if (with_grad_) rng_now_ = runs_.rng_for(backend_, table_->op_unit[op.index]);
    }
    void run(OpId op) {
        if (prepared_ != op) prepare(op);
        prepared_.reset();
        if (!is_activation_op(op)) return;  // an update: the caller's optimizer, after the step
        const ExecOpRole role = table_->op_role[op.index];
        const std::size_t unit = table_->op_unit[op.index];
        switch (role) {
            case ExecOpRole::loss: runs_.mark_written(op); loss_done_ = true; break;
            case ExecOpRole::backward:
                runs_.run_backward(backend_, op, unit);
                for (const DataId d : training_->op(op).writes)
                    if (d.index >= activations_->data_count()) modeled_gradient_bytes_ += training_->data(d).bytes;
                break;
            case ExecOpRole::forward:
            case ExecOpRole::forward_grad:
                if (!with_grad_) return;  // everything it writes is live
                ++forward_runs_;
                runs_.run_forward(backend_, op, unit, *with_grad_, std::move(rng_now_));
                break;
        }
        // No waiting for the device after the op (only at the end of each phase, synchronize()):
        // the transfer backend orders its copies after the compute through events, and the
        // device's stream orders the rest.
    }
    void release(DataId d) {
        if (d.index < activations_->data_count()) runs_.release(backend_, d);
        // The weights move through the transfer backend; their gradients are final and the
        // update markers hold nothing.
    }
    /// What the plan does not count that the device holds: parameter gradients the problem
    /// does not model, and what the caller holds (outputs it kept).
    [[nodiscard]] Bytes held_outside() const {
        return backend_.pending_gradient_bytes() - modeled_gradient_bytes_ + backend_.caller_bytes();
    }
    /// Waits for the device (the offloading engine calls it at the end of each phase).
    void synchronize() { backend_.synchronize(); }
    /// A failed step: the backend rolls back (the generators too, before the loss: the caller
    /// may have drawn from them after it) and drops what the step holds.
    void abort_step() noexcept {
        if (started_) backend_.rollback(!loss_done_);
        backend_.clear();
        started_ = false;
    }

    // ---- The step's phases
    /// After the forward phase: the generators stand where the model's forward leaves them.
    void end_forward() {
        if (runs_.chain_end()) backend_.restore_rng(*runs_.chain_end());
    }
    /// After the backward phase: hands the collected parameter gradients over (Backend::commit).
    void finish() {
        backend_.commit();
        started_ = false;
    }

    [[nodiscard]] Backend& backend() noexcept { return backend_; }
    [[nodiscard]] const Backend& backend() const noexcept { return backend_; }
    /// Forward runs so far (recomputations included).
    [[nodiscard]] std::size_t forward_runs() const noexcept { return forward_runs_; }

private:
    [[nodiscard]] static ForwardLandmarks landmarks(const Problem& activations, const ExecutionTable& table,
                                                    const offload::OffloadSchedule& schedule) {
        table.check(activations);
        std::vector<OpId> ops;
        for (const offload::TransferStep& step : schedule.steps)
            if (step.is_run() && step.op().index < activations.op_count()) ops.push_back(step.op());
        return forward_landmarks(table, ops);
    }
    [[nodiscard]] bool is_activation_op(OpId op) const { return op.index < activations_->op_count(); }

    void start() {
        backend_.begin_step();
        started_ = true;
        runs_.chain_random_draws(backend_);
    }

    const Problem* training_;
    const Problem* activations_;
    const ExecutionTable* table_;
    Backend backend_;
    UnitRuns<Backend> runs_;
    std::optional<OpId> prepared_;
    std::optional<bool> with_grad_;
    std::optional<typename Backend::RngState> rng_now_;
    Bytes modeled_gradient_bytes_ = 0;
    std::size_t forward_runs_ = 0;
    bool started_ = false;
    bool loss_done_ = false;
};

}  // namespace remat
