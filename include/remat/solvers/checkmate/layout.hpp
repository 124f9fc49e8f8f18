// remat/solvers/checkmate/layout.hpp — the passes of Checkmate's schedule and the (pass, op)
// points where each op may run: which points the model has at all, and, per data, the
// points that read or write it in time order (between two of them lies one liveness
// segment).
//
// Part of the Checkmate solver (solvers/checkmate.hpp; Jain et al., MLSys 2020: the passes
// are its stages). Exactly-once ops are confined to the windows of slots the order of
// checkmate/analysis.hpp allows, and points whose results no later point can read are
// left out, which keeps the model of checkmate/formulation.hpp small.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "../../core/problem.hpp"
#include "analysis.hpp"

namespace remat::detail::checkmate {

// A (pass, op position) point that reads or writes a data.
struct Event {
    std::size_t t = 0;
    std::size_t p = 0;
    bool reads = false;
    bool writes = false;
    friend bool operator<(const Event& a, const Event& b) { return a.t != b.t ? a.t < b.t : a.p < b.p; }
};

// The passes: one *slot* per exactly-once op (the k-th exactly-once op to run is in
// slot k), each made of `pre` passes without exactly-once op followed by its main pass,
// plus a trailing slot without exactly-once op when final data can be written by other
// ops (or when there is no exactly-once op at all).
struct Layout {
    std::size_t T = 0;      // passes
    std::size_t pre = 0;    // passes without exactly-once op before each main pass
    std::size_t slots = 0;  // exactly-once slots, plus the trailing one if any
    std::size_t E = 0;      // exactly-once ops (= slots that hold one)
    std::vector<char> allowed;  // [t * n + p]
    std::vector<std::size_t> lo, hi;  // slots of each exactly-once op (by exactly-once index)
    std::vector<std::vector<Event>> events;  // per data (non-initial)
    bool infeasible = false;
    std::string infeasible_reason;

    [[nodiscard]] bool at(std::size_t n, std::size_t t, std::size_t p) const { return allowed[t * n + p] != 0; }
    [[nodiscard]] std::size_t slot(std::size_t t) const { return t / (pre + 1); }
    [[nodiscard]] bool is_main(std::size_t t) const { return t % (pre + 1) == pre; }
    [[nodiscard]] std::size_t main_of(std::size_t slot) const { return slot * (pre + 1) + pre; }
    /// Whether pass t holds an exactly-once op (main pass of an exactly-once slot).
    [[nodiscard]] bool holds_eo(std::size_t t) const { return is_main(t) && slot(t) < E; }
};

inline bool needs_trailing_slot(const Problem& pr) {
    bool any_eo = false;
    for (const Op& op : pr.all_ops()) any_eo = any_eo || op.exactly_once;
    if (!any_eo) return true;
    for (const DataId d : pr.final_data()) {
        if (pr.is_initial(d)) continue;
        for (const OpId w : pr.writers(d))
            if (!pr.op(w).exactly_once) return true;
    }
    return false;
}

// The slots each exactly-once op can take: after all it needs, before all that need it.
inline void set_exactly_once_windows(Layout& L, const Analysis& a) {
    const std::size_t E = L.E;
    L.lo.assign(E, 0);
    L.hi.assign(E, 0);
    for (std::size_t e = 0; e < E; ++e) {
        L.lo[e] = a.n_pred[e];
        L.hi[e] = E - 1 - std::min(E - 1, a.n_succ[e]);
        if (L.lo[e] > L.hi[e]) {
            L.infeasible = true;
            L.infeasible_reason = "the exactly-once ops depend on each other in a cycle";
        }
    }
}

// Earliest pass at which each op can run (none: never), from the earliest passes at which
// its reads can be live and, for an exactly-once op, the first slot of its window.
inline std::vector<std::size_t> earliest_passes(const Problem& pr, const Analysis& a, const Layout& L) {
    std::vector<std::size_t> ep_op(a.n, none), ep_data(a.m, none);
    for (const DataId d : pr.initial()) ep_data[d.index] = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t k = 0; k < a.n; ++k) {
            std::size_t e = a.eo_index[k] != none ? L.main_of(L.lo[a.eo_index[k]]) : 0;
            for (const DataId d : pr.op(OpId{k}).reads) e = std::max(e, ep_data[d.index]);
            if (e >= ep_op[k]) continue;
            ep_op[k] = e;
            changed = true;
            for (const DataId d : pr.op(OpId{k}).writes) ep_data[d.index] = std::min(ep_data[d.index], e);
        }
    }
    return ep_op;
}

// Whether op k can run in pass t as far as the passes before it go: not before its
// earliest pass, and an exactly-once op only in a main pass of its window.
inline bool can_run_at(const Analysis& a, const Layout& L, const std::vector<std::size_t>& ep_op, std::size_t t,
                      std::size_t k) {
    if (ep_op[k] == none || t < ep_op[k]) return false;
    const std::size_t e = a.eo_index[k];
    return e == none || (L.holds_eo(t) && L.slot(t) >= L.lo[e] && L.slot(t) <= L.hi[e] && !L.infeasible);
}

// Backward sweep: an op other than an exactly-once one is worth running at a reachable,
// not forbidden point only if a later point can read one of its writes (or the write is
// final).
inline void mark_useful_points(const Problem& pr, const Analysis& a, Layout& L, const std::vector<std::size_t>& ep_op,
                               const std::vector<char>& forbidden) {
    const std::size_t n = a.n, T = L.T;
    L.allowed.assign(T * n, 0);
    std::vector<char> read_later(a.m, 0);
    for (std::size_t t = T; t-- > 0;)
        for (std::size_t p = n; p-- > 0;) {
            const std::size_t k = a.order[p];
            if (forbidden[t * n + p] || !can_run_at(a, L, ep_op, t, k)) continue;
            const Op& op = pr.op(OpId{k});
            bool ok = a.eo_index[k] != none;
            for (const DataId d : op.writes)
                ok = ok || (!pr.is_initial(d) && (read_later[d.index] || pr.is_final(d)));
            if (!ok) continue;
            L.allowed[t * n + p] = 1;
            for (const DataId d : op.reads) read_later[d.index] = 1;
        }
}

// Events of every data, in time order. A read of a data with no writer point before it
// can never happen: its point is forbidden instead; returns whether any was.
inline bool record_events(const Problem& pr, const Analysis& a, Layout& L, std::vector<char>& forbidden) {
    const std::size_t n = a.n, T = L.T;
    L.events.assign(a.m, {});
    std::vector<char> can_live(a.m, 0);
    bool changed = false;
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t p = 0; p < n; ++p) {
            if (!L.allowed[t * n + p]) continue;
            const std::size_t k = a.order[p];
            const Op& op = pr.op(OpId{k});
            bool dead_read = false;
            for (const DataId d : op.reads)
                if (!pr.is_initial(d) && !can_live[d.index]) dead_read = true;
            if (dead_read) {
                forbidden[t * n + p] = 1;
                changed = true;
                continue;
            }
            for (const DataId d : op.reads)
                if (!pr.is_initial(d)) L.events[d.index].push_back(Event{t, p, true, false});
            for (const DataId d : op.writes) {
                if (pr.is_initial(d)) continue;
                auto& ev = L.events[d.index];
                if (!ev.empty() && ev.back().t == t && ev.back().p == p)
                    ev.back().writes = true;
                else
                    ev.push_back(Event{t, p, false, true});
                can_live[d.index] = 1;
            }
        }
    return changed;
}

inline Layout make_layout(const Problem& pr, const Analysis& a, std::size_t pre) {
    Layout L;
    L.pre = pre;
    L.E = a.eo_ops.size();
    L.slots = L.E + (needs_trailing_slot(pr) ? 1 : 0);
    L.T = L.slots * (pre + 1);
    set_exactly_once_windows(L, a);
    const std::vector<std::size_t> ep_op = earliest_passes(pr, a, L);
    // Reads of a data that cannot be live there (its segment is fixed dead) are forbidden,
    // and the sweep repeated, until no point changes.
    std::vector<char> forbidden(L.T * a.n, 0);
    do {
        mark_useful_points(pr, a, L, ep_op, forbidden);
    } while (record_events(pr, a, L, forbidden));
    return L;
}

}  // namespace remat::detail::checkmate
