// Time limits that cover a whole solve: H-Rockmate's planning at one budget
// (HRockmateOptions::budget_time_limit_seconds: every component together), and remat::Auto's
// time limit over analysis and planning (AutoOptions::time_limit_seconds). Wall-time
// assertions: tagged [timing] and left out of the sanitizer runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include "../support/random_problems.hpp"
#include "../support/remat_plan_in_process.hpp"

using namespace remat;

namespace {

// A dense random DAG: too large to plan flat (more than 64 data), small enough (at most 128
// data) that H-Rockmate also tries its exact search at every budget.
Problem dense_dag(std::uint32_t seed, std::size_t forward_ops) {
    std::mt19937 rng(seed);
    testing::DagShape shape;
    shape.forward_ops = forward_ops;
    shape.second_input = 0.7;
    shape.second_output = 0.3;
    return testing::random_dag(rng, shape, "dense-" + std::to_string(seed));
}

// The DAG of bench_checkmate's 40-op row of `seed`: Auto picks Rockmate, whose large block
// cannot be planned, and H-Rockmate's flat exact search at the top stops at its limit.
Problem bench_dag_40(std::uint32_t seed) { return testing::bench_dag(40, seed); }

// A budget that the greedy reaches, low enough that the searches have work to do.
Bytes low_budget(const Problem& p) {
    const Bytes least = Greedy{}.smallest_budget(p);
    return least + (store_all_reference(p).peak - least) / 5;
}

}  // namespace

TEST_CASE("time limits: H-Rockmate plans at a budget within budget_time_limit_seconds, all components together",
          "[limits][timing]") {
    const Problem p = dense_dag(7, 28);
    REQUIRE(p.data_count() > 64);
    REQUIRE(p.data_count() <= 128);
    const Bytes budget = low_budget(p);
    HRockmateOptions own;  // the components' own limits
    own.time_limit_seconds = 2.0;
    const HRockmateModel model = HRockmate(own).analyse(p);

    const Stopwatch unlimited_clock;
    const Plan unlimited = HRockmate(own).solve(model, budget);
    const double unlimited_seconds = unlimited_clock.seconds();

    HRockmateOptions limited = own;
    limited.budget_time_limit_seconds = 0.4;
    const Stopwatch clock;
    const Plan plan = HRockmate(limited).solve(model, budget);
    const double seconds = clock.seconds();
    INFO("components' own limits: " << unlimited_seconds << " s; limited to 0.4 s: " << seconds << " s");
    // The components alone take longer than the limit, so the limit is what stops them.
    REQUIRE(unlimited_seconds > 1.0);
    CHECK(seconds <= 0.4 * 1.1 + 0.05);
    const SimulationReport r = simulate(p, plan.schedule);
    CHECK(r.valid);
    CHECK(r.peak <= budget);
    CHECK(simulate(p, unlimited.schedule).peak <= budget);
}

TEST_CASE("time limits: Auto's limit covers analysis and planning at the budget", "[limits][timing]") {
    const Problem p = dense_dag(11, 90);
    REQUIRE(auto_choice(p) == AutoChoice::hrockmate);
    const Bytes budget = low_budget(p);
    for (const double limit : {1.0, 3.0}) {
        AutoOptions options;
        options.time_limit_seconds = limit;
        const Stopwatch clock;
        const Plan plan = Auto(options).solve(p, budget);
        const double seconds = clock.seconds();
        INFO("time limit " << limit << " s: solved in " << seconds << " s");
        CHECK(seconds <= limit * 1.1 + 0.05);
        const SimulationReport r = simulate(p, plan.schedule);
        CHECK(r.valid);
        CHECK(r.peak <= budget);
    }
}

TEST_CASE("time limits: a sweep's budgets each get the planning share after one analysis", "[limits][timing]") {
    const Problem p = dense_dag(11, 90);
    AutoOptions options;
    options.time_limit_seconds = 2.0;
    const Auto solver(options);
    const AutoModel model = solver.analyse(p);
    CHECK(model.seconds <= auto_analysis_share * 2.0 * 1.1 + 0.05);
    const Bytes least = Greedy{}.smallest_budget(p);
    for (const Bytes budget : {least, (least + store_all_reference(p).peak) / 2}) {
        const Stopwatch clock;
        const Plan plan = solver.solve(model, budget);
        INFO("budget " << budget << ": planned in " << clock.seconds() << " s after an analysis of " << model.seconds
                       << " s");
        CHECK(clock.seconds() <= std::max((1 - auto_analysis_share) * 2.0, 2.0 - model.seconds) * 1.1 + 0.05);
        CHECK(simulate(p, plan.schedule).peak <= budget);
    }
}

// The DAGs of bench_checkmate's 40-op rows (seeds 1 and 2). H-Rockmate's weighted fallback
// once got the exact search's limit again: 4.7 s and 5.8 s under a 4 s limit.
TEST_CASE("time limits: Auto's limit holds when H-Rockmate's exact search at the top stops (40-op DAGs)",
          "[limits][timing]") {
    for (const std::uint32_t seed : {1U, 2U}) {
        const Problem dag = bench_dag_40(seed);
        REQUIRE(dag.op_count() == 40);
        const Bytes budget = percent_of(store_all_reference(dag).peak, 60);
        AutoOptions options;
        options.time_limit_seconds = 4.0;
        const Stopwatch clock;
        const Plan plan = Auto(options).solve(dag, budget);
        const double seconds = clock.seconds();
        INFO("seed " << seed << ": " << plan.stats.options << "; solved in " << seconds << " s");
        CHECK(seconds <= 4.0 * 1.1 + 0.05);
        CHECK(simulate(dag, plan.schedule).peak <= budget);
    }
}

// On bench_checkmate's 40-op DAG at 60 %, the analyses and the heuristics once took the whole
// limit and Checkmate (remat-plan's exact component, which found the best plans there) ran for
// 0.4 s of 10.
TEST_CASE("time limits: Auto keeps its share of the limit for the exact component", "[limits][timing]") {
    const Problem dag = bench_dag_40(1);
    const Bytes budget = percent_of(store_all_reference(dag).peak, 60);
    const double limit = 4.0;
    AutoOptions options;
    options.time_limit_seconds = limit;
    std::optional<double> given;
    options.exact_component = [&](const Problem& q, Bytes b, const Plan& incumbent, double seconds) -> std::optional<Plan> {
        given = seconds;
        CHECK(simulate(q, incumbent.schedule).fits(b));
        return std::nullopt;
    };
    const Auto solver(options);
    const Stopwatch clock;
    const AutoModel model = solver.analyse(dag);
    CHECK(model.seconds <= auto_analysis_share * (1 - options.exact_component_share) * limit * 1.1 + 0.05);
    const Plan plan = solver.solve(model, budget);
    INFO(plan.stats.options << "; analysed in " << model.seconds << " s, solved in " << clock.seconds() << " s");
    REQUIRE(given.has_value());
    // The reserve less the polish after the component (window search, at most a quarter of it),
    // and less the backward search and the loss-state search before it (each a share of what
    // is left at most).
    const double reserve = options.exact_component_share * limit;
    CHECK(*given >= 0.9 * (1.0 - options.backward_search_share) * (1.0 - options.loss_state_search_share) *
                        (reserve - std::min(options.window_search_seconds, 0.25 * reserve)));
    CHECK(clock.seconds() <= limit * 1.1 + 0.05);
    CHECK(simulate(dag, plan.schedule).peak <= budget);
    for (const double share : {-0.1, 1.0}) {
        AutoOptions bad;
        bad.exact_component_share = share;
        CHECK_THROWS_AS(Auto(bad), InvalidInput);
    }
    for (const double share : {-0.1, 1.1}) {
        AutoOptions bad;
        bad.backward_search_share = share;
        CHECK_THROWS_AS(Auto(bad), InvalidInput);
        bad = AutoOptions{};
        bad.loss_state_search_share = share;
        CHECK_THROWS_WITH(Auto(bad), Catch::Contains("loss_state_search_share"));
    }
}

// remat-plan's --time-limit once set only H-Rockmate's analysis and Rockmate's limit per block:
// on this DAG, --solver hrockmate --time-limit 10 took 37 s (the flat search at the budget has
// 30 s of its own), and rockmate's limit was paid once per block.
TEST_CASE("time limits: remat-plan --time-limit covers the whole run of hrockmate, rockmate and auto",
          "[limits][timing][cli]") {
    const std::filesystem::path file = std::filesystem::temp_directory_path() / "remat_test_time_limits_dag40.json";
    std::ofstream(file) << io::to_json(bench_dag_40(1));
    // auto also proves the time bound first (default), which the limit covers too: with
    // --time-limit 3 it once took 3.25 s.
    for (const std::string solver : {"hrockmate", "rockmate", "auto"}) {
        const Stopwatch clock;
        const testing::CliResult r =
            testing::remat_plan({file.string(), "--budget", "60%", "--solver", solver, "--time-limit", "2", "--quiet"});
        const double seconds = clock.seconds();
        INFO(solver << ": exit code " << r.code << " in " << seconds << " s; " << r.err);
        CHECK(seconds <= 2.0 * 1.1 + 0.1);
        // H-Rockmate's greedy component always plans, and so does auto's fallback; Rockmate's
        // large block has no option within the budget (exit code 3, infeasible).
        CHECK(r.code == (solver == "rockmate" ? 3 : 0));
    }
    std::filesystem::remove(file);
}

TEST_CASE("time limits: the exact search stops at its limit, its states freed at once", "[limits][timing]") {
    // Out of reach within the limit: the search fills a table of about a million states. A
    // node-based table took a further 0.25 s to free them, after the limit.
    const Problem p = bench_dag_40(1);
    ExhaustiveOptions options;
    options.time_limit_seconds = 3.0;
    const Stopwatch clock;
    CHECK_THROWS_AS(Exhaustive(options).solve(p, percent_of(store_all_reference(p).peak, 60)), TooLarge);
    const double seconds = clock.seconds();
    INFO("time limit 3 s: stopped after " << seconds << " s");
    CHECK(seconds <= 3.0 * 1.02 + 0.04);
}

TEST_CASE("time limits: the exact search out of time is too large for it: exit code 4, and solvers that scale named",
          "[limits][cli]") {
    // It was a plain SolverError (exit code 1, "use checkmate or rockmate"), unlike its state
    // and memory caps and Rotor's limits; Rockmate does not plan this DAG at all.
    const std::filesystem::path file = std::filesystem::temp_directory_path() / "remat_test_time_limits_exact_dag40.json";
    std::ofstream(file) << io::to_json(bench_dag_40(1));
    const testing::CliResult r =
        testing::remat_plan({file.string(), "--budget", "60%", "--solver", "exhaustive", "--time-limit", "0.3", "--quiet"});
    INFO(r.err);
    CHECK(r.code == 4);
    CHECK_THAT(r.err, Catch::Contains("too large for this solver") && Catch::Contains("time limit") &&
                          Catch::Contains("hrockmate") && Catch::Contains("auto"));
    // Without a budget to plan, the least peak: the same, when the search cannot settle it.
    ExhaustiveOptions options;
    options.time_limit_seconds = 0.2;
    CHECK_THROWS_AS(Exhaustive(options).smallest_budget(bench_dag_40(1)), TooLarge);
    std::filesystem::remove(file);
}
