// remat/torch/executor.hpp — runs any schedule of a chain problem on real tensors.
//
// The chain is Rotor's model (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal
// checkpointing for heterogeneous chains", 2019), expanded into a problem as docs/formats.md §5 (chains)
// says; a schedule of that problem (from StoreAll, Periodic, Rotor, or written by hand) is
// executed step by step (docs/design.md §6 (execution engine)):
//   F_l   runs stage l without autograd;  F_l+  runs it with autograd on a detached leaf of
//   its input, so that its graph s_l is its own;  B_l  back-propagates that graph alone,
//   writing g_{l-1} and the stage's parameter gradients;  free a_l  releases a_l's storage
//   (every handle stays, a recomputation moves new memory in);  free s_l  drops the graph.
// The step itself is the framework-independent engine of remat/exec/executor.hpp (phases,
// replay of random numbers, measurement, rollback); this header is its LibTorch backend for
// chains (ChainBackend) and the front end over it. Random ops recompute with the numbers of
// their first run; buffers (batch-norm running statistics) change once per step; parameter
// gradients are handed over once, at the end of the step, so that a failure anywhere leaves
// parameters, gradients and buffers as they were before the step.
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
#include "../exec/executor.hpp"
#include "detail/op_clock.hpp"
#include "detail/runtime.hpp"
#include "detail/step.hpp"
#include "gradient_hooks.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "stage.hpp"
#include "step.hpp"

namespace remat::torch {

/// What one step cost (remat/exec/report.hpp): the same report for every framework.
using StepReport = remat::StepReport;

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
            // A view is copied, as AccumulateGrad does: optimizers detach .grad in place
            // (zero_grad), which a view refuses.
            if (g.strides() == p.strides() && g.storage_offset() == 0 && !g.is_view())
                grad = std::move(g);
            else
                grad = at::empty_strided(p.sizes(), p.strides(), p.options()).copy_(g);
        } else {
            grad.add_(g);
        }
    }
}

namespace detail::executor {

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
        execution.units = L + 1;
        execution.op_role.assign(problem.op_count(), ExecOpRole::forward);
        execution.op_unit.assign(problem.op_count(), 0);
        for (std::size_t k = 0; k < ops.size(); ++k) {
            const ChainOp op = ops[k];
            execution.op_role[k] = op.kind == OpKind::forward        ? ExecOpRole::forward
                               : op.kind == OpKind::forward_grad ? ExecOpRole::forward_grad
                               : op.kind == OpKind::backward     ? ExecOpRole::backward
                                                                 : ExecOpRole::loss;
            execution.op_unit[k] = op.stage;
        }
        for (std::size_t d = 0; d < data.size(); ++d) {
            execution.data_role.push_back(data[d].kind == DataKind::activation ? ExecDataRole::activation
                                      : data[d].kind == DataKind::saved    ? ExecDataRole::saved
                                                                           : ExecDataRole::gradient);
            execution.data_unit.push_back(data[d].stage);
        }
    }

    StageList stages;
    ChainProfile profile;
    Problem problem;   ///< the chain's expansion: what solvers plan on
    Problem measured;  ///< the same with each forward's own overhead: what predictions use
    ParameterTable table;
    mutable Probe probe;
    std::vector<ChainOp> ops;
    std::vector<ChainData> data;
    ExecutionTable execution;
    /// Scratch copies of each stage's buffers, for recomputations (allocated once).
    mutable std::vector<BufferSnapshot> recompute_snapshots;
};

}  // namespace detail::executor

template <MemoryProbe Probe = CpuMemoryProbe>
class ChainExecutor;

/// A plan checked against the executor's chain and ready to run, shareable between steps:
/// plan(), schedule(), predicted_peak() (the simulator's peak on the measured problem),
/// planned_peak() (on the chain: an upper bound of it), predicted_time() and simulation().
class ExecutablePlan : public ExecutionPlan {
private:
    template <MemoryProbe>
    friend class ChainExecutor;
    explicit ExecutablePlan(ExecutionPlan plan) : ExecutionPlan(std::move(plan)) {}
};

namespace detail::executor {

/// One chain step's tensors, run for the engine (exec/backend.hpp): activations a_l, the
/// stages' autograd graphs s_l, gradients g_l, the parameter gradients collected so far.
template <class Probe>
class ChainBackend {
public:
    using RngState = detail::RngState;

    ChainBackend(std::shared_ptr<ExecutorCore<Probe>> core, const at::Tensor& input,
                 std::shared_ptr<const GradientHooks> hooks = nullptr)
        : core_(std::move(core)) {
        const std::size_t L = core_->stages.size();
        a_.resize(L + 1);
        s_.resize(L + 1);
        g_.resize(L + 1);
        pending_.reset(core_->table.parameters.size());
        if (hooks) {
            std::vector<std::size_t> units_of(core_->table.parameters.size(), 0);
            for (const auto& indices : core_->table.of_stage)
                for (const std::size_t p : indices) ++units_of[p];
            pending_.watch(std::move(hooks), std::move(units_of));
        }
        input_requires_grad_ = input.requires_grad();
        device_ = input.device();
        clock_ = OpClock(device_);
        a_[0].set_external(input);
    }
    ChainBackend(ChainBackend&&) noexcept = default;
    ChainBackend& operator=(ChainBackend&&) noexcept = default;

    [[nodiscard]] RngState capture_rng() const { return RngState::capture(device_); }
    void restore_rng(const RngState& state) const { state.restore(); }
    // Every stage the plan runs again gets its numbers back, whether or not profiling saw it
    // draw any: a stage may draw only sometimes, and reading the generators costs microseconds.
    [[nodiscard]] bool random(std::size_t) const noexcept { return true; }

    void forward(std::size_t l, bool with_grad, bool first_run) {
        const ChainStage& stage = core_->stages[l - 1];
        const at::Tensor& input = a_[l - 1].tensor();
        std::optional<BufferGuard> buffers;
        if (!first_run && !stage.buffers.empty()) buffers.emplace(core_->recompute_snapshots[l - 1], stage.buffers);
        if (with_grad) {
            StageGraph graph = run_with_grad(stage, input, input_grad_for(l));
            if (first_run) check_output_is_fresh(stage, input, graph.output);
            a_[l].install(graph.output, /*graph_holds_storage=*/true, stage.name);
            s_[l] = std::move(graph);
        } else {
            const at::Tensor y = run_no_grad(stage, input);
            if (first_run) check_output_is_fresh(stage, input, y);
            a_[l].install(y, /*graph_holds_storage=*/false, stage.name);
        }
    }

    void backward(std::size_t l) {
        const auto& indices = core_->table.of_stage[l - 1];
        std::vector<at::Tensor> grads;
        at::Tensor input_grad = run_backward(s_[l], g_[l], input_grad_for(l), core_->table.trainable[l - 1], grads);
        const at::NoGradGuard no_grad;
        for (std::size_t k = 0; k < indices.size(); ++k) {
            if (!grads[k].defined()) continue;
            // Autograd may hand one tensor on as several gradients (`x + b`); one that hooks may
            // change in place gets memory of its own.
            if (pending_.announces() && shares_memory(grads[k], input_grad, grads, k)) grads[k] = grads[k].clone();
            pending_.add_copying(indices[k], std::move(grads[k]));
        }
        g_[l - 1] = std::move(input_grad);
        pending_.unit_done(indices);
        pending_.recount();
    }

    void release(DataId d) {
        const ChainData& data = core_->data[d.index];
        switch (data.kind) {
            case DataKind::activation: a_[data.stage].release(); break;
            case DataKind::saved: s_[data.stage].clear(); break;
            case DataKind::gradient:
                if (data.stage == core_->stages.size()) release_output_gradient(g_[data.stage], gradients_from_autograd_, held_outside_);
                else g_[data.stage] = at::Tensor();
                break;
        }
    }

    [[nodiscard]] Bytes pending_gradient_bytes() const noexcept { return pending_.bytes(); }
    /// The output's gradient where autograd still holds it after the plan freed it.
    [[nodiscard]] Bytes caller_bytes() const noexcept { return held_outside_.bytes(); }
    void begin_step() { rollback_.save(core_->stages, device_); }
    void commit() {
        result_.input = g_[0];
        result_.parameters = pending_.take();
    }
    void rollback(bool generators_too) noexcept { rollback_.undo(core_->stages, generators_too); }
    void clear() noexcept {
        for (auto& s : s_) s.clear();
        for (auto& a : a_) a.clear();
        for (auto& g : g_) g = at::Tensor();
        pending_.clear();
        rollback_.clear();
        held_outside_.clear();
    }
    void synchronize() const { detail::synchronize(device_); }
    [[nodiscard]] std::string describe(std::size_t l) const {
        return l > 0 ? " (stage " + std::to_string(l) + " '" + core_->stages[l - 1].name + "')" : "";
    }
    [[nodiscard]] static std::string error_text(const std::exception& e) { return error_message(e); }
    [[nodiscard]] double now() const { return clock_.now(); }

    // The step's hand-over (torch/step.hpp): the chain's one output and its gradient.
    using OutputGradients = at::Tensor;
    /// The output after the forward phase: the caller's from now on.
    [[nodiscard]] at::Tensor expose_outputs() {
        a_.back().expose();
        return a_.back().tensor().detach();
    }
    void set_output_gradients(at::Tensor g) {
        if (!g.defined()) throw InvalidInput("chain step: the gradient of the output is undefined");
        g_.back() = std::move(g);
    }
    /// The output gradients come from autograd, into a custom Function's backward.
    void output_gradients_from_autograd() noexcept { gradients_from_autograd_ = true; }
    [[nodiscard]] StepGradients take_result() noexcept { return std::move(result_); }

private:
    [[nodiscard]] bool input_grad_for(std::size_t l) const noexcept { return l > 1 || input_requires_grad_; }

    [[nodiscard]] static bool shares_memory(const at::Tensor& t, const at::Tensor& input_grad,
                                            const std::vector<at::Tensor>& grads, std::size_t own) {
        const auto* storage = t.storage().unsafeGetStorageImpl();
        const auto same = [&](const at::Tensor& u) { return u.defined() && u.storage().unsafeGetStorageImpl() == storage; };
        if (same(input_grad)) return true;
        for (std::size_t j = 0; j < grads.size(); ++j)
            if (j != own && same(grads[j])) return true;
        return false;
    }

    std::shared_ptr<ExecutorCore<Probe>> core_;
    bool input_requires_grad_ = false;
    c10::Device device_ = c10::Device(c10::DeviceType::CPU);
    OpClock clock_{c10::Device(c10::DeviceType::CPU)};
    std::vector<Activation> a_;
    std::vector<StageGraph> s_;
    std::vector<at::Tensor> g_;
    PendingGradients pending_;
    StepRollback rollback_;
    StepGradients result_;
    bool gradients_from_autograd_ = false;
    HeldOutside held_outside_;
};

}  // namespace detail::executor

/// One training step of a chain in two phases (torch/step.hpp): forward() returns the chain's
/// output, backward(grad) takes the gradient of the loss with respect to it and returns the
/// gradients; errors name the plan step and the stage.
template <MemoryProbe Probe = CpuMemoryProbe>
using ChainStep = PlannedStep<detail::executor::ChainBackend<Probe>, Probe>;

/// The outcome of ChainExecutor::step.
struct StepResult {
    at::Tensor output;
    at::Tensor loss;
    StepReport report;
    std::vector<double> step_seconds;  ///< per plan step, with time_each_op (ChainStep::step_seconds())
};

/// Runs schedules of one profiled chain. Copies share the same stages and probe.
template <MemoryProbe Probe>
class ChainExecutor {
public:
    ChainExecutor(StageList stages, ChainProfile profile, Probe probe = Probe{})
        : core_(std::make_shared<detail::executor::ExecutorCore<Probe>>(std::move(stages), std::move(profile),
                                                                        std::move(probe))),
          engine_(std::make_shared<const Engine>(core_->problem, core_->measured, core_->execution)) {}

    [[nodiscard]] const Chain& chain() const noexcept { return core_->profile.chain; }
    [[nodiscard]] const ChainProfile& profile() const noexcept { return core_->profile; }
    /// The chain's expansion (docs/formats.md §5 (chains)): what solvers plan on.
    [[nodiscard]] const Problem& problem() const noexcept { return core_->problem; }
    /// The same problem with each forward's own measured overhead: what predictions use.
    [[nodiscard]] const Problem& measured_problem() const noexcept { return core_->measured; }
    [[nodiscard]] const StageList& stages() const noexcept { return core_->stages; }
    /// The trainable parameters, each once, in the order StepGradients uses.
    [[nodiscard]] const std::vector<at::Tensor>& parameters() const noexcept { return core_->table.parameters; }
    [[nodiscard]] Probe& probe() const noexcept { return core_->probe; }

    /// Checks a plan against this chain (the simulator must accept it) and prepares it.
    [[nodiscard]] ExecutablePlan prepare(Plan plan) const { return ExecutablePlan(engine_->prepare(std::move(plan))); }
    [[nodiscard]] ExecutablePlan prepare(Schedule schedule) const {
        return prepare(hand_written_plan(std::move(schedule)));
    }

    /// A step to drive by hand (or from an autograd function): forward(), then backward().
    /// `hooks`: what the step does with its parameter gradients besides handing them over
    /// (torch/gradient_hooks.hpp).
    [[nodiscard]] ChainStep<Probe> start(const ExecutablePlan& plan, const at::Tensor& input, bool continuous = true,
                                         std::shared_ptr<const GradientHooks> hooks = nullptr) const {
        check_input(input);
        return ChainStep<Probe>(engine_, plan, detail::executor::ChainBackend<Probe>(core_, input, std::move(hooks)),
                                &core_->probe, continuous);
    }

    /// A whole training step: forward, `loss(output)` (with autograd), backward, and the
    /// gradients added into the parameters' .grad — all or nothing. `time_each_op`: wait for
    /// the device around each op and time it (ChainStep::time_each_op).
    StepResult step(const ExecutablePlan& plan, const at::Tensor& input,
                    const std::function<at::Tensor(const at::Tensor&)>& loss, bool time_each_op = false) const {
        ChainStep<Probe> run = start(plan, input, /*continuous=*/true);
        run.time_each_op(time_each_op);
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
        StepGradients gradients;
        detail::run_backward_phase(input.device(), [&] { gradients = run.backward(std::move(grad)); });
        accumulate_gradients(parameters(), std::move(gradients));
        result.report = run.report();
        result.step_seconds = run.step_seconds();
        return result;
    }

private:
    using Engine = typename ChainStep<Probe>::Engine;

    void check_input(const at::Tensor& input) const {
        const ChainProfile& p = core_->profile;
        if (!matches(p, input))
            throw InvalidInput("chain '" + p.chain.name + "' was profiled for inputs of shape " +
                               detail::sizes_string(p.input_sizes) + " (" + std::string(c10::toString(p.input_dtype)) +
                               " on " + p.input_device.str() + "), not " + detail::sizes_string(input.sizes().vec()) +
                               " (" + std::string(c10::toString(input.scalar_type())) + " on " + input.device().str() +
                               "); profile again for this shape");
    }

    std::shared_ptr<detail::executor::ExecutorCore<Probe>> core_;
    std::shared_ptr<const Engine> engine_;
};

}  // namespace remat::torch
