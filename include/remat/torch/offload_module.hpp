// remat/torch/offload_module.hpp — the drop-in module with weight offloading: a chain model (a
// torch::nn::Sequential or functor stages) trained inside one device budget for everything the
// step holds, with rematerialization and weight offloading planned together
// (offload/combined.hpp: Rotor, or any remat::Solver, iterated with Greedy* weight offloading,
// after Beaumont, Eyraud-Dubois, Shilova, Zhao, "Weight Offloading Strategies for Training
// Large DNN Models", 2022) and run by the offloading engine (exec/offload_step.hpp) through a
// transfer backend (remat::CpuTransfers on the CPU, remat::torch::CudaTransfers on a GPU). So that
//     auto loss = criterion(m->forward(x), y); loss.backward(); optimizer.step();
// is unchanged: the optimizer's parameters are the model's own tensors, on the device whenever
// the caller sees them.
//
// How it differs from OffloadedChain driven by hand (torch/offload.hpp), which runs the loss
// and SGD inside the plan and may keep weights and momentum on the host between steps: here
// the caller computes the loss and steps its optimizer after the backward, on the device. So
// the weights leave the device only inside the step (between their forward and their backward,
// and around recomputations; remat::offload::CombinedOptions::between_steps is off), every gradient is
// handed over when the step ends (remat::offload::TrainingStateOptions::gradients_to_caller), and the
// caller's optimizer state stays on the device, counted in the budget
// (OffloadModuleOptions::optimizer_state_per_parameter).
//
// The budget counts everything the step holds on the device: parameters, their gradients,
// activations, buffers and the caller's optimizer state (budget_bytes(n), or budget_percent(p)
// of store-all's total). One step at a time: a forward() while another step waits for its
// backward gives that step up (its weights come back; its backward then throws). A step that
// fails leaves parameters, gradients, buffers and the random generators as they were.
// Inputs must have the sample's shape, dtype and device (build another module for another
// shape), and their gradient is not taken.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "../core/errors.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../exec/offload_step.hpp"
#include "../exec/transfer.hpp"
#include "../io/budget.hpp"
#include "../offload/combined.hpp"
#include "../solvers/rotor.hpp"
#include "detail/step_capsule.hpp"
#include "memory.hpp"
#include "module.hpp"
#include "offload.hpp"
#include "profile.hpp"

namespace remat::torch {

struct OffloadModuleOptions {
    ProfileOptions profile;
    /// The host limit and the bandwidths the plan assumes (bench_offload_torch measures them).
    TransferSettings transfers{std::nullopt, 12e9, 12e9};
    remat::offload::GreedyVariant variant = remat::offload::GreedyVariant::repeated;
    /// Activation budgets the combined planner tries (remat::offload::CombinedOptions).
    std::size_t activation_budgets = 12;
    /// The caller's optimizer state in bytes per byte of trainable parameter (0 for plain SGD,
    /// 1 with momentum, 2 for Adam): it stays on the device and counts in the budget.
    double optimizer_state_per_parameter = 0.0;
    /// Fuse stages that return views of their input into a neighbour (fuse_aliasing_stages).
    bool fuse_aliasing = true;
    /// Receives one line per phase (profiling, planning with its summary).
    ProgressCallback progress;
};

namespace detail::offload_module {

inline constexpr const char* capsule_key = "remat.offload_step";

/// One training step of the module: the offloading engine over the module's chain and
/// copies, from the forward to the backward autograd calls. A step dropped before its backward
/// (its output and graph freed, or the module's next forward) gives itself up, so that the
/// weights come back to the device.
template <class Transfers, class Probe>
class ModuleStep {
public:
    using Engine = OffloadStep<OffloadedChain, Transfers, Probe>;

    ModuleStep(const Problem& problem, const remat::offload::OffloadSchedule& schedule, OffloadedChain& chain,
               Transfers& copies, Probe& probe)
        : chain_(&chain), engine_(problem, schedule, chain, copies, probe) {}
    ModuleStep(const ModuleStep&) = delete;
    ModuleStep& operator=(const ModuleStep&) = delete;
    ~ModuleStep() { abandon(); }

    [[nodiscard]] at::Tensor forward() {
        try {
            engine_.forward();
        } catch (...) {
            chain_->end_step();  // the engine rolled the data and the model back
            throw;
        }
        return chain_->expose_output();
    }

    /// The rest of the step, from the output's gradient: the parameters' gradients, in the
    /// order of the chain's trainable parameters.
    [[nodiscard]] std::vector<at::Tensor> backward(at::Tensor output_gradient, bool from_autograd) {
        if (engine_.abandoned_or_failed())
            throw ExecutionError("offloading module: this step was given up before its backward (forward() was called "
                                 "again, or the module ran without autograd, in between); one step at a time: run the "
                                 "backward of each forward before the next forward");
        chain_->set_output_gradient(std::move(output_gradient), from_autograd);
        try {
            engine_.backward_after_caller_loss();
        } catch (...) {
            chain_->end_step();
            throw;
        }
        std::vector<at::Tensor> gradients = chain_->take_gradients();
        chain_->end_step();
        return gradients;
    }

    /// Puts the weights back where the step found them, if it is still under way.
    void abandon() noexcept {
        if (engine_.completed() || engine_.abandoned_or_failed()) return;
        engine_.abandon();
        chain_->end_step();
    }

    [[nodiscard]] const OffloadStepReport& report() const noexcept { return engine_.report(); }

private:
    OffloadedChain* chain_;
    Engine engine_;
};

/// The autograd function around one step; the parameters are inputs, so that autograd
/// accumulates their gradients as for the plain model.
template <class Step>
struct OffloadedForward : ::torch::autograd::Function<OffloadedForward<Step>> {
    static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                              at::TensorList parameters, StepHandle<Step> handle) {
        (void)input;
        (void)parameters;  // inputs for autograd's sake; the chain knows them
        at::Tensor output = handle.step->forward();
        stash_step(ctx, capsule_key, std::move(handle));
        return output;
    }

    // `grad_outputs` by reference: moving the output's gradient out of autograd's list (2.x)
    // leaves the plan its only holder, so that the plan's free of it frees its memory.
    static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                     ::torch::autograd::variable_list& grad_outputs) {
        const StepHandle<Step> handle = take_step<Step>(ctx, capsule_key, "remat offloading module");
        std::vector<at::Tensor> gradients = handle.backward(std::move(grad_outputs.at(0)));
        ::torch::autograd::variable_list result;
        result.reserve(gradients.size() + 2);
        result.emplace_back();  // the input's gradient is not taken
        for (at::Tensor& g : gradients) result.push_back(std::move(g));
        result.emplace_back();  // the step handle is not a tensor
        return result;
    }
};

}  // namespace detail::offload_module

template <Solver S = Rotor, class Transfers = CpuTransfers<OffloadedChain>, MemoryProbe Probe = CpuMemoryProbe>
class OffloadCheckpointedImpl : public ::torch::nn::Module {
public:
    using Step = detail::offload_module::ModuleStep<Transfers, Probe>;

    /// Profiles the stages on `sample`, and plans rematerialization and weight offloading
    /// together within `budget` (everything the step holds on the device; see the header).
    /// Throws Infeasible (saying whether the budget is below a proven bound or only beyond
    /// the planner) when no plan fits.
    OffloadCheckpointedImpl(StageList stages, const at::Tensor& sample, BudgetSpec budget, S solver = S{},
                            OffloadModuleOptions options = {}, Probe probe = Probe{})
        : ::torch::nn::Module("remat::torch::OffloadCheckpointed"),
          solver_(std::move(solver)),
          options_(std::move(options)),
          probe_(std::move(probe)),
          stages_(attach(std::move(stages), sample)),
          profile_(profile_chain(stages_, sample, profile_options(), probe_)),
          problems_(caller_optimizer_problems(stages_, profile_, sample, options_.transfers, probe_)),
          plan_(make_plan(budget)),
          last_report_(std::make_shared<OffloadStepReport>()) {
        chain_.emplace(stages_, problems_.predicting, sample);
        if constexpr (std::is_constructible_v<Transfers, OffloadedChain&, const Problem&, c10::Device>)
            transfers_.emplace(*chain_, problems_.predicting, sample.device());
        else
            transfers_.emplace(*chain_, problems_.predicting);
        for (const auto& of_stage : chain_->stage_parameters())
            trainable_.insert(trainable_.end(), of_stage.begin(), of_stage.end());
    }

    OffloadCheckpointedImpl(const ::torch::nn::Sequential& model, const at::Tensor& sample, BudgetSpec budget,
                            S solver = S{}, OffloadModuleOptions options = {}, Probe probe = Probe{})
        : OffloadCheckpointedImpl(stages_of(model), sample, budget, std::move(solver), std::move(options),
                                  std::move(probe)) {}

    ~OffloadCheckpointedImpl() override {
        if (auto pending = pending_.lock()) pending->abandon();
    }

    /// The model's forward under the plan; loss.backward() runs the rest of the plan.
    at::Tensor forward(const at::Tensor& input) {
        if (auto pending = pending_.lock()) pending->abandon();  // one step at a time; its weights come back
        if (!needs_autograd()) {
            at::Tensor x = input;
            for (const ChainStage& s : stages_) x = s.forward(x);
            return x;
        }
        if (input.requires_grad())
            throw InvalidInput("offloading module: the input requires grad; the module does not take the input's "
                               "gradient (detach it, or use remat::torch::checkpoint)");
        if (!matches(profile_, input))
            throw InvalidInput("offloading module: planned for inputs of shape " + detail::sizes_string(profile_.input_sizes) +
                               " (" + std::string(c10::toString(profile_.input_dtype)) + " on " +
                               profile_.input_device.str() + "), got " + detail::sizes_string(input.sizes().vec()) + " (" +
                               std::string(c10::toString(input.scalar_type())) + " on " + input.device().str() +
                               "); build a module for that shape");
        chain_->set_input(input);
        auto step = std::make_shared<Step>(problems_.predicting, plan_.schedule, *chain_, *transfers_, probe_);
        pending_ = step;
        return detail::offload_module::OffloadedForward<Step>::apply(
            input, at::TensorList(trainable_), detail::StepHandle<Step>{std::move(step), last_report_});
    }

    /// Plans again within another budget, on the same profile (a step waiting for its backward
    /// is given up first). Throws Infeasible, keeping the current plan, when none fits.
    void replan(BudgetSpec budget) {
        if (auto pending = pending_.lock()) pending->abandon();
        const Bytes old_budget = budget_;
        try {
            plan_ = make_plan(budget);
        } catch (...) {
            budget_ = old_budget;
            throw;
        }
    }

    /// The plan: its schedule of problem(), the simulator's figures, the split of the budget.
    [[nodiscard]] const remat::offload::OffloadPlan& plan() const noexcept { return plan_; }
    /// The problem the plan runs on (each forward's own overhead, as measured).
    [[nodiscard]] const Problem& problem() const noexcept { return problems_.predicting; }
    /// The problem the solvers planned (the chain's stage overheads).
    [[nodiscard]] const Problem& planned_problem() const noexcept { return problems_.planned; }
    [[nodiscard]] const ChainProfile& profile() const noexcept { return profile_; }
    [[nodiscard]] const StageList& stages() const noexcept { return stages_; }
    /// The device budget for everything the step holds, and the part of it outside the plan
    /// (buffers, frozen parameters, the caller's optimizer state).
    [[nodiscard]] Bytes budget() const noexcept { return budget_; }
    [[nodiscard]] Bytes resident_bytes() const noexcept { return resident_; }
    /// Store-all with every weight on the device: everything the step holds at its peak.
    [[nodiscard]] Bytes store_all_total() const noexcept { return store_all_total_; }
    /// What the last completed step measured against what the simulator predicted (device
    /// memory of the plan's data, host memory of the copies).
    [[nodiscard]] const OffloadStepReport& last_report() const noexcept { return *last_report_; }
    [[nodiscard]] const S& solver() const noexcept { return solver_; }

private:
    [[nodiscard]] ProfileOptions profile_options() const {
        ProfileOptions out = options_.profile;
        if (!out.progress) out.progress = options_.progress;
        return out;
    }

    // Registers the stages' modules and tensors (as Checkpointed does) and fuses aliasing stages.
    [[nodiscard]] StageList attach(StageList stages, const at::Tensor& sample) {
        if (sample.defined() && sample.requires_grad())
            throw InvalidInput("offloading module: the sample input requires grad; the module does not take the "
                               "input's gradient (detach it, or use remat::torch::checkpoint)");
        ChainFrontEnd<Probe> front(std::move(stages));
        CheckpointOptions attach_options;
        attach_options.fuse_aliasing = options_.fuse_aliasing;
        front.attach(*this, sample, attach_options);
        return front.stages();
    }

    [[nodiscard]] bool needs_autograd() const {
        if (!::torch::autograd::GradMode::is_enabled()) return false;
        for (const ChainStage& s : stages_)
            for (const at::Tensor& p : s.parameters)
                if (p.defined() && p.requires_grad()) return true;
        return false;
    }

    // Resident: what the step holds outside the problem (its w<l> and gw<l> are the trainable
    // parameters and their gradients).
    [[nodiscard]] Bytes outside_the_plan() const {
        const std::vector<at::Tensor> parameters = this->parameters();
        Bytes trainable = 0;
        for (const at::Tensor& p : parameters)
            if (p.defined() && p.requires_grad()) trainable += static_cast<Bytes>(p.nbytes());
        return resident_training_bytes(parameters, this->buffers(), options_.optimizer_state_per_parameter) -
               2 * trainable;
    }

    [[nodiscard]] remat::offload::OffloadPlan make_plan(const BudgetSpec& spec) {
        const Problem& planned = problems_.planned;
        resident_ = outside_the_plan();
        store_all_total_ = store_all_reference(planned).peak + resident_;
        budget_ = remat::offload::total_budget(spec, store_all_total_, "offloading module");
        remat::offload::CombinedOptions combined{options_.variant, options_.activation_budgets, options_.transfers};
        combined.between_steps = false;
        remat::offload::OffloadPlan plan =
            remat::offload::plan_within_total(planned, budget_, resident_, store_all_total_, solver_, combined,
                                              "offloading module", "buffers, frozen parameters, optimizer state");
        plan.report = remat::offload::simulate(problems_.predicting, plan.schedule, options_.transfers);
        if (!plan.report.valid || plan.report.device_peak > budget_ - resident_)
            throw SolverError("offloading module: the plan " +
                              (plan.report.valid ? "peaks above the budget" : "is invalid: " + plan.report.error) +
                              " on the problem as measured per forward (this is a bug in remat; please report it)");
        if (options_.progress) {
            std::ostringstream line;
            line << "remat: offloading chain '" << profile_.chain.name << "' (" << stages_.size()
                 << " stages): store-all total " << format_bytes(store_all_total_) << ", budget "
                 << format_bytes(budget_) << ", " << plan.method << " plan peak "
                 << format_bytes(plan.report.device_peak + resident_) << ", " << plan.report.offloads
                 << " offloads, predicted makespan " << plan.report.makespan << " s";
            options_.progress(line.str());
        }
        return plan;
    }

    S solver_;
    OffloadModuleOptions options_;
    Probe probe_;
    // In this order: each is made from the ones before (make_plan sets the three sizes).
    Bytes budget_ = 0;
    Bytes resident_ = 0;
    Bytes store_all_total_ = 0;
    StageList stages_;
    ChainProfile profile_;
    OffloadTrainingProblems problems_;
    remat::offload::OffloadPlan plan_;
    std::optional<OffloadedChain> chain_;  // after problems_: it keeps pointers into nothing else
    std::optional<Transfers> transfers_;   // after chain_, which it copies from and into
    std::vector<at::Tensor> trainable_;
    std::shared_ptr<OffloadStepReport> last_report_;
    std::weak_ptr<Step> pending_;
};

/// The module holder: `m->forward(x)`, `m->parameters()`, `m->train()` as with any module.
template <Solver S = Rotor, class Transfers = CpuTransfers<OffloadedChain>, MemoryProbe Probe = CpuMemoryProbe>
class OffloadCheckpointed : public ::torch::nn::ModuleHolder<OffloadCheckpointedImpl<S, Transfers, Probe>> {
public:
    using ::torch::nn::ModuleHolder<OffloadCheckpointedImpl<S, Transfers, Probe>>::ModuleHolder;
};

/// Profiles `model` on `sample` and plans rematerialization and weight offloading within
/// `budget` (everything the step holds on the device); on the CPU with remat::CpuTransfers.
template <Solver S = Rotor, class Transfers = CpuTransfers<OffloadedChain>, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] OffloadCheckpointed<S, Transfers, Probe> checkpoint_with_offload(const ::torch::nn::Sequential& model,
                                                                              const at::Tensor& sample, BudgetSpec budget,
                                                                              S solver = S{},
                                                                              OffloadModuleOptions options = {},
                                                                              Probe probe = Probe{}) {
    return OffloadCheckpointed<S, Transfers, Probe>(std::make_shared<OffloadCheckpointedImpl<S, Transfers, Probe>>(
        model, sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

template <Solver S = Rotor, class Transfers = CpuTransfers<OffloadedChain>, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] OffloadCheckpointed<S, Transfers, Probe> checkpoint_with_offload(StageList stages, const at::Tensor& sample,
                                                                              BudgetSpec budget, S solver = S{},
                                                                              OffloadModuleOptions options = {},
                                                                              Probe probe = Probe{}) {
    return OffloadCheckpointed<S, Transfers, Probe>(std::make_shared<OffloadCheckpointedImpl<S, Transfers, Probe>>(
        std::move(stages), sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

}  // namespace remat::torch
