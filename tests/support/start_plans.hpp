// Plans that tests of plan improvers start from.
#pragma once

#include <optional>

#include <remat/core/errors.hpp>
#include <remat/core/problem.hpp>
#include <remat/solvers/greedy.hpp>

namespace remat::testing {

// The greedy's plan, or none where it has no plan at the budget.
[[nodiscard]] inline std::optional<Plan> greedy_plan(const Problem& p, Bytes budget) {
    try {
        return Greedy{}.solve(p, budget);
    } catch (const Infeasible&) {
        return std::nullopt;
    }
}

}  // namespace remat::testing
