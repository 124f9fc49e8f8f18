// remat/solvers/rockmate_milp.hpp — Rockmate with an exact block solver for blocks of any
// size: exact search (Exhaustive) on small blocks, Checkmate's integer program on the others.
//
// Zhao et al., "Rockmate", ICML 2023, solve every block with Checkmate (Jain et al., MLSys
// 2020). Blocks of a few dozen data are solved faster and as exactly by best-first search
// (docs/design.md §4.4 (exhaustive search)), so ExactBlockSolver tries that first and falls back on the MILP when the
// block is too large or the search runs out of states or time. This header needs a MILP
// backend (milp/lp_solve.hpp links lp_solve); rockmate.hpp alone needs only the standard library.
#pragma once

#include <cstddef>
#include <limits>
#include <string_view>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "../milp/backend.hpp"
#include "../milp/lp_solve.hpp"
#include "checkmate.hpp"
#include "exhaustive.hpp"
#include "rockmate.hpp"
#include "rotor.hpp"
#include "sequence_solver.hpp"

namespace remat {

struct ExactBlockSolverOptions {
    /// Blocks with at most this many data go to the exact search first.
    std::size_t exhaustive_max_data = 40;
    /// Limits of that search; beyond them the block goes to Checkmate.
    ExhaustiveOptions exhaustive{200'000, 5.0};
    CheckmateOptions checkmate{};
    /// Limit of one solve, search and MILP together (the MILP gets what the search left).
    double time_limit_seconds = std::numeric_limits<double>::infinity();
};

/// Exhaustive on small blocks, Checkmate<Backend> on the others; models remat::Solver.
template <milp::MilpBackend Backend>
class ExactBlockSolver {
public:
    explicit ExactBlockSolver(ExactBlockSolverOptions options = {}, Backend backend = {})
        : options_(options), checkmate_(options.checkmate, std::move(backend)), exhaustive_(options.exhaustive) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "exhaustive+checkmate"; }

    /// A copy whose solves (search and MILP together) stop within `seconds` (models
    /// TimeBoundedSolver: Rockmate caps each block solve by what is left of the block's time).
    [[nodiscard]] ExactBlockSolver with_time_limit_at_most(double seconds) const {
        ExactBlockSolverOptions o = options_;
        o.time_limit_seconds = tightened_time_limit(o.time_limit_seconds, seconds);
        o.exhaustive.time_limit_seconds = tightened_time_limit(o.exhaustive.time_limit_seconds, seconds);
        o.checkmate.time_limit_seconds = tightened_time_limit(o.checkmate.time_limit_seconds, seconds);
        return ExactBlockSolver(o, checkmate_.backend());
    }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const Stopwatch clock;
        if (small(problem)) {
            try {
                return exhaustive_.solve(problem, budget);
            } catch (const SolverError&) {
                // Out of states or time: the integer program copes with larger searches.
            }
        }
        return time_bounded(checkmate_, options_.time_limit_seconds - clock.seconds()).solve(problem, budget);
    }

    [[deprecated("use smallest_budget()")]] [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        return smallest_budget(problem);
    }
    /// The least peak, search and MILP together within the time limit (as solve()).
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        const Stopwatch clock;
        if (small(problem)) {
            try {
                return exhaustive_.smallest_budget(problem);
            } catch (const SolverError&) {
            }
        }
        return time_bounded(checkmate_, options_.time_limit_seconds - clock.seconds()).smallest_budget(problem);
    }

private:
    [[nodiscard]] bool small(const Problem& problem) const {
        std::size_t exactly_once = 0;
        for (const Op& op : problem.all_ops()) exactly_once += op.exactly_once ? 1 : 0;
        return problem.data_count() <= std::min<std::size_t>(options_.exhaustive_max_data, 64) && exactly_once <= 64;
    }

    ExactBlockSolverOptions options_;
    Checkmate<Backend> checkmate_;
    Exhaustive exhaustive_;
};

static_assert(TimeBoundedSolver<ExactBlockSolver<milp::LpSolve>>);

/// Rockmate as the paper runs it: exact block options (search or MILP, lp_solve by default),
/// the multi-option Rotor across blocks by default. Rockmate<> in rockmate.hpp defaults to
/// the exact search on blocks instead, because that header must not need a MILP backend.
template <milp::MilpBackend Backend = milp::LpSolve, SequenceSolver Across = Rotor>
using RockmateMilp = Rockmate<ExactBlockSolver<Backend>, Across>;

/// Rockmate with every block solved by Checkmate's integer program alone (the paper's exact
/// setup; RockmateMilp gives the same options faster on small blocks).
template <milp::MilpBackend Backend = milp::LpSolve, SequenceSolver Across = Rotor>
using RockmateCheckmate = Rockmate<Checkmate<Backend>, Across>;

}  // namespace remat
