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

/// What a state's masks hold: data (DataMask, two words) and exactly-once units (one word).
inline constexpr std::size_t max_data = 128;
inline constexpr std::size_t max_units = 64;

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

// The states the search reached, by state. The states and their nodes lie in one array in
// the order they were reached; an open-addressing index (linear probing, a power of two of
// 8-byte entries, at most half full) maps a hash to a position. Each index entry keeps 24
// bits of the hash, so a probe passes over other states without reading them: a lookup
// costs about one cache miss in the index and one in the array. Against a node-based hash
// map this halves the time of the exact search, and dropping a table of millions of states
// is two deallocations, not one per state: a search stopped at its time limit returns at
// once (freeing a million hash nodes took up to a third of a second).
// A pointer or reference into the table is valid until the next insertion.
class StateTable {
public:
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    /// The node of `state`, whose state_hash is `hash`, or null.
    [[nodiscard]] SearchNode* find(const SearchState& state, std::uint64_t hash) noexcept {
        return const_cast<SearchNode*>(std::as_const(*this).find(state, hash));
    }
    [[nodiscard]] const SearchNode* find(const SearchState& state, std::uint64_t hash) const noexcept {
        if (index_.empty()) return nullptr;
        for (std::size_t i = hash & mask();; i = (i + 1) & mask()) {
            const std::uint64_t slot = index_[i];
            if (slot == 0) return nullptr;
            if ((slot >> position_bits) == tag_of(hash)) {
                const Entry& e = entries_[(slot & position_mask) - 1];
                if (e.state == state) return &e.node;
            }
        }
    }
    [[nodiscard]] SearchNode* find(const SearchState& state) noexcept { return find(state, state_hash(state)); }
    [[nodiscard]] const SearchNode* find(const SearchState& state) const noexcept { return find(state, state_hash(state)); }
    /// The node of a state the table holds (precondition: it does).
    [[nodiscard]] const SearchNode& at(const SearchState& state) const noexcept { return *find(state); }
    /// Adds `state`, whose state_hash is `hash` and which the table must not hold yet.
    void insert(const SearchState& state, std::uint64_t hash, const SearchNode& node) {
        if (2 * (size() + 1) > index_.size()) grow_index();
        entries_.push_back(Entry{state, node});
        place(hash, entries_.size());
    }
    void insert(const SearchState& state, const SearchNode& node) { insert(state, state_hash(state), node); }

    /// Hints that find() will soon look for a state of this hash: its index slot...
    void prefetch_index(std::uint64_t hash) const noexcept {
        if (!index_.empty()) prefetch(&index_[hash & mask()]);
    }
    /// ...and then the state the slot names, when its tag matches (after prefetch_index).
    void prefetch_state(std::uint64_t hash) const noexcept {
        if (index_.empty()) return;
        const std::uint64_t slot = index_[hash & mask()];
        if (slot != 0 && (slot >> position_bits) == tag_of(hash)) prefetch(&entries_[(slot & position_mask) - 1]);
    }
    /// The bytes the table holds after one more insertion (its array or index may double).
    [[nodiscard]] std::size_t bytes_after_insert() const noexcept {
        const std::size_t entries = size() + 1 > entries_.capacity() ? std::max<std::size_t>(2 * size(), 1) : entries_.capacity();
        const std::size_t slots = 2 * (size() + 1) > index_.size() ? std::max<std::size_t>(2 * index_.size(), 64) : index_.size();
        return entries * sizeof(Entry) + slots * sizeof(std::uint64_t);
    }

private:
    struct Entry {
        SearchState state;
        SearchNode node;
    };
    // An index slot: 0 when empty, else the tag in the top bits and the position + 1 below.
    static constexpr unsigned position_bits = 40;
    static constexpr std::uint64_t position_mask = (std::uint64_t{1} << position_bits) - 1;
    [[nodiscard]] static constexpr std::uint64_t tag_of(std::uint64_t hash) noexcept { return hash >> position_bits; }
    [[nodiscard]] std::size_t mask() const noexcept { return index_.size() - 1; }
    static void prefetch([[maybe_unused]] const void* address) noexcept {
#if defined(__GNUC__) || defined(__clang__)
        __builtin_prefetch(address);
#endif
    }
    // `position` counts from 1.
    void place(std::uint64_t hash, std::size_t position) noexcept {
        std::size_t i = hash & mask();
        while (index_[i] != 0) i = (i + 1) & mask();
        index_[i] = tag_of(hash) << position_bits | position;
    }
    void grow_index() {
        index_.assign(std::max<std::size_t>(2 * index_.size(), 64), 0);
        for (std::size_t k = 0; k < entries_.size(); ++k) place(state_hash(entries_[k].state), k + 1);
    }

    std::vector<Entry> entries_;
    std::vector<std::uint64_t> index_;
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
