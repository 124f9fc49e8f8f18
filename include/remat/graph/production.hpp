// remat/graph/production.hpp — when each data of a Problem can first be produced.
//
// The fixpoint ProblemBuilder::build() runs to decide which data can ever become live
// (docs/formats.md §1 (problems)), with the round at which each data first becomes producible: initial data
// are at level 0, an op is at 1 + the largest level of its reads, and a data at the least
// level of its writers. Choosing, for every data, a writer of the data's own level makes a
// set of ops whose "writes what the other reads" graph is acyclic (every read comes from a
// strictly lower level), which is how store-all picks its writers when a problem gives no
// order, and how the greedy solver recomputes without going round in circles. Computed
// breadth-first with a count of missing reads per op, the way Kahn's algorithm counts
// in-degrees. Standard library only.
#pragma once

#include <cstddef>
#include <deque>
#include <limits>
#include <vector>

#include "../core/problem.hpp"

namespace remat::graph {

/// The level of what can never be produced.
inline constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

struct ProductionLevels {
    std::vector<std::size_t> data;  ///< per data: 0 for initial data, `never` if unproducible
    std::vector<std::size_t> op;    ///< per op: 1 + the largest level of its reads, or `never`

    [[nodiscard]] bool producible(DataId d) const { return data.at(d.index) != never; }
    [[nodiscard]] bool runnable(OpId k) const { return op.at(k.index) != never; }
    /// Whether writer w of d is among those that produce d first (w's level is d's).
    [[nodiscard]] bool first_writer(OpId w, DataId d) const {
        return op.at(w.index) != never && op.at(w.index) == data.at(d.index);
    }
};

/// Levels when only the ops for which `usable(const Op&)` holds may run (the others get
/// `never`); initial data are at level 0 whoever writes them.
template <class Usable>
[[nodiscard]] ProductionLevels production_levels(const Problem& problem, const Usable& usable) {
    const std::size_t n_ops = problem.op_count();
    ProductionLevels levels{std::vector<std::size_t>(problem.data_count(), never), std::vector<std::size_t>(n_ops, never)};
    std::vector<std::size_t> missing(n_ops, 0);
    std::deque<DataId> reached;  // in nondecreasing level order
    for (const DataId d : problem.initial()) {
        levels.data[d.index] = 0;
        reached.push_back(d);
    }
    const auto run = [&](std::size_t k, std::size_t level) {
        levels.op[k] = level;
        for (const DataId w : problem.op(OpId{k}).writes)
            if (levels.data[w.index] == never) {
                levels.data[w.index] = level;
                reached.push_back(w);
            }
    };
    for (std::size_t k = 0; k < n_ops; ++k) {
        missing[k] = problem.op(OpId{k}).reads.size();
        if (missing[k] == 0 && usable(problem.op(OpId{k}))) run(k, 1);
    }
    while (!reached.empty()) {
        const DataId d = reached.front();
        reached.pop_front();
        for (const OpId k : problem.readers(d))
            if (--missing[k.index] == 0 && usable(problem.op(k))) run(k.index, levels.data[d.index] + 1);
    }
    return levels;
}

/// Levels when every op may run.
[[nodiscard]] inline ProductionLevels production_levels(const Problem& problem) {
    return production_levels(problem, [](const Op&) { return true; });
}

}  // namespace remat::graph
