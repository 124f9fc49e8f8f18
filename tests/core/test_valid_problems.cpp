// No solver rejects a valid problem (issue 21): on thousands of random training DAGs of
// several shapes and densities — each accepted by the problem validator — Rockmate's block
// split builds every block as a problem of its own, and Rockmate, H-Rockmate and the greedy,
// and remat-plan's default solver (auto) and rockmate, answer with a plan or Infeasible at
// budgets across the feasible range, never with InvalidInput (exit code 2).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include "../support/fast_options.hpp"
#include "../support/random_problems.hpp"
#include "../support/remat_plan_in_process.hpp"

using namespace remat;

namespace {

// Shapes from sparse chains with a few skips to dense DAGs of two-output ops.
testing::DagShape shape_of(std::uint32_t seed) {
    testing::DagShape shape;
    shape.forward_ops = 3 + seed % 43;
    shape.second_input = 0.1 + 0.15 * static_cast<double>(seed % 5);
    shape.second_output = 0.1 * static_cast<double>(seed % 4);
    shape.no_grad_variant = seed % 3 == 0 ? 1.0 : 0.8;
    return shape;
}

Problem dag(std::uint32_t seed) {
    std::mt19937 rng(seed);
    const Problem p = testing::random_dag(rng, shape_of(seed), "dag-" + std::to_string(seed));
    return seed % 7 == 3 ? testing::without_autograd_order(p) : p;
}

// The short limits of the H-Rockmate tests, and fast components too.
HRockmateOptions fast_hrockmate() {
    HRockmateOptions o = testing::fast_hrockmate_options();
    o.search_time_limit_seconds = 0.3;
    o.cluster_time_limit_seconds = 0.5;
    o.time_limit_seconds = 0.5;
    o.exact_component_seconds = 0.05;
    o.rockmate.block_time_limit_seconds = 0.05;
    o.rockmate.peak_budgets = o.rockmate.saved_budgets = 2;
    return o;
}

// Plans at `budget`, or says Infeasible; anything else fails the test, naming the solver.
template <class Solve>
void plan_or_infeasible(const std::string& solver, const Problem& p, Bytes budget, Solve&& solve) {
    INFO(solver << " on '" << p.name() << "' (" << p.op_count() << " ops) at " << budget << " bytes");
    try {
        const Plan plan = solve();
        const SimulationReport r = simulate(p, plan.schedule);
        REQUIRE(r.valid);
        CHECK(r.peak <= budget);
    } catch (const Infeasible&) {
        // a budget beyond this solver's reach: fine
    } catch (const InvalidInput& e) {
        FAIL("rejected a valid problem as bad input: " << e.what());
    }
}

}  // namespace

TEST_CASE("valid problems: Rockmate's block split builds every block of thousands of random DAGs", "[valid]") {
    std::size_t blocks = 0;
    for (std::uint32_t seed = 0; seed < 3000; ++seed) {
        const Problem p = dag(seed);
        INFO("'" << p.name() << "' (" << p.op_count() << " ops)");
        try {
            const BlockPartition part = partition_blocks(p);
            for (std::size_t l = 0; l < part.blocks.size(); ++l) (void)block_problem(p, part, l);
            blocks += part.blocks.size();
        } catch (const InvalidInput& e) {
            FAIL("the block split rejected a valid problem: " << e.what());
        }
    }
    CHECK(blocks > 3000);  // most DAGs have separators
}

TEST_CASE("valid problems: Rockmate and the greedy never answer InvalidInput, at budgets across the feasible range",
          "[valid]") {
    RockmateOptions options;
    options.peak_budgets = 2;
    options.saved_budgets = 2;
    options.block_time_limit_seconds = 0.05;
    const Rockmate<> rockmate(options);
    const Greedy greedy;
    for (std::uint32_t seed = 0; seed < 3000; seed += 20) {
        const Problem p = dag(seed);
        const Reference ref = store_all_reference(p);
        const Bytes floor = memory_lower_bound(p).bytes;
        std::optional<RockmateModel> model;
        try {
            model = rockmate.analyse(p);
        } catch (const InvalidInput& e) {
            FAIL("rockmate's analysis rejected valid problem '" << p.name() << "': " << e.what());
        }
        for (const int percent : {0, 50, 100}) {
            const Bytes budget = floor + (ref.peak - floor) * percent / 100;
            plan_or_infeasible("rockmate", p, budget, [&] { return rockmate.solve(*model, budget); });
            plan_or_infeasible("greedy", p, budget, [&] { return greedy.solve(p, budget); });
        }
    }
}

TEST_CASE("valid problems: H-Rockmate never answers InvalidInput on small random DAGs", "[valid]") {
    const HRockmate hrockmate(fast_hrockmate());
    for (std::uint32_t seed = 0; seed < 3000; seed += 250) {
        const Problem p = dag(seed / 250);  // 3 to 14 forward ops
        const Reference ref = store_all_reference(p);
        const Bytes floor = memory_lower_bound(p).bytes;
        const HRockmateModel model = hrockmate.analyse(p);
        for (const int percent : {25, 100}) {
            const Bytes budget = floor + (ref.peak - floor) * percent / 100;
            plan_or_infeasible("hrockmate", p, budget, [&] { return hrockmate.solve(model, budget); });
        }
    }
}

TEST_CASE("valid problems: remat-plan never exits 2 on a valid random DAG", "[valid][cli]") {
    const std::string dir = std::string(REMAT_BINARY_DIR) + "/valid_problems";
    std::filesystem::create_directories(dir);
    for (std::uint32_t seed = 1; seed < 3000; seed += 600) {
        const Problem p = dag(seed);
        const std::string file = dir + "/" + p.name() + ".problem.json";
        std::ofstream(file) << io::to_json(p);
        for (const std::string solver : {"auto", "rockmate"}) {
            const auto r = testing::remat_plan({file, "--budget", "91%", "--solver", solver, "--time-limit", "1", "--quiet"});
            INFO(solver << " on " << file << ": " << r.err);
            CHECK(r.code != 2);
        }
    }
}

TEST_CASE("valid problems: auto answers a budget below the proven lower bound before any analysis",
          "[valid][cli][timing]") {
    const Problem p = dag(2990);  // 3 + 2990 % 43 = 36 forward ops
    const Bytes floor = memory_lower_bound(p).bytes;
    const Stopwatch clock;
    try {
        (void)Auto{}.solve(p, floor - 1);
        FAIL("no Infeasible below the proven lower bound");
    } catch (const Infeasible& e) {
        CHECK(std::string(e.what()).find("below a proven lower bound") != std::string::npos);
    }
    CHECK(clock.seconds() < 0.5);
    const std::string file = std::string(REMAT_BINARY_DIR) + "/valid_problems/below-bound.problem.json";
    std::filesystem::create_directories(std::filesystem::path(file).parent_path());
    std::ofstream(file) << io::to_json(p);
    const auto r = testing::remat_plan({file, "--budget", std::to_string(floor - 1), "--quiet"});
    CHECK(r.code == 3);
    CHECK(r.err.find("below a proven lower bound") != std::string::npos);
}
