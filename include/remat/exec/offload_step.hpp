// remat/exec/offload_step.hpp — runs an offloading schedule (docs/formats.md §11): the ops
// through the framework's StepCompute, the copies through a TransferBackend (transfer.hpp),
// in schedule order, measuring device memory with the framework's probe and host memory with
// the transfer backend, against what offload::simulate predicts. Standard library only.
//
// The engine waits exactly where the semantics do: an op waits for the prefetches of what it
// reads or updates, and an op that updates a data also for the offload still reading it; a
// free waits for the transfers that use the copy (inside the transfer backend). A step is
// run in two phases like every remat step: up to the loss, and the rest. A step is all or
// nothing: one that fails leaves every data's values and copies as it found them
// (OffloadStepOptions::rollback).
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/timing.hpp"
#include "../offload/schedule.hpp"
#include "../offload/simulate.hpp"
#include "backend.hpp"
#include "transfer.hpp"

namespace remat {

/// What runs the ops of a problem with transfers: every op (forwards, the loss, backwards,
/// updates), and the release of data that do not move (activations, gradients). A compute
/// that also has abort_step() is told when a step fails, to drop what the step computed; one
/// with prepare(op) is called before each op's measured window, for work that is not the
/// op's (reading the random generators' state may allocate for a moment); one with
/// held_outside() says how many bytes the plan freed that someone else still holds (an
/// output the caller keeps), which are not counted as the plan's; one with synchronize() is
/// waited for at the end of each phase, inside the step, so that an error an asynchronous
/// device reports late still fails the step and rolls it back.
template <class C>
concept StepCompute = requires(C& compute, OpId op, DataId data) {
    compute.run(op);
    compute.release(data);
};

/// Predicted against measured, for one step.
struct OffloadStepReport {
    Bytes predicted_device_peak = 0;
    Bytes measured_device_peak = 0;
    Bytes predicted_host_peak = 0;
    Bytes measured_host_peak = 0;
    double predicted_makespan = 0.0;
    double predicted_compute_time = 0.0;
    double seconds = 0.0;
    /// Per step: device memory while it ran (an op) or after it (anything else).
    std::vector<Bytes> measured_device_timeline;
    /// Per step: the wall seconds the engine spent issuing it, waits included. On a device that
    /// runs asynchronously (a GPU) issuing is quick, so a long one is where the host stalled.
    std::vector<double> issue_seconds_timeline;
    /// Host bytes kept so that a failure can undo the updates (OffloadStepOptions::rollback).
    Bytes rollback_bytes = 0;
    bool completed = false;
};

struct OffloadStepOptions {
    /// Keep each updated data's values until the step completes (a copy to host memory before
    /// its update), so that a failure leaves parameters and optimizer state as they were.
    /// Without it, a failure after an update leaves that update in place (the copies are still
    /// put back where the step found them).
    bool rollback = true;
};

/// Puts the offloadable data where `schedule` starts them: the data of `start_on_host` get a
/// host copy and leave the device. Call it once before the first step; every step ends so.
template <TransferBackend Transfers>
void place_for(const offload::OffloadSchedule& schedule, Transfers& transfers) {
    for (const DataId d : schedule.start_on_host) {
        transfers.offload(d);
        transfers.release_device(d);
    }
    transfers.synchronize();
}

/// The reverse of place_for: the data `schedule` starts on the host come back to the device
/// and lose their host copy (before another plan, or to use the model without offloading).
template <TransferBackend Transfers>
void return_to_device(const offload::OffloadSchedule& schedule, Transfers& transfers) {
    for (const DataId d : schedule.start_on_host) {
        transfers.prefetch(d);
        transfers.release_host(d);
    }
    transfers.synchronize();
}

template <StepCompute Compute, TransferBackend Transfers, MemoryReader Probe>
class OffloadStep {
public:
    /// The schedule must be valid (offload::simulate); the data must be where it starts them.
    OffloadStep(const Problem& problem, offload::OffloadSchedule schedule, Compute& compute, Transfers& transfers,
                Probe& probe, OffloadStepOptions options = {})
        : problem_(&problem), schedule_(std::move(schedule)), compute_(&compute), transfers_(&transfers), probe_(&probe),
          options_(options), prediction_(offload::simulate(problem, schedule_)) {
        if (!prediction_.valid)
            throw InvalidInput("offloading step of '" + problem.name() + "': the schedule is invalid: " + prediction_.error);
        loss_step_ = schedule_.steps.size();
        if (const auto loss = problem.loss())
            for (std::size_t i = 0; i < schedule_.steps.size(); ++i)
                if (schedule_.steps[i].is_run() && schedule_.steps[i].op() == *loss) loss_step_ = i;
        report_.predicted_device_peak = prediction_.device_peak;
        report_.predicted_host_peak = prediction_.host_peak;
        report_.predicted_makespan = prediction_.makespan;
        report_.predicted_compute_time = prediction_.compute_time;
        report_.measured_device_timeline.assign(schedule_.steps.size(), -1);
        report_.issue_seconds_timeline.assign(schedule_.steps.size(), 0.0);
    }

    /// The steps before the loss.
    void forward() {
        if (started_) throw ExecutionError("offloading step: forward() was already called");
        started_ = true;
        transfers_->begin_step();
        device_reference_ = probe_->current() - prediction_.device_initial;
        host_reference_ = transfers_->host_bytes() - prediction_.host_initial;
        report_.measured_device_peak = prediction_.device_initial;
        transfers_->reset_host_peak();
        run_steps(0, loss_step_);
    }

    /// The loss and the rest; every transfer is done when it returns.
    void backward() {
        check_backward();
        run_steps(loss_step_, schedule_.steps.size());
        finish();
    }

    /// The rest after a loss that the caller computed between forward() and this call (a
    /// drop-in module: the compute's loss op only takes the output's gradient the caller
    /// gave). Device memory is measured from here on, taken to be the simulator's state after
    /// the loss: what the caller allocated meanwhile (the loss, its graph) is not the plan's.
    void backward_after_caller_loss() {
        check_backward();
        if (loss_step_ >= schedule_.steps.size())
            throw InvalidInput("offloading step of '" + problem_->name() + "': the problem has no loss op to start from");
        device_reference_ = probe_->current() - held_outside() - prediction_.timeline.at(loss_step_).device_after;
        run_steps(loss_step_, schedule_.steps.size());
        finish();
    }

    void run() {
        forward();
        backward();
    }

    /// Gives up a step between forward() and its backward (a caller that never runs it): the
    /// moving data go back where the step found them. What the compute holds of the step is
    /// the caller's to drop; as after a plain forward, the step's effects on the model (random
    /// numbers drawn, running statistics) stay. Nothing happens to a step that completed,
    /// failed or never started.
    void abandon() noexcept {
        if (!started_ || report_.completed || failed_) return;
        failed_ = true;
        try {
            transfers_->roll_back();
        } catch (...) {  // a transfer that failed has already left its data where it was
        }
    }
    [[nodiscard]] bool completed() const noexcept { return report_.completed; }
    [[nodiscard]] bool abandoned_or_failed() const noexcept { return failed_; }

    [[nodiscard]] const OffloadStepReport& report() const noexcept { return report_; }
    [[nodiscard]] const offload::OffloadReport& prediction() const noexcept { return prediction_; }

private:
    void check_backward() const {
        if (!started_ || report_.completed || failed_)
            throw ExecutionError(failed_ ? "offloading step: the step failed and was rolled back; start a new step"
                                         : "offloading step: backward() needs one forward() before it");
    }

    void finish() {
        try {
            transfers_->synchronize();
        } catch (...) {
            fail(schedule_.steps.size());
        }
        report_.measured_host_peak = transfers_->host_peak() - host_reference_;
        report_.rollback_bytes = transfers_->rollback_bytes();
        transfers_->commit_step();
        report_.completed = true;
    }

    [[nodiscard]] Bytes held_outside() const {
        if constexpr (requires(const Compute& c) { c.held_outside(); }) return compute_->held_outside();
        return 0;
    }

    void run_steps(std::size_t first, std::size_t end) {
        const Stopwatch clock;
        for (std::size_t i = first; i < end; ++i) {
            try {
                execute(i);
            } catch (...) {
                fail(i);
            }
        }
        if constexpr (requires(Compute& c) { c.synchronize(); }) {
            try {
                compute_->synchronize();
            } catch (...) {
                fail(end, /*waiting_for_device=*/true);
            }
        }
        report_.seconds += clock.seconds();
    }

    void execute(std::size_t index) {
        using K = offload::TransferStep::Kind;
        const offload::TransferStep& step = schedule_.steps[index];
        const Stopwatch clock;
        Bytes memory = 0;
        switch (step.kind()) {
            case K::run: memory = run_op(step.op()); break;
            case K::free:
                if (problem_->data(step.data()).offloadable) transfers_->release_device(step.data());
                else compute_->release(step.data());
                break;
            case K::offload: transfers_->offload(step.data()); break;
            case K::prefetch: transfers_->prefetch(step.data()); break;
            case K::free_host: transfers_->release_host(step.data()); break;
        }
        if (!step.is_run()) memory = probe_->current() - device_reference_ - held_outside();
        report_.measured_device_timeline[index] = memory;
        report_.measured_device_peak = std::max(report_.measured_device_peak, memory);
        report_.issue_seconds_timeline[index] = clock.seconds();
    }

    // Waits for the prefetches the op reads (and the offloads reading what it updates), then
    // runs it with the probe's peak reset: the memory while it ran.
    Bytes run_op(OpId id) {
        const Op& op = problem_->op(id);
        for (const DataId d : op.reads)
            if (problem_->data(d).offloadable) transfers_->wait_device(d);
        for (const DataId d : op.updates) {
            if (problem_->data(d).offloadable) transfers_->wait_writable(d);
            if (options_.rollback) transfers_->keep_for_rollback(d);
        }
        if constexpr (requires(Compute& c) { c.prepare(id); }) compute_->prepare(id);
        // What others hold from before the op: memory the op makes that someone else keeps
        // afterwards (a parameter gradient outside the plan) was the op's while it ran.
        const Bytes outside_before = held_outside();
        probe_->reset_peak();
        compute_->run(id);
        return probe_->peak() - device_reference_ - outside_before;
    }

    // Puts the data back as the step found them (the transfer backend waits for the copies in
    // flight first), lets the framework drop the step's activations, then rethrows what is
    // being handled, naming the step.
    // `waiting_for_device`: the error showed when the phase's end waited for the device; an
    // earlier op left it there.
    [[noreturn]] void fail(std::size_t index, bool waiting_for_device = false) {
        failed_ = true;
        std::string rollback;
        try {
            transfers_->roll_back();
        } catch (const std::exception& e) {
            rollback = std::string(" (and rolling back failed too: ") + e.what() + ")";
        } catch (...) {
            rollback = " (and rolling back failed too)";
        }
        if constexpr (requires(Compute& c) { c.abort_step(); }) {
            try {
                compute_->abort_step();
            } catch (...) {
                rollback += " (and the framework could not drop the step's activations)";
            }
        }
        const std::string what =
            waiting_for_device ? std::string("waiting for the device at the end of the phase: an earlier op's error")
            : index < schedule_.steps.size() ? offload::describe(*problem_, schedule_.steps[index])
                                             : std::string("the end");
        const std::string context = "offloading step of '" + problem_->name() + "': step " + std::to_string(index) + " (" +
                                    what + ") failed" + rollback + ": ";
        try {
            throw;
        } catch (const InvalidInput& e) {
            std::throw_with_nested(InvalidInput(context + e.what()));
        } catch (const std::exception& e) {
            std::throw_with_nested(ExecutionError(context + e.what()));
        } catch (...) {
            std::throw_with_nested(ExecutionError(context + "unknown exception"));
        }
    }

    const Problem* problem_;
    offload::OffloadSchedule schedule_;
    Compute* compute_;
    Transfers* transfers_;
    Probe* probe_;
    OffloadStepOptions options_;
    offload::OffloadReport prediction_;
    std::size_t loss_step_ = 0;
    bool started_ = false;
    bool failed_ = false;
    Bytes device_reference_ = 0;
    Bytes host_reference_ = 0;
    OffloadStepReport report_;
};

}  // namespace remat
