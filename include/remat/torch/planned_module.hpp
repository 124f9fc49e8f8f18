// remat/torch/planned_module.hpp — PlannedModuleImpl: the one drop-in module of every front
// end, which trains a program inside a memory budget and behaves like the model it came from.
//
// A front end (module.hpp: a Sequential or functor stages; script_module.hpp: a TorchScript
// module or a torch.export program) says how to profile or capture its model for a sample,
// whether a later input fits that capture, and how to run a prepared plan inside a custom
// autograd Function (its step is the one PlannedStep of torch/step.hpp). This module does the
// rest the same way for all of them: plan with the solver under the budget policy
// (io/budget.hpp), keep one capture and plan per input shape (ShapePolicy), plan again at
// another budget, report what the last step measured, explain the plan. So that
//     auto loss = criterion(m->forward(x), y); loss.backward(); optimizer.step();
// is unchanged, and the optimizer's parameters are the model's own tensors.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "../core/errors.hpp"
#include "../core/explain.hpp"
#include "../core/progress.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../exec/report.hpp"
#include "../io/budget.hpp"
#include "../solvers/store_all.hpp"
#include "gradient_hooks.hpp"
#include "memory.hpp"

namespace remat::torch {

/// What forward() does with an input unlike the ones captured so far.
enum class ShapePolicy { replan, reject };

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

/// What the drop-in module needs from a front end (see ChainFrontEnd, GraphFrontEnd).
template <class F>
concept ModuleFrontEnd = requires(F& front, const F& c, ::torch::nn::Module& self, const typename F::Arguments& args,
                                  const typename F::Executor& executor, const typename F::Options& options) {
    typename F::Result;
    front.attach(self, args, options);
    c.check_devices(args);
    c.fits(executor, args);
    { c.mismatch(executor, args) } -> std::convertible_to<std::string>;
    { c.describe(executor) } -> std::convertible_to<std::string>;
    { c.state_buffers(self) } -> std::convertible_to<std::vector<at::Tensor>>;
    c.explain_options(executor);
    front.train(true);
    { c.name() } -> std::convertible_to<std::string>;
};

template <ModuleFrontEnd FrontEnd, Solver S, MemoryProbe Probe>
class PlannedModuleImpl : public ::torch::nn::Module {
public:
    using Arguments = typename FrontEnd::Arguments;
    using Result = typename FrontEnd::Result;
    using Options = typename FrontEnd::Options;
    using Executor = typename FrontEnd::Executor;
    using PreparedPlan = decltype(std::declval<const Executor&>().prepare(std::declval<Plan>()));

    PlannedModuleImpl(FrontEnd front, const Arguments& sample, BudgetSpec budget, S solver = S{}, Options options = {},
                      Probe probe = Probe{})
        : ::torch::nn::Module(std::string("remat::torch::") + FrontEnd::module_name),
          front_(std::move(front)),
          budget_(budget),
          solver_(std::move(solver)),
          options_(std::move(options)),
          probe_(std::move(probe)),
          last_report_(std::make_shared<StepReport>()) {
        front_.attach(*this, sample, options_);
        current_ = compile(sample, budget_);
        cache_.push_back(current_);
    }

    /// The model's forward under the plan; loss.backward() runs the rest of the plan.
    Result forward(const Arguments& arguments) {
        if (auto eager = front_.without_autograd(arguments)) return std::move(*eager);
        const std::shared_ptr<Compiled> c = plan_for(arguments);
        return front_.run(c->executor, c->plan, arguments, last_report_, gradient_hooks_);
    }

    /// What every later step does with its parameter gradients besides handing them over
    /// (torch/gradient_hooks.hpp; a data-parallel wrapper reduces them across processes);
    /// empty hooks: none.
    void set_gradient_hooks(GradientHooks hooks) {
        gradient_hooks_ = hooks.on_final || hooks.before_hand_over || hooks.on_abandon
                              ? std::make_shared<const GradientHooks>(std::move(hooks))
                              : nullptr;
    }

    /// Runs `plan` for the current input shape instead of the module's own: a plan made
    /// elsewhere (by another process of a data-parallel job, or by hand). It must be a valid
    /// schedule of this module's problem (InvalidInput names the step otherwise) and fit this
    /// module's budget as this module measured its problem (Infeasible otherwise); on either
    /// error the module's plan stays.
    void adopt_plan(Plan plan) {
        const Problem& own = problem();
        const SimulationReport simulated = simulate(own, plan.schedule);
        if (!simulated.valid)
            throw InvalidInput(front_.name() + ": the plan to adopt is not a valid schedule of '" + own.name() +
                               "' as this process captured it: " + simulated.error);
        if (simulated.peak > current_->budget)
            throw Infeasible(front_.name() + ": the plan to adopt peaks at " + format_bytes(simulated.peak) +
                                 " on this process's measurements, above its budget of " +
                                 format_bytes(current_->budget),
                             current_->budget, std::nullopt, current_->reference.peak);
        plan.time = simulated.time;
        plan.peak = simulated.peak;
        plan.budget = current_->budget;
        auto adopted = std::make_shared<Compiled>(Compiled{current_->executor, current_->reference, current_->budget,
                                                           current_->executor.prepare(std::move(plan))});
        std::replace(cache_.begin(), cache_.end(), current_, adopted);
        current_ = std::move(adopted);
    }

    void train(bool on = true) override {
        front_.train(on);
        ::torch::nn::Module::train(on);
    }

    /// Plans again at another budget for every input shape seen so far (no capture again).
    /// All or nothing: when some shape is infeasible, Infeasible is thrown and the old plans stay.
    void replan(BudgetSpec budget) {
        std::vector<std::shared_ptr<Compiled>> fresh;
        for (const auto& c : cache_) fresh.push_back(plan(c->executor, budget));
        for (std::size_t i = 0; i < cache_.size(); ++i)
            if (cache_[i] == current_) current_ = fresh[i];
        cache_ = std::move(fresh);
        budget_ = budget;
    }

    /// Captures (profiles) for `sample` again and plans at `budget`; other shapes are re-planned.
    void replan(BudgetSpec budget, const Arguments& sample) {
        auto compiled = compile(sample, budget);
        replan(budget);
        std::erase_if(cache_, [&](const auto& c) { return front_.fits(c->executor, sample); });
        cache_.push_back(compiled);
        current_ = compiled;
    }

    /// What runs the plan for the last input shape used (or the sample's): the chain's or the
    /// captured program's executor, with its problem.
    [[nodiscard]] const Executor& executor() const noexcept { return current_->executor; }
    [[nodiscard]] const Problem& problem() const noexcept { return current_->executor.problem(); }
    [[nodiscard]] const Plan& plan() const noexcept { return current_->plan.plan(); }
    [[nodiscard]] const PreparedPlan& executable_plan() const noexcept { return current_->plan; }
    /// What the current plan does to each op or layer: how often it runs, what is recomputed
    /// and at what cost (core/explain.hpp).
    [[nodiscard]] std::string explain() const {
        ExplainOptions options = front_.explain_options(current_->executor);
        options.reference_time = store_all_time();
        return plan().explain(problem(), options);
    }
    /// The budget in bytes of the current plan, and the policy it came from.
    [[nodiscard]] Bytes budget() const noexcept { return current_->budget; }
    [[nodiscard]] const BudgetSpec& budget_spec() const noexcept { return budget_; }
    /// P_ref and T_ref of docs/formats.md §4 (store-all reference) for the current shape.
    [[nodiscard]] Bytes store_all_peak() const noexcept { return current_->reference.peak; }
    [[nodiscard]] double store_all_time() const noexcept { return current_->reference.time; }
    /// What the last completed step measured.
    [[nodiscard]] const StepReport& last_report() const noexcept { return *last_report_; }
    [[nodiscard]] const S& solver() const noexcept { return solver_; }
    [[nodiscard]] std::size_t cached_shapes() const noexcept { return cache_.size(); }
    [[nodiscard]] const FrontEnd& front_end() const noexcept { return front_; }

    // What some front ends have.
    [[nodiscard]] const auto& chain() const noexcept requires requires(const Executor& e) { e.chain(); } {
        return current_->executor.chain();
    }
    [[nodiscard]] const auto& profile() const noexcept requires requires(const Executor& e) { e.profile(); } {
        return current_->executor.profile();
    }
    [[nodiscard]] const auto& stages() const noexcept requires requires(const FrontEnd& f) { f.stages(); } {
        return front_.stages();
    }
    [[nodiscard]] const auto& capture() const noexcept requires requires(const Executor& e) { e.capture(); } {
        return current_->executor.capture();
    }
    [[nodiscard]] const auto& module() const noexcept requires requires(const FrontEnd& f) { f.module(); } {
        return front_.module();
    }

private:
    struct Compiled {
        Executor executor;
        Reference reference;
        Bytes budget;
        PreparedPlan plan;
    };

    void say(const std::string& line) const {
        if (options_.progress)
            options_.progress(line);
        else
            std::cerr << line << '\n';
    }

    [[nodiscard]] std::shared_ptr<Compiled> compile(const Arguments& sample, const BudgetSpec& budget) const {
        return plan(front_.compile(sample, options_, probe_), budget);
    }

    [[nodiscard]] std::shared_ptr<Compiled> plan(const Executor& executor, const BudgetSpec& budget) const {
        const Problem& problem = executor.problem();
        Reference reference = store_all_reference(problem);
        const BudgetSpec spec = budget.counts == BudgetSpec::Counts::total
                                    ? budget.with_resident(resident_training_bytes(
                                          this->parameters(), front_.state_buffers(*this),
                                          options_.optimizer_state_per_parameter))
                                    : budget;
        BudgetedPlan planned = plan_within(solver_, problem, spec, reference.peak, [this](const std::string& l) { say(l); });
        PreparedPlan prepared = executor.prepare(std::move(planned.plan));
        if (options_.progress) {
            std::ostringstream line;
            const double overhead = reference.time > 0 ? prepared.predicted_time() / reference.time - 1 : 0.0;
            line << "remat: " << front_.describe(executor) << ": store-all peak " << format_bytes(reference.peak)
                 << ", budget " << format_bytes(planned.budget) << ", " << solver_.name() << " plan peak "
                 << format_bytes(prepared.predicted_peak()) << ", predicted overhead " << overhead * 100 << " %";
            say(line.str());
        }
        return std::make_shared<Compiled>(Compiled{executor, std::move(reference), planned.budget, std::move(prepared)});
    }

    [[nodiscard]] std::shared_ptr<Compiled> plan_for(const Arguments& arguments) {
        if (front_.fits(current_->executor, arguments)) return current_;
        front_.check_devices(arguments);
        for (const auto& c : cache_)
            if (front_.fits(c->executor, arguments)) return current_ = c;
        if (options_.on_new_shape == ShapePolicy::reject) throw InvalidInput(front_.mismatch(current_->executor, arguments));
        current_ = compile(arguments, budget_);
        cache_.push_back(current_);
        if (cache_.size() > std::max<std::size_t>(options_.max_cached_shapes, 1)) cache_.erase(cache_.begin());
        return current_;
    }

    FrontEnd front_;
    BudgetSpec budget_;
    S solver_;
    Options options_;
    Probe probe_;
    std::shared_ptr<StepReport> last_report_;
    std::shared_ptr<const GradientHooks> gradient_hooks_;
    std::shared_ptr<Compiled> current_;
    std::vector<std::shared_ptr<Compiled>> cache_;
};

}  // namespace remat::torch
