// remat/torch/detail/step_capsule.hpp — carries a planned step from a custom autograd
// Function's forward to its backward.
//
// The drop-in module (module.hpp) and ScriptExecutor::forward (graph_executor.hpp) run a
// plan's forward phase inside a torch::autograd::Function and the rest of the plan when
// autograd calls its backward (docs/design.md §6 (execution engine), "Autograd integration"). The step in between
// is no tensor, so it travels in the context's saved_data as a capsule; the backward takes
// it out, which is how a second backward through the same forward is recognised and refused
// (the step has freed its activations by then).
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../../core/errors.hpp"

namespace remat::torch::detail {

/// A step under way, and where to leave its report once its backward has run (the caller's
/// last_report, say); `report` may be null.
template <class Step>
struct StepHandle {
    using Report = std::remove_cvref_t<decltype(std::declval<const Step&>().report())>;
    std::shared_ptr<Step> step;
    std::shared_ptr<Report> report;

    /// Runs the rest of the plan (the gradients come from autograd) and hands the report over.
    template <class Grads>
    auto backward(Grads&& grads) const {
        auto gradients = step->backward(std::forward<Grads>(grads), /*from_autograd=*/true);
        if (report) *report = step->report();
        return gradients;
    }
};

template <class Step>
struct StepCapsule : ::torch::CustomClassHolder {
    explicit StepCapsule(StepHandle<Step> h) : handle(std::move(h)) {}
    StepHandle<Step> handle;
};

/// Keeps the step in the autograd context under `key`, for the Function's backward.
template <class Step>
void stash_step(::torch::autograd::AutogradContext* ctx, const char* key, StepHandle<Step> handle) {
    ctx->saved_data[key] = at::IValue::make_capsule(
        c10::intrusive_ptr<::torch::CustomClassHolder>(c10::make_intrusive<StepCapsule<Step>>(std::move(handle))));
}

/// Takes the step back out of the autograd context; `owner` names the caller in the error
/// for a second backward through the same forward.
template <class Step>
[[nodiscard]] StepHandle<Step> take_step(::torch::autograd::AutogradContext* ctx, const char* key,
                                         const std::string& owner) {
    const auto found = ctx->saved_data.find(key);
    if (found == ctx->saved_data.end())
        throw ExecutionError(owner + ": backward through the same forward twice; a planned step frees its "
                                     "activations as it goes, so call forward() again for another backward");
    StepHandle<Step> handle = std::move(static_cast<StepCapsule<Step>*>(found->second.toCapsule().get())->handle);
    ctx->saved_data.erase(found);
    return handle;
}

}  // namespace remat::torch::detail
