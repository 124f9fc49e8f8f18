// remat/solvers/store_all.hpp — the framework's own order with no rematerialization.
//
// docs/formats.md §4 (store-all reference): run each op of the problem's `autograd` order once and free every data
// right after its last read (or right after it is written when nothing reads it later).
// This is the store-all reference (T_ref, P_ref) that every overhead is measured against,
// and the StoreAll baseline solver.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "../graph/production.hpp"
#include "../graph/topological.hpp"

namespace remat {

namespace detail::store_all {

// The ops store-all runs when a problem has no `autograd` order: every exactly-once op, plus
// one writer for every data they (transitively) need and for every final data. A data's
// writer is taken among those that produce it first (graph/production.hpp), so that what the
// writer reads can be produced without it: writers that read data nothing produces, or that
// could only come after what they feed, are never picked. Among those, the writer producing
// the most of what is needed wins (the with-grad forward, which also keeps the saved state),
// then the fastest. Data needed are settled in the order they are discovered; a data already
// written by a chosen op of its first level needs nothing more.
inline std::vector<char> choose_store_all_ops(const Problem& p, const graph::ProductionLevels& levels) {
    std::vector<char> chosen(p.op_count(), 0);
    std::vector<char> needed(p.data_count(), 0);
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
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (p.op(OpId{k}).exactly_once) choose(OpId{k});
    for (const DataId d : p.final_data()) need(d);
    // Data still to be settled that a writer would also produce count in its favour.
    const auto score = [&](OpId w) {
        std::size_t covered = 0;
        for (const DataId x : p.op(w).writes) covered += needed[x.index] ? 2 : 0;
        return covered + p.op(w).writes.size();
    };
    for (std::size_t next = 0; next < pending.size(); ++next) {
        const DataId d = pending[next];
        const auto writers = p.writers(d);
        const auto provides = [&](OpId w) { return levels.first_writer(w, d); };
        if (std::any_of(writers.begin(), writers.end(), [&](OpId w) { return chosen[w.index] && provides(w); })) continue;
        std::optional<OpId> best;
        for (const OpId w : writers) {
            if (!provides(w)) continue;
            if (!best || score(w) > score(*best) || (score(w) == score(*best) && p.op(w).time < p.op(*best).time))
                best = w;
        }
        if (!best)  // ProblemBuilder::build() checked that every needed data can be produced
            throw SolverError("store-all: no op can produce data '" + p.data(d).name + "' of '" + p.name() +
                              "' (this is a bug in remat; please report it with the problem file)");
        choose(*best);
    }
    return chosen;
}

// The chosen ops in a topological order (smallest op index first where the graph leaves a
// choice): each op after the first-level chosen writer of every data it reads.
inline std::vector<OpId> order_store_all_ops(const Problem& p, const graph::ProductionLevels& levels,
                                             const std::vector<char>& chosen) {
    const std::size_t n_ops = p.op_count();
    graph::Adjacency successors(n_ops);
    for (std::size_t k = 0; k < n_ops; ++k) {
        if (!chosen[k]) continue;
        for (const DataId d : p.op(OpId{k}).reads) {
            if (p.is_initial(d)) continue;
            for (const OpId w : p.writers(d))
                if (chosen[w.index] && levels.first_writer(w, d)) {
                    successors[w.index].push_back(k);
                    break;
                }
        }
    }
    // An op that updates data in place comes after every chosen op reading them (§11).
    for (std::size_t k = 0; k < n_ops; ++k) {
        if (!chosen[k]) continue;
        for (const DataId d : p.op(OpId{k}).updates)
            for (const OpId r : p.readers(d))
                if (chosen[r.index] && r.index != k) successors[r.index].push_back(k);
    }
    // Every data edge goes from a lower level to a higher one; an update edge could close a
    // cycle only through an op that reads what the updater writes, after the update.
    const std::optional<std::vector<std::size_t>> sorted = graph::topological_order(successors);
    if (!sorted && p.has_updates())
        throw InvalidInput("problem '" + p.name() + "': an op that reads data updated in place needs what the update "
                           "writes, so no order runs it before the update; every reader of a weight must come before "
                           "the op that updates it (docs/formats.md §11)");
    if (!sorted)
        throw SolverError("store-all: the ops chosen for '" + p.name() +
                          "' depend on each other in a cycle (this is a bug in remat; please report it with the problem "
                          "file, and give an explicit \"autograd\" order meanwhile)");
    std::vector<OpId> order;
    for (const std::size_t k : *sorted)
        if (chosen[k]) order.push_back(OpId{k});
    return order;
}

inline std::vector<OpId> choose_store_all_order(const Problem& p) {
    const graph::ProductionLevels levels = graph::production_levels(p);
    return order_store_all_ops(p, levels, choose_store_all_ops(p, levels));
}

}  // namespace detail::store_all

/// The order store-all runs: the problem's `autograd` order, or one chosen as described above.
[[nodiscard]] inline std::vector<OpId> store_all_order(const Problem& problem) {
    const auto given = problem.autograd_order();
    if (!given.empty()) return {given.begin(), given.end()};
    return detail::store_all::choose_store_all_order(problem);
}

/// The ops of store_all_order(problem) in another topological order, chosen for memory: at
/// each point, among the ops whose reads are all live, the one after which the least memory is
/// live (what it writes that is not live yet, less what it is the last remaining reader of),
/// the earlier in store_all_order on ties. Where the store-all order runs independent branches
/// side by side, so that their intermediates are live together, this order finishes one branch
/// before starting the next: a plan may then fit by reordering alone. The greedy replays it as
/// an alternative (GreedyOptions::order). O(ops² × reads).
[[nodiscard]] inline std::vector<OpId> memory_aware_order(const Problem& problem) {
    const std::vector<OpId> base = store_all_order(problem);
    const auto distinct = [](std::vector<DataId> list) {
        std::sort(list.begin(), list.end());
        list.erase(std::unique(list.begin(), list.end()), list.end());
        return list;
    };
    std::vector<std::vector<DataId>> reads, writes;
    std::vector<std::size_t> readers_left(problem.data_count(), 0);
    for (const OpId k : base) {
        reads.push_back(distinct(problem.op(k).reads));
        writes.push_back(distinct(problem.op(k).writes));
        for (const DataId d : reads.back()) ++readers_left[d.index];
    }
    std::vector<char> live(problem.data_count(), 0);
    for (const DataId d : problem.initial()) live[d.index] = 1;
    const auto kept = [&](DataId d) { return problem.is_initial(d) || problem.is_final(d); };
    std::vector<char> placed(base.size(), 0);
    std::vector<OpId> order;
    order.reserve(base.size());
    while (order.size() < base.size()) {
        std::size_t best = base.size();
        Bytes best_change = 0;
        for (std::size_t i = 0; i < base.size(); ++i) {
            if (placed[i]) continue;
            bool ready = true;
            for (const DataId d : reads[i]) ready = ready && live[d.index];
            if (!ready) continue;
            Bytes change = 0;
            for (const DataId d : writes[i])
                if (!live[d.index] && (readers_left[d.index] > 0 || problem.is_final(d))) change += problem.data(d).bytes;
            for (const DataId d : reads[i])
                if (readers_left[d.index] == 1 && !kept(d)) change -= problem.data(d).bytes;
            if (best == base.size() || change < best_change) {
                best = i;
                best_change = change;
            }
        }
        if (best == base.size()) return base;  // nothing ready: keep the order that is known valid
        placed[best] = 1;
        order.push_back(base[best]);
        for (const DataId d : writes[best]) live[d.index] = readers_left[d.index] > 0 || problem.is_final(d);
        for (const DataId d : reads[best])
            if (--readers_left[d.index] == 0 && !kept(d)) live[d.index] = 0;
    }
    return order;
}

/// Runs `order` once and frees each data right after its last read (or right after it is
/// written when nothing reads it later), never an initial or final data — docs/formats.md §4 (store-all reference).
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

/// T_ref and P_ref of docs/formats.md §4 (store-all reference), with the schedule that realises them.
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
