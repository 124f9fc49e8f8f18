// minigrad_offload — minigrad (minigrad.hpp) trained by an offloading plan (docs/formats.md
// §11): the optimizer step (SGD with momentum) runs inside the plan, layer by layer, and
// weights and momentum move between minigrad's allocator (the "device") and host memory
// through remat's CPU transfer backend (remat/exec/transfer.hpp).
//
// OffloadTraining is both what the engine (remat/exec/offload_step.hpp) runs the ops with
// (StepCompute) and where the moving data live (DeviceStore): a layer's weights (all its
// parameter matrices) are data `w<l>`, its momentum buffers `m<l>`, its parameter gradients
// `gw<l>`, as remat::offload::training_problem names them. Standard library only.
#pragma once

#include <cstddef>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <remat/exec/offload_step.hpp>
#include <remat/exec/transfer.hpp>
#include <remat/offload/training_state.hpp>

#include "minigrad.hpp"

namespace minigrad {

/// The parameter bytes of each layer, for remat::offload::training_problem.
[[nodiscard]] inline std::vector<Bytes> parameter_bytes(Model& m) {
    std::vector<Bytes> out;
    for (Layer& layer : m.layers) {
        Bytes bytes = 0;
        for (const Matrix* p : parameters(layer)) bytes += p->bytes();
        out.push_back(bytes);
    }
    return out;
}

/// One SGD-with-momentum update of a parameter: v = μ v + g; p -= lr v.
inline void momentum_update(Matrix& parameter, Matrix& velocity, const Matrix& gradient, float lr, float mu) {
    for (std::size_t i = 0; i < parameter.values().size(); ++i) {
        velocity.values()[i] = mu * velocity.values()[i] + gradient.values()[i];
        parameter.values()[i] -= lr * velocity.values()[i];
    }
}

class OffloadTraining {
public:
    /// `problem`: training_problem of the model's chain; the momentum buffers start at zero.
    OffloadTraining(Model& m, Allocator& allocator, const Matrix& input, const Matrix& target, const remat::Problem& problem,
                    float lr, float mu)
        : m_(&m), allocator_(&allocator), input_(input), target_(target), lr_(lr), mu_(mu),
          backend_(m, input), step_generator_(m.generator) {
        const std::size_t L = m.layers.size();
        ids_ = remat::chain_ids(L);
        velocity_.resize(L + 1);
        shapes_.resize(L + 1);
        first_rng_.resize(L + 1);
        layer_of_.assign(problem.data_count(), {Role::activation, 0});
        update_layer_.assign(problem.op_count(), 0);
        for (std::size_t l = 1; l <= L; ++l) {
            for (Matrix* p : parameters(m.layers[l - 1])) {
                shapes_[l].emplace_back(p->rows(), p->cols());
                velocity_[l].emplace_back(allocator, p->rows(), p->cols());
            }
            const std::string n = std::to_string(l);
            if (const auto w = problem.find_data("w" + n)) layer_of_[w->index] = {Role::weights, l};
            if (const auto v = problem.find_data("m" + n)) layer_of_[v->index] = {Role::momentum, l};
            if (const auto g = problem.find_data("gw" + n)) layer_of_[g->index] = {Role::gradients, l};
            if (const auto u = problem.find_data("u" + n)) layer_of_[u->index] = {Role::marker, l};
            if (const auto op = problem.find_op("U" + n)) update_layer_[op->index] = l;
        }
    }

    // ---- StepCompute
    void run(remat::OpId op) {
        const std::size_t L = m_->layers.size();
        if (update_layer_[op.index] != 0) return update(update_layer_[op.index]);
        if (op == ids_.loss) {
            Loss loss = mse(backend_.output(), target_);
            loss_ = loss.value;
            backend_.set_output_gradient(std::move(loss.gradient));
            return;
        }
        for (std::size_t l = 1; l <= L; ++l) {
            if (op == ids_.bwd[l]) return backend_.backward(l);
            if (op == ids_.fwd[l] || op == ids_.fwd_grad[l]) return forward(l, op == ids_.fwd_grad[l]);
        }
    }
    void release(remat::DataId d) {
        const auto [role, l] = layer_of_[d.index];
        if (role == Role::gradients) backend_.collected(l).clear();
        else if (role == Role::activation) backend_.release(d);
    }

    // ---- DeviceStore
    [[nodiscard]] std::vector<std::span<std::byte>> device_bytes(remat::DataId d) {
        std::vector<std::span<std::byte>> out;
        for (Matrix* matrix : matrices(d))
            if (matrix->bytes() > 0) out.push_back(std::as_writable_bytes(std::span(matrix->values())));  // none when away
        return out;
    }
    void make_device_copy(remat::DataId d) {
        const auto [role, l] = layer_of_[d.index];
        const std::vector<Matrix*> targets = matrices(d);
        for (std::size_t k = 0; k < targets.size(); ++k)
            *targets[k] = Matrix(*allocator_, shapes_[l][k].first, shapes_[l][k].second);
    }
    void drop_device_copy(remat::DataId d) {
        for (Matrix* matrix : matrices(d)) *matrix = Matrix();
    }

    [[nodiscard]] double loss() const noexcept { return loss_; }
    /// Drops the step's activations and random states, for the next step.
    void end_step() {
        backend_ = Backend(*m_, input_);
        for (auto& state : first_rng_) state.reset();
        step_generator_ = m_->generator;
    }
    /// A failed step (the engine calls it): as end_step, with the generator put back where
    /// the step found it, so that the step can be run again and draw the same numbers.
    void abort_step() {
        m_->generator = step_generator_;
        end_step();
    }

private:
    enum class Role : unsigned char { activation, weights, momentum, gradients, marker };

    [[nodiscard]] std::vector<Matrix*> matrices(remat::DataId d) {
        const auto [role, l] = layer_of_[d.index];
        if (role == Role::weights) return parameters(m_->layers[l - 1]);
        std::vector<Matrix*> out;
        if (role == Role::momentum)
            for (Matrix& v : velocity_[l]) out.push_back(&v);
        return out;
    }

    // A recomputed random layer replays the numbers of its first run.
    void forward(std::size_t l, bool with_grad) {
        if (!backend_.random(l)) return backend_.forward(l, with_grad, true);
        if (!first_rng_[l]) {
            first_rng_[l] = m_->generator;
            return backend_.forward(l, with_grad, true);
        }
        const std::mt19937 now = m_->generator;
        m_->generator = *first_rng_[l];
        backend_.forward(l, with_grad, false);
        m_->generator = now;
    }

    void update(std::size_t l) {
        const std::vector<Matrix*> params = parameters(m_->layers[l - 1]);
        const Gradients& grads = backend_.collected(l);
        for (std::size_t k = 0; k < params.size(); ++k) momentum_update(*params[k], velocity_[l][k], grads[k], lr_, mu_);
    }

    Model* m_;
    Allocator* allocator_;
    Matrix input_, target_;
    float lr_, mu_;
    Backend backend_;
    remat::ChainIds ids_;
    std::vector<std::vector<Matrix>> velocity_;  // by layer, by parameter
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> shapes_;
    std::vector<std::optional<std::mt19937>> first_rng_;
    std::vector<std::pair<Role, std::size_t>> layer_of_;  // by data
    std::vector<std::size_t> update_layer_;               // by op: the layer an update steps, or 0
    std::mt19937 step_generator_;                         // the generator when the step started
    double loss_ = 0.0;
};

static_assert(remat::StepCompute<OffloadTraining>);
static_assert(remat::DeviceStore<OffloadTraining>);

}  // namespace minigrad
