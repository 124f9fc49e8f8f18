// remat/torch/stage.hpp — a stage of a chain: a function Tensor → Tensor with the tensors
// it trains and the buffers it updates.
//
// Rotor (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
// heterogeneous chains", 2019) plans a sequence of stages, each mapping one activation to
// the next. The profiler and the executor need nothing more than this header; capture
// from torch::nn modules is in sequential.hpp (which costs much more to compile).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "../core/errors.hpp"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace remat::torch {

/// One stage of a chain.
struct ChainStage {
    std::string name;
    /// The computation. It must be a function of its input, the parameters and buffers, and the
    /// random numbers it draws from the default generator: the executor re-runs it to recompute.
    std::function<at::Tensor(const at::Tensor&)> forward;
    /// Tensors that receive gradients (those with requires_grad() are trained).
    std::vector<at::Tensor> parameters;
    /// State the forward updates in place (running statistics); saved and restored around
    /// every recomputation so that it changes once per step, as in plain training.
    std::vector<at::Tensor> buffers;
    /// The modules behind the stage, if any: they keep the modules alive and let a wrapping
    /// module register them, so that train()/eval() and parameters() reach them.
    std::vector<std::shared_ptr<::torch::nn::Module>> modules;
};

using StageList = std::vector<ChainStage>;

namespace detail::stage {

inline void append_unique(std::vector<at::Tensor>& into, const std::vector<at::Tensor>& from) {
    for (const at::Tensor& t : from) {
        bool seen = false;
        for (const at::Tensor& u : into) seen = seen || u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
        if (!seen) into.push_back(t);
    }
}

}  // namespace detail::stage

/// A stage from a function and the tensors it trains and updates.
[[nodiscard]] inline ChainStage make_stage(std::string name, std::function<at::Tensor(const at::Tensor&)> forward,
                                           std::vector<at::Tensor> parameters = {},
                                           std::vector<at::Tensor> buffers = {}) {
    if (!forward) throw InvalidInput("make_stage('" + name + "'): the function is empty");
    return ChainStage{std::move(name), std::move(forward), std::move(parameters), std::move(buffers), {}};
}

/// The stages [first, last) run one after the other as a single stage.
[[nodiscard]] inline ChainStage fuse(const StageList& stages, std::size_t first, std::size_t last) {
    if (first >= last || last > stages.size())
        throw InvalidInput("fuse: range [" + std::to_string(first) + ", " + std::to_string(last) +
                           ") is empty or beyond the " + std::to_string(stages.size()) + " stages");
    if (last - first == 1) return stages[first];
    ChainStage fused;
    std::vector<std::function<at::Tensor(const at::Tensor&)>> parts;
    for (std::size_t i = first; i < last; ++i) {
        fused.name += (i == first ? "" : "+") + stages[i].name;
        parts.push_back(stages[i].forward);
        detail::stage::append_unique(fused.parameters, stages[i].parameters);
        detail::stage::append_unique(fused.buffers, stages[i].buffers);
        fused.modules.insert(fused.modules.end(), stages[i].modules.begin(), stages[i].modules.end());
    }
    fused.forward = [parts = std::move(parts)](const at::Tensor& x) {
        at::Tensor y = parts.front()(x);
        for (std::size_t i = 1; i < parts.size(); ++i) y = parts[i](y);
        return y;
    };
    return fused;
}

/// Groups consecutive stages `size` at a time (the last group may be shorter): fewer,
/// coarser stages make planning cheaper and per-stage overheads smaller.
[[nodiscard]] inline StageList group_stages(const StageList& stages, std::size_t size) {
    if (size == 0) throw InvalidInput("group_stages: the group size must be at least 1");
    StageList grouped;
    for (std::size_t first = 0; first < stages.size(); first += size)
        grouped.push_back(fuse(stages, first, std::min(stages.size(), first + size)));
    return grouped;
}

/// Regroups stages: a new stage begins at every index in `starts` (index 0 always begins one).
[[nodiscard]] inline StageList group_stages_at(const StageList& stages, std::vector<std::size_t> starts) {
    starts.push_back(0);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    if (starts.back() >= stages.size())
        throw InvalidInput("group_stages_at: a stage cannot begin at index " + std::to_string(starts.back()) +
                           " of " + std::to_string(stages.size()) + " stages");
    StageList grouped;
    for (std::size_t i = 0; i < starts.size(); ++i)
        grouped.push_back(fuse(stages, starts[i], i + 1 < starts.size() ? starts[i + 1] : stages.size()));
    return grouped;
}

/// Regroups stages: a new stage begins at every stage for which `begins_stage` is true, e.g.
/// `group_stages_before(stages_of(model), starts_with<torch::nn::LinearImpl>)` makes one
/// stage of each Linear and the activation, normalisation and dropout layers after it.
/// (A torch::nn::Sequential cannot hold another one, so this is how flat models get blocks.)
[[nodiscard]] inline StageList group_stages_before(const StageList& stages,
                                                   const std::function<bool(const ChainStage&)>& begins_stage) {
    std::vector<std::size_t> starts;
    for (std::size_t i = 0; i < stages.size(); ++i)
        if (begins_stage(stages[i])) starts.push_back(i);
    return group_stages_at(stages, std::move(starts));
}

/// Every module behind the stages, once each (for registration in a wrapping module).
[[nodiscard]] inline std::vector<std::shared_ptr<::torch::nn::Module>> modules_of(const StageList& stages) {
    std::vector<std::shared_ptr<::torch::nn::Module>> modules;
    std::unordered_set<const ::torch::nn::Module*> seen;
    for (const ChainStage& s : stages)
        for (const auto& m : s.modules)
            if (m && seen.insert(m.get()).second) modules.push_back(m);
    return modules;
}

}  // namespace remat::torch
