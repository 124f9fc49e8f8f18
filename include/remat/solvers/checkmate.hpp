// remat/solvers/checkmate.hpp — optimal rematerialization of any graph by integer programming.
//
// Jain, Jain, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate: breaking the
// memory wall with optimal tensor rematerialization", MLSys 2020; on the data/op graph of
// Rockmate (Zhao et al., ICML 2023), i.e. every remat.problem/1 problem: several outputs per
// op, alternative writers, exactly-once ops, overheads, initial and final data.
//
// Formulation. Ops get one topological order. The schedule is a sequence of T *passes*;
// in a pass every op runs at most once, in that order (Checkmate's stages), and at most
// one exactly-once op runs per pass, so T = (exactly-once ops) + (extra passes). Variables:
//   R[t,k] ∈ {0,1}  op k runs in pass t (only where it can run and its result can be used),
//   Y[d,j] ∈ [0,1]  data d is live in its j-th segment: the time between two consecutive
//                   (pass, op) points where d is read or written (frees happen only there).
// Rows: each exactly-once op once; a read needs its data live just before; a segment can
// be live only if the one before was or a writer of d ran at the point between them; and
// at every (pass, op) point, the live data + the op's writes + its overhead ≤ budget. The
// objective is Σ time·R. Y needs no integrality: with R integral the least liveness that
// the rows allow is 0/1 and is what the schedule keeps (every data is freed right after
// its last read before it is written again), so the schedule's peak is never above the
// MILP's. Exactly-once ops are confined to windows of passes given by the order the graph
// forces on them (on a chain each backward gets one pass), and ops whose results no later
// point can read are not modelled at all, which keeps the model small.
//
// Exactness. Every schedule of at most T passes is a solution, and every solution is a
// schedule that the simulator (docs/formats.md §3 (simulation semantics)) accepts with the same time and no larger
// peak: the optimum is the optimum over schedules of at most T passes. On chains the
// optimal schedules need one pass per exactly-once op (each backward is preceded by one
// forward sweep); DAGs may need a few more (recomputing a branch "behind" the last op run),
// hence the extra passes (one by default on non-chains). The tests check the optimum
// against exhaustive search on hundreds of problems. The warm start (the best baseline
// that fits: store-all, Rotor or periodic) is always representable, because T is raised to
// its number of passes, so Checkmate is never worse than its baseline.
//
// Infeasible budgets: a quick lower bound (core/bounds.hpp: the largest single-op
// requirement, and the final data) rejects hopeless budgets at once; otherwise the same
// model with the budget replaced by a variable P and the objective min P gives the smallest
// peak over schedules of at most T passes, which Infeasible carries (exact whenever that
// search finishes).
//
// LP rounding (options.lp_rounding, for graphs too large for the exact search): the LP
// relaxation's liveness is rounded at several thresholds and by randomised rounding; each
// rounding is turned into a schedule that computes, pass by pass, what the exactly-once
// ops need (choosing writers the LP prefers) and keeps what the rounding keeps; schedules
// that are not valid or do not fit under the simulator are rejected. The LP optimum is
// the reported bound.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/bounds.hpp"
#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "../graph/topological.hpp"
#include "../milp/backend.hpp"
#include "../milp/model.hpp"
#include "exhaustive.hpp"
#include "greedy.hpp"
#include "periodic.hpp"
#include "rotor.hpp"
#include "store_all.hpp"

namespace remat {

struct CheckmateOptions {
    /// Wall-clock limit of one solve, every MILP included. When it stops the search, the
    /// best schedule found is returned with status "feasible" and its gap.
    double time_limit_seconds = 60.0;
    /// Relative MIP gap at which the search may stop; the default proves optimality.
    double relative_gap = 1e-9;
    /// Start from the best baseline that fits the budget (store-all; Rotor/periodic on chains).
    bool warm_start = true;
    /// Solve only the LP relaxation and round it (large graphs); never exact.
    bool lp_rounding = false;
    /// Passes without exactly-once op allowed before each one (extra sweeps over the
    /// order, to recompute something "behind" the last op run). Unset: 0 on chains, where
    /// one sweep per backward op is always enough, and 1 on other graphs.
    std::optional<std::size_t> extra_passes;
    /// Roundings tried in lp_rounding mode (thresholds, then randomised).
    std::size_t rounding_trials = 40;
    /// Seed of the randomised roundings (a solve is deterministic for a given seed).
    std::uint64_t seed = 0x5eedULL;
    /// For the smallest feasible budget (Infeasible), try the exact search of
    /// solvers/exhaustive.hpp first on problems of at most 64 data (a few seconds at most),
    /// then the min-peak MILP.
    bool exhaustive_first = true;
    /// Receives the model size and the MILP outcomes, one line each; empty means silence.
    ProgressCallback progress;
    /// Memory cap: a model with more run variables R[t,k] than this is not built (its rows and
    /// the backend's copy would take gigabytes); the best known schedule (the baselines and
    /// the greedy's) is returned instead, and without one the solve fails with SolverError.
    /// Two million run variables are about 1-2 GB in CBC.
    std::size_t max_run_variables = 2'000'000;
};

/// Size of the integer program Checkmate builds for a problem and budget.
struct CheckmateModelSize {
    std::size_t passes = 0;
    std::size_t variables = 0;
    std::size_t integers = 0;
    std::size_t rows = 0;
    std::size_t nonzeros = 0;
};

namespace detail::checkmate {

inline constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

// A set of exactly-once ops, by their exactly-once index.
class Bits {
public:
    Bits() = default;
    explicit Bits(std::size_t size) : words_((size + 63) / 64, 0) {}
    void set(std::size_t i) { words_[i / 64] |= std::uint64_t{1} << (i % 64); }
    [[nodiscard]] bool test(std::size_t i) const { return (words_[i / 64] >> (i % 64)) & 1U; }
    void unite(const Bits& o) {
        for (std::size_t w = 0; w < words_.size(); ++w) words_[w] |= o.words_[w];
    }
    void intersect(const Bits& o) {
        for (std::size_t w = 0; w < words_.size(); ++w) words_[w] &= o.words_[w];
    }
    [[nodiscard]] std::size_t count() const {
        std::size_t c = 0;
        for (const std::uint64_t w : words_) c += static_cast<std::size_t>(std::popcount(w));
        return c;
    }
    friend bool operator==(const Bits&, const Bits&) = default;

private:
    std::vector<std::uint64_t> words_;
};

// What Checkmate needs to know about a problem, whatever the number of passes.
struct Analysis {
    std::size_t n = 0;               // ops
    std::size_t m = 0;               // data
    std::vector<std::size_t> order;  // position → op
    std::vector<std::size_t> pos;    // op → position
    std::vector<std::size_t> eo_index;  // op → exactly-once index, or none
    std::vector<std::size_t> eo_ops;    // exactly-once index → op
    std::vector<Bits> eo_pred;          // exactly-once ops that must run before (by exactly-once index)
    std::vector<std::size_t> n_pred, n_succ;  // per exactly-once index
    std::vector<std::pair<std::size_t, std::size_t>> direct_prec;  // (before, after) exactly-once indices
    Bytes scale = 1;          // gcd of all sizes: memory rows are exact integers in this unit
    Bytes initial_bytes = 0;  // always live
    Bytes lower_bound = 0;    // no schedule has a smaller peak
    std::string lower_bound_reason;
};

inline Analysis analyse(const Problem& p) {
    Analysis a;
    a.n = p.op_count();
    a.m = p.data_count();
    a.order = graph::op_order(p);  // Checkmate's op numbering
    a.pos.assign(a.n, 0);
    for (std::size_t i = 0; i < a.n; ++i) a.pos[a.order[i]] = i;
    a.eo_index.assign(a.n, none);
    for (std::size_t k = 0; k < a.n; ++k)
        if (p.op(OpId{k}).exactly_once) {
            a.eo_index[k] = a.eo_ops.size();
            a.eo_ops.push_back(k);
        }
    const std::size_t E = a.eo_ops.size();

    // Exactly-once ops every derivation of a data / op goes through: the meet over all the
    // ways of producing it, iterated to its fixpoint from the initial data.
    std::vector<std::optional<Bits>> req_data(a.m), req_op(a.n);
    for (const DataId d : p.initial()) req_data[d.index] = Bits(E);
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t k = 0; k < a.n; ++k) {
            const Op& op = p.op(OpId{k});
            Bits r(E);
            bool ready = true;
            for (const DataId d : op.reads) {
                if (!req_data[d.index]) {
                    ready = false;
                    break;
                }
                r.unite(*req_data[d.index]);
            }
            if (!ready) continue;
            if (a.eo_index[k] != none) r.set(a.eo_index[k]);
            if (!req_op[k] || !(*req_op[k] == r)) {
                req_op[k] = std::move(r);
                changed = true;
            }
        }
        for (std::size_t d = 0; d < a.m; ++d) {
            if (p.is_initial(DataId{d})) continue;
            std::optional<Bits> r;
            for (const OpId w : p.writers(DataId{d})) {
                if (!req_op[w.index]) continue;
                if (!r)
                    r = *req_op[w.index];
                else
                    r->intersect(*req_op[w.index]);
            }
            if (r && (!req_data[d] || !(*req_data[d] == *r))) {
                req_data[d] = std::move(r);
                changed = true;
            }
        }
    }
    a.eo_pred.assign(E, Bits(E));
    a.n_pred.assign(E, 0);
    a.n_succ.assign(E, 0);
    for (std::size_t e = 0; e < E; ++e) {
        const auto& r = req_op[a.eo_ops[e]];
        if (!r) continue;  // cannot run at all; the model will be infeasible
        for (std::size_t f = 0; f < E; ++f)
            if (f != e && r->test(f)) {
                a.eo_pred[e].set(f);
                ++a.n_pred[e];
                ++a.n_succ[f];
            }
    }
    for (std::size_t e2 = 0; e2 < E; ++e2)
        for (std::size_t e1 = 0; e1 < E; ++e1) {
            if (!a.eo_pred[e2].test(e1)) continue;
            bool direct = true;
            for (std::size_t e3 = 0; e3 < E && direct; ++e3)
                if (e3 != e1 && a.eo_pred[e2].test(e3) && a.eo_pred[e3].test(e1)) direct = false;
            if (direct) a.direct_prec.emplace_back(e1, e2);
        }

    Bytes g = 0;
    for (const Data& d : p.all_data()) g = std::gcd(g, d.bytes);
    for (const Op& op : p.all_ops()) g = std::gcd(g, op.overhead);
    a.scale = g > 0 ? g : 1;
    a.initial_bytes = p.initial_bytes();

    // No schedule has a smaller peak (core/bounds.hpp).
    MemoryLowerBound bound = memory_lower_bound(p);
    a.lower_bound = bound.bytes;
    a.lower_bound_reason = std::move(bound.reason);
    return a;
}

// A segment's liveness: a constant or a variable.
struct Lit {
    enum class Kind : unsigned char { zero, one, var } kind = Kind::zero;
    milp::Var var{};
};

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

inline Layout make_layout(const Problem& pr, const Analysis& a, std::size_t pre) {
    Layout L;
    const std::size_t n = a.n, m = a.m, E = a.eo_ops.size();
    L.pre = pre;
    L.E = E;
    L.slots = E + (needs_trailing_slot(pr) ? 1 : 0);
    L.T = L.slots * (pre + 1);
    const std::size_t T = L.T;
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
    // Earliest pass at which each op can run and each data can be live.
    std::vector<std::size_t> ep_op(n, none), ep_data(m, none);
    for (const DataId d : pr.initial()) ep_data[d.index] = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t k = 0; k < n; ++k) {
            std::size_t e = a.eo_index[k] != none ? L.main_of(L.lo[a.eo_index[k]]) : 0;
            for (const DataId d : pr.op(OpId{k}).reads) e = std::max(e, ep_data[d.index]);
            if (e >= ep_op[k]) continue;
            ep_op[k] = e;
            changed = true;
            for (const DataId d : pr.op(OpId{k}).writes) ep_data[d.index] = std::min(ep_data[d.index], e);
        }
    }
    const auto forward_ok = [&](std::size_t t, std::size_t k) {
        if (ep_op[k] == none || t < ep_op[k]) return false;
        const std::size_t e = a.eo_index[k];
        return e == none || (L.holds_eo(t) && L.slot(t) >= L.lo[e] && L.slot(t) <= L.hi[e] && !L.infeasible);
    };
    // Backward: an op other than an exactly-once one is worth running only if a later point
    // can read one of its writes (or the write is final). Reads of a data that cannot be
    // live there (its segment is fixed dead) are forbidden, and the sweep repeated.
    std::vector<char> forbidden(T * n, 0);
    for (;;) {
        L.allowed.assign(T * n, 0);
        std::vector<char> read_later(m, 0);
        for (std::size_t t = T; t-- > 0;)
            for (std::size_t p = n; p-- > 0;) {
                const std::size_t k = a.order[p];
                if (forbidden[t * n + p] || !forward_ok(t, k)) continue;
                const Op& op = pr.op(OpId{k});
                bool ok = a.eo_index[k] != none;
                for (const DataId d : op.writes)
                    ok = ok || (!pr.is_initial(d) && (read_later[d.index] || pr.is_final(d)));
                if (!ok) continue;
                L.allowed[t * n + p] = 1;
                for (const DataId d : op.reads) read_later[d.index] = 1;
            }
        // Events of every data, in time order; a read of a data with no writer point
        // before it can never happen.
        L.events.assign(m, {});
        std::vector<char> can_live(m, 0);
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
        if (!changed) break;
    }
    return L;
}

// The MILP of one layout, with its variables, ready to be solved or to give a schedule.
class Formulation {
public:
    // `budget`: memory rows against it; nullopt: minimise the peak instead (variable P).
    Formulation(const Problem& pr, const Analysis& a, Layout layout, std::optional<Bytes> budget)
        : pr_(pr), a_(a), L_(std::move(layout)) {
        const std::size_t n = a.n, m = a.m, T = L_.T;
        infeasible_ = L_.infeasible;
        reason_ = L_.infeasible_reason;
        // Variables: R for every allowed point.
        rvar_.assign(T * n, none);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t p = 0; p < n; ++p)
                if (L_.at(n, t, p)) {
                    const Op& op = pr.op(OpId{a.order[p]});
                    rvar_[t * n + p] = model_.add_binary(op.time, "R_" + std::to_string(t) + "_" + op.name).index;
                }
        // Segments: fixed where the data cannot be live or is of no use, variables elsewhere.
        seg_.assign(m, {});
        for (std::size_t d = 0; d < m; ++d) {
            if (pr.is_initial(DataId{d})) continue;
            const auto& ev = L_.events[d];
            const std::size_t S = ev.size() + 1;
            std::vector<char> live_possible(S, 0), read_after(S, 0);
            for (std::size_t j = 0; j + 1 < S; ++j) live_possible[j + 1] = live_possible[j] || ev[j].writes;
            for (std::size_t j = S - 1; j-- > 0;) read_after[j] = read_after[j + 1] || ev[j].reads;
            const bool fin = pr.is_final(DataId{d});
            auto& seg = seg_[d];
            seg.resize(S);
            for (std::size_t j = 0; j < S; ++j) {
                if (j == S - 1 && fin) {
                    seg[j].kind = Lit::Kind::one;
                    if (!live_possible[j]) fail("final data '" + pr.data(DataId{d}).name + "' can never be computed");
                } else if (!live_possible[j] || (!read_after[j] && !fin)) {
                    seg[j].kind = Lit::Kind::zero;
                } else {
                    seg[j].kind = Lit::Kind::var;
                    seg[j].var = model_.add_continuous(0.0, 1.0, 0.0, "Y_" + pr.data(DataId{d}).name + "_" + std::to_string(j));
                }
            }
        }
        const double unit = static_cast<double>(a.scale);
        std::optional<milp::Var> peak;
        double cap = 0.0;
        if (budget) {
            cap = std::floor(static_cast<double>(*budget - a.initial_bytes) / unit);
        } else {
            peak = model_.add_continuous(std::ceil(static_cast<double>(a.lower_bound) / unit), milp::infinity, 1.0, "P");
            // The peak is the objective; time only breaks ties, weighted so that all runs
            // together are worth less than half a unit of peak (P is integral in units).
            double total = 0.0;
            for (const std::size_t v : rvar_)
                if (v != none) total += model_.variable(milp::Var{v}).objective;
            const double weight = total > 0 ? 0.25 / total : 0.0;
            for (const std::size_t v : rvar_)
                if (v != none) model_.set_objective(milp::Var{v}, model_.variable(milp::Var{v}).objective * weight);
        }
        peak_ = peak;

        // Exactly-once ops: once each, at most one per pass, in the order the graph forces.
        const std::size_t E = a.eo_ops.size();
        for (std::size_t e = 0; e < E; ++e) {
            std::vector<milp::Term> terms;
            const std::size_t p = a.pos[a.eo_ops[e]];
            for (std::size_t t = 0; t < T; ++t)
                if (const std::size_t v = rvar_[t * n + p]; v != none) terms.push_back({milp::Var{v}, 1.0});
            if (terms.empty()) fail("exactly-once op '" + pr.op(OpId{a.eo_ops[e]}).name + "' cannot run in any pass");
            else model_.add_row(std::move(terms), milp::Sense::equal, 1.0, "once_" + pr.op(OpId{a.eo_ops[e]}).name);
        }
        for (std::size_t t = 0; t < T; ++t) {
            std::vector<milp::Term> terms;
            for (const std::size_t k : a.eo_ops)
                if (const std::size_t v = rvar_[t * n + a.pos[k]]; v != none) terms.push_back({milp::Var{v}, 1.0});
            // Each exactly-once slot holds exactly one (there are as many slots as ops).
            if (L_.holds_eo(t) && !terms.empty())
                model_.add_row(std::move(terms), milp::Sense::equal, 1.0, "slot_" + std::to_string(t));
        }
        for (const auto& [e1, e2] : a.direct_prec) {
            const std::size_t p1 = a.pos[a.eo_ops[e1]], p2 = a.pos[a.eo_ops[e2]];
            if (L_.infeasible) break;
            // By slot s, e2 has run only if e1 ran in an earlier slot (redundant once e1 is surely done).
            for (std::size_t s = L_.lo[e2]; s <= L_.hi[e2] && s <= L_.hi[e1]; ++s) {
                std::vector<milp::Term> terms;
                for (std::size_t u = 0; u <= s; ++u)
                    if (const std::size_t v = rvar_[L_.main_of(u) * n + p2]; v != none) terms.push_back({milp::Var{v}, 1.0});
                for (std::size_t u = 0; u < s; ++u)
                    if (const std::size_t v = rvar_[L_.main_of(u) * n + p1]; v != none) terms.push_back({milp::Var{v}, -1.0});
                if (!terms.empty()) model_.add_row(std::move(terms), milp::Sense::less_equal, 0.0, "prec");
            }
        }

        // Production cuts: by the time an exactly-once op has run, every data it reads has
        // been written at least once (and so has every final data by the end). The rows
        // follow from the others for integral R, but the LP relaxation otherwise spreads an
        // exactly-once op over several passes and "half-computes" what it reads.
        if (!L_.infeasible) {
            for (std::size_t e = 0; e < E; ++e) {
                const std::size_t k = a.eo_ops[e];
                const std::size_t pe = a.pos[k];
                for (const DataId d : pr.op(OpId{k}).reads) {
                    if (pr.is_initial(d)) continue;
                    std::vector<milp::Term> writes;  // writer points in time order
                    std::vector<Event> at;
                    for (const Event& ev : L_.events[d.index])
                        if (ev.writes) {
                            writes.push_back({milp::Var{rvar_[ev.t * n + ev.p]}, 1.0});
                            at.push_back(ev);
                        }
                    std::vector<milp::Term> runs;
                    std::size_t w = 0;
                    for (std::size_t slot = L_.lo[e]; slot <= L_.hi[e]; ++slot) {
                        const std::size_t t = L_.main_of(slot);
                        const std::size_t v = rvar_[t * n + pe];
                        if (v == none) continue;
                        runs.push_back({milp::Var{v}, -1.0});
                        while (w < at.size() && (at[w].t < t || (at[w].t == t && at[w].p < pe))) ++w;
                        std::vector<milp::Term> row(writes.begin(), writes.begin() + static_cast<std::ptrdiff_t>(w));
                        row.insert(row.end(), runs.begin(), runs.end());
                        model_.add_row(std::move(row), milp::Sense::greater_equal, 0.0, "produced");
                    }
                }
            }
            for (const DataId d : pr.final_data()) {
                if (pr.is_initial(d)) continue;
                std::vector<milp::Term> writes;
                for (const Event& ev : L_.events[d.index])
                    if (ev.writes) writes.push_back({milp::Var{rvar_[ev.t * n + ev.p]}, 1.0});
                if (!writes.empty()) model_.add_row(std::move(writes), milp::Sense::greater_equal, 1.0, "final");
            }
        }

        // One representation per schedule: two consecutive passes that could be one (the
        // second starts after the last op of the first, and not both hold an exactly-once
        // op) are not allowed. When the first pass is one without exactly-once op, "if it
        // ends at q, the next one runs an op at or before q" (so a used pass of that kind is
        // followed by a used pass); when it holds one, "if the next starts at q, this one
        // runs an op at or after q" (an empty next pass is fine).
        if (!L_.infeasible)
            for (std::size_t t = 0; t + 1 < T; ++t) {
                if (L_.holds_eo(t) && L_.holds_eo(t + 1)) continue;
                const bool first_free = !L_.holds_eo(t);
                const std::size_t witness_pass = first_free ? t : t + 1;
                for (std::size_t q = 0; q < n; ++q) {
                    const std::size_t w = rvar_[witness_pass * n + q];
                    if (w == none) continue;
                    std::vector<milp::Term> row{{milp::Var{w}, -1.0}};
                    for (std::size_t p = 0; p < n; ++p) {
                        const bool in_first = first_free ? p > q : p >= q;
                        const bool in_second = first_free ? p <= q : p < q;
                        if (const std::size_t v = rvar_[t * n + p]; v != none && in_first && v != w) row.push_back({milp::Var{v}, 1.0});
                        if (const std::size_t v = rvar_[(t + 1) * n + p]; v != none && in_second && v != w) row.push_back({milp::Var{v}, 1.0});
                    }
                    model_.add_row(std::move(row), milp::Sense::greater_equal, 0.0, "one_representation");
                }
            }

        // Reads, liveness transitions and memory, point by point in time order.
        std::vector<std::size_t> seen(m, 0);  // events of each data passed so far = current segment
        std::vector<milp::Term> terms;
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t p = 0; p < n; ++p) {
                const std::size_t rv = rvar_[t * n + p];
                if (rv == none) continue;
                const std::size_t k = a.order[p];
                const Op& op = pr.op(OpId{k});
                const milp::Var R{rv};
                // Reads.
                for (const DataId d : op.reads) {
                    if (pr.is_initial(d)) continue;
                    const Lit& y = seg_[d.index][seen[d.index]];
                    if (y.kind == Lit::Kind::var)
                        model_.add_row({{R, 1.0}, {y.var, -1.0}}, milp::Sense::less_equal, 0.0, "read");
                    else if (y.kind == Lit::Kind::zero)
                        model_.add_row({{R, 1.0}}, milp::Sense::less_equal, 0.0, "read");
                }
                // Memory while the op runs.
                Bytes written = 0;
                for (const DataId d : op.writes)
                    if (!pr.is_initial(d)) written += pr.data(d).bytes;
                terms.clear();
                double rhs = budget ? cap : -static_cast<double>(a.initial_bytes / a.scale);
                double most = 0.0;
                const double own = static_cast<double>((written + op.overhead) / a.scale);
                if (own > 0) terms.push_back({R, own});
                most += own;
                for (std::size_t d = 0; d < m; ++d) {
                    if (pr.is_initial(DataId{d}) || pr.data(DataId{d}).bytes == 0) continue;
                    if (std::find(op.writes.begin(), op.writes.end(), DataId{d}) != op.writes.end()) continue;
                    const Lit& y = seg_[d][seen[d]];
                    const double b = static_cast<double>(pr.data(DataId{d}).bytes / a.scale);
                    if (y.kind == Lit::Kind::one) {
                        rhs -= b;
                    } else if (y.kind == Lit::Kind::var) {
                        terms.push_back({y.var, b});
                        most += b;
                    }
                }
                if (peak) {
                    terms.push_back({*peak, -1.0});
                    model_.add_row(terms, milp::Sense::less_equal, rhs, "mem");
                } else if (most > rhs) {
                    if (rhs < 0 && own == 0 && terms.empty()) fail("the data that must stay live exceed the budget");
                    model_.add_row(terms, milp::Sense::less_equal, rhs, "mem");
                }
                // Liveness transitions of the data this point touches.
                const auto transition = [&](std::size_t d, bool writes) {
                    const Lit& before = seg_[d][seen[d]];
                    const Lit& after = seg_[d][seen[d] + 1];
                    std::vector<milp::Term> row;
                    double constant = 0.0;  // row: after − before − R·writes + constant ≤ 0
                    if (after.kind == Lit::Kind::zero) return;
                    if (after.kind == Lit::Kind::one) constant += 1.0;
                    else row.push_back({after.var, 1.0});
                    if (before.kind == Lit::Kind::one) return;
                    if (before.kind == Lit::Kind::var) row.push_back({before.var, -1.0});
                    if (writes) row.push_back({R, -1.0});
                    if (row.empty()) {
                        if (constant > 0) fail("data '" + pr.data(DataId{d}).name + "' must be live but cannot be");
                        return;
                    }
                    model_.add_row(std::move(row), milp::Sense::less_equal, -constant, "live");
                };
                for (const DataId d : op.reads)
                    if (!pr.is_initial(d)) {
                        const bool writes = std::find(op.writes.begin(), op.writes.end(), d) != op.writes.end();
                        transition(d.index, writes);
                    }
                for (const DataId d : op.writes)
                    if (!pr.is_initial(d) && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end())
                        transition(d.index, true);
                for (const DataId d : op.reads)
                    if (!pr.is_initial(d)) ++seen[d.index];
                for (const DataId d : op.writes)
                    if (!pr.is_initial(d) && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end())
                        ++seen[d.index];
            }
    }

    [[nodiscard]] milp::Model& model() noexcept { return model_; }
    [[nodiscard]] const milp::Model& model() const noexcept { return model_; }
    [[nodiscard]] bool infeasible() const noexcept { return infeasible_; }
    [[nodiscard]] const std::string& infeasible_reason() const noexcept { return reason_; }
    [[nodiscard]] const Layout& layout() const noexcept { return L_; }
    [[nodiscard]] std::optional<milp::Var> peak_var() const noexcept { return peak_; }

    [[nodiscard]] CheckmateModelSize size() const {
        return {L_.T, model_.variable_count(), model_.integer_count(), model_.row_count(), model_.nonzero_count()};
    }

    // The runs of a solution, as (pass, position) points in time order.
    [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> runs(const std::vector<double>& values) const {
        std::vector<std::pair<std::size_t, std::size_t>> out;
        const std::size_t n = a_.n;
        for (std::size_t t = 0; t < L_.T; ++t)
            for (std::size_t p = 0; p < n; ++p)
                if (const std::size_t v = rvar_[t * n + p]; v != none && values[v] > 0.5) out.emplace_back(t, p);
        return out;
    }

    // The schedule of a set of runs: each data is kept from the run that writes it to its
    // last read before it is written again (to the end when final), and freed right then.
    [[nodiscard]] Schedule schedule(const std::vector<std::pair<std::size_t, std::size_t>>& runs) const {
        const std::size_t m = a_.m;
        // For each data, the run indices that read / write it.
        std::vector<std::vector<std::size_t>> free_after(runs.size());
        std::vector<std::size_t> last_write(m, none), last_read(m, none);
        const auto close = [&](std::size_t d, bool final_keep) {
            // The interval opened by last_write[d] ends: free after its last read (or the write).
            if (last_write[d] == none) return;
            if (final_keep) return;
            const std::size_t at = last_read[d] != none && last_read[d] > last_write[d] ? last_read[d] : last_write[d];
            free_after[at].push_back(d);
        };
        for (std::size_t i = 0; i < runs.size(); ++i) {
            const Op& op = pr_.op(OpId{a_.order[runs[i].second]});
            for (const DataId d : op.reads)
                if (!pr_.is_initial(d)) last_read[d.index] = i;
            for (const DataId d : op.writes) {
                if (pr_.is_initial(d)) continue;
                const bool read_here = std::find(op.reads.begin(), op.reads.end(), d) != op.reads.end();
                // Rewritten while it must be live (read by this very op): the interval goes on.
                if (!(read_here && last_write[d.index] != none)) close(d.index, false);
                if (!read_here || last_write[d.index] == none) last_write[d.index] = i;
            }
        }
        for (std::size_t d = 0; d < m; ++d)
            if (!pr_.is_initial(DataId{d})) close(d, pr_.is_final(DataId{d}));
        Schedule s;
        s.reserve(runs.size() * 2);
        for (std::size_t i = 0; i < runs.size(); ++i) {
            s.push_back(Step::run(OpId{a_.order[runs[i].second]}));
            auto& frees = free_after[i];
            std::sort(frees.begin(), frees.end());
            frees.erase(std::unique(frees.begin(), frees.end()), frees.end());
            for (const std::size_t d : frees) s.push_back(Step::free(DataId{d}));
        }
        return s;
    }

    // A full assignment of the model's variables for a set of runs (a warm start), or
    // nullopt when a run falls on a point the model does not have.
    [[nodiscard]] std::optional<std::vector<double>> assignment(
        const std::vector<std::pair<std::size_t, std::size_t>>& runs) const {
        const std::size_t n = a_.n, m = a_.m;
        std::vector<double> x(model_.variable_count(), 0.0);
        std::vector<char> run_at(L_.T * n, 0);
        for (const auto& [t, p] : runs) {
            if (t >= L_.T || rvar_[t * n + p] == none) return std::nullopt;
            x[rvar_[t * n + p]] = 1.0;
            run_at[t * n + p] = 1;
        }
        // Least liveness: live from a writing run to the last reading run before the next
        // writing run (or to the end for final data).
        for (std::size_t d = 0; d < m; ++d) {
            if (pr_.is_initial(DataId{d})) continue;
            const auto& ev = L_.events[d];
            const auto& seg = seg_[d];
            std::vector<char> live(ev.size() + 1, 0);
            // Mark segments before each reading run back to the writing run that feeds it.
            for (std::size_t j = 0; j < ev.size(); ++j) {
                if (!ev[j].reads || !run_at[ev[j].t * n + ev[j].p]) continue;
                for (std::size_t i = j; i-- > 0;) {
                    live[i + 1] = 1;
                    if (ev[i].writes && run_at[ev[i].t * n + ev[i].p]) break;
                    if (i == 0) return std::nullopt;  // read with no write before
                }
                if (j == 0) return std::nullopt;
            }
            if (pr_.is_final(DataId{d})) {
                for (std::size_t i = ev.size(); i-- > 0;) {
                    live[i + 1] = 1;
                    if (ev[i].writes && run_at[ev[i].t * n + ev[i].p]) break;
                }
            }
            for (std::size_t j = 0; j < seg.size(); ++j) {
                if (seg[j].kind == Lit::Kind::var) x[seg[j].var.index] = live[j];
                else if ((seg[j].kind == Lit::Kind::one) != (live[j] != 0)) return std::nullopt;
            }
        }
        if (peak_) {
            // The least P the memory rows allow.
            double p = model_.variable(*peak_).lower;
            for (const milp::Row& row : model_.rows()) {
                double coef = 0.0, activity = 0.0;
                for (const milp::Term& term : row.terms) {
                    if (term.var == *peak_) coef = term.coef;
                    else activity += term.coef * x[term.var.index];
                }
                if (coef < 0) p = std::max(p, (activity - row.rhs) / -coef);
            }
            x[peak_->index] = std::ceil(p - 1e-9);
        }
        return x;
    }

    // Fractional liveness of data d just after the point (t, p) in a solution of the relaxation.
    [[nodiscard]] double liveness_after(const std::vector<double>& values, std::size_t d, std::size_t t,
                                        std::size_t p) const {
        if (pr_.is_initial(DataId{d})) return 1.0;
        const auto& ev = L_.events[d];
        const Event key{t, p, false, false};
        const auto j = static_cast<std::size_t>(std::upper_bound(ev.begin(), ev.end(), key) - ev.begin());
        const Lit& y = seg_[d][j];
        if (y.kind == Lit::Kind::one) return 1.0;
        if (y.kind == Lit::Kind::zero) return 0.0;
        return values[y.var.index];
    }
    [[nodiscard]] double run_value(const std::vector<double>& values, std::size_t t, std::size_t p) const {
        const std::size_t v = rvar_[t * a_.n + p];
        return v == none ? 0.0 : values[v];
    }

private:
    void fail(std::string why) {
        if (!infeasible_) reason_ = std::move(why);
        infeasible_ = true;
    }

    const Problem& pr_;
    const Analysis& a_;
    Layout L_;
    milp::Model model_;
    std::vector<std::size_t> rvar_;
    std::vector<std::vector<Lit>> seg_;
    std::optional<milp::Var> peak_;
    bool infeasible_ = false;
    std::string reason_;
};

// Places a schedule's runs in the passes of a layout: its maximal runs in increasing
// order with at most one exactly-once op each, the one with the k-th exactly-once op as
// the main pass of slot k, those in between as the last pre-passes before it. Nullopt
// when the schedule needs more pre-passes than the layout has.
inline std::optional<std::vector<std::pair<std::size_t, std::size_t>>> place_runs(const Analysis& a, const Problem& pr,
                                                                                   const Layout& L, const Schedule& s) {
    struct Run {
        std::size_t p;
        bool eo;
    };
    std::vector<std::vector<Run>> passes;
    std::size_t last = none;
    bool eo_in_pass = false;
    for (const Step& step : s) {
        if (!step.is_run()) continue;
        const std::size_t p = a.pos[step.op().index];
        const bool eo = pr.op(step.op()).exactly_once;
        if (passes.empty() || p <= last || (eo && eo_in_pass)) {
            passes.emplace_back();
            eo_in_pass = false;
        }
        passes.back().push_back({p, eo});
        last = p;
        eo_in_pass = eo_in_pass || eo;
    }
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::size_t slot = 0;
    std::vector<const std::vector<Run>*> waiting;  // passes without exactly-once op before the next main
    const auto flush = [&](std::size_t main_pass) {
        if (waiting.size() > L.pre) return false;
        for (std::size_t i = 0; i < waiting.size(); ++i)
            for (const Run& r : *waiting[i]) out.emplace_back(main_pass - waiting.size() + i, r.p);
        waiting.clear();
        return true;
    };
    for (const auto& pass : passes) {
        const bool has_eo = std::any_of(pass.begin(), pass.end(), [](const Run& r) { return r.eo; });
        if (!has_eo) {
            waiting.push_back(&pass);
            continue;
        }
        if (slot >= L.E) return std::nullopt;
        const std::size_t main_pass = L.main_of(slot++);
        if (!flush(main_pass)) return std::nullopt;
        for (const Run& r : pass) out.emplace_back(main_pass, r.p);
    }
    if (!waiting.empty()) {
        if (L.slots == L.E) return std::nullopt;  // no trailing slot
        // The last of them is the trailing main pass, the others its pre-passes.
        const std::size_t main_pass = L.main_of(L.E);
        const std::vector<Run>* tail = waiting.back();
        waiting.pop_back();
        if (!flush(main_pass)) return std::nullopt;
        for (const Run& r : *tail) out.emplace_back(main_pass, r.p);
    }
    std::sort(out.begin(), out.end());
    return out;
}

// Drops runs whose results nothing uses (a baseline may have some), and frees that then
// refer to data no longer live, until nothing changes.
inline Schedule without_useless_runs(const Problem& pr, Schedule s) {
    for (bool changed = true; changed;) {
        changed = false;
        std::vector<char> live(pr.data_count(), 0);
        for (const DataId d : pr.initial()) live[d.index] = 1;
        // For each run, whether a data it made live is read before being freed, or ends live and final.
        std::vector<std::vector<std::size_t>> opened(s.size());
        std::vector<std::size_t> opener(pr.data_count(), none);
        std::vector<char> used(s.size(), 0);
        for (std::size_t i = 0; i < s.size(); ++i) {
            const Step& step = s[i];
            if (step.is_run()) {
                const Op& op = pr.op(step.op());
                for (const DataId d : op.reads)
                    if (opener[d.index] != none) used[opener[d.index]] = 1;
                for (const DataId d : op.writes)
                    if (!live[d.index]) {
                        live[d.index] = 1;
                        opener[d.index] = i;
                    }
                if (op.exactly_once) used[i] = 1;
            } else {
                live[step.data().index] = 0;
                opener[step.data().index] = none;
            }
        }
        for (const DataId d : pr.final_data())
            if (opener[d.index] != none) used[opener[d.index]] = 1;
        Schedule kept;
        std::fill(live.begin(), live.end(), 0);
        for (const DataId d : pr.initial()) live[d.index] = 1;
        for (std::size_t i = 0; i < s.size(); ++i) {
            const Step& step = s[i];
            if (step.is_run()) {
                if (!used[i]) {
                    changed = true;
                    continue;
                }
                for (const DataId d : pr.op(step.op()).writes) live[d.index] = 1;
                kept.push_back(step);
            } else if (live[step.data().index]) {
                live[step.data().index] = 0;
                kept.push_back(step);
            }
        }
        s = std::move(kept);
    }
    return s;
}

}  // namespace detail::checkmate

/// Checkmate over a MILP backend (milp::LpSolve from milp/lp_solve.hpp, milp::Cbc from
/// milp/cbc.hpp, or any type modelling milp::MilpBackend).
template <milp::MilpBackend Backend>
class Checkmate {
public:
    explicit Checkmate(CheckmateOptions options = {}, Backend backend = {})
        : options_(options), backend_(std::move(backend)) {
        if (!(options_.time_limit_seconds > 0))
            throw InvalidInput("checkmate: the time limit must be positive (infinity for none)");
        if (!(options_.relative_gap >= 0) || !std::isfinite(options_.relative_gap))
            throw InvalidInput("checkmate: the MIP gap must be a finite number >= 0");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "checkmate"; }
    [[nodiscard]] const CheckmateOptions& options() const noexcept { return options_; }
    [[nodiscard]] const Backend& backend() const noexcept { return backend_; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        using namespace detail::checkmate;
        const auto start = std::chrono::steady_clock::now();
        const Analysis a = analyse(problem);
        if (budget < a.lower_bound) throw_infeasible(problem, a, budget, start, a.lower_bound_reason);

        std::optional<Baseline> base = best_baseline(problem, a, budget);
        Layout layout = make_layout(problem, a, pre_passes(problem));
        if (const std::size_t runs = run_variables(layout); runs > options_.max_run_variables)
            return beyond_cap(problem, budget, base, runs, start);
        Formulation f(problem, a, std::move(layout), budget);
        if (options_.lp_rounding) return solve_by_rounding(problem, a, f, budget, base, start);
        if (!base && options_.warm_start && !f.infeasible()) {
            // No baseline fits: a few roundings of the LP relaxation usually give a good
            // start, within a tenth of the time limit.
            const double slice = std::isfinite(options_.time_limit_seconds) ? options_.time_limit_seconds / 10 : 10.0;
            base = round_relaxation(problem, a, f, budget, 12, seconds_since(start) + slice, start).best;
        }
        if (f.layout().pre > 0 && options_.warm_start && !f.infeasible()) {
            // The model with one sweep per exactly-once op is much easier and usually holds
            // the optimum: its solution (within a third of the time limit) starts the full one.
            Formulation one(problem, a, make_layout(problem, a, 0), budget);
            if (!one.infeasible()) {
                if (base)
                    if (const auto runs = place_runs(a, problem, one.layout(), base->schedule))
                        if (auto x = one.assignment(*runs)) one.model().set_start(std::move(*x));
                // Until a third of the time limit has passed (the roundings may have used some).
                one.model().set_relative_gap(options_.relative_gap);
                const milp::Result r1 = solve_until(one.model(), options_.time_limit_seconds / 3, start);
                if (options_.progress) print_result(r1);
                if (r1.has_solution()) {
                    Schedule s1 = one.schedule(one.runs(r1.values));
                    const SimulationReport rep = simulate(problem, s1);
                    if (rep.fits(budget) && (!base || rep.time < base->time))
                        base = Baseline{std::move(s1), rep.time, "one-sweep milp"};
                }
            }
        }

        if (base && options_.warm_start)
            if (const auto runs = place_runs(a, problem, f.layout(), base->schedule))
                if (auto x = f.assignment(*runs)) f.model().set_start(std::move(*x));
        report(problem, budget, f, base);
        if (f.infeasible()) throw_infeasible(problem, a, budget, start, f.infeasible_reason());

        const milp::Result r = run(f.model(), start);
        if (options_.progress) print_result(r);
        if (r.status == milp::Status::infeasible && !base)
            throw_infeasible(problem, a, budget, start, "the MILP has no solution");
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt, describe_options(f)};

        std::optional<Schedule> schedule;
        double time = milp::infinity;
        if (r.has_solution()) {
            Schedule s = f.schedule(f.runs(r.values));
            const SimulationReport check = simulate(problem, s);
            // The backend's arithmetic could let a point exceed the budget by a hair; the
            // simulator has the last word (make_checked_plan reports a genuine bug).
            if (!check.valid || check.peak <= budget || !base) {
                schedule = std::move(s);
                time = check.time;
            }
        }
        std::string returned;
        if (base && base->time < time) {
            schedule = base->schedule;
            time = base->time;
            returned = " returned=" + base->from +
                       (r.has_solution() ? "" : " (the MILP found no schedule within the time limit; this is the best known one)");
        }
        if (!schedule)
            throw SolverError("checkmate: the time limit of " + std::to_string(options_.time_limit_seconds) +
                              " s ran out before any schedule of '" + problem.name() + "' within " +
                              std::to_string(budget) + " bytes was found; raise the time limit or use lp_rounding");
        stats.options += returned;
        const double bound = r.status == milp::Status::optimal ? r.objective : r.best_bound;
        if (r.status == milp::Status::optimal && time <= r.objective + 1e-9 * std::max(1.0, std::abs(time))) {
            stats.status = SolveStatus::optimal;
            stats.gap = 0.0;
        } else {
            stats.gap = gap(time, bound);
        }
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(*schedule), budget, std::move(stats));
    }

    /// The smallest peak of any schedule this solver's model holds (exact when the search
    /// finishes within the time limit; otherwise the best peak found).
    [[deprecated("use smallest_budget()")]] [[nodiscard]] Bytes smallest_feasible_budget(const Problem& problem) const {
        return smallest_budget(problem);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::checkmate::Analysis a = detail::checkmate::analyse(problem);
        return smallest_peak(problem, a, start).first;
    }

    /// The size of the MILP solve() builds for this problem and budget.
    [[nodiscard]] CheckmateModelSize model_size(const Problem& problem, Bytes budget) const {
        using namespace detail::checkmate;
        const Analysis a = analyse(problem);
        const Formulation f(problem, a, make_layout(problem, a, pre_passes(problem)), budget);
        return f.size();
    }

private:
    struct Baseline {
        Schedule schedule;
        double time = 0.0;
        std::string from;
    };

    [[nodiscard]] static std::size_t run_variables(const detail::checkmate::Layout& layout) {
        return static_cast<std::size_t>(std::count(layout.allowed.begin(), layout.allowed.end(), char{1}));
    }

    // The model would pass the memory cap: the best known schedule, or a clear error.
    [[nodiscard]] Plan beyond_cap(const Problem& problem, Bytes budget, const std::optional<Baseline>& base,
                                  std::size_t runs, std::chrono::steady_clock::time_point start) const {
        const std::string why = "the MILP would have " + std::to_string(runs) + " run variables, above max_run_variables = " +
                                std::to_string(options_.max_run_variables) + " (the memory cap)";
        if (!base)
            throw SolverError("checkmate: " + why + " for '" + problem.name() + "' and no baseline fits " +
                              std::to_string(budget) + " bytes; raise the cap or use hrockmate or greedy");
        say("checkmate: ", why, "; returning the ", base->from, " schedule");
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt,
                          "backend=" + std::string(backend_.name()) + " " + why + "; returned=" + base->from};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, base->schedule, budget, std::move(stats));
    }

    [[nodiscard]] std::size_t pre_passes(const Problem& problem) const {
        if (options_.extra_passes) return *options_.extra_passes;
        return as_chain(problem) ? 0 : 1;
    }

    // The best schedule within budget among the baselines, cleaned of useless runs.
    [[nodiscard]] std::optional<Baseline> best_baseline(const Problem& problem, const detail::checkmate::Analysis& a,
                                                        Bytes budget) const {
        using namespace detail::checkmate;
        (void)a;
        std::optional<Baseline> best;
        const auto consider = [&](Schedule s, std::string from) {
            s = without_useless_runs(problem, std::move(s));
            const SimulationReport r = simulate(problem, s);
            if (!r.fits(budget)) return;
            if (best && best->time <= r.time) return;
            best = Baseline{std::move(s), r.time, std::move(from)};
        };
        try {
            consider(store_all_reference(problem).schedule, "store-all");
        } catch (const Error&) {
        }
        try {
            GreedyOptions g;
            g.improve_seconds = std::min(1.0, 0.02 * options_.time_limit_seconds);
            consider(Greedy(g).solve(problem, budget).schedule, "greedy");
        } catch (const Error&) {
        }
        if (const auto chain = as_chain(problem)) {
            try {
                consider(Rotor().solve(problem, budget).schedule, "rotor");
            } catch (const Error&) {
            }
            for (std::size_t k = 1; k <= chain->length(); ++k) consider(Periodic(k).schedule(*chain), "periodic");
        }
        return best;
    }

    [[nodiscard]] milp::Result run(milp::Model& model, std::chrono::steady_clock::time_point start) const {
        model.set_relative_gap(options_.relative_gap);
        return solve_until(model, options_.time_limit_seconds, start);
    }

    // A backend cannot stop inside its first LP (CBC's root LP alone takes tens of seconds on
    // models of ~10^4 rows), so a MILP is not started at all with almost no time left: the
    // model's starting solution, if any, is the answer, with no bound.
    [[nodiscard]] milp::Result solve_until(milp::Model& model, double deadline,
                                           std::chrono::steady_clock::time_point start) const {
        if (!std::isfinite(deadline)) {
            model.set_time_limit(milp::infinity);
            return backend_.solve(model);
        }
        const double left = deadline - seconds_since(start);
        const double least = std::min(0.5, 0.05 * options_.time_limit_seconds);
        if (left >= least) {
            model.set_time_limit(left);
            return backend_.solve(model);
        }
        say("checkmate: ", left, " s left; the MILP is not started");
        milp::Result skipped;
        if (model.start() && model.is_feasible(*model.start())) {
            skipped.status = milp::Status::feasible;
            skipped.values = *model.start();
            skipped.objective = model.objective_value(skipped.values);
        }
        return skipped;
    }

    [[nodiscard]] static double gap(double time, double bound) {
        if (!std::isfinite(bound)) return 1.0;
        if (time <= 0) return 0.0;
        return std::max(0.0, (time - bound) / time);
    }

    [[nodiscard]] std::string describe_options(const detail::checkmate::Formulation& f) const {
        const CheckmateModelSize s = f.size();
        std::ostringstream o;
        o << "backend=" << backend_.name() << " passes=" << s.passes << " vars=" << s.variables << " ints=" << s.integers
          << " rows=" << s.rows << " time_limit=" << options_.time_limit_seconds;
        if (options_.lp_rounding) o << " lp_rounding";
        return o.str();
    }

    void report(const Problem& problem, Bytes budget, const detail::checkmate::Formulation& f,
                const std::optional<Baseline>& base) const {
        if (!options_.progress) return;
        const CheckmateModelSize s = f.size();
        std::ostringstream start;
        if (base) start << "; start " << base->from << " time " << base->time;
        say("checkmate[", backend_.name(), "] '", problem.name(), "' budget ", budget, ": ", s.passes, " passes, ",
            s.variables, " variables (", s.integers, " binary), ", s.rows, " rows, ", s.nonzeros, " nonzeros",
            start.str());
    }
    void print_result(const milp::Result& r) const {
        say("checkmate[", backend_.name(), "] ", milp::to_string(r.status), " objective ", r.objective, " bound ",
            r.best_bound, " in ", r.seconds, " s");
    }
    // One progress line from its parts, built only when someone listens.
    template <class... Parts>
    void say(const Parts&... parts) const {
        if (!options_.progress) return;
        std::ostringstream line;
        (line << ... << parts);
        options_.progress(line.str());
    }

    // Smallest peak over schedules of the model's passes: (peak, proven).
    [[nodiscard]] std::pair<Bytes, bool> least_peak(const Problem& problem, const detail::checkmate::Analysis& a,
                                                    std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        Formulation f(problem, a, make_layout(problem, a, pre_passes(problem)), std::nullopt);
        if (f.infeasible()) throw InvalidInput("problem '" + problem.name() + "' has no valid schedule: " + f.infeasible_reason());
        // Store-all is a valid start when it has few enough passes.
        std::optional<Bytes> start_peak;
        try {
            Schedule s = without_useless_runs(problem, store_all_reference(problem).schedule);
            if (const auto runs = place_runs(a, problem, f.layout(), s))
                if (auto x = f.assignment(*runs)) {
                    f.model().set_start(std::move(*x));
                    start_peak = simulate(problem, s).peak;
                }
        } catch (const Error&) {
        }
        milp::Model& model = f.model();
        // P is integral in units and the time tie-break is worth under half a unit: an
        // absolute gap of 0.5 proves the least peak. solve_until sets the time limit.
        model.set_parameters(milp::Parameters{milp::infinity, 0.0, 0.5});
        const milp::Result r = solve_until(model, options_.time_limit_seconds, start);
        if (options_.progress) print_result(r);
        if (!r.has_solution()) {
            if (r.status == milp::Status::infeasible)
                throw InvalidInput("problem '" + problem.name() + "' has no valid schedule of at most " +
                                   std::to_string(f.layout().T) + " passes");
            if (start_peak) return {*start_peak, false};
            throw SolverError("checkmate: the time limit ran out before the smallest feasible budget of '" +
                              problem.name() + "' was found");
        }
        // The peak of the schedule itself (at most P·scale).
        const Schedule s = f.schedule(f.runs(r.values));
        const SimulationReport rep = simulate(problem, s);
        Bytes peak = static_cast<Bytes>(std::llround(r.value(*f.peak_var()))) * a.scale;
        if (rep.valid) peak = std::min(peak, rep.peak);
        if (start_peak) peak = std::min(peak, *start_peak);
        return {peak, r.status == milp::Status::optimal};
    }

    // The smallest peak: by exact search over all schedules when the problem is small
    // enough for it to finish quickly (it is exact over every schedule, not only those of
    // the model's passes), else by the min-peak MILP.
    [[nodiscard]] std::pair<Bytes, bool> smallest_peak(const Problem& problem, const detail::checkmate::Analysis& a,
                                                       std::chrono::steady_clock::time_point start) const {
        if (options_.exhaustive_first && problem.data_count() <= 64 && a.eo_ops.size() <= 64) {
            const double left = options_.time_limit_seconds - seconds_since(start);
            ExhaustiveOptions limits;
            limits.max_states = 200'000;
            limits.time_limit_seconds = std::min(2.0, std::max(0.05, left / 4));
            try {
                return {Exhaustive(limits).smallest_budget(problem), true};
            } catch (const SolverError&) {
                // Too many states: the MILP copes with larger problems.
            }
        }
        return least_peak(problem, a, start);
    }

    [[noreturn]] void throw_infeasible(const Problem& problem, const detail::checkmate::Analysis& a, Bytes budget,
                                       std::chrono::steady_clock::time_point start, const std::string& why) const {
        std::optional<Bytes> smallest;
        std::string how;
        try {
            const auto [peak, proven] = smallest_peak(problem, a, start);
            smallest = peak;
            how = proven ? "the smallest feasible budget is " + std::to_string(peak) + " bytes"
                         : "a budget of " + std::to_string(peak) + " bytes works (the search for the smallest one ran out of time)";
        } catch (const Error& e) {
            how = std::string("the smallest feasible budget is unknown: ") + e.what();
        }
        throw Infeasible("checkmate: no schedule of '" + problem.name() + "' fits " + std::to_string(budget) +
                             " bytes (" + why + "); " + how,
                         budget, smallest);
    }

    struct Rounded {
        milp::Result lp;
        std::optional<Baseline> best;
    };

    // LP relaxation + rounding: every rounding is made into a schedule, and only those the
    // simulator finds valid and within budget are kept.
    [[nodiscard]] Rounded round_relaxation(const Problem& problem, const detail::checkmate::Analysis& a,
                                           const detail::checkmate::Formulation& f, Bytes budget, std::size_t trials,
                                           double deadline, std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        Rounded out;
        milp::Model relaxed = f.model().relaxation();
        relaxed.clear_start();
        out.lp = solve_until(relaxed, deadline, start);
        if (options_.progress) print_result(out.lp);
        if (!out.lp.has_solution()) return out;
        std::mt19937_64 rng(options_.seed);
        std::uniform_real_distribution<double> uniform(0.0, 1.0);
        static constexpr double thresholds[] = {0.5, 0.9, 0.7, 0.3, 0.1, 0.99, 0.01, 0.8, 0.6, 0.4, 0.2};
        std::vector<double> draw(a.m, 0.0);
        for (std::size_t i = 0; i < std::max<std::size_t>(trials, 1); ++i) {
            if (seconds_since(start) > deadline) break;
            const bool random = i >= std::size(thresholds);
            const double theta = random ? 0.0 : thresholds[i];
            if (random)
                for (double& u : draw) u = uniform(rng);
            const auto keep = [&](std::size_t d, double y) { return random ? y > draw[d] * 0.999 : y >= theta; };
            std::optional<Schedule> s = rounded_schedule(problem, a, f, out.lp.values, keep);
            if (!s) continue;
            *s = without_useless_runs(problem, std::move(*s));
            const SimulationReport r = simulate(problem, *s);
            if (!r.fits(budget) || (out.best && r.time >= out.best->time)) continue;
            out.best = Baseline{std::move(*s), r.time, "lp-rounding"};
        }
        return out;
    }

    [[nodiscard]] Plan solve_by_rounding(const Problem& problem, const detail::checkmate::Analysis& a,
                                         detail::checkmate::Formulation& f, Bytes budget,
                                         const std::optional<Baseline>& base,
                                         std::chrono::steady_clock::time_point start) const {
        using namespace detail::checkmate;
        report(problem, budget, f, base);
        if (f.infeasible()) throw_infeasible(problem, a, budget, start, f.infeasible_reason());
        Rounded rounded = round_relaxation(problem, a, f, budget, options_.rounding_trials, options_.time_limit_seconds, start);
        if (rounded.lp.status == milp::Status::infeasible)
            throw_infeasible(problem, a, budget, start, "even the LP relaxation has no solution");
        std::optional<Baseline> best = std::move(rounded.best);
        if (base && (!best || base->time < best->time)) best = base;
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt, describe_options(f)};
        if (!best) {
            // No rounding fits: the exact search is the only way left.
            say("checkmate: no rounding fits; solving the MILP");
            const milp::Result r = run(f.model(), start);
            if (r.status == milp::Status::infeasible) throw_infeasible(problem, a, budget, start, "the MILP has no solution");
            if (!r.has_solution())
                throw SolverError("checkmate: no LP rounding of '" + problem.name() + "' fits " + std::to_string(budget) +
                                  " bytes and the exact search ran out of time; raise the time limit or the budget");
            Schedule s = f.schedule(f.runs(r.values));
            const double time = simulate(problem, s).time;
            best = Baseline{std::move(s), time, "milp"};
            if (r.status == milp::Status::optimal) stats.status = SolveStatus::optimal;
        }
        const double bound = rounded.lp.has_solution() ? rounded.lp.objective : -milp::infinity;
        stats.gap = stats.status == SolveStatus::optimal ? 0.0 : gap(best->time, bound);
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(best->schedule), budget, std::move(stats));
    }

    // One rounding made into a schedule: exactly-once ops in the passes where the LP runs
    // them (half their mass), each preceded by computing what it reads with the writers the
    // LP prefers; after each run, data are freed unless read by the rest of the current
    // plan, kept by the rounding, final, or impossible to recompute and still needed.
    template <class Keep>
    [[nodiscard]] std::optional<Schedule> rounded_schedule(const Problem& pr, const detail::checkmate::Analysis& a,
                                                           const detail::checkmate::Formulation& f,
                                                           const std::vector<double>& x, const Keep& keep) const {
        using namespace detail::checkmate;
        const std::size_t n = a.n, m = a.m, T = f.layout().T, E = a.eo_ops.size();
        // Pass of each exactly-once op: where its cumulative LP mass reaches one half.
        std::vector<std::pair<std::size_t, std::size_t>> eo_at;  // (pass, position)
        for (std::size_t e = 0; e < E; ++e) {
            const std::size_t p = a.pos[a.eo_ops[e]];
            double mass = 0.0;
            std::size_t at = T - 1;
            for (std::size_t t = 0; t < T; ++t) {
                mass += f.run_value(x, t, p);
                if (mass >= 0.5 - 1e-9) {
                    at = t;
                    break;
                }
            }
            eo_at.emplace_back(at, p);
        }
        // Exactly-once ops in that order, fixed up so that every op follows what it needs.
        std::vector<std::size_t> seq(E);
        std::iota(seq.begin(), seq.end(), 0);
        std::sort(seq.begin(), seq.end(), [&](std::size_t i, std::size_t j) { return eo_at[i] < eo_at[j]; });
        std::vector<std::size_t> ordered;
        std::vector<char> placed(E, 0);
        while (ordered.size() < E) {
            bool progress = false;
            for (const std::size_t e : seq) {
                if (placed[e]) continue;
                bool ready = true;
                for (std::size_t q = 0; q < E && ready; ++q) ready = !a.eo_pred[e].test(q) || placed[q];
                if (!ready) continue;
                placed[e] = 1;
                ordered.push_back(e);
                progress = true;
                break;
            }
            if (!progress) return std::nullopt;
        }
        // Preferred writer of each data: most LP mass, then least time.
        std::vector<double> mass(n, 0.0);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t p = 0; p < n; ++p) mass[a.order[p]] += f.run_value(x, t, p);
        std::vector<char> live(m, 0), ran(n, 0);
        for (const DataId d : pr.initial()) live[d.index] = 1;
        Schedule s;
        std::size_t pass = 0;
        std::vector<int> uses(m, 0);  // reads still to come in the current plan
        const auto recomputable = [&](std::size_t d) {
            for (const OpId w : pr.writers(DataId{d}))
                if (!pr.op(w).exactly_once) return true;
            return false;
        };
        const auto still_needed = [&](std::size_t d) {
            for (const OpId r : pr.readers(DataId{d}))
                if (!pr.op(r).exactly_once || !ran[r.index]) return true;
            return false;
        };
        const auto tidy = [&](std::size_t p_now) {
            for (std::size_t d = 0; d < m; ++d) {
                if (!live[d] || pr.is_initial(DataId{d}) || pr.is_final(DataId{d}) || uses[d] > 0) continue;
                if (!recomputable(d) && still_needed(d)) continue;
                if (still_needed(d) && keep(d, f.liveness_after(x, d, pass, p_now))) continue;
                live[d] = 0;
                s.push_back(Step::free(DataId{d}));
            }
        };
        // Ops that make `targets` live, in topological order; nullopt when impossible.
        const auto plan_for = [&](const std::vector<DataId>& targets) -> std::optional<std::vector<std::size_t>> {
            std::vector<char> planned(n, 0), making(m, 0);
            std::vector<std::size_t> ops;
            bool ok = true;
            const auto make = [&](auto&& self, DataId d) -> void {
                if (!ok || live[d.index] || making[d.index]) return;
                making[d.index] = 1;
                std::size_t best = none;
                for (const OpId w : pr.writers(d)) {
                    if (pr.op(w).exactly_once) continue;
                    bool cyclic = false;
                    for (const DataId r : pr.op(w).reads) cyclic = cyclic || (making[r.index] && !live[r.index]);
                    if (cyclic) continue;
                    if (best == none || mass[w.index] > mass[best] + 1e-9 ||
                        (std::abs(mass[w.index] - mass[best]) <= 1e-9 && pr.op(w).time < pr.op(OpId{best}).time))
                        best = w.index;
                }
                if (best == none) {
                    ok = false;
                    return;
                }
                for (const DataId r : pr.op(OpId{best}).reads) self(self, r);
                if (!planned[best]) {
                    planned[best] = 1;
                    ops.push_back(best);
                }
            };
            for (const DataId d : targets) make(make, d);
            if (!ok) return std::nullopt;
            std::sort(ops.begin(), ops.end(), [&](std::size_t i, std::size_t j) { return a.pos[i] < a.pos[j]; });
            return ops;
        };
        const auto run_plan = [&](const std::vector<std::size_t>& ops, std::size_t target) {
            for (const std::size_t k : ops)
                for (const DataId d : pr.op(OpId{k}).reads) ++uses[d.index];
            if (target != none)
                for (const DataId d : pr.op(OpId{target}).reads) ++uses[d.index];
            std::vector<std::size_t> all = ops;
            if (target != none) all.push_back(target);
            for (const std::size_t k : all) {
                const Op& op = pr.op(OpId{k});
                for (const DataId d : op.reads)
                    if (!live[d.index]) return false;
                s.push_back(Step::run(OpId{k}));
                ran[k] = 1;
                for (const DataId d : op.writes) live[d.index] = 1;
                for (const DataId d : op.reads) --uses[d.index];
                tidy(a.pos[k]);
            }
            return true;
        };
        for (const std::size_t e : ordered) {
            pass = std::max(pass, eo_at[e].first);
            const std::size_t k = a.eo_ops[e];
            std::vector<DataId> need;
            for (const DataId d : pr.op(OpId{k}).reads)
                if (!live[d.index]) need.push_back(d);
            const auto ops = plan_for(need);
            if (!ops || !run_plan(*ops, k)) return std::nullopt;
        }
        std::vector<DataId> finals;
        for (const DataId d : pr.final_data())
            if (!live[d.index]) finals.push_back(d);
        if (!finals.empty()) {
            const auto ops = plan_for(finals);
            if (!ops || !run_plan(*ops, none)) return std::nullopt;
        }
        for (std::size_t d = 0; d < m; ++d)
            if (live[d] && !pr.is_initial(DataId{d}) && !pr.is_final(DataId{d})) s.push_back(Step::free(DataId{d}));
        return s;
    }

    CheckmateOptions options_;
    Backend backend_;
};

}  // namespace remat
