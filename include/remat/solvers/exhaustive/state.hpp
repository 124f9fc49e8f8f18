// remat/solvers/exhaustive/state.hpp — the states of the exact search (solvers/exhaustive.hpp)
// and the table that holds them: a set of up to 128 live data as two machine words
// (DataMask), a state as those and the exactly-once units done (SearchState), the cheapest
// path known to a state (SearchNode), the flat hash table of reached states (StateTable),
// and the part of a schedule that window search (solvers/window_search.hpp) searches again
// (SearchWindow).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"

namespace remat::detail::exhaustive {

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

// A part of a schedule to search again (solvers/window_search.hpp): from the state a schedule
// reaches before the part, to one where the same exactly-once units ran and at least what the
// schedule keeps after it is live. The rest of the schedule, `time_after` seconds, is fixed.
struct SearchWindow {
    SearchState from;
    std::uint64_t done = 0;  // the units done at the end of the part
    DataMask live;           // what must be live at its end (the rest is then freed)
    double time_after = 0.0;
};

}  // namespace remat::detail::exhaustive
