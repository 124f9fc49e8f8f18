// The model and data of the LibTorch demo and of bench_executor: a chain MLP whose blocks
// (Linear, BatchNorm1d, ReLU, Dropout) have varied widths, trained on synthetic data that
// a fixed random "teacher" labels, so that the loss really goes down.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include <remat/torch/sequential.hpp>

namespace remat_demo {

struct Config {
    int blocks = 24;            ///< hidden blocks; the chain has blocks + 2 stages
    std::int64_t batch = 96;
    std::int64_t inputs = 128;
    std::int64_t classes = 10;
    double dropout = 0.1;
    std::uint64_t seed = 2024;
};

inline std::int64_t width_of(int block) {
    static const std::int64_t widths[] = {256, 160, 320, 192};
    return widths[block % 4];
}

inline torch::nn::Sequential make_model(const Config& c) {
    torch::manual_seed(c.seed);
    torch::nn::Sequential model(torch::nn::Linear(c.inputs, width_of(0)), torch::nn::ReLU());
    for (int b = 0; b < c.blocks; ++b) {
        model->push_back(torch::nn::Linear(width_of(b), width_of(b + 1)));
        model->push_back(torch::nn::BatchNorm1d(width_of(b + 1)));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Dropout(c.dropout));
    }
    model->push_back(torch::nn::Linear(width_of(c.blocks), c.classes));
    return model;
}

/// One stage per Linear and the layers after it.
inline remat::torch::StageList stages_of(const torch::nn::Sequential& model) {
    return remat::torch::group_stages_before(remat::torch::stages_of(model),
                                             remat::torch::starts_with<torch::nn::LinearImpl>);
}

struct Batch {
    at::Tensor x, y;
};

/// Batch number `step`: inputs and the teacher's labels, the same for every run.
inline Batch batch(const Config& c, int step) {
    torch::manual_seed(c.seed * 7919 + 1);
    const at::Tensor teacher = torch::randn({c.inputs, c.classes});
    torch::manual_seed(c.seed * 104729 + static_cast<std::uint64_t>(step));
    Batch b;
    b.x = torch::randn({c.batch, c.inputs});
    b.y = b.x.matmul(teacher).argmax(1);
    return b;
}

/// The seed each run sets before step `step`'s forward, so that dropout draws the same masks.
inline std::uint64_t dropout_seed(const Config& c, int step) { return c.seed * 31 + static_cast<std::uint64_t>(step); }

/// Copies parameters and buffers of `from` into `to` (same architecture).
inline void load_state(const torch::nn::Sequential& to, const torch::nn::Sequential& from) {
    const torch::NoGradGuard no_grad;
    const auto p = to->parameters(), q = from->parameters();
    for (std::size_t i = 0; i < p.size(); ++i) p[i].copy_(q[i]);
    const auto b = to->buffers(), d = from->buffers();
    for (std::size_t i = 0; i < b.size(); ++i) b[i].copy_(d[i]);
}

inline torch::nn::Sequential copy_of(const torch::nn::Sequential& model) {
    return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

}  // namespace remat_demo
