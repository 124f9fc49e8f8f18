// remat/solvers/checkmate/warm_start.hpp — known schedules (Checkmate's baselines) made
// into starting solutions of its integer program: runs nothing uses dropped, the runs
// placed in the passes of a layout, and Formulation::assignment's full solution set as the
// model's start.
//
// Part of the Checkmate solver (solvers/checkmate.hpp; Jain et al., MLSys 2020); the passes
// are checkmate/layout.hpp's. A baseline that needs more passes than the layout has gives
// no start; Checkmate still returns it when the search finds nothing faster.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "analysis.hpp"
#include "formulation.hpp"
#include "layout.hpp"

namespace remat::detail::checkmate {

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

// Sets the model's start to the runs of schedule s; false when s does not fit the layout's
// passes or the model lacks one of its points.
inline bool start_from(const Analysis& a, const Problem& pr, Formulation& f, const Schedule& s) {
    const auto runs = place_runs(a, pr, f.layout(), s);
    if (!runs) return false;
    auto x = f.assignment(*runs);
    if (!x) return false;
    f.model().set_start(std::move(*x));
    return true;
}

}  // namespace remat::detail::checkmate
