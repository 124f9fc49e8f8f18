// remat/solvers/window_search.hpp — large neighbourhood search over a schedule's windows with
// the exact search.
//
// Large neighbourhood search (Shaw, "Using constraint programming and local search methods to
// solve vehicle routing problems", CP 1998) keeps most of a solution fixed and solves the
// rest exactly. Here the rest is a window of a schedule: the steps from one run to another.
// The exact search (solvers/exhaustive.hpp, A*) goes from the state the schedule reaches
// before the window (what is live, which exactly-once ops ran) to a state from which the rest
// of the schedule runs as it is: the same exactly-once ops done, and at least what the rest
// still reads live. In between it may reorder, recompute, keep or free anything within the
// budget. Its bound on a window is the larger of two admissible ones: the window's
// exactly-once ops plus a run for each data it must make live again, and the exact search's
// own bound on any completion of the whole schedule less the fixed rest. So a window that
// cannot beat the schedule is refuted after few states.
//
// window_search() first searches the whole backward, from the loss's run to the end: what is
// live when the loss runs fixes most of it, and a heuristic's backward is often not the best
// one from there. Then it slides windows of `window_runs` runs over the schedule, half a
// window at a time, and splices in every faster window it finds (and searches the backward
// again: what is live at the loss may have changed). After a pass that finds nothing, the
// windows double, up to the whole schedule: that search is the exact one, and when it
// finishes without a faster schedule, the plan is optimal over all schedules. It stops at its
// time limit. The heuristics (the greedy, H-Rockmate) decide what to keep and recompute one
// op at a time; a window weighs those decisions jointly. On bench_checkmate's random DAGs of
// 40 and 60 ops at 50-80 % of P_ref, 5 s made auto's plans 0-8 % faster (docs/design.md
// §4.8). Problems beyond the exact search (more than 128 data or 64 exactly-once ops, or
// in-place updates) get their plan back as it is. Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "exhaustive.hpp"
#include "improve.hpp"

namespace remat {

struct WindowSearchOptions {
    /// Wall-clock limit of the whole search.
    double time_limit_seconds = 1.0;
    /// Runs in a window of the first pass (at least 1); each pass that finds nothing faster
    /// doubles it.
    std::size_t window_runs = 4;
    /// States one window's search may hold; past them that window is left as it is.
    std::size_t max_states_per_window = 200'000;
    /// Before the sliding windows, the whole backward: the window from the loss's run to the
    /// end, searched with up to this many states (0: not searched). What is live when the loss
    /// runs decides most of the backward, and a heuristic's backward is often not the best one
    /// from there, while the sliding windows, which must each reproduce the state the rest of
    /// the schedule needs, cannot reorder it as a whole: on bench_checkmate's 40-op DAG at 50 %
    /// of P_ref, auto's plan of 112 becomes 107 in 0.05 s (proven bound 104); the 60-op DAG at
    /// 60 %, 168 -> 159 in 1.7 s with about a million states (200,000 were not enough).
    std::size_t backward_max_states = 4'000'000;
    /// Receives one line per faster window found.
    ProgressCallback progress;
};

namespace detail::window_search {

using exhaustive::DataMask;
using exhaustive::ExhaustiveSearch;
using exhaustive::SearchState;
using exhaustive::SearchWindow;

// A schedule with what the search needs of it: the state before each step, where the runs
// are, and the time of the runs from each step to the end.
struct Walk {
    std::vector<SearchState> states;
    std::vector<std::size_t> runs;  // the steps that run an op, in order
    std::vector<double> time_from;  // time_from[i]: the runs of steps i..end

    Walk(const Problem& problem, const ExhaustiveSearch& search, const Schedule& schedule)
        : states(search.states_along(schedule)), time_from(schedule.size() + 1, 0.0) {
        for (std::size_t i = schedule.size(); i-- > 0;)
            time_from[i] = time_from[i + 1] + (schedule[i].is_run() ? problem.op(schedule[i].op()).time : 0.0);
        for (std::size_t i = 0; i < schedule.size(); ++i)
            if (schedule[i].is_run()) runs.push_back(i);
    }
    // The step where boundary `k` lies: the start (k = 0), the k-th run, or the end (k = runs).
    [[nodiscard]] std::size_t boundary(std::size_t k, std::size_t steps) const {
        return k == 0 ? 0 : k >= runs.size() ? steps : runs[k];
    }
};

// `schedule` with steps [begin, end) replaced by `part`. The rest may still free data that the
// part left dead and freed already; accept() tidies those frees away (tidy_schedule).
[[nodiscard]] inline Schedule spliced(const Schedule& schedule, std::size_t begin, std::size_t end,
                                      const Schedule& part) {
    Schedule out(schedule.begin(), schedule.begin() + static_cast<std::ptrdiff_t>(begin));
    out.insert(out.end(), part.begin(), part.end());
    out.insert(out.end(), schedule.begin() + static_cast<std::ptrdiff_t>(end), schedule.end());
    return out;
}

// What searching one window found: a faster whole schedule, and whether the search finished
// (without one, no faster window exists).
struct WindowOutcome {
    std::optional<Schedule> faster;
    bool finished = false;
};

// The runs [first, last) of `walk` searched again. Up to the end, only the final data must be
// live there.
[[nodiscard]] inline WindowOutcome search_window(const Problem& problem, Bytes budget, const Schedule& schedule,
                                                 const Walk& walk, const ExhaustiveSearch& search, std::size_t first,
                                                 std::size_t last) {
    const std::size_t begin = walk.boundary(first, schedule.size());
    const std::size_t end = walk.boundary(last, schedule.size());
    const SearchState& to = walk.states[end];
    DataMask keep = to.live & ~search.dead(to);
    if (end == schedule.size()) {
        keep = {};
        for (std::size_t d = 0; d < problem.data_count(); ++d)
            if (problem.is_final(DataId{d})) keep |= DataMask::bit(d);
    }
    const SearchWindow window{walk.states[begin], to.done, keep, walk.time_from[end]};
    const double window_time = walk.time_from[begin] - walk.time_from[end];
    auto result = search.run(exhaustive::SearchGoal::least_time, budget, window_time, &window);
    if (!result.found) return {std::nullopt, !result.stopped};
    return {spliced(schedule, begin, end, result.schedule), true};
}

// The run of the loss in the schedule's runs (its boundary), if the problem has a loss that the
// schedule runs exactly once.
[[nodiscard]] inline std::optional<std::size_t> loss_run(const Problem& problem, const Schedule& schedule) {
    const std::optional<OpId> loss = problem.loss();
    if (!loss) return std::nullopt;
    std::optional<std::size_t> at;
    std::size_t k = 0;
    for (const Step& step : schedule) {
        if (!step.is_run()) continue;
        if (step.op() == *loss) {
            if (at) return std::nullopt;
            at = k;
        }
        ++k;
    }
    return at;
}

// The search's state between windows: the schedule so far, its simulation, and what happened.
struct Current {
    Schedule schedule;
    SimulationReport report;
    std::size_t improved = 0;
    bool optimal = false;
    bool out_of_time = false;
};

// Takes `candidate`, tidied (which drops its frees of data no longer live), when it is then
// valid, within the budget and faster.
inline bool accept(const Problem& problem, Bytes budget, const Schedule& candidate, Current& state) {
    Schedule tidy = tidy_schedule(problem, candidate);
    SimulationReport report = simulate(problem, tidy);
    if (!report.fits(budget) || !(report.time < state.report.time)) return false;
    state.schedule = std::move(tidy);
    state.report = std::move(report);
    ++state.improved;
    return true;
}

// Runs [first, last) of `walk` searched again (search_window); a faster schedule, valid and
// within the budget, becomes the state and is reported, the window named by `what` after its
// runs. Returns whether one was taken; a search over the whole schedule that finishes without
// one proves the state optimal.
inline bool splice_faster_window(const Problem& problem, Bytes budget, const ExhaustiveSearch& search, const Walk& walk,
                                 std::size_t first, std::size_t last, const std::string& what,
                                 const WindowSearchOptions& options, Current& state) {
    const double before = state.report.time;
    const WindowOutcome outcome = search_window(problem, budget, state.schedule, walk, search, first, last);
    if (outcome.faster && accept(problem, budget, *outcome.faster, state)) {
        report_progress(options.progress, "window search: runs " + std::to_string(first + 1) + "-" + std::to_string(last) +
                                              what + ": time " + std::to_string(before) + " -> " +
                                              std::to_string(state.report.time));
        return true;
    }
    if (first == 0 && last == walk.runs.size() && outcome.finished && !outcome.faster) state.optimal = true;
    return false;
}

// One pass of windows of `width` runs, half a window apart; a faster window is searched again
// in the new schedule. Returns whether any window was faster.
inline bool pass(const Problem& problem, Bytes budget, std::size_t width, ExhaustiveOptions exact,
                 const WindowSearchOptions& options, const Stopwatch& clock, Current& state) {
    bool found = false;
    for (std::size_t first = 0;;) {
        const double left = options.time_limit_seconds - clock.seconds();
        if (left <= 0) {
            state.out_of_time = true;
            return found;
        }
        exact.time_limit_seconds = left;
        const ExhaustiveSearch search(problem, exact);
        const Walk walk(problem, search, state.schedule);
        const std::size_t runs = walk.runs.size();
        const std::size_t last = std::min(first + width, runs);
        if (splice_faster_window(problem, budget, search, walk, first, last, " of " + std::to_string(runs), options, state)) {
            found = true;
            continue;
        }
        if (last >= runs) return found;
        first += std::max<std::size_t>(width / 2, 1);
    }
}

// WindowSearchOptions::backward_max_states: the window from the loss's run to the end.
inline void search_backward(const Problem& problem, Bytes budget, ExhaustiveOptions exact,
                            const WindowSearchOptions& options, const Stopwatch& clock, Current& state) {
    const std::optional<std::size_t> loss = loss_run(problem, state.schedule);
    const double left = options.time_limit_seconds - clock.seconds();
    if (!loss || options.backward_max_states == 0 || left <= 0) return;
    exact.time_limit_seconds = left;
    exact.max_states = options.backward_max_states;
    const ExhaustiveSearch search(problem, exact);
    const Walk walk(problem, search, state.schedule);
    (void)splice_faster_window(problem, budget, search, walk, *loss, walk.runs.size(), " (the backward)", options, state);
}

}  // namespace detail::window_search

/// What window_search() returns.
struct WindowSearchResult {
    /// The plan, with the faster windows spliced in: never slower, valid and within the budget.
    Plan plan;
    /// The search over the whole schedule finished without a faster one: no schedule within
    /// the budget is faster (the plan's status is then optimal and its gap 0).
    bool optimal = false;
    /// Faster windows spliced in (the status is then heuristic unless optimal: what the
    /// input's solver proved was about its own plan).
    std::size_t faster_windows = 0;
};

/// `plan` at `budget` with faster windows spliced in, within the time limit (see the top of
/// this file). The plan comes back as it is where the exact search cannot take the problem.
[[nodiscard]] inline WindowSearchResult window_search(const Problem& problem, Bytes budget, Plan plan,
                                                      const WindowSearchOptions& options = {}) {
    namespace ws = detail::window_search;
    if (!(options.time_limit_seconds >= 0)) throw InvalidInput("window search: time_limit_seconds must be >= 0");
    if (problem.data_count() > Exhaustive::max_data || problem.has_updates()) return {std::move(plan)};
    const Stopwatch clock;
    ws::Current state{plan.schedule, simulate(problem, plan.schedule)};
    if (!state.report.fits(budget) || state.schedule.empty()) return {std::move(plan)};
    ExhaustiveOptions exact;
    exact.max_states = options.max_states_per_window;
    try {
        (void)ws::ExhaustiveSearch(problem, exact);
    } catch (const InvalidInput&) {  // more than 64 exactly-once ops
        return {std::move(plan)};
    }
    const double before = state.report.time;
    ws::search_backward(problem, budget, exact, options, clock, state);
    for (std::size_t width = std::max<std::size_t>(options.window_runs, 1); !state.optimal && !state.out_of_time;) {
        if (ws::pass(problem, budget, width, exact, options, clock, state)) {
            // The faster windows may have changed what is live at the loss.
            ws::search_backward(problem, budget, exact, options, clock, state);
            continue;
        }
        const auto runs = std::count_if(state.schedule.begin(), state.schedule.end(), [](const Step& step) { return step.is_run(); });
        if (width >= static_cast<std::size_t>(runs)) break;
        width *= 2;
    }
    SolverStats stats = plan.stats;
    stats.solve_seconds += clock.seconds();
    if (state.improved > 0) {
        stats.status = SolveStatus::heuristic;
        stats.gap.reset();
        stats.options += std::string(stats.options.empty() ? "" : ", ") + "window search (" +
                         std::to_string(state.improved) + " windows, " + format_percent(1.0 - state.report.time / before) +
                         " faster)";
    }
    if (state.optimal) {
        stats.status = SolveStatus::optimal;
        stats.gap = 0.0;
        stats.options += std::string(stats.options.empty() ? "" : ", ") + "proven optimal by the window search";
    }
    return {make_checked_plan(problem, std::move(state.schedule), budget, std::move(stats)), state.optimal, state.improved};
}

}  // namespace remat
