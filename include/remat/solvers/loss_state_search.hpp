// remat/solvers/loss_state_search.hpp — what to keep for the backward: states at the loss
// searched one by one, each with its exact best backward.
//
// What is live when the loss runs decides a schedule's backward, and from that state the
// exact search (solvers/exhaustive.hpp) finds the best backward quickly (milliseconds on
// random DAGs of 40 ops). Which state to reach is the hard part: the heuristics choose it one
// op at a time, and the window search (solvers/window_search.hpp) cannot change it as a whole,
// as every window must reproduce the state the rest of the schedule needs. This search
// enumerates states at the loss. Its forward runs each op once, in the store-all order, with
// the variant of each op that writes the least of what is kept (an op with the same reads and
// fewer writes: a layer's forward without the state its backward saves), and keeps a set of
// the data it writes (the loss's reads always; the rest freed after their last read in the
// forward). Keeping more never makes the backward slower (it may free anything at once), so
// only keep sets that cannot take one more data within the budget are searched. A depth-first
// search finds them, trying to keep each data before not keeping it, and the data most likely
// to matter first: LossStateSearchOptions::preferred (the time lower bound's choice,
// TimeLowerBound::live_at_loss in bounds/time_lower_bound.hpp, where nothing limits the
// forward's memory), then what the plan keeps. The exact search scores each keep set,
// looking only for a backward faster than the best plan so far.
// On bench_checkmate's 40-op DAG at 60 % of P_ref, the plans' 96 becomes 93 in about 1 s with
// the relaxation's choice preferred: the proven time bound, so the optimum. It stops at its
// time limit, when every keep set is searched, or at a time bound. A heuristic: schedules that
// recompute in the forward or run it in another order are not among the states it tries; the
// plan it returns is never slower than the one it is given. Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
#include "store_all.hpp"

namespace remat {

struct LossStateSearchOptions {
    /// Wall-clock limit of the whole search.
    double time_limit_seconds = 1.0;
    /// Names of data to try keeping first, in this order (unknown names are refused).
    std::vector<std::string> preferred;
    /// A proven lower bound on the time (bounds/time_lower_bound.hpp): a plan that meets it
    /// ends the search.
    std::optional<double> time_bound;
    /// States each backward's exact search may hold; past them that keep set is left.
    std::size_t max_states = 1'000'000;
    /// Receives one line per faster plan found.
    ProgressCallback progress;
};

/// What loss_state_search() returns.
struct LossStateSearchResult {
    /// The fastest plan found, or the one given: valid and within the budget.
    Plan plan;
    /// The keep sets whose backward was searched.
    std::size_t keep_sets = 0;
    /// Every keep set was searched (within its states): none of them gives a faster plan.
    bool complete = false;
    /// The plan is faster than the one given.
    bool improved = false;
};

namespace detail::loss_state {

// The forward the search varies: the store-all schedule's runs before the loss.
struct Forward {
    OpId loss;
    std::vector<OpId> ops;
    std::vector<std::size_t> reads_until;  // data: 1 + the index in `ops` of its last reader; 0: none
    std::vector<char> always;              // data kept whatever the set: the loss's reads, final data
    std::vector<DataId> writes;            // the data `ops` write that a keep set may hold
};

[[nodiscard]] inline Forward forward_of(const Problem& problem, OpId loss) {
    Forward f{loss, {}, std::vector<std::size_t>(problem.data_count(), 0), std::vector<char>(problem.data_count(), 0), {}};
    for (const Step& step : store_all_reference(problem).schedule) {
        if (!step.is_run()) continue;
        if (step.op() == loss) break;
        f.ops.push_back(step.op());
    }
    for (const DataId d : problem.op(loss).reads) f.always[d.index] = 1;
    for (const DataId d : problem.final_data()) f.always[d.index] = 1;
    std::vector<char> written(problem.data_count(), 0);
    for (std::size_t i = 0; i < f.ops.size(); ++i) {
        for (const DataId d : problem.op(f.ops[i]).reads) f.reads_until[d.index] = i + 1;
        for (const DataId d : problem.op(f.ops[i]).writes) written[d.index] = 1;
    }
    for (std::size_t d = 0; d < problem.data_count(); ++d)
        if (written[d] && !f.always[d] && !problem.is_initial(DataId{d})) f.writes.push_back(DataId{d});
    return f;
}

[[nodiscard]] inline bool writes_subset(const Op& small, const Op& large) {
    return std::all_of(small.writes.begin(), small.writes.end(), [&](DataId d) {
        return std::find(large.writes.begin(), large.writes.end(), d) != large.writes.end();
    });
}

// The variant of `op` to run: of the ops with its reads whose writes are among its own and
// cover every data `needed` says, the one that writes the fewest bytes.
template <class Needed>
[[nodiscard]] OpId lightest_variant(const Problem& problem, OpId op, const Needed& needed) {
    const Op& full = problem.op(op);
    OpId best = op;
    Bytes best_bytes = 0;
    for (const DataId d : full.writes) best_bytes += problem.data(d).bytes;
    for (std::size_t k = 0; k < problem.op_count(); ++k) {
        const Op& other = problem.op(OpId{k});
        if (other.exactly_once || other.reads != full.reads || !writes_subset(other, full)) continue;
        const bool covers = std::all_of(full.writes.begin(), full.writes.end(), [&](DataId d) {
            return !needed(d) || std::find(other.writes.begin(), other.writes.end(), d) != other.writes.end();
        });
        Bytes bytes = 0;
        for (const DataId d : other.writes) bytes += problem.data(d).bytes;
        if (covers && bytes < best_bytes) {
            best = OpId{k};
            best_bytes = bytes;
        }
    }
    return best;
}

// The forward that keeps `keep` (and what it always keeps), then the loss.
[[nodiscard]] inline Schedule forward_keeping(const Problem& problem, const Forward& f, const std::vector<char>& keep) {
    Schedule schedule;
    for (std::size_t i = 0; i < f.ops.size(); ++i) {
        const auto needed = [&](DataId d) { return keep[d.index] || f.always[d.index] || f.reads_until[d.index] > i + 1; };
        const OpId run = lightest_variant(problem, f.ops[i], needed);
        schedule.push_back(Step::run(run));
        for (const DataId d : problem.op(run).writes)
            if (!needed(d)) schedule.push_back(Step::free(d));
        for (const DataId d : problem.op(run).reads)
            if (f.reads_until[d.index] == i + 1 && !keep[d.index] && !f.always[d.index] && !problem.is_initial(d))
                schedule.push_back(Step::free(d));
    }
    schedule.push_back(Step::run(f.loss));
    return schedule;
}

// Whether that forward is valid and within the budget (the backward is still to come).
[[nodiscard]] inline bool forward_fits(const Problem& problem, const Forward& f, const std::vector<char>& keep,
                                       Bytes budget) {
    const Schedule schedule = forward_keeping(problem, f, keep);
    const SimulationReport report = simulate(problem, schedule);
    return report.error_step == schedule.size() && report.peak <= budget;
}

// The order the depth-first search decides the data in: `first`, then `second`, then the rest.
[[nodiscard]] inline std::vector<DataId> decision_order(const Forward& f, const std::vector<char>& first,
                                                        const std::vector<char>& second) {
    std::vector<DataId> order;
    for (const auto* rank : {&first, &second})
        for (const DataId d : f.writes)
            if ((*rank)[d.index] && std::find(order.begin(), order.end(), d) == order.end()) order.push_back(d);
    for (const DataId d : f.writes)
        if (std::find(order.begin(), order.end(), d) == order.end()) order.push_back(d);
    return order;
}

// The data live when the loss runs in a schedule whose states (ExhaustiveSearch::states_along,
// the state before each step) are `states` (none where it does not run the loss).
[[nodiscard]] inline std::vector<char> live_at_loss(const Problem& problem, const Schedule& schedule,
                                                    const std::vector<exhaustive::SearchState>& states, OpId loss) {
    std::vector<char> live(problem.data_count(), 0);
    const auto at = std::find(schedule.begin(), schedule.end(), Step::run(loss));
    if (at == schedule.end()) return live;
    const exhaustive::DataMask& mask = states[static_cast<std::size_t>(at - schedule.begin())].live;
    for (std::size_t d = 0; d < problem.data_count(); ++d) live[d] = mask.test(d) ? 1 : 0;
    return live;
}

// The depth-first search over keep sets (see the top of the file): `best` becomes each faster
// plan found.
class KeepSetSearch {
public:
    // `done_at_end`: the exactly-once units every schedule has run at its end.
    KeepSetSearch(const Problem& problem, Bytes budget, const Forward& forward, std::vector<DataId> order,
                  std::uint64_t done_at_end, const LossStateSearchOptions& options, const Stopwatch& clock, Plan& best)
        : problem_(problem), budget_(budget), forward_(forward), order_(std::move(order)), options_(options),
          clock_(clock), best_(best), keep_(problem.data_count(), 0), done_at_end_(done_at_end) {
        for (const DataId d : problem.final_data()) finals_ |= exhaustive::DataMask::bit(d.index);
    }
    // Returns whether every keep set was searched.
    bool run() {
        if (forward_fits(problem_, forward_, keep_, budget_)) visit(0);
        return !stopped_;
    }
    [[nodiscard]] std::size_t searched() const noexcept { return searched_; }

private:
    [[nodiscard]] bool over() const {
        return clock_.seconds() >= options_.time_limit_seconds ||
               (options_.time_bound && best_.time <= *options_.time_bound * (1 + 1e-9));
    }
    void visit(std::size_t next) {
        if (stopped_ || (stopped_ = over())) return;
        if (next == order_.size()) {
            if (maximal()) score();
            return;
        }
        const std::size_t d = order_[next].index;
        keep_[d] = 1;
        if (forward_fits(problem_, forward_, keep_, budget_)) visit(next + 1);
        keep_[d] = 0;
        visit(next + 1);
    }
    // No data left out can join the set within the budget.
    [[nodiscard]] bool maximal() {
        for (const DataId d : order_) {
            if (keep_[d.index]) continue;
            keep_[d.index] = 1;
            const bool fits = forward_fits(problem_, forward_, keep_, budget_);
            keep_[d.index] = 0;
            if (fits) return false;
        }
        return true;
    }
    // The keep set's forward and the best backward from its state at the loss, if faster.
    void score() {
        ++searched_;
        Schedule schedule = forward_keeping(problem_, forward_, keep_);
        double forward_time = 0.0;
        for (const Step& step : schedule)
            if (step.is_run()) forward_time += problem_.op(step.op()).time;
        if (!(best_.time - forward_time > 0)) return;  // no backward can make it faster
        ExhaustiveOptions exact;
        exact.time_limit_seconds = std::max(0.0, options_.time_limit_seconds - clock_.seconds());
        exact.max_states = options_.max_states;
        const exhaustive::ExhaustiveSearch search(problem_, exact);
        const exhaustive::SearchWindow backward{search.states_along(schedule).back(), done_at_end_, finals_, 0.0};
        const auto found = search.run(exhaustive::SearchGoal::least_time, budget_, best_.time - forward_time, &backward);
        if (!found.found) return;
        schedule.insert(schedule.end(), found.schedule.begin(), found.schedule.end());
        schedule = tidy_schedule(problem_, std::move(schedule));
        const SimulationReport report = simulate(problem_, schedule);
        if (!report.fits(budget_) || !(report.time < best_.time)) return;
        report_progress(options_.progress, "loss-state search: keep set " + std::to_string(searched_) + ": time " +
                                               std::to_string(best_.time) + " -> " + std::to_string(report.time));
        best_.schedule = std::move(schedule);
        best_.time = report.time;
        best_.peak = report.peak;
    }

    const Problem& problem_;
    Bytes budget_;
    const Forward& forward_;
    std::vector<DataId> order_;
    const LossStateSearchOptions& options_;
    const Stopwatch& clock_;
    Plan& best_;
    std::vector<char> keep_;
    std::uint64_t done_at_end_;
    exhaustive::DataMask finals_{};
    std::size_t searched_ = 0;
    bool stopped_ = false;
};

}  // namespace detail::loss_state

/// `plan` at `budget`, or a faster plan whose state at the loss another keep set gives (see the
/// top of this file), within the time limit. The plan comes back as it is where the exact
/// search cannot take the problem (more than 128 data or 64 exactly-once ops, in-place
/// updates), where the problem has no loss that runs once, or where the plan does not fit.
[[nodiscard]] inline LossStateSearchResult loss_state_search(const Problem& problem, Bytes budget, Plan plan,
                                                             const LossStateSearchOptions& options = {}) {
    namespace ls = detail::loss_state;
    if (!(options.time_limit_seconds >= 0)) throw InvalidInput("loss-state search: time_limit_seconds must be >= 0");
    std::vector<char> preferred(problem.data_count(), 0);
    for (const std::string& name : options.preferred) {
        const std::optional<DataId> d = problem.find_data(name);
        if (!d)
            throw InvalidInput("loss-state search: preferred data '" + name + "' is not a data of problem '" +
                               problem.name() + "'; name data of this problem (TimeLowerBound::live_at_loss)");
        preferred[d->index] = 1;
    }
    const std::optional<OpId> loss = problem.loss();
    if (!loss || !problem.op(*loss).exactly_once || problem.data_count() > Exhaustive::max_data ||
        problem.has_updates() || !simulate(problem, plan.schedule).fits(budget))
        return {std::move(plan)};
    std::vector<detail::exhaustive::SearchState> states;  // of the plan, before each step
    try {
        states = detail::exhaustive::ExhaustiveSearch(problem, ExhaustiveOptions{}).states_along(plan.schedule);
    } catch (const InvalidInput&) {  // more than 64 exactly-once ops
        return {std::move(plan)};
    }
    const Stopwatch clock;
    const ls::Forward forward = ls::forward_of(problem, *loss);
    const double before = plan.time;
    ls::KeepSetSearch search(problem, budget, forward,
                             ls::decision_order(forward, preferred, ls::live_at_loss(problem, plan.schedule, states, *loss)),
                             states.back().done, options, clock, plan);
    const bool complete = search.run();
    const bool improved = plan.time < before;
    plan.stats.solve_seconds += clock.seconds();
    if (improved) {
        plan.stats.status = SolveStatus::heuristic;  // what its solver proved was about its own plan
        plan.stats.gap.reset();
        plan.stats.options += std::string(plan.stats.options.empty() ? "" : ", ") + "loss-state search (" +
                              format_percent(1.0 - plan.time / before) + " faster)";
    }
    return {std::move(plan), search.searched(), complete, improved};
}

}  // namespace remat
