// remat/core/bounds.hpp — proven lower bounds on the peak memory and on the compute time of
// any valid schedule.
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
// reason names the op or data that forces it, for Infeasible messages.
//
// The compute time of every valid schedule is at least that of the ops it must run: every
// exactly-once op, and the only writer of each data it must compute (the same data as above;
// where a data has several writers, one of them runs, and none is counted). Standard library
// only.
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

// Data that every schedule must compute, in the order found: the reads of exactly-once ops and
// the final data that are not initial, then, transitively, the data all writers of such a data
// read (one of them must run).
[[nodiscard]] inline std::vector<DataId> needed_data(const Problem& p) {
    std::vector<char> needed(p.data_count(), 0);
    std::vector<DataId> stack, found;
    const auto need = [&](DataId d) {
        if (!p.is_initial(d) && !needed[d.index]) {
            needed[d.index] = 1;
            stack.push_back(d);
        }
    };
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (p.op(OpId{k}).exactly_once)
            for (const DataId d : p.op(OpId{k}).reads) need(d);
    for (const DataId d : p.final_data()) need(d);
    while (!stack.empty()) {
        const DataId d = stack.back();
        stack.pop_back();
        found.push_back(d);
        if (p.writers(d).empty()) continue;
        for (const DataId r : common_reads(p, d)) need(r);
    }
    return found;
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
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (p.op(OpId{k}).exactly_once)
            raise(bound, op_requirement(p, OpId{k}), "exactly-once op '" + p.op(OpId{k}).name + "'");
    // Each data every schedule computes: its cheapest writer.
    for (const DataId d : needed_data(p)) {
        const auto writers = p.writers(d);
        if (writers.empty()) continue;
        Bytes least = std::numeric_limits<Bytes>::max();
        for (const OpId w : writers) least = std::min(least, op_requirement(p, w));
        raise(bound, least, "computing data '" + p.data(d).name + "'");
    }
    return bound;
}

/// A lower bound on the compute time of every valid schedule of `problem`: the time of the ops
/// it must run (every exactly-once op, and the only writer of each data it must compute). At
/// most T_ref, and equal to it where every op is needed and has no alternative.
[[nodiscard]] inline double compute_lower_bound(const Problem& problem) {
    const Problem& p = problem;
    std::vector<char> runs(p.op_count(), 0);
    for (std::size_t k = 0; k < p.op_count(); ++k) runs[k] = p.op(OpId{k}).exactly_once ? 1 : 0;
    for (const DataId d : detail::bounds::needed_data(p)) {
        const auto writers = p.writers(d);
        if (writers.size() == 1) runs[writers.front().index] = 1;
    }
    double time = 0.0;
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (runs[k]) time += p.op(OpId{k}).time;
    return time;
}

}  // namespace remat
