// remat/solvers/improve.hpp — local improvement of a schedule that fits a budget.
//
// Any planner's schedule (the greedy's, H-Rockmate's flattened one) can carry steps that the
// simulator of docs/formats.md §3 (simulation semantics) does not need, and frees that come later than they could:
//   - tidy_schedule(): drops runs that write nothing new or nothing read before it is freed
//     again (a liveness analysis backwards from the final data and the exactly-once ops, as
//     a compiler removes dead code), drops the frees that then free nothing, and moves every
//     free to right after the last step that touches the data (as store-all frees, §4). It
//     never raises the peak and never adds time.
//   - improve_schedule(): hill climbing on "keep instead of recompute" (the move Checkmate's
//     integer program weighs for every data, Jain et al., MLSys 2020): for a run that
//     recomputes what an earlier free threw away, the free is dropped and the run removed;
//     the schedule is tidied (the recomputation of that run's inputs may become dead too) and
//     simulated, and the move is kept when it still fits the budget and is faster. The
//     largest savings are tried first; a pass over the candidates repeats while one is kept,
//     within a time limit.
// Every result is a valid schedule under the simulator with a peak within the budget, and
// never slower than the input. Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/timing.hpp"

namespace remat {

struct ImproveOptions {
    /// Wall-clock limit of the hill climbing.
    double time_limit_seconds = 1.0;
    /// Candidate moves tried per pass at most (the largest savings first).
    std::size_t max_candidates = 4096;
    /// Where keeping a data does not fit, also try freeing another one across the overflow and
    /// recomputing it (detail::improve::Exchange).
    bool exchanges = true;
};

namespace detail::improve {

inline constexpr std::size_t nowhere = std::numeric_limits<std::size_t>::max();

// Steps to keep after dropping the runs that change nothing (every write live already) and
// the frees of data that are not live; `newly[i]` flags the writes step i makes live.
struct ForwardPass {
    std::vector<char> keep;
    std::vector<std::vector<char>> newly;
    bool changed = false;
};

[[nodiscard]] inline ForwardPass forward_pass(const Problem& p, const Schedule& s) {
    ForwardPass f{std::vector<char>(s.size(), 1), std::vector<std::vector<char>>(s.size()), false};
    std::vector<char> live(p.data_count(), 0);
    for (const DataId d : p.initial()) live[d.index] = 1;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i].is_free()) {
            const std::size_t d = s[i].data().index;
            if (!live[d]) f.keep[i] = 0;
            live[d] = 0;
            f.changed = f.changed || !f.keep[i];
            continue;
        }
        const Op& op = p.op(s[i].op());
        const bool writes_new = std::any_of(op.writes.begin(), op.writes.end(), [&](DataId w) { return !live[w.index]; });
        if (!writes_new && !op.exactly_once) {
            f.keep[i] = 0;
            f.changed = true;
            continue;
        }
        f.newly[i].resize(op.writes.size());
        for (std::size_t x = 0; x < op.writes.size(); ++x) {
            f.newly[i][x] = live[op.writes[x].index] ? 0 : 1;
            live[op.writes[x].index] = 1;
        }
    }
    return f;
}

// Backwards liveness: a run that is not exactly once and makes live nothing that is read
// (or final at the end) before it is freed is dead. Marks dead runs in `f.keep`.
inline void drop_dead_runs(const Problem& p, const Schedule& s, ForwardPass& f) {
    std::vector<char> needed(p.data_count(), 0);
    for (const DataId d : p.final_data()) needed[d.index] = 1;
    for (std::size_t i = s.size(); i-- > 0;) {
        if (!f.keep[i]) continue;
        if (s[i].is_free()) {
            needed[s[i].data().index] = 0;
            continue;
        }
        const Op& op = p.op(s[i].op());
        bool useful = op.exactly_once;
        for (std::size_t x = 0; x < op.writes.size(); ++x) useful = useful || (f.newly[i][x] && needed[op.writes[x].index]);
        if (!useful) {
            f.keep[i] = 0;
            f.changed = true;
            continue;
        }
        for (std::size_t x = 0; x < op.writes.size(); ++x)
            if (f.newly[i][x]) needed[op.writes[x].index] = 0;
        for (const DataId r : op.reads) needed[r.index] = 1;
    }
}

// Every free moved to right after the last run that reads or writes the data while it is
// live; data left live at the end that are neither initial nor final are freed the same way.
[[nodiscard]] inline Schedule free_early(const Problem& p, const Schedule& s) {
    std::vector<std::size_t> last(p.data_count(), nowhere);  // last run touching the data's live value
    std::vector<char> live(p.data_count(), 0);
    std::vector<std::vector<DataId>> after(s.size());
    std::vector<char> moved(s.size(), 0);
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i].is_free()) {
            const std::size_t d = s[i].data().index;
            if (last[d] != nowhere) {
                after[last[d]].push_back(s[i].data());
                moved[i] = 1;
            }
            live[d] = 0;
            last[d] = nowhere;
            continue;
        }
        const Op& op = p.op(s[i].op());
        for (const DataId r : op.reads) last[r.index] = i;
        for (const DataId w : op.writes) {
            live[w.index] = 1;
            last[w.index] = i;
        }
    }
    for (std::size_t d = 0; d < p.data_count(); ++d)
        if (live[d] && last[d] != nowhere && !p.is_initial(DataId{d}) && !p.is_final(DataId{d}))
            after[last[d]].push_back(DataId{d});
    Schedule out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (!moved[i]) out.push_back(s[i]);
        if (s[i].is_run())
            for (const DataId d : after[i]) out.push_back(Step::free(d));
    }
    return out;
}

// A "keep instead of recompute" move: the run at `run` and the frees that threw away what it
// writes (at `frees`), `bytes` kept live longer, `saving` the run's time.
struct Move {
    std::size_t run = 0;
    std::vector<std::size_t> frees;
    Bytes bytes = 0;
    double saving = 0.0;
};

// The runs that only recompute data freed earlier (each write either live, or freed before).
[[nodiscard]] inline std::vector<Move> recompute_moves(const Problem& p, const Schedule& s) {
    std::vector<char> live(p.data_count(), 0);
    for (const DataId d : p.initial()) live[d.index] = 1;
    std::vector<std::size_t> freed_at(p.data_count(), nowhere);
    std::vector<Move> moves;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i].is_free()) {
            live[s[i].data().index] = 0;
            freed_at[s[i].data().index] = i;
            continue;
        }
        const Op& op = p.op(s[i].op());
        if (!op.exactly_once) {
            Move m{i, {}, 0, op.time};
            bool recompute = true;
            for (const DataId w : op.writes) {
                if (live[w.index]) continue;
                recompute = recompute && freed_at[w.index] != nowhere;
                if (!recompute) break;
                m.frees.push_back(freed_at[w.index]);
                m.bytes += p.data(w).bytes;
            }
            if (recompute && !m.frees.empty()) moves.push_back(std::move(m));
        }
        for (const DataId w : op.writes) live[w.index] = 1;
    }
    std::stable_sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.saving > b.saving; });
    return moves;
}

// Whether the move can fit at all: the memory between the earliest free and the run, plus
// what it keeps, within the budget (tidying afterwards only lowers it).
[[nodiscard]] inline bool may_fit(const Move& m, const SimulationReport& current, Bytes budget) {
    const std::size_t from = *std::min_element(m.frees.begin(), m.frees.end());
    Bytes most = 0;
    for (std::size_t i = from; i < m.run && i < current.timeline.size(); ++i) most = std::max(most, current.timeline[i].during);
    return most + m.bytes <= budget;
}

[[nodiscard]] inline Schedule without(const Schedule& s, const Move& m) {
    Schedule out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i)
        if (i != m.run && std::find(m.frees.begin(), m.frees.end(), i) == m.frees.end()) out.push_back(s[i]);
    return out;
}

// Where each data is live and read in a schedule: per data, its live intervals [from, to)
// (from: the run that makes it live, to: the step that frees it, or the end) and the sorted
// positions of the runs that read it.
struct Liveness {
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> intervals;
    std::vector<std::vector<std::size_t>> reads;

    [[nodiscard]] bool live_at(DataId d, std::size_t at) const { return interval_at(d, at).has_value(); }
    // The interval holding `at`, when the data is live there.
    [[nodiscard]] std::optional<std::pair<std::size_t, std::size_t>> interval_at(DataId d, std::size_t at) const {
        const auto& v = intervals[d.index];
        const auto it = std::upper_bound(v.begin(), v.end(), at, [](std::size_t x, const auto& iv) { return x < iv.first; });
        if (it == v.begin() || at >= std::prev(it)->second) return std::nullopt;
        return *std::prev(it);
    }
};

[[nodiscard]] inline Liveness liveness(const Problem& p, const Schedule& s) {
    Liveness l{std::vector<std::vector<std::pair<std::size_t, std::size_t>>>(p.data_count()),
               std::vector<std::vector<std::size_t>>(p.data_count())};
    std::vector<std::size_t> since(p.data_count(), nowhere);
    for (const DataId d : p.initial()) since[d.index] = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i].is_free()) {
            const std::size_t d = s[i].data().index;
            if (since[d] != nowhere) l.intervals[d].emplace_back(since[d], i);
            since[d] = nowhere;
            continue;
        }
        const Op& op = p.op(s[i].op());
        for (const DataId r : op.reads) l.reads[r.index].push_back(i);
        for (const DataId w : op.writes)
            if (since[w.index] == nowhere) since[w.index] = i;
    }
    for (std::size_t d = 0; d < p.data_count(); ++d)
        if (since[d] != nowhere) l.intervals[d].emplace_back(since[d], s.size());
    return l;
}

// A "keep this, recompute that" move: where a keep-instead-of-recompute move `keep` does not
// fit, another data is freed across the steps where it would overflow and recomputed by its
// cheapest writer right before its next read, when that costs less than `keep` saves. The
// exchange Checkmate's integer program weighs between pairs of data, which single moves
// cannot make once the budget is tight.
struct Exchange {
    std::size_t free_after = 0;  // the freed data's last touch before the overflow
    DataId freed{};
    std::size_t run_before = 0;  // its next read after the overflow
    OpId writer{};
};

[[nodiscard]] inline std::optional<Exchange> exchange_for(const Problem& p, const Schedule& s, const Move& keep,
                                                          const SimulationReport& current, const Liveness& l, Bytes budget) {
    const std::size_t from = *std::min_element(keep.frees.begin(), keep.frees.end());
    std::size_t lo = nowhere, hi = 0;
    Bytes need = 0;
    for (std::size_t i = from; i < keep.run && i < current.timeline.size(); ++i) {
        const Bytes over = current.timeline[i].during + keep.bytes - budget;
        if (over <= 0) continue;
        lo = std::min(lo, i);
        hi = i;
        need = std::max(need, over);
    }
    if (lo == nowhere) return std::nullopt;
    std::vector<char> kept(p.data_count(), 0);
    for (const DataId w : p.op(s[keep.run].op()).writes) kept[w.index] = 1;
    std::optional<Exchange> best;
    double best_cost = keep.saving;
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const DataId id{d};
        if (kept[d] || p.data(id).bytes < need || p.is_initial(id)) continue;
        const auto iv = l.interval_at(id, lo);
        if (!iv || iv->second <= hi) continue;
        const auto& reads = l.reads[d];
        const auto next = std::lower_bound(reads.begin(), reads.end(), lo);
        if (next != reads.end() && *next <= hi) continue;  // read inside the overflow
        const std::size_t run_before = next == reads.end() ? s.size() : *next;
        if (run_before >= iv->second && !(run_before == s.size() && p.is_final(id))) continue;
        std::size_t last_touch = iv->first;
        if (next != reads.begin() && *std::prev(next) >= iv->first) last_touch = *std::prev(next);
        for (const OpId w : p.writers(id)) {
            const Op& op = p.op(w);
            if (op.exactly_once || !(op.time < best_cost)) continue;
            const bool inputs_live = std::all_of(op.reads.begin(), op.reads.end(), [&](DataId r) {
                return r != id && l.live_at(r, run_before == 0 ? 0 : run_before - 1) && l.live_at(r, run_before);
            });
            if (!inputs_live) continue;
            best = Exchange{last_touch, id, run_before, w};
            best_cost = op.time;
        }
    }
    return best;
}

[[nodiscard]] inline Schedule with_exchange(const Schedule& s, const Move& keep, const Exchange& x) {
    Schedule out;
    out.reserve(s.size() + 2);
    for (std::size_t i = 0; i <= s.size(); ++i) {
        if (i == x.run_before) out.push_back(Step::run(x.writer));
        if (i == s.size()) break;
        if (i != keep.run && std::find(keep.frees.begin(), keep.frees.end(), i) == keep.frees.end()) out.push_back(s[i]);
        if (i == x.free_after) out.push_back(Step::free(x.freed));
    }
    return out;
}

}  // namespace detail::improve

/// The schedule without dead or idle runs, with every free as early as it can be (see the
/// top of this header). Valid input gives valid output of no larger peak and time.
[[nodiscard]] inline Schedule tidy_schedule(const Problem& problem, Schedule schedule) {
    using namespace detail::improve;
    for (std::size_t round = 0; round < 8; ++round) {
        ForwardPass f = forward_pass(problem, schedule);
        drop_dead_runs(problem, schedule, f);
        if (!f.changed) break;
        Schedule kept;
        kept.reserve(schedule.size());
        for (std::size_t i = 0; i < schedule.size(); ++i)
            if (f.keep[i]) kept.push_back(schedule[i]);
        schedule = std::move(kept);
    }
    return free_early(problem, schedule);
}

/// A schedule at least as fast as `schedule`, still within `budget` (see the top of this
/// header). When the input does not fit the budget it is returned tidied, unimproved.
[[nodiscard]] inline Schedule improve_schedule(const Problem& problem, Schedule schedule, Bytes budget,
                                               const ImproveOptions& options = {}) {
    using namespace detail::improve;
    if (!(options.time_limit_seconds >= 0))  // NaN too
        throw InvalidInput("improve: the time limit must be a non-negative number of seconds");
    const Stopwatch clock;
    schedule = tidy_schedule(problem, std::move(schedule));
    SimulationReport current = simulate(problem, schedule);
    if (!current.fits(budget)) return schedule;
    std::optional<Liveness> live;  // of the current schedule, computed when an exchange is first tried
    for (bool progress = true; progress && clock.seconds() < options.time_limit_seconds;) {
        progress = false;
        const std::vector<Move> moves = recompute_moves(problem, schedule);
        for (std::size_t c = 0; c < moves.size() && c < options.max_candidates; ++c) {
            if (clock.seconds() > options.time_limit_seconds) break;
            Schedule candidate;
            if (may_fit(moves[c], current, budget)) {
                candidate = tidy_schedule(problem, without(schedule, moves[c]));
            } else {
                if (!options.exchanges) continue;
                if (!live) live = liveness(problem, schedule);
                const auto x = exchange_for(problem, schedule, moves[c], current, *live, budget);
                if (!x) continue;
                candidate = tidy_schedule(problem, with_exchange(schedule, moves[c], *x));
            }
            SimulationReport r = simulate(problem, candidate);
            if (!r.fits(budget) || !(r.time < current.time)) continue;
            schedule = std::move(candidate);
            current = std::move(r);
            live.reset();
            progress = true;
            break;
        }
    }
    return schedule;
}

}  // namespace remat
