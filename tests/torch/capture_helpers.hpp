// Helpers of the capture tests (test_torch_capture*.cpp): small TorchScript modules, plain
// autograd references, and the check that a plan's step equals plain autograd in outputs,
// loss and every gradient, with measured memory within the simulator's.
#pragma once

#include <catch2/catch.hpp>

#include <ATen/Parallel.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/solvers/store_all.hpp"
#include "remat/torch/graph_executor.hpp"
#include "remat/torch/script.hpp"

namespace capture_test {

using remat::Bytes;
using remat::torch::capture_script;
using remat::torch::CaptureOptions;
using remat::torch::ScriptCapture;
using remat::torch::ScriptExecutor;
using Loss = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

inline CaptureOptions quick(const std::string& name) {
    at::set_num_threads(1);  // steady op times (docs/design.md §8, LibTorch notes)
    CaptureOptions o;
    o.name = name;
    o.repeats = 1;
    o.warmup = 0;
    return o;
}

inline torch::jit::Module make_module(const std::string& type, const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                               const std::string& source) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    for (const auto& [name, value] : parameters) m.register_parameter(name, value.clone().requires_grad_(true), false);
    m.define(source);
    return m;
}

// Dropout in place on an activation autograd does not save (a product by a scalar), as
// nn.Dropout(inplace=True) runs it: forward(x: [N, 64]) -> [N, 64].
inline torch::jit::Module in_place_dropout_module() {
    return make_module("InPlaceDropout", {{"w1", at::randn({64, 64}) * 0.125}, {"w2", at::randn({64, 64}) * 0.125}},
                       "def forward(self, x):\n"
                       "    h = torch.linear(x, self.w1) * 2.0\n"
                       "    h = torch.dropout_(h, 0.3, True)\n"
                       "    return torch.linear(torch.relu(h), self.w2)\n");
}

inline std::vector<at::Tensor> flatten_output(const c10::IValue& v) {
    std::vector<at::Tensor> out;
    std::function<void(const c10::IValue&)> walk = [&](const c10::IValue& x) {
        if (x.isTensor())
            out.push_back(x.toTensor());
        else if (x.isTuple())
            for (const auto& e : x.toTupleRef().elements()) walk(e);
        else if (x.isList())
            for (const auto& e : x.toListRef()) walk(e);
        else if (x.isGenericDict())
            for (const auto& e : x.toGenericDict()) walk(e.value());
    };
    walk(v);
    return out;
}

inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
    if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : 1e30;
    if (a.sizes() != b.sizes()) return 1e30;
    if (a.numel() == 0) return 0.0;
    // Equal elements differ by 0, infinities included (an attention mask's -inf).
    const at::Tensor x = a.to(at::kDouble);
    const at::Tensor y = b.to(at::kDouble);
    return at::where(x == y, at::zeros_like(x), x - y).abs().max().item<double>();
}

// Largest difference relative to the largest magnitude of `b` (gradient contributions may
// be summed in another order than autograd's).
inline double relative_diff(const at::Tensor& a, const at::Tensor& b) {
    const double d = max_diff(a, b);
    if (!b.defined() || b.numel() == 0 || d >= 1e30) return d;
    return d / std::max(1.0, b.to(at::kDouble).abs().max().item<double>());
}

// Gradients of every parameter (cloned) and of the inputs, and .grad reset.
struct Grads {
    std::vector<at::Tensor> parameters;
    std::vector<at::Tensor> inputs;
};

inline Grads take_grads(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& inputs) {
    Grads g;
    for (const at::Tensor& p : parameters) {
        g.parameters.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
        p.mutable_grad() = at::Tensor();
    }
    for (const at::Tensor& x : inputs) {
        g.inputs.push_back(x.grad().defined() ? x.grad().clone() : at::Tensor());
        if (x.requires_grad()) x.mutable_grad() = at::Tensor();
    }
    return g;
}

struct Plain {
    c10::IValue output;
    at::Tensor loss;
    Grads grads;
};

// module.forward(arguments) + loss + backward, from a given seed; `leaves` are the input
// tensors whose gradients are taken. The graph executor's optimizations are off: they
// differentiate fused regions with TorchScript's own formulas, which round differently from
// the operators' autograd (the eager reference capture reproduces bit for bit).
inline Plain plain_step_args(torch::jit::Module& m, const std::vector<c10::IValue>& arguments,
                             const std::vector<at::Tensor>& leaves, const Loss& loss,
                             const std::vector<at::Tensor>& parameters, std::uint64_t seed) {
    const torch::jit::GraphOptimizerEnabledGuard eager(false);
    at::manual_seed(seed);
    Plain r;
    r.output = m.forward(arguments);
    r.loss = loss(flatten_output(r.output));
    r.loss.backward();
    r.loss = r.loss.detach();
    r.grads = take_grads(parameters, leaves);
    return r;
}

inline Plain plain_step(torch::jit::Module& m, const std::vector<at::Tensor>& inputs, const Loss& loss,
                        const std::vector<at::Tensor>& parameters, std::uint64_t seed) {
    return plain_step_args(m, std::vector<c10::IValue>(inputs.begin(), inputs.end()), inputs, loss, parameters, seed);
}

inline void require_same_grads(const Grads& a, const Grads& b, double tolerance) {
    REQUIRE(a.parameters.size() == b.parameters.size());
    for (std::size_t i = 0; i < a.parameters.size(); ++i) {
        INFO("parameter " << i);
        REQUIRE(a.parameters[i].defined() == b.parameters[i].defined());
        CHECK(relative_diff(b.parameters[i], a.parameters[i]) <= tolerance);
    }
    for (std::size_t i = 0; i < a.inputs.size(); ++i) {
        INFO("input " << i);
        REQUIRE(a.inputs[i].defined() == b.inputs[i].defined());
        CHECK(relative_diff(b.inputs[i], a.inputs[i]) <= tolerance);
    }
}

// Runs `plan` through ScriptExecutor::step and checks outputs, loss and every gradient
// against plain autograd from the same seed; returns the step's report.
template <class Probe = remat::torch::CpuMemoryProbe>
remat::torch::StepReport check_against_plain_args(torch::jit::Module& m, const ScriptCapture& cap,
                                                         const ScriptExecutor<Probe>& ex, const remat::Plan& plan,
                                                         const std::vector<c10::IValue>& arguments, const Loss& loss,
                                                         double tolerance = 0.0) {
    const auto& params = cap.parameters();
    const std::vector<at::Tensor> inputs = cap.input_tensors(arguments);
    // Both steps start from the same buffers: a plain step updates them (batch norm's
    // statistics, spectral norm's power iteration, whose output reads what it updates).
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& b : m.buffers()) buffers.push_back(b);
    std::vector<at::Tensor> buffers_before;
    for (const at::Tensor& b : buffers) buffers_before.push_back(b.clone());
    const Plain ref = plain_step_args(m, arguments, inputs, loss, params, 1234);
    std::vector<at::Tensor> buffers_after_plain;
    for (std::size_t i = 0; i < buffers.size(); ++i) {
        buffers_after_plain.push_back(buffers[i].clone());
        const at::NoGradGuard no_grad;
        buffers[i].copy_(buffers_before[i]);
    }
    const auto prepared = ex.prepare(plan);
    at::manual_seed(1234);
    const auto result = ex.step(prepared, inputs, loss);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
        INFO("buffer " << i);
        CHECK(relative_diff(buffers[i], buffers_after_plain[i]) <= tolerance);
    }
    Grads got = take_grads(params, inputs);
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i].requires_grad()) got.inputs[i] = result.input_grads[i];
    const auto ref_outputs = flatten_output(ref.output);
    REQUIRE(ref_outputs.size() == result.outputs.size());
    for (std::size_t o = 0; o < ref_outputs.size(); ++o) CHECK(relative_diff(result.outputs[o], ref_outputs[o]) <= tolerance);
    CHECK(relative_diff(result.loss, ref.loss) <= tolerance);
    require_same_grads(ref.grads, got, tolerance);
    // Frees really free: at no step does the measured memory exceed the simulator's.
    const auto& timeline = prepared.simulation().timeline;
    REQUIRE(result.report.measured_timeline.size() == timeline.size());
    Bytes worst = 0;
    for (std::size_t i = 0; i < timeline.size(); ++i)
        if (result.report.measured_timeline[i] >= 0)
            worst = std::max(worst, result.report.measured_timeline[i] - timeline[i].during);
    // Exact on the CPU's tracking allocator. On a GPU, step by step, the tolerance these
    // checks passed on an H100 (1 % plus 2 KiB; the caching allocator rounds every block).
    const Bytes slack = std::is_same_v<Probe, remat::torch::CpuMemoryProbe> ? 0 : 2048 + prepared.predicted_peak() / 100;
    INFO("the largest excess of an op's measured memory over its prediction: " << worst << " B");
    CHECK(worst <= slack);
    return result.report;
}

template <class Probe = remat::torch::CpuMemoryProbe>
remat::torch::StepReport check_against_plain(torch::jit::Module& m, const ScriptCapture& cap,
                                                    const ScriptExecutor<Probe>& ex, const remat::Plan& plan,
                                                    const std::vector<at::Tensor>& inputs, const Loss& loss,
                                                    double tolerance = 0.0) {
    return check_against_plain_args(m, cap, ex, plan, std::vector<c10::IValue>(inputs.begin(), inputs.end()), loss,
                                     tolerance);
}

inline remat::Plan store_all(const ScriptCapture& cap) { return remat::StoreAll{}.solve(cap.problem(), Bytes{1} << 50); }

inline Loss sum_of_squares() {
    return [](const std::vector<at::Tensor>& outs) {
        at::Tensor total = at::zeros({}, at::kDouble);
        for (std::size_t i = 0; i < outs.size(); ++i)
            if (outs[i].is_floating_point()) total = total + (outs[i] * outs[i]).sum().to(at::kDouble) * double(i + 1);
        return total;
    };
}

// Every forward without grad first; then, op by op from the last, its forward again with grad
// and its backward: each op runs twice, outputs are overwritten by their recomputation.
inline remat::Plan recompute_all(const ScriptCapture& cap) {
    const remat::Problem& p = cap.problem();
    remat::Schedule s;
    for (const auto& op : cap.ops()) s.push_back(remat::Step::run(p.op_id("F:" + op.name)));
    s.push_back(remat::Step::run(*p.loss()));
    for (auto it = cap.ops().rbegin(); it != cap.ops().rend(); ++it) {
        if (!it->has_backward) continue;
        s.push_back(remat::Step::run(p.op_id("F+:" + it->name)));
        s.push_back(remat::Step::run(p.op_id("B:" + it->name)));
        s.push_back(remat::Step::free(p.data_id("s:" + it->name)));
    }
    const remat::SimulationReport r = remat::simulate(p, s);
    REQUIRE(r.valid);
    remat::Plan plan;
    plan.schedule = std::move(s);
    plan.time = r.time;
    plan.peak = r.peak;
    plan.budget = r.peak;
    return plan;
}

inline std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const remat::InvalidInput& e) {
        return e.what();
    }
    return "no InvalidInput thrown";
}

inline const remat::torch::CapturedOp* find_op(const ScriptCapture& cap, const std::string& prefix) {
    for (const auto& op : cap.ops())
        if (op.name.rfind(prefix, 0) == 0) return &op;
    return nullptr;
}

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

// A recompute-all plan in which the forward of `op` (an op with no backward) also runs again
// right after the loss, its output freed there: a recomputation after every op's first run.
inline remat::Plan rerun_after_loss(const ScriptCapture& cap, const std::string& op) {
    const remat::Problem& problem = cap.problem();
    remat::Schedule s = recompute_all(cap).schedule;
    const auto loss_step =
        std::find_if(s.begin(), s.end(), [&](const remat::Step& step) { return !step.is_free() && step.op() == *problem.loss(); });
    REQUIRE(loss_step != s.end());
    s.insert(std::next(loss_step), {remat::Step::free(problem.data_id(op)), remat::Step::run(problem.op_id("F:" + op))});
    REQUIRE(remat::simulate(problem, s).valid);
    return remat::hand_written_plan(std::move(s));
}

}  // namespace capture_test
