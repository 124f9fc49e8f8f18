// solvers/loss_state_search.hpp: other states at the loss, each with its exact best backward.
// Every result is valid, within the budget and never slower than its input, and never faster
// than the exact optimum; the search finds the optimum where the heuristics keep the wrong
// data for the backward; the preferred data steer it; it stops at a time bound; bad input is
// refused and problems it cannot take come back as they are; Auto runs it before its exact
// component.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/remat.hpp>

#include "../support/random_problems.hpp"
#include "../support/start_plans.hpp"

using namespace remat;

namespace {

using testing::greedy_plan;

// bench_checkmate's 40-op DAG at 60 % of P_ref: the heuristics keep o8, o12 and s8 at the loss
// (96 at best), where the optimum, 93 (Checkmate proved it in 240 s; the time bound's
// relaxation proves 93 is a bound), keeps o1, o7.b, o9, s7 and s9.
struct Dag40 {
    Problem problem = testing::bench_dag(40, 1);
    Bytes budget = percent_of(store_all_reference(problem).peak, 60);
    static constexpr double optimum = 93.0;
    // What the time bound's relaxation keeps at the loss besides the loss's reads
    // (TimeLowerBound::live_at_loss with CBC; tests/milp checks that the search preferring the
    // bound's own list meets the bound).
    static std::vector<std::string> relaxation() { return {"o5", "o7.b", "s3", "s5", "s7", "s9", "s10", "s11"}; }
};

}  // namespace

TEST_CASE("loss-state search: valid, within budget, never slower, never below the optimum",
          "[loss_state_search][property]") {
    std::mt19937 rng(2027);
    int checked = 0, faster = 0, at_optimum = 0;
    for (int trial = 0; trial < 80; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 3 + static_cast<std::size_t>(trial % 4);
        const Problem p = testing::random_dag(rng, shape, "dag-" + std::to_string(trial));
        const Bytes budget = percent_of(store_all_reference(p).peak, 50 + 10 * (trial % 4));
        const std::optional<Plan> plan = greedy_plan(p, budget);
        if (!plan) continue;
        LossStateSearchOptions options;
        options.time_limit_seconds = 10;
        const LossStateSearchResult result = loss_state_search(p, budget, *plan, options);
        INFO("trial " << trial << ": " << plan->time << " -> " << result.plan.time << ", " << result.keep_sets << " keep sets");
        const SimulationReport sim = simulate(p, result.plan.schedule);
        REQUIRE(sim.fits(budget));
        CHECK(sim.time == Approx(result.plan.time));
        CHECK(result.plan.time <= plan->time);
        CHECK(result.improved == (result.plan.time < plan->time));
        CHECK(result.keep_sets >= 1);
        CHECK(result.complete);  // a few data: every keep set within 10 s
        const Plan optimum = Exhaustive{}.solve(p, budget);
        CHECK(result.plan.time >= optimum.time - 1e-9);
        if (result.plan.time <= optimum.time + 1e-9) ++at_optimum;
        ++checked;
        if (result.improved) ++faster;
    }
    INFO(checked << " plans, " << faster << " made faster, " << at_optimum << " at the optimum");
    CHECK(checked >= 24);
    CHECK(faster >= 1);
    // These DAGs' optima keep the right data at the loss after a forward that runs once: all
    // 30 plans were at the optimum when this was written (28 made faster than the greedy's).
    CHECK(at_optimum * 10 >= checked * 9);
}

TEST_CASE("loss-state search: the optimum of bench_checkmate's 40-op DAG at 60 %, which the heuristics miss",
          "[loss_state_search]") {
    const Dag40 dag;
    const std::optional<Plan> greedy = greedy_plan(dag.problem, dag.budget);
    REQUIRE(greedy);
    REQUIRE(greedy->time > Dag40::optimum);
    LossStateSearchOptions options;
    options.time_limit_seconds = 60;  // both stop at the bound well before (about 1 s at most)
    options.time_bound = Dag40::optimum;
    std::vector<std::string> lines;
    options.progress = [&](std::string_view line) { lines.emplace_back(line); };
    const LossStateSearchResult without = loss_state_search(dag.problem, dag.budget, *greedy, options);
    options.preferred = Dag40::relaxation();
    const LossStateSearchResult with = loss_state_search(dag.problem, dag.budget, *greedy, options);
    for (const LossStateSearchResult* r : {&without, &with}) {
        INFO(r->plan.stats.options << "; " << r->keep_sets << " keep sets");
        CHECK(r->plan.time == Approx(Dag40::optimum));
        CHECK(simulate(dag.problem, r->plan.schedule).fits(dag.budget));
        CHECK(r->improved);
        CHECK_FALSE(r->complete);  // it stopped at the bound
        CHECK(r->plan.stats.options.find("loss-state search") != std::string::npos);
    }
    // The relaxation's choice first: 93 after tens of keep sets instead of thousands.
    CHECK(with.keep_sets * 10 < without.keep_sets);
    REQUIRE_FALSE(lines.empty());
    CHECK(lines.back().rfind("loss-state search: keep set ", 0) == 0);
}

TEST_CASE("loss-state search: bad input is refused; problems it cannot take come back as they are",
          "[loss_state_search]") {
    const Dag40 dag;
    const Plan plan = *greedy_plan(dag.problem, dag.budget);
    LossStateSearchOptions unknown;
    unknown.preferred = {"o5", "no-such-data"};
    CHECK_THROWS_WITH(loss_state_search(dag.problem, dag.budget, plan, unknown),
                      Catch::Contains("'no-such-data'") && Catch::Contains("dag-40"));
    LossStateSearchOptions negative;
    negative.time_limit_seconds = -1;
    CHECK_THROWS_AS(loss_state_search(dag.problem, dag.budget, plan, negative), InvalidInput);

    // Over the budget it is given: nothing to start from.
    const LossStateSearchResult over = loss_state_search(dag.problem, plan.peak - 1, plan);
    CHECK(over.plan.schedule == plan.schedule);
    CHECK(over.keep_sets == 0);
    // No loss: nothing splits the schedule.
    ProblemBuilder b("no-loss");
    const DataId x = b.add_data("x", 4), y = b.add_data("y", 4), z = b.add_data("z", 4);
    b.add_op({"F", 1, 0, {x}, {y}, false});
    b.add_op({"G", 1, 0, {y}, {z}, false});
    b.add_initial(x);
    b.add_final(z);
    const Problem chain = b.build();
    REQUIRE_FALSE(chain.loss().has_value());
    const Plan stored = StoreAll{}.solve(chain, store_all_reference(chain).peak);
    const LossStateSearchResult no_loss = loss_state_search(chain, stored.peak, stored);
    CHECK(no_loss.plan.schedule == stored.schedule);
    CHECK_FALSE(no_loss.improved);
}

TEST_CASE("auto searches the states at the loss before the exact component", "[loss_state_search][auto][timing]") {
    const Dag40 dag;
    AutoOptions options;
    options.time_limit_seconds = 8;
    std::vector<std::string> lines;
    options.progress = [&](std::string_view line) { lines.emplace_back(line); };
    std::optional<double> given;
    options.exact_component = [&](const Problem&, Bytes, const Plan& incumbent, double) -> std::optional<Plan> {
        given = incumbent.time;
        return std::nullopt;
    };
    SECTION("without a bound, the component starts from its plan") {
        const Plan plan = Auto(options).solve(dag.problem, dag.budget);
        REQUIRE(given.has_value());
        CHECK(plan.time <= *given);
        const auto at = [&](const std::string& what) {
            return std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
        };
        CHECK(at("searching the states at the loss") < at("the exact component"));
        CHECK(at("searching the states at the loss") != lines.end());
    }
    SECTION("with the bound and the relaxation's choice, the optimum ends the search before the component") {
        // About 0.4 s of search from the heuristics' plan; a longer limit (the plan ends it
        // early) and no backward search before it leave it seconds even on a loaded machine
        // (with 8 s and the backward search, a run beside the other tests once ended at 97).
        options.time_limit_seconds = 20;
        options.backward_search_share = 0;
        options.time_bound = Dag40::optimum;
        options.loss_state_preferred = Dag40::relaxation();
        const Plan plan = Auto(options).solve(dag.problem, dag.budget);
        INFO(plan.stats.options);
        CHECK(plan.time == Approx(Dag40::optimum));
        CHECK(plan.stats.status == SolveStatus::optimal);
        CHECK_FALSE(given.has_value());
    }
    SECTION("off at share 0") {
        options.loss_state_search_share = 0;
        (void)Auto(options).solve(dag.problem, dag.budget);
        CHECK(std::none_of(lines.begin(), lines.end(),
                           [](const std::string& l) { return l.find("states at the loss") != std::string::npos; }));
    }
}

// [timing]: the search has a quarter of the limit; under the sanitizers, without the
// relaxation's data first, it once ended at 97 within it.
TEST_CASE("refine_plan searches other states at the loss before the windows", "[loss_state_search][refine][timing]") {
    const Dag40 dag;
    const Plan greedy = *greedy_plan(dag.problem, dag.budget);
    RefineOptions options;
    options.time_limit_seconds = 40;  // it meets the bound within its quarter, in well under a second
    options.target_gap = 0.0;
    options.loss_state_preferred = Dag40::relaxation();
    std::vector<std::string> lines;
    options.progress = [&](std::string_view line) { lines.emplace_back(line); };
    const Plan refined = refine_plan(dag.problem, dag.budget, greedy, Dag40::optimum, options);
    INFO(refined.stats.options);
    CHECK(refined.time == Approx(Dag40::optimum));
    CHECK(refined.stats.status == SolveStatus::optimal);
    CHECK(simulate(dag.problem, refined.schedule).fits(dag.budget));
    CHECK(std::any_of(lines.begin(), lines.end(),
                      [](const std::string& l) { return l.find("other states at the loss searched") != std::string::npos; }));
    for (const double share : {-0.5, 1.5}) {
        RefineOptions bad;
        bad.loss_state_share = share;
        CHECK_THROWS_WITH(refine_plan(dag.problem, dag.budget, greedy, Dag40::optimum, bad),
                          Catch::Contains("loss-state search's share"));
    }
}
