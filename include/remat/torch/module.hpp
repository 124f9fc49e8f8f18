// remat/torch/module.hpp — the chain front end of the drop-in module (planned_module.hpp):
// a chain model trained inside a memory budget.
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
// caller holds it (one output-sized tensor: small for a classifier head). The output's
// gradient is the plan's: the backward takes it out of autograd's list and the plan frees it.
// last_report() measures the backward from its own start, which it takes to be the plan's
// state after `loss`.
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
#include "../core/explain.hpp"
#include "../core/errors.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../io/budget.hpp"
#include "../solvers/store_all.hpp"
#include "detail/step_capsule.hpp"
#include "executor.hpp"
#include "memory.hpp"
#include "planned_module.hpp"
#include "profile.hpp"
#include "sequential.hpp"

namespace remat::torch {

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

    // `grad_outputs` by reference: on LibTorch 2.x it is autograd's own list (CppNode::apply
    // passes the gradients it moved in), and moving them out leaves the plan the only holder,
    // so that its frees of the outputs' gradients free their memory. LibTorch 1.13's
    // CppNode::apply passes a copy and keeps its own list until this returns: there the
    // outputs' gradients stay allocated through the backward, beyond the prediction.
    static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                     ::torch::autograd::variable_list& grad_outputs) {
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

/// The chain front end of the drop-in module (planned_module.hpp): a Sequential or functor
/// stages, profiled per input shape into a chain (profile.hpp) that ChainExecutor runs.
template <MemoryProbe Probe>
class ChainFrontEnd {
public:
    using Arguments = at::Tensor;
    using Result = at::Tensor;
    using Executor = ChainExecutor<Probe>;
    using Options = CheckpointOptions;
    static constexpr const char* module_name = "Checkpointed";

    ChainFrontEnd(StageList stages) : stages_(std::move(stages)) {}  // NOLINT: implicit, like the model
    ChainFrontEnd(const ::torch::nn::Sequential& model) : stages_(stages_of(model)) {}  // NOLINT

    /// Registers the stages' modules (or their tensors) with the drop-in module and fuses
    /// stages that return views of their input (CheckpointOptions::fuse_aliasing).
    void attach(::torch::nn::Module& self, const at::Tensor& sample, const Options& options) {
        if (stages_.empty()) throw InvalidInput("checkpointed module: no stages");
        if (!sample.defined()) throw InvalidInput("checkpointed module: the sample input is undefined");
        register_stages(self);
        std::vector<at::Tensor> state;
        for (const ChainStage& s : stages_) {
            state.insert(state.end(), s.parameters.begin(), s.parameters.end());
            state.insert(state.end(), s.buffers.begin(), s.buffers.end());
        }
        model_device_ = detail::device_of_tensors(state);
        check_devices(sample);
        if (options.fuse_aliasing) stages_ = fuse_aliasing_stages(std::move(stages_), sample);
    }

    [[nodiscard]] Executor compile(const at::Tensor& sample, const Options& options, const Probe& probe) const {
        ProfileOptions profile_options = options.profile;
        if (!profile_options.progress) profile_options.progress = options.progress;
        ChainProfile profile = profile_chain(stages_, sample, profile_options, probe);
        return Executor(stages_, std::move(profile), probe);
    }

    [[nodiscard]] bool fits(const Executor& executor, const at::Tensor& input) const {
        return matches(executor.profile(), input);
    }
    void check_devices(const at::Tensor& input) const {
        detail::check_input_device(model_device_, input, "checkpointed module");
    }
    [[nodiscard]] std::string mismatch(const Executor& executor, const at::Tensor& input) const {
        const ChainProfile& p = executor.profile();
        return "checkpointed module: planned for inputs of shape " + detail::sizes_string(p.input_sizes) + " (" +
               std::string(c10::toString(p.input_dtype)) + " on " + p.input_device.str() + "), got " +
               detail::sizes_string(input.sizes().vec()) + " (" + std::string(c10::toString(input.scalar_type())) +
               " on " + input.device().str() + "); call replan(budget, sample) for that shape or use ShapePolicy::replan";
    }

    /// Without autograd (NoGradGuard, or nothing requires grad) the stages simply run.
    [[nodiscard]] std::optional<at::Tensor> without_autograd(const at::Tensor& input) const {
        if (needs_autograd(input)) return std::nullopt;
        at::Tensor x = input;
        for (const ChainStage& s : stages_) x = s.forward(x);
        return x;
    }

    [[nodiscard]] at::Tensor run(const Executor& executor, const ExecutablePlan& plan, const at::Tensor& input,
                                 const std::shared_ptr<StepReport>& report,
                                 const std::shared_ptr<const GradientHooks>& hooks) const {
        auto step = std::make_shared<ChainStep<Probe>>(executor.start(plan, input, false, hooks));
        return detail::module::PlannedChain<Probe>::apply(input, at::TensorList(executor.parameters()),
                                                          detail::StepHandle<ChainStep<Probe>>{std::move(step), report});
    }

    [[nodiscard]] std::string describe(const Executor& executor) const {
        return "chain '" + executor.chain().name + "' (" + std::to_string(executor.chain().length()) +
               " stages, input " + detail::sizes_string(executor.profile().input_sizes) + ")";
    }
    [[nodiscard]] std::vector<at::Tensor> state_buffers(const ::torch::nn::Module& self) const { return self.buffers(); }
    /// The layers by their stage names ("2:Linear") in explain().
    [[nodiscard]] ExplainOptions explain_options(const Executor& executor) const {
        ExplainOptions options;
        options.labels = stage_labels(executor.chain());
        return options;
    }
    void train(bool) const noexcept {}
    [[nodiscard]] std::string name() const { return "checkpointed module"; }
    [[nodiscard]] const StageList& stages() const noexcept { return stages_; }

private:
    [[nodiscard]] bool needs_autograd(const at::Tensor& input) const {
        if (!::torch::autograd::GradMode::is_enabled()) return false;
        if (input.requires_grad()) return true;
        for (const ChainStage& s : stages_)
            for (const at::Tensor& p : s.parameters)
                if (p.requires_grad()) return true;
        return false;
    }

    void register_stages(::torch::nn::Module& self) const {
        const auto modules = modules_of(stages_);
        for (std::size_t i = 0; i < modules.size(); ++i) self.register_module("stage" + std::to_string(i), modules[i]);
        // Tensors of stages without a module become the drop-in module's parameters and buffers.
        std::size_t p = 0, b = 0;
        for (const ChainStage& s : stages_) {
            if (!s.modules.empty()) continue;
            for (const at::Tensor& t : s.parameters)
                if (t.defined()) self.register_parameter("param" + std::to_string(p++), t, t.requires_grad());
            for (const at::Tensor& t : s.buffers)
                if (t.defined()) self.register_buffer("buffer" + std::to_string(b++), t);
        }
    }

    StageList stages_;
    std::optional<c10::Device> model_device_;  // of the stages' parameters and buffers
};

/// The chain's drop-in module; use it through Checkpointed<S, Probe> or checkpoint().
template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
using CheckpointedImpl = PlannedModuleImpl<ChainFrontEnd<Probe>, S, Probe>;

/// The module holder, made by checkpoint(): `m->forward(x)`, `m->parameters()`, `m->train()`
/// as with any module.
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
        std::make_shared<CheckpointedImpl<S, Probe>>(ChainFrontEnd<Probe>(model), sample, budget, std::move(solver),
                                                     std::move(options), std::move(probe)));
}

template <Solver S = StoreAll, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] Checkpointed<S, Probe> checkpoint(StageList stages, const at::Tensor& sample, BudgetSpec budget,
                                                S solver = S{}, CheckpointOptions options = {}, Probe probe = Probe{}) {
    return Checkpointed<S, Probe>(std::make_shared<CheckpointedImpl<S, Probe>>(
        ChainFrontEnd<Probe>(std::move(stages)), sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

}  // namespace remat::torch
