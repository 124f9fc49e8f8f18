// Checkmate<Backend>: exact against exhaustive search, never above Rotor on chains, valid
// and within budget always, time limits, LP rounding, and both backends agreeing.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <remat/milp/lp_solve.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/checkmate.hpp>
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif

#include "../support/fast_milp_backend.hpp"
#include "../support/op_level_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;

namespace {

using Fast = testing::FastMilp;

CheckmateOptions exact_options() {
    CheckmateOptions o;
    o.time_limit_seconds = milp::infinity;
    return o;
}

// A forward skip connection whose best schedule recomputes A "behind" C before D: it needs
// a pass without exactly-once op (one sweep more than a chain).
Problem skip_connection() {
    ProblemBuilder b("skip");
    const DataId x = b.add_data("x", 10), a = b.add_data("a", 100), bb = b.add_data("b", 10), c = b.add_data("c", 10),
                 d = b.add_data("d", 10);
    const DataId gd = b.add_data("gd", 10), gc = b.add_data("gc", 10), ga_d = b.add_data("ga.D", 100),
                 gb = b.add_data("gb", 10), ga_b = b.add_data("ga.B", 100), gx = b.add_data("gx", 10);
    b.add_op({"A", 1, 0, {x}, {a}, false});
    b.add_op({"B", 1, 0, {a}, {bb}, false});
    b.add_op({"C", 1, 300, {bb}, {c}, false});
    b.add_op({"D", 1, 0, {a, c}, {d}, false});
    b.add_op({"loss", 0, 0, {d}, {gd}, true});
    b.add_op({"BD", 1, 0, {gd, a, c}, {gc, ga_d}, true});
    b.add_op({"BC", 1, 0, {gc, bb}, {gb}, true});
    b.add_op({"BB", 1, 0, {gb, a}, {ga_b}, true});
    b.add_op({"BA", 1, 0, {ga_d, ga_b, x}, {gx}, true});
    b.add_initial(x);
    b.add_final(gx);
    return b.build();
}

struct Case {
    Problem problem;
    std::string what;
};

// The exactness corpus: chains of 1–3 stages and random DAGs of 2–6 forward ops (with their
// backward ops, 6–20 ops in all).
std::vector<Case> tiny_problems() {
    std::vector<Case> cases;
    for (unsigned seed = 0; seed < 40; ++seed) {
        std::mt19937 rng(seed);
        const std::size_t stages = 1 + seed % 3;
        cases.push_back({to_problem(testing::random_chain(rng, stages, "chain" + std::to_string(seed))),
                         "chain seed " + std::to_string(seed) + ", " + std::to_string(stages) + " stages"});
    }
    for (unsigned seed = 0; seed < 64; ++seed) {
        std::mt19937 rng(1000 + seed);
        testing::DagShape shape;
        shape.forward_ops = 2 + seed % 3 + (seed % 8 == 7 ? 2 : 0);
        cases.push_back({testing::random_dag(rng, shape, "dag" + std::to_string(seed)),
                         "dag seed " + std::to_string(seed) + ", " + std::to_string(shape.forward_ops) + " forward ops"});
    }
    cases.push_back({skip_connection(), "skip connection"});
    return cases;
}

}  // namespace

TEST_CASE("Checkmate equals exhaustive search on 105 tiny problems at several budgets") {
    const Checkmate<Fast> checkmate(exact_options());
    const Exhaustive exhaustive;
    std::size_t solved = 0, infeasible = 0;
    for (const Case& c : tiny_problems()) {
        INFO(c.what);
        const Problem& p = c.problem;
        const Bytes smallest = exhaustive.smallest_budget(p);
        const Bytes reference = store_all_reference(p).peak;
        // Below the smallest budget: both say infeasible, with the same smallest budget.
        try {
            (void)checkmate.solve(p, smallest - 1);
            FAIL("checkmate found a schedule below the smallest feasible budget " << smallest);
        } catch (const Infeasible& e) {
            REQUIRE(e.smallest_budget().has_value());
            CHECK(*e.smallest_budget() == smallest);
            ++infeasible;
        }
        for (const double fraction : {0.0, 0.35, 0.7, 1.0}) {
            const Bytes budget = smallest + static_cast<Bytes>(static_cast<double>(reference - smallest) * fraction);
            INFO("budget " << budget << " (smallest " << smallest << ", store-all " << reference << ")");
            const Plan best = exhaustive.solve(p, budget);
            const Plan plan = checkmate.solve(p, budget);
            CHECK(plan.time == Approx(best.time).epsilon(1e-9));
            CHECK(plan.stats.status == SolveStatus::optimal);
            REQUIRE(plan.stats.gap.has_value());
            CHECK(*plan.stats.gap == 0.0);
            const SimulationReport r = simulate(p, plan.schedule);
            CHECK(r.fits(budget));
            CHECK(r.time == plan.time);
            ++solved;
        }
    }
    CHECK(solved == 4 * 105);
    CHECK(infeasible == 105);
}

TEST_CASE("both backends give the same optimum; the min-peak MILP gives the smallest budget") {
    const Checkmate<milp::LpSolve> lpsolve(exact_options());
    const Checkmate<Fast> fast(exact_options());
    CheckmateOptions milp_only = exact_options();
    milp_only.exhaustive_first = false;
    const Checkmate<Fast> min_peak(milp_only);
    const Exhaustive exhaustive;
    for (unsigned seed = 0; seed < 16; ++seed) {
        std::mt19937 rng(77 + seed);
        const Problem p = seed % 2 == 0 ? to_problem(testing::random_chain(rng, 2 + seed % 3))
                                        : testing::random_dag(rng, testing::DagShape{2 + seed % 3});
        INFO("seed " << seed);
        const Bytes smallest = exhaustive.smallest_budget(p);
        const Bytes reference = store_all_reference(p).peak;
        for (const Bytes budget : {smallest, (smallest + reference) / 2}) {
            const Plan a = lpsolve.solve(p, budget);
            const Plan b = fast.solve(p, budget);
            CHECK(a.time == Approx(b.time).epsilon(1e-9));
            CHECK(a.stats.status == SolveStatus::optimal);
            CHECK(simulate(p, a.schedule).fits(budget));
        }
        CHECK(min_peak.smallest_budget(p) == smallest);
    }
}

TEST_CASE("on chains Checkmate is never above Rotor (persistent-only)") {
    const Checkmate<Fast> checkmate(exact_options());
    const Rotor rotor;
    std::size_t compared = 0;
    for (unsigned seed = 0; seed < 12; ++seed) {
        std::mt19937 rng(500 + seed);
        const Chain chain = testing::random_chain(rng, 2 + seed % 5);
        const Problem p = to_problem(chain);
        const Bytes reference = store_all_reference(p).peak;
        for (const int percent : {50, 65, 80, 100}) {
            const Bytes budget = percent_of(reference, percent);
            INFO("seed " << seed << " budget " << budget);
            Plan by_rotor;
            try {
                by_rotor = rotor.solve(p, budget);
            } catch (const Infeasible&) {
                continue;
            }
            const Plan plan = checkmate.solve(p, budget);
            CHECK(plan.time <= by_rotor.time + 1e-9);
            CHECK(simulate(p, plan.schedule).fits(budget));
            ++compared;
        }
    }
    CHECK(compared > 20);
}

TEST_CASE("a time limit that stops the search still returns a schedule that fits, with its gap") {
    std::mt19937 rng(42);
    const Problem p = to_problem(testing::random_chain(rng, 13));  // 40 ops
    const Bytes budget = percent_of(store_all_reference(p).peak, 40);
    CheckmateOptions o;
    o.time_limit_seconds = 0.3;
    const auto check = [&](const Plan& plan) {
        CHECK(simulate(p, plan.schedule).fits(budget));
        REQUIRE(plan.stats.gap.has_value());
        // plan time / the MILP's bound - 1: finite (a positive bound), and 0 only when proven
        CHECK(*plan.stats.gap >= 0.0);
        CHECK(std::isfinite(*plan.stats.gap));
        if (plan.stats.status == SolveStatus::feasible) CHECK(*plan.stats.gap > 0.0);
        CHECK(plan.stats.solve_seconds < 5.0);
    };
    const Plan fast = Checkmate<Fast>(o).solve(p, budget);
    CHECK(fast.stats.status == SolveStatus::feasible);  // this one needs many seconds to prove
    check(fast);
    check(Checkmate<milp::LpSolve>(o).solve(p, budget));
}

TEST_CASE("the skip connection needs one pass without exactly-once op, which the default allows") {
    const Problem p = skip_connection();
    const Bytes smallest = Exhaustive().smallest_budget(p);
    CHECK(smallest == 330);
    CheckmateOptions one_sweep = exact_options();
    one_sweep.extra_passes = 0;
    // The one-sweep MILP has no schedule there: what comes back is the greedy baseline.
    const Plan baseline = Checkmate<milp::LpSolve>(one_sweep).solve(p, smallest);
    CHECK_THAT(baseline.stats.options, Catch::Contains("returned=greedy") && Catch::Contains("the MILP found no schedule"));
    const Plan plan = Checkmate<milp::LpSolve>(exact_options()).solve(p, smallest);
    CHECK(plan.time == 9.0);
    CHECK(plan.stats.status == SolveStatus::optimal);
}

TEST_CASE("LP rounding: always valid and within budget, never below the optimum") {
    CheckmateOptions o;
    o.lp_rounding = true;
    o.warm_start = false;
    o.time_limit_seconds = 30;
    const Checkmate<Fast> rounding(o);
    const Exhaustive exhaustive;
    double ratio = 0.0;
    std::size_t n = 0;
    for (unsigned seed = 0; seed < 16; ++seed) {
        std::mt19937 rng(300 + seed);
        const Problem p = seed % 2 == 0 ? to_problem(testing::random_chain(rng, 2 + seed % 4))
                                        : testing::random_dag(rng, testing::DagShape{2 + seed % 4});
        const Bytes smallest = exhaustive.smallest_budget(p);
        const Bytes reference = store_all_reference(p).peak;
        for (const Bytes budget : {(2 * smallest + reference) / 3, (smallest + 2 * reference) / 3, reference}) {
            INFO("seed " << seed << " budget " << budget);
            const Plan plan = rounding.solve(p, budget);
            const Plan best = exhaustive.solve(p, budget);
            CHECK(simulate(p, plan.schedule).fits(budget));
            CHECK(plan.time >= best.time - 1e-9);
            REQUIRE(plan.stats.gap.has_value());
            CHECK(*plan.stats.gap >= 0.0);
            ratio += plan.time / best.time;
            ++n;
        }
    }
    CHECK(ratio / static_cast<double>(n) < 1.1);  // on average within 10 % of the optimum
}

TEST_CASE("Checkmate reports its status, model size and rejects bad options") {
    std::mt19937 rng(9);
    const Problem p = to_problem(testing::random_chain(rng, 4));
    const Reference ref = store_all_reference(p);
    const Checkmate<milp::LpSolve> checkmate;
    const Plan plan = checkmate.solve(p, ref.peak);
    CHECK(plan.time == ref.time);  // store-all fits: no recomputation
    CHECK(plan.stats.solver == "checkmate");
    CHECK(plan.stats.options.find("backend=lpsolve") != std::string::npos);
    const CheckmateModelSize size = checkmate.model_size(p, ref.peak);
    CHECK(size.passes == 5);  // one per backward op and the loss
    CHECK(size.integers > 0);
    CHECK(size.rows > 0);
    CHECK(size.variables >= size.integers);
    static_assert(Solver<Checkmate<milp::LpSolve>>);
    CheckmateOptions bad;
    bad.time_limit_seconds = 0;
    CHECK_THROWS_AS(Checkmate<milp::LpSolve>(bad), InvalidInput);
    bad = {};
    bad.relative_gap = -1;
    CHECK_THROWS_AS(Checkmate<milp::LpSolve>(bad), InvalidInput);
    bad = {};
    bad.time_bound_seconds = -1;
    CHECK_THROWS_AS(Checkmate<milp::LpSolve>(bad), InvalidInput);
    bad = {};
    bad.time_bound = std::nan("");
    CHECK_THROWS_AS(Checkmate<milp::LpSolve>(bad), InvalidInput);
    // The quick lower bound: an exactly-once op alone needs more than this.
    try {
        (void)checkmate.solve(p, 1);
        FAIL("a budget of 1 byte cannot fit");
    } catch (const Infeasible& e) {
        REQUIRE(e.smallest_budget().has_value());
        CHECK(*e.smallest_budget() == Exhaustive().smallest_budget(p));
    }
}

// Larger DAGs (7–8 forward ops, 20–25 ops in all): exhaustive search takes up to a minute
// per budget here, so this runs on demand only: `remat_milp_tests "[long]"`.
TEST_CASE("Checkmate equals exhaustive search on DAGs of 7 and 8 forward ops", "[.][long]") {
    const Checkmate<Fast> checkmate(exact_options());
    ExhaustiveOptions limits;
    limits.max_states = 40'000'000;
    limits.time_limit_seconds = 600;
    const Exhaustive exhaustive(limits);
    for (unsigned seed = 0; seed < 8; ++seed) {
        std::mt19937 rng(5000 + seed);
        testing::DagShape shape;
        shape.forward_ops = 7 + seed % 2;
        const Problem p = testing::random_dag(rng, shape, "dag" + std::to_string(seed));
        const Bytes smallest = exhaustive.smallest_budget(p);
        const Bytes reference = store_all_reference(p).peak;
        for (const double fraction : {0.0, 0.3, 0.6}) {
            const Bytes budget = smallest + static_cast<Bytes>(static_cast<double>(reference - smallest) * fraction);
            INFO("seed " << seed << ", budget " << budget);
            const Plan plan = checkmate.solve(p, budget);
            CHECK(plan.time == Approx(exhaustive.solve(p, budget).time).epsilon(1e-9));
            CHECK(plan.stats.status == SolveStatus::optimal);
        }
    }
}

// [timing]: a wall-time bound, left out of the sanitizers' run (instrumented code runs
// several times slower before and after the MILP, which the limit does not cover alike).
TEST_CASE("Checkmate honours its time limit on a 400-op graph and returns the best known schedule",
          "[checkmate][time-limit][timing]") {
    // CBC does not stop inside its root LP and cut loop: without the hard deadline of
    // milp/cbc.hpp, a Checkmate model of this size ran several times past its limit.
    testing::EncoderDecoderShape shape;
    shape.encoder = 4;
    shape.decoder = 3;  // about 400 ops
    const Problem p = testing::encoder_decoder_like(shape, "encdec-400");
    REQUIRE(p.op_count() >= 350);
    const Reference ref = store_all_reference(p);
    const Bytes budget = percent_of(ref.peak, 50);
    CheckmateOptions o;
    o.time_limit_seconds = 8.0;
    const Stopwatch clock;
    const Plan plan = Checkmate<Fast>(o).solve(p, budget);
    const double seconds = clock.seconds();
    INFO(plan.stats.options);
    // The greedy baseline and model building count against the limit; CBC's child is killed
    // at what is left of it, so only the schedule's rounding comes after.
    CHECK(seconds <= o.time_limit_seconds + 1.0);
    CHECK(simulate(p, plan.schedule).fits(budget));
    CHECK(plan.time <= Greedy{}.solve(p, budget).time);  // never worse than the greedy it starts from
}

// Building the integer program of a 400-op graph takes about 0.2 s here (a thousand ops:
// seconds and gigabytes); the time limit holds while it is built, not only while it is solved.
namespace {
struct BuildPastLimit {
    Problem problem = [] {
        testing::EncoderDecoderShape shape;
        shape.encoder = 4;
        shape.decoder = 3;  // about 400 ops
        return testing::encoder_decoder_like(shape, "encdec-400");
    }();
    Bytes budget = percent_of(store_all_reference(problem).peak, 50);
    CheckmateOptions options = [] {
        CheckmateOptions o;
        o.time_limit_seconds = 0.02;
        return o;
    }();
};
}  // namespace

TEST_CASE("Checkmate stops building its integer program at the time limit and returns the best known schedule",
          "[checkmate][time-limit]") {
    const BuildPastLimit k;
    const Plan plan = Checkmate<Fast>(k.options).solve(k.problem, k.budget);
    INFO(plan.stats.options);
    CHECK_THAT(plan.stats.options, Catch::Contains("ran out while building the MILP") && Catch::Contains("returned=greedy"));
    CHECK(plan.stats.status == SolveStatus::feasible);
    CHECK(simulate(k.problem, plan.schedule).fits(k.budget));
}

// [timing]: a wall-time bound, left out of the sanitizers' run.
TEST_CASE("Checkmate's time limit holds while its integer program is built", "[checkmate][time-limit][timing]") {
    const BuildPastLimit k;
    const Stopwatch clock;
    const Plan plan = Checkmate<Fast>(k.options).solve(k.problem, k.budget);
    INFO(plan.stats.options);
    CHECK(clock.seconds() <= k.options.time_limit_seconds + 0.25);  // the model's release included
    CHECK(plan.stats.solve_seconds <= k.options.time_limit_seconds + 0.05);
}

TEST_CASE("Checkmate's memory cap: a model beyond it is not built", "[checkmate][memory]") {
    testing::EncoderDecoderShape shape;
    shape.encoder = shape.decoder = 1;
    const Problem p = testing::encoder_decoder_like(shape, "encdec-120");
    const Reference ref = store_all_reference(p);
    CheckmateOptions o;
    o.max_run_variables = 1000;
    const Bytes budget = percent_of(ref.peak, 60);
    const Plan plan = Checkmate<Fast>(o).solve(p, budget);
    CHECK_THAT(plan.stats.options, Catch::Contains("memory cap") && Catch::Contains("returned=greedy"));
    CHECK(simulate(p, plan.schedule).fits(budget));
    // Below what any baseline fits, the cap is a clear error.
    const Bytes tight = memory_lower_bound(p).bytes;
    if (tight < Greedy{}.smallest_budget(p)) {
        try {
            (void)Checkmate<Fast>(o).solve(p, tight);
            FAIL("planned beyond the memory cap without a baseline");
        } catch (const SolverError& e) {
            CHECK_THAT(e.what(), Catch::Contains("max_run_variables"));
        }
    }
}

TEST_CASE("Checkmate's valid inequalities lift the root LP bound and never cut off the optimum", "[checkmate][root]") {
    // The pinned-liveness rows and the proven time bound's row hold for every schedule that
    // fits: the strengthened LP lies between the plain LP and the exact optimum.
    const Checkmate<Fast> checkmate(exact_options());
    const Exhaustive exhaustive;
    std::size_t compared = 0, lifted = 0;
    const std::vector<Case> cases = tiny_problems();
    for (std::size_t i = 0; i < cases.size(); i += 3) {
        const Case& c = cases[i];
        INFO(c.what);
        const Problem& p = c.problem;
        const Bytes smallest = exhaustive.smallest_budget(p);
        const Bytes reference = store_all_reference(p).peak;
        for (const double fraction : {0.0, 0.35, 0.7}) {
            const Bytes budget = smallest + static_cast<Bytes>(static_cast<double>(reference - smallest) * fraction);
            INFO("budget " << budget);
            const double optimum = exhaustive.solve(p, budget).time;
            const CheckmateRootBounds root = checkmate.root_bounds(p, budget);
            CHECK(root.plain <= optimum * (1 + 1e-9));
            CHECK(root.time_bound <= optimum * (1 + 1e-9));
            CHECK(root.strengthened <= optimum * (1 + 1e-9));
            CHECK(root.strengthened >= root.plain * (1 - 1e-6));
            CHECK(root.strengthened >= root.time_bound * (1 - 1e-6));
            ++compared;
            if (root.strengthened > root.plain * (1 + 1e-6)) ++lifted;
        }
    }
    CHECK(compared == 3 * 35);
    // The plain LP is weak (it runs ops in fractions of passes): the rows lift it often.
    INFO(lifted << " of " << compared << " budgets lifted");
    CHECK(lifted * 2 > compared);
}

TEST_CASE("the pinned-liveness rows keep every schedule of the passes: a warm start is a solution", "[checkmate][root]") {
    using namespace detail::checkmate;
    for (unsigned seed = 0; seed < 12; ++seed) {
        std::mt19937 rng(500 + seed);
        testing::DagShape shape;
        shape.forward_ops = 3 + seed % 4;
        const Problem p = testing::random_dag(rng, shape, "dag");
        const Analysis a = analyse(p);
        Formulation with_rows(p, a, make_layout(p, a, 1), store_all_reference(p).peak);
        const Formulation without(p, a, make_layout(p, a, 1), store_all_reference(p).peak, {}, false);
        INFO("seed " << seed);
        CHECK(with_rows.size().rows > without.size().rows);
        const Schedule s = without_useless_runs(p, store_all_reference(p).schedule);
        REQUIRE(start_from(a, p, with_rows, s));
        CHECK(with_rows.model().is_feasible(*with_rows.model().start()));
    }
}

TEST_CASE("a start that meets the proven time bound is returned as optimal without a search", "[checkmate][root]") {
    std::mt19937 rng(7);
    const Problem p = to_problem(testing::random_chain(rng, 6));
    const Reference ref = store_all_reference(p);
    // At the store-all peak the bound is the store-all time, which the start meets.
    const Plan plan = Checkmate<Fast>(exact_options()).solve(p, ref.peak);
    CHECK(plan.time == ref.time);
    CHECK(plan.stats.status == SolveStatus::optimal);
    CHECK_THAT(plan.stats.options, Catch::Contains("meets the proven time bound"));
    // Without the bound the MILP proves the same.
    CheckmateOptions no_bound = exact_options();
    no_bound.time_bound_seconds = 0;
    const Plan searched = Checkmate<Fast>(no_bound).solve(p, ref.peak);
    CHECK(searched.time == ref.time);
    CHECK(searched.stats.status == SolveStatus::optimal);
    CHECK_THAT(searched.stats.options, !Catch::Contains("meets the proven time bound"));

    // A bound given by the caller is used as it is: the exact optimum, with the optimal
    // schedule as the start, ends the solve at once.
    const Bytes budget = percent_of(ref.peak, 60);
    const Plan best = Exhaustive().solve(p, budget);
    CheckmateOptions given = exact_options();
    given.time_bound = best.time;
    given.start = best.schedule;
    const Plan proven = Checkmate<Fast>(given).solve(p, budget);
    CHECK(proven.time == Approx(best.time).epsilon(1e-12));
    CHECK(proven.stats.status == SolveStatus::optimal);
    // The greedy's plan meets the optimum here too: the caller's start wins the tie.
    CHECK(Greedy().solve(p, budget).time == Approx(best.time).epsilon(1e-12));
    CHECK_THAT(proven.stats.options, Catch::Contains("returned=the given start (meets the proven time bound)"));
}

TEST_CASE("a search stopped by its time limit reports its gap against the proven time bound", "[checkmate][root]") {
    std::mt19937 rng(42);
    const Problem p = to_problem(testing::random_chain(rng, 13));  // 40 ops
    const Bytes budget = percent_of(store_all_reference(p).peak, 40);
    const TimeLowerBound bound = time_lower_bound(p, budget, Fast{});
    REQUIRE(!bound.budget_infeasible);
    CheckmateOptions o;
    o.time_limit_seconds = 0.3;  // far too short to prove this one
    o.time_bound = bound.time;
    const Plan plan = Checkmate<Fast>(o).solve(p, budget);
    REQUIRE(plan.stats.gap.has_value());
    CHECK(plan.time >= bound.time * (1 - 1e-9));
    // The gap is measured against a bound at least as high as the proven time bound.
    CHECK(*plan.stats.gap <= plan.time / bound.time - 1.0 + 1e-9);
}
