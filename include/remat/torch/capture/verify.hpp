// remat/torch/capture/verify.hpp — phase 5 of capture: the captured step, replayed once with
// the store-all plan, must be plain autograd's step.
//
// remat promises the outputs and gradients of plain autograd (docs/design.md §5, capture,
// "the replay check"). Capture checks that promise on the example inputs before anyone trains
// with it: from the generators' state at the start of capture, it replays the captured step
// with the store-all plan through the executor (graph_executor.hpp) and compares the outputs,
// the loss and every parameter gradient with the reference step (reference.hpp) run from the
// same state. A difference beyond float noise (CaptureOptions::replay_tolerance) refuses the
// capture with an InvalidInput naming the first op whose forward output differs from the
// module's own values (the forward values interpretation recorded, from the same state),
// or, when every forward output agrees, the first parameter whose gradient differs. The
// buffers and generators are put back by capture_script afterwards.
//
// Cost: one reference step and one store-all step on the example inputs — about two training
// steps — plus, only when they differ, one forward to find the op. CaptureOptions::verify_replay
// turns it off.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../../core/errors.hpp"
#include "../../solvers/store_all.hpp"
#include "../graph_executor.hpp"
#include "../memory.hpp"
#include "captured.hpp"
#include "options.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "trace.hpp"

namespace remat::torch::detail::capture {

/// How far `got` is from `expected`: the largest absolute difference over the largest
/// absolute value of `expected` (1 when one is defined and the other not, or shapes differ).
[[nodiscard]] inline double relative_difference(const at::Tensor& got, const at::Tensor& expected) {
    if (got.defined() != expected.defined()) return 1.0;
    if (!got.defined()) return 0.0;
    if (got.sizes() != expected.sizes()) return 1.0;
    if (got.numel() == 0) return 0.0;
    const at::NoGradGuard no_grad;
    const at::Tensor a = got.detach().to(at::kDouble).cpu();
    const at::Tensor b = expected.detach().to(at::kDouble).cpu();
    const double worst = (a - b).abs().max().item<double>();
    if (worst == 0.0) return 0.0;
    if (!std::isfinite(worst)) return std::numeric_limits<double>::infinity();
    const double scale = b.abs().max().item<double>();
    return scale > 0.0 ? worst / scale : worst;
}

/// What the replay check found: empty when the replay is plain autograd's step.
struct ReplayDifference {
    std::string what;  ///< "output 0", "the loss", "the gradient of parameter 'w'"
    double relative = 0.0;
    [[nodiscard]] bool found() const noexcept { return !what.empty(); }
};

/// The first of the outputs, the loss and the parameter gradients that differs beyond
/// `tolerance` between the replayed step and the reference.
[[nodiscard]] inline ReplayDifference first_difference(const std::vector<at::Tensor>& outputs, const at::Tensor& loss,
                                                       const std::vector<at::Tensor>& parameter_grads,
                                                       const ReferenceStep& reference,
                                                       const std::vector<std::string>& parameter_names,
                                                       double tolerance) {
    for (std::size_t o = 0; o < reference.outputs.size() && o < outputs.size(); ++o)
        if (const double d = relative_difference(outputs[o], reference.outputs[o]); d > tolerance)
            return {"output " + std::to_string(o), d};
    if (const double d = relative_difference(loss, reference.loss); d > tolerance) return {"the loss", d};
    for (std::size_t p = 0; p < reference.parameter_grads.size() && p < parameter_grads.size(); ++p)
        if (const double d = relative_difference(parameter_grads[p], reference.parameter_grads[p]); d > tolerance)
            return {"the gradient of parameter '" + parameter_names.at(p) + "'", d};
    return {};
}

/// The first op (in the captured order) whose forward, run without grad from the generators'
/// current state on the outputs of the ops before it, gives another value than the module's
/// own forward recorded in `trace` from the same state; nullopt when all agree.
[[nodiscard]] inline std::optional<std::size_t> first_differing_op(const Core& core, const Trace& trace,
                                                                   double tolerance) {
    std::unordered_map<std::size_t, at::Tensor> computed;  // value id → the replay's tensor
    for (const std::size_t id : trace.input_leaves) computed[id] = trace.values[id].value.toTensor();
    for (std::size_t k = 0; k < core.groups.size(); ++k) {
        const Group& g = core.groups[k];
        std::vector<at::Tensor> inputs;
        inputs.reserve(g.inputs.size());
        for (const std::size_t id : g.inputs) {
            const auto found = computed.find(id);
            inputs.push_back(found != computed.end() ? found->second : trace.values[id].value.toTensor());
        }
        const std::vector<at::Tensor> outputs = run_no_grad(core, g, inputs);
        for (std::size_t o = 0; o < g.outputs.size() && o < outputs.size(); ++o) {
            const c10::IValue& recorded = trace.values[g.outputs[o]].value;
            if (recorded.isTensor() && relative_difference(outputs[o], recorded.toTensor()) > tolerance) return k;
            computed[g.outputs[o]] = outputs[o];
        }
    }
    return std::nullopt;
}

/// Replays the captured step with the store-all plan from the state `reset_state` puts back
/// (the one the reference and interpretation started from) and compares it with `reference`.
/// Throws InvalidInput naming the first differing op (or output, loss or gradient).
template <MemoryProbe Probe>
void verify_replay(const ScriptCapture& capture, const Trace& trace, const std::vector<c10::IValue>& sample,
                   const ReferenceStep& reference, const std::function<void()>& reset_state, double tolerance,
                   Probe probe, const std::string& who) {
    const Core& core = *capture.core();
    reset_state();
    const ScriptExecutor<Probe> executor(capture, std::move(probe));
    const ScriptPlan plan = executor.prepare(StoreAll{}.solve(capture.problem(), Bytes{1} << 62));
    ScriptStep<Probe> step = executor.start(plan, capture.input_tensors(sample));
    const std::vector<at::Tensor> outputs = step.forward();
    std::vector<at::Tensor> weights = reference.weights;
    weights.resize(outputs.size());
    at::Tensor loss;
    {
        const at::NoGradGuard no_grad;
        loss = weighted_loss(outputs, weights);
    }
    const ScriptGradients gradients = step.backward(weights);
    const ReplayDifference difference =
        first_difference(outputs, loss, gradients.parameters, reference, core.parameter_names, tolerance);
    if (!difference.found()) return;
    reset_state();
    const std::optional<std::size_t> op = first_differing_op(core, trace, tolerance);
    std::ostringstream message;
    message << who << ": the captured step differs from plain autograd on the example inputs (" << difference.what
            << " differs by " << difference.relative << " relative to its largest value, tolerance " << tolerance
            << "): ";
    if (op)
        message << "op '" << core.groups[*op].name << "' (root node " << core.groups[*op].where
                << ") is the first whose output differs from the module's own forward";
    else
        message << "every op's forward output equals the module's own; the difference is in the backward";
    message << ". This is a bug in capture: please report it with the model. To train anyway, set "
               "CaptureOptions::verify_replay = false";
    throw InvalidInput(message.str());
}

}  // namespace remat::torch::detail::capture
