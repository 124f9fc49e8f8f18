// train-minigrad — remat embedded in a framework that is not LibTorch (minigrad.hpp): a small
// MLP with residual blocks and dropout is profiled with minigrad's own allocator, planned
// with Rotor under a budget, and trained through remat's execution engine; every step's
// parameter gradients are compared with minigrad's own backward (no recomputation), and the
// measured peak with the one the simulator predicted.
//
//   train-minigrad [--budget PERCENT] [--steps N]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <remat/io/budget.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/solvers/store_all.hpp>

#include "minigrad.hpp"

int main(int argc, char** argv) {
    double percent = 50.0;
    int steps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--budget") percent = std::atof(argv[i + 1]);
        else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    }
    using namespace minigrad;
    Allocator memory;
    Model model = make_model(memory, 32, 64, 128, 6, 8);
    std::mt19937 data(3);
    const Matrix x = random_matrix(memory, 16, 32, data, 1.0f);
    const Matrix target = random_matrix(memory, 16, 8, data, 1.0f);
    const Profile p = profile(model, memory, x);
    const remat::Problem planned = remat::to_problem(p.chain);
    const remat::Reference ref = remat::store_all_reference(planned);
    const remat::Bytes budget = remat::percent_of(ref.peak, percent);
    const remat::Plan plan = remat::Rotor{}.solve(planned, budget);
    const remat::Executor<Backend, AllocatorProbe> engine(planned, p.problem, chain_table(planned, p.chain.length()));
    const remat::ExecutionPlan prepared = engine.prepare(plan);
    std::printf("minigrad: %zu layers, store-all peak %s, budget %.0f%% = %s, Rotor plan: +%.1f%% time, %zu layer forwards\n",
                p.chain.length(), remat::format_bytes(ref.peak).c_str(), percent, remat::format_bytes(budget).c_str(),
                100.0 * (plan.time / ref.time - 1.0), [&] {
                    std::size_t runs = 0;
                    for (const std::size_t r : prepared.prepared().forward_runs) runs += r;
                    return runs;
                }());
    AllocatorProbe probe{&memory};
    for (int s = 0; s < steps; ++s) {
        const std::mt19937 generator = model.generator;
        const PlainStep plain = plain_step(model, x, target);
        model.generator = generator;
        auto step = engine.start(prepared, Backend(model, x), probe);
        step.forward();
        Loss loss = mse(step.backend().output(), target);
        step.backend().set_output_gradient(std::move(loss.gradient));
        step.backward();
        const std::vector<Gradients> grads = step.backend().take_gradients();
        bool equal = true;
        for (std::size_t l = 0; l < grads.size(); ++l)
            for (std::size_t k = 0; k < grads[l].size(); ++k) equal = equal && grads[l][k].values() == plain.gradients[l][k].values();
        std::ostringstream report;
        report << step.report();
        std::printf("step %d: loss %.5f, gradients %s\n        %s\n", s, loss.value,
                    equal ? "equal to minigrad's own backward" : "DIFFER", report.str().c_str());
        // SGD
        for (std::size_t l = 0; l < grads.size(); ++l) {
            const auto params = parameters(model.layers[l]);
            for (std::size_t k = 0; k < params.size(); ++k)
                for (std::size_t i = 0; i < params[k]->values().size(); ++i) params[k]->values()[i] -= 0.01f * grads[l][k].values()[i];
        }
        if (!equal || step.report().measured_peak != step.report().predicted_peak) return 1;
    }
    return 0;
}
