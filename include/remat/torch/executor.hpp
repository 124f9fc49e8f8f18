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
#include <unordered_set>
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

struct PreparedSchedule {
    Plan plan;
    SimulationReport simulation;  ///< on the measured problem
    Bytes planned_peak = 0;       ///< on the chain's problem
    std::size_t loss_step = 0;
    std::vector<std::size_t> forward_runs;  // per stage (index l), how many F_l / F_l+ steps
};

}  // namespace detail

template <MemoryProbe Probe = CpuMemoryProbe>
class ChainExecutor;
template <MemoryProbe Probe = CpuMemoryProbe>
class ChainStep;

/// A plan checked against the executor's chain and ready to run, shareable between steps.
class ExecutablePlan {
public:
    [[nodiscard]] const Plan& plan() const noexcept { return prepared_->plan; }
    [[nodiscard]] const Schedule& schedule() const noexcept { return prepared_->plan.schedule; }
    /// The simulator's peak on the measured problem: what the executor should reach.
    [[nodiscard]] Bytes predicted_peak() const noexcept { return prepared_->simulation.peak; }
    /// The simulator's peak on the chain (an upper bound of predicted_peak()).
    [[nodiscard]] Bytes planned_peak() const noexcept { return prepared_->planned_peak; }
    [[nodiscard]] double predicted_time() const noexcept { return prepared_->simulation.time; }
    [[nodiscard]] const SimulationReport& simulation() const noexcept { return prepared_->simulation; }

private:
    template <MemoryProbe>
    friend class ChainExecutor;
    template <MemoryProbe>
    friend class ChainStep;
    explicit ExecutablePlan(std::shared_ptr<const detail::PreparedSchedule> prepared) : prepared_(std::move(prepared)) {}
    std::shared_ptr<const detail::PreparedSchedule> prepared_;
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
        pending_.resize(core_->table.parameters.size());
        input_requires_grad_ = input.requires_grad();
        device_ = input.device();
        a_[0].set_external(input);
        report_.predicted_peak = prepared_->simulation.peak;
        report_.planned_peak = prepared_->planned_peak;
        report_.predicted_time = prepared_->simulation.time;
        report_.measured_timeline.assign(prepared_->plan.schedule.size(), -1);
    }

    ChainStep(ChainStep&&) noexcept = default;
    ChainStep& operator=(ChainStep&&) noexcept = default;
    ChainStep(const ChainStep&) = delete;
    ChainStep& operator=(const ChainStep&) = delete;
    ~ChainStep() { clear(); }

    /// Runs the plan up to `loss`; returns the output (a tensor without autograd history
    /// that the caller may keep).
    at::Tensor forward() {
        if (phase_ != Phase::ready)
            throw ExecutionError("chain step: forward() was already called; start a new step for a new forward");
        // Taken before the baseline: these copies exist for the step, not for the plan.
        for (const ChainStage& s : core_->stages) start_buffers_.emplace_back(s.buffers);
        start_rng_ = detail::RngState::capture(device_);
        phase_ = Phase::forward;
        const auto start = detail::Clock::now();
        forward_reference_ = core_->probe.current() - core_->profile.chain.input_bytes;
        report_.forward_peak = core_->profile.chain.input_bytes;
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
        if (phase_ != Phase::between)
            throw ExecutionError(phase_ == Phase::done || phase_ == Phase::failed
                                     ? "chain step: backward() was already called (or the step failed); a step "
                                       "back-propagates once"
                                     : "chain step: backward() before forward()");
        if (!grad_output.defined())
            throw InvalidInput("chain step: the gradient of the output is undefined");
        phase_ = Phase::backward;
        const auto start = detail::Clock::now();
        const Bytes after_loss = prepared_->simulation.timeline.at(prepared_->loss_step).after;
        g_.back() = std::move(grad_output);
        const Bytes now = core_->probe.current();
        report_.caller_bytes = (now - forward_reference_) - after_loss;
        const Bytes reference = continuous_ ? forward_reference_ : now - after_loss;
        report_.backward_peak = after_loss;
        const Schedule& schedule = prepared_->plan.schedule;
        for (std::size_t i = prepared_->loss_step + 1; i < schedule.size(); ++i)
            execute(i, reference, report_.backward_peak);
        StepGradients result;
        result.input = g_[0];
        result.parameters = std::move(pending_);
        pending_.clear();
        detail::synchronize(device_);
        report_.backward_seconds = detail::seconds_since(start);
        report_.measured_peak = std::max(report_.forward_peak, report_.backward_peak);
        report_.completed = true;
        phase_ = Phase::done;
        clear();
        return result;
    }

    /// Gives up a step between its phases (the caller's loss failed): buffers go back to
    /// their values before the step and everything is freed.
    void abort() noexcept {
        if (phase_ == Phase::done || phase_ == Phase::failed) return;
        try {
            for (std::size_t i = 0; i < start_buffers_.size(); ++i)
                start_buffers_[i].restore(core_->stages[i].buffers);
        } catch (...) {
            // Copying a few buffers back failed (out of memory): nothing better is left to do.
        }
        phase_ = Phase::failed;
        clear();
    }

    [[nodiscard]] const StepReport& report() const noexcept { return report_; }

private:
    enum class Phase : unsigned char { ready, forward, between, backward, done, failed };

    [[nodiscard]] bool input_grad_for(std::size_t l) const noexcept { return l > 1 || input_requires_grad_; }

    void execute(std::size_t index, Bytes reference, Bytes& peak) {
        const Step& step = prepared_->plan.schedule[index];
        if (step.is_free()) {
            release_data(core_->data[step.data().index]);
            report_.measured_timeline[index] = core_->probe.current() - pending_bytes_ - reference;
            return;
        }
        const detail::ChainOp op = core_->ops[step.op().index];
        if (op.kind == detail::OpKind::loss) return;
        const Bytes pending_before = pending_bytes_;
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
        for (std::size_t k = 0; k < indices.size(); ++k) {
            if (!grads[k].defined()) continue;
            at::Tensor& sum = pending_[indices[k]];
            // Out of place: a gradient may alias another (autograd hands some through unchanged).
            sum = sum.defined() ? sum + grads[k] : std::move(grads[k]);
        }
        g_[l - 1] = std::move(input_grad);
        pending_bytes_ = 0;
        std::unordered_set<const void*> counted;
        for (const at::Tensor& t : pending_)
            if (t.defined() && t.has_storage() && counted.insert(t.storage().unsafeGetStorageImpl()).second)
                pending_bytes_ += detail::storage_bytes(t);
    }

    [[noreturn]] void fail(std::size_t index, const detail::ChainOp& op) {
        const bool in_forward = phase_ == Phase::forward;
        // Undo the step: buffers as before it; the generators too when the caller has not
        // drawn from them since (the forward phase).
        for (std::size_t i = 0; i < start_buffers_.size(); ++i) start_buffers_[i].restore(core_->stages[i].buffers);
        if (in_forward && !start_rng_.empty()) start_rng_.restore();
        phase_ = Phase::failed;
        clear();
        const std::string what = describe(core_->problem, prepared_->plan.schedule[index]);
        const std::string stage = op.stage > 0 ? " (stage " + std::to_string(op.stage) + " '" +
                                                     core_->stages[op.stage - 1].name + "')"
                                               : "";
        const std::string context = "step " + std::to_string(index) + " of the plan, " + what + stage +
                                    " failed during the " + (in_forward ? "forward" : "backward") +
                                    " phase; parameters, gradients and buffers are as before the step: ";
        try {
            throw;
        } catch (const InvalidInput& e) {
            // A stage that breaks the chain's rules: the input is at fault, not the run.
            std::throw_with_nested(InvalidInput(context + e.what()));
        } catch (const Error& e) {
            std::throw_with_nested(ExecutionError(context + e.what()));
        } catch (const std::exception& e) {
            std::throw_with_nested(ExecutionError(context + e.what()));
        } catch (...) {
            std::throw_with_nested(ExecutionError(context + "unknown exception"));
        }
    }

    void clear() noexcept {
        for (auto& s : s_) s.clear();
        for (auto& a : a_) a.clear();
        for (auto& g : g_) g = at::Tensor();
        pending_.clear();
        pending_bytes_ = 0;
        start_buffers_.clear();
    }

    std::shared_ptr<detail::ExecutorCore<Probe>> core_;
    std::shared_ptr<const detail::PreparedSchedule> prepared_;
    bool continuous_ = false;
    Phase phase_ = Phase::ready;
    bool input_requires_grad_ = false;
    c10::Device device_ = c10::Device(c10::DeviceType::CPU);
    std::vector<detail::Activation> a_;
    std::vector<detail::StageGraph> s_;
    std::vector<at::Tensor> g_;
    std::vector<std::optional<detail::RngState>> rng_;
    std::vector<char> ran_;
    std::vector<at::Tensor> pending_;
    Bytes pending_bytes_ = 0;
    Bytes forward_reference_ = 0;
    std::vector<detail::BufferSnapshot> start_buffers_;
    detail::RngState start_rng_;
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
        auto prepared = std::make_shared<detail::PreparedSchedule>();
        const SimulationReport planned = simulate(core_->problem, plan.schedule);
        if (!planned.valid)
            throw InvalidInput("the plan is not a valid schedule of chain '" + core_->profile.chain.name +
                               "': " + planned.error);
        prepared->planned_peak = planned.peak;
        prepared->simulation = simulate(core_->measured, plan.schedule);
        const std::size_t L = core_->stages.size();
        prepared->forward_runs.assign(L + 1, 0);
        bool found_loss = false;
        for (std::size_t i = 0; i < plan.schedule.size(); ++i) {
            const Step& step = plan.schedule[i];
            if (!step.is_run()) continue;
            const detail::ChainOp op = core_->ops[step.op().index];
            if (op.kind == detail::OpKind::loss) {
                prepared->loss_step = i;
                found_loss = true;
            } else if (op.kind != detail::OpKind::backward) {
                ++prepared->forward_runs[op.stage];
            }
        }
        if (!found_loss) throw InvalidInput("the plan never runs 'loss'");
        prepared->plan = std::move(plan);
        return ExecutablePlan(std::move(prepared));
    }
    [[nodiscard]] ExecutablePlan prepare(Schedule schedule) const {
        Plan plan;
        plan.schedule = std::move(schedule);
        plan.stats.solver = "hand-written";
        return prepare(std::move(plan));
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
