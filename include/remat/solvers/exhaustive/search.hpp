// remat/solvers/exhaustive/search.hpp — the exact search of solvers/exhaustive.hpp: best-first
// (A*, Hart, Nilsson and Raphael 1968) over states (live data, exactly-once units done), from
// the start to a goal, or over a window of a schedule (solvers/window_search.hpp).
//
// Because validity and memory of a step depend only on the live set, the cheapest path to a
// goal state is the optimal schedule under docs/formats.md §3 (simulation semantics), over
// every schedule, not only persistent ones. The path cost is the time within a budget, or the
// largest memory so far (the least peak). The bounds (exhaustive/bounds.hpp) order the
// queue; ExhaustiveOptions caps the states, the bytes of the tables and the time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "../../core/timing.hpp"
#include "bounds.hpp"
#include "options.hpp"
#include "state.hpp"

namespace remat::detail::exhaustive {

// A state in the search's queue, with the keys it is ordered by.
struct QueueEntry {
    double key_time;
    Bytes key_peak;
    double time;
    SearchState state;
};

// A state reached from the one being expanded, before the table is asked about it.
struct Successor {
    SearchState next;
    double time;
    Bytes peak;
    Step action;
    std::uint64_t hash;  // state_hash(next)
};

// What minimises the path cost: total time within a budget, or the peak itself.
enum class SearchGoal { least_time, least_peak };

class ExhaustiveSearch : public SearchBounds {
public:
    using SearchBounds::SearchBounds;

    struct Result {
        bool found = false;
        Schedule schedule;
        double time = 0.0;
        Bytes peak = 0;
        /// With a bound request (run's `below` given): the search stopped at its time or state
        /// limit, and every schedule within the budget takes at least `lower_bound`.
        bool stopped = false;
        double lower_bound = 0.0;
    };

    /// `below` (least_time, weight 1): look only for schedules faster than this, and at the time
    /// or state limit return the proven lower bound (the least key still open) instead of
    /// throwing. Without it, the limits throw TooLarge. With a `window` (least_time), the
    /// search goes from its state to its end only: times, schedule and bounds are the part's.
    Result run(SearchGoal goal, Bytes budget, std::optional<double> below = std::nullopt,
               const SearchWindow* window = nullptr) const {
        const auto start = std::chrono::steady_clock::now();
        using Node = SearchNode;
        using Entry = QueueEntry;
        StateTable nodes;
        const auto worse = [goal](const Entry& a, const Entry& b) {
            if (goal == SearchGoal::least_time)
                return a.key_time != b.key_time ? a.key_time > b.key_time : a.key_peak > b.key_peak;
            return a.key_peak != b.key_peak ? a.key_peak > b.key_peak : a.key_time > b.key_time;
        };
        std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> open(worse);

        const SearchState root = window ? window->from : SearchState{initial_mask_, 0};
        const std::uint64_t tight = options_.memory_bound ? tight_units(budget) : 0;
        const auto bound = [&](const SearchState& state) {
            return window ? window_bound(state, budget, tight, *window) : heuristic(state, budget, tight);
        };
        const Bytes root_memory = memory(root.live);
        if (root_memory > budget || bound(root) == std::numeric_limits<double>::infinity()) return {};
        nodes.insert(root, Node{0.0, root_memory, root, Step::free(DataId{0}), false});
        open.push({options_.weight * bound(root), root_memory, 0.0, root});

        std::vector<Successor> successors;  // of the state being expanded, in the order generated
        const auto collect = [&](SearchState next, double time, Bytes peak, Step action) {
            successors.push_back({next, time, peak, action, state_hash(next)});
        };
        std::size_t expanded = 0;
        bool out_of_states = false;
        double dropped_key = std::numeric_limits<double>::infinity();  // least key left out for the state limit
        while (!open.empty()) {
            const Entry top = open.top();
            open.pop();
            Node& node = *nodes.find(top.state);
            if (node.closed) continue;
            node.closed = true;
            // Copied: relax's insertions may move the table's nodes.
            const double node_time = node.time;
            const Bytes node_peak = node.peak;
            const SearchState s = top.state;
            if (window ? (s.done == window->done && (s.live & window->live) == window->live) : is_goal(s))
                return reconstruct(nodes, s, root, window ? window->live | initial_mask_ : initial_mask_ | final_mask_);
            // Each expansion evaluates the bounds for every successor (up to tens of microseconds
            // on dense graphs), so the clock is read often enough to stop within milliseconds.
            if (++expanded % 64 == 0) {
                const double seconds = seconds_since(start);
                if (seconds > options_.time_limit_seconds) {
                    if (below) return stopped_at(top.key_time, *below);
                    throw TooLarge("exhaustive search on '" + p_.name() + "' exceeded its time limit of " +
                                   std::to_string(options_.time_limit_seconds) +
                                   " s (raise the limit, or use checkmate, hrockmate or auto)");
                }
            }
            // Consecutive frees commute: they are generated in increasing data order only.
            const std::size_t first_free = s == root || node.action.is_run() ? 0 : node.action.data().index + 1;

            const auto relax = [&](const Successor& successor) {
                const auto& [next, time, peak, action, hash] = successor;
                Node* const existing_node = nodes.find(next, hash);
                if (existing_node) {
                    const Node& existing = *existing_node;
                    const bool strictly_better = goal == SearchGoal::least_time ? time < existing.time : peak < existing.peak;
                    const bool better = strictly_better || (goal == SearchGoal::least_time
                                                                ? (time == existing.time && peak < existing.peak)
                                                                : (peak == existing.peak && time < existing.time));
                    // A closed state opens again when reached strictly cheaper: the recompute
                    // bound is admissible but not always consistent (its greedy packing can
                    // drop by more than an op's time), and A* stays exact only by reopening.
                    if (existing.closed ? !strictly_better : !better) return;
                }
                const double key = time + options_.weight * bound(next);
                if (key == std::numeric_limits<double>::infinity()) return;  // leads nowhere
                if (below && key >= *below) return;  // cannot beat the incumbent (weight 1: key = time + bound)
                if (existing_node) {
                    *existing_node = Node{time, peak, s, action, false};
                } else {
                    const std::size_t table_bytes = estimated_bytes(nodes, open.size());
                    if (nodes.size() >= options_.max_states || table_bytes >= options_.max_memory_bytes) {
                        if (below) {
                            out_of_states = true;
                            dropped_key = std::min(dropped_key, key);
                            return;
                        }
                        throw TooLarge(limit_message(nodes.size(), open.size()));
                    }
                    nodes.insert(next, hash, Node{time, peak, s, action, false});
                }
                open.push({key, peak, time, next});
            };

            successors.clear();
            expand(s, node_time, node_peak, budget, first_free, collect);
            // On a table of millions of states every lookup misses the cache, twice (the index,
            // then the state): asking for all the successors' lines first lets the misses overlap.
            for (const Successor& successor : successors) nodes.prefetch_index(successor.hash);
            for (const Successor& successor : successors) nodes.prefetch_state(successor.hash);
            for (const Successor& successor : successors) relax(successor);
            // A state left out for the state or memory limit may lead to a faster schedule: what is
            // proven is what the queue still holds, at least this node's key.
            if (out_of_states) return stopped_at(std::min(top.key_time, dropped_key), *below);
        }
        // Nothing faster than `below` exists: the optimum is at least `below`.
        if (below) return Result{false, {}, 0.0, 0, false, *below};
        return {};
    }

    /// The state before each step of `schedule`, and after its last (one more than its
    /// steps): what is live as the simulator has it, and the units that ran.
    [[nodiscard]] std::vector<SearchState> states_along(const Schedule& schedule) const {
        std::vector<SearchState> states{SearchState{initial_mask_, 0}};
        states.reserve(schedule.size() + 1);
        for (const Step& step : schedule) {
            SearchState next = states.back();
            if (step.is_run()) {
                next.live |= op_writes_[step.op().index];
                if (const int unit = unit_of_[step.op().index]; unit >= 0) next.done |= std::uint64_t{1} << unit;
            } else {
                next.live = next.live & ~DataMask::bit(step.data().index);
            }
            states.push_back(next);
        }
        return states;
    }
    /// What is live in `s` that nothing can read any more (see dead_data).
    [[nodiscard]] DataMask dead(const SearchState& s) const { return dead_data(s); }

private:
    // The successors of `s` (reached in `time`, with the largest memory so far `peak`), each
    // passed to relax(next, time, peak, step). Run an op: its reads live, its writes not all
    // live already (else it changes nothing), an exactly-once op not run yet, within the
    // budget while it runs; then free what is dead. Or free a live data that is not initial,
    // from `first_free` on.
    template <class Relax>
    void expand(const SearchState& s, double time, Bytes peak, Bytes budget, std::size_t first_free, Relax& relax) const {
        const Bytes mem = memory(s.live);
        for (std::size_t k = 0; k < p_.op_count(); ++k) {
            const Op& op = p_.op(OpId{k});
            const int unit = unit_of_[k];
            if (unit >= 0 && (s.done >> unit & 1U)) continue;
            if ((op_reads_[k] & s.live) != op_reads_[k]) continue;
            const DataMask writes = op_writes_[k];
            if (unit < 0 && (writes & ~s.live).empty()) continue;
            const Bytes during = mem + memory(writes & ~s.live) + op.overhead;
            if (during > budget) continue;
            SearchState next{s.live | writes, unit >= 0 ? s.done | (std::uint64_t{1} << unit) : s.done};
            next.live = next.live & ~dead_data(next);
            relax(next, time + op.time, std::max(peak, during), Step::run(OpId{k}));
        }
        for (std::size_t d = first_free; d < p_.data_count(); ++d) {
            if (!s.live.test(d) || initial_mask_.test(d)) continue;
            relax(SearchState{s.live & ~DataMask::bit(d), s.done}, time, peak, Step::free(DataId{d}));
        }
    }

    // Why the search stopped at its state or memory cap, and what to do.
    [[nodiscard]] std::string limit_message(std::size_t states, std::size_t queued) const {
        const std::string head = "exhaustive search on '" + p_.name() + "' ";
        if (states >= options_.max_states)
            return head + "exceeded " + std::to_string(options_.max_states) +
                   " states (raise ExhaustiveOptions::max_states, or use checkmate or hrockmate)";
        return head + "reached its memory cap of " + std::to_string(options_.max_memory_bytes >> 20) + " MiB at " +
               std::to_string(states) + " states and " + std::to_string(queued) +
               " queued (raise ExhaustiveOptions::max_memory_bytes, or use checkmate or hrockmate)";
    }

    // What the state table (after one more state) and the queue hold.
    [[nodiscard]] static std::size_t estimated_bytes(const StateTable& nodes, std::size_t queued) {
        return nodes.bytes_after_insert() + queued * sizeof(QueueEntry);
    }

    // Stopped with `key` the least key still to expand: with an admissible heuristic, every
    // schedule takes at least that (and at most the incumbent was asked to be beaten).
    [[nodiscard]] static Result stopped_at(double key, double below) {
        Result r;
        r.stopped = true;
        r.lower_bound = std::min(key, below);
        return r;
    }

    // The path from `root` to `goal`, then the frees of what is live at the goal but not in `keep`.
    Result reconstruct(const StateTable& nodes, SearchState goal, SearchState root, DataMask keep) const {
        Result result;
        result.found = true;
        result.time = nodes.at(goal).time;
        result.peak = nodes.at(goal).peak;
        std::vector<SearchState> path;
        for (SearchState s = goal; !(s == root); s = nodes.at(s).parent) path.push_back(s);
        for (auto it = path.rbegin(); it != path.rend(); ++it) {
            const auto& node = nodes.at(*it);
            result.schedule.push_back(node.action);
            if (!node.action.is_free()) {
                // The frees of what the run left dead: live before the run, not after.
                const SearchState& before = node.parent;
                DataMask written;
                for (const DataId d : p_.op(node.action.op()).writes) written |= DataMask::bit(d.index);
                const DataMask gone = (before.live | written) & ~it->live;
                for (std::size_t d = 0; d < p_.data_count(); ++d)
                    if (gone.test(d)) result.schedule.push_back(Step::free(DataId{d}));
            }
        }
        // Tidy: free what is left that is not to be kept (neither initial nor final, in a whole schedule).
        const DataMask leftover = goal.live & ~keep;
        for (std::size_t d = 0; d < p_.data_count(); ++d)
            if (leftover.test(d)) result.schedule.push_back(Step::free(DataId{d}));
        return result;
    }
};

}  // namespace remat::detail::exhaustive
