// remat/core/bounds.hpp — a proven lower bound on the peak memory of any valid schedule.
//
// Under the simulator of docs/formats.md §3 (simulation semantics), every valid schedule has a peak at least:
//  - the initial data (the first state);
//  - the initial and final data together (the last state);
//  - for every exactly-once op (it must run): the initial data, plus its reads and writes
//    that are not initial, plus its overhead (memory while it runs);
//  - for every data every schedule must compute (the reads of exactly-once ops, the final
//    data, and, transitively, what every writer of such a data reads): the least of that
//    requirement over its writers, since one of them must run.
// The bound is what Checkmate (Jain et al., MLSys 2020) uses to reject hopeless budgets at
// once, and what the greedy solver starts its search for its smallest budget from. The
// reason names the op or data that forces it, for Infeasible messages. Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "problem.hpp"

namespace remat {

struct MemoryLowerBound {
    Bytes bytes = 0;
    /// What forces it: "the initial data", "exactly-once op 'B3'", "computing data 'a4'", ...
    std::string reason;
};

namespace detail::bounds {

// Memory while op k runs, counting only what it must have: the initial data, its reads and
// writes that are not initial, and its overhead.
[[nodiscard]] inline Bytes op_requirement(const Problem& p, OpId k) {
    const Op& op = p.op(k);
    Bytes total = p.initial_bytes() + op.overhead;
    for (const DataId d : op.reads)
        if (!p.is_initial(d)) total += p.data(d).bytes;
    for (const DataId d : op.writes)
        if (!p.is_initial(d) && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end())
            total += p.data(d).bytes;
    return total;
}

// Raises `bound` to `bytes` (strictly larger only: the first reason found stays on ties).
inline void raise(MemoryLowerBound& bound, Bytes bytes, std::string reason) {
    if (bytes <= bound.bytes) return;
    bound.bytes = bytes;
    bound.reason = std::move(reason);
}

// Data that every writer of d reads.
[[nodiscard]] inline std::vector<DataId> common_reads(const Problem& p, DataId d) {
    const auto writers = p.writers(d);
    std::vector<DataId> common;
    for (const DataId r : p.op(writers.front()).reads) {
        bool all = true;
        for (const OpId w : writers) {
            const auto& reads = p.op(w).reads;
            all = all && std::find(reads.begin(), reads.end(), r) != reads.end();
        }
        if (all) common.push_back(r);
    }
    return common;
}

// The needed-data part of the bound: starting from `stack` (the data marked in `needed`),
// each data's cheapest writer, then the data all its writers read.
inline void raise_by_needed_data(const Problem& p, MemoryLowerBound& bound, std::vector<char>& needed,
                                 std::vector<std::size_t>& stack) {
    while (!stack.empty()) {
        const DataId d{stack.back()};
        stack.pop_back();
        const auto writers = p.writers(d);
        if (writers.empty()) continue;
        Bytes least = std::numeric_limits<Bytes>::max();
        for (const OpId w : writers) least = std::min(least, op_requirement(p, w));
        raise(bound, least, "computing data '" + p.data(d).name + "'");
        for (const DataId r : common_reads(p, d))
            if (!p.is_initial(r) && !needed[r.index]) {
                needed[r.index] = 1;
                stack.push_back(r.index);
            }
    }
}

}  // namespace detail::bounds

/// A lower bound on the peak of every valid schedule of `problem`, with what forces it.
[[nodiscard]] inline MemoryLowerBound memory_lower_bound(const Problem& problem) {
    using namespace detail::bounds;
    const Problem& p = problem;
    MemoryLowerBound bound{p.initial_bytes(), "the initial data"};
    Bytes finals = p.initial_bytes();
    for (const DataId d : p.final_data())
        if (!p.is_initial(d)) finals += p.data(d).bytes;
    raise(bound, finals, "the initial and final data together");

    std::vector<char> needed(p.data_count(), 0);
    std::vector<std::size_t> stack;
    const auto need = [&](DataId d) {
        if (!p.is_initial(d) && !needed[d.index]) {
            needed[d.index] = 1;
            stack.push_back(d.index);
        }
    };
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        const Op& op = p.op(OpId{k});
        if (!op.exactly_once) continue;
        raise(bound, op_requirement(p, OpId{k}), "exactly-once op '" + op.name + "'");
        for (const DataId d : op.reads) need(d);
    }
    for (const DataId d : p.final_data()) need(d);
    raise_by_needed_data(p, bound, needed, stack);
    return bound;
}

}  // namespace remat
