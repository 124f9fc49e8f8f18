// remat/torch/capture/captured.hpp — ScriptCapture, the handle on a captured module: the
// problem every solver plans on, the per-op findings of capture, and the executable table
// the executor (graph_executor.hpp) runs. Made by capture_script() (script.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../../io/budget.hpp"
#include "program.hpp"

namespace remat::torch {

/// A captured, profiled module. Copies share the same capture.
class ScriptCapture {
public:
    explicit ScriptCapture(std::shared_ptr<const detail::capture::Core> core) : core_(std::move(core)) {}

    [[nodiscard]] const Problem& problem() const noexcept { return core_->problem; }
    /// One entry per op group, in the problem's forward order.
    [[nodiscard]] const std::vector<CapturedOp>& ops() const noexcept { return core_->info; }
    [[nodiscard]] const ::torch::jit::Module& module() const noexcept { return core_->module; }
    /// The module's trainable parameters, each once, in module order (the order the
    /// executor's gradients use), and their qualified names ("encoder.0.weight").
    [[nodiscard]] const std::vector<at::Tensor>& parameters() const noexcept { return core_->parameters; }
    [[nodiscard]] const std::vector<std::string>& parameter_names() const noexcept { return core_->parameter_names; }
    /// Number of tensors among forward's arguments (the leaves of tuples, lists and dicts).
    [[nodiscard]] std::size_t input_count() const noexcept { return core_->inputs.size(); }
    /// Number of tensors forward returns (the leaves of its result's structure).
    [[nodiscard]] std::size_t output_count() const noexcept { return core_->output_data.size(); }
    [[nodiscard]] bool training() const noexcept { return core_->training; }
    [[nodiscard]] double seconds() const noexcept { return core_->seconds; }

    /// Whether `inputs` (one tensor per input leaf) look like the example inputs (shapes,
    /// dtypes, devices): plans are valid for those only.
    [[nodiscard]] bool matches(const std::vector<at::Tensor>& inputs) const {
        if (inputs.size() != core_->inputs.size()) return false;
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            const auto& in = core_->inputs[i];
            const at::Tensor& t = inputs[i];
            if (!t.defined() || t.sizes().vec() != in.sizes || t.scalar_type() != in.dtype || t.device() != in.device)
                return false;
        }
        return true;
    }

    /// The tensor leaves of forward's arguments, in the order the executor takes them.
    /// Throws InvalidInput when an argument's structure or a constant in it differs from
    /// the example inputs.
    /// Arguments left out at the end take their default values, as at capture.
    [[nodiscard]] std::vector<at::Tensor> input_tensors(const std::vector<c10::IValue>& arguments) const {
        if (arguments.size() > core_->input_trees.size())
            throw InvalidInput("'" + core_->name + "' was captured with " + std::to_string(core_->input_trees.size()) +
                               " arguments, not " + std::to_string(arguments.size()));
        for (std::size_t i = arguments.size(); i < core_->input_trees.size(); ++i)
            if (core_->input_trees[i].kind != detail::capture::ValueTree::Kind::constant)
                throw InvalidInput("'" + core_->name + "' was captured with " +
                                   std::to_string(core_->input_trees.size()) + " arguments, not " +
                                   std::to_string(arguments.size()) + " (argument " + std::to_string(i) +
                                   " held tensors at capture)");
        std::vector<at::Tensor> leaves(core_->inputs.size());
        for (std::size_t i = 0; i < arguments.size(); ++i)
            detail::capture::flatten(core_->input_trees[i], arguments[i], leaves, "argument " + std::to_string(i));
        return leaves;
    }

    /// forward's arguments rebuilt around `tensors` (one per input leaf).
    [[nodiscard]] std::vector<c10::IValue> arguments(const std::vector<at::Tensor>& tensors) const {
        std::vector<c10::IValue> result;
        for (const auto& tree : core_->input_trees) result.push_back(detail::capture::pack(tree, tensors));
        return result;
    }

    /// The module's output structure (tuples, lists, dicts, constants) with `tensors` (one
    /// per output leaf, as the executor returns them) in place.
    [[nodiscard]] c10::IValue pack_outputs(const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != core_->output_data.size())
            throw InvalidInput("pack_outputs: " + std::to_string(tensors.size()) + " tensors for " +
                               std::to_string(core_->output_data.size()) + " outputs");
        return detail::capture::pack(core_->output_tree, tensors);
    }

    /// A table of the ops (for `remat-capture --verbose` and logs).
    [[nodiscard]] std::string summary() const {
        std::ostringstream out;
        out << "problem '" << core_->problem.name() << "': " << core_->info.size() << " op groups, "
            << core_->problem.op_count() << " problem ops, " << core_->problem.data_count() << " data; captured in "
            << core_->seconds << " s\n";
        for (const CapturedOp& op : core_->info) {
            out << "  " << op.name << ": " << op.nodes.size() << " nodes, out " << format_bytes(op.output_bytes)
                << ", saved " << format_bytes(op.saved_bytes) << ", fwd " << op.forward_time * 1e3 << " ms, bwd "
                << op.backward_time * 1e3 << " ms";
            if (op.random) out << ", random";
            if (op.mutates_buffers) out << ", updates buffers";
            out << "; backward reads {";
            for (std::size_t i = 0; i < op.backward_reads.size(); ++i) out << (i ? ", " : "") << op.backward_reads[i];
            out << "}; " << op.source << "\n";
        }
        return out.str();
    }

    [[nodiscard]] const std::shared_ptr<const detail::capture::Core>& core() const noexcept { return core_; }

private:
    std::shared_ptr<const detail::capture::Core> core_;
};

}  // namespace remat::torch
