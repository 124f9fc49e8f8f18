// remat/solvers/sequence_solver.hpp — the SequenceSolver concept: what Rockmate needs from
// the solver that plans across its blocks, and Rotor as its model.
//
// Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, "Rockmate", ICML 2023: once every block
// has its options, the multi-option Rotor DP (Beaumont et al. 2019, rotor.hpp) plans the
// chain of blocks. Rockmate hands that solver only a RotorChain (one stage per block, its
// options as RotorOptions) and a budget, and turns the RotorAction sequence it gets back into
// the schedule of the whole problem, which the simulator checks. Any solver of that chain
// model can take Rotor's place. The operations are free functions found by argument-dependent
// lookup, so that a type models the concept without changing its class (Rotor does so here):
//   sequence_plan(solver, chain, budget) -> RotorSequence whose actions are valid under
//       rotor_evaluate with a peak within the budget and never free a stage's input
//       (free_activation(l − 1)) between the forward with grad and the backward of stage l;
//       throws Infeasible (with the smallest budget when it knows it) when it has no plan.
//       The last rule is Rockmate's: a block option may free its input itself, which the
//       chain model counts through a negative saved size, so a second free would be counted
//       twice. Rotor's DP keeps it (a checkpoint goes once the part above it is done);
//   sequence_smallest_budget(solver, chain) -> the least budget sequence_plan accepts;
//   solver.name().
#pragma once

#include <concepts>
#include <string_view>

#include "../core/problem.hpp"
#include "rotor.hpp"

namespace remat {

/// Rotor's DP on a multi-option chain, under the Rotor object's own RotorOptions.
[[nodiscard]] inline RotorSequence sequence_plan(const Rotor& rotor, const RotorChain& chain, Bytes budget) {
    return rotor_plan(chain, budget, rotor.options());
}

/// The least budget rotor_plan accepts for `chain` with these options.
[[nodiscard]] inline Bytes sequence_smallest_budget(const Rotor& rotor, const RotorChain& chain) {
    return rotor.smallest_budget(chain);
}

template <class S>
concept SequenceSolver = requires(const S& solver, const RotorChain& chain, Bytes budget) {
    { sequence_plan(solver, chain, budget) } -> std::same_as<RotorSequence>;
    { sequence_smallest_budget(solver, chain) } -> std::convertible_to<Bytes>;
    { solver.name() } -> std::convertible_to<std::string_view>;
};

static_assert(SequenceSolver<Rotor>);

}  // namespace remat
