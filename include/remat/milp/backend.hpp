// remat/milp/backend.hpp — the MilpBackend concept: what a MILP library must offer remat.
//
// The integer programs of Checkmate (Jain et al., MLSys 2020) and Rockmate (Zhao et al.,
// ICML 2023) are solved through this concept, so the solvers are templates over the
// backend and no library is forced on a user. A backend takes a milp::Model (variables,
// rows, objective to minimise, time limit, MIP gap, optional starting solution) and returns
// a milp::Result (status, solution, objective, best bound, seconds). It must honour the
// time limit, print nothing, keep no global mutable state, and throw remat::SolverError
// when the library itself fails. Two backends ship: milp::LpSolve (lp_solve.hpp) and
// milp::Cbc (cbc.hpp); a user may write their own.
#pragma once

#include <concepts>
#include <string_view>

#include "model.hpp"

namespace remat::milp {

template <class B>
concept MilpBackend = requires(const B& backend, const Model& model) {
    { backend.solve(model) } -> std::same_as<Result>;
    { backend.name() } -> std::convertible_to<std::string_view>;
};

}  // namespace remat::milp
