// remat/torch/module.hpp — a drop-in module that trains a chain model inside a memory budget.
//
// Give it the model (a torch::nn::Sequential, or stages), a sample input, a budget and a
// solver type (StoreAll, Periodic, Rotor — Beaumont et al., "Optimal checkpointing for
// heterogeneous chains", 2019 — or any remat::Solver): it profiles the chain, plans, and
// behaves like the model, so that
//     auto loss = criterion(m->forward(x), y); loss.backward(); optimizer.step();
// is unchanged. forward() runs the plan up to `loss` inside a custom autograd Function,
// whose backward runs the rest of the plan (docs/design.md §6 (execution engine)). The parameters are the
// model's own tensors: an optimizer built on either sees the same ones.
//
// Inputs of another shape, dtype or device than the profiled sample: with
// ShapePolicy::replan (the default) the module profiles and plans again for that input on
// first sight, at the same budget specification (a percentage is taken of the new
// store-all peak; a byte budget may then throw Infeasible), and keeps up to
// `max_cached_shapes` plans; with ShapePolicy::reject it throws InvalidInput. Without
// autograd (NoGradGuard, or nothing requires grad) forward() simply runs the stages.
//
// Memory beyond the plan, as with plain LibTorch: the output stays allocated while the
// caller holds it, and autograd holds the output's gradient until the backward returns
// (both one output-sized tensor: small for a classifier head). last_report() measures the
// backward from its own start, which it takes to be the plan's state after `loss`.
// Parameter gradients are handed to autograd at the end of the backward, so that a stage
// that throws leaves parameters, gradients and buffers as they were before the step.
#pragma once

#include <cstddef>
#include <iostream>
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

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../io/budget.hpp"
#include "../solvers/store_all.hpp"
#include "detail/step_capsule.hpp"
#include "executor.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "sequential.hpp"

namespace remat::torch {

/// What forward() does with an input unlike the profiled sample.
enum class ShapePolicy { replan, reject };

struct CheckpointOptions {
    ProfileOptions profile;
    ShapePolicy on_new_shape = ShapePolicy::replan;
    /// Plans kept for distinct input shapes (the oldest is dropped beyond it).
    std::size_t max_cached_shapes = 8;
    /// Fuse stages that return views of their input into a neighbour (see fuse_aliasing_stages).
    bool fuse_aliasing = true;
    /// With a total budget (budget_total, BudgetSpec::Counts::total): the optimizer's state in
    /// bytes per byte of trainable parameters (0 for plain SGD, 1 with momentum, 2 for Adam).
    double optimizer_state_per_parameter = 0.0;
    /// Receives one line per phase (profiling, planning with its summary) and the warnings;
    /// empty: silence, except warnings (a fallback to the smallest budget), which go to stderr.
    ProgressCallback progress;
};

// Budgets (io/budget.hpp): budget_bytes(n), budget_percent(p), budget_above_smallest(p), each
// with .or_smallest() to fall back to the solver's smallest budget instead of throwing, and
// budget_total(n) (or .counting_everything()) for a budget of everything the step holds.
using remat::budget_total;

/// What a training step holds besides the plan's activations, for total budgets
/// (BudgetSpec::Counts::total): the parameters and buffers, a gradient per trainable
/// parameter, and the optimizer's state (`optimizer_state_per_parameter` bytes per byte of
/// trainable parameter).
[[nodiscard]] inline Bytes resident_training_bytes(const std::vector<at::Tensor>& parameters,
                                                   const std::vector<at::Tensor>& buffers,
                                                   double optimizer_state_per_parameter) {
    if (!(optimizer_state_per_parameter >= 0.0) || optimizer_state_per_parameter > 1e6)
        throw InvalidInput("optimizer_state_per_parameter must be between 0 and 1e6, not " +
                           std::to_string(optimizer_state_per_parameter));
    Bytes held = 0, trainable = 0;
    for (const at::Tensor& t : buffers)
        if (t.defined()) held += static_cast<Bytes>(t.nbytes());
    for (const at::Tensor& t : parameters) {
        if (!t.defined()) continue;
        held += static_cast<Bytes>(t.nbytes());
        if (t.requires_grad()) trainable += static_cast<Bytes>(t.nbytes());
    }
    return held + trainable + static_cast<Bytes>(optimizer_state_per_parameter * static_cast<double>(trainable));
}
using remat::budget_above_smallest;
using remat::budget_bytes;
using remat::budget_percent;

namespace detail::module {

inline constexpr const char* capsule_key = "remat.step";

/// The autograd function around one planned step. The parameters are inputs, so autograd
/// accumulates their gradients exactly as for the plain model (and leaves them alone when
/// the caller asks for other gradients only).
template <class Probe>
struct PlannedChain : ::torch::autograd::Function<PlannedChain<Probe>> {
    using Handle = StepHandle<ChainStep<Probe>>;

    static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                              at::TensorList parameters, Handle handle) {
        (void)input;
        (void)parameters;  // inputs for autograd's sake; the step already knows them
        at::Tensor output = handle.step->forward();
        stash_step(ctx, capsule_key, std::move(handle));
        return output;
    }

    static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                     ::torch::autograd::variable_list grad_outputs) {
        const Handle handle = take_step<ChainStep<Probe>>(ctx, capsule_key, "remat checkpointed module");
        StepGradients gradients = handle.backward(std::move(grad_outputs.at(0)));
        ::torch::autograd::variable_list result;
        result.reserve(gradients.parameters.size() + 2);
        result.push_back(std::move(gradients.input));
        for (at::Tensor& g : gradients.parameters) result.push_back(std::move(g));
        result.emplace_back();  // the step handle is not a tensor
        return result;
    }
};

}  // namespace detail::module

/// The module; use it through Checkpointed<S, Probe> (a ModuleHolder) or checkpoint().
template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
class CheckpointedImpl : public ::torch::nn::Module {
public:
    /// Plans for a chain of stages; the stages' modules are registered as submodules.
    CheckpointedImpl(StageList stages, const at::Tensor& sample, BudgetSpec budget, S solver = S{},
                     CheckpointOptions options = {}, Probe probe = Probe{})
        : ::torch::nn::Module("remat::torch::Checkpointed"),
          budget_(budget),
          solver_(std::move(solver)),
          options_(std::move(options)),
          probe_(std::move(probe)),
          last_report_(std::make_shared<StepReport>()) {
        if (stages.empty()) throw InvalidInput("checkpointed module: no stages");
        if (!sample.defined()) throw InvalidInput("checkpointed module: the sample input is undefined");
        register_stages(stages);
        std::vector<at::Tensor> state;
        for (const ChainStage& s : stages) {
            state.insert(state.end(), s.parameters.begin(), s.parameters.end());
            state.insert(state.end(), s.buffers.begin(), s.buffers.end());
        }
        model_device_ = detail::device_of_tensors(state);
        detail::check_input_device(model_device_, sample, "checkpointed module");
        stages_ = options_.fuse_aliasing ? fuse_aliasing_stages(std::move(stages), sample) : std::move(stages);
        current_ = compile(sample, budget_);
        cache_.push_back(current_);
    }

    /// Plans for a Sequential, one stage per element (nest Sequentials for coarser stages).
    CheckpointedImpl(const ::torch::nn::Sequential& model, const at::Tensor& sample, BudgetSpec budget, S solver = S{},
                     CheckpointOptions options = {}, Probe probe = Probe{})
        : CheckpointedImpl(stages_of(model), sample, budget, std::move(solver), std::move(options), std::move(probe)) {}

    /// Runs the plan's forward part; the backward part runs when the loss is back-propagated.
    at::Tensor forward(const at::Tensor& input) {
        if (!needs_autograd(input)) {
            at::Tensor x = input;
            for (const ChainStage& s : stages_) x = s.forward(x);
            return x;
        }
        const std::shared_ptr<Compiled> compiled = plan_for(input);
        auto step = std::make_shared<ChainStep<Probe>>(compiled->executor.start(compiled->plan, input, false));
        return detail::module::PlannedChain<Probe>::apply(input, at::TensorList(compiled->executor.parameters()),
                                                  detail::StepHandle<ChainStep<Probe>>{std::move(step), last_report_});
    }

    /// Plans again at another budget, for every input shape seen so far (no re-profiling).
    /// All or nothing: when some shape is infeasible, Infeasible is thrown and the old plans stay.
    void replan(BudgetSpec budget) {
        std::vector<std::shared_ptr<Compiled>> fresh;
        for (const auto& c : cache_) fresh.push_back(plan_again(c->executor, budget));
        for (std::size_t i = 0; i < cache_.size(); ++i)
            if (cache_[i] == current_) current_ = fresh[i];
        cache_ = std::move(fresh);
        budget_ = budget;
    }

    /// Profiles for `sample`'s shape (again) and plans at `budget`; other shapes are re-planned.
    void replan(BudgetSpec budget, const at::Tensor& sample) {
        auto compiled = compile(sample, budget);
        replan(budget);
        std::erase_if(cache_, [&](const auto& c) { return matches(c->executor.profile(), sample); });
        cache_.push_back(compiled);
        current_ = compiled;
    }

    /// The chain, plan and costs for the last input shape used (or the sample's).
    [[nodiscard]] const Chain& chain() const noexcept { return current_->executor.chain(); }
    [[nodiscard]] const ChainProfile& profile() const noexcept { return current_->executor.profile(); }
    [[nodiscard]] const Problem& problem() const noexcept { return current_->executor.problem(); }
    [[nodiscard]] const Plan& plan() const noexcept { return current_->plan.plan(); }
    /// What the current plan does to each layer, by the layers' stage names ("2:Linear"):
    /// how often it runs, what is recomputed and at what cost (core/explain.hpp).
    [[nodiscard]] std::string explain() const {
        ExplainOptions options;
        options.labels = stage_labels(chain());
        options.reference_time = store_all_time();
        return plan().explain(problem(), options);
    }
    [[nodiscard]] const ExecutablePlan& executable_plan() const noexcept { return current_->plan; }
    [[nodiscard]] const ChainExecutor<Probe>& executor() const noexcept { return current_->executor; }
    /// The budget in bytes of the current plan.
    [[nodiscard]] Bytes budget() const noexcept { return current_->budget; }
    [[nodiscard]] const BudgetSpec& budget_spec() const noexcept { return budget_; }
    /// P_ref and T_ref of docs/formats.md §4 (store-all reference) for the current shape.
    [[nodiscard]] Bytes store_all_peak() const noexcept { return current_->reference.peak; }
    [[nodiscard]] double store_all_time() const noexcept { return current_->reference.time; }
    /// What the last completed step measured.
    [[nodiscard]] const StepReport& last_report() const noexcept { return *last_report_; }
    [[nodiscard]] const StageList& stages() const noexcept { return stages_; }
    [[nodiscard]] const S& solver() const noexcept { return solver_; }
    [[nodiscard]] std::size_t cached_shapes() const noexcept { return cache_.size(); }

private:
    struct Compiled {
        ChainExecutor<Probe> executor;
        Reference reference;
        Bytes budget;
        ExecutablePlan plan;
    };

    [[nodiscard]] bool needs_autograd(const at::Tensor& input) const {
        if (!::torch::autograd::GradMode::is_enabled()) return false;
        if (input.requires_grad()) return true;
        for (const ChainStage& s : stages_)
            for (const at::Tensor& p : s.parameters)
                if (p.requires_grad()) return true;
        return false;
    }

    void register_stages(const StageList& stages) {
        const auto modules = modules_of(stages);
        for (std::size_t i = 0; i < modules.size(); ++i) register_module("stage" + std::to_string(i), modules[i]);
        // Tensors of stages without a module become this module's parameters and buffers.
        std::size_t p = 0, b = 0;
        for (const ChainStage& s : stages) {
            if (!s.modules.empty()) continue;
            for (const at::Tensor& t : s.parameters)
                if (t.defined()) register_parameter("param" + std::to_string(p++), t, t.requires_grad());
            for (const at::Tensor& t : s.buffers)
                if (t.defined()) register_buffer("buffer" + std::to_string(b++), t);
        }
    }

    [[nodiscard]] std::shared_ptr<Compiled> compile(const at::Tensor& sample, const BudgetSpec& budget) const {
        ProfileOptions profile_options = options_.profile;
        if (!profile_options.progress) profile_options.progress = options_.progress;
        ChainProfile profile = profile_chain(stages_, sample, profile_options, probe_);
        return plan_again(ChainExecutor<Probe>(stages_, std::move(profile), probe_), budget);
    }

    [[nodiscard]] std::shared_ptr<Compiled> plan_again(const ChainExecutor<Probe>& executor, const BudgetSpec& budget) const {
        const Problem& problem = executor.problem();
        Reference reference = store_all_reference(problem);
        const ProgressCallback warn = [this](const std::string& line) {
            if (options_.progress)
                options_.progress(line);
            else
                std::cerr << line << '\n';
        };
        const BudgetSpec spec = budget.counts == BudgetSpec::Counts::total
                                    ? budget.with_resident(resident_training_bytes(
                                          this->parameters(), this->buffers(), options_.optimizer_state_per_parameter))
                                    : budget;
        BudgetedPlan planned = plan_within(solver_, problem, spec, reference.peak, warn);
        const Bytes bytes = planned.budget;
        ExecutablePlan executable = executor.prepare(std::move(planned.plan));
        if (options_.progress) {
            std::ostringstream line;
            const double overhead = reference.time > 0 ? executable.predicted_time() / reference.time - 1 : 0.0;
            line << "remat: chain '" << executor.chain().name << "' (" << executor.chain().length()
                 << " stages, input " << detail::sizes_string(executor.profile().input_sizes) << "): store-all peak "
                 << format_bytes(reference.peak) << ", budget " << format_bytes(bytes) << ", " << solver_.name()
                 << " plan peak " << format_bytes(executable.predicted_peak()) << ", predicted overhead "
                 << overhead * 100 << " %";
            warn(line.str());
        }
        return std::make_shared<Compiled>(Compiled{executor, std::move(reference), bytes, std::move(executable)});
    }

    [[nodiscard]] std::shared_ptr<Compiled> plan_for(const at::Tensor& input) {
        if (matches(current_->executor.profile(), input)) return current_;
        detail::check_input_device(model_device_, input, "checkpointed module");
        for (const auto& c : cache_)
            if (matches(c->executor.profile(), input)) return current_ = c;
        if (options_.on_new_shape == ShapePolicy::reject)
            throw InvalidInput("checkpointed module: planned for inputs of shape " +
                               detail::sizes_string(current_->executor.profile().input_sizes) + " (" +
                               std::string(c10::toString(current_->executor.profile().input_dtype)) + " on " +
                               current_->executor.profile().input_device.str() + "), got " +
                               detail::sizes_string(input.sizes().vec()) + " (" +
                               std::string(c10::toString(input.scalar_type())) + " on " + input.device().str() +
                               "); call replan(budget, sample) for that shape or use ShapePolicy::replan");
        current_ = compile(input, budget_);
        cache_.push_back(current_);
        if (cache_.size() > std::max<std::size_t>(options_.max_cached_shapes, 1)) cache_.erase(cache_.begin());
        return current_;
    }

    StageList stages_;
    std::optional<c10::Device> model_device_;  // of the stages' parameters and buffers
    BudgetSpec budget_;
    S solver_;
    CheckpointOptions options_;
    Probe probe_;
    std::shared_ptr<StepReport> last_report_;
    std::shared_ptr<Compiled> current_;
    std::vector<std::shared_ptr<Compiled>> cache_;
};

/// The module holder: `Checkpointed<Rotor> m(model, sample, budget_percent(50), Rotor{});`
/// then `m->forward(x)`, `m->parameters()`, `m->train()` as with any module.
template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
class Checkpointed : public ::torch::nn::ModuleHolder<CheckpointedImpl<S, Probe>> {
public:
    using ::torch::nn::ModuleHolder<CheckpointedImpl<S, Probe>>::ModuleHolder;
};

/// Profiles `model` on `sample`, plans at `budget` with `solver`, and returns the module.
template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] Checkpointed<S, Probe> checkpoint(const ::torch::nn::Sequential& model, const at::Tensor& sample,
                                                BudgetSpec budget, S solver = S{}, CheckpointOptions options = {},
                                                Probe probe = Probe{}) {
    return Checkpointed<S, Probe>(
        std::make_shared<CheckpointedImpl<S, Probe>>(model, sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] Checkpointed<S, Probe> checkpoint(StageList stages, const at::Tensor& sample, BudgetSpec budget,
                                                S solver = S{}, CheckpointOptions options = {}, Probe probe = Probe{}) {
    return Checkpointed<S, Probe>(std::make_shared<CheckpointedImpl<S, Probe>>(
        std::move(stages), sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

}  // namespace remat::torch
