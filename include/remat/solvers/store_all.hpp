// remat/solvers/store_all.hpp — the framework's own order with no rematerialization.
//
// FORMATS.md §4: run each op of the problem's `autograd` order once and free every data
// right after its last read (or right after it is written when nothing reads it later).
// This is the store-all reference (T_ref, P_ref) that every overhead is measured against,
// and the StoreAll baseline solver.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"

namespace remat {

namespace detail {

// When a problem has no `autograd` order, choose one: every exactly-once op once, plus one
// writer for every data they (transitively) need, preferring the writer that produces the
// most of what is needed (the with-grad forward, which also keeps the saved state), in a
// topological order that follows the file's op order where the graph leaves a choice.
inline std::vector<OpId> choose_store_all_order(const Problem& p) {
    const std::size_t n_ops = p.op_count();
    const std::size_t n_data = p.data_count();
    std::vector<char> chosen(n_ops, 0);
    std::vector<char> needed(n_data, 0);
    std::vector<DataId> pending;
    const auto need = [&](DataId d) {
        if (!needed[d.index] && !p.is_initial(d)) {
            needed[d.index] = 1;
            pending.push_back(d);
        }
    };
    const auto choose = [&](OpId op) {
        if (chosen[op.index]) return;
        chosen[op.index] = 1;
        for (const DataId d : p.op(op).reads) need(d);
    };
    for (std::size_t k = 0; k < n_ops; ++k)
        if (p.op(OpId{k}).exactly_once) choose(OpId{k});
    for (const DataId d : p.final_data()) need(d);
    // Needed data are settled in the order they were discovered; a data already written
    // by a chosen op needs nothing more.
    for (std::size_t next = 0; next < pending.size(); ++next) {
        const DataId d = pending[next];
        const auto writers = p.writers(d);
        if (std::any_of(writers.begin(), writers.end(), [&](OpId w) { return chosen[w.index] != 0; })) continue;
        // Data still to be settled that a writer would also produce count in its favour.
        const auto score = [&](OpId w) {
            std::size_t covered = 0;
            for (const DataId x : p.op(w).writes) covered += needed[x.index] ? 2 : 0;
            return covered + p.op(w).writes.size();
        };
        OpId best = writers.front();
        for (const OpId w : writers)
            if (score(w) > score(best) || (score(w) == score(best) && p.op(w).time < p.op(best).time)) best = w;
        choose(best);
        // Data this writer produces and that were needed by a writer chosen earlier are
        // now covered too; data it reads joined `pending` in choose().
    }
    // Topological order over the chosen ops (Kahn), smallest op index first.
    std::vector<std::vector<std::size_t>> successors(n_ops);
    std::vector<std::size_t> missing(n_ops, 0);
    for (std::size_t k = 0; k < n_ops; ++k) {
        if (!chosen[k]) continue;
        for (const DataId d : p.op(OpId{k}).reads) {
            if (p.is_initial(d)) continue;
            // Depend on the first chosen writer of d.
            for (const OpId w : p.writers(d))
                if (chosen[w.index] && w.index != k) {
                    successors[w.index].push_back(k);
                    ++missing[k];
                    break;
                }
        }
    }
    std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
    for (std::size_t k = 0; k < n_ops; ++k)
        if (chosen[k] && missing[k] == 0) ready.push(k);
    std::vector<OpId> order;
    while (!ready.empty()) {
        const std::size_t k = ready.top();
        ready.pop();
        order.push_back(OpId{k});
        for (const std::size_t next : successors[k])
            if (--missing[next] == 0) ready.push(next);
    }
    const auto n_chosen = static_cast<std::size_t>(std::count(chosen.begin(), chosen.end(), char{1}));
    if (order.size() != n_chosen)
        throw InvalidInput("problem '" + p.name() +
                           "' has no autograd order and its ops form a cycle; give an explicit \"autograd\" order");
    return order;
}

}  // namespace detail

/// The order store-all runs: the problem's `autograd` order, or one chosen as described above.
[[nodiscard]] inline std::vector<OpId> store_all_order(const Problem& problem) {
    const auto given = problem.autograd_order();
    if (!given.empty()) return {given.begin(), given.end()};
    return detail::choose_store_all_order(problem);
}

/// Runs `order` once and frees each data right after its last read (or right after it is
/// written when nothing reads it later), never an initial or final data — FORMATS.md §4.
[[nodiscard]] inline Schedule schedule_with_eager_frees(const Problem& problem, const std::vector<OpId>& order) {
    std::vector<std::size_t> last_read(problem.data_count(), 0);
    std::vector<char> read_at_all(problem.data_count(), 0);
    for (std::size_t i = 0; i < order.size(); ++i)
        for (const DataId d : problem.op(order[i]).reads) {
            last_read[d.index] = i;
            read_at_all[d.index] = 1;
        }
    Schedule schedule;
    schedule.reserve(order.size() * 3);
    std::vector<char> live(problem.data_count(), 0);
    for (const DataId d : problem.initial()) live[d.index] = 1;
    std::vector<DataId> touched;
    for (std::size_t i = 0; i < order.size(); ++i) {
        const Op& op = problem.op(order[i]);
        schedule.push_back(Step::run(order[i]));
        touched.assign(op.reads.begin(), op.reads.end());
        touched.insert(touched.end(), op.writes.begin(), op.writes.end());
        for (const DataId d : op.writes) live[d.index] = 1;
        std::sort(touched.begin(), touched.end());
        touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
        for (const DataId d : touched) {
            const bool read_later = read_at_all[d.index] && last_read[d.index] > i;
            if (live[d.index] && !read_later && !problem.is_initial(d) && !problem.is_final(d)) {
                schedule.push_back(Step::free(d));
                live[d.index] = 0;
            }
        }
    }
    return schedule;
}

/// T_ref and P_ref of FORMATS.md §4, with the schedule that realises them.
struct Reference {
    double time = 0.0;  ///< T_ref
    Bytes peak = 0;     ///< P_ref
    Schedule schedule;
};

[[nodiscard]] inline Reference store_all_reference(const Problem& problem) {
    Schedule schedule = schedule_with_eager_frees(problem, store_all_order(problem));
    const SimulationReport report = simulate(problem, schedule);
    if (!report.valid)
        throw InvalidInput("problem '" + problem.name() + "': the store-all order is not a valid schedule: " + report.error);
    return Reference{report.time, report.peak, std::move(schedule)};
}

/// Baseline: the store-all schedule when it fits, else Infeasible (smallest budget = P_ref).
class StoreAll {
public:
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "store-all"; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        Reference ref = store_all_reference(problem);
        if (ref.peak > budget)
            throw Infeasible("store-all needs " + std::to_string(ref.peak) + " bytes for '" + problem.name() +
                                 "', above the budget of " + std::to_string(budget) + " bytes",
                             budget, ref.peak);
        SolverStats stats{std::string(name()), 0.0, SolveStatus::heuristic, std::nullopt, ""};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(ref.schedule), budget, std::move(stats));
    }
};

}  // namespace remat
