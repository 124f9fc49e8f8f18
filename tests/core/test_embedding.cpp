// The embedding example (examples/embedding/minigrad.hpp): a framework that is not LibTorch
// trains through remat's execution engine with gradients equal to its own backward (bit for
// bit, dropout included) and a measured peak equal to the simulator's, at several budgets.
#include <catch2/catch.hpp>

#include <random>

#include <remat/solvers/rotor.hpp>
#include <remat/solvers/store_all.hpp>

#include "../../examples/embedding/minigrad.hpp"

TEST_CASE("embedding: minigrad trains under budgets with its own gradients and the predicted peak", "[executor][embedding]") {
    using namespace minigrad;
    Allocator memory;
    Model model = make_model(memory, 6, 12, 20, 3, 3);
    std::mt19937 data(11);
    const Matrix x = random_matrix(memory, 5, 6, data, 1.0f);
    const Matrix target = random_matrix(memory, 5, 3, data, 1.0f);
    const Profile p = profile(model, memory, x);
    const remat::Problem planned = remat::to_problem(p.chain);
    const remat::Reference ref = remat::store_all_reference(planned);
    const remat::Executor<Backend, AllocatorProbe> engine(planned, p.problem, chain_table(planned, p.chain.length()));
    AllocatorProbe probe{&memory};
    const remat::Rotor rotor;
    const remat::Bytes least = rotor.smallest_budget(p.chain);
    std::vector<remat::Plan> plans{remat::StoreAll{}.solve(planned, ref.peak)};
    for (const remat::Bytes budget : {ref.peak * 3 / 4, std::max(ref.peak * 3 / 5, least), least})
        plans.push_back(rotor.solve(planned, budget));
    for (const remat::Plan& plan : plans) {
        INFO("budget " << plan.budget << " of store-all " << ref.peak);
        const remat::ExecutionPlan prepared = engine.prepare(plan);
        for (int step_index = 0; step_index < 2; ++step_index) {
            const std::mt19937 generator = model.generator;
            const PlainStep plain = plain_step(model, x, target);
            const std::mt19937 after_plain = model.generator;
            model.generator = generator;
            const remat::Bytes before = memory.current();
            auto step = engine.start(prepared, Backend(model, x), probe);
            step.forward();
            Loss loss = mse(step.backend().output(), target);
            CHECK(loss.value == plain.loss);
            step.backend().set_output_gradient(std::move(loss.gradient));
            step.backward();
            CHECK(model.generator == after_plain);  // recomputed dropout replayed, sequence unchanged
            const std::vector<Gradients> grads = step.backend().take_gradients();
            REQUIRE(grads.size() == plain.gradients.size());
            for (std::size_t l = 0; l < grads.size(); ++l) {
                REQUIRE(grads[l].size() == plain.gradients[l].size());
                for (std::size_t k = 0; k < grads[l].size(); ++k) CHECK(grads[l][k].values() == plain.gradients[l][k].values());
            }
            CHECK(step.report().measured_peak == step.report().predicted_peak);
            CHECK(step.report().predicted_peak <= plan.budget);
            remat::Bytes handed_over = 0;  // the parameter gradients, the caller's now
            for (const Gradients& gs : grads)
                for (const Matrix& g : gs) handed_over += g.bytes();
            CHECK(memory.current() == before + handed_over);  // nothing else left behind
        }
    }
}
