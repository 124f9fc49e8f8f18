// remat/torch/offload_script.hpp — a captured module (TorchScript, or a torch.export program)
// trained by an offloading plan: the graph executor's ops (graph_executor.hpp) run through
// the offloading engine (exec/offload_step.hpp) while the parameters move between the device
// and host memory (docs/formats.md §11, docs/design.md §4.12).
//
// script_training_problem() adds the module's parameters to its captured problem
// (offload::training_problem with WeightUse): a trainable parameter that one op group alone
// reads, and that owns its storage, becomes the offloadable data `w:<name>`, read by that
// group's forwards and backward, with its gradient `gw:<name>` written by the backward and
// handed to the caller at the end of the step (TrainingStateOptions::gradients_to_caller).
// A parameter that several groups read stays on the device, outside the problem, with its
// gradient (its contributions are summed in place: it cannot be in two places at once).
//
// OffloadedScript plans (the combined planner, offload/combined.hpp) within one budget for
// everything the step holds, and runs whole steps: forward, the caller's loss, backward, the
// gradients added into .grad, all or nothing. Parameters keep their identity (their storage's
// memory leaves and comes back), so the caller's optimizer steps after each step as usual.
// Its drop-in form, forward(), runs the plan's forward inside a custom autograd Function:
//     auto outputs = off.forward(plan, {x});
//     auto loss = criterion(outputs[0], y); loss.backward(); optimizer.step();
// the backward runs the rest of the plan, and autograd accumulates the gradients.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../exec/backend_compute.hpp"
#include "../exec/offload_step.hpp"
#include "../exec/transfer.hpp"
#include "../io/budget.hpp"
#include "../offload/combined.hpp"
#include "../offload/training_state.hpp"
#include "../solvers/store_all.hpp"
#include "capture/captured.hpp"
#include "detail/runtime.hpp"
#include "detail/step_capsule.hpp"
#include "executor.hpp"
#include "graph_executor.hpp"
#include "memory.hpp"
#include "offload.hpp"
#include "planned_module.hpp"

namespace remat::torch {

/// A captured module's training problem: the captured problem with its offloadable
/// parameters added (see the header).
struct ScriptTrainingProblem {
    Problem problem;
    /// Per weight of the problem (`w:<name>`, in order): its index in capture.parameters().
    std::vector<std::size_t> weights;
    /// Trainable parameters left on the device outside the problem (indices into
    /// capture.parameters()), and why: "read by 3 op groups", "a view of another tensor".
    std::vector<std::size_t> resident;
    std::vector<std::string> resident_reasons;
};

/// See the header. `transfers`: the problem's bandwidths and host limit.
[[nodiscard]] inline ScriptTrainingProblem script_training_problem(const ScriptCapture& capture,
                                                                   TransferSettings transfers = {}) {
    const detail::capture::Core& core = *capture.core();
    std::vector<std::vector<std::size_t>> readers(core.parameters.size());
    for (std::size_t k = 0; k < core.groups.size(); ++k)
        for (const std::size_t p : core.groups[k].parameters) readers[p].push_back(k);
    ScriptTrainingProblem out{ProblemBuilder("unbuilt").build(), {}, {}, {}};
    std::vector<remat::offload::WeightUse> weights;
    for (std::size_t p = 0; p < core.parameters.size(); ++p) {
        const at::Tensor& t = core.parameters[p];
        std::string reason;
        if (readers[p].size() != 1)
            reason = "read by " + std::to_string(readers[p].size()) + " op groups";
        else if (!core.groups[readers[p][0]].has_backward)
            reason = "read by an op group without backward";
        else if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes())
            reason = "does not own its whole storage (a view or a slice of another tensor)";
        else if (t.nbytes() == 0)
            reason = "has no elements";
        if (!reason.empty()) {
            out.resident.push_back(p);
            out.resident_reasons.push_back(core.parameter_names[p] + ": " + reason);
            continue;
        }
        const detail::capture::Group& g = core.groups[readers[p][0]];
        weights.push_back({core.parameter_names[p], static_cast<Bytes>(t.nbytes()), {*g.fwd, *g.fwd_grad, *g.bwd}, *g.bwd});
        out.weights.push_back(p);
    }
    remat::offload::TrainingStateOptions options;
    options.transfers = transfers;
    options.gradients_to_caller = true;
    // Capture measured each backward with its parameter gradients (graph_executor.hpp): they
    // are data of the training problem now.
    options.backward_overhead_includes_gradients = true;
    out.problem = remat::offload::training_problem(capture.problem(), weights, options);
    return out;
}

/// Where the weights of a captured module's training problem live on the device (DeviceStore):
/// each `w:<name>` is its parameter's storage, which keeps its identity while its memory
/// leaves and comes back. Each CPU weight's memory is moved into the allocator installed at
/// construction (a memory probe's), so that its departures and returns are both measured.
class ScriptParameterStore {
public:
    ScriptParameterStore(const ScriptCapture& capture, const ScriptTrainingProblem& training) {
        tensors_.resize(training.problem.data_count());
        for (const std::size_t p : training.weights) {
            const std::string name = "w:" + capture.parameter_names()[p];
            const auto d = training.problem.find_data(name);
            if (!d) throw InvalidInput("ScriptParameterStore: the training problem has no data '" + name + "'");
            tensors_[d->index] = capture.parameters()[p];
            detail::offload::adopt_memory(tensors_[d->index]);
        }
    }
    [[nodiscard]] std::vector<std::span<std::byte>> device_bytes(DataId d) {
        const at::Tensor& t = tensor(d);
        if (t.storage().nbytes() == 0) return {};
        return {std::span<std::byte>(static_cast<std::byte*>(t.data_ptr()), t.nbytes())};
    }
    void make_device_copy(DataId d) { detail::offload::allocate_memory(tensor(d), tensor(d).nbytes()); }
    void drop_device_copy(DataId d) { detail::release_memory(tensor(d)); }

private:
    [[nodiscard]] const at::Tensor& tensor(DataId d) const {
        if (d.index >= tensors_.size() || !tensors_[d.index].defined())
            throw InvalidInput("ScriptParameterStore: data #" + std::to_string(d.index) + " is not a parameter");
        return tensors_[d.index];
    }
    std::vector<at::Tensor> tensors_;  // by data of the training problem
};

static_assert(DeviceStore<ScriptParameterStore>);

/// The outcome of OffloadedScript::step.
struct ScriptOffloadStepResult {
    std::vector<at::Tensor> outputs;
    at::Tensor loss;
    std::vector<at::Tensor> input_grads;
    OffloadStepReport report;
    std::size_t forward_runs = 0;
};

/// What OffloadedScript plans with.
struct ScriptOffloadOptions {
    /// Bandwidths and host limit (12 GB/s each way by default).
    TransferSettings transfers{};
    remat::offload::GreedyVariant variant = remat::offload::GreedyVariant::repeated;
    std::size_t activation_budgets = 12;
    /// The caller's optimizer state per byte of trainable parameter (0 for SGD, 1 with
    /// momentum, 2 for Adam): on the device, outside the plan, counted in total budgets.
    double optimizer_state_per_parameter = 2.0;
};

namespace detail::offload_script {

/// One step of OffloadedScript: the captured program's compute and the offloading engine over
/// it, from the forward to the backward (step() runs both; the drop-in form runs them in the
/// autograd calls of detail::capture::PlannedScript, graph_executor.hpp, as a ScriptStep's). A
/// step that fails is rolled back; one dropped before its backward (its outputs and graph
/// freed, or the next forward) gives itself up, so that the weights come back to the device.
template <class Transfers, class Probe>
class ScriptOffloadStep {
public:
    using Compute = BackendCompute<capture::ScriptBackend>;
    using Engine = OffloadStep<Compute, Transfers, Probe>;

    ScriptOffloadStep(const Problem& training, const ScriptCapture& capture, std::shared_ptr<const ExecutionTable> table,
                      const remat::offload::OffloadSchedule& schedule, std::shared_ptr<capture::Scratch> scratch,
                      const std::vector<at::Tensor>& inputs, Transfers& transfers, Probe& probe)
        : table_(std::move(table)),
          compute_(std::make_unique<Compute>(training, capture.problem(), *table_, schedule,
                                             capture::ScriptBackend(capture.core(), std::move(scratch), inputs))),
          engine_(std::make_unique<Engine>(training, schedule, *compute_, transfers, probe)) {}
    ScriptOffloadStep(const ScriptOffloadStep&) = delete;
    ScriptOffloadStep& operator=(const ScriptOffloadStep&) = delete;
    ~ScriptOffloadStep() { abandon(); }

    /// The plan's steps before the loss; the outputs, the caller's from now on.
    [[nodiscard]] std::vector<at::Tensor> forward() {
        engine_->forward();  // a failure has rolled the step back
        try {
            compute_->end_forward();
            return compute_->backend().expose_outputs();
        } catch (...) {
            abort();
            throw;
        }
    }

    /// The rest of the step from the outputs' gradients: the inputs' and parameters' gradients.
    [[nodiscard]] ScriptGradients backward(std::vector<at::Tensor> output_gradients, bool from_autograd) {
        if (engine_->abandoned_or_failed())
            throw ExecutionError("OffloadedScript: this step was given up before its backward (forward() was called "
                                 "again in between); one step at a time: run the backward of each forward before the "
                                 "next forward");
        try {
            compute_->backend().set_output_gradients(std::move(output_gradients));
            if (from_autograd) compute_->backend().output_gradients_from_autograd();
        } catch (...) {
            abort();
            throw;
        }
        engine_->backward_after_caller_loss();  // a failure has rolled the step back
        ScriptGradients gradients;
        try {
            compute_->finish();
            gradients = compute_->backend().take_result();
        } catch (...) {
            compute_->abort_step();
            throw;
        }
        compute_->backend().clear();
        return gradients;
    }

    /// Puts the weights back where the step found them, if it is still under way, and drops
    /// what the step holds (as after a plain forward, its random draws and running statistics
    /// stay).
    void abandon() noexcept {
        if (engine_->completed() || engine_->abandoned_or_failed()) return;
        engine_->abandon();
        compute_->backend().clear();
    }

    /// A failure between the forward and the backward (the caller's loss, say): the weights go
    /// back, and parameters, buffers and the generators are as before the step.
    void abort() noexcept {
        engine_->abandon();
        compute_->abort_step();
    }

    [[nodiscard]] const OffloadStepReport& report() const noexcept { return engine_->report(); }
    /// Forward runs of the step so far (recomputations included).
    [[nodiscard]] std::size_t forward_runs() const noexcept { return compute_->forward_runs(); }

private:
    std::shared_ptr<const ExecutionTable> table_;  // the compute's, kept alive with it
    std::unique_ptr<Compute> compute_;
    std::unique_ptr<Engine> engine_;  // after compute_, which it drives
};

}  // namespace detail::offload_script

namespace detail::capture {
template <class Transfers, class Probe>
inline constexpr const char* autograd_owner<offload_script::ScriptOffloadStep<Transfers, Probe>> = "OffloadedScript";
}  // namespace detail::capture

/// A captured module trained by offloading plans; see the header. One step at a time; the
/// object must outlive nothing but its own steps (step() runs a whole one).
template <class Transfers = CpuTransfers<ScriptParameterStore>, MemoryProbe Probe = CpuMemoryProbe>
class OffloadedScript {
public:
    using Step = detail::offload_script::ScriptOffloadStep<Transfers, Probe>;

    OffloadedScript(ScriptCapture capture, ScriptOffloadOptions options = {}, Probe probe = Probe{})
        : capture_(std::move(capture)),
          options_(options),
          probe_(std::move(probe)),
          training_(std::make_unique<ScriptTrainingProblem>(script_training_problem(capture_, options_.transfers))),
          table_(std::make_shared<const ExecutionTable>(detail::capture::execution_table(*capture_.core()))),
          scratch_(std::make_shared<detail::capture::Scratch>(capture_.core()->groups)),
          store_(std::make_unique<ScriptParameterStore>(capture_, *training_)) {
        if constexpr (std::is_constructible_v<Transfers, ScriptParameterStore&, const Problem&, c10::Device>)
            transfers_ = std::make_unique<Transfers>(*store_, training_->problem, capture_.core()->device);
        else
            transfers_ = std::make_unique<Transfers>(*store_, training_->problem);
        resident_ = outside_the_problem();
        store_all_total_ = store_all_reference(training_->problem).peak + resident_;
    }
    // A step under way refers to this object (its transfers, probe and store).
    OffloadedScript(const OffloadedScript&) = delete;
    OffloadedScript& operator=(const OffloadedScript&) = delete;
    ~OffloadedScript() {
        if (auto pending = pending_.lock()) pending->abandon();
    }

    [[nodiscard]] const ScriptCapture& capture() const noexcept { return capture_; }
    /// The training problem the plans run on.
    [[nodiscard]] const Problem& problem() const noexcept { return training_->problem; }
    [[nodiscard]] const ScriptTrainingProblem& training() const noexcept { return *training_; }
    /// What the step holds on the device outside the problem: buffers, frozen parameters,
    /// the parameters left resident with their gradients, and the caller's optimizer state.
    [[nodiscard]] Bytes resident_bytes() const noexcept { return resident_; }
    /// Store-all with every weight on the device, plus the resident bytes: everything the
    /// step holds at its peak without a plan.
    [[nodiscard]] Bytes store_all_total() const noexcept { return store_all_total_; }
    [[nodiscard]] Probe& probe() noexcept { return probe_; }

    /// Plans rematerialization and weight offloading together within `budget` for everything
    /// the step holds (bytes, or a percentage of store_all_total()), weights on the device
    /// between steps. Throws Infeasible, saying whether the budget is below the proven lower
    /// bound or only beyond the planner.
    template <Solver S>
    [[nodiscard]] remat::offload::OffloadPlan plan(const BudgetSpec& budget, const S& solver) const {
        const Problem& p = training_->problem;
        const std::string who = "OffloadedScript '" + p.name() + "'";
        remat::offload::CombinedOptions combined{options_.variant, options_.activation_budgets, options_.transfers};
        combined.between_steps = false;
        return remat::offload::plan_within_total(p, remat::offload::total_budget(budget, store_all_total_, who), resident_,
                                                 store_all_total_, solver, combined, who,
                                                 "buffers, tied weights, optimizer state");
    }

    /// A whole training step under `plan`: forward, `loss(outputs)` (with autograd), backward,
    /// and the parameters' gradients added into their .grad, every weight back on the device
    /// — all or nothing: a failure leaves parameters, gradients, buffers and the generators as
    /// they were.
    ScriptOffloadStepResult step(const remat::offload::OffloadPlan& plan, const std::vector<at::Tensor>& inputs,
                                 const std::function<at::Tensor(const std::vector<at::Tensor>&)>& loss) {
        check_inputs(inputs);
        if (auto pending = pending_.lock()) pending->abandon();  // one step at a time; its weights come back
        Step run(training_->problem, capture_, table_, plan.schedule, scratch_, inputs, *transfers_, probe_);
        ScriptOffloadStepResult result;
        result.outputs = run.forward();
        std::vector<at::Tensor> grads;
        try {
            grads = detail::capture::caller_loss_gradients(*capture_.core(), result.outputs, loss, result.loss,
                                                           "OffloadedScript::step");
        } catch (...) {
            run.abort();
            throw;
        }
        ScriptGradients gradients = run.backward(std::move(grads), /*from_autograd=*/false);
        StepGradients to_accumulate;
        to_accumulate.parameters = std::move(gradients.parameters);
        accumulate_gradients(capture_.parameters(), std::move(to_accumulate));
        result.input_grads = std::move(gradients.inputs);
        result.report = run.report();
        result.forward_runs = run.forward_runs();
        return result;
    }

    /// The drop-in form: the module's forward under `plan` inside a custom autograd Function.
    /// Back-propagating through the outputs (`loss.backward()`) runs the rest of the plan,
    /// brings every weight back to the device and lets autograd accumulate the parameters'
    /// (and inputs') gradients as plain autograd would; the optimizer then steps as usual.
    /// One step at a time: a forward (or step()) while another step waits for its backward
    /// gives that step up (its weights come back; its backward then throws). Without grad mode
    /// this simply runs the module. last_report() has the step's report after its backward.
    [[nodiscard]] std::vector<at::Tensor> forward(const remat::offload::OffloadPlan& plan,
                                                  const std::vector<at::Tensor>& inputs) {
        if (auto pending = pending_.lock()) pending->abandon();
        check_inputs(inputs);
        const detail::capture::Core& core = *capture_.core();
        if (!detail::capture::needs_autograd(core, inputs)) return detail::capture::run_plainly(capture_, inputs);
        auto step = std::make_shared<Step>(training_->problem, capture_, table_, plan.schedule, scratch_, inputs,
                                           *transfers_, probe_);
        pending_ = step;
        return detail::capture::PlannedScript<Step>::apply(
            at::TensorList(inputs), at::TensorList(core.parameters), detail::StepHandle<Step>{std::move(step), last_report_},
            detail::capture::differentiable_outputs(core));
    }

    /// What the last step of the drop-in form measured against what the simulator predicted.
    [[nodiscard]] const OffloadStepReport& last_report() const noexcept { return *last_report_; }

private:
    [[nodiscard]] Bytes outside_the_problem() const {
        const detail::capture::Core& core = *capture_.core();
        std::vector<at::Tensor> parameters, buffers;
        for (const auto& p : core.module.parameters(/*recurse=*/true)) parameters.push_back(p);
        for (const auto& b : core.module.buffers(/*recurse=*/true)) buffers.push_back(b);
        Bytes modeled = 0;
        for (const std::size_t p : training_->weights) modeled += static_cast<Bytes>(capture_.parameters()[p].nbytes());
        // The modeled weights and their gradients are the problem's.
        return resident_training_bytes(parameters, buffers, options_.optimizer_state_per_parameter) - 2 * modeled;
    }

    void check_inputs(const std::vector<at::Tensor>& inputs) const {
        if (!capture_.matches(inputs))
            throw InvalidInput("OffloadedScript '" + training_->problem.name() +
                               "': the inputs differ in number, shape, dtype or device from the captured ones; capture "
                               "again for these inputs");
        const auto& core = *capture_.core();
        for (std::size_t i = 0; i < inputs.size(); ++i)
            if (inputs[i].requires_grad() != core.inputs[i].requires_grad)
                throw InvalidInput("OffloadedScript: input " + std::to_string(i) + " " +
                                   (inputs[i].requires_grad() ? "requires" : "does not require") +
                                   " grad but was captured the other way; capture again with such an input");
        if (core.module.is_training() != core.training)
            throw InvalidInput("OffloadedScript: the module changed between training and evaluation mode since capture; "
                               "capture again");
    }

    ScriptCapture capture_;
    ScriptOffloadOptions options_;
    Probe probe_;
    std::unique_ptr<ScriptTrainingProblem> training_;
    std::shared_ptr<const ExecutionTable> table_;
    std::shared_ptr<detail::capture::Scratch> scratch_;
    std::unique_ptr<ScriptParameterStore> store_;
    std::unique_ptr<Transfers> transfers_;
    Bytes resident_ = 0;
    Bytes store_all_total_ = 0;
    std::shared_ptr<OffloadStepReport> last_report_ = std::make_shared<OffloadStepReport>();
    std::weak_ptr<Step> pending_;
};

}  // namespace remat::torch
