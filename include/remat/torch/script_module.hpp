// remat/torch/script_module.hpp — any TorchScript module as a drop-in module that trains
// inside a memory budget: remat's counterpart of Rockmate's `Rockmate(model, sample, budget)`.
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
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../io/budget.hpp"
#include "../solvers/auto.hpp"
#include "../solvers/store_all.hpp"
#include "graph_executor.hpp"
#include "memory.hpp"
#include "module.hpp"
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

/// The module; use it through ScriptCheckpointed<S, Probe> or checkpoint().
template <Solver S = Auto, MemoryProbe Probe = CpuMemoryProbe>
class ScriptCheckpointedImpl : public ::torch::nn::Module {
public:
    ScriptCheckpointedImpl(::torch::jit::Module module, const std::vector<c10::IValue>& sample, BudgetSpec budget,
                           S solver = S{}, ScriptCheckpointOptions options = {}, Probe probe = Probe{})
        : ::torch::nn::Module("remat::torch::ScriptCheckpointed"),
          jit_(std::move(module)),
          budget_(budget),
          solver_(std::move(solver)),
          options_(std::move(options)),
          probe_(std::move(probe)),
          last_report_(std::make_shared<StepReport>()) {
        // Each tensor once, under its first name: tied weights (a GPT's lm_head.weight, the
        // token embedding's) are one parameter, which an optimizer must update once.
        std::unordered_set<const c10::TensorImpl*> seen;
        for (const auto& named : jit_.named_parameters(true)) {
            if (!seen.insert(named.value.unsafeGetTensorImpl()).second) continue;
            std::string name = named.name;
            for (char& c : name)
                if (c == '.') c = '_';
            register_parameter(name, named.value, named.value.requires_grad());
        }
        ::torch::nn::Module::train(jit_.is_training());
        std::vector<at::Tensor> state;
        for (const at::Tensor& p : jit_.parameters(true)) state.push_back(p);
        for (const at::Tensor& b : jit_.buffers(true)) state.push_back(b);
        model_device_ = detail::device_of_tensors(state);
        check_devices(sample);
        current_ = compile(sample);
        cache_.push_back(current_);
    }

    /// The module's forward under the plan; its result has the module's own structure.
    c10::IValue forward(const std::vector<c10::IValue>& arguments) {
        const std::shared_ptr<Compiled> c = plan_for(arguments);
        const std::vector<at::Tensor> leaves = c->capture.input_tensors(arguments);
        return c->capture.pack_outputs(c->executor.forward(c->plan, leaves, last_report_));
    }
    /// A program read from a .pt2 file keeps the mode it was exported in (its dropout and
    /// batch-norm flags are constants of the program): switching it throws InvalidInput.
    void train(bool on = true) override {
        if (jit_.hasattr(detail::exported_mode_attribute) && jit_.attr(detail::exported_mode_attribute).toBool() != on)
            throw InvalidInput(std::string("checkpointed module '") + current_name() + "': the program was exported in " +
                               (on ? "eval" : "train") + " mode, and its mode is part of the program; export it again "
                               "after model." + (on ? "train()" : "eval()") + " to run it in " +
                               (on ? "train" : "eval") + " mode");
        jit_.train(on);
        ::torch::nn::Module::train(on);
    }

    /// Plans again at another budget for every shape captured so far (no capture again).
    void replan(BudgetSpec budget) {
        budget_ = budget;
        for (auto& c : cache_) *c = plan(c->capture);
    }

    [[nodiscard]] const ScriptCapture& capture() const noexcept { return current_->capture; }
    [[nodiscard]] const Problem& problem() const noexcept { return current_->capture.problem(); }
    [[nodiscard]] const Plan& plan() const noexcept { return current_->plan.plan(); }
    [[nodiscard]] Bytes budget() const noexcept { return current_->budget; }
    [[nodiscard]] Bytes store_all_peak() const noexcept { return current_->reference.peak; }
    [[nodiscard]] double store_all_time() const noexcept { return current_->reference.time; }
    /// What the last completed step measured.
    [[nodiscard]] const StepReport& last_report() const noexcept { return *last_report_; }
    [[nodiscard]] const ::torch::jit::Module& module() const noexcept { return jit_; }
    [[nodiscard]] std::size_t cached_shapes() const noexcept { return cache_.size(); }

private:
    struct Compiled {
        ScriptCapture capture;
        ScriptExecutor<Probe> executor;
        Reference reference;
        Bytes budget;
        ScriptPlan plan;
    };

    [[nodiscard]] std::vector<at::Tensor> jit_buffers() const {
        std::vector<at::Tensor> out;
        for (const at::Tensor& b : jit_.buffers(true)) out.push_back(b);
        return out;
    }
    void say(const std::string& line) const {
        if (options_.progress)
            options_.progress(line);
        else
            std::cerr << line << '\n';
    }

    [[nodiscard]] std::shared_ptr<Compiled> compile(const std::vector<c10::IValue>& arguments) const {
        CaptureOptions capture_options = options_.capture;
        if (!capture_options.progress) capture_options.progress = options_.progress;
        ScriptCapture captured = capture_script<Probe>(jit_, arguments, capture_options, probe_);
        return std::make_shared<Compiled>(plan(captured));
    }

    [[nodiscard]] Compiled plan(const ScriptCapture& captured) const {
        const ScriptExecutor<Probe> executor(captured, probe_);
        Reference reference = store_all_reference(captured.problem());
        const BudgetSpec spec = budget_.counts == BudgetSpec::Counts::total
                                    ? budget_.with_resident(resident_training_bytes(
                                          this->parameters(), jit_buffers(), options_.optimizer_state_per_parameter))
                                    : budget_;
        BudgetedPlan planned =
            plan_within(solver_, captured.problem(), spec, reference.peak, [this](const std::string& l) { say(l); });
        ScriptPlan prepared = executor.prepare(std::move(planned.plan));
        if (options_.progress) {
            std::ostringstream line;
            line << "remat: '" << captured.problem().name() << "' captured (" << captured.ops().size() << " ops in "
                 << captured.seconds() << " s): store-all peak " << format_bytes(reference.peak) << ", budget "
                 << format_bytes(planned.budget) << ", " << solver_.name() << " plan peak "
                 << format_bytes(prepared.predicted_peak()) << ", predicted overhead "
                 << 100.0 * (prepared.predicted_time() / std::max(reference.time, 1e-300) - 1.0) << " %";
            say(line.str());
        }
        return Compiled{captured, executor, std::move(reference), planned.budget, std::move(prepared)};
    }

    [[nodiscard]] static bool fits(const Compiled& c, const std::vector<c10::IValue>& arguments, bool training) {
        if (c.capture.training() != training) return false;
        try {
            return c.capture.matches(c.capture.input_tensors(arguments));
        } catch (const InvalidInput&) {
            return false;
        }
    }

    [[nodiscard]] std::shared_ptr<Compiled> plan_for(const std::vector<c10::IValue>& arguments) {
        const bool training = jit_.is_training();
        if (fits(*current_, arguments, training)) return current_;
        for (const auto& c : cache_)
            if (fits(*c, arguments, training)) return current_ = c;
        check_devices(arguments);
        if (options_.on_new_shape == ShapePolicy::reject)
            throw InvalidInput("checkpointed module '" + current_->capture.problem().name() +
                               "': captured for other argument shapes or another training mode; capture again with "
                               "ShapePolicy::replan or a new checkpoint()");
        current_ = compile(arguments);
        cache_.push_back(current_);
        if (cache_.size() > std::max<std::size_t>(options_.max_cached_shapes, 1)) cache_.erase(cache_.begin());
        return current_;
    }

    [[nodiscard]] std::string current_name() const {
        return current_ ? current_->capture.problem().name() : std::string("module");
    }
    // Every tensor among the arguments (in tuples, lists and dicts too) must be on the model's device.
    void check_devices(const std::vector<c10::IValue>& arguments) const {
        const std::string who = "checkpointed module '" + current_name() + "'";
        std::vector<at::Tensor> tensors;
        for (const c10::IValue& a : arguments) detail::capture::tensors_in(a, tensors);
        for (const at::Tensor& t : tensors) detail::check_input_device(model_device_, t, who);
    }

    ::torch::jit::Module jit_;
    std::optional<c10::Device> model_device_;  // of the module's parameters and buffers
    BudgetSpec budget_;
    S solver_;
    ScriptCheckpointOptions options_;
    Probe probe_;
    std::shared_ptr<StepReport> last_report_;
    std::shared_ptr<Compiled> current_;
    std::vector<std::shared_ptr<Compiled>> cache_;
};

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
        module, sample, budget, std::move(solver), std::move(options), std::move(probe)));
}

}  // namespace remat::torch
