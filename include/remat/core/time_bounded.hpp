// remat/core/time_bounded.hpp — solvers whose time limit a caller can tighten.
//
// A solver that runs inside another one (a block solver inside Rockmate, docs/design.md
// §4.4) must stop when its caller's time runs out, not at its own, longer limit. Such a
// solver models remat::TimeBoundedSolver: `with_time_limit_at_most(seconds)` returns a copy
// whose time limit is the smaller of its own and `seconds`. `time_bounded(solver, seconds)`
// gives that copy, or the solver itself when it has no time limit to tighten.
#pragma once

#include <algorithm>
#include <concepts>

#include "solver.hpp"

namespace remat {

template <class S>
concept TimeBoundedSolver = Solver<S> && requires(const S& solver, double seconds) {
    { solver.with_time_limit_at_most(seconds) } -> std::same_as<S>;
};

/// The time limit `own` tightened to at most `at_most`. A limit that has already run out
/// (at_most <= 0) becomes the smallest positive one, which solvers accept and which stops
/// them at their first time check.
[[nodiscard]] constexpr double tightened_time_limit(double own, double at_most) noexcept {
    return std::max(std::min(own, at_most), 1e-9);
}

/// `solver` with a time limit of at most `seconds` when it has one to tighten, else itself.
template <Solver S>
[[nodiscard]] S time_bounded(const S& solver, double seconds) {
    if constexpr (TimeBoundedSolver<S>)
        return solver.with_time_limit_at_most(seconds);
    else
        return solver;
}

}  // namespace remat
