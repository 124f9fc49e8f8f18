// remat/solvers/refine.hpp — more time on a plan, until a proven bound certifies it.
//
// A plan at a budget (H-Rockmate's, Auto's, any solver's) and a proven lower bound on the
// time of every schedule within that budget (bounds/time_lower_bound.hpp, or the exact
// search's) give a certified gap: plan time / bound - 1. refine_plan() spends up to a time
// limit on faster plans and stops as soon as the gap is at most a target: the bound is what
// says when further search is no longer worth it (issue 26's "use the bound for early
// stopping"). The search is anytime and randomised:
//   - the plan itself, locally improved (solvers/improve.hpp: keep instead of recompute);
//   - on problems within the exact search's reach (at most 128 data), other states at the loss,
//     each with its exact best backward (solvers/loss_state_search.hpp), then the plan's windows
//     searched again exactly (solvers/window_search.hpp), each for a share of the time limit;
//   - then rounds of the greedy's portfolio (solvers/greedy.hpp, after DTR, Kirisame et al.
//     2021), each with fresh noise on DTR's eviction score and alternating the store-all and
//     the memory-aware order, its fastest plans locally improved.
// The fastest plan found is kept. On the 200-op encoder-decoder of bench_hierarchical at
// 30 % of P_ref, H-Rockmate's +32.5 % (certified gap 3.4 %) becomes +31.9 % within 20 s.
// The result carries its certified gap (SolverStats::gap) and status optimal where it meets
// the bound. Every plan is checked by the simulator. Standard library only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "greedy.hpp"
#include "improve.hpp"
#include "loss_state_search.hpp"
#include "window_search.hpp"

namespace remat {

struct RefineOptions {
    /// Stop as soon as the plan's certified gap (plan time / bound - 1) is at most this.
    double target_gap = 0.03;
    /// Seconds for the whole refinement; each round's portfolio and improvement end within
    /// it (a round's first replay always runs, milliseconds on thousands of ops).
    double time_limit_seconds = 10.0;
    /// Seconds of one round: the greedy's portfolio (60 %) and the improvement of its fastest
    /// plans (40 %). Shorter rounds stop sooner once the target is met.
    double round_seconds = 2.0;
    /// The share of the time limit the window search takes, on problems within its reach,
    /// before the greedy's rounds.
    double window_share = 0.5;
    /// The share of the time limit the loss-state search takes, on problems within its reach,
    /// before the window search; and the data it tries to keep first (the bound's relaxation's
    /// choice, TimeLowerBound::live_at_loss).
    double loss_state_share = 0.25;
    std::vector<std::string> loss_state_preferred;
    /// Seed of the rounds' noise (round r uses its own seed derived from it).
    std::uint64_t seed = 1;
    ProgressCallback progress;
};

namespace detail::refine {

// remat::certified_gap, infinite without a bound, for comparisons with the target.
[[nodiscard]] inline double gap_or_infinity(double plan_time, double time_bound) {
    return certified_gap(plan_time, time_bound).value_or(std::numeric_limits<double>::infinity());
}

// The options of round r: fresh noise, alternating orders, within `seconds`.
[[nodiscard]] inline GreedyOptions round_options(const RefineOptions& options, std::uint64_t round, double seconds) {
    GreedyOptions g;
    g.order = round % 2 == 0 ? GreedyOrder::store_all : GreedyOrder::memory_aware;
    g.seed = options.seed * 0x9E3779B97F4A7C15ULL + round * 0xBF58476D1CE4E5B9ULL;
    g.portfolio_seconds = 0.6 * seconds;
    g.improve_seconds = 0.4 * seconds;
    return g;
}

}  // namespace detail::refine

/// `plan` (within `budget`), or a faster plan within it, found within the time limit (see the
/// top of this header); `time_bound` is a proven lower bound on the time of every schedule
/// within `budget`. The result's stats.gap is its certified gap against `time_bound`; its
/// status is optimal when it meets the bound, heuristic when a faster plan replaced the input
/// without meeting it, and the input's otherwise; its time and peak are the simulator's.
/// Throws InvalidInput when the plan does not fit the budget, or when it is faster than the
/// bound (which then is no lower bound at this budget).
[[nodiscard]] inline Plan refine_plan(const Problem& problem, Bytes budget, Plan plan, double time_bound,
                                      const RefineOptions& options = {}) {
    namespace dr = detail::refine;
    if (!(options.time_limit_seconds >= 0) || !(options.round_seconds > 0) || !(options.target_gap >= 0) ||
        !(options.loss_state_share >= 0 && options.loss_state_share <= 1))
        throw InvalidInput("refine: the time limit must be non-negative, the round's seconds positive, the "
                           "target gap non-negative and the loss-state search's share between 0 and 1");
    const SimulationReport checked = simulate(problem, plan.schedule);
    if (!checked.fits(budget))
        throw InvalidInput("refine: the plan of '" + problem.name() + "' does not fit the budget of " +
                           std::to_string(budget) + " bytes" + (checked.valid ? "" : " (" + checked.error + ")"));
    if (!std::isfinite(time_bound) || checked.time < time_bound * (1.0 - 1e-9))
        throw InvalidInput("refine: the plan of '" + problem.name() + "' takes " + std::to_string(checked.time) +
                           ", less than the bound " + std::to_string(time_bound) +
                           ", which is therefore no lower bound at this budget");
    const Stopwatch clock;
    plan.time = checked.time;
    plan.peak = checked.peak;
    const double before = checked.time;
    const auto gap = [&] { return dr::gap_or_infinity(plan.time, time_bound); };
    const auto take = [&](Schedule schedule, const std::string& how) {
        const SimulationReport r = simulate(problem, schedule);
        if (!r.fits(budget) || !(r.time < plan.time)) return;
        plan.schedule = std::move(schedule);
        plan.time = r.time;
        plan.peak = r.peak;
        report_progress(options.progress, "refine: " + how + ", certified gap " + format_percent(gap()));
    };
    if (gap() > options.target_gap) {
        ImproveOptions io;
        io.time_limit_seconds = std::min(options.round_seconds, options.time_limit_seconds);
        take(improve_schedule(problem, plan.schedule, budget, io), "the plan locally improved");
    }
    if (gap() > options.target_gap && options.loss_state_share > 0) {  // problems beyond its reach come back as they are
        LossStateSearchOptions lo;
        lo.time_limit_seconds = std::max(0.0, std::min(options.loss_state_share * options.time_limit_seconds,
                                                       options.time_limit_seconds - clock.seconds()));
        lo.preferred = options.loss_state_preferred;
        lo.time_bound = time_bound;
        take(loss_state_search(problem, budget, plan, lo).plan.schedule, "other states at the loss searched");
    }
    bool proven_optimal = false;  // by the window search over the whole schedule
    if (gap() > options.target_gap) {  // window_search() leaves problems beyond its reach as they are
        WindowSearchOptions wo;
        wo.time_limit_seconds = std::max(0.0, std::min(options.window_share * options.time_limit_seconds,
                                                       options.time_limit_seconds - clock.seconds()));
        const WindowSearchResult searched = window_search(problem, budget, plan, wo);
        take(searched.plan.schedule, "the plan's windows searched exactly");
        proven_optimal = searched.optimal;
    }
    std::uint64_t round = 0;
    int failed_in_a_row = 0;  // rounds whose greedy fits no plan at this budget
    for (; !proven_optimal && gap() > options.target_gap && failed_in_a_row < 2; ++round) {
        const double left = options.time_limit_seconds - clock.seconds();
        if (left <= 0.0) break;
        try {
            const Greedy greedy(dr::round_options(options, round, std::min(options.round_seconds, left)));
            take(greedy.solve(problem, budget).schedule, "round " + std::to_string(round + 1) + " of the greedy's portfolio");
            failed_in_a_row = 0;
        } catch (const Infeasible&) {
            ++failed_in_a_row;  // neither order fits after two in a row: more rounds will not either
        }
    }
    plan.stats.gap = gap();
    if (*plan.stats.gap <= 1e-9 || proven_optimal) {  // no schedule is faster: the bound is below the optimum
        plan.stats.gap = 0.0;
        plan.stats.status = SolveStatus::optimal;
    } else if (plan.time < before) {
        plan.stats.status = SolveStatus::heuristic;  // whatever the input's solver proved was about its plan
    }
    plan.stats.options += (plan.stats.options.empty() ? "" : ", ") + std::string("refined in ") +
                          std::to_string(round) + " rounds (" + format_percent(1.0 - plan.time / before) +
                          " faster)";
    plan.stats.solve_seconds += clock.seconds();
    return plan;
}

}  // namespace remat
