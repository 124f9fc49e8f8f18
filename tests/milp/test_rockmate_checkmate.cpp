// Rockmate with its MILP-backed block solver (exact search on small blocks, Checkmate over
// lp_solve on the others): valid plans, and on small op-level graphs close to Checkmate's
// proven optimum over the whole graph.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <remat/remat.hpp>
#include <remat/milp/lp_solve.hpp>
#include <remat/solvers/checkmate.hpp>
#include <remat/solvers/rockmate_milp.hpp>

#include "../support/op_level_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;

namespace {

std::vector<Bytes> sweep(Bytes least, Bytes top, int count) {
    std::vector<Bytes> out;
    for (int i = 0; i < count; ++i) out.push_back(least + (top - least) * i / (count - 1));
    return out;
}

testing::OpLevelShape small_shape() {
    testing::OpLevelShape shape;
    shape.blocks = 2;
    shape.kinds = {testing::BlockKind::chain, testing::BlockKind::residual, testing::BlockKind::diamond,
                   testing::BlockKind::mlp};
    return shape;
}

}  // namespace

static_assert(Solver<ExactBlockSolver<milp::LpSolve>> && Solver<RockmateMilp<>>);
// The defaults: Checkmate over lp_solve on the blocks, the multi-option Rotor across.
static_assert(std::is_same_v<RockmateMilp<>, Rockmate<ExactBlockSolver<milp::LpSolve>, Rotor>>);
static_assert(Solver<RockmateCheckmate<>> && std::is_same_v<RockmateCheckmate<>, Rockmate<Checkmate<milp::LpSolve>, Rotor>>);

TEST_CASE("rockmate with checkmate blocks: valid plans, never below the exact optimum") {
    std::mt19937 rng(17);
    ExactBlockSolverOptions only_milp;
    only_milp.exhaustive_max_data = 0;  // every block goes to Checkmate
    only_milp.checkmate.time_limit_seconds = 20.0;
    RockmateOptions options;
    options.peak_budgets = 3;
    options.saved_budgets = 3;
    const RockmateMilp<> rockmate(options, ExactBlockSolver<milp::LpSolve>(only_milp));
    for (int trial = 0; trial < 6; ++trial) {
        const Problem p = testing::random_op_level_problem(rng, small_shape(), testing::numbered("net", trial));
        const Reference ref = store_all_reference(p);
        const RockmateModel model = rockmate.analyse(p);
        for (const RockmateBlock& b : model.blocks) CHECK(b.failure.empty());
        const Bytes least = rockmate.smallest_budget(model);
        for (const Bytes budget : sweep(least, ref.peak, 4)) {
            const Plan plan = rockmate.solve(model, budget);
            CHECK(simulate(p, plan.schedule).fits(budget));
            if (p.data_count() <= 24) CHECK(plan.time >= Exhaustive().solve(p, budget).time - 1e-9);
        }
    }
}

// Why some cases stay above 10 %: not the grid nor Rotor's slots (a 12 × 12 grid with exact
// slots gives the same times, asserted below), and not Rotor's DP (an exact search over every
// action sequence across the blocks, tests/core/test_rockmate.cpp's ExactActionSearch, gives
// the same times too), but optima that are not block-structured. With this seed, 2 of the 18
// cases, both at the smallest budget Rockmate can plan:
// - small1 at 704 B: the optimum (24) frees block 2's input b1.c0 (128 B) after block 2's
//   forward and recomputes it, with block 1's forward with grad, in the middle of block 2's
//   backward (after Bb2.d, before Bb2.b). With block 2's backward in one piece and its input
//   live, as in every Rockmate schedule, keeping block 2's saved data (time 26) peaks at 784 B
//   during Bb2.d; recomputing block 2 instead costs 30 (+25 %).
// - small4 at 528 B: the optimum (29) back-propagates block 3 (whose backward reads only its
//   output gradient) before recomputing block 3's input; in the chain of blocks a block's
//   backward needs its input and its forward with grad after it, so Rockmate recomputes
//   block 3's forward (Fb2.c0+, time 5): 34 (+17 %).
TEST_CASE("rockmate on small op-level graphs stays within 10 % of checkmate's proven optimum") {
    std::mt19937 rng(23);
    const RockmateMilp<> rockmate;
    RockmateOptions dense_grid;
    dense_grid.peak_budgets = dense_grid.saved_budgets = 12;
    RotorOptions exact_slots;
    exact_slots.slots = 10'000'000;
    const RockmateMilp<> dense(dense_grid, ExactBlockSolver<milp::LpSolve>(), Rotor(exact_slots));
    CheckmateOptions exact_options;
    exact_options.time_limit_seconds = 30.0;
    const Checkmate<milp::LpSolve> checkmate(exact_options);
    int cases = 0, within10 = 0, proven = 0;
    double worst = 0.0, total = 0.0;
    for (int trial = 0; trial < 60 && cases < 18; ++trial) {
        const Problem p = testing::random_op_level_problem(rng, small_shape(), testing::numbered("small", trial));
        if (p.data_count() > 18) continue;
        const Reference ref = store_all_reference(p);
        const RockmateModel model = rockmate.analyse(p);
        const Bytes least = rockmate.smallest_budget(model);
        for (const Bytes budget : sweep(least, ref.peak, 3)) {
            const Plan exact = checkmate.solve(p, budget);
            const Plan plan = rockmate.solve(model, budget);
            if (exact.stats.status != SolveStatus::optimal) continue;
            ++proven;
            REQUIRE(plan.time >= exact.time - 1e-6 * exact.time);
            const double gap = plan.time / exact.time - 1.0;
            worst = std::max(worst, gap);
            total += gap;
            within10 += gap <= 0.10 + 1e-9 ? 1 : 0;
            ++cases;
            if (gap > 0.10 + 1e-9) {
                INFO(p.name() << " at " << budget << " B: rockmate " << plan.time << ", optimum " << exact.time);
                CHECK(dense.solve(p, budget).time == Approx(plan.time));
            }
        }
    }
    REQUIRE(cases >= 18);
    WARN("rockmate vs checkmate's proven optimum on " << cases << " (graph, budget) cases: within 10 % " << within10
                                                      << ", mean gap " << 100.0 * total / cases << " %, worst "
                                                      << 100.0 * worst << " %");
    CHECK(total / cases <= 0.05);
    CHECK(within10 >= cases - 2);
}

TEST_CASE("rockmate with exact blocks stops each block at its time limit, search and MILP included", "[timing]") {
    // One block of a dense random DAG (no separator): its exact search and integer program
    // would take far longer than the block's limit.
    std::mt19937 rng(7);
    testing::DagShape shape;
    shape.forward_ops = 40;
    shape.second_input = 0.7;
    shape.second_output = 0.3;
    const Problem p = testing::random_dag(rng, shape, "dense-40");
    const BlockPartition part = partition_blocks(p);
    std::size_t largest = 0;
    for (const Block& b : part.blocks) largest = std::max(largest, b.forward_ops.size() + b.backward_ops.size());
    REQUIRE(largest >= 40);
    RockmateOptions options;
    options.block_time_limit_seconds = 0.5;
    const RockmateMilp<> rockmate(options);
    const Stopwatch clock;
    const RockmateModel model = rockmate.analyse(p);
    const double seconds = clock.seconds();
    INFO(part.blocks.size() << " blocks, the largest of " << largest << " ops, analysed in " << seconds << " s");
    CHECK(seconds <= static_cast<double>(part.blocks.size()) * options.block_time_limit_seconds * 1.1 + 0.5);
    // What it found within the limit still plans.
    const Reference ref = store_all_reference(p);
    CHECK(simulate(p, rockmate.solve(model, ref.peak).schedule).fits(ref.peak));
}

TEST_CASE("exact block solver: the least peak keeps to the time limit, search and MILP together", "[timing]") {
    // bench_checkmate's 20-op DAG (seed 1) has 36 data, so the exact search goes first. Its
    // least-peak search stops at its state cap after about 0.8 s; the MILP then had its own
    // full second, and the whole took 1.77 s. Rockmate's least-peak search of a block ran
    // that long past the block's limit (remat-plan --solver rockmate --time-limit 2: 3.0 s).
    const Problem dag = testing::bench_dag(20, 1);
    REQUIRE(dag.data_count() <= ExactBlockSolverOptions{}.exhaustive_max_data);
    const auto solver = ExactBlockSolver<milp::LpSolve>{}.with_time_limit_at_most(1.0);
    const Stopwatch clock;
    try {
        const Bytes least = solver.smallest_budget(dag);
        CHECK(least >= Exhaustive{}.least_budget_bound(dag));
    } catch (const SolverError&) {  // out of time before any schedule: allowed
    }
    const double seconds = clock.seconds();
    INFO("least peak within a 1-s limit: " << seconds << " s");
    CHECK(seconds <= 1.0 * 1.1 + 0.1);
}
