// remat/core/solver.hpp — the Solver concept and the Plan it returns.
//
// A solver is a pure function (problem, budget) → plan with no global state. Solvers are
// plugged in at compile time: any type with `solve(const Problem&, Bytes) const -> Plan`
// and a `name()` models remat::Solver, whether it lives in remat or in user code.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "errors.hpp"
#include "explain.hpp"
#include "problem.hpp"
#include "schedule.hpp"
#include "simulate.hpp"

namespace remat {

/// How a solver's answer stands.
enum class SolveStatus {
    optimal,    ///< proven optimal within the solver's model
    feasible,   ///< valid and within budget, optimality not proven (gap may say by how much)
    heuristic,  ///< a rule, not a search (store-all, periodic)
};

[[nodiscard]] constexpr std::string_view to_string(SolveStatus status) noexcept {
    switch (status) {
        case SolveStatus::optimal: return "optimal";
        case SolveStatus::feasible: return "feasible";
        case SolveStatus::heuristic: return "heuristic";
    }
    return "unknown";
}

inline std::ostream& operator<<(std::ostream& out, SolveStatus status) { return out << to_string(status); }

/// A fraction as a percentage with two decimals ("3.40 %"): gaps and speed-ups in
/// SolverStats::options.
[[nodiscard]] inline std::string format_percent(double fraction) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f %%", 100.0 * fraction);
    return text;
}

struct SolverStats {
    std::string solver;
    double solve_seconds = 0.0;
    SolveStatus status = SolveStatus::heuristic;
    /// How much slower than a proven lower bound the plan may be: plan time / bound - 1, with
    /// Checkmate's MILP bound when it stopped before proving optimality, or a certified one
    /// (the time bound, or the exact search's; remat::Auto). Not the MILP convention
    /// (time - bound) / time, which reads smaller for the same bound. None without a bound.
    std::optional<double> gap;
    /// Free-form description of the options used ("slots=500", "k=4").
    std::string options;
};

/// A schedule with what it costs under the simulator.
struct Plan {
    Schedule schedule;
    double time = 0.0;  ///< simulated time
    Bytes peak = 0;     ///< simulated peak
    Bytes budget = 0;   ///< the budget it was made for
    SolverStats stats;

    /// The plan in words, per layer: what runs how often, what is recomputed at what cost,
    /// what is kept (core/explain.hpp).
    [[nodiscard]] std::string explain(const Problem& problem, const ExplainOptions& options = {}) const {
        return remat::explain(problem, schedule, options);
    }
};

/// Relative slack of meets_time_bound: a proven time bound comes from a MILP solved to a
/// relative gap of 1e-6 and lowered by it (bounds/time_lower_bound.hpp), so float noise must
/// not keep a schedule at the bound from meeting it.
inline constexpr double time_bound_tolerance = 1e-7;

/// Whether a schedule of `time` meets `bound`, a proven lower bound on the time of every
/// schedule within its budget: it is then optimal over every schedule.
[[nodiscard]] inline bool meets_time_bound(double time, double bound) noexcept {
    return std::isfinite(bound) && time <= bound * (1 + time_bound_tolerance);
}

/// Throws InvalidInput when a plan of `time` is faster than `bound`, which `option` (the
/// option's name, "AutoOptions::time_bound") gave as a proven lower bound: it is then no bound
/// at this budget (one proved at another budget, say), and a plan that met it would be called
/// optimal falsely.
inline void require_time_bound_holds(double time, double bound, std::string_view option) {
    if (std::isfinite(bound) && time < bound * (1 - time_bound_tolerance))
        throw InvalidInput(std::string(option) + " is " + std::to_string(bound) + ", but a plan takes " +
                           std::to_string(time) + ": it is no lower bound at this budget; give the bound proved at "
                           "the budget planned (bounds/time_lower_bound.hpp), or none");
}

/// What a plan's options say once its time meets the proven time bound.
inline constexpr std::string_view meets_time_bound_note = "optimal: its time meets the proven time bound";

/// When `plan`'s time meets `bound` (see meets_time_bound), marks it optimal over every
/// schedule: status optimal, gap 0, and its options say why (once). Returns whether it does.
inline bool settle_by_time_bound(Plan& plan, double bound) {
    if (!meets_time_bound(plan.time, bound)) return false;
    plan.stats.status = SolveStatus::optimal;
    plan.stats.gap = 0.0;
    if (plan.stats.options.find(meets_time_bound_note) == std::string::npos)
        plan.stats.options += std::string(plan.stats.options.empty() ? "" : ", ") + std::string(meets_time_bound_note);
    return true;
}

/// The certified gap (SolverStats::gap) of a plan of time `plan_time` against `bound`, a proven
/// lower bound on the time of every schedule at its budget: plan_time / bound - 1; none without
/// a positive, finite bound.
[[nodiscard]] inline std::optional<double> certified_gap(double plan_time, double bound) {
    if (!(bound > 0) || !std::isfinite(bound)) return std::nullopt;
    return std::max(0.0, plan_time / bound - 1.0);
}

/// `plan` against `bound`, a proven lower bound at its budget: settled as optimal where its
/// time meets it (settle_by_time_bound), else given the certified gap unless it has a smaller
/// one already.
inline void certify_by_time_bound(Plan& plan, double bound) {
    if (settle_by_time_bound(plan, bound)) return;
    const std::optional<double> gap = certified_gap(plan.time, bound);
    if (gap && (!plan.stats.gap || *gap < *plan.stats.gap)) plan.stats.gap = gap;
}

template <class S>
concept Solver = requires(const S& solver, const Problem& problem, Bytes budget) {
    { solver.solve(problem, budget) } -> std::same_as<Plan>;
    { solver.name() } -> std::convertible_to<std::string_view>;
};

/// Builds a Plan from a schedule after checking it with the simulator: a solver never
/// returns a plan that is invalid or over budget, whatever its internal accounting said.
[[nodiscard]] inline Plan make_checked_plan(const Problem& problem, Schedule schedule, Bytes budget, SolverStats stats) {
    const SimulationReport report = simulate(problem, schedule);
    if (!report.valid && problem.has_updates())
        throw InvalidInput("solver '" + stats.solver + "' cannot plan '" + problem.name() + "': its ops update weights in "
                           "place (remat.problem/2, docs/formats.md §11), which remat's solvers do not model; plan it "
                           "with remat::offload::plan_remat_only or plan_with_offload, which plan its activations apart "
                           "(" + report.error + ")");
    if (!report.valid)
        throw SolverError("solver '" + stats.solver + "' produced an invalid schedule for '" + problem.name() +
                          "': " + report.error + " (this is a bug in the solver; please report it with the problem file)");
    if (report.peak > budget)
        throw SolverError("solver '" + stats.solver + "' produced a schedule of peak " + std::to_string(report.peak) +
                          " bytes above the budget " + std::to_string(budget) + " for '" + problem.name() +
                          "' (this is a bug in the solver; please report it with the problem file)");
    return Plan{std::move(schedule), report.time, report.peak, budget, std::move(stats)};
}

/// The smallest budget `solver` plans `problem` for: its own smallest_budget(problem) when it
/// has one, else what its Infeasible says at a budget nothing fits (no budget at all when it
/// says nothing).
template <Solver S>
[[nodiscard]] std::optional<Bytes> smallest_budget_of(const S& solver, const Problem& problem) {
    if constexpr (requires { { solver.smallest_budget(problem) } -> std::convertible_to<Bytes>; }) {
        return solver.smallest_budget(problem);
    } else {
        try {
            (void)solver.solve(problem, 0);
        } catch (const Infeasible& e) {
            return e.smallest_budget();
        }
        return Bytes{0};
    }
}

/// A budget given as a percentage of a reference peak: floor(percent × reference / 100).
[[nodiscard]] inline Bytes percent_of(Bytes reference, double percent) {
    if (!std::isfinite(percent) || percent < 0) throw InvalidInput("a budget percentage must be finite and >= 0");
    const auto too_large = [&] {
        return InvalidInput("a budget of " + std::to_string(percent) + " % of " + std::to_string(reference) +
                            " bytes is beyond 2^63 - 1 bytes; give a smaller percentage");
    };
    // Whole percentages in exact integer arithmetic, so that "40%" is exactly floor(40 × P / 100):
    // with P = 100 q + r, floor(p P / 100) = p q + floor(p r / 100).
    if (percent == std::floor(percent) && percent <= 1e15 && reference >= 0) {
        const auto p = static_cast<Bytes>(percent);
        const Bytes q = reference / 100;
        const Bytes low = p * (reference % 100) / 100;  // p r < 1e17
        if (p != 0 && q > (std::numeric_limits<Bytes>::max() - low) / p) throw too_large();
        return p * q + low;
    }
    const double bytes = std::floor(percent * static_cast<double>(reference) / 100.0);
    // 2^63 is the first double past the largest Bytes; the cast below would be undefined there.
    if (!(bytes < 9223372036854775808.0)) throw too_large();
    return static_cast<Bytes>(bytes);
}

}  // namespace remat
