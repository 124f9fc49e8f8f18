// remat/torch/script.hpp — op-level capture of a TorchScript module into a remat.problem/1
// problem, with the executable table of its ops.
//
// Rockmate (Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, ICML 2023) and Checkmate
// (Jain et al., MLSys 2020) plan on the graph of a model's forward and backward operations.
// capture_script() builds that graph from a torch::jit::Module — written in C++ with
// Module::define, or saved from Python (torch.jit.script or torch.jit.trace) and loaded with
// torch::jit::load — on example inputs, in five phases, each in its own header
// (docs/design.md §5, capture):
//   1. capture/interpret.hpp    run the inlined forward graph once, node by node; evaluate and
//                               freeze everything that is not tensor work (constants, shapes,
//                               branches, loops, strings, containers); rewrite in-place ops
//                               on activations out of place; keep buffer updates as effects;
//   2. capture/group.hpp        fold views, cheap ops and parameter-only values into the ops
//                               that consume them; order the ops; compile their programs;
//   3. capture/profile_ops.hpp  measure bytes, overheads, times, randomness, buffer updates
//                               and what each backward really reads, with the executor's own
//                               primitives under a memory probe (docs/design.md §1, principle 2);
//   4. capture/problem_builder.hpp  write the problem: per op F:G, F+:G (with saved state
//                               s:G) and B:G (exactly once), gradient contributions g:X<G;
//   5. capture/verify.hpp       replay the step with the store-all plan and compare it with
//                               plain autograd (capture/reference.hpp) from the same random
//                               state: outputs, loss and every parameter gradient.
// The captured graph is specialised to the example inputs' shapes, like tracing: plans are
// valid for inputs of the same shapes, dtypes and devices, in the same training mode.
// A construct no rematerialization can keep (control flow on tensor values, in-place updates
// of parameters or graph inputs) throws remat::InvalidInput naming the node and its source
// line; a capture never guesses, and never drops a parameter's gradient.
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/inliner.h>

#include "../core/errors.hpp"
#include "capture/captured.hpp"
#include "capture/group.hpp"
#include "capture/interpret.hpp"
#include "capture/options.hpp"
#include "capture/problem_builder.hpp"
#include "capture/profile_ops.hpp"
#include "capture/program.hpp"
#include "capture/reference.hpp"
#include "capture/trace.hpp"
#include "capture/verify.hpp"
#include "detail/runtime.hpp"
#include "memory.hpp"

namespace remat::torch {

namespace detail::capture {

/// Puts the module's buffers and the random generators back on exit: capture leaves no trace.
class StateGuard {
public:
    StateGuard(std::vector<at::Tensor> buffers, const c10::Device& device)
        : buffers_(std::move(buffers)), snapshot_(buffers_), rng_(RngState::capture(device)) {}
    ~StateGuard() {
        snapshot_.restore(buffers_);
        rng_.restore();
    }
    StateGuard(const StateGuard&) = delete;
    StateGuard& operator=(const StateGuard&) = delete;
    /// Puts the buffers back now (after the interpreting run changed them).
    void restore_buffers() const { snapshot_.restore(buffers_); }
    /// Puts the buffers and the generators back now: the state capture started from.
    void restore() const {
        snapshot_.restore(buffers_);
        rng_.restore();
    }

private:
    std::vector<at::Tensor> buffers_;
    BufferSnapshot snapshot_;
    RngState rng_;
};

[[nodiscard]] inline c10::Device device_of(const std::vector<c10::IValue>& inputs) {
    for (const c10::IValue& v : inputs) {
        std::vector<at::Tensor> tensors;
        tensors_in(v, tensors);
        for (const at::Tensor& t : tensors)
            if (t.defined()) return t.device();
    }
    return c10::Device(c10::DeviceType::CPU);
}

[[nodiscard]] inline std::shared_ptr<Core> new_core(const jit::Module& module, const CaptureOptions& options,
                                                    const std::string& who) {
    if (!module.find_method("forward")) throw InvalidInput(who + ": the module has no forward method");
    auto core = std::make_shared<Core>();
    core->module = module;
    core->name = options.name;
    core->training = module.is_training();
    core->graph = module.get_method("forward").graph()->copy();
    jit::Inline(*core->graph);
    return core;
}

/// What interpretation found that the executor keeps.
inline void keep_trace(Core& core, const Trace& trace) {
    core.parameters = trace.parameters;
    core.parameter_names = trace.parameter_names;
    core.inputs = trace.inputs;
    core.input_trees = trace.input_trees;
    core.frozen.assign(trace.values.size(), c10::IValue());
    for (std::size_t i = 0; i < trace.values.size(); ++i)
        if (trace.values[i].category == Category::constant) core.frozen[i] = trace.values[i].value;
}

}  // namespace detail::capture

/// Captures `module` (its forward method) on example arguments — tensors, or tuples, lists
/// and dicts of them, one per forward argument — into an op-level problem, profiled with
/// `probe`. The module's parameters, gradients, buffers and random generators are left as
/// they were. Throws InvalidInput for what capture cannot plan, naming the node and its
/// source line.
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ScriptCapture capture_script(const ::torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                                           const CaptureOptions& options = {}, Probe probe = Probe{}) {
    using namespace detail::capture;
    if (options.repeats == 0) throw InvalidInput("capture_script: repeats must be at least 1");
    const auto start = detail::Clock::now();
    const std::string who = "capture of '" + options.name + "'";
    const std::shared_ptr<Core> core = new_core(module, options, who);
    core->device = device_of(inputs);
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& b : core->module.buffers(true))
        if (b.defined()) buffers.push_back(b);
    const StateGuard guard(buffers, core->device);
    auto phase_start = detail::Clock::now();
    const auto phase_done = [&](const std::string& what) {
        report_progress(options.progress, "remat: " + who + ": " + what + " in " +
                                              std::to_string(detail::seconds_since(phase_start)) + " s");
        phase_start = detail::Clock::now();
    };
    const Trace trace = Interpreter(core->module, core->graph, inputs, options, who).run();
    guard.restore_buffers();
    keep_trace(*core, trace);
    phase_done("interpreted the graph");
    Grouping grouping = Grouper(trace, who).run();
    core->groups = std::move(grouping.groups);
    core->output_tree = grouping.output_tree;
    phase_done("grouped " + std::to_string(core->groups.size()) + " ops");
    // Plain autograd from the state interpretation started from: the reference of the
    // gradient coverage check and of the replay check.
    guard.restore();
    const ReferenceStep reference =
        reference_step(core->module, core->output_tree, trace.arguments, core->parameters, who);
    guard.restore();
    phase_done("ran plain autograd");
    Profile profile = Profiler<Probe>(*core, trace, grouping, reference.parameter_grads, options, probe, who).run();
    phase_done("profiled the ops");
    ProblemWriter(*core, trace, grouping, profile, who).run();
    phase_done("built the problem");
    ScriptCapture capture(core);
    if (options.verify_replay) {
        verify_replay(capture, trace, trace.arguments, reference, [&guard] { guard.restore(); }, options.replay_tolerance,
                      probe, who);
        phase_done("checked the store-all replay against plain autograd");
    }
    core->seconds = detail::seconds_since(start);
    return capture;
}

/// The same, for a forward whose arguments are all tensors.
template <std::ranges::input_range Tensors, MemoryProbe Probe = CpuMemoryProbe>
    requires std::same_as<std::ranges::range_value_t<Tensors>, at::Tensor>
[[nodiscard]] ScriptCapture capture_script(const ::torch::jit::Module& module, const Tensors& inputs,
                                           const CaptureOptions& options = {}, Probe probe = Probe{}) {
    const std::vector<c10::IValue> arguments(std::ranges::begin(inputs), std::ranges::end(inputs));
    return capture_script<Probe>(module, arguments, options, std::move(probe));
}

}  // namespace remat::torch
