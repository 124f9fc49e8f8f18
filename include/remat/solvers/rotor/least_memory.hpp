// remat/solvers/rotor/least_memory.hpp — the first phase of a Rotor solve: the least memory
// (in units) with which every sub-chain (a, b) can be back-propagated by a persistent
// schedule (RotorNeeds, compute_needs()), with the branch of the fastest such schedule; with
// the release moves of a wider RotorClass, also the release branches and the other shapes of
// sub-chain of rotor/branches.hpp.
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains", whose branches F_all, F_ck and F∅ the min-max recursion ranges
// over; docs/design.md §4.2). The time table (rotor/table.hpp) skips every memory below a
// sub-chain's need; the expansion (rotor/expansion.hpp) turns the choices into the
// least-memory schedule when slot rounding leaves the table no plan; rotor_smallest_budget()
// is need(1, L) in bytes. O(K·L² + L³) time, L(L+1)/2 entries of 24 bytes.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../core/bytes.hpp"
#include "branches.hpp"
#include "chain.hpp"
#include "limits.hpp"

namespace remat::detail::rotor {

// Least memory (in units) with which sub-chain (a, b) can be back-propagated by a
// persistent schedule, for every (a, b); with the fastest such schedule's choice as a
// tie-break. Exact in the model: Opt(a, b, m) < ∞ ⇔ m ≥ need(a, b), because every branch's
// constraints are thresholds on m and the sub-chains' needs compose by max. Stored as a
// triangle, row by row (row a holds b = a..L), so that a row is contiguous.
struct RotorNeeds {
    std::size_t L = 0;
    std::vector<Bytes> need;
    std::vector<double> time;     // time of the chosen least-memory schedule
    std::vector<RotorChoice> choice;
    // With release moves: the same for the other shapes of rotor/branches.hpp, table by
    // table (table_of), at shape_at() (K = the most options of any stage; entries of options
    // a stage lacks stay unused).
    static constexpr std::size_t shape_tables = 5;  // the shapes but plain-closed (table_of)
    std::size_t K = 0;
    std::array<std::vector<Bytes>, shape_tables> shape_need;
    std::array<std::vector<double>, shape_tables> shape_time;
    std::array<std::vector<RotorChoice>, shape_tables> shape_choice;
    [[nodiscard]] std::size_t at(std::size_t a, std::size_t b) const noexcept {
        return (a - 1) * L - (a - 1) * (a - 2) / 2 + (b - a);
    }
    // The table of a shape, -1 for plain-closed (need, time, choice): 0 plain-open,
    // 1 plain-partial, 2 turn-closed, 3 turn-open, 4 turn-partial.
    [[nodiscard]] static int table_of(const RotorShape& s) noexcept {
        using End = RotorShape::End;
        const int end = s.end == End::closed ? 0 : s.end == End::open ? 1 : 2;
        return s.turn ? 2 + end : end - 1;
    }
    // Entries per sub-chain of each table (partial ends come with early moves only).
    [[nodiscard]] static std::size_t table_rows(std::size_t table, std::size_t K, const RotorMoves& moves) noexcept {
        if (!moves.release) return 0;
        if (table == 1 || table == 4) return moves.early ? (table == 1 ? 1 : K) : 0;
        return table == 3 ? K * K : K;
    }
    // Where shape s of sub-chain `pair` lies within its table.
    [[nodiscard]] static std::size_t within(const RotorShape& s, std::size_t pair, std::size_t K) noexcept {
        switch (table_of(s)) {
            case 0: return pair * K + s.option;
            case 1: return pair;
            case 3: return (pair * K + s.pending) * K + s.option;
            default: return pair * K + s.pending;
        }
    }
    [[nodiscard]] std::size_t shape_at(const RotorShape& s, std::size_t a, std::size_t c) const noexcept {
        return within(s, at(a, c), K);
    }
    [[nodiscard]] Bytes need_of(const RotorSubChain& s) const noexcept {
        const int t = table_of(s.shape);
        return t < 0 ? need[at(s.a, s.c)] : shape_need[static_cast<std::size_t>(t)][shape_at(s.shape, s.a, s.c)];
    }
    [[nodiscard]] double time_of(const RotorSubChain& s) const noexcept {
        const int t = table_of(s.shape);
        return t < 0 ? time[at(s.a, s.c)] : shape_time[static_cast<std::size_t>(t)][shape_at(s.shape, s.a, s.c)];
    }
    [[nodiscard]] RotorChoice choice_of(const RotorShape& shape, std::size_t a, std::size_t c) const noexcept {
        const int t = table_of(shape);
        return t < 0 ? choice[at(a, c)] : shape_choice[static_cast<std::size_t>(t)][shape_at(shape, a, c)];
    }
    // A branch's least memory: its own peak, or a sub-chain's need beside what it keeps.
    [[nodiscard]] Bytes need_of(const RotorBranch& br) const noexcept {
        Bytes n = br.floor;
        for (std::size_t i = 0; i < br.sub_count; ++i) n = std::max(n, need_of(br.subs[i]) + br.subs[i].offset);
        return n;
    }
    [[nodiscard]] double time_of(const RotorBranch& br) const noexcept {
        double t = br.time;
        for (std::size_t i = 0; i < br.sub_count; ++i) t += time_of(br.subs[i]);
        return t;
    }
};

struct RotorNeed {
    Bytes need = std::numeric_limits<Bytes>::max();
    double time = std::numeric_limits<double>::infinity();
    RotorChoice choice;
    void consider(Bytes n, double t, RotorChoice c) noexcept {
        if (n < need || (n == need && t < time)) {
            need = n;
            time = t;
            choice = c;
        }
    }
};

// need(a, b) for a < b from the sub-chains already known: row a of `n` (b' < b) and column b
// (`col_need[j]`, `col_time[j]` for j in (a, b]), both read contiguously.
[[nodiscard]] inline RotorNeed rotor_need_of(const RotorUnits& u, const RotorNeeds& n, std::size_t a, std::size_t b,
                                             const std::vector<Bytes>& col_need, const std::vector<double>& col_time,
                                             const RotorMoves& moves) {
    RotorNeed best;
    const auto& opts = u.options[a];
    const Bytes up = u.upper(b);
    const Bytes xa = u.x[a - 1];
    for (std::size_t k = 0; k < opts.size(); ++k)
        best.consider(std::max({opts[k].fwd + up, opts[k].bwd, col_need[a + 1] + xa + opts[k].extra}),
                      opts[k].time + col_time[a + 1], {RotorChoice::Kind::all, k});
    const Bytes* row_need = n.need.data() + n.at(a, a);  // row_need[c - a] = need(a, c)
    const double* row_time = n.time.data() + n.at(a, a);
    Bytes fwd = 0;
    double pre = 0.0;
    for (std::size_t j = a + 1; j <= b; ++j) {
        const std::size_t l = j - 1;
        fwd = std::max(fwd, u.nograd[l] + (l > a ? xa : 0));
        pre += u.nograd_time[l];
        best.consider(std::max({fwd + up, col_need[j] + xa, row_need[j - 1 - a]}),
                      pre + col_time[j] + row_time[j - 1 - a], {RotorChoice::Kind::ck, j});
    }
    if (moves.release)
        for_each_branch(u, moves, RotorShape::plain(), a, b, std::numeric_limits<Bytes>::max() / 4, true,
                        [&](const RotorBranch& br) { best.consider(n.need_of(br), n.time_of(br), br.choice); });
    return best;
}

// Every shape of rotor/branches.hpp but plain-closed for sub-chain (a, c), in the order they
// read each other: the plain ones (open, partial), then the turn ones (closed, open, partial),
// whose F∅ run up to a_c reads the plain shape of (a, c) with the same end.
template <class Visit>
void for_each_shape(const RotorUnits& u, const RotorMoves& moves, std::size_t a, std::size_t c, Visit&& visit) {
    using End = RotorShape::End;
    const auto option = [](std::size_t k) { return static_cast<std::uint32_t>(k); };
    for (std::size_t k = 0; k < u.options[a].size(); ++k) visit(RotorShape{false, End::open, 0, option(k)});
    if (moves.early && shape_exists(u, RotorShape{false, End::partial, 0, 0}, a, c))
        visit(RotorShape{false, End::partial, 0, 0});
    if (c == u.L) return;
    for (std::size_t p = 0; p < u.options[c + 1].size(); ++p) {
        visit(RotorShape{true, End::closed, option(p), 0});
        for (std::size_t k = 0; k < u.options[a].size(); ++k) visit(RotorShape{true, End::open, option(p), option(k)});
        if (moves.early) visit(RotorShape{true, End::partial, option(p), 0});
    }
}

inline void compute_shape_needs(const RotorUnits& u, const RotorMoves& moves, RotorNeeds& n, std::size_t a,
                                std::size_t c) {
    for_each_shape(u, moves, a, c, [&](const RotorShape& shape) {
        RotorNeed best;
        for_each_branch(u, moves, shape, a, c, std::numeric_limits<Bytes>::max() / 4, false,
                        [&](const RotorBranch& br) { best.consider(n.need_of(br), n.time_of(br), br.choice); });
        const auto t = static_cast<std::size_t>(RotorNeeds::table_of(shape));
        const std::size_t i = n.shape_at(shape, a, c);
        n.shape_need[t][i] = best.need;
        n.shape_time[t][i] = best.time;
        n.shape_choice[t][i] = best.choice;
    });
}

[[nodiscard]] inline RotorNeeds compute_needs(const RotorUnits& u, const RotorLimits& limits,
                                              const RotorMoves& moves = {}) {
    const std::size_t L = u.L;
    const std::size_t pairs = L * (L + 1) / 2;
    limits.check_memory(pairs, sizeof(Bytes) + sizeof(double) + sizeof(RotorChoice), "a least-memory table",
                        "raise max_table_mib");
    limits.check_work(static_cast<double>(L) * static_cast<double>(L) * static_cast<double>(L) / 6.0,
                      "the least-memory precomputation");
    RotorNeeds n;
    n.L = L;
    n.need.assign(pairs, std::numeric_limits<Bytes>::max());
    n.time.assign(pairs, std::numeric_limits<double>::infinity());
    n.choice.assign(pairs, {});
    if (moves.release) {
        for (std::size_t l = 1; l <= L; ++l) n.K = std::max(n.K, u.options[l].size());
        for (std::size_t t = 0; t < n.shape_need.size(); ++t) {
            const std::size_t rows = pairs * RotorNeeds::table_rows(t, n.K, moves);
            limits.check_memory(rows, sizeof(Bytes) + sizeof(double) + sizeof(RotorChoice),
                                "a least-memory table of sub-chains that release checkpoints", "raise max_table_mib");
            n.shape_need[t].assign(rows, std::numeric_limits<Bytes>::max());
            n.shape_time[t].assign(rows, std::numeric_limits<double>::infinity());
            n.shape_choice[t].assign(rows, {});
        }
    }
    std::vector<Bytes> col_need(L + 2, 0);  // column b being computed: (j, b) for j > a
    std::vector<double> col_time(L + 2, 0.0);
    for (std::size_t b = 1; b <= L; ++b) {
        limits.check_time("computing the least memory of sub-chains", b - 1, L);
        for (std::size_t a = b; a >= 1; --a) {
            RotorNeed best;
            if (a == b) {
                const auto& opts = u.options[a];
                for (std::size_t k = 0; k < opts.size(); ++k)
                    best.consider(opts[k].leaf, opts[k].leaf_time, {RotorChoice::Kind::leaf, k});
            } else {
                best = rotor_need_of(u, n, a, b, col_need, col_time, moves);
            }
            const std::size_t i = n.at(a, b);
            n.need[i] = col_need[a] = best.need;
            n.time[i] = col_time[a] = best.time;
            n.choice[i] = best.choice;
            if (moves.release) compute_shape_needs(u, moves, n, a, b);
        }
    }
    return n;
}

}  // namespace remat::detail::rotor
