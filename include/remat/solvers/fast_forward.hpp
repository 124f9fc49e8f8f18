// remat/solvers/fast_forward.hpp — computing some data without autograd: the "no-grad
// forward" of Rockmate's blocks (Zhao et al., ICML 2023, §3) and the "fast forward" of
// H-Rockmate's cluster children (Zhao et al. 2024, HiRemate), written once.
//
// For every data needed, the writer that is not exactly-once and writes the fewest bytes
// (then the fastest) is chosen; the chosen ops run in an order their reads allow, and each
// data but the initial ones and the targets is freed after its last read. Such a schedule
// keeps nothing for the backward: it is what a solver runs when it recomputes a block or a
// child's outputs only to pass them on (docs/design.md §4.4 and §4.5).
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"

namespace remat::detail {

// The ops that compute `targets`, by op index; `who` starts the message when a needed data
// has no writer that may run twice.
[[nodiscard]] inline std::vector<char> fast_forward_writers(const Problem& q, std::span<const DataId> targets,
                                                            std::string_view who) {
    const auto written_bytes = [&](OpId k) {
        Bytes sum = 0;
        for (const DataId d : q.op(k).writes) sum += q.data(d).bytes;
        return sum;
    };
    std::vector<char> chosen(q.op_count(), 0), needed(q.data_count(), 0), produced(q.data_count(), 0);
    std::vector<DataId> pending;
    for (const DataId d : targets) {
        needed[d.index] = 1;
        pending.push_back(d);
    }
    while (!pending.empty()) {
        const DataId d = pending.back();
        pending.pop_back();
        if (q.is_initial(d) || produced[d.index]) continue;
        std::optional<OpId> best;
        for (const OpId w : q.writers(d)) {
            if (q.op(w).exactly_once) continue;
            if (!best || written_bytes(w) < written_bytes(*best) ||
                (written_bytes(w) == written_bytes(*best) && q.op(w).time < q.op(*best).time))
                best = w;
        }
        if (!best)
            throw SolverError(std::string(who) + ": no forward op of '" + q.name() + "' writes '" + q.data(d).name +
                              "' (this is a bug in the solver's partition; please report it)");
        chosen[best->index] = 1;
        for (const DataId w : q.op(*best).writes) produced[w.index] = 1;
        for (const DataId r : q.op(*best).reads)
            if (!needed[r.index]) {
                needed[r.index] = 1;
                pending.push_back(r);
            }
    }
    return chosen;
}

// The chosen ops in an order the reads allow: repeatedly the first chosen op whose reads
// are available.
[[nodiscard]] inline std::vector<OpId> fast_forward_order(const Problem& q, const std::vector<char>& chosen) {
    std::vector<OpId> order;
    std::vector<char> available(q.data_count(), 0), done(q.op_count(), 0);
    for (const DataId d : q.initial()) available[d.index] = 1;
    for (bool progress = true; progress;) {
        progress = false;
        for (std::size_t k = 0; k < q.op_count(); ++k) {
            if (!chosen[k] || done[k]) continue;
            const Op& op = q.op(OpId{k});
            if (!std::all_of(op.reads.begin(), op.reads.end(), [&](DataId d) { return available[d.index] != 0; })) continue;
            done[k] = 1;
            order.push_back(OpId{k});
            for (const DataId d : op.writes) available[d.index] = 1;
            progress = true;
        }
    }
    return order;
}

// Runs `order`, freeing each data but the initial ones and the targets after its last read.
[[nodiscard]] inline Schedule fast_forward_steps(const Problem& q, const std::vector<OpId>& order,
                                                 std::span<const DataId> targets) {
    std::vector<char> kept(q.data_count(), 0);
    for (const DataId d : targets) kept[d.index] = 1;
    std::vector<std::size_t> last_read(q.data_count(), 0);
    for (std::size_t i = 0; i < order.size(); ++i)
        for (const DataId d : q.op(order[i]).reads) last_read[d.index] = i;
    std::vector<char> live(q.data_count(), 0);
    Schedule out;
    for (std::size_t i = 0; i < order.size(); ++i) {
        const Op& op = q.op(order[i]);
        out.push_back(Step::run(order[i]));
        for (const DataId d : op.writes) live[d.index] = 1;
        std::vector<DataId> touched(op.reads);
        touched.insert(touched.end(), op.writes.begin(), op.writes.end());
        std::sort(touched.begin(), touched.end());
        touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
        for (const DataId d : touched)
            if (live[d.index] && !q.is_initial(d) && !kept[d.index] && last_read[d.index] <= i) {
                out.push_back(Step::free(d));
                live[d.index] = 0;
            }
    }
    return out;
}

/// The schedule that computes `targets` of `q` without autograd (see the top of this file).
[[nodiscard]] inline Schedule fast_forward(const Problem& q, std::span<const DataId> targets, std::string_view who) {
    return fast_forward_steps(q, fast_forward_order(q, fast_forward_writers(q, targets, who)), targets);
}

}  // namespace remat::detail
