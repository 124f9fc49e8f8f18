// remat/solvers/checkmate.hpp — optimal rematerialization of any graph by integer programming.
//
// Jain, Jain, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate: breaking the
// memory wall with optimal tensor rematerialization", MLSys 2020; on the data/op graph of
// Rockmate (Zhao et al., ICML 2023), i.e. every remat.problem/1 problem: several outputs per
// op, alternative writers, exactly-once ops, overheads, initial and final data.
//
// Formulation. Ops get one topological order. The schedule is a sequence of T *passes*;
// in a pass every op runs at most once, in that order (Checkmate's stages), and at most
// one exactly-once op runs per pass, so T = (exactly-once ops) + (extra passes). Variables:
//   R[t,k] ∈ {0,1}  op k runs in pass t (only where it can run and its result can be used),
//   Y[d,j] ∈ [0,1]  data d is live in its j-th segment: the time between two consecutive
//                   (pass, op) points where d is read or written (frees happen only there).
// Rows: each exactly-once op once; a read needs its data live just before; a segment can
// be live only if the one before was or a writer of d ran at the point between them; and
// at every (pass, op) point, the live data + the op's writes + its overhead ≤ budget. The
// objective is Σ time·R. Y needs no integrality: with R integral the least liveness that
// the rows allow is 0/1 and is what the schedule keeps (every data is freed right after
// its last read before it is written again), so the schedule's peak is never above the
// MILP's. Exactly-once ops are confined to windows of passes given by the order the graph
// forces on them (on a chain each backward gets one pass), and ops whose results no later
// point can read are not modelled at all, which keeps the model small.
//
// Exactness. Every schedule of at most T passes is a solution, and every solution is a
// schedule that the simulator (docs/formats.md §3 (simulation semantics)) accepts with the same time and no larger
// peak: the optimum is the optimum over schedules of at most T passes. On chains the
// optimal schedules need one pass per exactly-once op (each backward is preceded by one
// forward sweep); DAGs may need a few more (recomputing a branch "behind" the last op run),
// hence the extra passes (one by default on non-chains). The tests check the optimum
// against exhaustive search on hundreds of problems. The warm start (the best baseline
// that fits: store-all, Rotor or periodic) is always representable, because T is raised to
// its number of passes, so Checkmate is never worse than its baseline.
//
// Strengthening. The LP relaxation lets ops run in fractions of passes, each fraction holding
// that fraction of its data, so its bound alone is weak (often the store-all time). Rows
// that every schedule satisfies lift it: production cuts and pinned liveness (checkmate/
// formulation.hpp), and Σ time·R >= the proven time bound (bounds/time_lower_bound.hpp),
// proven first within CheckmateOptions::time_bound_seconds or given. A start that meets that
// bound is optimal over every schedule and is returned without a search; a search stopped
// early reports its gap against the higher bound. root_bounds() measures the LP bound before
// and after.
//
// Infeasible budgets: a quick lower bound (core/bounds.hpp: the largest single-op
// requirement, and the final data) rejects hopeless budgets at once; otherwise the same
// model with the budget replaced by a variable P and the objective min P gives the smallest
// peak over schedules of at most T passes, which Infeasible carries (exact whenever that
// search finishes).
//
// LP rounding (options.lp_rounding, for graphs too large for the exact search): the LP
// relaxation's liveness is rounded at several thresholds and by randomised rounding; each
// rounding is turned into a schedule that computes, pass by pass, what the exactly-once
// ops need (choosing writers the LP prefers) and keeps what the rounding keeps; schedules
// that are not valid or do not fit under the simulator are rejected. The LP optimum is
// the reported bound.
//
// Where each phase lives (namespace detail::checkmate, under solvers/checkmate/):
//   analysis.hpp     the op order, the exactly-once ops and the order forced on them, the
//                    memory unit and the quick lower bound;
//   layout.hpp       the passes and slots, and the (pass, op) points the model has;
//   formulation.hpp  the MILP of one layout (and CheckmateModelSize), its schedule from a
//                    solution and its starting solution from runs;
//   warm_start.hpp   baselines made into starting solutions;
//   rounding.hpp     the schedule of one rounding of the LP relaxation.
// This header holds the options and the solve driver (class Checkmate): the baselines, the
// one-sweep and rounding starts, the time limits, the memory cap and the infeasible budgets.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "../bounds/time_lower_bound.hpp"
#include "../milp/backend.hpp"
#include "../milp/model.hpp"
#include "checkmate/analysis.hpp"
#include "checkmate/formulation.hpp"
#include "checkmate/layout.hpp"
#include "checkmate/rounding.hpp"
#include "checkmate/warm_start.hpp"
#include "exhaustive.hpp"
#include "greedy.hpp"
#include "periodic.hpp"
#include "rotor.hpp"
#include "store_all.hpp"

namespace remat {

struct CheckmateOptions {
    /// Wall-clock limit of one solve, every MILP included. When it stops the search, the
    /// best schedule found is returned with status "feasible" and its gap.
    double time_limit_seconds = 60.0;
    /// Relative MIP gap at which the search may stop; the default proves optimality.
    double relative_gap = 1e-9;
    /// Start from the best baseline that fits the budget (store-all; Rotor/periodic on chains).
    bool warm_start = true;
    /// Another solver's schedule, a baseline too (with warm_start): where it is valid within
    /// the budget the answer is never slower than it (remat::Auto's exact component), and a
    /// baseline only as fast does not replace it.
    std::optional<Schedule> start;
    /// Solve only the LP relaxation and round it (large graphs); never exact.
    bool lp_rounding = false;
    /// Passes without exactly-once op allowed before each one (extra sweeps over the
    /// order, to recompute something "behind" the last op run). Unset: 0 on chains, where
    /// one sweep per backward op is always enough, and 1 on other graphs.
    std::optional<std::size_t> extra_passes;
    /// Roundings tried in lp_rounding mode (thresholds, then randomised).
    std::size_t rounding_trials = 40;
    /// Seed of the randomised roundings (a solve is deterministic for a given seed).
    std::uint64_t seed = 0x5eedULL;
    /// For the smallest feasible budget (Infeasible), try the exact search of
    /// solvers/exhaustive.hpp first on problems of at most 64 data (a few seconds at most),
    /// then the min-peak MILP.
    bool exhaustive_first = true;
    /// Receives the model size and the MILP outcomes, one line each; empty means silence.
    ProgressCallback progress;
    /// Seconds for a proven lower bound on the time (bounds/time_lower_bound.hpp) before the
    /// search, at most a tenth of the time limit: it becomes a row of the MILP (a valid
    /// inequality that lifts the LP relaxation, whose own bound is weak), the gap of a search
    /// stopped early is measured against it when it is higher than the search's, and a start
    /// that meets it is returned as optimal at once. 0: no bound.
    double time_bound_seconds = 5.0;
    /// A proven lower bound known already (e.g. remat-plan's): used instead of computing one.
    /// It must hold for every schedule within the budget; a higher value cuts off the optimum.
    std::optional<double> time_bound;
    /// Memory cap: a model with more run variables R[t,k] than this is not built (its rows and
    /// the backend's copy would take gigabytes); the best known schedule (the baselines and
    /// the greedy's) is returned instead, and without one the solve fails with SolverError.
    /// Two million run variables are about 1-2 GB in CBC.
    std::size_t max_run_variables = 2'000'000;
};

/// The LP relaxation of Checkmate's MILP at one budget (the bound a branch-and-bound starts
/// from, "root"), without and with its strengthening: the pinned-liveness rows and the row of
/// the proven time bound (CheckmateOptions::time_bound_seconds). −infinity where an LP could
/// not be solved; +infinity where it has no solution.
struct CheckmateRootBounds {
    double plain = 0.0;         ///< the formulation's LP alone (Checkmate's own rows)
    double time_bound = 0.0;    ///< the proven time bound (bounds/time_lower_bound.hpp); −infinity without
    double strengthened = 0.0;  ///< the LP with the pinned-liveness rows and the time-bound row
};

/// Checkmate over a MILP backend (milp::LpSolve from milp/lp_solve.hpp, milp::Cbc from
/// milp/cbc.hpp, or any type modelling milp::MilpBackend).
template <milp::MilpBackend Backend>
class Checkmate {
public:
    explicit Checkmate(CheckmateOptions options = {}, Backend backend = {})
        : options_(options), backend_(std::move(backend)) {
        if (!(options_.time_limit_seconds > 0))
            throw InvalidInput("checkmate: the time limit must be positive (infinity for none)");
        if (!(options_.relative_gap >= 0) || !std::isfinite(options_.relative_gap))
            throw InvalidInput("checkmate: the MIP gap must be a finite number >= 0");
        if (!(options_.time_bound_seconds >= 0))
            throw InvalidInput("checkmate: the time bound's seconds must be >= 0 (0: no bound)");
        if (options_.time_bound && !std::isfinite(*options_.time_bound))
            throw InvalidInput("checkmate: a given time bound must be a finite number of seconds");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "checkmate"; }

    /// A copy whose time limit is at most `seconds` (models TimeBoundedSolver).
    [[nodiscard]] Checkmate with_time_limit_at_most(double seconds) const {
        CheckmateOptions o = options_;
        o.time_limit_seconds = tightened_time_limit(o.time_limit_seconds, seconds);
        return Checkmate(o, backend_);
    }
    [[nodiscard]] const CheckmateOptions& options() const noexcept { return options_; }
    [[nodiscard]] const Backend& backend() const noexcept { return backend_; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        using namespace detail::checkmate;
        const auto start = std::chrono::steady_clock::now();
        const Analysis a = analyse(problem);
        if (budget < a.lower_bound) throw_infeasible(problem, a, budget, start, a.lower_bound_reason, true);

        std::optional<Baseline> base = best_baseline(problem, a, budget);
        Layout layout = make_layout(problem, a, pre_passes(problem));
        if (const std::size_t runs = run_variables(layout); runs > options_.max_run_variables)
            return beyond_cap(problem, budget, base, runs, start);
        std::optional<Formulation> built;
        try {
            built.emplace(problem, a, std::move(layout), budget, std::vector<DataId>{}, true, deadline(start));
        } catch (const TooLarge& e) {
            return out_of_time_building(problem, budget, base, e.what(), start);
        }
        Formulation& f = *built;
        if (options_.lp_rounding) return solve_by_rounding(problem, a, f, budget, base, start);
        const double bound = proven_time_bound(problem, budget, start);
        if (base && meets_time_bound(base->time, bound)) return proven_start(problem, budget, f, *base, start);
        improve_start(problem, a, f, budget, base, start);
        if (base && options_.warm_start) start_from(a, problem, f, base->schedule);
        report(problem, budget, f, base);
        if (f.infeasible()) throw_infeasible(problem, a, budget, start, f.infeasible_reason(), true);
        if (base && meets_time_bound(base->time, bound)) return proven_start(problem, budget, f, *base, start);
        if (std::isfinite(bound)) f.add_time_at_least(bound * (1 - time_bound_tolerance));

        milp::Result r = run(f.model(), start);
        if (options_.progress) print_result(r);
        if (r.status == milp::Status::infeasible && !base) throw_infeasible(problem, a, budget, start, milp_has_none(f), false);
        if (r.status != milp::Status::optimal && std::isfinite(bound)) r.best_bound = std::max(r.best_bound, bound);
        return exact_plan(problem, budget, f, r, base, start);
    }

    /// The smallest peak of any schedule this solver's model holds (exact when the search
    /// finishes within the time limit; otherwise the best peak found).
    [[deprecated("use smallest_budget()")]] [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        return smallest_budget(problem);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::checkmate::Analysis a = detail::checkmate::analyse(problem);
        return smallest_peak(problem, a, start).peak;
    }

    /// The root LP bounds of the MILP solve() builds at this budget, before and after its
    /// strengthening (how much the valid inequalities lift the relaxation). Problems that
    /// solve() answers without a MILP (below the quick memory bound) throw Infeasible.
    [[nodiscard]] CheckmateRootBounds root_bounds(const Problem& problem, Bytes budget) const {
        using namespace detail::checkmate;
        const Analysis a = analyse(problem);
        if (budget < a.lower_bound)
            throw Infeasible("checkmate: no schedule of '" + problem.name() + "' fits " + std::to_string(budget) +
                                 " bytes (" + a.lower_bound_reason + ")",
                             budget, std::nullopt, InfeasibleBecause::no_schedule_fits);
        const auto lp = [&](const Formulation& f) {
            if (f.infeasible()) return milp::infinity;
            milp::Model relaxed = f.model().relaxation();
            relaxed.clear_start();
            relaxed.set_time_limit(options_.time_limit_seconds);
            const milp::Result r = backend_.solve(relaxed);
            if (r.status == milp::Status::infeasible) return milp::infinity;
            return r.status == milp::Status::optimal ? r.objective : -milp::infinity;
        };
        CheckmateRootBounds out;
        out.plain = lp(Formulation(problem, a, make_layout(problem, a, pre_passes(problem)), budget, {}, false));
        out.time_bound = proven_time_bound(problem, budget);
        Formulation strong(problem, a, make_layout(problem, a, pre_passes(problem)), budget);
        if (std::isfinite(out.time_bound)) strong.add_time_at_least(out.time_bound * (1 - time_bound_tolerance));
        out.strengthened = lp(strong);
        return out;
    }

    /// The size of the MILP solve() builds for this problem and budget.
    [[nodiscard]] CheckmateModelSize model_size(const Problem& problem, Bytes budget) const {
        using namespace detail::checkmate;
        const Analysis a = analyse(problem);
        const Formulation f(problem, a, make_layout(problem, a, pre_passes(problem)), budget);
        return f.size();
    }

private:
    struct Baseline {
        Schedule schedule;
        double time = 0.0;
        std::string from;
    };

    [[nodiscard]] static std::size_t run_variables(const detail::checkmate::Layout& layout) {
        return static_cast<std::size_t>(std::count(layout.allowed.begin(), layout.allowed.end(), char{1}));
    }

    // When the time limit ends, counted from `start` (none without a finite limit).
    [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> deadline(
        std::chrono::steady_clock::time_point start) const {
        return deadline_after(start, options_.time_limit_seconds);
    }

    // The time limit ran out while the MILP was built: the best known schedule, or a clear error.
    [[nodiscard]] Plan out_of_time_building(const Problem& problem, Bytes budget, const std::optional<Baseline>& base,
                                            const std::string& why, std::chrono::steady_clock::time_point start) const {
        if (!base)
            throw SolverError(why + ", and no baseline schedule fits " + std::to_string(budget) +
                              " bytes; raise the time limit, or use hrockmate or greedy");
        say(why, "; returning the ", base->from, " schedule");
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt,
                          "backend=" + std::string(backend_.name()) + " time_limit=" +
                              std::to_string(options_.time_limit_seconds) +
                              " (ran out while building the MILP) returned=" + base->from};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, base->schedule, budget, std::move(stats));
    }

    // The model would pass the memory cap: the best known schedule, or a clear error.
    [[nodiscard]] Plan beyond_cap(const Problem& problem, Bytes budget, const std::optional<Baseline>& base,
                                  std::size_t runs, std::chrono::steady_clock::time_point start) const {
        const std::string why = "the MILP would have " + std::to_string(runs) + " run variables, above max_run_variables = " +
                                std::to_string(options_.max_run_variables) + " (the memory cap)";
        if (!base)
            throw SolverError("checkmate: " + why + " for '" + problem.name() + "' and no baseline fits " +
                              std::to_string(budget) + " bytes; raise the cap or use hrockmate or greedy");
        say("checkmate: ", why, "; returning the ", base->from, " schedule");
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt,
                          "backend=" + std::string(backend_.name()) + " " + why + "; returned=" + base->from};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, base->schedule, budget, std::move(stats));
    }

    // The proven lower bound on the time (−infinity without one): the given one, or
    // bounds/time_lower_bound.hpp's within its share of the time limit.
    [[nodiscard]] double proven_time_bound(const Problem& problem, Bytes budget,
                                           std::optional<std::chrono::steady_clock::time_point> start = std::nullopt) const {
        if (options_.time_bound) return *options_.time_bound;
        double share = std::min(options_.time_bound_seconds, options_.time_limit_seconds / 10);
        if (start) share = std::min(share, options_.time_limit_seconds - seconds_since(*start));  // what building left
        if (!(share > 0)) return -milp::infinity;
        TimeLowerBoundOptions o;
        o.time_limit_seconds = share;
        try {
            const TimeLowerBound b = time_lower_bound(problem, budget, backend_, o);
            say("checkmate: proven time bound ", b.time, b.relaxation_solved ? "" : " (at its time limit)", " in ",
                b.seconds, " s");
            // A relaxation without solution proves the budget infeasible; the search below
            // finds the smallest feasible budget for the message, so the bound is just not used.
            if (b.budget_infeasible) return -milp::infinity;
            return b.time;
        } catch (const SolverError& e) {
            say("checkmate: no time bound (", e.what(), ")");
            return -milp::infinity;
        }
    }

    // The start meets the proven bound: it is optimal over every schedule, no search needed.
    [[nodiscard]] Plan proven_start(const Problem& problem, Bytes budget, const detail::checkmate::Formulation& f,
                                    const Baseline& base, std::chrono::steady_clock::time_point start) const {
        say("checkmate: the ", base.from, " schedule meets the proven time bound; it is optimal");
        SolverStats stats{std::string(name()), 0.0, SolveStatus::optimal, 0.0,
                          describe_options(f) + " returned=" + base.from + " (meets the proven time bound)"};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, base.schedule, budget, std::move(stats));
    }

    [[nodiscard]] std::size_t pre_passes(const Problem& problem) const {
        if (options_.extra_passes) return *options_.extra_passes;
        return as_chain(problem) ? 0 : 1;
    }

    // The best schedule within budget among the baselines, cleaned of useless runs.
    [[nodiscard]] std::optional<Baseline> best_baseline(const Problem& problem, const detail::checkmate::Analysis& a,
                                                        Bytes budget) const {
        using namespace detail::checkmate;
        (void)a;
        std::optional<Baseline> best;
        const auto consider = [&](Schedule s, std::string from) {
            s = without_useless_runs(problem, std::move(s));
            const SimulationReport r = simulate(problem, s);
            if (!r.fits(budget)) return;
            if (best && best->time <= r.time) return;
            best = Baseline{std::move(s), r.time, std::move(from)};
        };
        // The caller's start first: a later baseline replaces it only when strictly faster,
        // so a caller who passes an optimal schedule gets that schedule back.
        if (options_.start) {
            try {
                consider(*options_.start, "the given start");
            } catch (const Error&) {  // not a schedule of this problem: the other baselines stand
            }
        }
        try {
            consider(store_all_reference(problem).schedule, "store-all");
        } catch (const Error&) {
        }
        try {
            GreedyOptions g;
            g.improve_seconds = std::min(1.0, 0.02 * options_.time_limit_seconds);
            consider(Greedy(g).solve(problem, budget).schedule, "greedy");
        } catch (const Error&) {
        }
        if (const auto chain = as_chain(problem)) {
            try {
                consider(Rotor().solve(problem, budget).schedule, "rotor");
            } catch (const Error&) {
            }
            for (std::size_t k = 1; k <= chain->length(); ++k) consider(Periodic(k).schedule(*chain), "periodic");
        }
        return best;
    }

    // Before the full search, a better start where one is cheap: roundings of the LP
    // relaxation when no baseline fits, then the optimum of the one-sweep model.
    void improve_start(const Problem& problem, const detail::checkmate::Analysis& a,
                       const detail::checkmate::Formulation& f, Bytes budget, std::optional<Baseline>& base,
                       std::chrono::steady_clock::time_point start) const {
        if (!options_.warm_start || f.infeasible()) return;
        if (!base) {
            // No baseline fits: a few roundings of the LP relaxation usually give a good
            // start, within a tenth of the time limit.
            const double slice = std::isfinite(options_.time_limit_seconds) ? options_.time_limit_seconds / 10 : 10.0;
            base = round_relaxation(problem, a, f, budget, 12, seconds_since(start) + slice, start).best;
        }
        if (f.layout().pre > 0) improve_by_one_sweep(problem, a, budget, base, start);
    }

    // The model with one sweep per exactly-once op is much easier and usually holds the
    // optimum: its solution (within a third of the time limit) starts the full one when it
    // beats `base`.
    void improve_by_one_sweep(const Problem& problem, const detail::checkmate::Analysis& a, Bytes budget,
                              std::optional<Baseline>& base, std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        std::optional<Formulation> built;
        try {
            built.emplace(problem, a, make_layout(problem, a, 0), budget, std::vector<DataId>{}, true, deadline(start));
        } catch (const TooLarge& e) {
            say(e.what(), "; the one-sweep model is skipped");
            return;
        }
        Formulation& one = *built;
        if (one.infeasible()) return;
        if (base) start_from(a, problem, one, base->schedule);
        // Until a third of the time limit has passed (the roundings may have used some).
        one.model().set_relative_gap(options_.relative_gap);
        const milp::Result r1 = solve_until(one.model(), options_.time_limit_seconds / 3, start);
        if (options_.progress) print_result(r1);
        if (!r1.has_solution()) return;
        Schedule s1 = one.schedule(one.runs(r1.values));
        const SimulationReport rep = simulate(problem, s1);
        if (rep.fits(budget) && (!base || rep.time < base->time))
            base = Baseline{std::move(s1), rep.time, "one-sweep milp"};
    }

    // The plan from the MILP's outcome: its schedule, or the baseline when that is faster
    // (or the MILP found none in time), with the status and gap the MILP's bound proves.
    [[nodiscard]] Plan exact_plan(const Problem& problem, Bytes budget, const detail::checkmate::Formulation& f,
                                  const milp::Result& r, const std::optional<Baseline>& base,
                                  std::chrono::steady_clock::time_point start) const {
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt, describe_options(f)};

        std::optional<Schedule> schedule;
        double time = milp::infinity;
        if (r.has_solution()) {
            Schedule s = f.schedule(f.runs(r.values));
            const SimulationReport check = simulate(problem, s);
            // The backend's arithmetic could let a point exceed the budget by a hair; the
            // simulator has the last word (make_checked_plan reports a genuine bug).
            if (!check.valid || check.peak <= budget || !base) {
                schedule = std::move(s);
                time = check.time;
            }
        }
        std::string returned;
        if (base && base->time < time) {
            schedule = base->schedule;
            time = base->time;
            returned = " returned=" + base->from +
                       (r.has_solution() ? "" : " (the MILP found no schedule within the time limit; this is the best known one)");
        }
        if (!schedule)
            throw SolverError("checkmate: the time limit of " + std::to_string(options_.time_limit_seconds) +
                              " s ran out before any schedule of '" + problem.name() + "' within " +
                              std::to_string(budget) + " bytes was found; raise the time limit or use lp_rounding");
        stats.options += returned;
        const double bound = r.status == milp::Status::optimal ? r.objective : r.best_bound;
        if (r.status == milp::Status::optimal && time <= r.objective + 1e-9 * std::max(1.0, std::abs(time))) {
            stats.status = SolveStatus::optimal;
            stats.gap = 0.0;
        } else {
            // (certified_gap: plan time / the MILP's bound - 1, not the MILP's (time - bound) / time)
            stats.gap = certified_gap(time, bound);
        }
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(*schedule), budget, std::move(stats));
    }

    [[nodiscard]] milp::Result run(milp::Model& model, std::chrono::steady_clock::time_point start) const {
        model.set_relative_gap(options_.relative_gap);
        return solve_until(model, options_.time_limit_seconds, start);
    }

    // A backend cannot stop inside its first LP (CBC's root LP alone takes tens of seconds on
    // models of ~10^4 rows), so a MILP is not started at all with almost no time left: the
    // model's starting solution, if any, is the answer, with no bound.
    [[nodiscard]] milp::Result solve_until(milp::Model& model, double deadline,
                                           std::chrono::steady_clock::time_point start) const {
        if (!std::isfinite(deadline)) {
            model.set_time_limit(milp::infinity);
            return backend_.solve(model);
        }
        const double left = deadline - seconds_since(start);
        const double least = std::min(0.5, 0.05 * options_.time_limit_seconds);
        if (left >= least) {
            model.set_time_limit(left);
            return backend_.solve(model);
        }
        say("checkmate: ", left, " s left; the MILP is not started");
        milp::Result skipped;
        if (model.start() && model.is_feasible(*model.start())) {
            skipped.status = milp::Status::feasible;
            skipped.values = *model.start();
            skipped.objective = model.objective_value(skipped.values);
        }
        return skipped;
    }

    [[nodiscard]] std::string describe_options(const detail::checkmate::Formulation& f) const {
        const CheckmateModelSize s = f.size();
        std::ostringstream o;
        o << "backend=" << backend_.name() << " passes=" << s.passes << " vars=" << s.variables << " ints=" << s.integers
          << " rows=" << s.rows << " time_limit=" << options_.time_limit_seconds;
        if (options_.lp_rounding) o << " lp_rounding";
        return o.str();
    }

    void report(const Problem& problem, Bytes budget, const detail::checkmate::Formulation& f,
                const std::optional<Baseline>& base) const {
        if (!options_.progress) return;
        const CheckmateModelSize s = f.size();
        std::ostringstream start;
        if (base) start << "; start " << base->from << " time " << base->time;
        say("checkmate[", backend_.name(), "] '", problem.name(), "' budget ", budget, ": ", s.passes, " passes, ",
            s.variables, " variables (", s.integers, " binary), ", s.rows, " rows, ", s.nonzeros, " nonzeros",
            start.str());
    }
    void print_result(const milp::Result& r) const {
        say("checkmate[", backend_.name(), "] ", milp::to_string(r.status), " objective ", r.objective, " bound ",
            r.best_bound, " in ", r.seconds, " s");
    }
    // One progress line from its parts, built only when someone listens.
    template <class... Parts>
    void say(const Parts&... parts) const {
        if (!options_.progress) return;
        std::ostringstream line;
        (line << ... << parts);
        options_.progress(line.str());
    }

    // Smallest peak over schedules of the model's passes: (peak, proven).
    [[nodiscard]] std::pair<Bytes, bool> least_peak(const Problem& problem, const detail::checkmate::Analysis& a,
                                                    std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        // Past the time limit while building: TooLarge, a SolverError (the least peak is unknown).
        Formulation f(problem, a, make_layout(problem, a, pre_passes(problem)), std::nullopt, std::vector<DataId>{}, true,
                      deadline(start));
        if (f.infeasible()) throw InvalidInput("problem '" + problem.name() + "' has no valid schedule: " + f.infeasible_reason());
        // Store-all is a valid start when it has few enough passes.
        std::optional<Bytes> start_peak;
        try {
            Schedule s = without_useless_runs(problem, store_all_reference(problem).schedule);
            if (start_from(a, problem, f, s)) start_peak = simulate(problem, s).peak;
        } catch (const Error&) {
        }
        milp::Model& model = f.model();
        // P is integral in units and the time tie-break is worth under half a unit: an
        // absolute gap of 0.5 proves the least peak. solve_until sets the time limit.
        model.set_parameters(milp::Parameters{milp::infinity, 0.0, 0.5});
        const milp::Result r = solve_until(model, options_.time_limit_seconds, start);
        if (options_.progress) print_result(r);
        if (!r.has_solution()) {
            if (r.status == milp::Status::infeasible)
                throw InvalidInput("problem '" + problem.name() + "' has no valid schedule of at most " +
                                   std::to_string(f.layout().T) + " passes");
            if (start_peak) return {*start_peak, false};
            throw SolverError("checkmate: the time limit ran out before the smallest feasible budget of '" +
                              problem.name() + "' was found");
        }
        // The peak of the schedule itself (at most P·scale).
        const Schedule s = f.schedule(f.runs(r.values));
        const SimulationReport rep = simulate(problem, s);
        Bytes peak = static_cast<Bytes>(std::llround(r.value(*f.peak_var()))) * a.scale;
        if (rep.valid) peak = std::min(peak, rep.peak);
        if (start_peak) peak = std::min(peak, *start_peak);
        return {peak, r.status == milp::Status::optimal};
    }

    // The smallest peak, whether it is proven, and whether over every schedule (the exact
    // search's) or over the model's passes only (the min-peak MILP's).
    struct SmallestPeak {
        Bytes peak = 0;
        bool proven = false;
        bool every_schedule = false;
    };

    // The smallest peak: by exact search over all schedules when the problem is small
    // enough for it to finish quickly (it is exact over every schedule, not only those of
    // the model's passes), else by the min-peak MILP.
    [[nodiscard]] SmallestPeak smallest_peak(const Problem& problem, const detail::checkmate::Analysis& a,
                                             std::chrono::steady_clock::time_point start) const {
        if (options_.exhaustive_first && problem.data_count() <= 64 && a.eo_ops.size() <= 64) {
            const double left = options_.time_limit_seconds - seconds_since(start);
            ExhaustiveOptions limits;
            limits.max_states = 200'000;
            limits.time_limit_seconds = std::min(2.0, std::max(0.05, left / 4));
            try {
                return {Exhaustive(limits).smallest_budget(problem), true, true};
            } catch (const SolverError&) {
                // Too many states: the MILP copes with larger problems.
            }
        }
        const auto [peak, proven] = least_peak(problem, a, start);
        return {peak, proven, false};
    }

    // Why the MILP has no solution: none within its passes, which is not every schedule.
    [[nodiscard]] static std::string milp_has_none(const detail::checkmate::Formulation& f) {
        return "the MILP over schedules of at most " + std::to_string(f.layout().T) + " passes has no solution";
    }

    // Throws Infeasible at `budget` for `why`, with the smallest budget when it can be found in
    // the time left. `why_is_proof`: `why` holds for every schedule (a proven lower bound, a
    // cycle); otherwise the budget is proven too small only when the exact search's smallest
    // peak is above it.
    [[noreturn]] void throw_infeasible(const Problem& problem, const detail::checkmate::Analysis& a, Bytes budget,
                                       std::chrono::steady_clock::time_point start, const std::string& why,
                                       bool why_is_proof) const {
        std::optional<Bytes> smallest;
        std::string how;
        bool proof = why_is_proof;
        try {
            const SmallestPeak found = smallest_peak(problem, a, start);
            smallest = found.peak;
            proof = proof || (found.every_schedule && budget < found.peak);
            how = found.proven ? "the smallest feasible budget is " + std::to_string(found.peak) + " bytes" +
                                     (found.every_schedule ? "" : " for schedules of the model's passes")
                               : "a budget of " + std::to_string(found.peak) +
                                     " bytes works (the search for the smallest one ran out of time)";
        } catch (const Error& e) {
            how = std::string("the smallest feasible budget is unknown: ") + e.what();
        }
        throw Infeasible("checkmate: no schedule of '" + problem.name() + "' " +
                             (proof ? std::string() : "that the MILP models ") + "fits " + std::to_string(budget) +
                             " bytes (" + why + "); " + how,
                         budget, smallest,
                         proof ? InfeasibleBecause::no_schedule_fits : InfeasibleBecause::beyond_solver);
    }

    struct Rounded {
        milp::Result lp;
        std::optional<Baseline> best;
    };

    // LP relaxation + rounding: every rounding is made into a schedule, and only those the
    // simulator finds valid and within budget are kept.
    [[nodiscard]] Rounded round_relaxation(const Problem& problem, const detail::checkmate::Analysis& a,
                                           const detail::checkmate::Formulation& f, Bytes budget, std::size_t trials,
                                           double deadline, std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        Rounded out;
        milp::Model relaxed = f.model().relaxation();
        relaxed.clear_start();
        out.lp = solve_until(relaxed, deadline, start);
        if (options_.progress) print_result(out.lp);
        if (!out.lp.has_solution()) return out;
        std::mt19937_64 rng(options_.seed);
        std::uniform_real_distribution<double> uniform(0.0, 1.0);
        static constexpr double thresholds[] = {0.5, 0.9, 0.7, 0.3, 0.1, 0.99, 0.01, 0.8, 0.6, 0.4, 0.2};
        std::vector<double> draw(a.m, 0.0);
        for (std::size_t i = 0; i < std::max<std::size_t>(trials, 1); ++i) {
            if (seconds_since(start) > deadline) break;
            const bool random = i >= std::size(thresholds);
            const double theta = random ? 0.0 : thresholds[i];
            if (random)
                for (double& u : draw) u = uniform(rng);
            const auto keep = [&](std::size_t d, double y) { return random ? y > draw[d] * 0.999 : y >= theta; };
            std::optional<Schedule> s = rounded_schedule(problem, a, f, out.lp.values, keep);
            if (!s) continue;
            *s = without_useless_runs(problem, std::move(*s));
            const SimulationReport r = simulate(problem, *s);
            if (!r.fits(budget) || (out.best && r.time >= out.best->time)) continue;
            out.best = Baseline{std::move(*s), r.time, "lp-rounding"};
        }
        return out;
    }

    [[nodiscard]] Plan solve_by_rounding(const Problem& problem, const detail::checkmate::Analysis& a,
                                         detail::checkmate::Formulation& f, Bytes budget,
                                         const std::optional<Baseline>& base,
                                         std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        report(problem, budget, f, base);
        if (f.infeasible()) throw_infeasible(problem, a, budget, start, f.infeasible_reason(), true);
        Rounded rounded = round_relaxation(problem, a, f, budget, options_.rounding_trials, options_.time_limit_seconds, start);
        if (rounded.lp.status == milp::Status::infeasible)
            throw_infeasible(problem, a, budget, start,
                             "even the LP relaxation over schedules of at most " + std::to_string(f.layout().T) +
                                 " passes has no solution",
                             false);
        std::optional<Baseline> best = std::move(rounded.best);
        if (base && (!best || base->time < best->time)) best = base;
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt, describe_options(f)};
        if (!best) {
            // No rounding fits: the exact search is the only way left.
            say("checkmate: no rounding fits; solving the MILP");
            const milp::Result r = run(f.model(), start);
            if (r.status == milp::Status::infeasible) throw_infeasible(problem, a, budget, start, milp_has_none(f), false);
            if (!r.has_solution())
                throw SolverError("checkmate: no LP rounding of '" + problem.name() + "' fits " + std::to_string(budget) +
                                  " bytes and the exact search ran out of time; raise the time limit or the budget");
            Schedule s = f.schedule(f.runs(r.values));
            const double time = simulate(problem, s).time;
            best = Baseline{std::move(s), time, "milp"};
            if (r.status == milp::Status::optimal) stats.status = SolveStatus::optimal;
        }
        const double bound = rounded.lp.has_solution() ? rounded.lp.objective : -milp::infinity;
        stats.gap = stats.status == SolveStatus::optimal ? std::optional<double>(0.0) : certified_gap(best->time, bound);
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(best->schedule), budget, std::move(stats));
    }

    CheckmateOptions options_;
    Backend backend_;
};

}  // namespace remat
