// remat/torch/graph_executor.hpp — runs any schedule of a captured TorchScript problem on
// real tensors.
//
// The problem is the op-level graph of script.hpp (the model of Checkmate, Jain et al.,
// MLSys 2020, and Rockmate, Zhao et al., ICML 2023); a schedule of it (from StoreAll,
// Checkmate, Rockmate, or written by hand) is executed step by step (docs/design.md §6 (execution engine)):
//   F:G   runs op G's nodes without autograd;   F+:G  runs them on detached leaves of G's
//   inputs, so that G's autograd graph s:G is its own;   B:G  back-propagates that graph
//   alone with the sum of G's incoming gradient contributions, writing one contribution per
//   input and the parameters' gradients;   free X  releases X's storage (every handle stays:
//   the graphs that saved X see the memory a recomputation moves back in), drops a graph, or
//   drops a gradient.
// Random ops recompute with the numbers of their first run; buffers change once per step;
// parameter gradients are handed over once, at the end of the step, so that a failure
// anywhere leaves parameters, gradients and buffers as they were before the step. Through
// forward(), the plan runs inside a custom autograd Function, so `loss.backward()` just works.
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
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../exec/executor.hpp"
#include "detail/runtime.hpp"
#include "detail/step.hpp"
#include "detail/step_capsule.hpp"
#include "executor.hpp"
#include "memory.hpp"
#include "step.hpp"
#include "capture/captured.hpp"
#include "capture/program.hpp"
#include "detail/op_clock.hpp"

namespace remat::torch {

/// The gradients a step produced: of each input (undefined unless it requires grad) and of
/// each trainable parameter, in the order of ScriptCapture::parameters() (undefined for a
/// parameter the step did not reach).
struct ScriptGradients {
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> parameters;
};

namespace detail::capture {

/// Scratch copies of each group's buffers for recomputations (Group::rerun_buffers: those it
/// updates, and those it reads that a later group updates), allocated once per executor so
/// that a step's measured memory does not include them. A recomputation starts from the
/// buffers as the group's first run of the step found them (`before_first_run`, saved only
/// when the plan runs the group more than once): its outputs may read what it updates
/// (spectral norm's power iteration reads u and v after writing them), and starting from the
/// updated values would iterate once more. Its updates are then undone: the values it found
/// (`recompute`) are put back.
struct Scratch {
    std::vector<BufferSnapshot> before_first_run;
    std::vector<BufferSnapshot> recompute;
    explicit Scratch(const std::vector<Group>& groups) {
        for (const Group& g : groups) {
            before_first_run.emplace_back(g.rerun_buffers);
            recompute.emplace_back(g.rerun_buffers);
        }
    }
};

}  // namespace detail::capture

template <MemoryProbe Probe = CpuMemoryProbe>
class ScriptExecutor;

/// A plan checked against a captured problem and ready to run, shareable between steps:
/// plan(), schedule(), predicted_peak(), predicted_time() and simulation().
class ScriptPlan : public ExecutionPlan {
private:
    template <MemoryProbe>
    friend class ScriptExecutor;
    explicit ScriptPlan(ExecutionPlan plan) : ExecutionPlan(std::move(plan)) {}
};

namespace detail::capture {

/// The execution table of a captured problem: one unit per op group.
[[nodiscard]] inline ExecutionTable execution_table(const Core& core) {
    ExecutionTable t;
    t.units = core.groups.size();
    for (const OpEntry& op : core.ops) {
        t.op_role.push_back(op.role == OpRole::forward        ? ExecOpRole::forward
                            : op.role == OpRole::forward_grad ? ExecOpRole::forward_grad
                            : op.role == OpRole::backward     ? ExecOpRole::backward
                                                              : ExecOpRole::loss);
        t.op_unit.push_back(op.role == OpRole::loss ? 0 : op.group);
    }
    for (const DataEntry& d : core.data) {
        t.data_role.push_back(d.role == DataRole::activation ? ExecDataRole::activation
                              : d.role == DataRole::saved    ? ExecDataRole::saved
                              : d.role == DataRole::gradient ? ExecDataRole::gradient
                                                             : ExecDataRole::marker);
        t.data_unit.push_back(d.role == DataRole::activation && d.input ? 0 : (d.group == static_cast<std::size_t>(-1) ? 0 : d.group));
    }
    return t;
}

/// One step of a captured module's tensors, run for the engine (exec/backend.hpp): the
/// activations, each group's autograd graph, the gradient contributions, the parameter
/// gradients collected so far, and the outputs the caller holds.
class ScriptBackend {
public:
    using RngState = detail::RngState;

    ScriptBackend(std::shared_ptr<const Core> core, std::shared_ptr<Scratch> scratch, const std::vector<at::Tensor>& inputs,
                  std::shared_ptr<const GradientHooks> hooks = nullptr)
        : core_(std::move(core)), scratch_(std::move(scratch)), device_(core_->device), clock_(core_->device) {
        const std::size_t n_data = core_->problem.data_count();
        act_.resize(n_data);
        grad_.resize(n_data);
        graph_.resize(core_->groups.size());
        pending_.reset(core_->parameters.size());
        if (hooks) {
            std::vector<std::size_t> units_of(core_->parameters.size(), 0);
            for (const auto& group : core_->groups)
                for (const std::size_t p : group.parameters) ++units_of[p];
            pending_.watch(std::move(hooks), std::move(units_of));
        }
        for (std::size_t i = 0; i < inputs.size(); ++i) act_[core_->inputs[i].data.index].set_external(inputs[i]);
    }
    ScriptBackend(ScriptBackend&&) noexcept = default;
    ScriptBackend& operator=(ScriptBackend&&) noexcept = default;

    [[nodiscard]] RngState capture_rng() const { return RngState::capture(device_); }
    void restore_rng(const RngState& state) const { state.restore(); }
    [[nodiscard]] bool random(std::size_t k) const { return core_->groups[k].random; }

    // DrawsLike (exec/backend.hpp): the group's forward on placeholders shaped like its
    // inputs, without grad and with its buffers put back, draws what its real run draws (the
    // numbers a random op draws depend on shapes, not values).
    void draw_like(std::size_t k) {
        const Group& g = core_->groups[k];
        std::vector<at::Tensor> inputs;
        inputs.reserve(g.input_meta.size());
        for (const TensorMeta& meta : g.input_meta) inputs.push_back(meta.placeholder());
        std::optional<BufferGuard> buffers;
        if (!g.rerun_buffers.empty()) buffers.emplace(scratch_->recompute[k], g.rerun_buffers);
        (void)run_no_grad(*core_, g, inputs);
    }
    [[nodiscard]] std::size_t draw_rank(std::size_t k) const { return core_->groups[k].draw_rank; }

    // KeepsStateForReruns (exec/backend.hpp): before the first of several runs, the buffers
    // the group updates, which its recomputations start from.
    void keep_state_for_reruns(std::size_t k) {
        const Group& g = core_->groups[k];
        if (!g.rerun_buffers.empty()) scratch_->before_first_run[k].save(g.rerun_buffers);
    }

    void forward(std::size_t k, bool with_grad, bool first_run) {
        const Group& g = core_->groups[k];
        std::vector<at::Tensor> inputs;
        inputs.reserve(g.input_data.size());
        for (const DataId d : g.input_data) inputs.push_back(act_[d.index].tensor());
        std::optional<BufferGuard> buffers;
        if (!first_run && !g.rerun_buffers.empty()) {
            buffers.emplace(scratch_->recompute[k], g.rerun_buffers);
            scratch_->before_first_run[k].restore(g.rerun_buffers);
        }
        if (with_grad) {
            GroupGraph graph = run_with_grad(*core_, g, inputs);
            for (std::size_t o = 0; o < g.output_data.size(); ++o)
                act_[g.output_data[o].index].install(graph.outputs[o], /*graph_holds_storage=*/true, g.name);
            graph_[k] = std::move(graph);
        } else {
            const std::vector<at::Tensor> outs = run_no_grad(*core_, g, inputs);
            for (std::size_t o = 0; o < g.output_data.size(); ++o)
                act_[g.output_data[o].index].install(outs[o], /*graph_holds_storage=*/false, g.name);
        }
    }

    void backward(std::size_t k) {
        const Group& g = core_->groups[k];
        if (!graph_[k].live())
            throw ExecutionError("the backward of op '" + g.name + "' found no autograd graph (its saved state was "
                                 "produced without one)");
        std::vector<std::vector<at::Tensor>> incoming(g.outputs.size());
        for (std::size_t o = 0; o < g.outputs.size(); ++o)
            for (const DataId d : g.incoming[o]) incoming[o].push_back(grad_[d.index]);
        std::vector<std::vector<at::Tensor>> seeds(g.seed.size());
        for (std::size_t i = 0; i < g.seed.size(); ++i)
            for (const DataId d : g.seed[i]) seeds[i].push_back(grad_[d.index]);
        BackwardResult r = run_backward(g, graph_[k], incoming, /*retain_graph=*/false, seeds);
        incoming.clear();
        seeds.clear();
        graph_[k].clear();  // consumed; the plan's `free s:G` finds nothing left to drop
        for (std::size_t i = 0; i < g.inputs.size(); ++i)
            if (g.input_grad[i]) grad_[g.input_grad[i]->index] = std::move(r.input_grads[i]);
        const at::NoGradGuard no_grad;
        // run_backward gives every parameter gradient memory of its own.
        for (std::size_t j = 0; j < g.parameters.size(); ++j)
            if (r.parameter_grads[j].defined()) pending_.add_owned(g.parameters[j], std::move(r.parameter_grads[j]));
        pending_.unit_done(g.parameters);
        pending_.recount();
    }

    void release(DataId d) {
        const DataEntry& e = core_->data[d.index];
        switch (e.role) {
            case DataRole::activation:
                if (std::find(exposed_.begin(), exposed_.end(), d.index) != exposed_.end()) {
                    // The caller holds it: forget it (a recomputation produces it afresh), and count
                    // its bytes as the caller's for as long as the caller keeps it.
                    if (act_[d.index].live()) caller_held_.add(act_[d.index].tensor());
                    act_[d.index].clear();
                } else {
                    act_[d.index].release();
                }
                break;
            case DataRole::saved: graph_[e.group].clear(); break;
            case DataRole::gradient:
                if (is_output_gradient(d)) release_output_gradient(grad_[d.index], gradients_from_autograd_, caller_held_);
                else grad_[d.index] = at::Tensor();
                break;
            case DataRole::marker: break;
        }
    }

    [[nodiscard]] Bytes pending_gradient_bytes() const noexcept { return pending_.bytes(); }
    // Bytes of outputs the plan has freed but the caller still holds, and of output gradients
    // that autograd still holds.
    [[nodiscard]] Bytes caller_bytes() const noexcept { return caller_held_.bytes(); }
    void begin_step() { rollback_.save(core_->groups, device_); }
    void commit() {
        const at::NoGradGuard no_grad;
        result_.inputs.clear();
        for (const auto& in : core_->inputs) {
            at::Tensor sum;
            for (const DataId d : in.grads)
                if (grad_[d.index].defined()) sum = sum.defined() ? sum + grad_[d.index] : grad_[d.index];
            result_.inputs.push_back(std::move(sum));
        }
        result_.parameters = pending_.take();
    }
    void rollback(bool generators_too) noexcept { rollback_.undo(core_->groups, generators_too); }
    void clear() noexcept {
        for (auto& g : graph_) g.clear();
        for (auto& a : act_) a.clear();
        for (auto& g : grad_) g = at::Tensor();
        pending_.clear();
        rollback_.clear();
        caller_held_.clear();
    }
    void synchronize() const { detail::synchronize(device_); }
    [[nodiscard]] std::string describe(std::size_t k) const {
        return " (op '" + core_->groups[k].name + "', root node " + core_->groups[k].where + ")";
    }
    [[nodiscard]] static std::string error_text(const std::exception& e) { return error_message(e); }
    [[nodiscard]] double now() const { return clock_.now(); }

    /// The outputs after the forward phase: the caller's from now on.
    [[nodiscard]] std::vector<at::Tensor> expose_outputs() {
        std::vector<at::Tensor> outputs;
        for (const DataId d : core_->output_data) {
            act_[d.index].expose();
            exposed_.push_back(d.index);
            outputs.push_back(act_[d.index].tensor().detach());
        }
        return outputs;
    }
    // The step's hand-over (torch/step.hpp): one gradient per output, undefined ones taken
    // as zeros.
    using OutputGradients = std::vector<at::Tensor>;
    void set_output_gradients(std::vector<at::Tensor> grad_outputs) {
        if (grad_outputs.size() != core_->output_data.size())
            throw InvalidInput("script step: " + std::to_string(grad_outputs.size()) + " output gradients for " +
                               std::to_string(core_->output_data.size()) + " outputs");
        for (std::size_t o = 0; o < grad_outputs.size(); ++o) {
            if (!core_->output_grad[o]) continue;
            const at::Tensor& out = act_[core_->output_data[o].index].tensor();
            at::Tensor g = std::move(grad_outputs[o]);
            if (!g.defined()) {
                g = at::zeros_like(out);
            } else if (g.sizes() != out.sizes()) {
                throw InvalidInput("script step: the gradient of output " + std::to_string(o) + " has shape " +
                                   detail::sizes_string(g.sizes().vec()) + " but the output has " +
                                   detail::sizes_string(out.sizes().vec()));
            } else {
                g = g.contiguous();
            }
            grad_[core_->output_grad[o]->index] = std::move(g);
        }
    }
    /// The output gradients come from autograd, into a custom Function's backward.
    void output_gradients_from_autograd() noexcept { gradients_from_autograd_ = true; }
    [[nodiscard]] ScriptGradients take_result() noexcept { return std::move(result_); }

private:
    // The gradient of one of the outputs, which the caller hands in.
    [[nodiscard]] bool is_output_gradient(DataId d) const {
        return std::any_of(core_->output_grad.begin(), core_->output_grad.end(),
                           [&](const std::optional<DataId>& g) { return g && g->index == d.index; });
    }
    std::shared_ptr<const Core> core_;
    std::shared_ptr<Scratch> scratch_;
    c10::Device device_;
    OpClock clock_;
    std::vector<Activation> act_;
    std::vector<at::Tensor> grad_;
    std::vector<GroupGraph> graph_;
    std::vector<std::size_t> exposed_;
    HeldOutside caller_held_;
    PendingGradients pending_;
    bool gradients_from_autograd_ = false;
    StepRollback rollback_;
    ScriptGradients result_;
};

}  // namespace detail::capture

/// One training step of a captured program in two phases (torch/step.hpp): forward()
/// returns the module's output tensors, backward(grads) takes one gradient per output
/// (undefined ones taken as zeros) and returns the gradients; errors name the plan step, the
/// op and its node.
template <MemoryProbe Probe = CpuMemoryProbe>
using ScriptStep = PlannedStep<detail::capture::ScriptBackend, Probe>;

/// The outcome of ScriptExecutor::step.
struct ScriptStepResult {
    std::vector<at::Tensor> outputs;
    at::Tensor loss;
    std::vector<at::Tensor> input_grads;
    StepReport report;
    std::vector<double> step_seconds;  ///< per plan step, with time_each_op (ScriptStep::step_seconds())
};

namespace detail::capture {

/// The caller's loss of a step's outputs (detached, those that take a gradient made leaves),
/// its value in `value`, and its gradient with respect to each output (undefined where none).
[[nodiscard]] inline std::vector<at::Tensor> caller_loss_gradients(
    const Core& core, const std::vector<at::Tensor>& outputs,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& loss, at::Tensor& value, const std::string& who) {
    const ::torch::autograd::AutoGradMode grad_mode(true);
    std::vector<at::Tensor> leaves, wrt, grads(outputs.size());
    std::vector<std::size_t> index;
    for (std::size_t o = 0; o < outputs.size(); ++o) {
        at::Tensor leaf = outputs[o].detach();
        if (core.output_grad[o]) {
            leaf.requires_grad_(true);
            wrt.push_back(leaf);
            index.push_back(o);
        }
        leaves.push_back(std::move(leaf));
    }
    const at::Tensor result = loss(leaves);
    if (!result.defined() || result.numel() != 1) throw InvalidInput(who + ": the loss function must return a single value");
    std::vector<at::Tensor> g = ::torch::autograd::grad({result}, wrt, {}, false, false, /*allow_unused=*/true);
    for (std::size_t j = 0; j < index.size(); ++j) grads[index[j]] = std::move(g[j]);
    value = result.detach();
    return grads;
}

inline constexpr const char* capsule_key = "remat.script_step";

/// Who a second backward through the same forward is reported as, per step type.
template <class Step>
inline constexpr const char* autograd_owner = "remat planned module";

/// The autograd function around one planned step of a captured program (ScriptStep here;
/// OffloadedScript's step in offload_script.hpp). Inputs and parameters are its inputs, so
/// autograd accumulates the parameters' gradients as for the plain module.
template <class Step>
struct PlannedScript : ::torch::autograd::Function<PlannedScript<Step>> {
    using Handle = StepHandle<Step>;

    static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                    at::TensorList parameters, Handle handle,
                                                    std::vector<char> differentiable) {
        (void)inputs;
        (void)parameters;  // autograd's business; the step already holds them
        ::torch::autograd::variable_list outputs = handle.step->forward();
        for (std::size_t o = 0; o < outputs.size(); ++o)
            if (!differentiable[o]) ctx->mark_non_differentiable({outputs[o]});
        stash_step(ctx, capsule_key, std::move(handle));
        return outputs;
    }

    // `grad_outputs` by reference: on LibTorch 2.x it is autograd's own list (CppNode::apply
    // passes the gradients it moved in), and moving them out leaves the plan the only holder,
    // so that its frees of the outputs' gradients free their memory. LibTorch 1.13's
    // CppNode::apply passes a copy and keeps its own list until this returns: there the
    // outputs' gradients stay allocated through the backward, beyond the prediction.
    static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                     ::torch::autograd::variable_list& grad_outputs) {
        const Handle handle = take_step<Step>(ctx, capsule_key, autograd_owner<Step>);
        ScriptGradients gradients = handle.backward(std::move(grad_outputs));
        ::torch::autograd::variable_list result;
        for (at::Tensor& g : gradients.inputs) result.push_back(std::move(g));
        for (at::Tensor& g : gradients.parameters) result.push_back(std::move(g));
        result.emplace_back();  // the step handle
        result.emplace_back();  // the differentiability flags
        return result;
    }
};

// A forward records a planned step for autograd only with grad mode on and an input or a
// parameter that requires grad; otherwise the module simply runs (run_plainly).
[[nodiscard]] inline bool needs_autograd(const Core& core, const std::vector<at::Tensor>& inputs) {
    if (!::torch::autograd::GradMode::is_enabled()) return false;
    for (const at::Tensor& t : inputs)
        if (t.requires_grad()) return true;
    for (const at::Tensor& p : core.parameters)
        if (p.requires_grad()) return true;
    return false;
}

// The module's own forward, without a plan: its outputs, flattened as the capture's.
[[nodiscard]] inline std::vector<at::Tensor> run_plainly(const ScriptCapture& capture,
                                                         const std::vector<at::Tensor>& inputs) {
    const Core& core = *capture.core();
    const c10::IValue value = ::torch::jit::Module(core.module).forward(capture.arguments(inputs));
    std::vector<at::Tensor> outputs(core.output_data.size());
    flatten(core.output_tree, value, outputs, "the module's result");
    return outputs;
}

// PlannedScript's flags: which outputs have a gradient.
[[nodiscard]] inline std::vector<char> differentiable_outputs(const Core& core) {
    std::vector<char> differentiable;
    for (const auto& d : core.output_grad) differentiable.push_back(d.has_value() ? 1 : 0);
    return differentiable;
}

}  // namespace detail::capture

/// Runs schedules of one captured module. Copies share the capture and the probe.
template <MemoryProbe Probe>
class ScriptExecutor {
public:
    explicit ScriptExecutor(ScriptCapture capture, Probe probe = Probe{})
        : capture_(std::move(capture)),
          probe_(std::make_shared<Probe>(std::move(probe))),
          scratch_(std::make_shared<detail::capture::Scratch>(capture_.core()->groups)),
          engine_(std::make_shared<const Engine>(capture_.problem(), capture_.problem(),
                                                 detail::capture::execution_table(*capture_.core()))) {}

    [[nodiscard]] const ScriptCapture& capture() const noexcept { return capture_; }
    [[nodiscard]] const Problem& problem() const noexcept { return capture_.problem(); }
    /// The trainable parameters, each once, in the order ScriptGradients uses.
    [[nodiscard]] const std::vector<at::Tensor>& parameters() const noexcept { return capture_.parameters(); }
    [[nodiscard]] Probe& probe() const noexcept { return *probe_; }

    /// Checks a plan against the captured problem (the simulator must accept it) and prepares it.
    [[nodiscard]] ScriptPlan prepare(Plan plan) const { return ScriptPlan(engine_->prepare(std::move(plan))); }
    [[nodiscard]] ScriptPlan prepare(Schedule schedule) const {
        return prepare(hand_written_plan(std::move(schedule)));
    }

    /// A step to drive by hand: forward(), then backward().
    /// `hooks`: what the step does with its parameter gradients besides handing them over
    /// (torch/gradient_hooks.hpp).
    [[nodiscard]] ScriptStep<Probe> start(const ScriptPlan& plan, const std::vector<at::Tensor>& inputs,
                                          bool continuous = true,
                                          std::shared_ptr<const GradientHooks> hooks = nullptr) const {
        check_inputs(*capture_.core(), inputs);
        return ScriptStep<Probe>(engine_, plan,
                                 detail::capture::ScriptBackend(capture_.core(), scratch_, inputs, std::move(hooks)),
                                 probe_.get(), continuous);
    }

    /// A whole training step: forward, `loss(outputs)` (with autograd), backward, and the
    /// parameters' gradients added into their .grad — all or nothing. `time_each_op`: wait
    /// for the device around each op and time it (ScriptStep::time_each_op).
    ScriptStepResult step(const ScriptPlan& plan, const std::vector<at::Tensor>& inputs,
                          const std::function<at::Tensor(const std::vector<at::Tensor>&)>& loss,
                          bool time_each_op = false) const {
        // Not continuous: the backward phase is measured from its own start, so that the loss
        // value and whatever else the loss function keeps count as the caller's.
        ScriptStep<Probe> run = start(plan, inputs, /*continuous=*/false);
        run.time_each_op(time_each_op);
        ScriptStepResult result;
        result.outputs = run.forward();
        std::vector<at::Tensor> grads;
        try {
            grads = detail::capture::caller_loss_gradients(*capture_.core(), result.outputs, loss, result.loss,
                                                           "ScriptExecutor::step");
        } catch (...) {
            run.abort();
            throw;
        }
        ScriptGradients gradients;
        detail::run_backward_phase(capture_.core()->device, [&] { gradients = run.backward(std::move(grads)); });
        StepGradients to_accumulate;
        to_accumulate.parameters = std::move(gradients.parameters);
        accumulate_gradients(parameters(), std::move(to_accumulate));
        result.input_grads = std::move(gradients.inputs);
        result.report = run.report();
        result.step_seconds = run.step_seconds();
        return result;
    }

    /// The module's forward under the plan, inside a custom autograd Function: back-propagating
    /// through the returned tensors (`loss.backward()`) runs the rest of the plan and
    /// accumulates the parameters' (and inputs') gradients as plain autograd would. Without
    /// grad mode, this simply runs the module. `report`, when given, receives the step's
    /// report after its backward.
    [[nodiscard]] std::vector<at::Tensor> forward(const ScriptPlan& plan, const std::vector<at::Tensor>& inputs,
                                                  std::shared_ptr<StepReport> report = nullptr,
                                                  std::shared_ptr<const GradientHooks> hooks = nullptr) const {
        const auto& core = *capture_.core();
        if (!detail::capture::needs_autograd(core, inputs)) return detail::capture::run_plainly(capture_, inputs);
        detail::StepHandle<ScriptStep<Probe>> handle{
            std::make_shared<ScriptStep<Probe>>(start(plan, inputs, /*continuous=*/false, std::move(hooks))),
            std::move(report)};
        return detail::capture::PlannedScript<ScriptStep<Probe>>::apply(
            at::TensorList(inputs), at::TensorList(core.parameters), std::move(handle),
            detail::capture::differentiable_outputs(core));
    }

private:
    using Engine = typename ScriptStep<Probe>::Engine;

    void check_inputs(const detail::capture::Core& c, const std::vector<at::Tensor>& inputs) const {
        if (!capture_.matches(inputs)) {
            std::string expected, got;
            for (const auto& in : c.inputs)
                expected += (expected.empty() ? "" : ", ") + detail::sizes_string(in.sizes) + " " +
                            std::string(c10::toString(in.dtype)) + " on " + in.device.str();
            for (const at::Tensor& t : inputs)
                got += (got.empty() ? "" : ", ") +
                       (t.defined() ? detail::sizes_string(t.sizes().vec()) + " " + std::string(c10::toString(t.scalar_type())) +
                                          " on " + t.device().str()
                                    : std::string("undefined"));
            throw InvalidInput("'" + c.name + "' was captured for inputs (" + expected + "), not (" + got +
                               "); capture again for these inputs");
        }
        for (std::size_t i = 0; i < inputs.size(); ++i)
            if (inputs[i].requires_grad() != c.inputs[i].requires_grad)
                throw InvalidInput("input " + std::to_string(i) + " of '" + c.name + "' " +
                                   (inputs[i].requires_grad() ? "requires" : "does not require") +
                                   " grad but was captured the other way; capture again with such an input");
        if (c.module.is_training() != c.training)
            throw InvalidInput("'" + c.name + "' was captured in " + (c.training ? "training" : "evaluation") +
                               " mode but the module is now in " + (c.training ? "evaluation" : "training") +
                               " mode; capture again after train()/eval()");
    }


    ScriptCapture capture_;
    std::shared_ptr<Probe> probe_;
    std::shared_ptr<detail::capture::Scratch> scratch_;
    std::shared_ptr<const Engine> engine_;
};

}  // namespace remat::torch
