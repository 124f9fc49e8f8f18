// remat/solvers/rotor/least_memory.hpp — the first phase of a Rotor solve: the least memory
// (in units) with which every sub-chain (a, b) can be back-propagated by a persistent
// schedule (RotorNeeds, compute_needs()), with the branch of the fastest such schedule; and
// RotorChoice, the branches of the recursion that every phase names.
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains", whose branches F_all, F_ck and F∅ the min-max recursion ranges
// over; docs/design.md §4.2). The time table (rotor/table.hpp) skips every memory below a
// sub-chain's need; the expansion (rotor/expansion.hpp) turns the choices into the
// least-memory schedule when slot rounding leaves the table no plan; rotor_smallest_budget()
// is need(1, L) in bytes. O(K·L² + L³) time, L(L+1)/2 entries of 24 bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../core/bytes.hpp"
#include "chain.hpp"
#include "limits.hpp"

namespace remat::detail::rotor {

// Branch of the recursion for sub-chain (a, b): the leaf with option k (a == b), F_all
// with option k, or F_ck at a followed by F∅ up to the checkpoint a_{j-1}.
struct RotorChoice {
    enum class Kind : unsigned char { none, leaf, all, ck };
    Kind kind = Kind::none;
    std::uint32_t index = 0;  // option k, or j (validate() and the size caps keep both below 2^32)

    RotorChoice() = default;
    RotorChoice(Kind k, std::size_t i) : kind(k), index(static_cast<std::uint32_t>(i)) {}
};

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
    [[nodiscard]] std::size_t at(std::size_t a, std::size_t b) const noexcept {
        return (a - 1) * L - (a - 1) * (a - 2) / 2 + (b - a);
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
                                             const std::vector<Bytes>& col_need, const std::vector<double>& col_time) {
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
    return best;
}

[[nodiscard]] inline RotorNeeds compute_needs(const RotorUnits& u, const RotorLimits& limits) {
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
                best = rotor_need_of(u, n, a, b, col_need, col_time);
            }
            const std::size_t i = n.at(a, b);
            n.need[i] = col_need[a] = best.need;
            n.time[i] = col_time[a] = best.time;
            n.choice[i] = best.choice;
        }
    }
    return n;
}

}  // namespace remat::detail::rotor
