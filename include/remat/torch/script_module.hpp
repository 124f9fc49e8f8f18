// remat/torch/script_module.hpp — the graph front end of the drop-in module
// (planned_module.hpp): any TorchScript module, or a torch.export program (exported.hpp),
// trained inside a memory budget: remat's counterpart of Rockmate's `Rockmate(model, sample,
// budget)`.
//
//     auto m = remat::torch::checkpoint(jit_module, {sample}, remat::budget_percent(40));
//     auto loss = criterion(m->forward({x}).toTensor(), y);
//     loss.backward();      // runs the rest of the plan
//     optimizer.step();     // on m->parameters(): the jit module's own tensors
//
// checkpoint() captures the module on the sample arguments (script.hpp: any scripted or
// traced module, tuples, lists and dicts in and out), plans with the solver (remat::Auto by
// default, solvers/auto.hpp: Rotor, Rockmate or H-Rockmate by the graph's shape, the greedy
// as the last resort; pass remat::Greedy{} to plan large graphs in milliseconds) under a
// budget policy (io/budget.hpp: bytes, % of the store-all peak, or the
// smallest budget plus a margin, optionally falling back to the smallest), and runs the plan
// through ScriptExecutor::forward inside a custom autograd Function (graph_executor.hpp).
// Gradients are bitwise those of plain autograd. The capture is specialised to the sample's
// shapes and training mode: another shape (or train()/eval()) is captured and planned again
// on first sight (ShapePolicy::replan, the default) or refused (ShapePolicy::reject).
#pragma once

#include <cstddef>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../core/errors.hpp"
#include "../core/explain.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../io/budget.hpp"
#include "../solvers/auto.hpp"
#include "../solvers/store_all.hpp"
#include "graph_executor.hpp"
#include "memory.hpp"
#include "module.hpp"
#include "planned_module.hpp"
#include "script.hpp"

namespace remat::torch {

struct ScriptCheckpointOptions {
    CaptureOptions capture;
    ShapePolicy on_new_shape = ShapePolicy::replan;
    /// Captures kept for distinct argument shapes (the oldest is dropped beyond it).
    std::size_t max_cached_shapes = 4;
    /// With a total budget (budget_total, BudgetSpec::Counts::total): the optimizer's state in
    /// bytes per byte of trainable parameters (0 for plain SGD, 1 with momentum, 2 for Adam).
    double optimizer_state_per_parameter = 0.0;
    /// Receives one line per phase (capture phases, planning with its summary) and the
    /// warnings; empty: silence, except warnings (a fallback to the smallest budget), which go
    /// to stderr.
    ProgressCallback progress;
};

/// The graph front end of the drop-in module (planned_module.hpp): a TorchScript module, or a
/// torch.export program read by load_exported (exported.hpp), captured per argument shape and
/// training mode into an op-level program (script.hpp) that ScriptExecutor runs.
template <MemoryProbe Probe>
class GraphFrontEnd {
public:
    using Arguments = std::vector<c10::IValue>;
    using Result = c10::IValue;
    using Executor = ScriptExecutor<Probe>;
    using Options = ScriptCheckpointOptions;
    static constexpr const char* module_name = "ScriptCheckpointed";

    explicit GraphFrontEnd(::torch::jit::Module module) : jit_(std::move(module)) {}

    /// Registers the module's parameters with the drop-in module, each tensor once: tied
    /// weights (a GPT's lm_head.weight, the token embedding's) are one parameter, which an
    /// optimizer must update once.
    void attach(::torch::nn::Module& self, const Arguments& sample, const Options&) {
        std::unordered_set<const c10::TensorImpl*> seen;
        for (const auto& named : jit_.named_parameters(true)) {
            if (!seen.insert(named.value.unsafeGetTensorImpl()).second) continue;
            std::string name = named.name;
            for (char& c : name)
                if (c == '.') c = '_';
            self.register_parameter(name, named.value, named.value.requires_grad());
        }
        self.::torch::nn::Module::train(jit_.is_training());
        std::vector<at::Tensor> state;
        for (const at::Tensor& p : jit_.parameters(true)) state.push_back(p);
        for (const at::Tensor& b : jit_.buffers(true)) state.push_back(b);
        model_device_ = detail::device_of_tensors(state);
        check_devices(sample);
    }

    [[nodiscard]] Executor compile(const Arguments& sample, const Options& options, const Probe& probe) const {
        CaptureOptions capture_options = options.capture;
        if (!capture_options.progress) capture_options.progress = options.progress;
        return Executor(capture_script<Probe>(jit_, sample, capture_options, probe), probe);
    }

    [[nodiscard]] bool fits(const Executor& executor, const Arguments& arguments) const {
        const ScriptCapture& c = executor.capture();
        if (c.training() != jit_.is_training()) return false;
        try {
            return c.matches(c.input_tensors(arguments));
        } catch (const InvalidInput&) {
            return false;
        }
    }
    // Every tensor among the arguments (in tuples, lists and dicts too) must be on the model's device.
    void check_devices(const Arguments& arguments) const {
        std::vector<at::Tensor> tensors;
        for (const c10::IValue& a : arguments) detail::capture::tensors_in(a, tensors);
        for (const at::Tensor& t : tensors) detail::check_input_device(model_device_, t, name());
    }
    [[nodiscard]] std::string mismatch(const Executor& executor, const Arguments&) const {
        return "checkpointed module '" + executor.capture().problem().name() +
               "': captured for other argument shapes or another training mode; capture again with "
               "ShapePolicy::replan or a new checkpoint()";
    }

    [[nodiscard]] std::optional<Result> without_autograd(const Arguments&) const noexcept { return std::nullopt; }

    /// The module's forward under the plan; its result has the module's own structure.
    [[nodiscard]] Result run(const Executor& executor, const ScriptPlan& plan, const Arguments& arguments,
                             const std::shared_ptr<StepReport>& report,
                             const std::shared_ptr<const GradientHooks>& hooks) const {
        const ScriptCapture& c = executor.capture();
        return c.pack_outputs(executor.forward(plan, c.input_tensors(arguments), report, hooks));
    }

    [[nodiscard]] std::string describe(const Executor& executor) const {
        const ScriptCapture& c = executor.capture();
        std::ostringstream text;
        text << "'" << c.problem().name() << "' captured (" << c.ops().size() << " ops in " << c.seconds() << " s)";
        return text.str();
    }
    [[nodiscard]] std::vector<at::Tensor> state_buffers(const ::torch::nn::Module&) const {
        std::vector<at::Tensor> out;
        for (const at::Tensor& b : jit_.buffers(true)) out.push_back(b);
        return out;
    }
    [[nodiscard]] ExplainOptions explain_options(const Executor&) const { return {}; }

    /// A program read from a .pt2 file keeps the mode it was exported in (its dropout and
    /// batch-norm flags are constants of the program): switching it throws InvalidInput.
    void train(bool on) {
        if (jit_.hasattr(detail::exported_mode_attribute) && jit_.attr(detail::exported_mode_attribute).toBool() != on)
            throw InvalidInput(name() + ": the program was exported in " + (on ? "eval" : "train") +
                               " mode, and its mode is part of the program; export it again after model." +
                               (on ? "train()" : "eval()") + " to run it in " + (on ? "train" : "eval") + " mode");
        jit_.train(on);
    }
    [[nodiscard]] std::string name() const { return "checkpointed module"; }
    [[nodiscard]] const ::torch::jit::Module& module() const noexcept { return jit_; }

private:
    ::torch::jit::Module jit_;
    std::optional<c10::Device> model_device_;  // of the module's parameters and buffers
};

/// The graph's drop-in module; use it through ScriptCheckpointed<S, Probe> or checkpoint().
template <Solver S = Auto, MemoryProbe Probe = CpuMemoryProbe>
using ScriptCheckpointedImpl = PlannedModuleImpl<GraphFrontEnd<Probe>, S, Probe>;

template <Solver S = Auto, MemoryProbe Probe = CpuMemoryProbe>
class ScriptCheckpointed : public ::torch::nn::ModuleHolder<ScriptCheckpointedImpl<S, Probe>> {
public:
    using ::torch::nn::ModuleHolder<ScriptCheckpointedImpl<S, Probe>>::ModuleHolder;
};

/// Captures `module` on `sample` (one value per forward argument), plans at `budget` with
/// `solver`, and returns a module whose forward() and `loss.backward()` work like the
/// original's, within the budget.
template <Solver S = Auto, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ScriptCheckpointed<S, Probe> checkpoint(const ::torch::jit::Module& module, const std::vector<c10::IValue>& sample,
                                                      BudgetSpec budget, S solver = S{}, ScriptCheckpointOptions options = {},
                                                      Probe probe = Probe{}) {
    return ScriptCheckpointed<S, Probe>(std::make_shared<ScriptCheckpointedImpl<S, Probe>>(
        GraphFrontEnd<Probe>(module), sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

}  // namespace remat::torch
