// remat/solvers/checkmate/analysis.hpp — what Checkmate learns about a problem before it
// chooses a number of passes: the op order, the exactly-once ops and the order the graph
// forces on them, the memory unit and a lower bound on the peak.
//
// Part of the Checkmate solver (solvers/checkmate.hpp; Jain et al., MLSys 2020, on the
// data/op graph of Rockmate, Zhao et al., ICML 2023). The order forced on exactly-once ops
// is what confines each of them to a window of passes (checkmate/layout.hpp); the lower
// bound is core/bounds.hpp's.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/bounds.hpp"
#include "../../core/problem.hpp"
#include "../../graph/topological.hpp"

namespace remat::detail::checkmate {

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

// Checkmate's op numbering (one topological order) and the exactly-once ops in it.
inline void number_ops(const Problem& p, Analysis& a) {
    a.order = graph::op_order(p);
    a.pos.assign(a.n, 0);
    for (std::size_t i = 0; i < a.n; ++i) a.pos[a.order[i]] = i;
    a.eo_index.assign(a.n, none);
    for (std::size_t k = 0; k < a.n; ++k)
        if (p.op(OpId{k}).exactly_once) {
            a.eo_index[k] = a.eo_ops.size();
            a.eo_ops.push_back(k);
        }
}

// Exactly-once ops every derivation of each op goes through (nullopt: the op can never
// run): the meet over all the ways of producing its reads, iterated to its fixpoint from
// the initial data.
inline std::vector<std::optional<Bits>> exactly_once_requirements(const Problem& p, const Analysis& a) {
    const std::size_t E = a.eo_ops.size();
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
    return req_op;
}

// The exactly-once ops each one needs before it, and how many it needs / is needed by.
inline void order_exactly_once(Analysis& a, const std::vector<std::optional<Bits>>& req_op) {
    const std::size_t E = a.eo_ops.size();
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
}

// The precedences between exactly-once ops that no third one implies: the model's
// precedence rows need only these.
inline void direct_precedences(Analysis& a) {
    const std::size_t E = a.eo_ops.size();
    for (std::size_t e2 = 0; e2 < E; ++e2)
        for (std::size_t e1 = 0; e1 < E; ++e1) {
            if (!a.eo_pred[e2].test(e1)) continue;
            bool direct = true;
            for (std::size_t e3 = 0; e3 < E && direct; ++e3)
                if (e3 != e1 && a.eo_pred[e2].test(e3) && a.eo_pred[e3].test(e1)) direct = false;
            if (direct) a.direct_prec.emplace_back(e1, e2);
        }
}

// The gcd of all sizes and overheads, so that the memory rows are exact integers.
inline Bytes memory_unit(const Problem& p) {
    Bytes g = 0;
    for (const Data& d : p.all_data()) g = std::gcd(g, d.bytes);
    for (const Op& op : p.all_ops()) g = std::gcd(g, op.overhead);
    return g > 0 ? g : 1;
}

inline Analysis analyse(const Problem& p) {
    Analysis a;
    a.n = p.op_count();
    a.m = p.data_count();
    number_ops(p, a);
    order_exactly_once(a, exactly_once_requirements(p, a));
    direct_precedences(a);
    a.scale = memory_unit(p);
    a.initial_bytes = p.initial_bytes();

    // No schedule has a smaller peak (core/bounds.hpp).
    MemoryLowerBound bound = memory_lower_bound(p);
    a.lower_bound = bound.bytes;
    a.lower_bound_reason = std::move(bound.reason);
    return a;
}

}  // namespace remat::detail::checkmate
