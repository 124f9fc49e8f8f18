// remat/solvers/rotor/table.hpp — the second phase of a Rotor solve: the DP's time table
// (RotorTable), for every sub-chain (a, b) and every memory m = 0..M the least time of a
// persistent schedule, filled column by column by two vectorised kernels, and the branch
// that realises each entry (RotorTable::choose, read by rotor/expansion.hpp).
//
// Part of the Rotor solver (solvers/rotor.hpp): the recursion Opt[m][a][b] of Beaumont et
// al. 2019, "Optimal checkpointing for heterogeneous chains", with the K options per stage
// of Rockmate (Zhao et al., ICML 2023) in its F_all branch (docs/design.md §4.2). It works
// on the chain in units (rotor/chain.hpp), skips memories below each sub-chain's need
// (rotor/least_memory.hpp) and stops at the limits of rotor/limits.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../core/progress.hpp"
#include "../../core/timing.hpp"
#include "branches.hpp"
#include "chain.hpp"
#include "least_memory.hpp"
#include "limits.hpp"

namespace remat::detail::rotor {

// The DP's hot loops. Rows hold, for every memory m, the least time of a sub-chain minus
// its lower bound (below), in single precision: half the memory traffic of doubles, which
// is what bounds this DP; times are compared to ~1e-7 of the recomputation time and every
// reported time is recomputed exactly.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define REMAT_ROTOR_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define REMAT_ROTOR_KERNEL
#endif

// row[m] = min(row[m], c + src[m]) for m in [lo, hi] (src already shifted).
REMAT_ROTOR_KERNEL inline void rotor_relax1(float* row, const float* src, float c, std::size_t lo,
                                            std::size_t hi) noexcept {
    for (std::size_t m = lo; m <= hi; ++m) {
        const float v = c + src[m];
        row[m] = v < row[m] ? v : row[m];
    }
}

// row[m] = min(row[m], c + s1[m] + s2[m]) for m in [lo, hi] (s1 already shifted).
REMAT_ROTOR_KERNEL inline void rotor_relax2(float* row, const float* s1, const float* s2, float c, std::size_t lo,
                                            std::size_t hi) noexcept {
    for (std::size_t m = lo; m <= hi; ++m) {
        const float v = c + s1[m] + s2[m];
        row[m] = v < row[m] ? v : row[m];
    }
}

#undef REMAT_ROTOR_KERNEL

// The time table of the DP: for every sub-chain (a, b) and memory m = 0..M, the least
// time of a persistent schedule, stored as its excess over the lower bound
// T(a, b) = Σ_{l=a..b} min_k (fwd + bwd) (+ the loss when b = L), which every schedule
// pays. The recursion is additive in T, so excesses follow the same recursion with
// constants pre_j (F∅ run) and time_k − t_a (option k). One row of M+1 floats per
// sub-chain, column by column (all a for b = 1, then b = 2, ...).
class RotorTable {
public:
    RotorTable(const RotorUnits& u, const RotorNeeds& needs, std::size_t M, const RotorOptions& options,
               const RotorLimits& limits)
        : u_(u), needs_(needs), L_(u.L), M_(M), width_(M + 1), moves_(moves_of(options.schedule_class, u.L)),
          K_(moves_.release ? needs.K : 0) {
        check_size(L_, width_, limits, K_, moves_);
        least_.assign(L_ + 1, 0.0);
        double total = 0.0;  // every schedule's time is at most L + 1 times this
        for (std::size_t l = 1; l <= L_; ++l) {
            double t = std::numeric_limits<double>::infinity(), slowest = 0.0;
            for (const auto& o : u_.options[l]) {
                t = std::min(t, o.leaf_time);
                slowest = std::max(slowest, o.leaf_time);
            }
            least_[l] = t;  // leaf_time = fwd + bwd, plus the loss for the last stage
            total += slowest + u_.nograd_time[l];
        }
        // Excesses reach (L + 1) · total at most; scaled down when a float could overflow.
        if (total * static_cast<double>(L_ + 1) > 1e30) scale_ = 1.0 / total;
        const std::size_t pairs = L_ * (L_ + 1) / 2;
        std::size_t base = pairs;
        for (std::size_t t = 0; t < shape_base_.size(); ++t) {
            shape_base_[t] = base;
            base += pairs * RotorNeeds::table_rows(t, K_, moves_);
        }
        table_.assign(pairs * rows_per_pair(K_, moves_) * width_, std::numeric_limits<float>::infinity());
        fill(options, limits);
    }

    /// Rows per sub-chain: one, and with release moves (K = the most options of a stage)
    /// those of the other shapes of rotor/branches.hpp.
    [[nodiscard]] static std::size_t rows_per_pair(std::size_t K, const RotorMoves& moves) noexcept {
        std::size_t rows = 1;
        for (std::size_t t = 0; t < RotorNeeds::shape_tables; ++t) rows += RotorNeeds::table_rows(t, K, moves);
        return rows;
    }

    /// Throws TooLarge when the table of L stages and `width` memory values exceeds the cap
    /// (K and moves as for rows_per_pair).
    static void check_size(std::size_t L, std::size_t width, const RotorLimits& limits, std::size_t K = 0,
                           const RotorMoves& moves = {}) {
        const std::size_t pairs = L * (L + 1) / 2 * rows_per_pair(K, moves);
        const std::size_t cells = limits.max_table_mib * (std::size_t{1} << 20) / sizeof(float);
        const std::size_t fitting = cells / pairs;  // widths that fit
        limits.check_memory(pairs * width, sizeof(float),
                            "a time table of " + std::to_string(width) + " memory values per sub-chain",
                            fitting >= 2 ? "use at most " + std::to_string(fitting - 1) +
                                               " slots (rotor:SLOTS), a larger slot_bytes, or raise max_table_mib"
                                         : std::string("use a larger slot_bytes or raise max_table_mib"));
    }

    [[nodiscard]] const float* row(std::size_t a, std::size_t b) const noexcept {
        return table_.data() + (b * (b - 1) / 2 + (a - 1)) * width_;
    }
    /// Least time of sub-chain (a, b) at memory m minus its lower bound (∞ when none fits).
    [[nodiscard]] float excess(std::size_t a, std::size_t b, std::size_t m) const noexcept { return row(a, b)[m]; }

    // The branch that realises the table entry (a, b, m): the candidates in the DP's
    // arithmetic, first strict minimum (the table holds the minimum, whatever the order).
    [[nodiscard]] RotorChoice choose(std::size_t a, std::size_t b, std::size_t m) const {
        RotorChoice choice;
        float best = std::numeric_limits<float>::infinity();
        const auto& opts = u_.options[a];
        const auto mm = static_cast<Bytes>(m);
        if (a == b) {
            for (std::size_t k = 0; k < opts.size(); ++k) {
                const float v = leaf_constant(a, k);
                if (opts[k].leaf <= mm && v < best) {
                    best = v;
                    choice = {RotorChoice::Kind::leaf, k};
                }
            }
            return choice;
        }
        const Bytes sub_need = needs_.need[needs_.at(a + 1, b)];
        for (std::size_t k = 0; k < opts.size(); ++k) {
            const Bytes off = u_.x[a - 1] + opts[k].extra;
            if (std::max({opts[k].fwd + u_.upper(b), opts[k].bwd, sub_need + off}) > mm) continue;
            const float v = all_constant(a, k) + row(a + 1, b)[m - static_cast<std::size_t>(off)];
            if (v < best) {
                best = v;
                choice = {RotorChoice::Kind::all, k};
            }
        }
        Bytes fwd = 0;
        double pre = 0.0;
        const Bytes off = u_.x[a - 1];
        for (std::size_t j = a + 1; j <= b; ++j) {
            const std::size_t l = j - 1;
            fwd = std::max(fwd, u_.nograd[l] + (l > a ? u_.x[a - 1] : 0));
            pre += u_.nograd_time[l];
            if (fwd + u_.upper(b) > mm) break;
            if (std::max(needs_.need[needs_.at(j, b)] + off, needs_.need[needs_.at(a, j - 1)]) > mm) continue;
            const float v = static_cast<float>(pre * scale_) + row(j, b)[m - static_cast<std::size_t>(off)] + row(a, j - 1)[m];
            if (v < best) {
                best = v;
                choice = {RotorChoice::Kind::ck, j};
            }
        }
        if (moves_.release) choose_branch(RotorShape::plain(), a, b, m, true, best, choice);
        return choice;
    }

    /// The branch that realises sub-chain (a, c) of another shape (rotor/branches.hpp) at memory m.
    [[nodiscard]] RotorChoice choose(const RotorShape& shape, std::size_t a, std::size_t c, std::size_t m) const {
        if (RotorNeeds::table_of(shape) < 0) return choose(a, c, m);
        RotorChoice choice;
        float best = std::numeric_limits<float>::infinity();
        choose_branch(shape, a, c, m, false, best, choice);
        return choice;
    }

private:
    // The enumerated branches (for_each_branch) that beat `best` at memory m: the first
    // strict minimum.
    void choose_branch(const RotorShape& shape, std::size_t a, std::size_t c, std::size_t m, bool beyond_rotor,
                       float& best, RotorChoice& choice) const {
        for_each_branch(u_, moves_, shape, a, c, static_cast<Bytes>(m), beyond_rotor, [&](const RotorBranch& br) {
            if (const float v = branch_value(br, m); v < best) {
                best = v;
                choice = br.choice;
            }
        });
    }

    // Rows of the other shapes (rotor/branches.hpp) follow the plain rows, table by table.
    [[nodiscard]] std::size_t shape_offset(const RotorShape& shape, std::size_t a, std::size_t c) const noexcept {
        const auto t = static_cast<std::size_t>(RotorNeeds::table_of(shape));
        const std::size_t pair = c * (c - 1) / 2 + (a - 1);
        return (shape_base_[t] + RotorNeeds::within(shape, pair, K_)) * width_;
    }
    [[nodiscard]] const float* sub_row(const RotorSubChain& s) const noexcept {
        return RotorNeeds::table_of(s.shape) < 0 ? row(s.a, s.c) : table_.data() + shape_offset(s.shape, s.a, s.c);
    }
    // A branch's own time as excess: minus the least leaf time of the stage whose option it runs.
    [[nodiscard]] float branch_constant(const RotorBranch& br) const noexcept {
        return static_cast<float>((br.time - (br.stage != 0 ? least_[br.stage] : 0.0)) * scale_);
    }
    // The branch's time at memory m (∞ when it does not fit), in relax's arithmetic.
    [[nodiscard]] float branch_value(const RotorBranch& br, std::size_t m) const noexcept {
        if (needs_.need_of(br) > static_cast<Bytes>(m)) return std::numeric_limits<float>::infinity();
        float v = branch_constant(br);
        for (std::size_t i = 0; i < br.sub_count; ++i)
            v += sub_row(br.subs[i])[m - static_cast<std::size_t>(br.subs[i].offset)];
        return v;
    }
    // Adds a branch to a row for every memory it fits, where it can improve the row (see
    // improvable()).
    void relax_branch(float* out, const RotorBranch& br, Bytes M) const noexcept {
        const Bytes need = needs_.need_of(br);
        if (need > M) return;
        const auto lo = static_cast<std::size_t>(std::max<Bytes>(need, 0));
        const auto hi = static_cast<std::size_t>(M);
        const float c = branch_constant(br);
        const auto shifted = [&](std::size_t i) { return sub_row(br.subs[i]) - br.subs[i].offset; };
        if (br.sub_count == 2) {
            const float* s1 = shifted(0);
            const float* s2 = shifted(1);
            const std::size_t end = improvable(out, c + s1[hi] + s2[hi], lo, hi);
            if (end > lo) rotor_relax2(out, s1, s2, c, lo, end - 1);
        } else if (br.sub_count == 1) {
            const float* s1 = shifted(0);
            const std::size_t end = improvable(out, c + s1[hi], lo, hi);
            if (end > lo) rotor_relax1(out, s1, c, lo, end - 1);
        } else {
            for (std::size_t m = lo; m <= hi; ++m) out[m] = c < out[m] ? c : out[m];
        }
    }
    // Rows fall as m grows, so a candidate built from them never drops below its value at
    // the top (`floor`); it can only improve the part of `out` still above that, a prefix
    // [lo, end) since `out` falls too. Rounding is monotone, so this holds in floats.
    [[nodiscard]] static std::size_t improvable(const float* out, float floor, std::size_t lo, std::size_t hi) noexcept {
        std::size_t first = lo, last = hi + 1;
        while (first < last) {
            const std::size_t mid = first + (last - first) / 2;
            if (out[mid] <= floor) last = mid;
            else first = mid + 1;
        }
        return first;
    }
    [[nodiscard]] float* mutable_row(std::size_t a, std::size_t b) noexcept {
        return table_.data() + (b * (b - 1) / 2 + (a - 1)) * width_;
    }
    [[nodiscard]] float leaf_constant(std::size_t a, std::size_t k) const noexcept {
        return static_cast<float>((u_.options[a][k].leaf_time - least_[a]) * scale_);
    }
    [[nodiscard]] float all_constant(std::size_t a, std::size_t k) const noexcept {
        return static_cast<float>((u_.options[a][k].time - least_[a]) * scale_);
    }

    void fill(const RotorOptions& options, const RotorLimits& limits) {
        const auto M = static_cast<Bytes>(M_);
        const auto elapsed = [&] { return seconds_since(limits.start); };
        // Columns in blocks: row (a, c) is read by every (a, b) with b > c, so a block of
        // columns reuses it from cache; within a block, a descends and b ascends, which
        // keeps every dependency ((a+1, b), (j, b) for j > a, (a, c) for c < b) computed first.
        constexpr std::size_t block = 8;
        for (std::size_t b0 = 1; b0 <= L_; b0 += block) {
            limits.check_time("filling the time table", b0 - 1, L_);
            report_progress(options.progress, "rotor: columns " + std::to_string(b0) + ".." + std::to_string(L_) + " after " +
                                                   std::to_string(elapsed()) + " s");
            const std::size_t b1 = std::min(L_, b0 + block - 1);
            for (std::size_t a = b1; a >= 1; --a)
                for (std::size_t b = std::max(a, b0); b <= b1; ++b) {
                    fill_row(a, b, M);
                    if (moves_.release)
                        for_each_shape(u_, moves_, a, b,
                                       [&](const RotorShape& shape) { fill_shape_row(shape, a, b, M); });
                }
        }
    }

    void fill_row(std::size_t a, std::size_t b, Bytes M) {
        if (needs_.need[needs_.at(a, b)] > M) return;  // no m works: the row stays infinite
        float* out = mutable_row(a, b);
        const auto& opts = u_.options[a];
        const auto hi = static_cast<std::size_t>(M);
        if (a == b) {
            for (std::size_t k = 0; k < opts.size(); ++k) {
                if (opts[k].leaf > M) continue;
                const float v = leaf_constant(a, k);
                for (auto m = static_cast<std::size_t>(std::max<Bytes>(opts[k].leaf, 0)); m <= hi; ++m)
                    out[m] = v < out[m] ? v : out[m];
            }
            return;
        }
        const Bytes sub_need = needs_.need[needs_.at(a + 1, b)];
        for (std::size_t k = 0; k < opts.size(); ++k) {
            const Bytes off = u_.x[a - 1] + opts[k].extra;
            const Bytes lo = std::max({opts[k].fwd + u_.upper(b), opts[k].bwd, sub_need + off, Bytes{0}});
            if (lo > M) continue;
            rotor_relax1(out, row(a + 1, b) - off, all_constant(a, k), static_cast<std::size_t>(lo), hi);
        }
        Bytes fwd = 0;
        double pre = 0.0;
        const Bytes off = u_.x[a - 1];
        for (std::size_t j = a + 1; j <= b; ++j) {
            const std::size_t l = j - 1;
            fwd = std::max(fwd, u_.nograd[l] + (l > a ? u_.x[a - 1] : 0));
            pre += u_.nograd_time[l];
            if (fwd + u_.upper(b) > M) break;  // longer F∅ runs only need more memory
            const Bytes lo_bytes = std::max({fwd + u_.upper(b), needs_.need[needs_.at(j, b)] + off,
                                             needs_.need[needs_.at(a, j - 1)], Bytes{0}});
            if (lo_bytes > M) continue;
            const auto lo = static_cast<std::size_t>(lo_bytes);
            const float c = static_cast<float>(pre * scale_);
            const float* s1 = row(j, b) - off;
            const float* s2 = row(a, j - 1);
            const std::size_t end = improvable(out, c + s1[hi] + s2[hi], lo, hi);
            if (end > lo) rotor_relax2(out, s1, s2, c, lo, end - 1);
        }
        if (moves_.release)
            for_each_branch(u_, moves_, RotorShape::plain(), a, b, M, true,
                            [&](const RotorBranch& br) { relax_branch(out, br, M); });
    }

    void fill_shape_row(const RotorShape& shape, std::size_t a, std::size_t c, Bytes M) {
        if (needs_.need_of(RotorSubChain{shape, a, c, 0}) > M) return;
        float* out = table_.data() + shape_offset(shape, a, c);
        for_each_branch(u_, moves_, shape, a, c, M, false, [&](const RotorBranch& br) { relax_branch(out, br, M); });
    }

    const RotorUnits& u_;
    const RotorNeeds& needs_;
    std::size_t L_;
    std::size_t M_;
    std::size_t width_;
    std::vector<double> least_;  // t_l = min_k leaf_time: T(a, b) = Σ t_l
    RotorMoves moves_;           // what RotorOptions::schedule_class adds to Rotor's branches
    std::size_t K_ = 0;          // the most options of a stage, with release moves
    std::array<std::size_t, RotorNeeds::shape_tables> shape_base_{};  // first row of each shape table (RotorNeeds::table_of)
    double scale_ = 1.0;         // times enter the floats multiplied by this
    std::vector<float> table_;
};

}  // namespace remat::detail::rotor
