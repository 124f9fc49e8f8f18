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
    for (bool progress = true; progress && clock.seconds() < options.time_limit_seconds;) {
        progress = false;
        const std::vector<Move> moves = recompute_moves(problem, schedule);
        for (std::size_t c = 0; c < moves.size() && c < options.max_candidates; ++c) {
            if (clock.seconds() > options.time_limit_seconds) break;
            if (!may_fit(moves[c], current, budget)) continue;
            Schedule candidate = tidy_schedule(problem, without(schedule, moves[c]));
            SimulationReport r = simulate(problem, candidate);
            if (!r.fits(budget) || !(r.time < current.time)) continue;
            schedule = std::move(candidate);
            current = std::move(r);
            progress = true;
            break;
        }
    }
    return schedule;
}

}  // namespace remat
