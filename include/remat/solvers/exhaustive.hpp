// remat/solvers/exhaustive.hpp — exact search over all schedules of a small problem.
//
// A best-first (A*) search over states (live data, exactly-once ops done), the exact
// combinatorial alternative to an integer program that DESIGN.md §4.3 mentions. Because
// validity and memory of a step depend only on the current live set, the cheapest path to
// a goal state is the optimal schedule under FORMATS.md §3 — over every schedule, not only
// persistent ones. The admissible bound is the time of the exactly-once ops still to run.
// It is the reference the tests compare every other solver with, and a practical solver
// for problems of up to a few dozen data. The same search with "largest memory so far" as
// the path cost gives the exact smallest feasible budget.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"

namespace remat {

struct ExhaustiveOptions {
    /// The search gives up (SolverError) beyond this many distinct states.
    std::size_t max_states = 4'000'000;
    /// And beyond this many seconds.
    double time_limit_seconds = 60.0;
};

namespace detail {

struct SearchState {
    std::uint64_t live = 0;
    std::uint64_t done = 0;  // exactly-once ops that ran, by their exactly-once index
    friend bool operator==(const SearchState&, const SearchState&) = default;
};

struct SearchStateHash {
    std::size_t operator()(const SearchState& s) const noexcept {
        return std::hash<std::uint64_t>{}(s.live * 0x9E3779B97F4A7C15ULL ^ (s.done + 0x632BE59BD9B4E019ULL));
    }
};

// What minimises the path cost: total time within a budget, or the peak itself.
enum class SearchGoal { least_time, least_peak };

class ExhaustiveSearch {
public:
    ExhaustiveSearch(const Problem& problem, ExhaustiveOptions options) : p_(problem), options_(options) {
        if (p_.data_count() > 64)
            throw InvalidInput("exhaustive search handles at most 64 data; problem '" + p_.name() + "' has " +
                               std::to_string(p_.data_count()) + " (use checkmate or rockmate)");
        eo_index_.assign(p_.op_count(), -1);
        for (std::size_t k = 0; k < p_.op_count(); ++k)
            if (p_.op(OpId{k}).exactly_once) {
                eo_index_[k] = static_cast<int>(eo_ops_.size());
                eo_ops_.push_back(k);
            }
        if (eo_ops_.size() > 64)
            throw InvalidInput("exhaustive search handles at most 64 exactly-once ops; problem '" + p_.name() + "' has " +
                               std::to_string(eo_ops_.size()));
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (p_.is_initial(DataId{d})) initial_mask_ |= bit(d);
            if (p_.is_final(DataId{d})) final_mask_ |= bit(d);
        }
        all_done_ = eo_ops_.size() == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << eo_ops_.size()) - 1;
    }

    struct Result {
        bool found = false;
        Schedule schedule;
        double time = 0.0;
        Bytes peak = 0;
    };

    Result run(SearchGoal goal, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        struct Node {
            double time;
            Bytes peak;
            SearchState parent;
            std::vector<Step> steps;  // steps from the parent to this state
            bool closed;
        };
        std::unordered_map<SearchState, Node, SearchStateHash> nodes;
        struct Entry {
            double key_time;
            Bytes key_peak;
            double time;
            SearchState state;
        };
        const auto worse = [goal](const Entry& a, const Entry& b) {
            if (goal == SearchGoal::least_time)
                return a.key_time != b.key_time ? a.key_time > b.key_time : a.key_peak > b.key_peak;
            return a.key_peak != b.key_peak ? a.key_peak > b.key_peak : a.key_time > b.key_time;
        };
        std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> open(worse);

        const SearchState root{initial_mask_, 0};
        const Bytes root_memory = memory(root.live);
        if (root_memory > budget) return {};
        nodes.emplace(root, Node{0.0, root_memory, root, {}, false});
        open.push({heuristic(root), root_memory, 0.0, root});

        std::size_t expanded = 0;
        while (!open.empty()) {
            const Entry top = open.top();
            open.pop();
            Node& node = nodes.at(top.state);
            if (node.closed) continue;
            node.closed = true;
            const SearchState s = top.state;
            if (is_goal(s)) return reconstruct(nodes, s, root);
            if (++expanded % 4096 == 0) {
                const double seconds = seconds_since(start);
                if (seconds > options_.time_limit_seconds)
                    throw SolverError("exhaustive search on '" + p_.name() + "' exceeded its time limit of " +
                                      std::to_string(options_.time_limit_seconds) + " s (use checkmate or rockmate)");
            }
            const double g = node.time;
            const Bytes peak_so_far = node.peak;
            const Bytes mem = memory(s.live);

            const auto relax = [&](SearchState next, double time, Bytes peak, std::vector<Step> steps) {
                if (const auto it = nodes.find(next); it != nodes.end()) {
                    Node& existing = it->second;
                    if (existing.closed) return;
                    const bool better = goal == SearchGoal::least_time
                                            ? (time < existing.time || (time == existing.time && peak < existing.peak))
                                            : (peak < existing.peak || (peak == existing.peak && time < existing.time));
                    if (!better) return;
                    existing = Node{time, peak, s, std::move(steps), false};
                } else {
                    nodes.emplace(next, Node{time, peak, s, std::move(steps), false});
                    if (nodes.size() > options_.max_states)
                        throw SolverError("exhaustive search on '" + p_.name() + "' exceeded " +
                                          std::to_string(options_.max_states) + " states (use checkmate or rockmate)");
                }
                open.push({time + heuristic(next), peak, time, next});
            };

            // Run an op: its reads live, its writes not all live already (else it changes nothing),
            // an exactly-once op not run yet; then free what is dead.
            for (std::size_t k = 0; k < p_.op_count(); ++k) {
                const Op& op = p_.op(OpId{k});
                const int eo = eo_index_[k];
                if (eo >= 0 && (s.done >> eo & 1U)) continue;
                bool ready = true;
                for (const DataId d : op.reads) ready = ready && (s.live >> d.index & 1U);
                if (!ready) continue;
                std::uint64_t writes = 0;
                for (const DataId d : op.writes) writes |= bit(d.index);
                if (eo < 0 && (writes & ~s.live) == 0) continue;
                const Bytes during = mem + memory(writes & ~s.live) + op.overhead;
                if (during > budget) continue;
                SearchState next{s.live | writes, eo >= 0 ? s.done | bit(static_cast<std::size_t>(eo)) : s.done};
                std::vector<Step> steps{Step::run(OpId{k})};
                const std::uint64_t dead = dead_data(next);
                for (std::size_t d = 0; d < p_.data_count(); ++d)
                    if (dead >> d & 1U) steps.push_back(Step::free(DataId{d}));
                next.live &= ~dead;
                relax(next, g + op.time, std::max(peak_so_far, during), std::move(steps));
            }
            // Free a live data that is neither initial nor final-and-done.
            for (std::size_t d = 0; d < p_.data_count(); ++d) {
                if (!(s.live >> d & 1U) || (initial_mask_ >> d & 1U)) continue;
                const SearchState next{s.live & ~bit(d), s.done};
                relax(next, g, peak_so_far, {Step::free(DataId{d})});
            }
        }
        return {};
    }

private:
    static constexpr std::uint64_t bit(std::size_t i) noexcept { return std::uint64_t{1} << i; }

    [[nodiscard]] Bytes memory(std::uint64_t mask) const {
        Bytes total = 0;
        for (std::size_t d = 0; mask != 0; ++d, mask >>= 1)
            if (mask & 1U) total += p_.data(DataId{d}).bytes;
        return total;
    }
    [[nodiscard]] double heuristic(const SearchState& s) const {
        double remaining = 0.0;
        for (std::size_t e = 0; e < eo_ops_.size(); ++e)
            if (!(s.done >> e & 1U)) remaining += p_.op(OpId{eo_ops_[e]}).time;
        return remaining;
    }
    [[nodiscard]] bool is_goal(const SearchState& s) const {
        return s.done == all_done_ && (s.live & final_mask_) == final_mask_;
    }
    // Live data nobody can use any more: not initial, not final, and every reader is an
    // exactly-once op that already ran. Freeing them at once never hurts.
    [[nodiscard]] std::uint64_t dead_data(const SearchState& s) const {
        std::uint64_t dead = 0;
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (!(s.live >> d & 1U) || ((initial_mask_ | final_mask_) >> d & 1U)) continue;
            bool used = false;
            for (const OpId r : p_.readers(DataId{d})) {
                const int eo = eo_index_[r.index];
                used = used || eo < 0 || !(s.done >> eo & 1U);
            }
            if (!used) dead |= bit(d);
        }
        return dead;
    }

    template <class Nodes>
    Result reconstruct(const Nodes& nodes, SearchState goal, SearchState root) const {
        Result result;
        result.found = true;
        result.time = nodes.at(goal).time;
        result.peak = nodes.at(goal).peak;
        std::vector<const std::vector<Step>*> pieces;
        for (SearchState s = goal; !(s == root);) {
            const auto& node = nodes.at(s);
            pieces.push_back(&node.steps);
            s = node.parent;
        }
        for (auto it = pieces.rbegin(); it != pieces.rend(); ++it)
            result.schedule.insert(result.schedule.end(), (*it)->begin(), (*it)->end());
        // Tidy: free what is left that is neither initial nor final.
        std::uint64_t leftover = goal.live & ~(initial_mask_ | final_mask_);
        for (std::size_t d = 0; leftover != 0; ++d, leftover >>= 1)
            if (leftover & 1U) result.schedule.push_back(Step::free(DataId{d}));
        return result;
    }

    const Problem& p_;
    ExhaustiveOptions options_;
    std::vector<int> eo_index_;
    std::vector<std::size_t> eo_ops_;
    std::uint64_t initial_mask_ = 0;
    std::uint64_t final_mask_ = 0;
    std::uint64_t all_done_ = 0;
};

}  // namespace detail

/// Exact optimum over all schedules, for small problems (≤ 64 data, ≤ 64 exactly-once ops).
class Exhaustive {
public:
    explicit Exhaustive(ExhaustiveOptions options = {}) : options_(options) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "exhaustive"; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::ExhaustiveSearch search(problem, options_);
        auto result = search.run(detail::SearchGoal::least_time, budget);
        if (!result.found) {
            const Bytes smallest = search.run(detail::SearchGoal::least_peak, std::numeric_limits<Bytes>::max()).peak;
            throw Infeasible("no schedule of '" + problem.name() + "' fits " + std::to_string(budget) +
                                 " bytes; the smallest feasible budget is " + std::to_string(smallest) + " bytes",
                             budget, smallest);
        }
        SolverStats stats{std::string(name()), 0.0, SolveStatus::optimal, std::nullopt, ""};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(result.schedule), budget, std::move(stats));
    }

    /// The least peak of any valid schedule: the smallest budget any solver can meet.
    [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        const detail::ExhaustiveSearch search(problem, options_);
        const auto result = search.run(detail::SearchGoal::least_peak, std::numeric_limits<Bytes>::max());
        if (!result.found) throw InvalidInput("problem '" + problem.name() + "' has no valid schedule at all");
        return result.peak;
    }

private:
    ExhaustiveOptions options_;
};

/// The least peak of any valid schedule of a small problem (see Exhaustive).
[[nodiscard]] inline Bytes smallest_feasible_budget(const Problem& problem, ExhaustiveOptions options = {}) {
    return Exhaustive(options).smallest_feasible_budget(problem);
}

}  // namespace remat
