// remat/solvers/exhaustive/options.hpp — the limits and bounds of the exact search
// (ExhaustiveOptions), shared by its phases: the bounds (exhaustive/bounds.hpp), the search
// (exhaustive/search.hpp) and the solver (solvers/exhaustive.hpp).
#pragma once

#include <cstddef>

namespace remat {

struct ExhaustiveOptions {
    /// The search gives up (TooLarge, a SolverError) beyond this many distinct states.
    std::size_t max_states = 4'000'000;
    /// And beyond this many seconds (TooLarge as well).
    double time_limit_seconds = 60.0;
    /// Weight of the admissible bound in the search order (weighted A*, Pohl 1970): 1 is
    /// exact; w > 1 returns a schedule at most w times slower than the optimum after
    /// expanding far fewer states (how H-Rockmate plans when the exact search hits its limits).
    double weight = 1.0;
    /// The second admissible bound: the recomputations a state forces (what units still to run
    /// must read and no copy holds). It cuts the states expanded by orders of magnitude on
    /// training graphs; off leaves only the time of the exactly-once ops still to run (and
    /// their private reads), the bound before it, for comparison.
    bool recompute_bound = true;
    /// The third admissible bound: the recomputations the budget forces (what is live now and
    /// needed after an exactly-once op, but cannot all stay live while that op runs). It is
    /// what prunes states that keep too much when the budget is tight; off for comparison.
    bool memory_bound = true;
    /// The search also gives up when its state table and queue would take more than this many
    /// bytes: 88 bytes a state in an array that doubles as it fills, 16 to 32 of index (so 104
    /// to 208 bytes a state), and 48 a queued entry (the queue can outgrow the table when
    /// states are reached again more cheaply).
    std::size_t max_memory_bytes = std::size_t{2} << 30;
};

}  // namespace remat
