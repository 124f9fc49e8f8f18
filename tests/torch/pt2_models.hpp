// The .pt2 models the 2.x configuration's Python exports for the tests
// (scripts/lib/export_pt2_models.py, the torch_pt2_models fixture; scripts/gpu-check exports
// them on a GPU machine), and what eager PyTorch computed on them: shared by the CPU tests
// (test_torch_exported.cpp) and the CUDA ones (test_torch_cuda.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/torch/capture/reference.hpp"
#include "remat/torch/detail/compat.hpp"

namespace pt2_test {

namespace fs = std::filesystem;
using Json = nlohmann::json;

inline const fs::path models_dir = fs::path(REMAT_BINARY_DIR) / "pt2_models";

/// What Python saved for one model (export_pt2_models.py).
struct Expected {
    std::string name;
    fs::path program;
    fs::path folder;
    Json index;

    [[nodiscard]] bool has(const std::string& key) const { return index["tensors"].contains(key); }
    [[nodiscard]] at::Tensor tensor(const std::string& key) const {
        INFO("expected tensor '" << key << "' of " << name);
        REQUIRE(has(key));
        const Json& e = index["tensors"][key];
        const std::string dtype = e["dtype"].get<std::string>();
        const at::ScalarType type = dtype == "float32"   ? at::kFloat
                                    : dtype == "float64" ? at::kDouble
                                    : dtype == "int64"   ? at::kLong
                                    : dtype == "bool"    ? at::kBool
                                                         : at::kFloat;
        REQUIRE((dtype == "float32" || dtype == "float64" || dtype == "int64" || dtype == "bool"));
        at::Tensor t = at::empty(e["shape"].get<std::vector<std::int64_t>>(), at::TensorOptions().dtype(type));
        std::ifstream in(folder / e["file"].get<std::string>(), std::ios::binary);
        REQUIRE(in.good());
        in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
        REQUIRE(static_cast<std::size_t>(in.gcount()) == t.nbytes());
        return t;
    }
    [[nodiscard]] std::vector<c10::IValue> inputs() const {
        std::vector<c10::IValue> out;
        for (int i = 0; i < index["inputs"].get<int>(); ++i) out.emplace_back(tensor("input_" + std::to_string(i)));
        return out;
    }
    [[nodiscard]] std::vector<at::Tensor> weights() const {
        std::vector<at::Tensor> out;
        for (int i = 0; i < index["outputs"].get<int>(); ++i) out.push_back(tensor("weight_" + std::to_string(i)));
        return out;
    }
};

inline std::vector<Expected> exported_models() {
    std::vector<Expected> models;
    std::ifstream in(models_dir / "manifest.json");
    if (!in.good()) return models;
    for (const Json& entry : Json::parse(in)) {
        Expected e;
        e.name = entry["model"].get<std::string>();
        e.program = entry["file"].get<std::string>();
        e.folder = entry["expected"].get<std::string>();
        std::ifstream index(e.folder / "index.json");
        e.index = Json::parse(index);
        models.push_back(std::move(e));
    }
    return models;
}

inline bool skipped_without_torch_export() {
    if (fs::exists(models_dir / "manifest.json")) return false;
    WARN("no .pt2 models in " << models_dir.string()
                              << ": torch.export needs the 2.x configuration (scripts/test --torch pip)");
    REQUIRE_FALSE(remat::torch::detail::compat::torch2);
    return true;
}

inline std::vector<at::Tensor> leaves(const c10::IValue& v) {
    std::vector<at::Tensor> out;
    remat::torch::detail::capture::tensors_in(v, out);
    return out;
}

// The module's named tensors, each once (tied weights under their first name).
inline std::map<std::string, at::Tensor> named(const torch::jit::named_parameter_list& list) {
    std::map<std::string, at::Tensor> out;
    for (const auto& p : list) out.emplace(p.name, p.value);
    return out;
}

// Eager PyTorch's update between its steps: plain SGD at the exported learning rate.
inline void sgd_like_eager(const Expected& e, const std::map<std::string, at::Tensor>& parameters) {
    const double lr = e.index["lr"].get<double>();
    const at::NoGradGuard no_grad;
    for (const auto& [name, p] : parameters)
        if (p.grad().defined()) {
            p.add_(p.grad(), -lr);
            p.mutable_grad() = at::Tensor();
        }
}

}  // namespace pt2_test
