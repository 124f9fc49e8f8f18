// The store-all reference of docs/formats.md §4 (with the order it chooses when a problem gives
// none) and the exact search over all schedules.
#include <catch2/catch.hpp>

#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/remat.hpp>

#include "../support/op_level_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;

namespace {

std::vector<std::string> op_names(const Problem& p, const Schedule& s) {
    std::vector<std::string> names;
    for (const Step& step : s)
        if (step.is_run()) names.push_back(p.op(step.op()).name);
    return names;
}

// A residual block without an autograd order: x → f → y, x + y → z, with backward ops and
// a no-grad alternative writer of y.
Problem residual_without_autograd() {
    ProblemBuilder b("residual");
    const DataId x = b.add_data("x", 100);
    const DataId y = b.add_data("y", 100);
    const DataId sy = b.add_data("sy", 300);
    const DataId z = b.add_data("z", 100);
    const DataId gz = b.add_data("gz", 100);
    const DataId gy = b.add_data("gy", 100);
    const DataId gx_res = b.add_data("gx.res", 100);
    const DataId gx_f = b.add_data("gx.f", 100);
    b.add_op({"Ff", 2.0, 0, {x}, {y}, false});
    b.add_op({"Ff+", 2.0, 0, {x}, {y, sy}, false});
    b.add_op({"Fadd", 0.5, 0, {x, y}, {z}, false});
    b.add_op({"loss", 0.0, 0, {z}, {gz}, true});
    b.add_op({"Badd", 0.5, 0, {gz}, {gy, gx_res}, true});
    b.add_op({"Bf", 4.0, 50, {gy, sy, x}, {gx_f}, true});
    b.add_initial(x);
    b.add_final(gx_res);
    b.add_final(gx_f);
    return b.build();
}

Chain random_chain(std::mt19937& rng, std::size_t length) {
    std::uniform_int_distribution<int> size(1, 8);
    std::uniform_int_distribution<int> time(1, 5);
    Chain c{"random", size(rng) * 16, {}};
    for (std::size_t l = 0; l < length; ++l) {
        const Bytes out = size(rng) * 16;
        c.stages.push_back(Stage{std::to_string(l + 1), double(time(rng)), double(time(rng)), out, out + size(rng) * 16 - 16,
                                 size(rng) % 3 == 0 ? 16 : 0, size(rng) % 3 == 0 ? 32 : 0});
    }
    return c;
}

}  // namespace

TEST_CASE("store-all follows the autograd order and frees each data after its last read") {
    const Problem p = to_problem(Chain{"c", 10, {{"1", 1, 2, 20, 50, 0, 0}, {"2", 1, 2, 30, 30, 0, 0}}});
    const Reference ref = store_all_reference(p);
    CHECK(op_names(p, ref.schedule) == std::vector<std::string>{"F1+", "F2+", "loss", "B2", "B1"});
    CHECK(ref.time == 6.0);
    // Peak during B2: a0 a1 s1 a2 s2(0) g2 + g1 = 10+20+30+30+0+30+20.
    CHECK(ref.peak == 140);
    const SimulationReport r = simulate(p, ref.schedule);
    REQUIRE(r.valid);
    CHECK(r.timeline.back().after == 10 + 10);  // a0 and g0 only
}

TEST_CASE("store-all chooses an order when the problem gives none") {
    const Problem p = residual_without_autograd();
    const Reference ref = store_all_reference(p);
    // The with-grad forward is chosen because the backward needs its saved state; the
    // no-grad alternative is never run.
    CHECK(op_names(p, ref.schedule) == std::vector<std::string>{"Ff+", "Fadd", "loss", "Badd", "Bf"});
    CHECK(ref.time == 7.0);
    CHECK(simulate(p, ref.schedule).valid);
}

namespace {

// The filed bug: x initial; W1 reads x and u, W2 reads x, both write y (final); nothing writes
// u. Store-all picked W1 (it was listed first) and then found no writer of u.
Problem unproducible_read(bool with_w3, bool with_consumer) {
    ProblemBuilder b(with_w3 ? "cycle-through-alternative" : "unproducible-read");
    const DataId x = b.add_data("x", 10);
    const DataId u = b.add_data("u", 20);
    const DataId y = b.add_data("y", 30);
    b.add_op({"W1", 1.0, 0, {x, u}, {y}, false});
    b.add_op({"W2", 2.0, 0, {x}, {y}, false});
    // W3 makes u from y: W1 could then only come after W2, its own alternative.
    if (with_w3) b.add_op({"W3", 1.0, 0, {y}, {u}, false});
    if (with_consumer) {
        const DataId z = b.add_data("z", 5);
        b.add_op({"W4", 1.0, 0, {y, u}, {z}, true});
        b.add_final(z);
    } else {
        b.add_final(y);
    }
    b.add_initial(x);
    return b.build();
}

// A random training DAG without its order, plus cheap traps for store-all's choice: for some
// data, an alternative writer that reads a data no op produces, or a later activation.
Problem with_trap_writers(const Problem& p, std::mt19937& rng) {
    ProblemBuilder b(p.name() + "+traps");
    for (const Data& d : p.all_data()) b.add_data(d.name, d.bytes);
    const DataId ghost = b.add_data("ghost", 16);
    for (const Op& op : p.all_ops()) b.add_op({op.name, op.time, op.overhead, op.reads, op.writes, op.exactly_once});
    std::uniform_int_distribution<std::size_t> data(0, p.data_count() - 1);
    for (int i = 0; i < 4; ++i) {
        const DataId target = DataId{data(rng)};
        const DataId source = DataId{data(rng)};
        if (p.is_initial(target) || p.writers(target).empty() || source == target) continue;
        const bool reads_ghost = i % 2 == 0;
        std::vector<DataId> reads{reads_ghost ? ghost : source};
        b.add_op({testing::numbered("trap", static_cast<std::size_t>(i)), 0.0, 0, reads, {target}, false});
    }
    for (const DataId d : p.initial()) b.add_initial(d);
    for (const DataId d : p.final_data()) b.add_final(d);
    if (p.loss()) b.set_loss(*p.loss());
    return b.build();
}

}  // namespace

TEST_CASE("store-all without an order never picks a writer whose reads cannot be produced (filed bug)", "[store-all]") {
    SECTION("no op writes what W1 reads: W2 alone") {
        const Problem p = unproducible_read(false, false);
        const Reference ref = store_all_reference(p);
        CHECK(op_names(p, ref.schedule) == std::vector<std::string>{"W2"});
        CHECK(ref.time == 2.0);
        CHECK(ref.peak == 40);
        CHECK(simulate(p, ref.schedule).valid);
    }
    SECTION("W1's read is made from y: W1 would depend on itself; W2 alone") {
        const Problem p = unproducible_read(true, false);
        const Reference ref = store_all_reference(p);
        CHECK(op_names(p, ref.schedule) == std::vector<std::string>{"W2"});
        CHECK(simulate(p, ref.schedule).valid);
    }
    SECTION("an exactly-once op needs both y and u: W2, then W3, then it") {
        const Problem p = unproducible_read(true, true);
        const Reference ref = store_all_reference(p);
        CHECK(op_names(p, ref.schedule) == std::vector<std::string>{"W2", "W3", "W4"});
        CHECK(simulate(p, ref.schedule).valid);
    }
}

TEST_CASE("store-all chooses a valid order for random problems without one", "[store-all][property]") {
    std::mt19937 rng(20250207);
    for (int trial = 0; trial < 200; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 1 + static_cast<std::size_t>(trial % 12);
        const Problem dag = testing::random_dag(rng, shape);
        testing::OpLevelShape op_shape;
        op_shape.blocks = 1 + static_cast<std::size_t>(trial % 4);
        op_shape.side_inputs = trial % 2 == 0;
        const Problem net = testing::random_op_level_problem(rng, op_shape);
        for (const Problem& given : {dag, net}) {
            for (const Problem& p : {testing::without_autograd_order(given), with_trap_writers(given, rng)}) {
                INFO(p.name() << " trial " << trial);
                REQUIRE(p.autograd_order().empty());
                Reference ref;
                REQUIRE_NOTHROW(ref = store_all_reference(p));
                const SimulationReport r = simulate(p, ref.schedule);
                REQUIRE(r.valid);
                CHECK(r.peak == ref.peak);
                // Each op at most once: store-all never recomputes.
                std::vector<int> runs(p.op_count(), 0);
                for (const Step& s : ref.schedule)
                    if (s.is_run()) REQUIRE(++runs[s.op().index] == 1);
            }
            // Without traps, the choice costs what the framework's own order costs.
            CHECK(store_all_reference(testing::without_autograd_order(given)).time == store_all_reference(given).time);
        }
    }
}

TEST_CASE("StoreAll solver: plan at P_ref, Infeasible below with P_ref as smallest budget") {
    const Problem p = residual_without_autograd();
    const Reference ref = store_all_reference(p);
    const Plan plan = StoreAll{}.solve(p, ref.peak);
    CHECK(plan.peak == ref.peak);
    CHECK(plan.time == ref.time);
    CHECK(plan.stats.solver == "store-all");
    try {
        (void)StoreAll{}.solve(p, ref.peak - 1);
        FAIL("expected Infeasible");
    } catch (const Infeasible& e) {
        CHECK(e.smallest_budget() == ref.peak);
        CHECK(e.budget() == ref.peak - 1);
    }
}

TEST_CASE("Exhaustive: tiny-chain optimum and smallest budget match the reference table") {
    const Problem p = to_problem(Chain{"tiny-chain", 4096, {{"l1", 1.0, 2.0, 4096, 12288, 0, 512}}});
    CHECK(exact_smallest_budget(p) == 25088);
    const Plan plan = Exhaustive{}.solve(p, 25088);
    CHECK(plan.time == 3.0);
    CHECK(plan.stats.status == SolveStatus::optimal);
    CHECK_THROWS_AS(Exhaustive{}.solve(p, 25087), Infeasible);
}

TEST_CASE("Exhaustive: recomputation trades time for memory on a chain") {
    const Problem p = to_problem(Chain{"three", 10, {{"1", 1, 1, 100, 300, 0, 0}, {"2", 1, 1, 100, 300, 0, 0},
                                                   {"3", 1, 1, 10, 10, 0, 0}}});
    const Reference ref = store_all_reference(p);
    const Bytes smallest = exact_smallest_budget(p);
    CHECK(smallest < ref.peak);
    const Plan at_ref = Exhaustive{}.solve(p, ref.peak);
    CHECK(at_ref.time == ref.time);
    const Plan tight = Exhaustive{}.solve(p, smallest);
    CHECK(tight.peak <= smallest);
    CHECK(tight.time >= ref.time);
    try {
        (void)Exhaustive{}.solve(p, smallest - 1);
        FAIL("expected Infeasible");
    } catch (const Infeasible& e) {
        CHECK(e.smallest_budget() == smallest);
        CHECK_THAT(e.what(), Catch::Contains("three") && Catch::Contains(std::to_string(smallest)));
    }
}

TEST_CASE("Exhaustive on random chains: valid, within budget, never worse than store-all, monotone in budget", "[property]") {
    std::mt19937 rng(20261122);
    for (int trial = 0; trial < 40; ++trial) {
        const Problem p = to_problem(random_chain(rng, 1 + trial % 4));
        const Reference ref = store_all_reference(p);
        const Bytes smallest = exact_smallest_budget(p);
        REQUIRE(smallest <= ref.peak);
        double previous = std::numeric_limits<double>::infinity();
        for (int k = 0; k <= 4; ++k) {
            const Bytes budget = smallest + (ref.peak - smallest) * k / 4;
            const Plan plan = Exhaustive{}.solve(p, budget);
            const SimulationReport r = simulate(p, plan.schedule);
            REQUIRE(r.fits(budget));
            CHECK(r.time == plan.time);
            CHECK(plan.time <= previous);
            previous = plan.time;
        }
        CHECK(previous == ref.time);
    }
}

TEST_CASE("Exhaustive refuses problems beyond its reach with a clear message") {
    std::mt19937 rng(7);
    const Problem p = to_problem(random_chain(rng, 45));  // 2 + 3 × 45 data
    CHECK_THROWS_WITH(Exhaustive{}.solve(p, 1 << 30), Catch::Contains("at most 128 data") && Catch::Contains("checkmate"));
}

TEST_CASE("Exhaustive honours its memory cap: a clear error, or a proven bound when certifying") {
    std::mt19937 rng(11);
    const Problem p = testing::random_dag(rng, testing::DagShape{6});
    const Reference ref = store_all_reference(p);
    const Bytes budget = percent_of(ref.peak, 80);
    const double optimum = Exhaustive{}.solve(p, budget).time;
    ExhaustiveOptions capped;
    capped.max_memory_bytes = 16 << 10;  // a few hundred states
    INFO(p.op_count() << " ops, optimum " << optimum);
    CHECK_THROWS_WITH(Exhaustive(capped).solve(p, budget),
                      Catch::Contains("memory cap of 0 MiB") && Catch::Contains("max_memory_bytes") &&
                          Catch::Contains(p.name()));
    const Exhaustive::Certificate early = Exhaustive(capped).certify(p, budget, std::numeric_limits<double>::infinity());
    CHECK_FALSE(early.complete);
    CHECK(early.lower_bound <= optimum);
    CHECK(early.lower_bound >= ref.time);  // at least the exactly-once ops' time
}

TEST_CASE("Exhaustive: an infeasible budget whose smallest feasible one is out of reach still gets a proven bound") {
    // With too few states for the least-peak search, the message gives the bounds' lower bound
    // on the smallest feasible budget, which is above the budget and at most the exact one.
    std::mt19937 rng(23);
    ExhaustiveOptions tiny;
    tiny.max_states = 30;
    int checked = 0;
    for (int trial = 0; trial < 20; ++trial) {
        const Problem p = testing::random_dag(rng, testing::DagShape{4 + static_cast<std::size_t>(trial % 3)});
        const Bytes smallest = exact_smallest_budget(p);
        const Bytes budget = smallest / 3;
        INFO("trial " << trial << ": smallest " << smallest << ", budget " << budget);
        try {
            (void)Exhaustive(tiny).solve(p, budget);
            FAIL("a plan below a third of the smallest feasible budget");
        } catch (const Infeasible& e) {
            const std::string message = e.what();
            INFO(message);
            const auto at = message.find("is at least ");
            if (at == std::string::npos) {
                CHECK(e.smallest_budget() == smallest);  // the least-peak search finished within 30 states
                continue;
            }
            ++checked;
            const Bytes bound = std::stoll(message.substr(at + 12));
            CHECK(bound > budget);
            CHECK(bound <= smallest);
            CHECK_THAT(message, Catch::Contains("a proven bound"));
            CHECK_FALSE(e.smallest_budget().has_value());
        }
    }
    CHECK(checked >= 10);
}

TEST_CASE("Exhaustive::certify: a faster schedule, a proof of the incumbent, or a proven lower bound", "[property]") {
    std::mt19937 rng(41);
    const Exhaustive exhaustive;
    ExhaustiveOptions brief;
    brief.max_states = 50;  // stops early: a bound, not a proof
    int faster = 0, proven = 0, bounded = 0;
    for (int trial = 0; trial < 40; ++trial) {
        const Problem p = trial % 2 == 0 ? to_problem(testing::random_chain(rng, 2 + trial % 4))
                                         : testing::random_dag(rng, testing::DagShape{4});
        const Bytes budget = percent_of(store_all_reference(p).peak, 75 + trial % 20);
        std::optional<Plan> greedy;
        try {
            greedy = Greedy{}.solve(p, budget);
        } catch (const Infeasible&) {
            continue;
        }
        const double optimum = exhaustive.solve(p, budget).time;
        INFO("trial " << trial << ": greedy " << greedy->time << ", optimum " << optimum);
        const Exhaustive::Certificate c = exhaustive.certify(p, budget, greedy->time);
        REQUIRE(c.complete);
        if (c.faster) {
            ++faster;
            CHECK(c.faster->time == optimum);
            CHECK(c.faster->peak <= budget);
            CHECK(c.lower_bound == optimum);
        } else {
            ++proven;
            CHECK(greedy->time == optimum);
            CHECK(c.lower_bound == greedy->time);
        }
        // The optimum itself as the incumbent: nothing faster, proven.
        const Exhaustive::Certificate same = exhaustive.certify(p, budget, optimum);
        CHECK_FALSE(same.faster);
        CHECK(same.complete);
        // Stopped by the state limit: a lower bound, never above the optimum.
        const Exhaustive::Certificate early = Exhaustive(brief).certify(p, budget, greedy->time);
        if (!early.complete) {
            ++bounded;
            CHECK(early.lower_bound <= optimum);
            CHECK(early.lower_bound > 0.0);
        }
    }
    CHECK(faster > 0);
    CHECK(proven > 0);
    CHECK(bounded > 0);
    ExhaustiveOptions weighted;
    weighted.weight = 1.5;
    CHECK_THROWS_AS(Exhaustive(weighted).certify(to_problem(testing::random_chain(rng, 2)), 1 << 20, 1.0), InvalidInput);
}

TEST_CASE("Exhaustive: the recompute and memory bounds keep every optimum and every smallest budget", "[property]") {
    // The bounds are admissible only if the search with them returns what the search without
    // them (the time of the exactly-once ops alone) returns: the same optimal time at every
    // budget, the same least peak, and the same budgets found infeasible. Each bound is
    // checked alone and with the other (the memory bound adds rewrite shares to the recompute
    // bound's needed data, so the pair is checked as it runs by default).
    std::mt19937 rng(20261127);
    ExhaustiveOptions plain;
    plain.recompute_bound = false;
    plain.memory_bound = false;
    ExhaustiveOptions recompute_only = plain, memory_only = plain;
    recompute_only.recompute_bound = true;
    memory_only.memory_bound = true;
    const std::vector<std::pair<const char*, ExhaustiveOptions>> bounded{
        {"both (the default)", ExhaustiveOptions{}}, {"recompute only", recompute_only}, {"memory only", memory_only}};
    int compared = 0, infeasible = 0;
    for (int trial = 0; trial < 60; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 2 + static_cast<std::size_t>(trial % 3);
        shape.second_input = (trial % 3) * 0.3;
        shape.second_output = (trial % 4) * 0.2;
        const Problem p = trial % 3 == 0 ? to_problem(random_chain(rng, 1 + trial % 3)) : testing::random_dag(rng, shape);
        const Reference ref = store_all_reference(p);
        const Bytes smallest = Exhaustive(plain).smallest_budget(p);
        INFO("trial " << trial << " (" << p.op_count() << " ops), smallest budget " << smallest);
        REQUIRE(Exhaustive{}.smallest_budget(p) == smallest);
        for (int k = -1; k <= 4; ++k) {
            const Bytes budget = k < 0 ? smallest - 1 : smallest + (ref.peak - smallest) * k / 4;
            INFO("budget " << budget);
            std::optional<Plan> without;
            try {
                without = Exhaustive(plain).solve(p, budget);
            } catch (const Infeasible&) {
            }
            without ? ++compared : ++infeasible;
            for (const auto& [bounds, options] : bounded) {
                INFO("bounds: " << bounds);
                std::optional<Plan> with;
                try {
                    with = Exhaustive(options).solve(p, budget);
                } catch (const Infeasible&) {
                }
                REQUIRE(with.has_value() == without.has_value());
                if (!with) continue;
                CHECK(with->time == without->time);
                CHECK(simulate(p, with->schedule).fits(budget));
            }
        }
    }
    CHECK(compared > 200);
    CHECK(infeasible >= 60);
}
