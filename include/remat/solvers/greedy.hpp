// remat/solvers/greedy.hpp — a fast greedy planner for any graph: a static, DTR-like replay of
// the framework's order on the simulator's semantics (docs/formats.md §3 (simulation semantics)).
//
// Kirisame, Lyubomirsky, Haan, Brennan, He, Roesch, Chen, Tatlock, "Dynamic Tensor
// Rematerialization", ICLR 2021: when memory runs short, evict the tensor with the smallest
// h = recompute cost / (bytes × staleness), the recompute cost counting the evicted inputs it
// would need too; recompute evicted tensors when they are read. Here that runs offline, once
// per plan, on the problem's own numbers:
//  - Follow the store-all order (the problem's `autograd` order, or the one store-all chooses;
//    solvers/store_all.hpp), or with GreedyOrder::memory_aware the same ops reordered for
//    memory (memory_aware_order). Exactly-once ops run there and nowhere else; other ops of
//    the order are skipped when everything they write is live or never read again.
//  - Before an op runs, its reads are made live: a missing read is recomputed, recursively,
//    by its cheapest writer that is not exactly-once and whose missing reads can be produced
//    at a lower production level (graph/production.hpp), which rules out going round in
//    circles. A missing data that only exactly-once ops write is a failure at that budget.
//    Among writers of equal cost, the one that allocates least, or the one that also makes
//    live more data still needed (GreedyScore::prefer_needed_writes): both are replayed.
//  - While the op would take memory above the budget (live data + what it writes that is
//    not live + its overhead), a live data is evicted (a free step): not initial, not final,
//    not read or written by the op, not pinned by the recomputation in progress, and
//    recomputable from the initial data without exactly-once ops (anything else could never
//    come back). The victim has the least DTR h (GreedyEviction::dtr), or the farthest next
//    read in the order (GreedyEviction::farthest_next_use, Belady's rule); by default both
//    are tried and the faster plan that fits is kept.
//  - Data never read again are freed at once, as store-all frees them; what is not final is
//    freed at the end.
// Portfolio (GreedyOptions::portfolio_seconds > 0): further replays with other eviction scores
// — DTR's h with the bytes and the staleness raised to other powers (Kirisame et al. weigh
// such variants of h), other neighbourhood depths, then random multiplicative noise on h
// (randomised tie-breaking) — until the time is spent; with `improve`, the fastest plans are
// locally improved (solvers/improve.hpp). The fastest plan that fits is kept. Off by
// default: Greedy{} is the plain rule.
// At a budget of at least P_ref nothing is evicted and the plan is the order's own. Below what it
// can fit, Greedy throws Infeasible with the smallest budget it fits, found by bisection
// between the proven lower bound of core/bounds.hpp and P_ref (a greedy is not monotone in the
// budget: when it fails at a budget but fits a smaller one, that plan is returned). Every plan
// is checked by the simulator. Thousands of ops plan in milliseconds (examples/bench_greedy).
// Standard library only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/bounds.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "../graph/production.hpp"
#include "improve.hpp"
#include "store_all.hpp"

namespace remat {

/// Which live data the greedy frees when memory runs short.
enum class GreedyEviction {
    dtr,                ///< least recompute cost / (bytes × steps since last use), as in DTR
    farthest_next_use,  ///< the data read farthest ahead in the order (Belady's rule)
    both,               ///< plan with each and keep the faster plan that fits
};

[[nodiscard]] constexpr std::string_view to_string(GreedyEviction eviction) noexcept {
    switch (eviction) {
        case GreedyEviction::dtr: return "dtr";
        case GreedyEviction::farthest_next_use: return "farthest-next-use";
        case GreedyEviction::both: return "both";
    }
    return "unknown";
}

/// Which writer recomputes a missing data when several cost the same (GreedyScore::prefer_needed_writes).
enum class GreedyWriter {
    fewest_new_bytes,   ///< the one that allocates least (a layer's forward without grad)
    most_needed_bytes,  ///< the one that makes live the most bytes still needed (its forward with grad)
    both,               ///< plan with each and keep the faster plan that fits
};

[[nodiscard]] constexpr std::string_view to_string(GreedyWriter writer) noexcept {
    switch (writer) {
        case GreedyWriter::fewest_new_bytes: return "fewest-new-bytes";
        case GreedyWriter::most_needed_bytes: return "most-needed-bytes";
        case GreedyWriter::both: return "both";
    }
    return "unknown";
}

/// The order of ops the greedy replays.
enum class GreedyOrder {
    store_all,     ///< the store-all order (the problem's `autograd` order, or store-all's choice)
    memory_aware,  ///< the same ops, reordered for memory (memory_aware_order, solvers/store_all.hpp)
};

struct GreedyOptions {
    /// The eviction rule; `both` costs two replays per budget and is never slower in plan time.
    GreedyEviction eviction = GreedyEviction::both;
    /// The order replayed.
    GreedyOrder order = GreedyOrder::store_all;
    /// The writer that recomputes a missing data among equally costly ones; `both` costs two
    /// replays per eviction rule and is never slower in plan time. In the portfolio, `both`
    /// replays the grid with each, and gives three in four noisy replays to the choice of the
    /// fastest plan so far.
    GreedyWriter writer = GreedyWriter::both;
    /// How many writers deep the recompute cost of a data counts evicted inputs (DTR's evicted
    /// neighbourhood), for the dtr rule and for choosing among alternative writers. 0 counts
    /// the writer alone; deeper is more precise on long evicted chains and slower.
    std::size_t neighbourhood_depth = 4;
    /// Seconds spent on the portfolio of further replays described above; 0 turns it off.
    double portfolio_seconds = 0.0;
    /// Seed of the portfolio's random noise (a solve is deterministic for a given seed and
    /// number of replays; the time limit decides how many run).
    std::uint64_t seed = 0x5eedULL;
    /// Locally improve the fastest plans (solvers/improve.hpp) within this many seconds; 0: off.
    double improve_seconds = 0.0;
};

/// `options` with its portfolio and its improvement within `seconds` in all (at most their
/// own limits; 60 % and 40 % of `seconds`). The first replay is not timed: it always runs.
[[nodiscard]] inline GreedyOptions greedy_within(GreedyOptions options, double seconds) {
    options.portfolio_seconds = std::min(options.portfolio_seconds, 0.6 * seconds);
    options.improve_seconds = std::min(options.improve_seconds, 0.4 * seconds);
    return options;
}

/// One eviction score of the dtr rule: cost / (bytes^bytes_power × staleness^staleness_power),
/// times exp(noise × a standard normal draw) when noise > 0.
struct GreedyScore {
    double bytes_power = 1.0;
    double staleness_power = 1.0;
    double noise = 0.0;
    std::uint64_t seed = 0;
    std::size_t depth = 4;
    /// Which writer recomputes a missing data when several cost the same: by default the one
    /// that allocates least (a layer's forward without grad); with this, the one that also
    /// makes live more data still needed (its forward with grad, whose saved data a later
    /// backward reads), so that the backward does not run that forward again. Neither is
    /// better on every graph (GreedyOptions::writer).
    bool prefer_needed_writes = false;
};

namespace detail::greedy {

inline constexpr std::size_t nowhere = std::numeric_limits<std::size_t>::max();

// What does not depend on the budget.
struct Analysis {
    std::vector<OpId> order;                       // store-all's order
    std::vector<std::vector<std::size_t>> reads_at;  // per data: positions of the order that read it
    graph::ProductionLevels levels;                // without exactly-once ops, from the initial data
    Reference reference;                           // T_ref, P_ref
    Bytes order_peak = 0;                          // the order's own peak, freeing eagerly (P_ref for store-all's)
    MemoryLowerBound lower_bound;
};

[[nodiscard]] inline Analysis analyse(const Problem& problem, GreedyOrder order = GreedyOrder::store_all) {
    Analysis a;
    a.order = order == GreedyOrder::memory_aware ? memory_aware_order(problem) : store_all_order(problem);
    a.reads_at.assign(problem.data_count(), {});
    for (std::size_t pos = 0; pos < a.order.size(); ++pos)
        for (const DataId d : problem.op(a.order[pos]).reads) a.reads_at[d.index].push_back(pos);
    a.levels = graph::production_levels(problem, [](const Op& op) { return !op.exactly_once; });
    a.reference = store_all_reference(problem);
    a.order_peak = order == GreedyOrder::store_all ? a.reference.peak
                                                   : simulate(problem, schedule_with_eager_frees(problem, a.order)).peak;
    a.lower_bound = memory_lower_bound(problem);
    return a;
}

// A plan that fits (the simulator has the last word on its peak), with its time.
struct Outcome {
    Schedule schedule;
    double time = 0.0;
    GreedyEviction rule = GreedyEviction::dtr;
    std::string variant;  // the portfolio's score, when not the plain rule
    bool prefer_needed_writes = false;  // its score's writer choice
};

// One replay of the order at one budget with one eviction rule.
class Replay {
public:
    Replay(const Problem& problem, const Analysis& analysis, Bytes budget, GreedyEviction rule, const GreedyScore& score)
        : p_(problem), a_(analysis), budget_(budget), rule_(rule), depth_(score.depth), score_(score), rng_(score.seed),
          live_(problem.data_count(), 0),
          live_at_(problem.data_count(), nowhere), pins_(problem.data_count(), 0),
          last_use_(problem.data_count(), 0), next_read_(problem.data_count(), 0),
          memo_(problem.data_count(), 0.0), memo_stamp_(problem.data_count(), 0) {
        for (const DataId d : p_.initial()) {
            live_[d.index] = 1;
            memory_ += p_.data(d).bytes;
        }
    }

    // The plan, or nullopt when this replay cannot keep within the budget.
    [[nodiscard]] std::optional<Outcome> run() {
        if (memory_ > budget_) return std::nullopt;
        for (pos_ = 0; pos_ < a_.order.size(); ++pos_) {
            const OpId k = a_.order[pos_];
            if (!p_.op(k).exactly_once && !useful(k)) continue;
            if (!run_op(k)) return std::nullopt;
        }
        for (const DataId d : p_.final_data())
            if (!make_live(d)) return std::nullopt;
        for (std::size_t d = 0; d < live_.size(); ++d)
            if (live_[d] && !p_.is_initial(DataId{d}) && !p_.is_final(DataId{d})) drop(DataId{d});
        return Outcome{std::move(schedule_), time_, rule_, {}, score_.prefer_needed_writes};
    }

private:
    // The next position after the current one where the order reads d; nowhere if none.
    [[nodiscard]] std::size_t next_read(DataId d) {
        const std::vector<std::size_t>& at = a_.reads_at[d.index];
        std::size_t& i = next_read_[d.index];
        while (i < at.size() && at[i] <= pos_) ++i;
        return i < at.size() ? at[i] : nowhere;
    }

    [[nodiscard]] bool needed_later(DataId d) { return p_.is_final(d) || next_read(d) != nowhere; }

    // An op of the order that is not exactly once runs only if it makes live something needed.
    [[nodiscard]] bool useful(OpId k) {
        const auto& writes = p_.op(k).writes;
        return std::any_of(writes.begin(), writes.end(), [&](DataId d) { return !live_[d.index] && needed_later(d); });
    }

    // Runs op k after making its reads live and room for it; then frees what is dead.
    [[nodiscard]] bool run_op(OpId k) {
        const Op& op = p_.op(k);
        for (const DataId r : op.reads) ++pins_[r.index];
        for (const DataId r : op.reads)
            if (!make_live(r)) return false;
        if (!make_room(k)) return false;
        emit_run(k);
        for (const DataId r : op.reads) --pins_[r.index];
        free_dead(op);
        return true;
    }

    // Recomputes d, if it is not live, with its cheapest eligible writer.
    [[nodiscard]] bool make_live(DataId d) {
        if (live_[d.index]) return true;
        const std::optional<OpId> writer = cheapest_writer(d);
        return writer && run_op(*writer);
    }

    // A writer that may recompute d now: not exactly once, and every read it lacks can itself
    // be recomputed from strictly lower production levels (so the recursion ends).
    [[nodiscard]] bool eligible(OpId w, DataId d) const {
        const Op& op = p_.op(w);
        if (op.exactly_once) return false;
        return std::all_of(op.reads.begin(), op.reads.end(), [&](DataId r) {
            return live_[r.index] || a_.levels.data[r.index] < a_.levels.data[d.index];
        });
    }

    // Estimated time to make d live from the current state, counting evicted inputs up to
    // `depth` writers deep (memoised for one decision: see next_decision()).
    [[nodiscard]] double estimate(DataId d, std::size_t depth) {
        if (live_[d.index]) return 0.0;
        if (memo_stamp_[d.index] == stamp_) return memo_[d.index];
        double best = std::numeric_limits<double>::infinity();
        for (const OpId w : p_.writers(d))
            if (eligible(w, d)) best = std::min(best, writer_cost(w, depth));
        memo_stamp_[d.index] = stamp_;
        memo_[d.index] = best;
        return best;
    }

    [[nodiscard]] double writer_cost(OpId w, std::size_t depth) {
        double cost = p_.op(w).time;
        if (depth == 0) return cost;
        for (const DataId r : p_.op(w).reads)
            if (!live_[r.index]) cost += estimate(r, depth - 1);
        return cost;
    }

    void next_decision() { ++stamp_; }

    // Bytes op k would add by writing data that are not live.
    [[nodiscard]] Bytes new_bytes(OpId k) const {
        Bytes total = 0;
        for (const DataId d : p_.op(k).writes)
            if (!live_[d.index]) total += p_.data(d).bytes;
        return total;
    }

    // Bytes op k would make live that are still needed later.
    [[nodiscard]] Bytes new_needed_bytes(OpId k) {
        Bytes total = 0;
        for (const DataId d : p_.op(k).writes)
            if (!live_[d.index] && needed_later(d)) total += p_.data(d).bytes;
        return total;
    }

    // Between two writers of equal estimated cost, whether w is the better one: fewer new
    // bytes; or, with GreedyScore::prefer_needed_writes, more new bytes still needed (then fewer
    // new bytes).
    [[nodiscard]] bool better_tie(OpId w, OpId best) {
        if (score_.prefer_needed_writes) {
            const Bytes mine = new_needed_bytes(w), theirs = new_needed_bytes(best);
            if (mine != theirs) return mine > theirs;
        }
        return new_bytes(w) < new_bytes(best);
    }

    // The eligible writer of least estimated cost; ties: better_tie, then lower id.
    [[nodiscard]] std::optional<OpId> cheapest_writer(DataId d) {
        next_decision();
        std::optional<OpId> best;
        double best_cost = 0.0;
        for (const OpId w : p_.writers(d)) {
            if (!eligible(w, d)) continue;
            const double cost = writer_cost(w, depth_);
            if (!best || cost < best_cost || (cost == best_cost && better_tie(w, *best))) {
                best = w;
                best_cost = cost;
            }
        }
        return best;
    }

    // Evicts until op k fits; false when nothing more may go.
    [[nodiscard]] bool make_room(OpId k) {
        const Bytes extra = new_bytes(k) + p_.op(k).overhead;
        while (memory_ + extra > budget_) {
            const std::optional<DataId> victim = pick_victim(k);
            if (!victim) return false;
            drop(*victim);
        }
        return true;
    }

    // Whether d may be evicted before op k runs.
    [[nodiscard]] bool evictable(DataId d, OpId k) const {
        if (pins_[d.index] != 0 || p_.is_final(d) || p_.data(d).bytes == 0) return false;
        if (a_.levels.data[d.index] == graph::never) return false;  // could never come back
        const auto& writes = p_.op(k).writes;
        return std::find(writes.begin(), writes.end(), d) == writes.end();
    }

    // What evicting d would cost to undo: its cheapest writer that does not read it, with the
    // evicted inputs that writer lacks.
    [[nodiscard]] double eviction_cost(DataId d) {
        double best = std::numeric_limits<double>::infinity();
        for (const OpId w : p_.writers(d)) {
            const auto& reads = p_.op(w).reads;
            if (std::find(reads.begin(), reads.end(), d) != reads.end() || !eligible(w, d)) continue;
            best = std::min(best, writer_cost(w, depth_));
        }
        return best;
    }

    [[nodiscard]] std::optional<DataId> pick_victim(OpId k) {
        next_decision();
        std::optional<DataId> best;
        double best_score = 0.0;
        for (const DataId d : live_list_) {
            if (!evictable(d, k)) continue;
            const Bytes bytes = p_.data(d).bytes;
            double score = 0.0;  // smaller is evicted first
            if (rule_ == GreedyEviction::farthest_next_use) {
                const std::size_t next = next_read(d);
                score = next == nowhere ? -std::numeric_limits<double>::infinity() : -static_cast<double>(next);
            } else {
                score = dtr_score(d, bytes);
            }
            if (!best || score < best_score || (score == best_score && bytes > p_.data(*best).bytes) ||
                (score == best_score && bytes == p_.data(*best).bytes && d < *best)) {
                best = d;
                best_score = score;
            }
        }
        return best;
    }

    // DTR's h, or the variant the score asks for.
    [[nodiscard]] double dtr_score(DataId d, Bytes bytes) {
        const auto staleness = static_cast<double>(step_ - last_use_[d.index] + 1);
        const auto size = static_cast<double>(bytes);
        double score = score_.bytes_power == 1.0 && score_.staleness_power == 1.0
                           ? eviction_cost(d) / (size * staleness)
                           : eviction_cost(d) / (std::pow(size, score_.bytes_power) * std::pow(staleness, score_.staleness_power));
        if (score_.noise > 0) score *= std::exp(score_.noise * normal_(rng_));
        return score;
    }

    void emit_run(OpId k) {
        const Op& op = p_.op(k);
        schedule_.push_back(Step::run(k));
        time_ += op.time;
        for (const DataId d : op.writes)
            if (!live_[d.index]) {
                live_[d.index] = 1;
                memory_ += p_.data(d).bytes;
                if (!p_.is_initial(d)) {
                    live_at_[d.index] = live_list_.size();
                    live_list_.push_back(d);
                }
            }
        for (const DataId d : op.reads) last_use_[d.index] = step_;
        for (const DataId d : op.writes) last_use_[d.index] = step_;
        ++step_;
    }

    // Frees a live data that is not initial (a free step).
    void drop(DataId d) {
        schedule_.push_back(Step::free(d));
        live_[d.index] = 0;
        memory_ -= p_.data(d).bytes;
        const std::size_t at = live_at_[d.index];
        live_list_[at] = live_list_.back();
        live_at_[live_list_[at].index] = at;
        live_list_.pop_back();
        live_at_[d.index] = nowhere;
    }

    // After op ran: frees what it touched that is never read again (as store-all does).
    void free_dead(const Op& op) {
        touched_.assign(op.reads.begin(), op.reads.end());
        touched_.insert(touched_.end(), op.writes.begin(), op.writes.end());
        std::sort(touched_.begin(), touched_.end());
        touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
        for (const DataId d : touched_)
            if (live_[d.index] && pins_[d.index] == 0 && !p_.is_initial(d) && !needed_later(d)) drop(d);
    }

    const Problem& p_;
    const Analysis& a_;
    Bytes budget_;
    GreedyEviction rule_;
    std::size_t depth_;
    GreedyScore score_;
    std::mt19937_64 rng_;
    std::normal_distribution<double> normal_{0.0, 1.0};
    std::vector<char> live_;
    std::vector<DataId> live_list_;      // live data that are not initial
    std::vector<std::size_t> live_at_;   // per data: index in live_list_, or nowhere
    std::vector<int> pins_;              // per data: reads of ops waiting on a recomputation
    std::vector<std::size_t> last_use_;  // per data: the last run step that read or wrote it
    std::vector<std::size_t> next_read_;  // per data: index into reads_at, advanced lazily
    std::vector<double> memo_;
    std::vector<std::size_t> memo_stamp_;
    std::vector<DataId> touched_;
    std::size_t stamp_ = 0;
    std::size_t pos_ = 0;   // position in the order
    std::size_t step_ = 0;  // run steps so far
    Bytes memory_ = 0;
    double time_ = 0.0;
    Schedule schedule_;
};

}  // namespace detail::greedy

/// The greedy planner described above; models remat::Solver.
class Greedy {
public:
    explicit Greedy(GreedyOptions options = {}) : options_(options) {
        if (!(options_.portfolio_seconds >= 0) || !(options_.improve_seconds >= 0))
            throw InvalidInput("greedy: portfolio_seconds and improve_seconds must be non-negative numbers of seconds");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "greedy"; }
    [[nodiscard]] const GreedyOptions& options() const noexcept { return options_; }

    /// A plan within `budget`; Infeasible (with the smallest budget the greedy fits) otherwise.
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const Stopwatch clock;
        const detail::greedy::Analysis a = detail::greedy::analyse(problem, options_.order);
        std::optional<detail::greedy::Outcome> best;
        if (budget >= a.lower_bound.bytes) best = plan(problem, a, budget);
        std::string note;
        if (!best) {
            const Bytes smallest = smallest_budget(problem, a);
            if (smallest > budget) throw_infeasible(problem, a, budget, smallest);
            // Not monotone: the greedy fits a smaller budget than this one.
            best = plan(problem, a, smallest);
            note = " (planned at " + std::to_string(smallest) + " bytes)";
        }
        SolverStats stats{std::string(name()), 0.0, SolveStatus::heuristic, std::nullopt,
                          std::string(options_.order == GreedyOrder::memory_aware ? "order=memory-aware " : "") +
                              "eviction=" + std::string(to_string(best->rule)) +
                              " depth=" + std::to_string(options_.neighbourhood_depth) + best->variant + note};
        stats.solve_seconds = clock.seconds();
        return make_checked_plan(problem, std::move(best->schedule), budget, std::move(stats));
    }

    /// The smallest budget this greedy fits `problem` in (bisection between the proven lower
    /// bound of core/bounds.hpp and P_ref, about log2(P_ref − bound) replays).
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        return smallest_budget(problem, detail::greedy::analyse(problem, options_.order));
    }

private:
    [[nodiscard]] std::vector<GreedyEviction> rules() const {
        if (options_.eviction == GreedyEviction::both) return {GreedyEviction::farthest_next_use, GreedyEviction::dtr};
        return {options_.eviction};
    }

    // The plain rule's scores, one per writer choice asked for (the default choice first).
    [[nodiscard]] std::vector<GreedyScore> plain_scores() const {
        GreedyScore score;
        score.depth = options_.neighbourhood_depth;
        std::vector<GreedyScore> scores;
        for (const bool needed : {false, true})
            if (options_.writer == GreedyWriter::both || needed == (options_.writer == GreedyWriter::most_needed_bytes)) {
                score.prefer_needed_writes = needed;
                scores.push_back(score);
            }
        return scores;
    }

    // The writer choice of the next noisy replay: the one asked for; with `both`, the one of
    // the fastest plan so far, and the other every fourth replay. Noise samples plans, and
    // the choice that plans better on a graph is the one worth sampling more.
    [[nodiscard]] bool noisy_prefers_needed(std::uint64_t noisy, const std::vector<detail::greedy::Outcome>& found) const {
        if (options_.writer != GreedyWriter::both) return options_.writer == GreedyWriter::most_needed_bytes;
        const bool fastest = !found.empty() && found.front().prefer_needed_writes;
        return noisy % 4 == 3 ? !fastest : fastest;
    }

    // The score of the next noisy replay of DTR's h: the writer choice above, and that
    // choice's own count of noisy replays as seed and scale of noise (counted here).
    [[nodiscard]] GreedyScore noisy_score(std::uint64_t noisy, const std::vector<detail::greedy::Outcome>& found,
                                          std::array<std::uint64_t, 2>& noisy_count) const {
        const bool needed = noisy_prefers_needed(noisy, found);
        const std::uint64_t own = noisy_count[needed ? 1 : 0]++;
        return GreedyScore{1.0, 1.0, own % 2 == 0 ? 0.3 : 1.0, options_.seed + own, options_.neighbourhood_depth, needed};
    }

    [[nodiscard]] static std::string writer_choice(const GreedyScore& score) {
        return score.prefer_needed_writes ? " writer=" + std::string(to_string(GreedyWriter::most_needed_bytes)) : "";
    }

    // The fastest plan of the rules that fits the budget (ties: the first rule), then of the
    // portfolio's replays, improved when asked.
    [[nodiscard]] std::optional<detail::greedy::Outcome> plan(const Problem& problem, const detail::greedy::Analysis& a,
                                                              Bytes budget) const {
        const Stopwatch clock;
        std::vector<detail::greedy::Outcome> found;
        for (const GreedyEviction rule : rules())
            for (const GreedyScore& score : plain_scores())
                if (auto outcome = detail::greedy::Replay(problem, a, budget, rule, score).run()) {
                    outcome->variant = writer_choice(score);
                    keep_fastest(found, std::move(*outcome));
                }
        if (options_.portfolio_seconds > 0) portfolio(problem, a, budget, clock, found);
        if (found.empty()) return std::nullopt;
        if (options_.improve_seconds > 0) improve(problem, budget, found);
        return std::move(found.front());
    }

    // Replays with the scores of the portfolio (see the top of this header) until its time is
    // spent: the grid of powers and depths first, then noisy replays of DTR's h.
    void portfolio(const Problem& problem, const detail::greedy::Analysis& a, Bytes budget, const Stopwatch& clock,
                   std::vector<detail::greedy::Outcome>& found) const {
        std::vector<GreedyScore> grid;
        for (const double bytes_power : {0.5, 1.0, 1.5, 2.0})
            for (const double staleness_power : {0.0, 0.5, 1.0, 2.0})
                for (const std::size_t depth : {std::size_t{0}, options_.neighbourhood_depth})
                    if (bytes_power != 1.0 || staleness_power != 1.0 || depth != options_.neighbourhood_depth)
                        for (const GreedyScore& writer : plain_scores())  // the writer choices asked for
                            grid.push_back({bytes_power, staleness_power, 0.0, 0, depth, writer.prefer_needed_writes});
        // Each writer choice numbers its own noisy replays (their seeds and scales of noise),
        // so that its sequence is the same whatever the other choice does.
        std::array<std::uint64_t, 2> noisy_count{0, 0};
        for (std::uint64_t i = 0; clock.seconds() < options_.portfolio_seconds; ++i) {
            const GreedyScore score = i < grid.size() ? grid[i] : noisy_score(i - grid.size(), found, noisy_count);
            auto outcome = detail::greedy::Replay(problem, a, budget, GreedyEviction::dtr, score).run();
            if (!outcome) continue;
            outcome->variant = " bytes^" + std::to_string(score.bytes_power) + " staleness^" +
                               std::to_string(score.staleness_power) + " depth " + std::to_string(score.depth) +
                               (score.noise > 0 ? " noise " + std::to_string(score.noise) + " seed " + std::to_string(score.seed) : "") +
                               writer_choice(score);
            keep_fastest(found, std::move(*outcome));
        }
    }

    // Adds a plan to the three fastest kept so far (ties: the earlier stays first).
    static void keep_fastest(std::vector<detail::greedy::Outcome>& found, detail::greedy::Outcome outcome) {
        const auto at = std::upper_bound(found.begin(), found.end(), outcome.time,
                                         [](double time, const auto& o) { return time < o.time; });
        found.insert(at, std::move(outcome));
        if (found.size() > 3) found.pop_back();
    }

    // The three fastest plans locally improved (solvers/improve.hpp); the fastest comes first.
    void improve(const Problem& problem, Bytes budget, std::vector<detail::greedy::Outcome>& found) const {
        const std::size_t count = std::min<std::size_t>(3, found.size());
        ImproveOptions io;
        io.time_limit_seconds = options_.improve_seconds / static_cast<double>(count);
        for (std::size_t i = 0; i < count; ++i) {
            found[i].schedule = improve_schedule(problem, std::move(found[i].schedule), budget, io);
            found[i].time = simulate(problem, found[i].schedule).time;
            found[i].variant += " improved";
        }
        std::stable_sort(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(count),
                         [](const auto& x, const auto& y) { return x.time < y.time; });
    }

    [[nodiscard]] bool fits(const Problem& problem, const detail::greedy::Analysis& a, Bytes budget) const {
        for (const GreedyEviction rule : rules())
            for (const GreedyScore& score : plain_scores())
                if (detail::greedy::Replay(problem, a, budget, rule, score).run()) return true;
        return false;
    }

    [[nodiscard]] Bytes smallest_budget(const Problem& problem, const detail::greedy::Analysis& a) const {
        Bytes lo = a.lower_bound.bytes - 1;  // no schedule at all fits lo
        Bytes hi = a.order_peak;             // the order's own schedule fits its peak (P_ref for store-all's)
        if (!fits(problem, a, hi))
            throw SolverError("greedy: no plan of '" + problem.name() + "' at " + std::to_string(hi) +
                              " bytes, where the order's own schedule fits (this is a bug in the greedy; please "
                              "report it with the problem file)");
        while (hi - lo > 1) {
            const Bytes mid = lo + (hi - lo) / 2;
            (fits(problem, a, mid) ? hi : lo) = mid;
        }
        return hi;
    }

    [[noreturn]] static void throw_infeasible(const Problem& problem, const detail::greedy::Analysis& a, Bytes budget,
                                              Bytes smallest) {
        const std::string head = "greedy: no plan of '" + problem.name() + "' within " + std::to_string(budget) + " bytes";
        const std::string tail = "; the smallest budget the greedy fits is " + std::to_string(smallest) + " bytes";
        if (budget < a.lower_bound.bytes)
            throw Infeasible(head + ": no schedule at all fits, every schedule needs at least " +
                                 std::to_string(a.lower_bound.bytes) + " bytes (" + a.lower_bound.reason + ")" + tail,
                             budget, smallest, InfeasibleBecause::no_schedule_fits);
        throw Infeasible(head + "; this is only beyond the greedy's reach (the proven lower bound is " +
                             std::to_string(a.lower_bound.bytes) + " bytes, " + a.lower_bound.reason +
                             "): an exact solver (checkmate, rockmate) may fit it" + tail,
                         budget, smallest);
    }

    GreedyOptions options_;
};

}  // namespace remat
