// solvers/window_search.hpp: windows of a plan searched again by the exact search. Every
// result is valid, within the budget and never slower; where the search over the whole
// schedule finishes, the result is the exact optimum and says so; faster windows are found
// where the heuristics miss the optimum; problems beyond the exact search come back as they
// are; and Auto and refine_plan use it.
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

using testing::greedy_plan;

TEST_CASE("window search: valid, within budget, never slower, and exact where the whole search finishes",
          "[window_search][property]") {
    std::mt19937 rng(2026);
    int checked = 0, faster = 0, optimal = 0;
    for (int trial = 0; trial < 60; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 3 + static_cast<std::size_t>(trial % 4);
        const Problem p = testing::random_dag(rng, shape, "dag-" + std::to_string(trial));
        const Reference ref = store_all_reference(p);
        const Bytes budget = percent_of(ref.peak, 60 + 10 * (trial % 4));
        const std::optional<Plan> plan = greedy_plan(p, budget);
        if (!plan) continue;
        WindowSearchOptions options;
        options.time_limit_seconds = 30;  // the state cap ends each window first on these sizes
        options.window_runs = 2;
        const WindowSearchResult result = window_search(p, budget, *plan, options);
        INFO("trial " << trial << ": " << result.plan.stats.options);
        const SimulationReport sim = simulate(p, result.plan.schedule);
        REQUIRE(sim.fits(budget));
        CHECK(sim.time == Approx(result.plan.time));
        CHECK(result.plan.time <= plan->time);
        ++checked;
        if (result.faster_windows > 0) {
            ++faster;
            CHECK(result.plan.time < plan->time);
        }
        if (result.optimal) {
            ++optimal;
            CHECK(result.plan.stats.status == SolveStatus::optimal);
            CHECK(result.plan.time == Approx(Exhaustive{}.solve(p, budget).time));
        }
    }
    INFO(checked << " plans, " << faster << " made faster, " << optimal << " proven optimal");
    CHECK(checked >= 30);
    CHECK(faster >= 5);
    CHECK(optimal >= checked / 2);
}

TEST_CASE("window search: a faster window where the heuristics miss the optimum", "[window_search]") {
    // The DAG of test_hierarchical.cpp's missed_optimum(): at 60 % of P_ref the heuristics' plan
    // was 63 where the optimum is 51.
    std::mt19937 rng(51);
    testing::DagShape shape;
    shape.forward_ops = 6;
    const Problem p = testing::random_dag(rng, shape, "dag-51");
    const Bytes budget = percent_of(store_all_reference(p).peak, 60);
    const double optimum = Exhaustive{}.solve(p, budget).time;
    const std::optional<Plan> plan = greedy_plan(p, budget);
    REQUIRE(plan);
    REQUIRE(plan->time > optimum);
    WindowSearchOptions options;
    options.time_limit_seconds = 30;
    int lines = 0;
    options.progress = [&](const std::string& line) {
        ++lines;
        CHECK_THAT(line, Catch::StartsWith("window search: runs "));
    };
    const WindowSearchResult result = window_search(p, budget, *plan, options);
    CHECK(result.plan.time == Approx(optimum));
    CHECK(result.optimal);
    CHECK(result.faster_windows >= 1);
    CHECK(lines == static_cast<int>(result.faster_windows));
    CHECK_THAT(result.plan.stats.options, Catch::Contains("window search (") && Catch::Contains("proven optimal by the window search"));
    CHECK(result.plan.stats.gap == 0.0);
}

// The whole backward, from the loss's run, searched first: on bench_checkmate's DAGs the
// greedy's backward is far from the best one from what it keeps at the loss, and the sliding
// windows (off here: no states) cannot reorder it as a whole.
TEST_CASE("window search: the backward from the loss's run is searched whole", "[window_search]") {
    struct Case {
        std::size_t ops;
        int percent;
    };
    for (const Case c : {Case{20, 80}, Case{40, 50}}) {
        const Problem p = testing::bench_dag(c.ops, 1);
        const Bytes budget = percent_of(store_all_reference(p).peak, c.percent);
        const Plan plan = Greedy{}.solve(p, budget);
        WindowSearchOptions options;
        options.time_limit_seconds = 60;
        options.max_states_per_window = 0;
        std::vector<std::string> lines;
        options.progress = [&](const std::string& line) { lines.push_back(line); };
        const WindowSearchResult result = window_search(p, budget, plan, options);
        INFO(c.ops << " ops at " << c.percent << " %: greedy " << plan.time << ", searched " << result.plan.time);
        CHECK(simulate(p, result.plan.schedule).fits(budget));
        REQUIRE_FALSE(lines.empty());
        CHECK_THAT(lines.front(), Catch::StartsWith("window search: runs ") && Catch::Contains("(the backward)"));
        CHECK(result.plan.time < 0.95 * plan.time);  // 51 -> 46 and 150 -> 111
        options.backward_max_states = 0;
        CHECK(window_search(p, budget, plan, options).plan.time == plan.time);
    }
    // The 20-op DAG at 80 %: the greedy's plan with its backward searched again is the optimum.
    const Problem p = testing::bench_dag(20, 1);
    const Bytes budget = percent_of(store_all_reference(p).peak, 80);
    WindowSearchOptions backward_only;
    backward_only.max_states_per_window = 0;
    CHECK(window_search(p, budget, Greedy{}.solve(p, budget), backward_only).plan.time ==
          Approx(Exhaustive{}.solve(p, budget).time));
}

TEST_CASE("window search: out of the exact search's reach the plan comes back as it is; bad options are refused",
          "[window_search]") {
    std::mt19937 rng(7);
    testing::DagShape shape;
    shape.forward_ops = 40;  // over 128 data
    const Problem big = testing::random_dag(rng, shape, "big");
    REQUIRE(big.data_count() > 128);
    const Bytes budget = store_all_reference(big).peak;
    const Plan plan = Greedy{}.solve(big, budget);
    const WindowSearchResult result = window_search(big, budget, plan);
    CHECK(result.plan.schedule == plan.schedule);
    CHECK_FALSE(result.optimal);
    CHECK(result.faster_windows == 0);
    WindowSearchOptions bad;
    bad.time_limit_seconds = -1;
    CHECK_THROWS_AS(window_search(big, budget, plan, bad), InvalidInput);
}

TEST_CASE("auto and refine_plan search the plan's windows: never slower than without", "[window_search][auto]") {
    std::mt19937 rng(99);
    AutoOptions with;
    with.certify_seconds = 0.0;
    with.second_opinion_max_ops = 0;
    with.window_search_seconds = 2.0;
    AutoOptions without = with;
    without.window_search_seconds = 0.0;
    int compared = 0;
    for (int trial = 0; trial < 6; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 5 + static_cast<std::size_t>(trial % 3);
        const Problem p = testing::random_dag(rng, shape, "dag-" + std::to_string(trial));
        const Bytes budget = percent_of(store_all_reference(p).peak, 60 + 5 * trial);
        const AutoModel model = Auto(without).analyse(p);
        std::optional<Plan> plain;
        try {
            plain = Auto(without).solve(model, budget);
        } catch (const Infeasible&) {
            continue;
        }
        const Plan searched = Auto(with).solve(model, budget);
        INFO("trial " << trial << ": " << searched.stats.options);
        CHECK(simulate(p, searched.schedule).fits(budget));
        CHECK(searched.time <= plain->time);
        ++compared;
        // refine_plan, against the exact optimum as the bound: the window search reaches it.
        const double optimum = Exhaustive{}.solve(p, budget).time;
        RefineOptions ro;
        ro.time_limit_seconds = 20;
        ro.target_gap = 0.0;
        const Plan refined = refine_plan(p, budget, *plain, optimum, ro);
        CHECK(refined.time <= plain->time);
        CHECK(simulate(p, refined.schedule).fits(budget));
        CHECK(refined.stats.status == SolveStatus::optimal);
    }
    CHECK(compared >= 3);
}

// Auto polishes the exact component's plan (local improvement, then the window search): on
// bench_checkmate's 40-op DAG at 50 % of P_ref, Checkmate's plan kept recomputations the
// budget did not need. Here the component returns the exact optimum with one needless run
// added (an op run again right after itself: it writes nothing new and only costs its time).
TEST_CASE("auto polishes the exact component's plan: a run it did not need is dropped", "[window_search][auto]") {
    std::mt19937 rng(7);
    int polished = 0;
    for (int trial = 0; trial < 300 && polished < 3; ++trial) {
        testing::DagShape shape;
        shape.forward_ops = 4 + static_cast<std::size_t>(trial % 3);
        const Problem p = testing::random_dag(rng, shape, "dag-" + std::to_string(trial));
        const Bytes budget = percent_of(store_all_reference(p).peak, 60 + 10 * (trial % 3));
        std::optional<Plan> optimum;
        try {
            optimum = Exhaustive{}.solve(p, budget);
        } catch (const Infeasible&) {
            continue;
        }
        // The cheapest op that may run again, run twice where it first runs.
        std::optional<OpId> cheapest;
        for (const Step& step : optimum->schedule)
            if (step.is_run() && !p.op(step.op()).exactly_once && (!cheapest || p.op(step.op()).time < p.op(*cheapest).time))
                cheapest = step.op();
        if (!cheapest) continue;
        Schedule padded;
        bool added = false;
        for (const Step& step : optimum->schedule) {
            padded.push_back(step);
            if (!added && step == Step::run(*cheapest)) {
                padded.push_back(step);
                added = true;
            }
        }
        const SimulationReport padded_report = simulate(p, padded);
        REQUIRE(padded_report.fits(budget));
        REQUIRE(padded_report.time > optimum->time);
        AutoOptions with;
        with.time_limit_seconds = 2.0;
        with.certify_seconds = 0.0;
        with.second_opinion_max_ops = 0;
        with.exact_fallback = false;
        with.loss_state_search_share = 0.0;  // it finds the optimum before the component on these DAGs
        bool taken = false;
        with.exact_component = [&](const Problem&, Bytes, const Plan& incumbent, double) -> std::optional<Plan> {
            if (!(padded_report.time < incumbent.time)) return std::nullopt;
            taken = true;
            Plan plan = *optimum;
            plan.schedule = padded;
            plan.time = padded_report.time;
            plan.peak = padded_report.peak;
            return plan;
        };
        AutoOptions without = with;
        without.window_search_seconds = 0.0;
        const Plan plain = Auto(without).solve(p, budget);
        if (!taken) continue;  // the heuristics' plan is faster than the padded one
        INFO("trial " << trial << ": " << plain.stats.options);
        CHECK(plain.time == Approx(padded_report.time));  // the control: without the polish, the run stays
        taken = false;
        const Plan plan = Auto(with).solve(p, budget);
        INFO(plan.stats.options);
        if (!taken) continue;  // the heuristics, within their time, found a faster plan this time
        CHECK(simulate(p, plan.schedule).fits(budget));
        CHECK(plan.time == Approx(optimum->time));
        CHECK(plan.stats.options.find("exact component") != std::string::npos);
        ++polished;
    }
    CHECK(polished >= 3);
}

// Auto searches the heuristics' backward whole before the exact component, which then starts
// from that plan (AutoOptions::backward_search_share): bench_checkmate's 40-op DAG, with an
// exact component that only records the plan it is given. [timing]: whether the search finishes
// within its share of the 6 s depends on the machine's speed (not under the sanitizers).
TEST_CASE("auto searches the plan's backward before the exact component", "[window_search][auto][timing]") {
    int faster = 0;
    for (const int percent : {50, 60}) {
        const Problem p = testing::bench_dag(40, 1);
        const Bytes budget = percent_of(store_all_reference(p).peak, percent);
        AutoOptions with;
        with.time_limit_seconds = 6.0;
        with.certify_seconds = 0.0;
        with.exact_fallback = false;
        with.window_search_seconds = 0.0;
        with.loss_state_search_share = 0.0;  // after the backward search, it would make both plans equal
        std::vector<std::string> lines;
        with.progress = [&](const std::string& line) {
            if (line.starts_with("auto: ")) lines.push_back(line);
        };
        std::optional<double> given;  // the incumbent's time the component is given
        with.exact_component = [&](const Problem&, Bytes, const Plan& incumbent, double) -> std::optional<Plan> {
            given = incumbent.time;
            return std::nullopt;
        };
        AutoOptions without = with;
        without.backward_search_share = 0.0;
        const Plan plain = Auto(without).solve(p, budget);
        REQUIRE(given);
        const double plain_given = *given;
        CHECK(plain.time == Approx(plain_given));
        lines.clear();
        given.reset();
        const Plan searched = Auto(with).solve(p, budget);
        INFO(percent << " %: " << plain.stats.options << " / " << searched.stats.options);
        REQUIRE(given);
        CHECK(simulate(p, searched.schedule).fits(budget));
        CHECK(searched.time == Approx(*given));
        CHECK(searched.time <= plain.time);
        const auto at = [&](std::string_view what) {
            return std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
        };
        CHECK(at("searching the backward") < at("the exact component"));
        if (searched.time < plain.time) ++faster;
    }
    CHECK(faster >= 1);  // 128 -> 109 at 50 %, 108 -> 103 at 60 % when measured
}
