// remat/solvers/checkmate/rounding.hpp — a schedule from one rounding of the LP relaxation of
// Checkmate's integer program, for graphs too large for the exact search.
//
// Part of the Checkmate solver (solvers/checkmate.hpp; Jain et al., MLSys 2020, which also
// rounds the LP relaxation on large graphs; this rounding is remat's own). A rounding decides, for each data, whether to
// keep it where the LP keeps it (`keep`, given the LP's fractional liveness: a threshold or a
// random draw, chosen by Checkmate::round_relaxation). Exactly-once ops run in the passes
// where the LP runs them (half their mass), each preceded by computing what it reads with
// the writers the LP prefers; after each run, data are freed unless read by the rest of the
// current plan, kept by the rounding, final, or impossible to recompute and still needed.
// The caller simulates the schedule and rejects it when it is not valid or does not fit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "analysis.hpp"
#include "formulation.hpp"

namespace remat::detail::checkmate {

// Pass of each exactly-once op, as (pass, position): where its cumulative LP mass reaches
// one half (the last pass when it never does).
inline std::vector<std::pair<std::size_t, std::size_t>> exactly_once_passes(const Analysis& a, const Formulation& f,
                                                                            const std::vector<double>& x) {
    const std::size_t T = f.layout().T, E = a.eo_ops.size();
    std::vector<std::pair<std::size_t, std::size_t>> eo_at;
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
    return eo_at;
}

// Exactly-once ops in the order of their passes, fixed up so that every op follows what
// it needs; nullopt when no such order exists.
inline std::optional<std::vector<std::size_t>> exactly_once_sequence(
    const Analysis& a, const std::vector<std::pair<std::size_t, std::size_t>>& eo_at) {
    const std::size_t E = a.eo_ops.size();
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
    return ordered;
}

// The schedule of one rounding, built run by run: what is live, what has run, and how
// many reads of each data the current plan still has to make.
template <class Keep>
class RoundedScheduleBuilder {
public:
    RoundedScheduleBuilder(const Problem& pr, const Analysis& a, const Formulation& f, const std::vector<double>& x,
                           const Keep& keep)
        : pr_(pr), a_(a), f_(f), x_(x), keep_(keep), mass_(writer_mass()), live_(a.m, 0), ran_(a.n, 0), uses_(a.m, 0) {
        for (const DataId d : pr.initial()) live_[d.index] = 1;
    }

    // Runs exactly-once op k no earlier than `pass`, after computing what it reads;
    // false when that is impossible.
    bool run_exactly_once(std::size_t pass, std::size_t k) {
        pass_ = std::max(pass_, pass);
        std::vector<DataId> need;
        for (const DataId d : pr_.op(OpId{k}).reads)
            if (!live_[d.index]) need.push_back(d);
        const auto ops = plan_for(need);
        return ops && run_plan(*ops, k);
    }

    // Computes the final data not live; false when that is impossible.
    bool make_finals_live() {
        std::vector<DataId> finals;
        for (const DataId d : pr_.final_data())
            if (!live_[d.index]) finals.push_back(d);
        if (finals.empty()) return true;
        const auto ops = plan_for(finals);
        return ops && run_plan(*ops, none);
    }

    // The schedule, with what is left live and neither initial nor final freed.
    [[nodiscard]] Schedule finish() && {
        for (std::size_t d = 0; d < a_.m; ++d)
            if (live_[d] && !pr_.is_initial(DataId{d}) && !pr_.is_final(DataId{d})) s_.push_back(Step::free(DataId{d}));
        return std::move(s_);
    }

private:
    // Preferred writer of each data: most LP mass (then least time, in plan_for).
    [[nodiscard]] std::vector<double> writer_mass() const {
        std::vector<double> mass(a_.n, 0.0);
        for (std::size_t t = 0; t < f_.layout().T; ++t)
            for (std::size_t p = 0; p < a_.n; ++p) mass[a_.order[p]] += f_.run_value(x_, t, p);
        return mass;
    }

    [[nodiscard]] bool recomputable(std::size_t d) const {
        for (const OpId w : pr_.writers(DataId{d}))
            if (!pr_.op(w).exactly_once) return true;
        return false;
    }

    [[nodiscard]] bool still_needed(std::size_t d) const {
        for (const OpId r : pr_.readers(DataId{d}))
            if (!pr_.op(r).exactly_once || !ran_[r.index]) return true;
        return false;
    }

    // Frees, after the run at position p_now, every data nothing keeps.
    void tidy(std::size_t p_now) {
        for (std::size_t d = 0; d < a_.m; ++d) {
            if (!live_[d] || pr_.is_initial(DataId{d}) || pr_.is_final(DataId{d}) || uses_[d] > 0) continue;
            if (!recomputable(d) && still_needed(d)) continue;
            if (still_needed(d) && keep_(d, f_.liveness_after(x_, d, pass_, p_now))) continue;
            live_[d] = 0;
            s_.push_back(Step::free(DataId{d}));
        }
    }

    // A plan under construction: the ops chosen so far, the data being made.
    struct WriterPlan {
        std::vector<char> planned, making;
        std::vector<std::size_t> ops;
        bool ok = true;
    };

    // Chooses a writer of d (its preferred one that does not need d itself) and, first,
    // the writers of what that one reads.
    void make(WriterPlan& plan, DataId d) const {
        if (!plan.ok || live_[d.index] || plan.making[d.index]) return;
        plan.making[d.index] = 1;
        std::size_t best = none;
        for (const OpId w : pr_.writers(d)) {
            if (pr_.op(w).exactly_once) continue;
            bool cyclic = false;
            for (const DataId r : pr_.op(w).reads) cyclic = cyclic || (plan.making[r.index] && !live_[r.index]);
            if (cyclic) continue;
            if (best == none || mass_[w.index] > mass_[best] + 1e-9 ||
                (std::abs(mass_[w.index] - mass_[best]) <= 1e-9 && pr_.op(w).time < pr_.op(OpId{best}).time))
                best = w.index;
        }
        if (best == none) {
            plan.ok = false;
            return;
        }
        for (const DataId r : pr_.op(OpId{best}).reads) make(plan, r);
        if (!plan.planned[best]) {
            plan.planned[best] = 1;
            plan.ops.push_back(best);
        }
    }

    // Ops that make `targets` live, in topological order; nullopt when impossible.
    [[nodiscard]] std::optional<std::vector<std::size_t>> plan_for(const std::vector<DataId>& targets) const {
        WriterPlan plan{std::vector<char>(a_.n, 0), std::vector<char>(a_.m, 0), {}, true};
        for (const DataId d : targets) make(plan, d);
        if (!plan.ok) return std::nullopt;
        std::sort(plan.ops.begin(), plan.ops.end(), [&](std::size_t i, std::size_t j) { return a_.pos[i] < a_.pos[j]; });
        return std::move(plan.ops);
    }

    // Runs the plan, then `target` (none: no target), tidying after each run; false when
    // a run would read a data not live.
    bool run_plan(const std::vector<std::size_t>& ops, std::size_t target) {
        for (const std::size_t k : ops)
            for (const DataId d : pr_.op(OpId{k}).reads) ++uses_[d.index];
        if (target != none)
            for (const DataId d : pr_.op(OpId{target}).reads) ++uses_[d.index];
        std::vector<std::size_t> all = ops;
        if (target != none) all.push_back(target);
        for (const std::size_t k : all) {
            const Op& op = pr_.op(OpId{k});
            for (const DataId d : op.reads)
                if (!live_[d.index]) return false;
            s_.push_back(Step::run(OpId{k}));
            ran_[k] = 1;
            for (const DataId d : op.writes) live_[d.index] = 1;
            for (const DataId d : op.reads) --uses_[d.index];
            tidy(a_.pos[k]);
        }
        return true;
    }

    const Problem& pr_;
    const Analysis& a_;
    const Formulation& f_;
    const std::vector<double>& x_;
    const Keep& keep_;
    std::vector<double> mass_;
    std::vector<char> live_, ran_;
    std::vector<int> uses_;  // reads still to come in the current plan
    std::size_t pass_ = 0;
    Schedule s_;
};

// One rounding made into a schedule (see the top of this header); nullopt when it cannot be.
template <class Keep>
[[nodiscard]] std::optional<Schedule> rounded_schedule(const Problem& pr, const Analysis& a, const Formulation& f,
                                                       const std::vector<double>& x, const Keep& keep) {
    const std::vector<std::pair<std::size_t, std::size_t>> eo_at = exactly_once_passes(a, f, x);
    const std::optional<std::vector<std::size_t>> ordered = exactly_once_sequence(a, eo_at);
    if (!ordered) return std::nullopt;
    RoundedScheduleBuilder<Keep> builder(pr, a, f, x, keep);
    for (const std::size_t e : *ordered)
        if (!builder.run_exactly_once(eo_at[e].first, a.eo_ops[e])) return std::nullopt;
    if (!builder.make_finals_live()) return std::nullopt;
    return std::move(builder).finish();
}

}  // namespace remat::detail::checkmate
