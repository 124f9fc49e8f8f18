// remat/solvers/rotor/branches.hpp — the branches of the chain DP that every phase names
// (RotorChoice), and the sub-chain shapes that take it beyond persistent schedules
// (RotorClass, the RotorRelease solver), their branches enumerated
// once (RotorBranch) for the least-memory phase (rotor/least_memory.hpp), the time table
// (rotor/table.hpp) and its choices, and the expansion (rotor/expansion.hpp).
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains", branches F_all, F_ck and F∅; docs/design.md §4.2).
//
// Persistent schedules keep a checkpoint until everything above it is back-propagated. The
// optimum over all schedules often frees it as soon as nothing above needs it any more: right
// after the stage above it ran forward with grad, and recomputes it from an earlier checkpoint
// before that stage's backward. Four shapes of sub-chain (a, c) express this; each starts
// with its input a_{a-1} live and one of two things above it:
//   plain  g_c waits (nothing when c = L: the loss comes);
//   turn_k stage c+1's saved data for option k (a_{c+1} included) and g_{c+1} wait, and
//          a_c does not exist: stage c+1's backward (the turn) runs, in place of the loss,
//          once the stages up to c ran forward again;
// and ends in one of two ways:
//   closed    back-propagated to g_{a-1}, a_{a-1} still live (Rotor's only shape: plain, closed);
//   open_k    a_{a-1} freed right after stage a's forward with grad (option k), whose
//             backward is left pending: stage a's saved data and g_a are live. The caller
//             frees a_{a-1} afterwards anyway, and finishes stage a in a turn shape;
//   partial   a_{a-1} freed once a_a is computed for the last time; only g_a is live, and
//             the caller redoes stage a from an earlier checkpoint.
// Every shape has the branches of the recursion, with the turn where the loss would be:
//   leaf/all(k)  stage a with grad, then (a+1, c) in the same start, closed, then, when
//                closed, stage a's backward; when open, a_{a-1} is freed after the forward
//                and the backward is left pending (leaf when a = c);
//   first        (partial end) stage a without grad, free a_{a-1}, then (a+1, c) in the
//                same start, closed (a plain (a, a) only frees a_{a-1});
//   ck(j)        F∅ a..j-1, then (j, c) in the same start, closed, free a_{j-1}, then
//                (a, j-1) plain with the same end; with a turn start, j = c + 1 runs the
//                turn after F∅ reaches a_c itself;
//   release(j,k) F∅ a..j-1, then (j, c) in the same start, open_k (a_{j-1} freed after
//                stage j's forward), then (a, j-1) in turn_k with the same end: a_{j-1} is
//                recomputed from a_{a-1} for stage j's backward;
//   ck_partial(j) F∅ a..j-1, then (j, c) in the same start, partial (a_{j-1} freed once a_j
//                is computed for the last time), then (a, j) plain with the same end.
// Memory is counted as in the DP (rotor/chain.hpp), every term one moment of the schedule:
// a branch needs max(floor, need(sub) + offset) over its sub-chains, where the floor is the
// peak of its own actions and the offset what stays live beside a sub-chain. Time is the
// branch's own actions plus its sub-chains'; a stage's backward is counted where its forward
// with grad runs; a partial end's stage a is counted by the caller, who redoes it. Only a
// stage whose forward keeps its input (saved ≥ out) is left open: the model keeps the input
// of a forward that frees it anyway. Open and partial ends free the sub-chain's input, so they
// never occur at a = 1 (a_0 belongs to the caller): only a branch's inner sub-chains have them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "../../core/bytes.hpp"
#include "chain.hpp"

namespace remat::detail::rotor {

// Branch of the recursion for sub-chain (a, b): the leaf with option k (a == b), F_all
// with option k, F_ck at a followed by F∅ up to the checkpoint a_{j-1}; and the branches of
// the other shapes (see above): release at j with option k of stage j, ck_partial at j, and
// first (a partial end's F∅ of stage a).
struct RotorChoice {
    enum class Kind : unsigned char { none, leaf, all, ck, release, ck_partial, first };
    Kind kind = Kind::none;
    std::uint32_t index = 0;   // option k, or j (validate() and the size caps keep both below 2^32)
    std::uint32_t option = 0;  // the release branch's option k of stage j

    RotorChoice() = default;
    RotorChoice(Kind k, std::size_t i, std::size_t o = 0)
        : kind(k), index(static_cast<std::uint32_t>(i)), option(static_cast<std::uint32_t>(o)) {}
};

// The shape of a sub-chain (see above): a turn start waits for stage c+1's backward with
// option `pending`; an open end leaves stage a's backward with option `option` pending.
struct RotorShape {
    enum class End : unsigned char { closed, open, partial };
    bool turn = false;
    End end = End::closed;
    std::uint32_t pending = 0;
    std::uint32_t option = 0;

    [[nodiscard]] static RotorShape plain() noexcept { return {}; }
    [[nodiscard]] RotorShape ending(End e, std::size_t k = 0) const noexcept {
        return {turn, e, pending, static_cast<std::uint32_t>(k)};
    }
    [[nodiscard]] RotorShape starting(bool turn_start, std::size_t p = 0) const noexcept {
        return {turn_start, end, static_cast<std::uint32_t>(p), option};
    }
    friend bool operator==(const RotorShape&, const RotorShape&) = default;
};

// A sub-chain a branch recurses into, with the memory beside it.
struct RotorSubChain {
    RotorShape shape;
    std::size_t a = 0, c = 0;
    Bytes offset = 0;
};

// One branch: its choice, the peak of its own actions (floor), their time (and the stage
// whose option it runs, whose least leaf time the table's excess subtracts: 0 for none), and
// up to two sub-chains.
struct RotorBranch {
    RotorChoice choice;
    Bytes floor = 0;
    double time = 0.0;
    std::size_t stage = 0;
    std::array<RotorSubChain, 2> subs{};
    std::size_t sub_count = 0;

    void add(RotorSubChain s) noexcept { subs[sub_count++] = s; }
};

// Whether sub-chain (a, c) exists in `shape`: a turn start needs a stage c+1; a partial end
// of a plain (a, a) frees its input and hands g_a on, which needs a < L.
[[nodiscard]] inline bool shape_exists(const RotorUnits& u, const RotorShape& shape, std::size_t a,
                                       std::size_t c) noexcept {
    if (shape.turn && c == u.L) return false;
    return !(shape.end == RotorShape::End::partial && !shape.turn && a == c && c == u.L);
}

namespace detail_branches {

// Stage a first: with grad (leaf/all) for a closed or open end, without grad for a partial one.
template <class Visit>
void first_stage_branches(const RotorUnits& u, const RotorShape& shape, std::size_t a, std::size_t c, Bytes up,
                          Bytes turn, Visit&& visit) {
    using End = RotorShape::End;
    const Bytes xa = u.x[a - 1];
    const bool last = a == c;
    const RotorShape closed = shape.ending(End::closed);
    if (shape.end == End::partial) {
        RotorBranch br{{RotorChoice::Kind::first, a}, u.nograd[a] + up, u.nograd_time[a], 0, {}, 0};
        if (!last) br.add({closed, a + 1, c, 0});
        else if (shape.turn) br.floor = std::max(br.floor, turn);
        else br = RotorBranch{{RotorChoice::Kind::first, a}, xa + up, 0.0, 0, {}, 0};  // frees a_{a-1} only
        visit(br);
        return;
    }
    const bool open = shape.end == End::open;
    for (std::size_t k = 0; k < u.options[a].size(); ++k) {
        if (open && k != shape.option) continue;
        const RotorUnits::Option& o = u.options[a][k];
        if (open && o.extra < 0) continue;
        RotorBranch br{{last ? RotorChoice::Kind::leaf : RotorChoice::Kind::all, k},
                       o.fwd + up,
                       last && !shape.turn ? o.leaf_time : o.time,
                       a,
                       {},
                       0};
        const Bytes beside = (open ? 0 : xa) + o.extra;  // a_{a-1} is freed when open
        if (!open) br.floor = std::max(br.floor, o.bwd);
        if (!last) br.add({closed, a + 1, c, beside});
        else if (shape.turn) br.floor = std::max(br.floor, beside + turn);
        else if (c == u.L) br.floor = std::max(br.floor, beside + o.saved - o.extra + u.y[c] + u.loss_overhead);
        visit(br);
    }
}

}  // namespace detail_branches

// The branches of sub-chain (a, c) in `shape` that `moves` allow, whose F∅ runs fit within
// `cap`. With `beyond_rotor` (plain, closed, whose other branches Rotor's own kernels add),
// only the release and ck_partial branches. Without early moves an open end has its first
// stage only: the release branch as F∅, stage j with grad, a_{j-1} freed, the part above.
template <class Visit>
void for_each_branch(const RotorUnits& u, const RotorMoves& moves, const RotorShape& shape, std::size_t a,
                     std::size_t c, Bytes cap, bool beyond_rotor, Visit&& visit) {
    using End = RotorShape::End;
    const Bytes xa = u.x[a - 1];
    // Above the sub-chain while its forwards run; and the turn's peak (a_c included).
    const Bytes up = shape.turn ? u.options[c + 1][shape.pending].saved + u.y[c + 1] : u.upper(c);
    const Bytes turn = shape.turn ? u.options[c + 1][shape.pending].bwd : 0;
    const RotorShape closed = shape.ending(End::closed);
    const RotorShape plain_end = shape.starting(false);
    if (!beyond_rotor) detail_branches::first_stage_branches(u, shape, a, c, up, turn, visit);
    if (!moves.early && shape.end == End::open) return;
    Bytes fwd = 0;
    double pre = 0.0;
    for (std::size_t j = a + 1; j <= c + (shape.turn ? 1 : 0); ++j) {
        const std::size_t l = j - 1;
        fwd = std::max(fwd, u.nograd[l] + (l > a ? xa : 0));
        pre += u.nograd_time[l];
        if (fwd + up > cap) return;  // longer F∅ runs only need more memory
        if (!beyond_rotor) {
            RotorBranch ck{{RotorChoice::Kind::ck, j}, fwd + up, pre, 0, {}, 0};
            if (j <= c) ck.add({closed, j, c, xa});
            else ck.floor = std::max(ck.floor, xa + turn);
            ck.add({plain_end, a, j - 1, 0});
            visit(ck);
        }
        if (j > c) break;
        for (std::size_t k = 0; k < u.options[j].size(); ++k) {
            if (u.options[j][k].extra < 0) continue;
            RotorBranch br{{RotorChoice::Kind::release, j, k}, fwd + up, pre, 0, {}, 0};
            br.add({shape.ending(End::open, k), j, c, xa});
            br.add({plain_end.starting(true, k), a, j - 1, 0});
            visit(br);
        }
        if (!moves.early || (j == c && !shape.turn)) continue;  // (a, c) plain again: itself
        RotorBranch partial{{RotorChoice::Kind::ck_partial, j}, fwd + up, pre, 0, {}, 0};
        partial.add({shape.ending(End::partial), j, c, xa});
        partial.add({plain_end, a, j, 0});
        visit(partial);
    }
}

}  // namespace remat::detail::rotor
