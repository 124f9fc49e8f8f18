// remat/solvers/exhaustive/bounds.hpp — the admissible bounds of the exact search
// (solvers/exhaustive.hpp) on the time a state still needs, and the problem as bit masks
// they read.
//
// The bound is the largest of three (Hart, Nilsson and Raphael 1968: an admissible bound keeps
// A* exact): the time of the exactly-once units still to run, with their private reads; that
// time plus the recomputations the state forces (recompute_bound): data that units still to
// run must read, that are not live and that only repeatable ops can write again, closed over
// what those writers read; and that time plus the recomputations the budget forces
// (memory_bound): what exists before a unit and is needed after it, but cannot all be in
// memory while it runs. A state where such a data has no writer left, or where no drop fits
// a unit in the budget, is infinitely far from a goal. The same bounds at a budget give a
// proven least peak without searching (least_budget_bound).
//
// Units: every exactly-once op is a unit of its own, except the members of a choice group
// (H-Rockmate's alternative sub-schedules of a cluster, solvers/hierarchical.hpp), which
// together are one unit of which exactly one member runs.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "options.hpp"
#include "state.hpp"

namespace remat::detail::exhaustive {

class SearchBounds {
public:
    /// `choice_groups`: sets of exactly-once ops of which exactly one must run (see above);
    /// every other exactly-once op is a unit of its own.
    SearchBounds(const Problem& problem, ExhaustiveOptions options, const std::vector<std::vector<OpId>>& choice_groups = {})
        : p_(problem), options_(options) {
        if (p_.data_count() > max_data)
            throw InvalidInput("exhaustive search handles at most " + std::to_string(max_data) + " data; problem '" +
                               p_.name() + "' has " +
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
        if (units_.size() > max_units)
            throw InvalidInput("exhaustive search handles at most " + std::to_string(max_units) +
                               " exactly-once ops; problem '" + p_.name() + "' has " +
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

protected:
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

}  // namespace remat::detail::exhaustive
