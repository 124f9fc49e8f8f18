// Where a ChainExecutor step runs its backward phase (detail::run_backward_phase in
// remat/torch/detail/runtime.hpp): the threads that run the forwards recomputed after the
// loss, for the tightest plan of an MLP chain, and that step's gradients against the
// store-all step's. Shared by the CPU test (the caller's thread) and the [cuda] one
// (autograd's device thread).
#pragma once

#include <torch/torch.h>

#include <remat/solvers/auto.hpp>
#include <remat/solvers/store_all.hpp>
#include <remat/torch/executor.hpp>
#include <remat/torch/profile.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "models.hpp"

namespace remat_test {

struct BackwardPhaseThreads {
    std::set<std::thread::id> recomputed_on;  ///< threads of the forwards run after the loss
    bool same_gradients = true;               ///< as the store-all step's, within the tolerance
};

template <class Probe>
BackwardPhaseThreads backward_phase_threads(const at::Device& device, Probe probe, double tolerance) {
    torch::nn::Sequential model = make_mlp(64, 256, 6, 10, 0.0, 13);
    model->to(device);
    const at::Tensor x = at::randn({64, 64}, at::TensorOptions().device(device));
    const at::Tensor y = at::randint(0, 10, {64}, at::TensorOptions().device(device).dtype(at::kLong));
    std::mutex mutex;
    std::atomic<bool> after_loss{false};
    BackwardPhaseThreads out;
    remat::torch::StageList stages = blocks_of(model);
    for (remat::torch::ChainStage& stage : stages)
        stage.forward = [f = stage.forward, &mutex, &after_loss, &out](const at::Tensor& in) {
            if (after_loss) {
                const std::lock_guard lock(mutex);
                out.recomputed_on.insert(std::this_thread::get_id());
            }
            return f(in);
        };
    remat::torch::ProfileOptions options;
    options.repeats = 2;
    const remat::torch::ChainExecutor<Probe> ex(stages, remat::torch::profile_chain(stages, x, options, probe), probe);
    const auto loss = [&](const at::Tensor& out_) {
        after_loss = true;
        return at::cross_entropy_loss(out_, y);
    };
    const remat::Plan tight = remat::Auto{}.solve(ex.problem(), remat::Auto{}.smallest_budget(ex.problem()));
    std::vector<std::vector<at::Tensor>> gradients;
    for (const remat::Schedule& schedule : {remat::store_all_reference(ex.problem()).schedule, tight.schedule}) {
        for (const at::Tensor& p : ex.parameters()) p.mutable_grad() = at::Tensor();
        after_loss = false;
        (void)ex.step(ex.prepare(schedule), x, loss);
        std::vector<at::Tensor> g;
        for (const at::Tensor& p : ex.parameters()) g.push_back(p.grad().clone());
        gradients.push_back(std::move(g));
    }
    for (std::size_t i = 0; i < gradients[0].size(); ++i)
        out.same_gradients = out.same_gradients && at::allclose(gradients[0][i], gradients[1][i], tolerance, 1e-7);
    return out;
}

}  // namespace remat_test
