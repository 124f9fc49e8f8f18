// Checkmate's MILP with offload variables (offload/checkmate.hpp): the optimum of a one-layer
// step by hand, valid plans within both memory limits on random training chains, the model's
// makespan an upper bound of the simulated one, the warm start from the iteration, and the
// combined planner never worse than the iteration.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/milp/lp_solve.hpp>
#include <remat/offload/checkmate.hpp>
#include <remat/remat.hpp>
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif

#include "../support/fast_milp_backend.hpp"
#include "../support/offload_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;
using namespace remat::offload;

namespace {

using Fast = testing::FastMilp;

template <class Backend>
void check_one_layer() {
    const Problem p = testing::one_layer_training();
    OffloadCheckmateOptions options;
    options.time_limit_seconds = 30;
    const OffloadCheckmate<Backend> milp(options);
    // P_ref = 470 (B runs with everything): no transfer, the compute time.
    const OffloadMilpResult all = milp.solve(p, 470);
    REQUIRE(all.plan);
    CHECK(all.status == milp::Status::optimal);
    CHECK(all.plan->report.makespan == Approx(7.0));
    CHECK(all.plan->report.offloads + all.plan->report.prefetches == 0);
    // Below it m must leave the device during B. By hand, the fastest way: offload m at the
    // start (4 units, while F runs 2), free it before B (waiting 2), prefetch it after B (2)
    // and run U: 2 + 2 + 4 + 2 + 1 = 11. Keeping m on the host between steps instead costs a
    // prefetch after B and an offload after U: 7 + 2 + 4 = 13. The device then holds x, w, m,
    // gw and gx at U: 420 bytes, the least of any plan.
    for (const Bytes budget : {450, 420}) {
        INFO("budget " << budget);
        const OffloadMilpResult r = milp.solve(p, budget);
        REQUIRE(r.plan);
        CHECK(r.status == milp::Status::optimal);
        CHECK(r.plan->report.makespan == Approx(11.0));
        CHECK(r.model_makespan == Approx(11.0));
        CHECK(r.plan->report.device_peak == 420);
        CHECK(r.plan->report.host_peak == 200);
        CHECK(r.plan->schedule.start_on_host.empty());
    }
    const OffloadMilpResult none = milp.solve(p, 419);
    CHECK_FALSE(none.plan);
    CHECK(none.status == milp::Status::infeasible);
}

// A random chain's training problem: weights, gradients and momentum, transfers at 40 B per
// time unit; with `limit_host`, host memory for half the weights and momentum.
Problem random_training(std::mt19937& rng, std::size_t stages, bool limit_host) {
    const Chain chain = testing::random_chain(rng, stages);
    std::vector<Bytes> params;
    std::uniform_int_distribution<int> size(2, 12);
    Bytes total = 0;
    for (std::size_t l = 0; l < chain.length(); ++l) total += params.emplace_back(size(rng) * 16);
    const std::optional<Bytes> host_limit = limit_host ? std::optional<Bytes>(total) : std::nullopt;
    return training_problem(chain, params, {1.0, 0.005, true, TransferSettings{host_limit, 40.0, 40.0}});
}

}  // namespace

TEST_CASE("checkmate+offload: the one-layer step's optimum by hand, with both backends", "[milp][offload]") {
    SECTION("lp_solve") { check_one_layer<milp::LpSolve>(); }
#ifdef REMAT_WITH_CBC
    SECTION("cbc") { check_one_layer<milp::Cbc>(); }
#endif
}

TEST_CASE("checkmate+offload: valid plans within the device budget and the host limit, never slower than the model says",
          "[milp][offload]") {
    std::mt19937 rng(23);
    std::size_t plans = 0, started = 0, improved = 0;
    for (int trial = 0; trial < 4; ++trial) {
        const bool limited = trial % 2 == 1;
        const Problem full = random_training(rng, 2, limited);
        const Bytes reference = store_all_reference(full).peak;
        OffloadCheckmateOptions options;
        options.time_limit_seconds = 1;
        const OffloadCheckmate<Fast> milp(options);
        for (const int percent : {90, 75, 65}) {
            const Bytes budget = reference * percent / 100;
            INFO("trial " << trial << ", " << percent << " % of " << reference << (limited ? ", host limit" : ""));
            const auto iteration = plan_with_offload(full, budget, Rotor{});
            const OffloadMilpResult r = milp.solve(full, budget, iteration ? std::optional(iteration->schedule) : std::nullopt);
            started += r.started;
            if (!r.plan) {
                CHECK_FALSE(iteration);  // a started search always has a plan
                continue;
            }
            ++plans;
            INFO(r.plan->report.error);
            REQUIRE(r.plan->report.fits(budget, full.transfers().host_limit));
            CHECK(r.plan->report.makespan <= r.model_makespan * (1 + 1e-9));
            CHECK(r.model_bound <= r.model_makespan * (1 + 1e-9));
            if (r.started) CHECK(r.model_makespan <= r.plan->report.makespan + iteration->report.makespan);
            if (iteration) improved += r.plan->report.makespan < iteration->report.makespan * (1 - 1e-9);
            if (percent != 75) continue;  // the combined planner solves the same MILP again
            const auto combined = plan_with_offload(full, budget, Rotor{}, milp);
            REQUIRE(combined);
            REQUIRE(combined->report.fits(budget, full.transfers().host_limit));
            if (iteration) CHECK(combined->report.makespan <= iteration->report.makespan);
        }
    }
    WARN("checkmate+offload: " << plans << " plans, " << started << " searches started from the iteration's plan, "
                               << improved << " faster than the iteration");
    CHECK(plans >= 8);
    CHECK(started >= plans / 2);
}

TEST_CASE("checkmate+offload: the model's times bound the simulated ones for every plan it holds", "[milp][offload]") {
    // The iteration's plans, held by the model as solutions (the warm start): each is feasible
    // for every row, and its makespan in the model is at least the simulated one.
    std::mt19937 rng(41);
    std::size_t held = 0, tried = 0;
    for (int trial = 0; trial < 16; ++trial) {
        const Problem full = random_training(rng, 2 + trial % 2, trial % 3 == 0);
        const Bytes reference = store_all_reference(full).peak;
        const auto a = remat::detail::checkmate::analyse(full);
        std::vector<DataId> movable;
        for (const DataId d : full.initial())
            if (full.data(d).offloadable) movable.push_back(d);
        for (const int percent : {95, 85, 75, 65, 55}) {
            const Bytes budget = reference * percent / 100;
            const auto plan = plan_with_offload(full, budget, Rotor{});
            if (!plan) continue;
            ++tried;
            remat::detail::checkmate::Formulation f(full, a, remat::detail::checkmate::make_layout(full, a, 0), budget, movable);
            const offload::detail::offload_milp::Model model(full, f, movable, full.transfers(), 1, budget, std::nullopt);
            const auto x = model.assignment(plan->schedule);
            if (!x) continue;
            ++held;
            INFO("trial " << trial << ", " << percent << " %");
            CHECK(model.makespan(*x) >= plan->report.makespan * (1 - 1e-12));
        }
    }
    WARN("checkmate+offload holds " << held << " of " << tried << " plans of the iteration");
    CHECK(held * 4 >= tried * 3);
}

TEST_CASE("checkmate+offload: options and size cap say what is wrong", "[milp][offload]") {
    OffloadCheckmateOptions bad;
    bad.offload_lag = 0;
    CHECK_THROWS_AS(OffloadCheckmate<milp::LpSolve>(bad), InvalidInput);
    OffloadCheckmateOptions tiny;
    tiny.max_binary_variables = 10;
    const Problem p = testing::one_layer_training();
    CHECK_THROWS_WITH(OffloadCheckmate<milp::LpSolve>(tiny).solve(p, 450),
                      Catch::Contains("max_binary_variables") && Catch::Contains("one-layer"));
    // The combined planner falls back to the iteration's plan past the cap.
    std::mt19937 rng(3);
    const Problem chain = random_training(rng, 2, false);
    const Bytes budget = store_all_reference(chain).peak * 8 / 10;
    const auto combined = plan_with_offload(chain, budget, Rotor{}, OffloadCheckmate<milp::LpSolve>(tiny));
    const auto iteration = plan_with_offload(chain, budget, Rotor{});
    REQUIRE(combined);
    REQUIRE(iteration);
    CHECK(combined->schedule == iteration->schedule);
}

TEST_CASE("checkmate+offload: building the MILP stops at the time limit, and the combined planner keeps the "
          "iteration's plan",
          "[milp][offload][time-limit]") {
    std::mt19937 rng(5);
    const Problem chain = random_training(rng, 8, false);
    const Bytes budget = store_all_reference(chain).peak * 8 / 10;
    OffloadCheckmateOptions instant;
    instant.time_limit_seconds = 1e-6;  // past before the first rows
    const OffloadMilpResult r = OffloadCheckmate<milp::LpSolve>(instant).solve(chain, budget);
    CHECK_FALSE(r.plan);
    CHECK(r.status == milp::Status::time_limit_no_solution);
    CHECK(r.rows == 0);  // not built, let alone solved
    const auto combined = plan_with_offload(chain, budget, Rotor{}, OffloadCheckmate<milp::LpSolve>(instant));
    const auto iteration = plan_with_offload(chain, budget, Rotor{});
    REQUIRE(combined);
    REQUIRE(iteration);
    CHECK(combined->schedule == iteration->schedule);
}

TEST_CASE("checkmate+offload: a plan at the proven makespan bound is returned without the MILP", "[milp][offload][time-limit]") {
    // The GPT-like example at 90 % of P_ref: the combined planner's plan takes T_ref, which every
    // schedule's compute takes too (compute_lower_bound), so the MILP could only spend its limit
    // proving it (60 s, remat-plan's default, before).
    const Problem problem =
        io::load_problem(std::string(REMAT_SOURCE_DIR) + "/examples/problems/gpt-like-training.json");
    const Reference reference = store_all_reference(problem);
    const Bytes budget = reference.peak * 9 / 10;
    CHECK(compute_lower_bound(problem) == Approx(reference.time).epsilon(1e-12));
    OffloadCheckmateOptions options;
    options.time_limit_seconds = 30.0;
    const Stopwatch clock;
    const auto plan = plan_with_offload(problem, budget, Auto{}, OffloadCheckmate<milp::LpSolve>(options));
    CHECK(clock.seconds() < 5.0);
    REQUIRE(plan);
    CHECK(meets_time_bound(plan->report.makespan, makespan_lower_bound(problem, budget)));
    CHECK(plan->report.device_peak <= budget);
}
