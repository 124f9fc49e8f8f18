// The greedy planner (solvers/greedy.hpp) and the proven memory lower bound (core/bounds.hpp):
// every plan valid and within budget on random chains, training DAGs and op-level networks
// from the greedy's smallest budget to P_ref; store-all's plan at P_ref; never faster than
// the exact optimum, and the bound never above the exact smallest budget, on tiny problems;
// Infeasible messages; a 2,500-op network planned quickly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <remat/remat.hpp>
#include <remat/solvers/greedy.hpp>

#include "../support/op_level_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;

static_assert(Solver<Greedy>);

namespace {

constexpr GreedyEviction all_rules[] = {GreedyEviction::dtr, GreedyEviction::farthest_next_use, GreedyEviction::both};

Greedy with_rule(GreedyEviction rule) {
    GreedyOptions options;
    options.eviction = rule;
    return Greedy(options);
}

// Small random problems for the bounds' tests: per trial, a DAG and a chain of 1-3 forward ops.
std::vector<std::pair<Problem, Problem>> small_dags_and_chains(std::uint32_t seed, int trials) {
    std::mt19937 rng(seed);
    std::vector<std::pair<Problem, Problem>> out;
    for (int trial = 0; trial < trials; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 1 + static_cast<std::size_t>(trial % 3);
        Problem dag = testing::random_dag(rng, shape);
        Problem chain = to_problem(testing::random_chain(rng, 1 + static_cast<std::size_t>(trial % 3)));
        out.emplace_back(std::move(dag), std::move(chain));
    }
    return out;
}

// Plans at budgets from the greedy's smallest to P_ref and checks each with the simulator.
void check_budget_range(const Problem& p, const Greedy& greedy) {
    const Reference ref = store_all_reference(p);
    const Bytes smallest = greedy.smallest_budget(p);
    REQUIRE(smallest <= ref.peak);
    REQUIRE(smallest >= memory_lower_bound(p).bytes);
    for (int k = 0; k <= 4; ++k) {
        const Bytes budget = smallest + (ref.peak - smallest) * k / 4;
        INFO(p.name() << " budget " << budget << " (smallest " << smallest << ", P_ref " << ref.peak << ")");
        const Plan plan = greedy.solve(p, budget);
        const SimulationReport r = simulate(p, plan.schedule);
        REQUIRE(r.fits(budget));
        CHECK(r.time == Approx(plan.time));
        CHECK(plan.time >= ref.time * (1 - 1e-12));
        CHECK(plan.stats.solver == "greedy");
        CHECK(plan.stats.status == SolveStatus::heuristic);
    }
}

// Problems of the filed store-all bug: alternatives whose reads nothing produces or that feed
// each other, and no autograd order.
Problem tricky_alternatives() {
    ProblemBuilder b("tricky");
    const DataId x = b.add_data("x", 10);
    const DataId u = b.add_data("u", 20);
    const DataId y = b.add_data("y", 30);
    const DataId z = b.add_data("z", 40);
    const DataId g = b.add_data("g", 5);
    b.add_op({"W1", 1.0, 0, {x, u}, {y}, false});
    b.add_op({"W2", 2.0, 0, {x}, {y}, false});
    b.add_op({"W3", 1.0, 0, {y}, {u}, false});
    b.add_op({"Z", 1.0, 0, {y}, {z}, false});
    b.add_op({"E", 1.0, 8, {z, u}, {g}, true});
    b.add_initial(x);
    b.add_final(g);
    return b.build();
}

}  // namespace

TEST_CASE("memory lower bound: what forces it, and never above the exact smallest budget", "[bounds]") {
    const Problem tiny = to_problem(Chain{"tiny-chain", 4096, {{"l1", 1.0, 2.0, 4096, 12288, 0, 512}}});
    const MemoryLowerBound b = memory_lower_bound(tiny);
    // B1 reads a0 (initial), g1, s1 (8192), a1 and writes g0, with 512 of overhead.
    CHECK(b.bytes == 4096 + 4096 + 8192 + 4096 + 4096 + 512);
    CHECK(b.reason == "exactly-once op 'B1'");
    CHECK(b.bytes <= exact_smallest_budget(tiny));

    ProblemBuilder only("only-initial");
    const DataId x = only.add_data("x", 100);
    only.add_initial(x);
    const DataId y = only.add_data("y", 0);
    only.add_op({"F", 1.0, 0, {x}, {y}, false});
    only.add_final(y);
    const Problem p = only.build();
    CHECK(memory_lower_bound(p).bytes == 100);
    CHECK(memory_lower_bound(p).reason == "the initial data");

    for (const auto& [dag, chain] : small_dags_and_chains(99, 60)) {
        for (const Problem& q : {dag, chain}) {
            const MemoryLowerBound bound = memory_lower_bound(q);
            INFO(q.name() << ": " << bound.reason);
            CHECK(bound.bytes <= exact_smallest_budget(q));
            CHECK(bound.bytes <= store_all_reference(q).peak);
        }
    }
}

TEST_CASE("compute lower bound: the ops every schedule runs, never above the exact optimum", "[bounds]") {
    // E (exactly-once) needs z and u: Z and W3 are their only writers and run; y, which both
    // read, has two writers (W1, W2), so neither counts.
    const Problem tricky = tricky_alternatives();
    CHECK(compute_lower_bound(tricky) == 3.0);
    CHECK(compute_lower_bound(tricky) <= Exhaustive{}.solve(tricky, store_all_reference(tricky).peak).time);
    // A forward op nothing needs does not count: F writes y, which no exactly-once op reads.
    ProblemBuilder idle("idle");
    const DataId x = idle.add_data("x", 10), y = idle.add_data("y", 10), g = idle.add_data("g", 1);
    idle.add_op({"F", 5.0, 0, {x}, {y}, false});
    idle.add_op({"L", 1.0, 0, {x}, {g}, true});
    idle.add_initial(x);
    idle.add_final(g);
    CHECK(compute_lower_bound(idle.build()) == 1.0);

    for (const auto& [dag, chain] : small_dags_and_chains(98, 60)) {
        for (const Problem& q : {dag, chain}) {
            INFO(q.name());
            const double bound = compute_lower_bound(q);
            const Reference ref = store_all_reference(q);
            CHECK(bound <= ref.time * (1 + 1e-12));
            const Bytes smallest = exact_smallest_budget(q);
            for (const Bytes budget : {smallest, (smallest + ref.peak) / 2, ref.peak})
                CHECK(bound <= Exhaustive{}.solve(q, budget).time * (1 + 1e-12));
        }
        // Every op of a chain is needed and is its data's only writer.
        CHECK(compute_lower_bound(chain) == Approx(store_all_reference(chain).time).epsilon(1e-12));
    }
}

TEST_CASE("greedy at P_ref is store-all, step for step", "[greedy]") {
    std::mt19937 rng(4242);
    for (int trial = 0; trial < 30; ++trial) {
        testing::OpLevelShape shape;
        shape.blocks = 1 + static_cast<std::size_t>(trial % 5);
        shape.side_inputs = trial % 2 == 1;
        const Problem net = testing::random_op_level_problem(rng, shape);
        const Problem chain = to_problem(testing::random_chain(rng, 1 + static_cast<std::size_t>(trial % 9)));
        for (const Problem& p : {net, chain, testing::without_autograd_order(net)})
            for (const GreedyEviction rule : all_rules) {
                const Reference ref = store_all_reference(p);
                const Plan plan = with_rule(rule).solve(p, ref.peak);
                CHECK(plan.time == ref.time);
                CHECK(plan.peak == ref.peak);
                CHECK(plan.schedule == ref.schedule);
            }
    }
}

TEST_CASE("greedy plans are valid and within budget on random chains, DAGs and op-level networks", "[greedy][property]") {
    std::mt19937 rng(20240612);
    for (int trial = 0; trial < 24; ++trial) {
        const Problem chain = to_problem(testing::random_chain(rng, 1 + static_cast<std::size_t>(trial % 12)));
        testing::DagShape dag_shape;
        dag_shape.forward_ops = 2 + static_cast<std::size_t>(trial % 10);
        const Problem dag = testing::random_dag(rng, dag_shape);
        testing::OpLevelShape net_shape;
        net_shape.blocks = 1 + static_cast<std::size_t>(trial % 6);
        net_shape.side_inputs = trial % 3 == 0;
        net_shape.input_gradient = trial % 4 != 0;
        const Problem net = testing::random_op_level_problem(rng, net_shape);
        for (const GreedyEviction rule : all_rules) {
            check_budget_range(chain, with_rule(rule));
            check_budget_range(dag, with_rule(rule));
            check_budget_range(net, with_rule(rule));
            check_budget_range(testing::without_autograd_order(net), with_rule(rule));
        }
    }
    for (const GreedyEviction rule : all_rules) check_budget_range(tricky_alternatives(), with_rule(rule));
}

TEST_CASE("greedy saves memory on chains and networks, and trying both rules is never slower", "[greedy]") {
    std::mt19937 rng(77);
    std::size_t below_ref = 0, cases = 0;
    for (int trial = 0; trial < 20; ++trial) {
        testing::OpLevelShape shape;
        shape.blocks = 3 + static_cast<std::size_t>(trial % 4);
        const Problem net = testing::random_op_level_problem(rng, shape);
        const Problem chain = to_problem(testing::random_chain(rng, 6 + static_cast<std::size_t>(trial % 6)));
        for (const Problem& p : {net, chain}) {
            const Reference ref = store_all_reference(p);
            ++cases;
            if (Greedy{}.smallest_budget(p) < ref.peak) ++below_ref;
            const Bytes budget = ref.peak * 3 / 4;
            const auto time_of = [&](GreedyEviction rule) -> std::optional<double> {
                try {
                    return with_rule(rule).solve(p, budget).time;
                } catch (const Infeasible&) {
                    return std::nullopt;
                }
            };
            const auto dtr = time_of(GreedyEviction::dtr);
            const auto belady = time_of(GreedyEviction::farthest_next_use);
            const auto both = time_of(GreedyEviction::both);
            CHECK(both.has_value() == (dtr.has_value() || belady.has_value()));
            if (both && dtr) CHECK(*both <= *dtr);
            if (both && belady) CHECK(*both <= *belady);
        }
    }
    // Recomputation must buy memory on nearly all of these (a chain of one cheap stage may not).
    CHECK(below_ref * 10 >= cases * 9);
}

TEST_CASE("greedy's writer choice: both are replayed, never slower than either, and the with-grad forward wins on DAGs", "[greedy]") {
    // A missing output of a layer can be recomputed by its forward without grad (fewest new
    // bytes) or with grad (which also makes live the saved data its backward reads). On
    // bench_checkmate's DAGs the second often saves running that forward again.
    const auto time_of = [](const Problem& p, Bytes budget, GreedyWriter writer) -> std::optional<double> {
        GreedyOptions o;
        o.writer = writer;
        try {
            return Greedy(o).solve(p, budget).time;
        } catch (const Infeasible&) {
            return std::nullopt;
        }
    };
    std::size_t faster = 0, cases = 0;
    for (const std::size_t ops : {std::size_t{20}, std::size_t{40}, std::size_t{60}}) {
        const Problem p = testing::bench_dag(ops, 1);
        const Reference ref = store_all_reference(p);
        for (const int percent : {40, 50, 60, 70, 80}) {
            const Bytes budget = ref.peak * percent / 100;
            const auto fewest = time_of(p, budget, GreedyWriter::fewest_new_bytes);
            const auto needed = time_of(p, budget, GreedyWriter::most_needed_bytes);
            const auto both = time_of(p, budget, GreedyWriter::both);
            INFO(p.name() << " at " << percent << " %");
            CHECK(both.has_value() == (fewest.has_value() || needed.has_value()));
            if (!both) continue;
            ++cases;
            CHECK(*both == std::min(fewest.value_or(*both), needed.value_or(*both)));
            if (fewest && *both < *fewest) ++faster;
        }
    }
    std::cout << "greedy writer choice: faster than fewest-new-bytes alone in " << faster << " of " << cases
              << " DAG budgets\n";
    CHECK(faster >= 3);
    // The option is named in the plan's options when the with-grad writer made it.
    GreedyOptions o;
    o.writer = GreedyWriter::most_needed_bytes;
    const Problem p = testing::bench_dag(60, 1);
    CHECK(Greedy(o).solve(p, store_all_reference(p).peak * 6 / 10).stats.options.find("writer=most-needed-bytes") !=
          std::string::npos);
}

TEST_CASE("greedy is never faster than the exact optimum, nor below its smallest budget, on tiny problems", "[greedy]") {
    std::mt19937 rng(31337);
    for (int trial = 0; trial < 40; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 1 + static_cast<std::size_t>(trial % 3);
        const Problem dag = testing::random_dag(rng, shape);
        const Problem chain = to_problem(testing::random_chain(rng, 1 + static_cast<std::size_t>(trial % 3)));
        for (const Problem& p : {dag, chain}) {
            const Bytes exact_smallest = exact_smallest_budget(p);
            const Bytes greedy_smallest = Greedy{}.smallest_budget(p);
            CHECK(memory_lower_bound(p).bytes <= exact_smallest);
            CHECK(greedy_smallest >= exact_smallest);
            const Reference ref = store_all_reference(p);
            for (int k = 0; k <= 3; ++k) {
                const Bytes budget = greedy_smallest + (ref.peak - greedy_smallest) * k / 3;
                const Plan greedy = Greedy{}.solve(p, budget);
                const Plan exact = Exhaustive{}.solve(p, budget);
                INFO(p.name() << " budget " << budget);
                CHECK(greedy.time >= exact.time - 1e-9);
            }
        }
    }
}

TEST_CASE("greedy Infeasible: below the proven bound, and only beyond the greedy's reach", "[greedy]") {
    const Problem p = to_problem(Chain{"tiny-chain", 4096, {{"l1", 1.0, 2.0, 4096, 12288, 0, 512}}});
    const MemoryLowerBound bound = memory_lower_bound(p);
    const Bytes smallest = Greedy{}.smallest_budget(p);
    try {
        (void)Greedy{}.solve(p, bound.bytes - 1);
        FAIL("expected Infeasible");
    } catch (const Infeasible& e) {
        CHECK(e.budget() == bound.bytes - 1);
        CHECK(e.smallest_budget() == smallest);
        CHECK_THAT(e.what(), Catch::Contains("no schedule at all fits") && Catch::Contains("exactly-once op 'B1'") &&
                                 Catch::Contains(std::to_string(bound.bytes)) && Catch::Contains(std::to_string(smallest)));
    }
    // A problem where the greedy's smallest budget is above the bound: the message says it
    // is the greedy's limit, not the problem's.
    std::mt19937 rng(5);
    bool seen_gap = false;
    for (int trial = 0; trial < 40 && !seen_gap; ++trial) {
        const Problem q = to_problem(testing::random_chain(rng, 4 + static_cast<std::size_t>(trial % 5)));
        const Bytes lb = memory_lower_bound(q).bytes;
        const Bytes greedy_smallest = Greedy{}.smallest_budget(q);
        if (greedy_smallest <= lb) continue;
        seen_gap = true;
        try {
            (void)Greedy{}.solve(q, greedy_smallest - 1);
            FAIL("expected Infeasible");
        } catch (const Infeasible& e) {
            CHECK(e.smallest_budget() == greedy_smallest);
            CHECK_THAT(e.what(), Catch::Contains("only beyond the greedy's reach") && Catch::Contains("checkmate"));
        }
        CHECK(Greedy{}.solve(q, greedy_smallest).peak <= greedy_smallest);
    }
    CHECK(seen_gap);
}

TEST_CASE("greedy never evicts what only exactly-once ops write while it is still read", "[greedy]") {
    // x → F1 → a → E1 → g; x → F3 → c → E3 → h; E2 reads a, g and h. At F3 something must go:
    // a (recomputable by F1) or g (larger, read as late as a, but E1 cannot run again).
    ProblemBuilder b("keep-the-gradient");
    const DataId x = b.add_data("x", 10);
    const DataId a = b.add_data("a", 100);
    const DataId g = b.add_data("g", 150);
    const DataId c = b.add_data("c", 140);
    const DataId h = b.add_data("h", 1);
    const DataId out = b.add_data("out", 10);
    const OpId f1 = b.add_op({"F1", 1.0, 0, {x}, {a}, false});
    const OpId e1 = b.add_op({"E1", 1.0, 0, {a}, {g}, true});
    const OpId f3 = b.add_op({"F3", 1.0, 0, {x}, {c}, false});
    const OpId e3 = b.add_op({"E3", 1.0, 0, {c}, {h}, true});
    const OpId e2 = b.add_op({"E2", 1.0, 0, {a, g, h}, {out}, true});
    b.add_initial(x);
    b.add_final(out);
    b.set_autograd_order({f1, e1, f3, e3, e2});
    const Problem p = b.build();
    REQUIRE(store_all_reference(p).peak == 401);
    for (const GreedyEviction rule : all_rules) {
        const Plan plan = with_rule(rule).solve(p, 311);
        INFO(to_string(rule));
        const Schedule expected{Step::run(f1), Step::run(e1), Step::free(a), Step::run(f3), Step::run(e3),
                                Step::free(c), Step::run(f1), Step::run(e2), Step::free(a), Step::free(g),
                                Step::free(h)};
        CHECK(plan.schedule == expected);
        CHECK(plan.time == 6.0);
    }
}

TEST_CASE("greedy plans a 2,500-op op-level network quickly", "[greedy]") {
    testing::TransformerShape shape;
    shape.layers = 60;
    const Problem p = testing::transformer_like(shape, "gpt-60");
    REQUIRE(p.op_count() >= 2500);
    const Reference ref = store_all_reference(p);
    const Bytes budget = percent_of(ref.peak, 40);
    const Stopwatch clock;
    const Plan plan = Greedy{}.solve(p, budget);
    const double seconds = clock.seconds();
    CHECK(simulate(p, plan.schedule).fits(budget));
    std::cout << "greedy: " << p.op_count() << " ops at 40 % of P_ref planned in " << seconds << " s ("
              << plan.stats.options << "), overhead " << 100.0 * (plan.time / ref.time - 1.0) << " %\n";
    CHECK(seconds < 10.0);  // well under a second in a release build; generous for slow machines
}

TEST_CASE("refine_plan: never slower, within budget, stops at the target, and meets an exact bound", "[refine]") {
    // The bound is the exact optimum (Exhaustive), so a refined plan that reaches it is optimal.
    std::mt19937 rng(4242);
    int improved = 0, optimal = 0, cases = 0;
    for (int trial = 0; trial < 12; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 3 + static_cast<std::size_t>(trial % 3);
        const Problem p = testing::random_dag(rng, shape);
        const Reference ref = store_all_reference(p);
        const Bytes smallest = exact_smallest_budget(p);
        const Bytes budget = smallest + (ref.peak - smallest) / 4;
        GreedyOptions plain;
        plain.eviction = GreedyEviction::dtr;
        Plan start;
        try {
            start = Greedy(plain).solve(p, budget);
        } catch (const Infeasible&) {
            continue;
        }
        const double optimum = Exhaustive{}.solve(p, budget).time;
        INFO(p.name() << " trial " << trial << " budget " << budget);
        RefineOptions o;
        o.target_gap = 0.0;
        o.time_limit_seconds = 0.3;
        o.round_seconds = 0.1;
        const Plan r = refine_plan(p, budget, start, optimum, o);
        ++cases;
        const SimulationReport checked = simulate(p, r.schedule);
        REQUIRE(checked.fits(budget));
        CHECK(checked.time == Approx(r.time));
        CHECK(r.time <= start.time + 1e-12);
        CHECK(r.time >= optimum - 1e-9);
        REQUIRE(r.stats.gap);
        CHECK(*r.stats.gap == Approx(r.time / optimum - 1.0).margin(1e-12));
        CHECK(r.stats.solver == start.stats.solver);
        if (r.time < start.time - 1e-12) ++improved;
        if (r.stats.status == SolveStatus::optimal) {
            ++optimal;
            CHECK(r.time == Approx(optimum));
            CHECK(*r.stats.gap == 0.0);
        }
        // A target the plan already meets: nothing runs, and the plan comes back as it was.
        o.target_gap = r.time / optimum - 1.0 + 1e-6;
        const Plan again = refine_plan(p, budget, r, optimum, o);
        CHECK(again.schedule == r.schedule);
        CHECK_THAT(again.stats.options, Catch::Contains("refined in 0 rounds"));
    }
    WARN("refine_plan: " << improved << " of " << cases << " plain DTR plans made faster, " << optimal << " proven optimal");
    CHECK(cases >= 8);
    CHECK(improved > 0);
    CHECK(optimal > 0);
}

TEST_CASE("refine_plan: a plan beyond the budget or faster than the bound is refused, naming both", "[refine]") {
    std::mt19937 rng(7);
    const Problem p = to_problem(testing::random_chain(rng, 4));
    const Reference ref = store_all_reference(p);
    const Plan plan = Greedy{}.solve(p, ref.peak);
    CHECK_THROWS_WITH(refine_plan(p, ref.peak, plan, 2.0 * plan.time),
                      Catch::Contains("less than the bound") && Catch::Contains("no lower bound"));
    CHECK_THROWS_WITH(refine_plan(p, ref.peak - 1, plan, plan.time),
                      Catch::Contains("does not fit the budget of " + std::to_string(ref.peak - 1)));
    RefineOptions bad;
    bad.round_seconds = 0.0;
    CHECK_THROWS_AS(refine_plan(p, ref.peak, plan, plan.time, bad), InvalidInput);
    // Meeting the bound: optimal at once, no round.
    const Plan met = refine_plan(p, ref.peak, plan, plan.time);
    CHECK(met.stats.status == SolveStatus::optimal);
    CHECK(*met.stats.gap == 0.0);
}
