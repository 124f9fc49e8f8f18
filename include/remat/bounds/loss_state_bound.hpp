// remat/bounds/loss_state_bound.hpp — a proof that no schedule beats a target time, by the
// states at the loss: the time bound's relaxation chooses them, the exact search scores them.
//
// The loss runs once and splits every schedule in two: the runs before it, and the rest from
// the set K of data live when it starts. The rest takes at least B(K), the least time of any
// continuation from K (the exact search, solvers/exhaustive/search.hpp, finds it in
// milliseconds on 60-op graphs, or proves it above a target), and the runs before it take at
// least what every schedule runs before the loss (time_run_anyway less the exactly-once ops
// from the loss on). B is monotone: a continuation from a superset of K may free the extra
// data at once, so B(K') <= B(K) for every K' containing K.
//
// That is a logic-based Benders decomposition (Hooker and Ottosson 2003) with combinatorial
// cuts (Codato and Fischetti 2006):
//   - the master problem is the time bound's relaxation with the loss as its only cut
//     (bounds/time_lower_bound.hpp): it picks a K (its k variables at the loss) and its value
//     is a lower bound on every schedule;
//   - each K it picks is scored exactly, and a row records "every schedule whose state at the
//     loss is within K takes at least that": time >= value, unless some data outside K is live;
//   - the master is solved again, until its value reaches the target (then no schedule is
//     faster than the target: a plan of that time is optimal), it picks a K whose score was
//     exact (its value is then the bound), or the time limit.
// A continuation below the target also gives a schedule where the store-all forward, each op
// once, reaches its K (as in solvers/loss_state_search.hpp): that schedule's time becomes the
// target, so the proof is also an exact solver on the graphs it fits.
// Each answer of the master is a lower bound on the time of every schedule; the result is the
// largest, so stopping early is still a proof. The time bound's relaxation alone stops below
// the optimum where it ties many states at the loss whose exact continuations all take longer:
// on bench_checkmate's 60-op DAG at 60 and 80 % of P_ref it proves 153 and 137; from the
// heuristics' plans (172, 145) this finds plans of 154 and 138 and proves them optimal in 1.2
// and 0.1 s. On the milp tests' tiny problems it reaches the exact optimum in 389 of 390 cases
// (30 s each; 368 in the test's 0.5 s), the loss-only relaxation in 138.
//
// Where the budget forces recomputation before the loss, this adds little: the master knows
// nothing of the memory before the loss, and the exact continuations from its K may not finish.
// Within the exact search's reach only: at most 128 data and 64 exactly-once ops, no in-place
// updates, a loss that runs once, and every exactly-once op bound to one side of the loss.
// Standard library only, plus the MILP backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/timing.hpp"
#include "../milp/backend.hpp"
#include "../milp/model.hpp"
#include "../core/simulate.hpp"
#include "../solvers/exhaustive.hpp"
#include "../solvers/improve.hpp"
#include "../solvers/loss_state_search.hpp"
#include "../solvers/store_all.hpp"
#include "time_lower_bound.hpp"

namespace remat {

struct LossStateBoundOptions {
    /// Seconds for the whole proof (master problems and exact continuations together).
    double time_limit_seconds = 5.0;
    /// Seconds one state's exact continuation may take at first (within the time limit); one
    /// that stops there still proves the lower bound it reached, and when the master picks the
    /// state again, it gets 4 times as many. Most states take milliseconds; a few are far
    /// harder, and the master often moves past them once their first bound is in.
    double state_seconds = 0.25;
    /// States one exact continuation may hold.
    std::size_t max_states = 2'000'000;
    ProgressCallback progress;
};

struct LossStateBound {
    /// No schedule within the budget takes less (at most the target; at least the loss-only
    /// relaxation's bound where the proof applies).
    double time = 0.0;
    /// time reached the target: no schedule within the budget is faster than the target.
    bool reached_target = false;
    /// The problem is within the proof's reach (see the top of this file); otherwise `time` is
    /// 0 and nothing was tried.
    bool applicable = false;
    /// No schedule fits the budget at all (the master has no solution).
    bool budget_infeasible = false;
    /// States at the loss scored exactly.
    std::size_t states_scored = 0;
    /// A schedule faster than the target found on the way, valid and within the budget: the
    /// store-all forward, each op once, keeping a scored state, then that state's exact
    /// continuation. The proof then goes on against its time (`target`).
    std::optional<Schedule> faster;
    /// The target the proof ended with: the one given, or the time of `faster`.
    double target = 0.0;
    double seconds = 0.0;
};

namespace detail::loss_state_bound {

// Why the proof does not apply to `p` (empty: it does).
[[nodiscard]] inline std::string not_applicable(const Problem& p) {
    const std::optional<OpId> loss = p.loss();
    if (!loss || !p.op(*loss).exactly_once) return "no loss that runs once";
    if (p.has_updates()) return "in-place updates";
    if (!Exhaustive::handles(p)) return "beyond the exact search (more than 128 data or 64 exactly-once ops)";
    const time_bound::Phases ph = time_bound::phases(p, *loss);
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (p.op(OpId{k}).exactly_once && OpId{k} != *loss && !ph.after_loss_op[k] &&
            !time_bound::must_precede(ph, OpId{k}, *loss))
            return "exactly-once op '" + p.op(OpId{k}).name + "' may run on either side of the loss";
    return {};
}


// The master problem (see the top of the file): the loss-only relaxation, a slack for the time
// its runs cannot see, and one row per scored state.
template <milp::MilpBackend Backend>
class Master {
public:
    Master(const Problem& p, Bytes budget, const Backend& backend)
        : p_(p), backend_(backend), loss_(*p.loss()), phases_(time_bound::phases(p, loss_)),
          v_(time_bound::add_variables(model_, p, phases_, {loss_}, {})) {
        const double unit = static_cast<double>(checkmate::memory_unit(p));
        feasible_rows_ = time_bound::add_rows(model_, p, phases_, {loss_}, {}, v_, budget, unit);
        unseen_ = model_.add_var(milp::VarType::continuous, 0.0, 1e12, 1.0, "unseen");
        model_.set_relative_gap(1e-9);
        anyway_ = time_bound::time_run_anyway(p, loss_);
        for (std::size_t k = 0; k < p.op_count(); ++k) {
            const Op& op = p.op(OpId{k});
            if (op.exactly_once && (OpId{k} == loss_ || phases_.after_loss_op[k])) from_loss_ += op.time;
            if (v_.runs[0][k] && !op.exactly_once) runs_after_.push_back({*v_.runs[0][k], op.time});
        }
        runs_after_.push_back({unseen_, 1.0});
    }
    // Every data a continuation may use has a variable at the loss; otherwise dropping it would
    // overstate the continuation's time (a repeatable op after the loss that reads it). The
    // others are never read on a way to the end, so dropping them changes no continuation.
    [[nodiscard]] bool covers_what_continuations_read() const {
        const std::vector<char> relevant = time_bound::useful_from(p_, phases_, loss_, true).data;
        for (std::size_t d = 0; d < p_.data_count(); ++d)
            if (relevant[d] && !v_.live[0][d] && !p_.is_initial(DataId{d}) && !phases_.after_loss_data[d]) return false;
        return true;
    }
    [[nodiscard]] bool feasible_rows() const noexcept { return feasible_rows_; }
    // What every schedule runs anyway, and the part of it before the loss.
    [[nodiscard]] double anyway() const noexcept { return anyway_; }
    [[nodiscard]] double before_loss() const noexcept { return anyway_ - from_loss_; }
    [[nodiscard]] milp::Result solve(double seconds) {
        model_.set_time_limit(std::max(0.0, seconds));
        return backend_.solve(model_);
    }
    // The data live at the loss in a solution (as a mask, with the initial data), and those left out.
    [[nodiscard]] std::pair<exhaustive::DataMask, std::vector<std::size_t>> state(const milp::Result& r) const {
        exhaustive::DataMask live;
        for (const DataId d : p_.initial()) live |= exhaustive::DataMask::bit(d.index);
        std::vector<std::size_t> left_out;
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (!v_.live[0][d]) continue;
            if (r.values[v_.live[0][d]->index] > 0.5) live |= exhaustive::DataMask::bit(d);
            else left_out.push_back(d);
        }
        return {live, left_out};
    }
    // The row of a scored state: the runs the master sees, with its slack, take at least
    // `beyond` (the score less what runs anyway) unless a data left out is live.
    void add_score(const std::vector<std::size_t>& left_out, double beyond) {
        std::vector<milp::Term> row = runs_after_;
        for (const std::size_t d : left_out) row.push_back({*v_.live[0][d], beyond});
        model_.add_row(std::move(row), milp::Sense::greater_equal, beyond);
    }

private:
    const Problem& p_;
    const Backend& backend_;
    OpId loss_;
    time_bound::Phases phases_;
    milp::Model model_;
    time_bound::Variables v_;
    bool feasible_rows_ = true;
    milp::Var unseen_{};
    double anyway_ = 0.0, from_loss_ = 0.0;
    std::vector<milp::Term> runs_after_;
};

// Scores states at the loss exactly, and makes schedules of the ones that beat the target.
class Continuations {
public:
    Continuations(const Problem& p, Bytes budget, std::size_t max_states)
        : p_(p), budget_(budget), max_states_(max_states), loss_(*p.loss()), forward_(loss_state::forward_of(p, loss_)) {
        const exhaustive::ExhaustiveSearch search(p, options(0.0));
        const Schedule store_all = store_all_reference(p).schedule;
        const std::vector<exhaustive::SearchState> states = search.states_along(store_all);
        const auto at_loss = std::find(store_all.begin(), store_all.end(), Step::run(loss_));
        done_before_loss_ = states[static_cast<std::size_t>(at_loss - store_all.begin())].done;
        done_at_end_ = states.back().done;
        for (const DataId d : p.final_data()) finals_ |= exhaustive::DataMask::bit(d.index);
    }
    // The least time of the continuation from `live` when the loss starts, or a lower bound on
    // it; looked for only below `below`, within `seconds`.
    [[nodiscard]] exhaustive::ExhaustiveSearch::Result search(exhaustive::DataMask live, double below, double seconds) const {
        const exhaustive::ExhaustiveSearch continuation(p_, options(seconds));
        const exhaustive::SearchWindow window{exhaustive::SearchState{live, done_before_loss_}, done_at_end_, finals_, 0.0};
        return continuation.run(exhaustive::SearchGoal::least_time, budget_, below, &window);
    }
    // The store-all forward keeping `live`, then `continuation`: checked by the simulator.
    [[nodiscard]] std::pair<Schedule, SimulationReport> schedule(exhaustive::DataMask live, const Schedule& continuation) const {
        std::vector<char> keep(p_.data_count(), 0);
        for (std::size_t d = 0; d < p_.data_count(); ++d) keep[d] = live.test(d) ? 1 : 0;
        Schedule steps = loss_state::forward_keeping(p_, forward_, keep);
        steps.pop_back();  // the loss: the continuation runs it
        steps.insert(steps.end(), continuation.begin(), continuation.end());
        steps = tidy_schedule(p_, std::move(steps));
        SimulationReport report = simulate(p_, steps);
        return {std::move(steps), std::move(report)};
    }

private:
    [[nodiscard]] ExhaustiveOptions options(double seconds) const {
        ExhaustiveOptions o;
        o.max_states = max_states_;
        o.time_limit_seconds = seconds;
        return o;
    }
    const Problem& p_;
    Bytes budget_;
    std::size_t max_states_;
    OpId loss_;
    loss_state::Forward forward_;
    std::uint64_t done_before_loss_ = 0, done_at_end_ = 0;
    exhaustive::DataMask finals_;
};

}  // namespace detail::loss_state_bound

/// A proven lower bound on the time of every schedule of `problem` within `budget`, raised
/// towards `target` (typically a plan's time) as described at the top of this file, within
/// the time limit. reached_target says that no schedule is faster than the final target (the
/// given one, or the time of a faster schedule found on the way).
/// Throws InvalidInput on a negative time limit or non-positive state seconds, and what the
/// backend throws.
template <milp::MilpBackend Backend>
[[nodiscard]] LossStateBound loss_state_bound(const Problem& problem, Bytes budget, const Backend& backend, double target,
                                              const LossStateBoundOptions& options = {}) {
    namespace lb = detail::loss_state_bound;
    if (!(options.time_limit_seconds >= 0) || !(options.state_seconds > 0))
        throw InvalidInput("loss-state bound: time_limit_seconds must be >= 0 and state_seconds > 0");
    const Stopwatch clock;
    LossStateBound out;
    out.target = target;
    if (const std::string why = lb::not_applicable(problem); !why.empty()) {
        report_progress(options.progress, "loss-state bound: does not apply to '" + problem.name() + "': " + why);
        return out;
    }
    lb::Master master(problem, budget, backend);
    if (!master.covers_what_continuations_read()) {
        report_progress(options.progress, "loss-state bound: does not apply to '" + problem.name() +
                                              "': an op after the loss reads data the relaxation does not track");
        return out;
    }
    out.applicable = true;
    const auto finish = [&] {
        // (a faster schedule found last may already meet the bound proven before it)
        out.reached_target = out.reached_target || out.time >= out.target * (1 - 1e-9);
        out.seconds = clock.seconds();
        return out;
    };
    if (!master.feasible_rows()) {  // what the loss itself needs does not fit
        out.budget_infeasible = out.reached_target = true;
        out.time = out.target;
        return finish();
    }
    const lb::Continuations continuations(problem, budget, options.max_states);
    const auto left = [&] { return options.time_limit_seconds - clock.seconds(); };
    struct Scored {
        detail::exhaustive::DataMask live;
        double seconds;  // for its next search
        bool exact;      // that search finished
    };
    std::vector<Scored> scored;
    for (;;) {
        const milp::Result r = master.solve(left());
        if (r.status == milp::Status::infeasible) {  // the rows leave every state a solution: only the budget does this
            out.budget_infeasible = out.reached_target = true;
            out.time = out.target;
            break;
        }
        const double proven = master.anyway() + (r.status == milp::Status::optimal ? r.objective : std::max(0.0, r.best_bound));
        out.time = std::max(out.time, std::min(proven, out.target));
        if (proven >= out.target * (1 - 1e-9)) break;  // reached
        if (r.status != milp::Status::optimal || left() <= 0) break;
        const auto state = master.state(r);  // (no structured binding: a lambda below reads it, which clang 14 refuses)
        const detail::exhaustive::DataMask& live = state.first;
        const std::vector<std::size_t>& left_out = state.second;
        auto again = std::find_if(scored.begin(), scored.end(), [&](const Scored& x) { return x.live == live; });
        if (again != scored.end() && again->exact) break;  // its value is the master's
        if (again == scored.end()) again = scored.insert(scored.end(), Scored{live, options.state_seconds, false});
        const auto found = continuations.search(live, out.target - master.before_loss(), std::min(again->seconds, left()));
        again->seconds *= 4;  // if the master picks it again
        again->exact = !found.stopped;
        const double rest = found.found ? found.time : found.stopped ? found.lower_bound : out.target - master.before_loss();
        ++out.states_scored;
        report_progress(options.progress, "loss-state bound: state " + std::to_string(out.states_scored) + ": at least " +
                                              std::to_string(master.before_loss() + rest) + ", bound so far " +
                                              std::to_string(out.time));
        if (found.found) {  // below the target: a faster schedule, where the store-all forward reaches the state
            auto [steps, report] = continuations.schedule(live, found.schedule);
            if (report.fits(budget) && report.time < out.target) {
                report_progress(options.progress, "loss-state bound: a schedule of " + std::to_string(report.time) +
                                                      " (the target was " + std::to_string(out.target) + ")");
                out.faster = std::move(steps);
                out.target = report.time;
            }
        }
        const double beyond = master.before_loss() + rest - master.anyway();  // what the row asks of the runs
        if (!(beyond > r.objective + 1e-9)) {
            if (again->exact) break;  // the master's value is this state's: nothing to add
            continue;                 // the master picks it again, and its search gets longer
        }
        master.add_score(left_out, beyond);
    }
    return finish();
}

}  // namespace remat
