// Periodic checkpointing (Chen et al. 2016): hand-computed schedules, peaks and times.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include <remat/remat.hpp>

using namespace remat;

namespace {

std::vector<std::string> step_names(const Problem& p, const Schedule& s) {
    std::vector<std::string> names;
    for (const Step& step : s) names.push_back(step.is_run() ? p.op(step.op()).name : "-" + p.data(step.data()).name);
    return names;
}

// L stages of 1 byte activations, no extra saved state, no overheads; forward 1, backward 2.
Chain uniform_chain(std::size_t length) {
    Chain c{"uniform", 1, {}};
    for (std::size_t l = 1; l <= length; ++l) c.stages.push_back(Stage{std::to_string(l), 1.0, 2.0, 1, 1, 0, 0});
    return c;
}

}  // namespace

TEST_CASE("periodic uses segments of ceil(sqrt(L)) stages by default") {
    const Periodic periodic;
    const std::vector<std::pair<std::size_t, std::size_t>> expected{{1, 1},  {2, 2},  {3, 2},  {4, 2},   {5, 3},
                                                                    {9, 3},  {10, 4}, {16, 4}, {17, 5}, {100, 10}};
    for (const auto& [length, k] : expected) {
        INFO("L = " << length);
        CHECK(periodic.segment_for(length) == k);
    }
    CHECK(Periodic(7).segment_for(100) == 7);
    CHECK_THROWS_AS(Periodic(0), InvalidInput);
}

TEST_CASE("periodic on a uniform 4-stage chain: hand-computed schedule, time and peak") {
    const Chain chain = uniform_chain(4);
    const Problem p = to_problem(chain);
    const Plan plan = Periodic{}.solve(p, 100);
    // k = 2: segment 1-2 runs without grad keeping a0, segment 3-4 with grad, then 1-2 again.
    CHECK(step_names(p, plan.schedule) ==
          std::vector<std::string>{"F1", "F2", "-a1", "F3+", "F4+", "loss", "B4", "-g4", "-s4", "-a4", "B3",
                                   "-g3", "-s3", "-a3", "-a2", "F1+", "F2+", "B2", "-g2", "-s2", "-a2", "B1",
                                   "-g1", "-s1", "-a1"});
    // Forwards of segment 1 twice (2 + 2), of segment 2 once (2), backwards 4 × 2.
    CHECK(plan.time == 14.0);
    // Peak while B4 runs: a0 a2 a3 a4 g4 + g3 = 6 (store-all peaks at 7 there: a1 is live too).
    CHECK(plan.peak == 6);
    CHECK(store_all_reference(p).peak == 7);
    CHECK(plan.stats.solver == "periodic");
    CHECK(plan.stats.options == "k=2");
}

TEST_CASE("periodic with one segment is store-all") {
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> size(1, 50);
    for (int trial = 0; trial < 20; ++trial) {
        Chain c{"c", size(rng), {}};
        const auto length = static_cast<std::size_t>(1 + trial % 7);
        for (std::size_t l = 1; l <= length; ++l) {
            const Bytes out = size(rng);
            c.stages.push_back(Stage{std::to_string(l), 0.5 * size(rng), 0.25 * size(rng), out, out + size(rng), size(rng) % 5,
                                     size(rng) % 7});
        }
        const Problem p = to_problem(c);
        const Reference ref = store_all_reference(p);
        const Plan plan = Periodic(length).solve(p, ref.peak);
        CHECK(plan.time == Approx(ref.time));
        CHECK(plan.peak == ref.peak);
    }
}

TEST_CASE("periodic plans are valid, and its smallest budget is exactly its peak") {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> size(1, 1000);
    for (int trial = 0; trial < 40; ++trial) {
        const auto length = static_cast<std::size_t>(1 + trial * 3 % 37);
        Chain c{"c", size(rng), {}};
        for (std::size_t l = 1; l <= length; ++l) {
            const Bytes out = size(rng);
            c.stages.push_back(Stage{std::to_string(l), 0.001 * size(rng), 0.002 * size(rng), out, out + size(rng),
                                     size(rng) / 4, size(rng) / 3});
        }
        const Problem p = to_problem(c);
        for (const std::optional<std::size_t> k : {std::optional<std::size_t>{}, std::optional<std::size_t>{1},
                                                   std::optional<std::size_t>{3}, std::optional<std::size_t>{length}}) {
            const Periodic periodic(k);
            const SimulationReport report = simulate(p, periodic.schedule(c));
            REQUIRE(report.valid);
            const Plan plan = periodic.solve(p, report.peak);
            CHECK(plan.peak == report.peak);
            CHECK(plan.time == Approx(report.time));
            try {
                (void)periodic.solve(p, report.peak - 1);
                FAIL("periodic accepted a budget below its peak");
            } catch (const Infeasible& e) {
                REQUIRE(e.smallest_budget());
                CHECK(*e.smallest_budget() == report.peak);
                CHECK(e.budget() == report.peak - 1);
            }
        }
        // Recomputation never lowers the time below store-all's.
        CHECK(Periodic{}.solve(p, 1LL << 40).time >= store_all_reference(p).time - 1e-9);
    }
}

TEST_CASE("periodic rejects a problem that is not a chain") {
    ProblemBuilder b("not-a-chain");
    const DataId x = b.add_data("x", 4);
    const DataId y = b.add_data("y", 4);
    b.add_op({"f", 1.0, 0, {x}, {y}, true});
    b.add_initial(x);
    b.add_final(y);
    const Problem p = b.build();
    CHECK_THROWS_WITH(Periodic{}.solve(p, 100), Catch::Contains("not a chain") && Catch::Contains("checkmate"));
}
