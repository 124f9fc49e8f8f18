// Small chain models and helpers shared by the LibTorch tests.
#pragma once

#include <torch/torch.h>

#include <remat/torch/sequential.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace remat_test {

/// An MLP chain: input layer, `blocks` × (Linear, BatchNorm1d, ReLU, Dropout), classifier
/// head — as one flat Sequential (`blocks_of` makes a stage of each Linear and what follows).
inline torch::nn::Sequential make_mlp(std::int64_t in, std::int64_t width, int blocks, std::int64_t classes,
                                      double dropout, std::uint64_t seed = 7) {
    torch::manual_seed(seed);
    torch::nn::Sequential model(torch::nn::Linear(in, width), torch::nn::ReLU());
    for (int i = 0; i < blocks; ++i) {
        model->push_back(torch::nn::Linear(width, width));
        model->push_back(torch::nn::BatchNorm1d(width));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Dropout(dropout));
    }
    model->push_back(torch::nn::Linear(width, classes));
    return model;
}

/// A conv chain: stem, `blocks` × (Conv, BatchNorm2d, ReLU, Dropout), then pooling, a view
/// (Flatten, which alone would be a stage aliasing its input) and a classifier.
inline torch::nn::Sequential make_convnet(std::int64_t channels, int blocks, std::int64_t classes, double dropout,
                                          std::uint64_t seed = 11) {
    torch::manual_seed(seed);
    torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, 3).padding(1)),
                                torch::nn::BatchNorm2d(channels), torch::nn::ReLU());
    for (int i = 0; i < blocks; ++i) {
        model->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)));
        model->push_back(torch::nn::BatchNorm2d(channels));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Dropout(dropout));
    }
    model->push_back(torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions(2)));
    model->push_back(torch::nn::Flatten());
    model->push_back(torch::nn::Linear(channels * 4, classes));
    return model;
}

/// One stage per Linear / Conv2d and the layers that follow it.
inline remat::torch::StageList blocks_of(const torch::nn::Sequential& model) {
    return remat::torch::group_stages_before(remat::torch::stages_of(model),
                                             remat::torch::starts_with<torch::nn::LinearImpl, torch::nn::Conv2dImpl>);
}

/// A deep copy (parameters and buffers) for plain-autograd reference training.
inline torch::nn::Sequential copy_of(const torch::nn::Sequential& model) {
    return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

inline bool same(const at::Tensor& a, const at::Tensor& b) {
    if (a.defined() != b.defined()) return false;
    if (!a.defined()) return true;
    return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

/// Largest absolute difference (for messages).
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
    if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : 1e30;
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace remat_test
