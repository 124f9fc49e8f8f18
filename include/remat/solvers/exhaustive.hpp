// remat/solvers/exhaustive.hpp — exact search over all schedules of a small problem.
//
// Exhaustive: the optimum of a problem of up to 128 data and 64 exactly-once ops, by a
// best-first (A*) search over states (live data, exactly-once ops done), the exact
// combinatorial alternative to an integer program that docs/design.md §4.4 (exhaustive
// search) mentions; its least peak (smallest_budget); and certify(), what the search proves
// about an incumbent plan. It is the reference the tests compare every other solver with,
// and a practical solver for problems of up to a few dozen data.
//
// Its phases, one header each: the options (exhaustive/options.hpp); the states and their
// table (exhaustive/state.hpp); the admissible bounds (exhaustive/bounds.hpp); the search
// (exhaustive/search.hpp), which H-Rockmate (solvers/hierarchical.hpp) and window search
// (solvers/window_search.hpp) also run, with choice groups and on windows.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "exhaustive/options.hpp"
#include "exhaustive/search.hpp"

namespace remat {

/// Exact optimum over all schedules, for small problems (≤ 128 data, ≤ 64 exactly-once ops).
class Exhaustive {
public:
    explicit Exhaustive(ExhaustiveOptions options = {}) : options_(options) {
        if (!(options_.weight >= 1.0))
            throw InvalidInput("exhaustive: the weight of the bound must be at least 1 (1 is exact)");
        if (!(options_.time_limit_seconds > 0))  // NaN too
            throw InvalidInput("exhaustive: the time limit must be a positive number of seconds (infinity for none)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "exhaustive"; }
    [[nodiscard]] const ExhaustiveOptions& options() const noexcept { return options_; }

    /// The most data, and the most exactly-once ops, a problem within the search's reach has
    /// (the bit masks of its states); the other solvers that run it test against these.
    static constexpr std::size_t max_data = detail::exhaustive::max_data;
    static constexpr std::size_t max_exactly_once_ops = detail::exhaustive::max_units;

    /// Whether the problem is within the search's reach at all: at most max_data (128) data
    /// and max_exactly_once_ops (64) exactly-once ops. Beyond, every call throws InvalidInput.
    [[nodiscard]] static bool handles(const Problem& problem) {
        const auto ops = problem.all_ops();
        const auto exactly_once = std::count_if(ops.begin(), ops.end(), [](const Op& op) { return op.exactly_once; });
        return problem.data_count() <= max_data && static_cast<std::size_t>(exactly_once) <= max_exactly_once_ops;
    }

    /// A copy whose time limit is at most `seconds` (models TimeBoundedSolver).
    [[nodiscard]] Exhaustive with_time_limit_at_most(double seconds) const {
        ExhaustiveOptions o = options_;
        o.time_limit_seconds = tightened_time_limit(o.time_limit_seconds, seconds);
        return Exhaustive(o);
    }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::exhaustive::ExhaustiveSearch search(problem, options_);
        auto result = search.run(detail::exhaustive::SearchGoal::least_time, budget);
        if (!result.found) {  // the search went through every schedule (its limits throw TooLarge): a proof
            // The smallest budget, in the time that is left (the limit covers every search).
            const std::string none = "no schedule of '" + problem.name() + "' fits " + std::to_string(budget) + " bytes";
            const LeastPeak smallest = least_peak(problem, budget + 1, start);
            if (!smallest.peak)
                throw Infeasible(none + "; the smallest feasible budget is at least " + std::to_string(smallest.at_least) +
                                     " bytes (a proven bound)" +
                                     (smallest.feasible ? " and at most " + std::to_string(*smallest.feasible) +
                                                              " bytes (a schedule fits it)"
                                                        : std::string()) +
                                     ", and the search's limits ran out before the exact one was found",
                                 budget, smallest.feasible, InfeasibleBecause::no_schedule_fits);
            throw Infeasible(none + "; the smallest feasible budget is " + std::to_string(*smallest.peak) + " bytes",
                             budget, smallest.peak, InfeasibleBecause::no_schedule_fits);
        }
        SolverStats stats{std::string(name()), 0.0, options_.weight == 1.0 ? SolveStatus::optimal : SolveStatus::feasible,
                          std::nullopt, options_.weight == 1.0 ? "" : "weight=" + std::to_string(options_.weight)};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(result.schedule), budget, std::move(stats));
    }

    /// What the exact search proves about a plan at `budget` whose time is `incumbent_time`:
    /// a faster schedule (then optimal), or that none exists (the incumbent is optimal), or at
    /// the time or state limit a proven lower bound on every schedule's time. The search only
    /// explores what could beat the incumbent.
    struct Certificate {
        std::optional<Plan> faster;
        double lower_bound = 0.0;  ///< every schedule within the budget takes at least this
        bool complete = false;     ///< the search finished: the optimum is known
    };
    [[nodiscard]] Certificate certify(const Problem& problem, Bytes budget, double incumbent_time) const {
        if (options_.weight != 1.0) throw InvalidInput("exhaustive: certify() needs the exact search (weight 1)");
        const auto start = std::chrono::steady_clock::now();
        const detail::exhaustive::ExhaustiveSearch search(problem, options_);
        auto result = search.run(detail::exhaustive::SearchGoal::least_time, budget, incumbent_time);
        Certificate c;
        if (result.found) {
            SolverStats stats{std::string(name()), seconds_since(start), SolveStatus::optimal, std::nullopt,
                              "certified against an incumbent"};
            c.lower_bound = result.time;
            c.faster = make_checked_plan(problem, std::move(result.schedule), budget, std::move(stats));
            c.complete = true;
            return c;
        }
        c.lower_bound = result.lower_bound;
        c.complete = !result.stopped;
        return c;
    }

    /// A proven lower bound on the least peak of any valid schedule, from the search's bounds
    /// alone, without searching (microseconds to milliseconds): the smallest budget at which
    /// the memory and recompute bounds do not rule out the start. Often the least peak itself;
    /// core/bounds.hpp's memory_lower_bound may still be higher (it also counts what writers
    /// of needed data need), so a caller takes the larger.
    [[nodiscard]] Bytes least_budget_bound(const Problem& problem) const {
        ExhaustiveOptions o = options_;
        o.memory_bound = true;
        o.recompute_bound = true;
        return detail::exhaustive::ExhaustiveSearch(problem, o).least_budget_bound(0);
    }

    /// The least peak of any valid schedule: the smallest budget any solver can meet.
    [[deprecated("use smallest_budget()")]] [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        return smallest_budget(problem);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        const LeastPeak least = least_peak(problem, 0, std::chrono::steady_clock::now());
        if (least.none_at_all) throw InvalidInput("problem '" + problem.name() + "' has no valid schedule at all");
        if (!least.peak)
            throw TooLarge("exhaustive search on '" + problem.name() + "': the limits ran out before the least peak "
                           "was found; it is at least " + std::to_string(least.at_least) +
                           " bytes (raise ExhaustiveOptions' limits, or use checkmate, hrockmate or auto)");
        return *least.peak;
    }

private:
    struct LeastPeak {
        std::optional<Bytes> peak;      // the least peak of any schedule, when the searches finished
        Bytes at_least = 0;             // proven: every schedule's peak is at least this
        std::optional<Bytes> feasible;  // the least peak of a schedule found
        bool none_at_all = false;       // proven: no valid schedule exists
    };
    // The least peak of any schedule, known to be at least `floor`, in two phases. First a
    // schedule under a ceiling: ceilings grow from the bounds' own least budget, an eighth more
    // each time, and at each a brief search for any schedule within it (weighted A*: the
    // bound steers it to a goal; the bounds at the ceiling prune it); a search that ends with
    // none proves the least peak above the ceiling, one that runs out of states proves
    // nothing. Then, with a schedule of peak p, one exact least-peak search below p, pruned by
    // the bounds at p, settles the rest. One time limit, counted from `start`, covers all.
    [[nodiscard]] LeastPeak least_peak(const Problem& problem, Bytes floor, std::chrono::steady_clock::time_point start) const {
        using detail::exhaustive::ExhaustiveSearch;
        using detail::exhaustive::SearchGoal;
        const ExhaustiveSearch bounds(problem, options_);
        const Bytes unconstrained = bounds.unconstrained_budget();
        const auto rest = [&](double weight, std::size_t max_states) {
            ExhaustiveOptions o = options_;
            o.weight = weight;
            o.max_states = std::min(o.max_states, max_states);
            o.time_limit_seconds = tightened_time_limit(options_.time_limit_seconds,
                                                        options_.time_limit_seconds - seconds_since(start));
            return o;
        };
        constexpr std::size_t brief = 100'000;  // states of one probe below the unconstrained budget
        LeastPeak out;
        out.at_least = bounds.least_budget_bound(floor);
        try {
            for (Bytes ceiling = out.at_least; !out.feasible;) {
                const bool last = ceiling >= unconstrained;
                try {
                    const auto any = ExhaustiveSearch(problem, rest(8.0, last ? options_.max_states : brief))
                                         .run(SearchGoal::least_time, last ? std::numeric_limits<Bytes>::max() : ceiling);
                    if (any.found) {
                        out.feasible = any.peak;
                    } else if (last) {
                        out.none_at_all = true;
                        return out;
                    } else {
                        out.at_least = ceiling + 1;
                    }
                } catch (const TooLarge&) {  // the probe's state cap: nothing proven at this ceiling
                    if (last || seconds_since(start) >= options_.time_limit_seconds) throw;  // or the time is up
                }
                ceiling = std::min(unconstrained, ceiling + std::max<Bytes>(1, ceiling / 8));
            }
            if (*out.feasible > out.at_least) {
                const auto least = ExhaustiveSearch(problem, rest(1.0, options_.max_states))
                                       .run(SearchGoal::least_peak, *out.feasible - 1);
                if (least.found) out.feasible = least.peak;
            }
            out.peak = out.at_least = *out.feasible;
        } catch (const SolverError&) {  // a limit: what is proven stands
        }
        return out;
    }

    ExhaustiveOptions options_;
};

/// The least peak of any valid schedule of a small problem (see Exhaustive).
[[nodiscard]] inline Bytes exact_smallest_budget(const Problem& problem, ExhaustiveOptions options = {}) {
    return Exhaustive(options).smallest_budget(problem);
}
[[deprecated("use exact_smallest_budget()")]] [[nodiscard]] inline Bytes smallest_feasible_budget(
    const Problem& problem, ExhaustiveOptions options = {}) {
    return exact_smallest_budget(problem, options);
}

}  // namespace remat
