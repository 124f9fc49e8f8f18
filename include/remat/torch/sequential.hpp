// remat/torch/sequential.hpp — capture of a torch::nn model as a chain of stages.
//
// Rotor (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
// heterogeneous chains", 2019) plans a sequence of stages Tensor → Tensor. This header
// makes them from a torch::nn::Sequential or a list of modules, keeping with every stage
// the parameters it trains and the buffers it updates (batch-norm running statistics),
// which the executor needs to accumulate gradients once and to keep recomputations free
// of side effects. Stages from plain functions, and regrouping, are in stage.hpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "../core/errors.hpp"
#include "stage.hpp"

namespace remat::torch {

namespace detail::sequential {

inline std::string short_type_name(const ::torch::nn::Module& module) {
    const std::string& full = module.name();
    const auto colon = full.rfind("::");
    std::string name = colon == std::string::npos ? full : full.substr(colon + 2);
    if (name.size() > 4 && name.ends_with("Impl")) name.resize(name.size() - 4);
    return name;
}

}  // namespace detail::sequential

template <class M>
concept TensorModule = std::derived_from<M, ::torch::nn::Module> && requires(M& m, const at::Tensor& x) {
    { m.forward(x) } -> std::convertible_to<at::Tensor>;
};

/// A stage from a module with `Tensor forward(const Tensor&)`.
template <TensorModule M>
[[nodiscard]] ChainStage make_stage(std::string name, std::shared_ptr<M> module) {
    if (!module) throw InvalidInput("make_stage('" + name + "'): the module is empty");
    ChainStage stage;
    stage.name = std::move(name);
    stage.parameters = module->parameters();
    stage.buffers = module->buffers();
    stage.forward = [m = module](const at::Tensor& x) -> at::Tensor { return m->forward(x); };
    stage.modules.push_back(std::move(module));
    return stage;
}

/// A stage from a module holder such as torch::nn::Linear.
template <TensorModule M>
[[nodiscard]] ChainStage make_stage(std::string name, const ::torch::nn::ModuleHolder<M>& holder) {
    return make_stage(std::move(name), holder.ptr());
}

/// A stage from one element of a Sequential (or any AnyModule); its forward must map one
/// tensor to one tensor.
[[nodiscard]] inline ChainStage make_stage(std::string name, ::torch::nn::AnyModule any) {
    if (any.is_empty()) throw InvalidInput("make_stage('" + name + "'): the module is empty");
    ChainStage stage;
    stage.name = std::move(name);
    stage.modules.push_back(any.ptr());
    stage.parameters = any.ptr()->parameters();
    stage.buffers = any.ptr()->buffers();
    stage.forward = [any, who = stage.name](const at::Tensor& x) mutable -> at::Tensor {
        ::torch::nn::AnyValue out = any.any_forward(x);
        if (const at::Tensor* t = out.try_get<at::Tensor>()) return *t;
        throw InvalidInput("stage '" + who + "' returned a " + c10::demangle(out.type_info().name()) +
                           ", not a tensor; every stage of a chain maps one tensor to one tensor");
    };
    return stage;
}

/// One stage per element of a Sequential, named "<index>:<type>" (e.g. "3:Linear"). Group
/// them into coarser stages with group_stages_before / group_stages_at / group_stages, or
/// put modules of your own (a block with a `Tensor forward(Tensor)`) in the Sequential.
[[nodiscard]] inline StageList stages_of(const ::torch::nn::Sequential& sequential) {
    if (sequential.is_empty() || sequential->is_empty())
        throw InvalidInput("stages_of: the Sequential is empty; a chain needs at least one stage");
    StageList stages;
    std::size_t index = 0;
    for (const ::torch::nn::AnyModule& any : *sequential) {
        stages.push_back(
            make_stage(std::to_string(index) + ":" + detail::sequential::short_type_name(*any.ptr()), any));
        ++index;
    }
    return stages;
}

/// Stages from a list of modules or module holders.
[[nodiscard]] inline StageList stages_of(const std::vector<::torch::nn::AnyModule>& modules) {
    StageList stages;
    for (std::size_t i = 0; i < modules.size(); ++i)
        stages.push_back(make_stage(std::to_string(i) + ":" + detail::sequential::short_type_name(*modules[i].ptr()),
                                    modules[i]));
    if (stages.empty()) throw InvalidInput("stages_of: the module list is empty; a chain needs at least one stage");
    return stages;
}

/// True when the stage's first module is one of the module types `Impl...` (e.g. LinearImpl).
template <class... Impl>
[[nodiscard]] bool starts_with(const ChainStage& stage) {
    if (stage.modules.empty() || !stage.modules.front()) return false;
    const ::torch::nn::Module* m = stage.modules.front().get();
    return (... || (dynamic_cast<const Impl*>(m) != nullptr));
}

}  // namespace remat::torch
