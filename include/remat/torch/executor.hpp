// remat/torch/executor.hpp — runs any schedule of a chain problem on real tensors.
//
// The chain is Rotor's model (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal
// checkpointing for heterogeneous chains", 2019), expanded into a problem as FORMATS.md §5
// says; a schedule of that problem (from StoreAll, Periodic, Rotor, or written by hand) is
// executed step by step (DESIGN.md §4.6):
//   F_l   runs stage l without autograd;  F_l+  runs it with autograd on a detached leaf of
//   its input, so that its graph s_l is its own;  B_l  back-propagates that graph alone,
//   writing g_{l-1} and the stage's parameter gradients;  free a_l  releases a_l's storage
//   (every handle stays, a recomputation moves new memory in);  free s_l  drops the graph.
// Random ops recompute with the numbers of their first run; buffers (batch-norm running
// statistics) change once per step; parameter gradients are handed over once, at the end
// of the step, so that a failure anywhere leaves parameters, gradients and buffers as
// they were before the step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "detail/runtime.hpp"
#include "detail/step.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "stage.hpp"

namespace remat::torch {

/// What one step cost, measured, next to what the plan predicted.
///
/// Measured bytes come from the probe, op by op: the peak while an op ran, minus the
/// parameter gradients the step has collected so far (they are handed to the parameters at
/// the end; parameters and their gradients are not activations), relative to the memory
/// at the start of the step plus the input's bytes (the simulator's initial state). When
/// the caller computes the loss between the two phases (the drop-in module), the backward
/// phase is measured from its own start, taken to be the simulator's state after `loss`;
/// `caller_bytes` says how much more the caller really held then.
struct StepReport {
    /// The simulator's peak for the plan on the measured problem (measured_problem()).
    Bytes predicted_peak = 0;
    /// The simulator's peak for the plan on the chain the solver planned with (>= predicted).
    Bytes planned_peak = 0;
    double predicted_time = 0.0;  ///< in the profile's unit: seconds
    Bytes measured_peak = 0;
    Bytes forward_peak = 0;
    Bytes backward_peak = 0;
    Bytes caller_bytes = 0;
    double forward_seconds = 0.0;
    double backward_seconds = 0.0;
    /// Stage forwards run (L when nothing is recomputed).
    std::size_t forward_runs = 0;
    /// Per schedule step, the measured memory while it ran (run steps) or after it (free
    /// steps), on the same scale as SimulationReport::timeline; -1 for `loss`, which the
    /// caller runs. For comparing a plan's timeline with reality step by step.
    std::vector<Bytes> measured_timeline;
    bool completed = false;
};

/// The gradients a step produced: of the chain input (undefined unless it requires grad)
/// and of each trainable parameter, in the order of ChainExecutor::parameters() (undefined
/// for a parameter the step did not reach).
struct StepGradients {
    at::Tensor input;
    std::vector<at::Tensor> parameters;
};

/// Adds step gradients into the parameters' .grad as autograd's AccumulateGrad does:
/// a parameter without a gradient takes the new one, otherwise it is added in place.
inline void accumulate_gradients(const std::vector<at::Tensor>& parameters, StepGradients&& gradients) {
    const at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters.size() && i < gradients.parameters.size(); ++i) {
        at::Tensor g = std::move(gradients.parameters[i]);
        if (!g.defined()) continue;
        const at::Tensor& p = parameters[i];
        at::Tensor& grad = p.mutable_grad();
        if (!grad.defined()) {
            if (g.strides() == p.strides() && g.storage_offset() == 0)
                grad = std::move(g);
            else
                grad = at::empty_strided(p.sizes(), p.strides(), p.options()).copy_(g);
        } else {
            grad.add_(g);
        }
    }
}

namespace detail {

// How a step fills its report: ChainStep here and ScriptStep (graph_executor.hpp) share
// these, so that their reports measure the same things the same way.

/// A step's report before it runs: what the plan predicts, and a timeline to fill.
[[nodiscard]] inline StepReport planned_report(const PreparedPlan& prepared) {
    StepReport report;
    report.predicted_peak = prepared.simulation.peak;
    report.planned_peak = prepared.planned_peak;
    report.predicted_time = prepared.simulation.time;
    report.measured_timeline.assign(prepared.plan.schedule.size(), -1);
    return report;
}

/// Starts measuring the forward phase; returns the reference that later readings of the
/// probe are taken against. The simulator starts with the inputs in memory, so the
/// reference is the probe's reading now less the inputs' bytes.
[[nodiscard]] inline Bytes start_forward_measurement(StepReport& report, Bytes probe_now, Bytes input_bytes) {
    report.forward_peak = input_bytes;
    return probe_now - input_bytes;
}

/// Starts measuring the backward phase; returns its reference. A continuous step (both
/// phases back to back, nothing of the caller's in between) keeps the forward's reference;
/// otherwise the phase is calibrated at its own start, taken to be the simulator's state
/// after `loss`, and what the caller holds beyond that state goes to `caller_bytes`.
[[nodiscard]] inline Bytes start_backward_measurement(StepReport& report, const PreparedPlan& prepared,
                                                      Bytes probe_now, Bytes forward_reference, bool continuous) {
    const Bytes after_loss = prepared.simulation.timeline.at(prepared.loss_step).after;
    report.caller_bytes = (probe_now - forward_reference) - after_loss;
    report.backward_peak = after_loss;
    return continuous ? forward_reference : probe_now - after_loss;
}

/// Completes the report of a step whose backward phase has run, once the device has done
/// the queued work (or the time would leave some of it out).
inline void finish_report(StepReport& report, Clock::time_point backward_start, const c10::Device& device) {
    synchronize(device);
    report.backward_seconds = seconds_since(backward_start);
    report.measured_peak = std::max(report.forward_peak, report.backward_peak);
    report.completed = true;
}

enum class OpKind : unsigned char { forward, forward_grad, loss, backward };
enum class DataKind : unsigned char { activation, saved, gradient };

struct ChainOp {
    OpKind kind;
    std::size_t stage;  // 1..L; 0 for the loss
};
struct ChainData {
    DataKind kind;
    std::size_t stage;  // a_l, s_l, g_l
};

/// Everything a step needs that does not change from step to step.
template <class Probe>
struct ExecutorCore {
    ExecutorCore(StageList stages_in, ChainProfile profile_in, Probe probe_in)
        : stages(std::move(stages_in)),
          profile(std::move(profile_in)),
          problem(to_problem(profile.chain)),
          measured(measured_problem(profile)),
          table(stages),
          probe(std::move(probe_in)) {
        const std::size_t L = stages.size();
        if (L != profile.chain.length())
            throw InvalidInput("ChainExecutor: " + std::to_string(L) + " stages but the chain '" + profile.chain.name +
                               "' has " + std::to_string(profile.chain.length()) +
                               "; profile the same stages that you execute");
        if (profile.random.size() != L) profile.random.assign(L, 1);
        const ChainIds ids = chain_ids(L);
        ops.resize(problem.op_count());
        data.resize(problem.data_count());
        for (std::size_t l = 1; l <= L; ++l) {
            ops[ids.fwd[l].index] = {OpKind::forward, l};
            ops[ids.fwd_grad[l].index] = {OpKind::forward_grad, l};
            ops[ids.bwd[l].index] = {OpKind::backward, l};
            data[ids.s[l].index] = {DataKind::saved, l};
        }
        ops[ids.loss.index] = {OpKind::loss, 0};
        for (std::size_t l = 0; l <= L; ++l) {
            data[ids.a[l].index] = {DataKind::activation, l};
            data[ids.g[l].index] = {DataKind::gradient, l};
        }
        for (const ChainStage& s : stages) recompute_snapshots.emplace_back(s.buffers);
    }

    StageList stages;
    ChainProfile profile;
    Problem problem;   ///< the chain's expansion: what solvers plan on
    Problem measured;  ///< the same with each forward's own overhead: what predictions use
    ParameterTable table;
    mutable Probe probe;
    std::vector<ChainOp> ops;
    std::vector<ChainData> data;
    /// Scratch copies of each stage's buffers, for recomputations (allocated once).
    mutable std::vector<BufferSnapshot> recompute_snapshots;
};

}  // namespace detail

template <MemoryProbe Probe = CpuMemoryProbe>
class ChainExecutor;
template <MemoryProbe Probe = CpuMemoryProbe>
class ChainStep;

/// A plan checked against the executor's chain and ready to run, shareable between steps.
/// plan(), schedule(), predicted_peak() (the simulator's peak on the measured problem),
/// predicted_time() and simulation() come from detail::PlanView.
class ExecutablePlan : public detail::PlanView {
public:
    /// The simulator's peak on the chain (an upper bound of predicted_peak()).
    [[nodiscard]] Bytes planned_peak() const noexcept { return prepared_->planned_peak; }

private:
    template <MemoryProbe>
    friend class ChainExecutor;
    template <MemoryProbe>
    friend class ChainStep;
    explicit ExecutablePlan(std::shared_ptr<const detail::PreparedPlan> prepared) : PlanView(std::move(prepared)) {}
};

/// One training step in two phases: forward() runs the plan up to `loss` and returns the
/// chain's output; backward(grad) runs the rest and returns the gradients. A step that
/// throws undoes itself (buffers, random generators in the forward phase) and frees
/// everything; the exception is an ExecutionError naming the plan step and the stage.
template <MemoryProbe Probe>
class ChainStep {
public:
    /// `continuous`: the caller runs both phases back to back (the backward phase is measured
    /// from the start of the step, not calibrated at its own start).
    ChainStep(std::shared_ptr<detail::ExecutorCore<Probe>> core, ExecutablePlan plan, const at::Tensor& input,
              bool continuous)
        : core_(std::move(core)), prepared_(std::move(plan.prepared_)), continuous_(continuous) {
        if (!matches(core_->profile, input))
            throw InvalidInput("chain '" + core_->profile.chain.name + "' was profiled for inputs of shape " +
                               detail::sizes_string(core_->profile.input_sizes) + " (" +
                               std::string(c10::toString(core_->profile.input_dtype)) + " on " +
                               core_->profile.input_device.str() + "), not " + detail::sizes_string(input.sizes().vec()) +
                               " (" + std::string(c10::toString(input.scalar_type())) + " on " + input.device().str() +
                               "); profile again for this shape");
        const std::size_t L = core_->stages.size();
        a_.resize(L + 1);
        s_.resize(L + 1);
        g_.resize(L + 1);
        rng_.resize(L + 1);
        ran_.assign(L + 1, 0);
        pending_.reset(core_->table.parameters.size());
        input_requires_grad_ = input.requires_grad();
        device_ = input.device();
        a_[0].set_external(input);
        report_ = detail::planned_report(*prepared_);
    }

    ChainStep(ChainStep&&) noexcept = default;
    ChainStep& operator=(ChainStep&&) noexcept = default;
    ChainStep(const ChainStep&) = delete;
    ChainStep& operator=(const ChainStep&) = delete;
    ~ChainStep() { clear(); }

    /// Runs the plan up to `loss`; returns the output (a tensor without autograd history
    /// that the caller may keep).
    at::Tensor forward() {
        detail::check_forward_allowed(phase_, "chain step");
        rollback_.save(core_->stages, device_);
        phase_ = Phase::forward;
        const auto start = detail::Clock::now();
        forward_reference_ =
            detail::start_forward_measurement(report_, core_->probe.current(), core_->profile.chain.input_bytes);
        for (std::size_t i = 0; i < prepared_->loss_step; ++i) execute(i, forward_reference_, report_.forward_peak);
        a_.back().expose();
        at::Tensor output = a_.back().tensor().detach();
        detail::synchronize(device_);
        report_.forward_seconds = detail::seconds_since(start);
        phase_ = Phase::between;
        return output;
    }

    /// Runs the rest of the plan with `grad_output`, the gradient of the loss with respect
    /// to the output. The executor keeps no reference to it beyond the plan's `free g_L`.
    StepGradients backward(at::Tensor grad_output) {
        detail::check_backward_allowed(phase_, "chain step");
        if (!grad_output.defined())
            throw InvalidInput("chain step: the gradient of the output is undefined");
        phase_ = Phase::backward;
        const auto start = detail::Clock::now();
        g_.back() = std::move(grad_output);
        const Bytes reference = detail::start_backward_measurement(report_, *prepared_, core_->probe.current(),
                                                                   forward_reference_, continuous_);
        const Schedule& schedule = prepared_->plan.schedule;
        for (std::size_t i = prepared_->loss_step + 1; i < schedule.size(); ++i)
            execute(i, reference, report_.backward_peak);
        StepGradients result;
        result.input = g_[0];
        result.parameters = pending_.take();
        detail::finish_report(report_, start, device_);
        phase_ = Phase::done;
        clear();
        return result;
    }

    /// Gives up a step between its phases (the caller's loss failed): buffers go back to
    /// their values before the step and everything is freed.
    void abort() noexcept {
        if (phase_ == Phase::done || phase_ == Phase::failed) return;
        rollback_.undo(core_->stages, /*generators_too=*/false);
        phase_ = Phase::failed;
        clear();
    }

    [[nodiscard]] const StepReport& report() const noexcept { return report_; }

private:
    using Phase = detail::StepPhase;

    [[nodiscard]] bool input_grad_for(std::size_t l) const noexcept { return l > 1 || input_requires_grad_; }

    void execute(std::size_t index, Bytes reference, Bytes& peak) {
        const Step& step = prepared_->plan.schedule[index];
        if (step.is_free()) {
            release_data(core_->data[step.data().index]);
            report_.measured_timeline[index] = core_->probe.current() - pending_.bytes() - reference;
            return;
        }
        const detail::ChainOp op = core_->ops[step.op().index];
        if (op.kind == detail::OpKind::loss) return;
        const Bytes pending_before = pending_.bytes();
        core_->probe.reset_peak();
        try {
            run(op);
        } catch (...) {
            fail(index, op);
        }
        const Bytes during = core_->probe.peak() - pending_before - reference;
        report_.measured_timeline[index] = during;
        peak = std::max(peak, during);
    }

    void release_data(const detail::ChainData& d) {
        switch (d.kind) {
            case detail::DataKind::activation: a_[d.stage].release(); break;
            case detail::DataKind::saved: s_[d.stage].clear(); break;
            case detail::DataKind::gradient: g_[d.stage] = at::Tensor(); break;
        }
    }

    void run(const detail::ChainOp& op) {
        if (op.kind == detail::OpKind::backward) {
            run_backward(op.stage);
            return;
        }
        run_forward(op.stage, op.kind == detail::OpKind::forward_grad);
    }

    void run_forward(std::size_t l, bool with_grad) {
        detail::Activation& out = a_[l];
        if (with_grad && s_[l].live()) with_grad = false;  // only a_l is missing, if anything
        if (!with_grad && out.live()) return;              // nothing the op writes is missing
        if (out.live()) out.release();  // rewritten: the simulator counts it once, and so do we
        const ChainStage& stage = core_->stages[l - 1];
        const at::Tensor& input = a_[l - 1].tensor();
        const bool first = ran_[l] == 0;
        std::optional<detail::RngReplay> replay;
        std::optional<detail::BufferGuard> buffers;
        if (first) {
            ran_[l] = 1;
            // Every stage the plan runs again gets its numbers back, whether or not profiling saw
            // it draw any: a stage may draw only sometimes, and a capture costs microseconds.
            if (prepared_->forward_runs[l] > 1) rng_[l] = detail::RngState::capture(device_);
        } else {
            if (rng_[l]) replay.emplace(*rng_[l], device_);
            if (!stage.buffers.empty()) buffers.emplace(core_->recompute_snapshots[l - 1], stage.buffers);
        }
        ++report_.forward_runs;
        if (with_grad) {
            detail::StageGraph graph = detail::run_with_grad(stage, input, input_grad_for(l));
            if (first) detail::check_output_is_fresh(stage, input, graph.output);
            out.install(graph.output, /*graph_holds_storage=*/true, stage.name);
            s_[l] = std::move(graph);
        } else {
            const at::Tensor y = detail::run_no_grad(stage, input);
            if (first) detail::check_output_is_fresh(stage, input, y);
            out.install(y, /*graph_holds_storage=*/false, stage.name);
        }
    }

    void run_backward(std::size_t l) {
        const auto& indices = core_->table.of_stage[l - 1];
        std::vector<at::Tensor> grads;
        at::Tensor input_grad =
            detail::run_backward(s_[l], g_[l], input_grad_for(l), core_->table.trainable[l - 1], grads);
        const at::NoGradGuard no_grad;
        for (std::size_t k = 0; k < indices.size(); ++k)
            if (grads[k].defined()) pending_.add_copying(indices[k], std::move(grads[k]));
        g_[l - 1] = std::move(input_grad);
        pending_.recount();
    }

    [[noreturn]] void fail(std::size_t index, const detail::ChainOp& op) {
        const bool in_forward = phase_ == Phase::forward;
        // The generators go back only in the forward phase: later, the caller (its loss) may
        // have drawn from them.
        rollback_.undo(core_->stages, /*generators_too=*/in_forward);
        phase_ = Phase::failed;
        clear();
        const std::string stage =
            op.stage > 0 ? " (stage " + std::to_string(op.stage) + " '" + core_->stages[op.stage - 1].name + "')" : "";
        const std::string context = detail::step_failure_context(index, core_->problem, prepared_->plan.schedule[index],
                                                                 stage, in_forward);
        try {
            throw;
        } catch (const InvalidInput& e) {
            // A stage that breaks the chain's rules: the input is at fault, not the run.
            std::throw_with_nested(InvalidInput(context + e.what()));
        } catch (...) {
            detail::rethrow_as_execution_error(context);
        }
    }

    void clear() noexcept {
        for (auto& s : s_) s.clear();
        for (auto& a : a_) a.clear();
        for (auto& g : g_) g = at::Tensor();
        pending_.clear();
        rollback_.clear();
    }

    std::shared_ptr<detail::ExecutorCore<Probe>> core_;
    std::shared_ptr<const detail::PreparedPlan> prepared_;
    bool continuous_ = false;
    Phase phase_ = Phase::ready;
    bool input_requires_grad_ = false;
    c10::Device device_ = c10::Device(c10::DeviceType::CPU);
    std::vector<detail::Activation> a_;
    std::vector<detail::StageGraph> s_;
    std::vector<at::Tensor> g_;
    std::vector<std::optional<detail::RngState>> rng_;
    std::vector<char> ran_;
    detail::PendingGradients pending_;
    Bytes forward_reference_ = 0;
    detail::StepRollback rollback_;
    StepReport report_;
};

/// The outcome of ChainExecutor::step.
struct StepResult {
    at::Tensor output;
    at::Tensor loss;
    StepReport report;
};

/// Runs schedules of one profiled chain. Copies share the same stages and probe.
template <MemoryProbe Probe>
class ChainExecutor {
public:
    ChainExecutor(StageList stages, ChainProfile profile, Probe probe = Probe{})
        : core_(std::make_shared<detail::ExecutorCore<Probe>>(std::move(stages), std::move(profile), std::move(probe))) {}

    [[nodiscard]] const Chain& chain() const noexcept { return core_->profile.chain; }
    [[nodiscard]] const ChainProfile& profile() const noexcept { return core_->profile; }
    /// The chain's expansion (FORMATS.md §5): what solvers plan on.
    [[nodiscard]] const Problem& problem() const noexcept { return core_->problem; }
    /// The same problem with each forward's own measured overhead: what predictions use.
    [[nodiscard]] const Problem& measured_problem() const noexcept { return core_->measured; }
    [[nodiscard]] const StageList& stages() const noexcept { return core_->stages; }
    /// The trainable parameters, each once, in the order StepGradients uses.
    [[nodiscard]] const std::vector<at::Tensor>& parameters() const noexcept { return core_->table.parameters; }
    [[nodiscard]] Probe& probe() const noexcept { return core_->probe; }

    /// Checks a plan against this chain (the simulator must accept it) and prepares it.
    [[nodiscard]] ExecutablePlan prepare(Plan plan) const {
        const SimulationReport planned =
            detail::checked_simulation(core_->problem, plan.schedule, "chain '" + core_->profile.chain.name + "'");
        SimulationReport simulation = simulate(core_->measured, plan.schedule);
        // Stages are numbered from 1, as in the chain's ids.
        const auto role_of = [this](OpId id) {
            const detail::ChainOp op = core_->ops[id.index];
            using Kind = detail::OpKind;
            return detail::PlanOpRole{op.kind == Kind::loss, op.kind == Kind::forward || op.kind == Kind::forward_grad,
                                      op.stage};
        };
        return ExecutablePlan(detail::prepare_plan(std::move(plan), std::move(simulation), planned.peak,
                                                   core_->stages.size() + 1, role_of));
    }
    [[nodiscard]] ExecutablePlan prepare(Schedule schedule) const {
        return prepare(detail::hand_written_plan(std::move(schedule)));
    }

    /// A step to drive by hand (or from an autograd function): forward(), then backward().
    [[nodiscard]] ChainStep<Probe> start(const ExecutablePlan& plan, const at::Tensor& input, bool continuous = true) const {
        return ChainStep<Probe>(core_, plan, input, continuous);
    }

    /// A whole training step: forward, `loss(output)` (with autograd), backward, and the
    /// gradients added into the parameters' .grad — all or nothing.
    StepResult step(const ExecutablePlan& plan, const at::Tensor& input,
                    const std::function<at::Tensor(const at::Tensor&)>& loss) const {
        ChainStep<Probe> run = start(plan, input, /*continuous=*/true);
        StepResult result;
        result.output = run.forward();
        at::Tensor grad;
        try {
            const ::torch::autograd::AutoGradMode grad_mode(true);
            const at::Tensor leaf = result.output.detach().requires_grad_(true);
            const at::Tensor value = loss(leaf);
            if (!value.defined() || value.numel() != 1)
                throw InvalidInput("ChainExecutor::step: the loss function must return a single value");
            grad = ::torch::autograd::grad({value}, {leaf})[0];
            result.loss = value.detach();
        } catch (...) {
            run.abort();
            throw;
        }
        StepGradients gradients = run.backward(std::move(grad));
        accumulate_gradients(parameters(), std::move(gradients));
        result.report = run.report();
        return result;
    }

private:
    std::shared_ptr<detail::ExecutorCore<Probe>> core_;
};

}  // namespace remat::torch
