// remat/torch/capture/reference.hpp — the plain autograd step that capture checks itself
// against: the module's forward, interpreted node by node with autograd on, a loss that
// weighs every differentiable output, and the parameters' gradients.
//
// The forward runs on an inlined copy of its graph through TorchScript's interpreter
// (jit::Code, jit::InterpreterState), never through the module's own graph executor, for two
// reasons (docs/design.md §5, capture, "the reference step"):
//   - calling the module changes what the module does next. TorchScript's graph executor
//     profiles the first call of a method and optimizes the later ones; in training mode the
//     optimized graph replaces dropout with its autodiff formula (native_dropout), which draws
//     random numbers even at p = 0, where eager PyTorch's dropout returns its input and draws
//     none. A capture that called forward would switch the user's next calls to that other
//     random stream (it did: remat 0.x before issue 21);
//   - the interpreter runs the operators themselves, in the module's order: eager PyTorch's
//     step, the one remat reproduces bit for bit.
// The loss is Σ_o Σ(output_o · w_o) with weights drawn from a private generator, so that
// every output element matters and the caller's random sequence is not touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include "../../core/errors.hpp"
#include "../detail/runtime.hpp"
#include "program.hpp"

namespace remat::torch::detail::capture {

/// The weights of the reference loss: one tensor per output leaf that is floating point and
/// requires grad (undefined for the others), drawn from a generator of their own.
[[nodiscard]] inline std::vector<at::Tensor> loss_weights(const std::vector<at::Tensor>& outputs) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(0x5eed);
    std::vector<at::Tensor> weights(outputs.size());
    const at::NoGradGuard no_grad;
    for (std::size_t o = 0; o < outputs.size(); ++o) {
        const at::Tensor& out = outputs[o];
        if (!out.defined() || !out.requires_grad() || !out.is_floating_point()) continue;
        weights[o] = at::randn(out.sizes(), generator, at::TensorOptions().dtype(out.scalar_type())).to(out.device());
    }
    return weights;
}

/// Σ_o Σ(outputs_o · weights_o), in double precision.
[[nodiscard]] inline at::Tensor weighted_loss(const std::vector<at::Tensor>& outputs,
                                              const std::vector<at::Tensor>& weights) {
    at::Tensor total;
    for (std::size_t o = 0; o < outputs.size(); ++o) {
        if (!weights[o].defined()) continue;
        const at::Tensor term = (outputs[o] * weights[o]).sum().to(at::kDouble);
        total = total.defined() ? total + term : term;
    }
    return total;
}

/// One plain autograd step: the outputs (flattened like the capture's output tree), the
/// loss weights and the loss, and each parameter's gradient (undefined when autograd gives
/// it none).
struct ReferenceStep {
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> weights;
    at::Tensor loss;
    std::vector<at::Tensor> parameter_grads;
};

/// Runs `module`'s forward on `sample` through the interpreter, with autograd on, from the
/// generators' current state, and differentiates the weighted loss with respect to
/// `parameters`. Changes buffers and the generators, as a training step does.
[[nodiscard]] inline ReferenceStep reference_step(const jit::Module& module, const ValueTree& output_tree,
                                                  const std::vector<c10::IValue>& sample,
                                                  const std::vector<at::Tensor>& parameters, const std::string& who) {
    std::shared_ptr<jit::Graph> graph = module.get_method("forward").graph()->copy();
    jit::Inline(*graph);
    const jit::Code code(graph, "forward");
    jit::InterpreterState interpreter(code);
    ReferenceStep step;
    {
        const ::torch::autograd::AutoGradMode grad_mode(true);
        jit::Stack stack;
        stack.emplace_back(module._ivalue());
        for (const c10::IValue& v : sample) stack.push_back(v);
        try {
            interpreter.run(stack);
        } catch (const std::exception& e) {
            throw InvalidInput(who + ": plain autograd (the module's forward, interpreted) failed on the example inputs: " +
                               error_message(e));
        }
        if (stack.size() != 1)
            throw InvalidInput(who + ": the module's forward returned " + std::to_string(stack.size()) + " values");
        flatten(output_tree, stack.back(), step.outputs, "the module's result");
        step.weights = loss_weights(step.outputs);
        step.loss = weighted_loss(step.outputs, step.weights);
    }
    step.parameter_grads.assign(parameters.size(), at::Tensor());
    if (step.loss.defined() && step.loss.requires_grad() && !parameters.empty()) {
        try {
            step.parameter_grads = ::torch::autograd::grad({step.loss}, parameters, {}, /*retain_graph=*/false,
                                                           /*create_graph=*/false, /*allow_unused=*/true);
        } catch (const std::exception& e) {
            // The module's own backward fails (an in-place op overwrote what another op saved for
            // its gradient): it does not train in eager PyTorch either, remat or not.
            throw InvalidInput(who + ": plain autograd's backward (the module's forward, interpreted, then the "
                                     "gradient of a loss over its outputs) failed on the example inputs, so the "
                                     "module does not train as it is, with or without remat: " +
                               error_message(e));
        }
    }
    if (step.loss.defined()) step.loss = step.loss.detach();
    for (at::Tensor& out : step.outputs)
        if (out.defined()) out = out.detach();
    return step;
}

}  // namespace remat::torch::detail::capture
