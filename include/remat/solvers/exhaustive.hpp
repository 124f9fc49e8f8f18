// remat/solvers/exhaustive.hpp — exact search over all schedules of a small problem.
//
// A best-first (A*) search over states (live data, exactly-once ops done), the exact
// combinatorial alternative to an integer program that docs/design.md §4.4 (exhaustive search) mentions. Because
// validity and memory of a step depend only on the current live set, the cheapest path to
// a goal state is the optimal schedule under docs/formats.md §3 (simulation semantics) — over every schedule, not only
// persistent ones. The admissible bound is the largest of three: the time of the exactly-once
// ops still to run (with their private reads); that time plus the recomputations the state
// forces (recompute_bound): data that units still to run must read, that are not live and
// that only repeatable ops can write again, closed over what those writers read; and that
// time plus the recomputations the budget forces (memory_bound): what exists before a unit
// and is needed after it, but cannot all be in memory while it runs. A state where such a
// data has no writer left, or where no drop fits a unit in the budget, is dropped at once.
// Memory: ExhaustiveOptions caps the states and the bytes of the search's tables.
// It is the reference the tests compare every other solver with, and a practical solver
// for problems of up to a few dozen data (at most 128). The same search with "largest memory
// so far" as the path cost gives the exact smallest feasible budget.
//
// Choice groups: H-Rockmate (hierarchical.hpp) plans a cluster whose children each offer
// several backward sub-schedules, exactly one of which must run. The search takes such
// groups of exactly-once ops and treats each group as one exactly-once unit: once any member
// runs, no member may run again.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"

namespace remat {

struct ExhaustiveOptions {
    /// The search gives up (SolverError) beyond this many distinct states.
    std::size_t max_states = 4'000'000;
    /// And beyond this many seconds.
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
    /// bytes: 89 bytes a slot of the table, which doubles when 3/4 full (so 120 to 240 bytes a
    /// state), and 48 a queued entry (the queue can outgrow the table when states are reached
    /// again more cheaply).
    std::size_t max_memory_bytes = std::size_t{2} << 30;
};

namespace detail::exhaustive {

/// A set of up to 128 data, by id.
struct DataMask {
    std::uint64_t low = 0, high = 0;
    [[nodiscard]] static constexpr DataMask bit(std::size_t i) noexcept {
        return i < 64 ? DataMask{std::uint64_t{1} << i, 0} : DataMask{0, std::uint64_t{1} << (i - 64)};
    }
    [[nodiscard]] constexpr bool test(std::size_t i) const noexcept {
        return i < 64 ? (low >> i & 1U) != 0 : (high >> (i - 64) & 1U) != 0;
    }
    [[nodiscard]] constexpr bool empty() const noexcept { return (low | high) == 0; }
    constexpr DataMask& operator|=(DataMask o) noexcept {
        low |= o.low;
        high |= o.high;
        return *this;
    }
    friend constexpr DataMask operator|(DataMask a, DataMask b) noexcept { return {a.low | b.low, a.high | b.high}; }
    friend constexpr DataMask operator&(DataMask a, DataMask b) noexcept { return {a.low & b.low, a.high & b.high}; }
    friend constexpr DataMask operator~(DataMask a) noexcept { return {~a.low, ~a.high}; }
    friend constexpr bool operator==(DataMask, DataMask) = default;
};

struct SearchState {
    DataMask live;
    std::uint64_t done = 0;  // exactly-once units that ran, by their unit index
    friend bool operator==(const SearchState&, const SearchState&) = default;
};

// A hash whose low bits depend on every bit of the state (StateTable indexes by them):
// each word goes through the finaliser of MurmurHash3 (Appleby 2008) before the next joins.
[[nodiscard]] constexpr std::uint64_t state_hash(const SearchState& s) noexcept {
    const auto mix = [](std::uint64_t x) {
        x ^= x >> 33;
        x *= 0xFF51AFD7ED558CCDULL;
        x ^= x >> 33;
        x *= 0xC4CEB9FE1A85EC53ULL;
        return x ^ (x >> 33);
    };
    return mix(s.live.low ^ mix(s.live.high ^ mix(s.done + 0x9E3779B97F4A7C15ULL)));
}

// A state the search reached: the cheapest path to it known so far.
struct SearchNode {
    double time;
    Bytes peak;
    SearchState parent;
    Step action;  // from the parent: a run (with the frees of what it leaves dead) or a free
    bool closed;
};
// The states the search reached, by state: open addressing with linear probing in one array
// (a power of two of slots, at most 3/4 full). Against a node-based hash map, a lookup
// touches one cache line instead of following pointers, and dropping a table of millions of
// states is one deallocation, not one per state: a search that stops at its time limit
// returns at once instead of spending up to a third of a second freeing its states.
// A reference into the table is valid until the next insertion.
class StateTable {
public:
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] SearchNode* find(const SearchState& state) noexcept {
        return const_cast<SearchNode*>(std::as_const(*this).find(state));
    }
    [[nodiscard]] const SearchNode* find(const SearchState& state) const noexcept {
        if (slots_.empty()) return nullptr;
        for (std::size_t i = slot_of(state);; i = (i + 1) & mask()) {
            if (!used_[i]) return nullptr;
            if (slots_[i].state == state) return &slots_[i].node;
        }
    }
    /// The node of a state the table holds (precondition: it does).
    [[nodiscard]] const SearchNode& at(const SearchState& state) const noexcept { return *find(state); }
    /// Adds `state`, which the table must not hold yet.
    void insert(const SearchState& state, const SearchNode& node) {
        if (size_ + 1 > capacity_for(slots_.size())) grow();
        place(Slot{state, node});
        ++size_;
    }
    /// The bytes the table holds after one more insertion (it may double to take it).
    [[nodiscard]] std::size_t bytes_after_insert() const noexcept {
        const std::size_t slots = size_ + 1 > capacity_for(slots_.size()) ? std::max<std::size_t>(2 * slots_.size(), 64)
                                                                          : slots_.size();
        return slots * (sizeof(Slot) + 1);
    }

private:
    struct Slot {
        SearchState state;
        SearchNode node{0.0, 0, {}, Step::free(DataId{0}), false};  // Step has no default
    };
    [[nodiscard]] static constexpr std::size_t capacity_for(std::size_t slots) noexcept { return slots / 4 * 3; }
    [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }
    [[nodiscard]] std::size_t slot_of(const SearchState& state) const noexcept {
        return static_cast<std::size_t>(state_hash(state)) & mask();
    }
    void place(const Slot& slot) {
        std::size_t i = slot_of(slot.state);
        while (used_[i]) i = (i + 1) & mask();
        slots_[i] = slot;
        used_[i] = 1;
    }
    void grow() {
        std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(std::max<std::size_t>(2 * slots_.size(), 64)));
        const std::vector<unsigned char> old_used = std::exchange(used_, std::vector<unsigned char>(slots_.size(), 0));
        for (std::size_t i = 0; i < old.size(); ++i)
            if (old_used[i]) place(old[i]);
    }

    std::vector<Slot> slots_;
    std::vector<unsigned char> used_;  // per slot: holds a state
    std::size_t size_ = 0;
};

// A state in the search's queue, with the keys it is ordered by.
struct QueueEntry {
    double key_time;
    Bytes key_peak;
    double time;
    SearchState state;
};

// What minimises the path cost: total time within a budget, or the peak itself.
enum class SearchGoal { least_time, least_peak };

// A part of a schedule to search again (solvers/window_search.hpp): from the state a schedule
// reaches before the part, to one where the same exactly-once units ran and at least what the
// schedule keeps after it is live. The rest of the schedule, `time_after` seconds, is fixed.
struct SearchWindow {
    SearchState from;
    std::uint64_t done = 0;  // the units done at the end of the part
    DataMask live;           // what must be live at its end (the rest is then freed)
    double time_after = 0.0;
};

class ExhaustiveSearch {
public:
    /// `choice_groups`: sets of exactly-once ops of which exactly one must run (see above);
    /// every other exactly-once op is a unit of its own.
    ExhaustiveSearch(const Problem& problem, ExhaustiveOptions options, const std::vector<std::vector<OpId>>& choice_groups = {})
        : p_(problem), options_(options) {
        if (p_.data_count() > 128)
            throw InvalidInput("exhaustive search handles at most 128 data; problem '" + p_.name() + "' has " +
                               std::to_string(p_.data_count()) + " (use checkmate, rockmate or hrockmate)");
        unit_of_.assign(p_.op_count(), -1);
        for (const auto& group : choice_groups) {
            for (const OpId k : group) {
                if (!p_.op(k).exactly_once)
                    throw InvalidInput("exhaustive search: choice group member '" + p_.op(k).name + "' is not exactly once");
                unit_of_.at(k.index) = static_cast<int>(units_.size());
            }
            if (!group.empty()) units_.push_back(group);
        }
        for (std::size_t k = 0; k < p_.op_count(); ++k)
            if (p_.op(OpId{k}).exactly_once && unit_of_[k] < 0) {
                unit_of_[k] = static_cast<int>(units_.size());
                units_.push_back({OpId{k}});
            }
        if (units_.size() > 64)
            throw InvalidInput("exhaustive search handles at most 64 exactly-once ops; problem '" + p_.name() + "' has " +
                               std::to_string(units_.size()));
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (p_.is_initial(DataId{d})) initial_mask_ |= DataMask::bit(d);
            if (p_.is_final(DataId{d})) final_mask_ |= DataMask::bit(d);
        }
        all_done_ = units_.size() == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << units_.size()) - 1;
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            bytes_.push_back(p_.data(DataId{d}).bytes);
            std::uint64_t units = 0;
            bool other_reader = false;
            for (const OpId r : p_.readers(DataId{d})) {
                if (unit_of_[r.index] < 0)
                    other_reader = true;
                else
                    units |= std::uint64_t{1} << unit_of_[r.index];
            }
            reader_units_.push_back(units);
            read_by_repeatable_.push_back(other_reader ? 1 : 0);
        }
        for (std::size_t k = 0; k < p_.op_count(); ++k) {
            DataMask reads, writes;
            for (const DataId d : p_.op(OpId{k}).reads) reads |= DataMask::bit(d.index);
            for (const DataId d : p_.op(OpId{k}).writes) writes |= DataMask::bit(d.index);
            op_reads_.push_back(reads);
            op_writes_.push_back(writes);
        }
        prepare_heuristic();
    }

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
    /// throwing. Without it, the limits throw SolverError. With a `window` (least_time), the
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
                    throw SolverError("exhaustive search on '" + p_.name() + "' exceeded its time limit of " +
                                      std::to_string(options_.time_limit_seconds) + " s (use checkmate or rockmate)");
                }
            }
            // Consecutive frees commute: they are generated in increasing data order only.
            const std::size_t first_free = s == root || node.action.is_run() ? 0 : node.action.data().index + 1;

            const auto relax = [&](SearchState next, double time, Bytes peak, Step action) {
                Node* const existing_node = nodes.find(next);
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
                    nodes.insert(next, Node{time, peak, s, action, false});
                }
                open.push({key, peak, time, next});
            };

            expand(s, node_time, node_peak, budget, first_free, relax);
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

    /// A budget no step can exceed: every data live at once, with the largest overhead.
    [[nodiscard]] Bytes unconstrained_budget() const {
        Bytes everything = 0;
        for (const Bytes b : bytes_) everything += b;
        Bytes largest_overhead = 0;
        for (std::size_t k = 0; k < p_.op_count(); ++k) largest_overhead = std::max(largest_overhead, p_.op(OpId{k}).overhead);
        return everything + largest_overhead;
    }

    /// A proven lower bound on the least peak of any schedule, at least `floor`, from the
    /// bounds alone (no search): the smallest budget at which they do not rule out the start
    /// state. The memory bound only grows as the budget shrinks, so a bisection finds it.
    [[nodiscard]] Bytes least_budget_bound(Bytes floor) const {
        const SearchState root{initial_mask_, 0};
        const auto possible = [&](Bytes budget) {
            return memory(root.live) <= budget &&
                   heuristic(root, budget, options_.memory_bound ? tight_units(budget) : 0) <
                       std::numeric_limits<double>::infinity();
        };
        Bytes low = floor, high = std::max(floor, unconstrained_budget());
        if (possible(low) || !possible(high)) return low;
        while (high - low > 1) {  // possible(high), not possible(low)
            const Bytes middle = low + (high - low) / 2;
            (possible(middle) ? high : low) = middle;
        }
        return high;
    }

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

    [[nodiscard]] Bytes memory(DataMask mask) const {
        Bytes total = 0;
        for (std::uint64_t w = mask.low; w != 0; w &= w - 1) total += bytes_[static_cast<std::size_t>(std::countr_zero(w))];
        for (std::uint64_t w = mask.high; w != 0; w &= w - 1)
            total += bytes_[64 + static_cast<std::size_t>(std::countr_zero(w))];
        return total;
    }
    // Per unit member: the data only this unit reads and only repeatable ops write (a layer's
    // saved state, an option's phantom), and the least time of a writer of each. A data whose
    // writer also writes a data private to another unit is left out: one run of that writer
    // may serve both units, and counting it twice would overestimate (an inadmissible bound
    // makes A* return a slower schedule).
    void prepare_heuristic() {
        std::vector<int> private_unit(p_.data_count(), -1);
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            const DataId id{d};
            if (p_.is_initial(id) || p_.writers(id).empty() || p_.readers(id).empty()) continue;
            bool repeatable = true;
            for (const OpId w : p_.writers(id)) repeatable = repeatable && unit_of_[w.index] < 0;
            const int unit = unit_of_[p_.readers(id).front().index];
            bool one_unit = unit >= 0;
            for (const OpId r : p_.readers(id)) one_unit = one_unit && unit_of_[r.index] == unit;
            if (repeatable && one_unit) private_unit[d] = unit;
        }
        const auto shared_writer = [&](DataId d) {
            for (const OpId w : p_.writers(d))
                for (const DataId e : p_.op(w).writes)
                    if (private_unit[e.index] >= 0 && private_unit[e.index] != private_unit[d.index]) return true;
            return false;
        };
        member_private_.resize(units_.size());
        for (std::size_t u = 0; u < units_.size(); ++u)
            for (const OpId k : units_[u]) {
                std::vector<std::pair<std::size_t, double>> own;
                for (const DataId d : p_.op(k).reads) {
                    if (private_unit[d.index] != static_cast<int>(u) || shared_writer(d)) continue;
                    double least = std::numeric_limits<double>::infinity();
                    for (const OpId w : p_.writers(d)) least = std::min(least, p_.op(w).time);
                    own.emplace_back(d.index, least);
                }
                member_private_[u].push_back(std::move(own));
            }
        prepare_recompute_bound();
    }

    // What recompute_bound needs, per data: the units that must read it (every member does)
    // or may write it, its repeatable writers, their least time, and what all of them read.
    void prepare_recompute_bound() {
        const std::size_t n = p_.data_count();
        least_unit_time_.assign(units_.size(), std::numeric_limits<double>::infinity());
        for (std::size_t u = 0; u < units_.size(); ++u)
            for (const OpId k : units_[u]) least_unit_time_[u] = std::min(least_unit_time_[u], p_.op(k).time);
        required_by_units_.assign(n, 0);
        written_by_units_.assign(n, 0);
        repeatable_writers_.assign(n, {});
        least_writer_time_.assign(n, std::numeric_limits<double>::infinity());
        writers_read_.assign(n, DataMask{});
        for (std::size_t u = 0; u < units_.size(); ++u) {
            DataMask all_read = ~DataMask{};
            for (const OpId k : units_[u]) all_read = all_read & op_reads_[k.index];
            for (std::size_t d = 0; d < n; ++d)
                if (all_read.test(d)) required_by_units_[d] |= std::uint64_t{1} << u;
        }
        for (std::size_t d = 0; d < n; ++d) {
            DataMask common = ~DataMask{};
            for (const OpId w : p_.writers(DataId{d})) {
                if (const int unit = unit_of_[w.index]; unit >= 0) {
                    written_by_units_[d] |= std::uint64_t{1} << unit;
                    continue;
                }
                repeatable_writers_[d].push_back(w.index);
                least_writer_time_[d] = std::min(least_writer_time_[d], p_.op(w).time);
                common = common & op_reads_[w.index];
            }
            if (repeatable_writers_[d].empty()) continue;
            writers_read_[d] = common;
            data_by_writer_time_.push_back(d);
        }
        std::stable_sort(data_by_writer_time_.begin(), data_by_writer_time_.end(),
                         [&](std::size_t a, std::size_t b) { return least_writer_time_[a] > least_writer_time_[b]; });
        prepare_memory_bound();
    }

    // A second admissible bound, on the repeatable ops still to run: a data that is not live,
    // that a unit still to run must read (or that is final), and that no such unit writes, must
    // be written again by a repeatable op, which needs what all those writers read, and so on.
    // Data whose repeatable writers are disjoint need as many distinct runs, so the least
    // writer times of a set of such data add up (a greedy packing, costliest first). Infinite
    // when a needed data has no writer left: the state leads nowhere.
    [[nodiscard]] std::optional<DataMask> needed_writes(const SearchState& s) const {
        const std::uint64_t remaining = all_done_ & ~s.done;
        DataMask needed;
        std::size_t stack[128];
        std::size_t depth = 0;
        const auto need = [&](std::size_t d) {
            if (s.live.test(d) || needed.test(d) || (written_by_units_[d] & remaining) != 0) return;
            needed |= DataMask::bit(d);
            stack[depth++] = d;
        };
        for (std::size_t d = 0; d < p_.data_count(); ++d)
            if ((required_by_units_[d] & remaining) != 0 || final_mask_.test(d)) need(d);
        while (depth > 0) {
            const std::size_t d = stack[--depth];
            if (repeatable_writers_[d].empty()) return std::nullopt;
            const DataMask inputs = writers_read_[d];
            for (std::size_t e = 0; e < p_.data_count(); ++e)
                if (inputs.test(e)) need(e);
        }
        return needed;
    }
    // The least time of repeatable runs that write every data of `needed`: data whose writers
    // are disjoint need distinct runs (a greedy packing, costliest first).
    [[nodiscard]] double recompute_bound(DataMask needed) const {
        if (needed.empty()) return 0.0;
        // The ops already charged, as a bitset over op indices (up to 1024 ops; beyond, only
        // the costliest data counts).
        constexpr std::size_t max_tracked = 1024;
        const bool tracked = p_.op_count() <= max_tracked;
        std::uint64_t used[max_tracked / 64] = {};
        double total = 0.0;
        for (const std::size_t d : data_by_writer_time_) {
            if (!needed.test(d)) continue;
            if (!tracked) return least_writer_time_[d];
            bool disjoint = true;
            for (const std::size_t w : repeatable_writers_[d]) disjoint = disjoint && (used[w / 64] >> (w % 64) & 1U) == 0;
            if (!disjoint) continue;
            for (const std::size_t w : repeatable_writers_[d]) used[w / 64] |= std::uint64_t{1} << (w % 64);
            total += least_writer_time_[d];
        }
        return total;
    }

    // What memory_bound needs. Per unit: what all its members read, what any of them writes,
    // and what must still be live after it: what the units that must run after it read (they
    // read a data that only it writes, transitively) and the final data. Per data: a share of
    // a rewrite's time (its cheapest repeatable writer's time over that writer's outputs, so
    // shares of data one run rewrites together add up to at most that run), and the data in
    // increasing order of share per byte.
    void prepare_memory_bound() {
        const std::size_t n = p_.data_count(), units = units_.size();
        DataMask all;
        for (std::size_t d = 0; d < n; ++d) all |= DataMask::bit(d);
        unit_reads_.assign(units, all);
        unit_writes_.assign(units, DataMask{});
        unit_writes_every_.assign(units, all);
        for (std::size_t u = 0; u < units; ++u)
            for (const OpId k : units_[u]) {
                unit_reads_[u] = unit_reads_[u] & op_reads_[k.index];
                unit_writes_[u] |= op_writes_[k.index];
                unit_writes_every_[u] = unit_writes_every_[u] & op_writes_[k.index];
            }
        std::vector<std::uint64_t> after(units, 0);
        for (std::size_t d = 0; d < n; ++d) {
            if (initial_mask_.test(d) || p_.writers(DataId{d}).empty()) continue;
            int only = unit_of_[p_.writers(DataId{d}).front().index];
            for (const OpId w : p_.writers(DataId{d})) only = unit_of_[w.index] == only ? only : -1;
            if (only >= 0) after[static_cast<std::size_t>(only)] |= required_by_units_[d] & ~(std::uint64_t{1} << only);
        }
        for (bool grew = true; grew;) {
            grew = false;
            for (std::size_t u = 0; u < units; ++u)
                for (std::uint64_t v = after[u]; v != 0; v &= v - 1) {
                    const std::uint64_t wider = after[u] | after[static_cast<std::size_t>(std::countr_zero(v))];
                    grew = grew || wider != after[u];
                    after[u] = wider;
                }
        }
        before_.assign(units, 0);
        for (std::size_t u = 0; u < units; ++u)
            for (std::uint64_t v = after[u]; v != 0; v &= v - 1) before_[static_cast<std::size_t>(std::countr_zero(v))] |= std::uint64_t{1} << u;
        needed_after_.assign(units, final_mask_);
        for (std::size_t u = 0; u < units; ++u)
            for (std::uint64_t v = after[u]; v != 0; v &= v - 1)
                needed_after_[u] |= unit_reads_[static_cast<std::size_t>(std::countr_zero(v))];
        rewrite_share_.assign(n, std::numeric_limits<double>::infinity());
        data_by_share_per_byte_.clear();
        for (std::size_t d = 0; d < n; ++d) {
            for (const std::size_t w : repeatable_writers_[d]) {
                const auto outputs = static_cast<double>(p_.op(OpId{w}).writes.size());
                rewrite_share_[d] = std::min(rewrite_share_[d], p_.op(OpId{w}).time / outputs);
            }
            if (bytes_[d] > 0 && rewrite_share_[d] < std::numeric_limits<double>::infinity())
                data_by_share_per_byte_.push_back(d);
        }
        std::stable_sort(data_by_share_per_byte_.begin(), data_by_share_per_byte_.end(), [&](std::size_t a, std::size_t b) {
            return rewrite_share_[a] * static_cast<double>(bytes_[b]) < rewrite_share_[b] * static_cast<double>(bytes_[a]);
        });
    }

    // The units for which the budget may force a drop: a member's footprint and overhead with
    // everything needed after it exceeds the budget (else the bound is 0 for the unit).
    [[nodiscard]] std::uint64_t tight_units(Bytes budget) const {
        std::uint64_t tight = 0;
        for (std::size_t u = 0; u < units_.size(); ++u) {
            bool every_member = true;
            for (const OpId k : units_[u])
                every_member = every_member && memory(initial_mask_ | op_reads_[k.index] | op_writes_[k.index] |
                                                      needed_after_[u]) + p_.op(k).overhead > budget;
            if (every_member) tight |= std::uint64_t{1} << u;
        }
        return tight;
    }
    // A third admissible bound, on the repeatable runs the budget forces: when a unit still to
    // run runs, the initial data, its member's reads and writes and overhead, and every data
    // that exists before it (live now, written by a unit that must run before it, or needed to
    // produce what it or such a unit reads) and that a unit which must run after it reads (and
    // no unit that may run later writes) must fit the budget, or some of those data must be
    // dropped and written again after it by a repeatable op. The cheapest drop is a fractional
    // knapsack over rewrite shares. The largest over the units counts (one rewrite may serve
    // several); infinite when no drop suffices.
    [[nodiscard]] double memory_bound(const SearchState& s, Bytes budget, std::uint64_t tight) const {
        const std::uint64_t remaining = all_done_ & ~s.done;
        double forced = 0.0;
        for (std::uint64_t r = remaining & tight; r != 0; r &= r - 1) {
            const auto u = static_cast<std::size_t>(std::countr_zero(r));
            // What exists when u runs, unless dropped: what is live now, and what units still
            // to run that must run before u write; less what a unit that may run later (or u)
            // writes again, which needs no repeatable run.
            DataMask exists = s.live, rewritten, read_before = unit_reads_[u];
            for (std::uint64_t v = remaining; v != 0; v &= v - 1) {
                const auto w = static_cast<std::size_t>(std::countr_zero(v));
                if (before_[u] >> w & 1U) {
                    exists |= unit_writes_every_[w];
                    read_before |= unit_reads_[w];
                } else {
                    rewritten |= unit_writes_[w];
                }
            }
            exists |= written_before(s, remaining, read_before);
            const DataMask still_needed = exists & needed_after_[u] & ~rewritten & ~initial_mask_;
            double least = std::numeric_limits<double>::infinity();
            for (const OpId k : units_[u]) {
                const DataMask footprint = initial_mask_ | op_reads_[k.index] | op_writes_[k.index];
                const DataMask kept = still_needed & ~footprint;
                const Bytes during = memory(footprint | kept) + p_.op(k).overhead;
                if (during <= budget) {
                    least = 0.0;
                    break;
                }
                least = std::min(least, cheapest_drop(kept, during - budget));
            }
            forced = std::max(forced, least);
            if (forced == std::numeric_limits<double>::infinity()) break;
        }
        return forced;
    }
    // The data that must be written before something reads `read` (what is not live of it,
    // and what every repeatable writer of such a data reads, and so on): each exists at some
    // point before. A data a unit still to run writes is not followed further (that unit's
    // own reads are the caller's to add).
    [[nodiscard]] DataMask written_before(const SearchState& s, std::uint64_t remaining, DataMask read) const {
        DataMask reached = read & ~s.live, frontier = reached;
        while (!frontier.empty()) {
            DataMask next;
            for (int half = 0; half < 2; ++half)
                for (std::uint64_t w = half == 0 ? frontier.low : frontier.high; w != 0; w &= w - 1) {
                    const auto d = static_cast<std::size_t>(std::countr_zero(w)) + (half == 0 ? 0 : 64);
                    if ((written_by_units_[d] & remaining) == 0) next |= writers_read_[d];
                }
            frontier = next & ~reached & ~s.live;
            reached |= frontier;
        }
        return reached;
    }
    [[nodiscard]] double share_of(DataMask data) const {
        double total = 0.0;
        for (std::size_t d = 0; d < p_.data_count(); ++d)
            if (data.test(d)) total += rewrite_share_[d];
        return total;
    }
    // The least total rewrite share of data among `candidates` whose bytes reach `excess`,
    // taking fractions (an LP relaxation, so a lower bound); infinite when they cannot.
    [[nodiscard]] double cheapest_drop(DataMask candidates, Bytes excess) const {
        double cost = 0.0;
        for (const std::size_t d : data_by_share_per_byte_) {
            if (!candidates.test(d)) continue;
            if (bytes_[d] >= excess)
                return cost + rewrite_share_[d] * static_cast<double>(excess) / static_cast<double>(bytes_[d]);
            cost += rewrite_share_[d];
            excess -= bytes_[d];
        }
        return std::numeric_limits<double>::infinity();
    }

    // Admissible: every unit still to run needs one of its members, and that member's
    // private reads that are not live need a writer each (the costliest of them counted).
    [[nodiscard]] double heuristic(const SearchState& s, Bytes budget, std::uint64_t tight) const {
        double remaining = 0.0;
        for (std::size_t u = 0; u < units_.size(); ++u) {
            if (s.done >> u & 1U) continue;
            double least = std::numeric_limits<double>::infinity();
            for (std::size_t m = 0; m < units_[u].size(); ++m) {
                double produce = 0.0;
                for (const auto& [d, t] : member_private_[u][m])
                    if (!s.live.test(d)) produce = std::max(produce, t);
                least = std::min(least, p_.op(units_[u][m]).time + produce);
            }
            remaining += least;
        }
        if (!options_.recompute_bound && !options_.memory_bound) return remaining;
        const std::optional<DataMask> needed = needed_writes(s);
        if (!needed) return std::numeric_limits<double>::infinity();
        const double recompute = options_.recompute_bound ? recompute_bound(*needed) : 0.0;
        double exactly_once = 0.0;
        for (std::size_t u = 0; u < units_.size(); ++u)
            if (!(s.done >> u & 1U)) exactly_once += least_unit_time_[u];
        if (!options_.memory_bound) return std::max(remaining, exactly_once + recompute);
        const double forced = memory_bound(s, budget, tight);
        if (forced == std::numeric_limits<double>::infinity()) return forced;
        // The packing's runs may be the very runs that rewrite what the budget drops, so the
        // two do not add up; counted in rewrite shares, one write of each needed data and one
        // more of each dropped data (after the unit, the other before it or never) do.
        return std::max(remaining, exactly_once + std::max(recompute, share_of(*needed) + forced));
    }
    // Admissible for the rest of a window: its units still to run, and whatever every
    // completion of the whole schedule needs beyond the fixed rest (the heuristic is a bound
    // on any completion, this window's with the rest among them). Units the window does not
    // run may not run in it.
    [[nodiscard]] double window_bound(const SearchState& s, Bytes budget, std::uint64_t tight, const SearchWindow& w) const {
        if ((s.done & ~w.done) != 0) return std::numeric_limits<double>::infinity();
        const std::uint64_t to_run = w.done & ~s.done;
        double units = 0.0;
        for (std::size_t u = 0; u < units_.size(); ++u)
            if (to_run >> u & 1U) units += least_unit_time_[u];
        // What must be live at the end and is not, and no unit of the window writes, needs a
        // repeatable run (or has no writer left).
        DataMask missing;
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (!w.live.test(d) || s.live.test(d) || (written_by_units_[d] & to_run) != 0) continue;
            if (repeatable_writers_[d].empty()) return std::numeric_limits<double>::infinity();
            missing |= DataMask::bit(d);
        }
        return std::max({units + recompute_bound(missing), heuristic(s, budget, tight) - w.time_after});
    }
    [[nodiscard]] bool is_goal(const SearchState& s) const {
        return s.done == all_done_ && (s.live & final_mask_) == final_mask_;
    }
    // Live data nobody can use any more: not initial, not final, and every reader is an
    // exactly-once op whose unit already ran. Freeing them at once never hurts.
    [[nodiscard]] DataMask dead_data(const SearchState& s) const {
        DataMask dead;
        const DataMask candidates = s.live & ~(initial_mask_ | final_mask_);
        for (std::size_t d = 0; d < p_.data_count(); ++d) {
            if (!candidates.test(d) || read_by_repeatable_[d]) continue;
            if ((reader_units_[d] & ~s.done) == 0) dead |= DataMask::bit(d);
        }
        return dead;
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

    const Problem& p_;
    ExhaustiveOptions options_;
    std::vector<int> unit_of_;                 // op → exactly-once unit, or -1
    std::vector<std::vector<OpId>> units_;     // unit → its ops (one, or a choice group)
    std::vector<std::vector<std::vector<std::pair<std::size_t, double>>>> member_private_;  // unit → member → (data, writer time)
    std::vector<Bytes> bytes_;                 // data → size
    std::vector<std::uint64_t> reader_units_;  // data → units of its exactly-once readers
    std::vector<char> read_by_repeatable_;     // data → read by an op that may run again
    std::vector<DataMask> op_reads_, op_writes_;
    // recompute_bound's tables (prepare_recompute_bound)
    std::vector<double> least_unit_time_;            // unit → least time of a member
    std::vector<std::uint64_t> required_by_units_;   // data → units every member of which reads it
    std::vector<std::uint64_t> written_by_units_;    // data → units a member of which writes it
    std::vector<std::vector<std::size_t>> repeatable_writers_;  // data → its repeatable writers
    std::vector<double> least_writer_time_;          // data → least time of a repeatable writer
    std::vector<DataMask> writers_read_;             // data → what every repeatable writer reads
    std::vector<std::size_t> data_by_writer_time_;   // data with a repeatable writer, costliest first
    // memory_bound's tables (prepare_memory_bound)
    std::vector<DataMask> unit_reads_, unit_writes_;  // unit → what every member reads, any member writes
    std::vector<DataMask> unit_writes_every_;         // unit → what every member writes
    std::vector<std::uint64_t> before_;               // unit → units that must run before it
    std::vector<DataMask> needed_after_;              // unit → what must be live after it
    std::vector<double> rewrite_share_;               // data → share of its cheapest rewrite
    std::vector<std::size_t> data_by_share_per_byte_; // rewritable data of some bytes, cheapest per byte first
    DataMask initial_mask_;
    DataMask final_mask_;
    std::uint64_t all_done_ = 0;
};

}  // namespace detail::exhaustive

/// Exact optimum over all schedules, for small problems (≤ 128 data, ≤ 64 exactly-once ops).
class Exhaustive {
public:
    explicit Exhaustive(ExhaustiveOptions options = {}) : options_(options) {
        if (!(options_.weight >= 1.0))
            throw InvalidInput("exhaustive: the weight of the bound must be at least 1 (1 is exact)");
        if (!(options_.time_limit_seconds > 0))  // NaN too
            throw InvalidInput("exhaustive: the time limit must be a positive number of seconds (infinity for none)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "exhaustive"; }
    [[nodiscard]] const ExhaustiveOptions& options() const noexcept { return options_; }

    /// A copy whose time limit is at most `seconds` (models TimeBoundedSolver).
    [[nodiscard]] Exhaustive with_time_limit_at_most(double seconds) const {
        ExhaustiveOptions o = options_;
        o.time_limit_seconds = tightened_time_limit(o.time_limit_seconds, seconds);
        return Exhaustive(o);
    }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::exhaustive::ExhaustiveSearch search(problem, options_);
        auto result = search.run(detail::exhaustive::SearchGoal::least_time, budget);
        if (!result.found) {
            // The smallest budget, in the time that is left (the limit covers every search).
            const std::string none = "no schedule of '" + problem.name() + "' fits " + std::to_string(budget) + " bytes";
            const LeastPeak smallest = least_peak(problem, budget + 1, start);
            if (!smallest.peak)
                throw Infeasible(none + "; the smallest feasible budget is at least " + std::to_string(smallest.at_least) +
                                     " bytes (a proven bound)" +
                                     (smallest.feasible ? " and at most " + std::to_string(*smallest.feasible) +
                                                              " bytes (a schedule fits it)"
                                                        : std::string()) +
                                     ", and the search's limits ran out before the exact one was found",
                                 budget, smallest.feasible);
            throw Infeasible(none + "; the smallest feasible budget is " + std::to_string(*smallest.peak) + " bytes",
                             budget, smallest.peak);
        }
        SolverStats stats{std::string(name()), 0.0, options_.weight == 1.0 ? SolveStatus::optimal : SolveStatus::feasible,
                          std::nullopt, options_.weight == 1.0 ? "" : "weight=" + std::to_string(options_.weight)};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(result.schedule), budget, std::move(stats));
    }

    /// What the exact search proves about a plan at `budget` whose time is `incumbent_time`:
    /// a faster schedule (then optimal), or that none exists (the incumbent is optimal), or at
    /// the time or state limit a proven lower bound on every schedule's time. The search only
    /// explores what could beat the incumbent.
    struct Certificate {
        std::optional<Plan> faster;
        double lower_bound = 0.0;  ///< every schedule within the budget takes at least this
        bool complete = false;     ///< the search finished: the optimum is known
    };
    [[nodiscard]] Certificate certify(const Problem& problem, Bytes budget, double incumbent_time) const {
        if (options_.weight != 1.0) throw InvalidInput("exhaustive: certify() needs the exact search (weight 1)");
        const auto start = std::chrono::steady_clock::now();
        const detail::exhaustive::ExhaustiveSearch search(problem, options_);
        auto result = search.run(detail::exhaustive::SearchGoal::least_time, budget, incumbent_time);
        Certificate c;
        if (result.found) {
            SolverStats stats{std::string(name()), seconds_since(start), SolveStatus::optimal, std::nullopt,
                              "certified against an incumbent"};
            c.lower_bound = result.time;
            c.faster = make_checked_plan(problem, std::move(result.schedule), budget, std::move(stats));
            c.complete = true;
            return c;
        }
        c.lower_bound = result.lower_bound;
        c.complete = !result.stopped;
        return c;
    }

    /// A proven lower bound on the least peak of any valid schedule, from the search's bounds
    /// alone, without searching (microseconds to milliseconds): the smallest budget at which
    /// the memory and recompute bounds do not rule out the start. Often the least peak itself;
    /// core/bounds.hpp's memory_lower_bound may still be higher (it also counts what writers
    /// of needed data need), so a caller takes the larger.
    [[nodiscard]] Bytes least_budget_bound(const Problem& problem) const {
        ExhaustiveOptions o = options_;
        o.memory_bound = true;
        o.recompute_bound = true;
        return detail::exhaustive::ExhaustiveSearch(problem, o).least_budget_bound(0);
    }

    /// The least peak of any valid schedule: the smallest budget any solver can meet.
    [[deprecated("use smallest_budget()")]] [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        return smallest_budget(problem);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        const LeastPeak least = least_peak(problem, 0, std::chrono::steady_clock::now());
        if (least.none_at_all) throw InvalidInput("problem '" + problem.name() + "' has no valid schedule at all");
        if (!least.peak)
            throw SolverError("exhaustive search on '" + problem.name() + "': the limits ran out before the least peak "
                              "was found; it is at least " + std::to_string(least.at_least) +
                              " bytes (raise ExhaustiveOptions' limits, or use checkmate)");
        return *least.peak;
    }

private:
    struct LeastPeak {
        std::optional<Bytes> peak;      // the least peak of any schedule, when the searches finished
        Bytes at_least = 0;             // proven: every schedule's peak is at least this
        std::optional<Bytes> feasible;  // the least peak of a schedule found
        bool none_at_all = false;       // proven: no valid schedule exists
    };
    // The least peak of any schedule, known to be at least `floor`, in two phases. First a
    // schedule under a ceiling: ceilings grow from the bounds' own least budget, an eighth more
    // each time, and at each a brief search for any schedule within it (weighted A*: the
    // bound steers it to a goal; the bounds at the ceiling prune it); a search that ends with
    // none proves the least peak above the ceiling, one that runs out of states proves
    // nothing. Then, with a schedule of peak p, one exact least-peak search below p, pruned by
    // the bounds at p, settles the rest. One time limit, counted from `start`, covers all.
    [[nodiscard]] LeastPeak least_peak(const Problem& problem, Bytes floor, std::chrono::steady_clock::time_point start) const {
        using detail::exhaustive::ExhaustiveSearch;
        using detail::exhaustive::SearchGoal;
        const ExhaustiveSearch bounds(problem, options_);
        const Bytes unconstrained = bounds.unconstrained_budget();
        const auto rest = [&](double weight, std::size_t max_states) {
            ExhaustiveOptions o = options_;
            o.weight = weight;
            o.max_states = std::min(o.max_states, max_states);
            o.time_limit_seconds = tightened_time_limit(options_.time_limit_seconds,
                                                        options_.time_limit_seconds - seconds_since(start));
            return o;
        };
        constexpr std::size_t brief = 100'000;  // states of one probe below the unconstrained budget
        LeastPeak out;
        out.at_least = bounds.least_budget_bound(floor);
        try {
            for (Bytes ceiling = out.at_least; !out.feasible;) {
                const bool last = ceiling >= unconstrained;
                try {
                    const auto any = ExhaustiveSearch(problem, rest(8.0, last ? options_.max_states : brief))
                                         .run(SearchGoal::least_time, last ? std::numeric_limits<Bytes>::max() : ceiling);
                    if (any.found) {
                        out.feasible = any.peak;
                    } else if (last) {
                        out.none_at_all = true;
                        return out;
                    } else {
                        out.at_least = ceiling + 1;
                    }
                } catch (const TooLarge&) {  // the probe's state cap: nothing proven at this ceiling
                    if (last) throw;
                }
                ceiling = std::min(unconstrained, ceiling + std::max<Bytes>(1, ceiling / 8));
            }
            if (*out.feasible > out.at_least) {
                const auto least = ExhaustiveSearch(problem, rest(1.0, options_.max_states))
                                       .run(SearchGoal::least_peak, *out.feasible - 1);
                if (least.found) out.feasible = least.peak;
            }
            out.peak = out.at_least = *out.feasible;
        } catch (const SolverError&) {  // a limit: what is proven stands
        }
        return out;
    }

    ExhaustiveOptions options_;
};

/// The least peak of any valid schedule of a small problem (see Exhaustive).
[[nodiscard]] inline Bytes exact_smallest_budget(const Problem& problem, ExhaustiveOptions options = {}) {
    return Exhaustive(options).smallest_budget(problem);
}
[[deprecated("use exact_smallest_budget()")]] [[nodiscard]] inline Bytes smallest_feasible_budget(
    const Problem& problem, ExhaustiveOptions options = {}) {
    return exact_smallest_budget(problem, options);
}

}  // namespace remat
