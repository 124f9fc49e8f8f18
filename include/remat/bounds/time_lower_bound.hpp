// remat/bounds/time_lower_bound.hpp — a proven lower bound on the time of every schedule that
// fits a budget: how close a plan is to the optimum when no exact solver finishes.
//
// core/bounds.hpp bounds the peak; this header bounds the time. The bound comes from a
// relaxation of the scheduling problem that keeps only what happens at a few instants the
// graph fixes, "cuts": the start of the loss (the turn from forward to backward) and the
// starts of some exactly-once ops after it, chosen along the longest chain of exactly-once
// ops that must follow one another (each cut must run before the next): spread evenly, where
// the op itself holds the most memory, or one at a time by what each proves (grown; an
// outer search over the cut sets of small relaxations, each solved by the backend). Every
// valid schedule maps onto the relaxation:
//   k[d,i] = 1  data d is live when cut i starts;
//   r[o,i] = 1  op o runs at least once between cut i and cut i+1 (after the last cut: to the end).
// Rows, all true of every schedule that fits the budget:
//   - the data a cut reads are live when it starts;
//   - at each cut, the live data + what must also be live then (below) + the cut's own writes
//     and overhead fit the budget (docs/formats.md §3: memory while an op runs);
//   - a data live at cut i+1 was live at cut i or was written between them;
//   - an op that runs between two cuts read data that were live at the first or were written
//     in between (by another op);
//   - the data an exactly-once op after cut i reads were live at cut i or are written after it,
//     before the first cut that must follow the op;
//   - at the ops inside a span that hold the most (span rows), the data kept from the span's
//     cut for a later op of the span fit beside what the op holds.
// What must also be live at a cut: the initial data, the data the cut reads that only ops
// after the loss write, and every such data an exactly-once op already run wrote and an op
// still to come (or the end) reads: no op can write it again.
// The objective, the least time of the runs after the loss, is minimised by a MILP backend
// (milp/backend.hpp); it is added to what every schedule runs anyway: each exactly-once op
// once, and, before the loss, a writer of each data the loss needs (shared among the data one
// op writes). Only ops that run after the loss can be counted in r, and nothing limits the
// memory before the loss, nor between cuts beyond the span rows (what is kept from a cut for
// a later op of its span, checked at some ops inside it), so the bound can be far below the
// optimum at low budgets on graphs whose recomputation happens in the forward phase; it is
// tight where the cost is in keeping the loss's and the backward's inputs. Forward cuts
// (opt-in) add instants
// before the loss, the first writes of data every schedule makes in one order; there, data
// not written yet are not live and ops that need them have not run, the runs before the loss
// become variables too, and the relaxation sees recomputation in the forward phase (exact on
// a skip that cannot be held, tests/milp/test_time_lower_bound.cpp). When the backend stops at its
// time limit, its best proven bound on the relaxation is used, which is still a bound.
//
// Checkmate (Jain et al., MLSys 2020) proves optimality with the full MILP over every pass;
// that model does not finish on graphs of hundreds of ops and its LP bound is weak. This
// relaxation is far smaller (one stage per cut, no op order inside a stage), so it gives a
// useful bound on thousands of ops in seconds. Standard library only, plus the backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/bounds.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/timing.hpp"
#include "../milp/backend.hpp"
#include "../milp/model.hpp"
#include "../solvers/checkmate/analysis.hpp"
#include "time_bound/relaxation.hpp"

namespace remat {

struct TimeLowerBoundOptions {
    /// Exactly-once ops after the loss at which memory is checked, at most, along the longest
    /// chain of ops that must follow one another: two relaxations, one with the cuts spread
    /// evenly, one with them at the ops that hold the most memory, after one with a quarter as
    /// many of the latter; each is a bound, and the largest is kept. More cuts give a tighter
    /// bound and a larger MILP (about (cuts + 1) × (data + ops) binaries); 0 checks the loss only.
    std::size_t cuts = 8;
    /// Above `cuts`: after the relaxation with `cuts` cuts, ones with 4 times as many, and so
    /// on up to this many, each given an equal share of the time left (a solved one hands its
    /// unused time on). The largest proven bound is kept. The ladder leaves out the counts
    /// that the longest chain has no ops for (no more cuts than the count before). The time
    /// limit is then spent on a tighter bound rather than returning early: on a
    /// 200-op encoder-decoder at 30 % of P_ref, 8 spread cuts prove +25.7 % in 0.6 s, 32 cuts
    /// +28.1 % (not solved: its best proven bound); on a 200-op U-Net at 30 %, 8 spread cuts
    /// prove +5.8 % in 20 s unsolved, 32 cuts +8.3 % in 5 s. At most `cuts` (the default): no
    /// larger relaxation.
    std::size_t max_cuts = 8;
    /// Forward cuts: up to this many instants before the loss that every schedule passes in one
    /// order (the first write of each data along the longest chain in which every writer of a
    /// data reads the one before), at which memory is also checked. The relaxation then counts
    /// every run, so it also sees recomputation that a small budget forces before the loss (the
    /// skips a U-Net cannot hold through its bottleneck), which the cuts after the loss cannot.
    /// It is solved last, with the best cuts of the ladder, in the time left; it is larger and
    /// helps only where it is solved: on a 94-op U-Net at 40 % of P_ref, 8 forward cuts raise
    /// the bound from +3.6 % to +4.9 % (solved in 5 s); on a 200-op U-Net at 20 %, within 20 s,
    /// they do not finish. 0 (the default) adds none.
    std::size_t forward_cuts = 0;
    /// Grown cuts: up to this many cuts after the loss, chosen one at a time by what they prove
    /// (0, the default: none). Each round solves the relaxation with the cuts grown so far and
    /// one more, for each candidate, and keeps the one that proves most; a round where none
    /// proves more than the round before ends the growth, unless some candidates were not
    /// tried yet. The first round's candidates are the `grow_candidates` ops of the longest
    /// chain that hold the most memory (the tightest cuts' measure); each later round tries the
    /// better half of the ones before, then those not tried. A round tries only as many as can
    /// each get twice the time the start took per cut, times its cuts: an unsolved relaxation
    /// proves little before its root is solved. It starts from the best of the loss alone and
    /// the ladder's first rung (its few tightest cuts), in half of the time left when more of
    /// the ladder follows (all of it otherwise; time it does not use is handed on). A few
    /// well-chosen cuts keep the MILP small enough to solve, where more cuts placed by rule are
    /// tighter only once solved: on the 283-op U-Net of bench_hierarchical at 20 % of P_ref, the
    /// bound proves +28.1 % over T_ref in 20 s with grown cuts, +25.2 % without (the ladder up
    /// to 512 cuts, in 60 s); on a 54-data U-Net at 40 %, +17.9 %, its optimum, against +12.3 %
    /// (docs/design.md §4.10).
    std::size_t grown_cuts = 0;
    /// The ops tried at the growth's first round (see grown_cuts), each one relaxation.
    std::size_t grow_candidates = 24;
    /// Span rows: memory checked inside the spans between cuts after the loss, at up to this
    /// many exactly-once ops per span (those where the data kept from the span's cut for a
    /// later op of the span, with what the op holds anyway, exceed the budget most; see
    /// detail::time_bound::add_span_rows). 0: none, memory is checked only at the cuts. On
    /// bench_hierarchical's 1,039-op U-Net at 20 % of P_ref, the loss alone proves +7.8 % over
    /// T_ref without them (unsolved in 4.7 s), +9.2 % with 4 rows (solved in 4.4 s) and +9.6 %
    /// with 64 (solved in 2.4 s); on the milp tests' tiny problems the loss alone equals the
    /// optimum in 299 of 390 cases with them, 138 without. With grown cuts, the growth and the
    /// relaxations it starts from go without them (larger, they solve less in the growth's
    /// time), and the loss alone with them follows the growth as a relaxation of its own.
    std::size_t span_rows = 64;
    /// Seconds for all the relaxations together; past them the best bound so far is used
    /// (at least the loss-only relaxation is always run, to its own proven bound, in a quarter
    /// of them when larger relaxations follow).
    double time_limit_seconds = 10.0;
    /// A schedule within the budget (a plan) that every relaxation after the loss starts from:
    /// its live data at each cut and its runs in each span are a solution of every relaxation,
    /// so the backend has that incumbent at once and only has to prove it, or find a lower one.
    /// The bound stays the same; it is proven sooner. Where the plan is optimal, a relaxation
    /// with enough cuts proves it so: on a 61-op random chain at 40 % of P_ref (bench_checkmate's
    /// generator), a cut at each of its 20 backward ops proves RotorRelease's 144 optimal in
    /// 1.7 s from that plan and in 12 s without it, where the default 9 cuts prove 142 (141
    /// without span rows). Empty: none. (Not used with forward cuts; a start the backend finds
    /// infeasible is ignored.)
    Schedule start;
    ProgressCallback progress;
};

struct TimeLowerBound {
    /// No schedule that fits the budget takes less time (seconds, as the problem's op times).
    double time = 0.0;
    /// The relaxation has no solution: no schedule fits the budget at all.
    bool budget_infeasible = false;
    /// Whether the backend solved the relaxation to optimality (otherwise `time` uses its best
    /// proven bound at the time limit, which is lower).
    bool relaxation_solved = false;
    /// The cuts of the relaxation that gave `time`, the loss first.
    std::vector<std::string> cuts;
    /// The data whose first writes are the forward cuts of that relaxation
    /// (TimeLowerBoundOptions::forward_cuts), first first.
    std::vector<std::string> forward_cuts;
    /// The data live when the loss starts in that relaxation's best solution, where the backend
    /// found one: not a schedule's (nothing checks memory before the loss), but a hint of what
    /// an optimal schedule keeps for its backward (LossStateSearchOptions::preferred,
    /// solvers/loss_state_search.hpp).
    std::vector<std::string> live_at_loss;
    double seconds = 0.0;
};

namespace detail::time_bound {

// One relaxation's answer: its bound on the time of every schedule, or that nothing fits.
struct Stage {
    double time = 0.0;
    bool solved = false;
    bool infeasible = false;
    double seconds = 0.0;       // the backend's wall-clock time on it
    std::vector<OpId> cuts;     // the loss, then the cuts after it
    std::vector<DataId> forward;  // the forward cuts' data
    std::vector<DataId> live_at_loss;  // in the backend's best solution, if any
};

// A schedule mapped onto a relaxation without forward cuts (TimeLowerBoundOptions::start):
// each cut's live binaries are the data live when the cut starts, each span's run binaries
// the ops that run in it (from one cut's start to the next, the last to the end), and every
// variable the relaxation leaves out stays 0, as its rows allow.
[[nodiscard]] inline std::vector<double> start_values(const Problem& p, const std::vector<OpId>& cuts, const Variables& v,
                                                      const std::vector<Kept>& kept, const Schedule& schedule,
                                                      std::size_t variables) {
    std::vector<double> values(variables, 0.0);
    std::vector<char> live(p.data_count(), 0);
    for (const DataId d : p.initial()) live[d.index] = 1;
    std::optional<std::size_t> span;  // none before the loss
    for (const Step& step : schedule) {
        if (!step.is_run()) {
            live[step.data().index] = 0;
            continue;
        }
        const OpId k = step.op();
        if (const auto at = std::find(cuts.begin(), cuts.end(), k); at != cuts.end()) {
            span = static_cast<std::size_t>(at - cuts.begin());
            for (std::size_t d = 0; d < p.data_count(); ++d)
                if (const auto& var = v.live[*span][d]; var && live[d]) values[var->index] = 1.0;
        }
        if (span && v.runs[*span][k.index]) values[v.runs[*span][k.index]->index] = 1.0;
        for (const DataId d : p.op(k).writes) live[d.index] = 1;
    }
    // Kept through a span: live at its cut, and no writer ran in it (the least value its row allows).
    for (const Kept& t : kept) {
        double value = values[v.live[t.span][t.data.index]->index];
        for (const milp::Term& w : written(p, v, t.data, t.span, t.span)) value -= values[w.var.index];
        values[t.var.index] = std::max(0.0, value);
    }
    return values;
}

// The relaxation with these cuts (cut_ladder) and forward cuts (choose_forward_cuts), solved
// within `seconds`. Without forward cuts, the runs before the loss are not variables: what runs
// anyway (time_run_anyway) is added instead; with them, every run is counted by a variable.
template <milp::MilpBackend Backend>
[[nodiscard]] Stage solve_stage(const Problem& p, const Phases& ph, std::vector<OpId> cuts, const ForwardCuts& forward,
                                Bytes budget, double seconds, const Backend& backend, const ProgressCallback& progress,
                                std::string_view kind = {}, const Schedule& start = {}, std::size_t span_rows = 0) {
    Stage stage;
    stage.cuts = std::move(cuts);
    stage.forward = forward.data;
    milp::Model model;
    const Variables v = add_variables(model, p, ph, stage.cuts, forward);
    const double unit = static_cast<double>(detail::checkmate::memory_unit(p));
    if (!add_rows(model, p, ph, stage.cuts, forward, v, budget, unit)) {
        stage.infeasible = stage.solved = true;
        return stage;
    }
    add_start_rows(model, p, v, forward);
    const std::vector<Kept> kept = add_span_rows(model, p, ph, stage.cuts, v, budget, unit, span_rows);
    if (!start.empty() && forward.data.empty())
        model.set_start(start_values(p, stage.cuts, v, kept, start, model.variable_count()));
    model.set_time_limit(seconds);
    model.set_relative_gap(1e-6);
    const std::string what = std::to_string(stage.cuts.size()) + " cuts" +
                             (kind.empty() ? std::string() : " (" + std::string(kind) + ")") +
                             (forward.data.empty() ? "" : " and " + std::to_string(forward.data.size()) + " forward");
    report_progress(progress, "time bound: " + what + ", " + std::to_string(model.variable_count()) + " binaries, " +
                                  std::to_string(model.row_count()) + " rows, " + std::string(backend.name()));
    const Stopwatch clock;
    const milp::Result result = backend.solve(model);
    if (result.has_solution())
        for (std::size_t d = 0; d < p.data_count(); ++d)
            if (const auto& k = v.live[v.forward][d]; k && result.values[k->index] > 0.5) stage.live_at_loss.push_back(DataId{d});
    stage.solved = result.status == milp::Status::optimal || result.status == milp::Status::infeasible;
    stage.infeasible = result.status == milp::Status::infeasible;
    stage.seconds = clock.seconds();
    // Within the relative gap of the optimum when solved; the backend's proven bound otherwise.
    double extra = std::isfinite(result.best_bound) ? result.best_bound : 0.0;
    if (result.status == milp::Status::optimal)
        extra = std::min(result.objective, std::max(extra, result.objective * (1.0 - 1e-6)));
    const std::optional<OpId> loss = stage.cuts.front();
    stage.time = (forward.data.empty() ? time_run_anyway(p, loss) : exactly_once_time(p)) + std::max(0.0, extra);
    report_progress(progress, "time bound: " + what + ": " +
                                  (stage.infeasible ? std::string("no schedule fits")
                                                    : std::to_string(stage.time) + (stage.solved ? " (solved)" : " (at its limit)")) +
                                  " in " + std::to_string(stage.seconds) + " s");
    return stage;
}

// The share of the time limit the loss-only relaxation may take when larger ones follow. It
// usually solves in well under a second; where it does not, its bound at the limit is a root
// bound that more time hardly raises, and the larger relaxations, which need the time, prove
// more: within 20 s, bench_hierarchical's 895-op encoder-decoder at 30 % of P_ref, +11.8 %
// over T_ref with the whole limit for the loss alone (nothing else ran), +12.9 % with a quarter;
// at 40 %, +6.6 % -> +7.3 % (docs/design.md §4.10).
inline constexpr double loss_alone_share = 0.25;

// The cuts of the relaxations after the loss-only one, in the order they are solved, by count:
// `cuts`, then 4 times as many up to `max_cuts`; none when `cuts` is 0. Each count gets the
// cuts spread along the longest chain, then its tightest ops where those differ: the spread
// ones bound the recomputation all along the backward, the tightest ones where memory forces
// it; neither is better on every graph (a 60-op random DAG at 40 %: 186 spread, solved in
// 0.8 s, and 181 tightest, unsolved in 10 s). Before them, the tightest ops alone at a quarter
// of `cuts`: a few cuts at the right instants often solve in a second where more stop at the
// limit with a weaker proven bound (a 283-op U-Net at 20 % of P_ref: 2 tightest cuts prove
// +25.2 % in 0.7 s, 8 only +20.3 % in 96 s). A count that gets no more cuts than the one
// before (the chain has no more ops) is left out: it would solve the same relaxations again,
// and the time they would take is better spent on the ones before.
struct CutSet {
    std::vector<OpId> cuts;
    std::string_view kind;  // for progress: "spread" or "tightest"
};

[[nodiscard]] inline std::vector<CutSet> cut_ladder(const Problem& p, const Phases& ph, OpId loss,
                                                    const TimeLowerBoundOptions& options) {
    std::vector<CutSet> ladder;
    if (options.cuts == 0) return ladder;
    const std::vector<OpId> chain = longest_chain_after_loss(ph, loss);
    std::size_t made = 1;  // the loss-only relaxation's
    if (const std::size_t few = options.cuts / 4; few > 0) {
        ladder.push_back({tightest_cuts(p, ph, chain, loss, few), "tightest"});
        made = ladder.back().cuts.size();
    }
    for (std::size_t c = options.cuts;; c = std::min(4 * c, options.max_cuts)) {
        std::vector<OpId> spread = spread_cuts(chain, loss, c);
        if (spread.size() <= made) break;
        made = spread.size();
        std::vector<OpId> tightest = tightest_cuts(p, ph, chain, loss, c);
        const bool same = tightest == spread;
        ladder.push_back({std::move(spread), "spread"});
        if (!same) ladder.push_back({std::move(tightest), "tightest"});
        if (c >= options.max_cuts) break;
    }
    return ladder;
}

// TimeLowerBoundOptions::grown_cuts: from the cuts of `start` (the best small relaxation so
// far), one cut at a time, each the candidate whose relaxation proves most, within `seconds`.
// Every relaxation solved is a bound, so the largest stage seen is returned (an infeasible one
// at once: no schedule fits). Each candidate gets an equal share of the time left, counting one
// more round after this one, so that a round never takes the time of the next. A round tries
// only as many candidates, in their order, as can each get twice the time `start` took per cut,
// times its cuts: a relaxation stopped before its root is solved proves little (the 283-op
// U-Net of bench_hierarchical at 20 %: in 0.2 s each, no 4-cut relaxation proves more than the
// loss and 2 tightest cuts' +25.2 % over T_ref; in 1.9 s, the first proves +28.1 %). The others
// wait for the next round. A round where no candidate proves more ends the growth, unless some
// were not tried.
template <milp::MilpBackend Backend>
[[nodiscard]] Stage grow_cuts(const Problem& p, const Phases& ph, Stage start, Bytes budget, double seconds,
                              const Backend& backend, const TimeLowerBoundOptions& options) {
    const Stopwatch clock;
    const OpId loss = start.cuts.front();
    const std::vector<OpId> chain = longest_chain_after_loss(ph, loss);
    std::vector<OpId> candidates = tightest_cuts(p, ph, chain, loss, options.grow_candidates + start.cuts.size());
    std::erase_if(candidates, [&](OpId c) { return std::find(start.cuts.begin(), start.cuts.end(), c) != start.cuts.end(); });
    candidates.resize(std::min(candidates.size(), options.grow_candidates));
    std::vector<std::size_t> position(p.op_count(), 0);  // along the chain, which orders the cuts
    for (std::size_t j = 0; j < chain.size(); ++j) position[chain[j].index] = j + 1;
    std::vector<OpId> grown = start.cuts;
    const double seconds_per_cut = start.seconds / static_cast<double>(start.cuts.size());
    Stage best = std::move(start);
    double grown_time = best.time;
    for (std::size_t added = 0; added < options.grown_cuts && !candidates.empty();) {
        const double least_share = 2.0 * seconds_per_cut * static_cast<double>(grown.size() + 1);
        std::vector<std::pair<double, OpId>> proven;  // each candidate's bound this round
        std::optional<Stage> pick;
        std::size_t tried = 0;
        for (; tried < candidates.size(); ++tried) {
            const double left = seconds - clock.seconds();
            if (left <= 0.0) return best;
            // This candidate and those after it that can still get their least share, keeping
            // as much for the next round (the first is always tried).
            const auto after = static_cast<double>(candidates.size() - tried);
            const auto fit = static_cast<std::size_t>(least_share > 0.0 ? std::min(left / (2.0 * least_share), after) : after);
            if (fit == 0 && tried > 0) break;
            std::vector<OpId> cuts = grown;
            cuts.push_back(candidates[tried]);
            std::sort(cuts.begin(), cuts.end(), [&](OpId x, OpId y) { return position[x.index] < position[y.index]; });
            const double share = left / static_cast<double>(2 * std::max<std::size_t>(fit, 1));
            Stage stage = solve_stage(p, ph, std::move(cuts), {}, budget, share, backend, options.progress, "grown", options.start);
            if (stage.infeasible) return stage;
            proven.emplace_back(stage.time, candidates[tried]);
            if (!pick || stage.time > pick->time) pick = std::move(stage);
        }
        if (!pick || !(pick->time > grown_time)) {
            // No candidate proves more: the growth ends, unless some were not tried yet.
            candidates.erase(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(tried));
            continue;
        }
        grown = pick->cuts;
        grown_time = pick->time;
        ++added;
        if (pick->time > best.time) best = std::move(*pick);
        // The next round tries the better half of the others, then those not tried yet: a cut
        // that proved little beside these seldom proves much beside more, and the larger
        // relaxations need the time.
        std::stable_sort(proven.begin(), proven.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
        std::vector<OpId> next;
        for (std::size_t c = 1; c < proven.size() && next.size() < (proven.size() + 1) / 2; ++c) next.push_back(proven[c].second);
        next.insert(next.end(), candidates.begin() + static_cast<std::ptrdiff_t>(tried), candidates.end());
        candidates = std::move(next);
    }
    return best;
}

}  // namespace detail::time_bound

/// A proven lower bound on the time of every valid schedule of `problem` whose peak is at most
/// `budget` (see the header comment). A budget below core/bounds.hpp's memory lower bound is
/// reported as `budget_infeasible` at once. The relaxation is solved with the loss alone as a
/// cut (small, usually solved in well under a second; in a quarter of the time limit at most
/// when more follow), then, with `options.grown_cuts`, with
/// cuts grown one at a time by what they prove (in half of the time left), then with `options.cuts` cuts (spread
/// along the backward, then at its tightest ops) in the time left, then with 4 times as many up
/// to `options.max_cuts`, each in an equal share of the time left, and the largest bound is
/// kept (each is a bound; more cuts are tighter once solved, but a larger model may stop at its
/// time limit with a weaker proven bound).
/// Needs the problem's loss for the cuts; without one, the bound is what every schedule runs
/// anyway. Throws what the backend throws (SolverError).
template <milp::MilpBackend Backend>
[[nodiscard]] TimeLowerBound time_lower_bound(const Problem& problem, Bytes budget, const Backend& backend,
                                              const TimeLowerBoundOptions& options = {}) {
    namespace tb = detail::time_bound;
    const Stopwatch clock;
    TimeLowerBound out;
    // The cuts need a loss that runs exactly once (it then splits every schedule in two).
    std::optional<OpId> loss = problem.loss();
    if (loss && !problem.op(*loss).exactly_once) loss.reset();
    const double anyway = tb::time_run_anyway(problem, loss);
    out.time = anyway;
    out.relaxation_solved = true;
    if (budget < memory_lower_bound(problem).bytes) {
        out.budget_infeasible = true;  // below core/bounds.hpp's bound on every schedule's peak
    } else if (loss) {
        const tb::Phases ph = tb::phases(problem, *loss);
        std::vector<tb::CutSet> ladder = tb::cut_ladder(problem, ph, *loss, options);
        const tb::ForwardCuts forward = tb::choose_forward_cuts(problem, ph, *loss, options.forward_cuts);
        // The loss alone first: small, and a bound even if nothing larger is solved in time.
        const bool more_follow = !ladder.empty() || options.grown_cuts > 0 || !forward.data.empty();
        const double loss_alone_seconds = std::max(options.time_limit_seconds, 0.0) * (more_follow ? tb::loss_alone_share : 1.0);
        // The grown cuts start from relaxations without span rows (see span_rows): with them the
        // start is slower and higher, so the growth, which shares its time by the start's and
        // keeps a cut only where it proves more, tried fewer candidates and stopped sooner (the
        // 283-op U-Net at 30 % of P_ref in 20 s: +7.9 %, against +9.8 % from the plain start).
        // The loss alone with span rows then comes after the growth, as a relaxation of its own.
        const bool growing = options.grown_cuts > 0;
        const bool span_rows_after_growth = growing && options.span_rows > 0;
        const std::size_t start_span_rows = growing ? 0 : options.span_rows;
        tb::Stage best = tb::solve_stage(problem, ph, {*loss}, {}, budget, loss_alone_seconds, backend, options.progress,
                                         "the loss alone", {}, start_span_rows);
        // Every relaxation solved is a bound: the largest is kept (an infeasible one at once).
        const auto keep_tighter = [&best](tb::Stage stage) {
            if (stage.infeasible || stage.time > best.time) best = std::move(stage);
        };
        // The grown cuts start from the best of the first (smallest) relaxations: after the
        // ladder's first rung when it is its few tightest cuts, otherwise after the loss alone.
        const std::size_t grow_after = !ladder.empty() && ladder.front().kind == "tightest" ? 1 : 0;
        // Relaxations still to solve.
        std::size_t to_come = ladder.size() + (forward.data.empty() ? 0 : 1) + (span_rows_after_growth ? 1 : 0);
        for (std::size_t rung = 0; rung <= ladder.size(); ++rung) {
            if (rung == grow_after && growing && !best.infeasible) {
                // Half of the time left when more relaxations follow, all of it otherwise.
                const double left = options.time_limit_seconds - clock.seconds();
                const double share = to_come == 0 ? left : left / 2;
                if (share > 0.0) best = tb::grow_cuts(problem, ph, std::move(best), budget, share, backend, options);
                const double after = options.time_limit_seconds - clock.seconds();
                if (span_rows_after_growth && !best.infeasible && after > 0.0) {
                    const double seconds = std::min(after, std::max(after / static_cast<double>(to_come), loss_alone_seconds));
                    --to_come;
                    keep_tighter(tb::solve_stage(problem, ph, {*loss}, {}, budget, seconds, backend, options.progress,
                                                 "the loss alone, span rows", {}, options.span_rows));
                }
            }
            if (rung == ladder.size()) break;
            tb::CutSet& set = ladder[rung];
            const double left = options.time_limit_seconds - clock.seconds();
            if (best.infeasible || left <= 0.0) break;
            // An equal share of what is left for each relaxation still to come: a solved one
            // hands its unused time on; an unsolved one still proves a bound, and a larger
            // relaxation after it is often tighter even unsolved (a 200-op U-Net at 30 % of
            // P_ref: 8 spread cuts prove +5.8 % in 20 s, 32 cuts +8.3 % in 5 s), so the ladder
            // goes on to the end or the time limit.
            const double share = left / static_cast<double>(to_come--);
            keep_tighter(tb::solve_stage(problem, ph, std::move(set.cuts), {}, budget, share, backend, options.progress,
                                         set.kind, options.start, rung < grow_after ? start_span_rows : options.span_rows));
        }
        // Last, the forward cuts with the best cuts so far, in all the time left: a relaxation
        // that counts every run, so it may prove more than the ladder, and only its own larger
        // bound is kept.
        const double left = options.time_limit_seconds - clock.seconds();
        if (!forward.data.empty() && !best.infeasible && left > 0.0) {
            keep_tighter(tb::solve_stage(problem, ph, best.cuts, forward, budget, left, backend, options.progress, {}, {},
                                         options.span_rows));
        }
        out.time = best.time;
        out.budget_infeasible = best.infeasible;
        out.relaxation_solved = best.solved;
        for (const OpId c : best.cuts) out.cuts.push_back(problem.op(c).name);
        for (const DataId d : best.forward) out.forward_cuts.push_back(problem.data(d).name);
        for (const DataId d : best.live_at_loss) out.live_at_loss.push_back(problem.data(d).name);
    }
    out.seconds = clock.seconds();
    report_progress(options.progress,
                    out.budget_infeasible
                        ? std::string("time bound: no schedule fits the budget")
                        : "time bound: " + std::to_string(out.time) +
                              (out.relaxation_solved ? " (solved, " : " (at the time limit, ") +
                              std::to_string(out.cuts.size()) + " cuts) in " + std::to_string(out.seconds) + " s");
    return out;
}

}  // namespace remat
