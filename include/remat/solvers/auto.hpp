// remat/solvers/auto.hpp — remat::Auto, the solver to use when you do not want to choose one.
//
// It looks at the problem's shape and hands it to the solver made for that shape:
//   - a chain (as_chain, core/chain.hpp)                → RotorRelease (solvers/rotor_release.hpp):
//                                                          Rotor's DP (Beaumont et al. 2019) with
//                                                          checkpoints released and recomputed;
//   - a sequence of at least two blocks of at most
//     AutoOptions::max_block_ops ops each              → Rockmate (Zhao et al. 2023);
//   - any other graph                                  → H-Rockmate (solvers/hierarchical.hpp);
//   - a problem without a loss op (which the block and hierarchy solvers need) → the greedy.
// On problems of at most AutoOptions::second_opinion_max_ops ops, H-Rockmate also plans
// beside Rockmate, and the faster plan wins: their classes differ (Rockmate's blocks keep one
// order per block and its chain DP is persistent), and on block sequences measured from real
// layers H-Rockmate's plan was up to 14.5 % faster. Chains get no second opinion: RotorRelease
// was never slower than H-Rockmate's plan on random chains of 8-30 stages at 40-90 % of
// P_ref (60 cases, faster in 33), and equals the optimum over all schedules on every random
// chain of up to 4 stages tested.
// When the chosen solver has no plan at the budget (or fails), the last resorts are tried in
// turn, so that a budget another method reaches is never reported infeasible: the greedy with
// its portfolio of eviction scores (solvers/greedy.hpp, after DTR, Kirisame et al. 2021), the
// same greedy along an order chosen for memory (a plan may fit by reordering alone), and on
// small problems the exact search (solvers/exhaustive.hpp), which either finds a plan or
// proves the smallest budget any schedule needs. An infeasible answer says whether the budget
// is below a proven bound (core/bounds.hpp, or the exact search's) or only beyond the reach of
// the solvers tried, and carries the smallest budget they know to work. The plan is then
// improved by an exact component when one is given (remat-plan's: Checkmate started from the
// plan), which keeps a share of the time limit for itself. Before it, in that share: on
// problems of at most 48 data the certification's exact search (below), then a proof
// by the states at the loss when one is given (bounds/loss_state_bound.hpp, a logic-based
// Benders decomposition that may also find a faster plan; a plan it proves optimal ends the
// solve), the plan's whole backward searched again exactly (solvers/window_search.hpp), and
// other states at the loss tried, each with its exact best backward
// (solvers/loss_state_search.hpp); the component starts from that plan. Then, on
// problems within the exact search's reach, polished: locally improved (solvers/improve.hpp)
// and its windows searched again exactly (solvers/window_search.hpp, large neighbourhood
// search, Shaw 1998); and certified by the exact search.
// Given a proven time bound (AutoOptions::time_bound), a plan that meets it ends all this
// early: it is optimal over every schedule. Under a time limit, what the limit then leaves
// refines a plan whose certified gap against that bound is still open (solvers/refine.hpp),
// on graphs of any size, until the gap is small (AutoOptions::refine_target_gap). See
// docs/guide.md, "Choosing a solver".
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../bounds/loss_state_bound.hpp"
#include "../core/bounds.hpp"
#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "../partition/blocks.hpp"
#include "exhaustive.hpp"
#include "greedy.hpp"
#include "hierarchical.hpp"
#include "improve.hpp"
#include "loss_state_search.hpp"
#include "refine.hpp"
#include "rockmate.hpp"
#include "rotor.hpp"
#include "rotor_release.hpp"
#include "window_search.hpp"

namespace remat {

/// Which solver Auto hands a problem to.
/// (rotor, Rotor's persistent DP, is not chosen any more: rotor_release's class contains it.)
enum class AutoChoice { rotor, rockmate, hrockmate, greedy, rotor_release };

[[nodiscard]] constexpr std::string_view to_string(AutoChoice choice) noexcept {
    switch (choice) {
        case AutoChoice::rotor: return "rotor";
        case AutoChoice::rockmate: return "rockmate";
        case AutoChoice::hrockmate: return "hrockmate";
        case AutoChoice::greedy: return "greedy";
        case AutoChoice::rotor_release: return "rotor-release";
    }
    return "unknown";
}

struct AutoOptions {
    /// Limit of one solve(problem, budget), analysis and planning at the budget together.
    /// The chain DP (RotorRelease) gets all of it. Rockmate's and H-Rockmate's analyses get
    /// auto_analysis_share of it (Rockmate's shared by its blocks), and planning at a
    /// budget what the analysis left, at least the rest of the share (so each budget of a
    /// sweep gets that much); the greedy's fallback plans within what is then left, its first
    /// replay (milliseconds) always. None: the chain DP unlimited, Rockmate's analysis
    /// auto_default_rockmate_seconds in all, H-Rockmate's its own defaults (40 s, and about
    /// 7 s per budget; HRockmateOptions::budget_time_limit_seconds).
    std::optional<double> time_limit_seconds;
    /// Receives the choice and the chosen solver's progress lines.
    ProgressCallback progress;
    /// Rockmate is chosen only when every block has at most this many ops (forward and
    /// backward): larger blocks make its per-block exact searches slow.
    std::size_t max_block_ops = 64;
    /// Try the greedy (along the store-all order, then along an order chosen for memory) when
    /// the chosen solver has no plan.
    bool greedy_fallback = true;
    /// The seconds each of those greedies spends on its portfolio and improvement (which run
    /// until their time is spent, also where no plan fits); none: 1.5 s, within the time limit.
    std::optional<double> greedy_fallback_seconds;
    /// Applied last to the options of every H-Rockmate Auto plans with (its choice or its
    /// second opinion), after Auto's own time limits. The combined offloading planner
    /// (offload/combined.hpp), whose Auto plans some 25 budgets of one problem, cuts there the
    /// components that run until their time is spent or seldom finish (H-Rockmate's greedy and
    /// exact search: 4 s at each budget of a 94-op U-Net). Empty: Auto's options as they are.
    std::function<HRockmateOptions(HRockmateOptions)> hrockmate_adjustment;
    /// Certification (off at 0): on problems of at most exact_fallback_max_data data, the
    /// exact search, for up to this many seconds (within the time limit), takes the plan as its
    /// incumbent and looks only for faster schedules. It returns one (optimal), proves the plan
    /// optimal over all schedules (status optimal, gap 0), or at its limit states the certified
    /// gap: SolverStats::gap = plan time / proven lower bound - 1, where that bound is above
    /// time_bound (below it, the time bound's gap is the smaller one). The plan's options say
    /// which. On by default: on random DAGs of 20-30 data the heuristics' plans were up to 24 %
    /// slower than the optimum the search finds in milliseconds. Off where a plan is made many
    /// times (the combined offloading planner, remat-plan's sweeps).
    double certify_seconds = 1.0;
    /// The polish (off at 0): on problems within the exact search's reach (at most 128 data
    /// and 64 exactly-once ops), the plan locally improved (solvers/improve.hpp, a quarter of
    /// the seconds at most), then its windows searched again exactly, faster ones spliced in
    /// (solvers/window_search.hpp), for up to this many seconds within the time limit, after
    /// the exact component (out of its reserve, a quarter of it at most) and before the
    /// certification. On bench_checkmate's random DAGs of 40 and 60 ops at 50-80 % of P_ref,
    /// 5 s of window search made the plans 0-8 % faster; after Checkmate, the polish took the
    /// 40-op DAG at 50 % from 119 to 112. Off where certification is.
    double window_search_seconds = 1.0;
    /// An exact component on problems of at most exact_component_max_ops ops, after the
    /// solvers above: called with the best plan so far and the seconds it may take; a faster
    /// valid plan it returns replaces that one. The core has no MILP backend, so it is empty by
    /// default; remat-plan fills it with Checkmate started from the plan
    /// (CheckmateOptions::start), on the backend it has.
    std::function<std::optional<Plan>(const Problem&, Bytes, const Plan& incumbent, double seconds)> exact_component;
    std::size_t exact_component_max_ops = 60;
    /// The exact component's seconds without a time limit. Under one, it takes what the
    /// heuristics left of the limit (at least its reserve, exact_component_share), less the
    /// polish's: a longer limit buys a better plan or a proof.
    double exact_component_seconds = 10.0;
    /// Before the exact component, where it runs (at most 128 data): the plan's whole backward
    /// searched again exactly from what it keeps when the loss runs
    /// (WindowSearchOptions::backward_max_states), in up to this share of the component's
    /// seconds; it stops when that search does, and the component starts from its plan. The
    /// heuristics' backward is often far from the best one from their own state at the loss:
    /// with `remat-plan --time-limit 10`, bench_checkmate's 60-op DAG at 60 % of P_ref went
    /// from 171 to 154 (proven bound 153; the search alone gave 159 in 2 s, where Checkmate
    /// had found nothing in 4 s), the 40-op DAG at 50 % from 112 to 107 (bound 104). 0: off.
    double backward_search_share = 0.5;
    /// Then, in up to this share of what is left of the component's seconds, the loss-state
    /// search (solvers/loss_state_search.hpp): other states at the loss, each with its exact
    /// best backward, the data named by loss_state_preferred tried first. Its plan, when
    /// faster, is the one the component starts from. With `remat-plan --time-limit 10`,
    /// bench_checkmate's 40-op DAG at 60 % of P_ref went from 96 to 93 (the proven time bound:
    /// optimal), at 70 % from 87 to 85 (optimal too). 0: off.
    double loss_state_search_share = 0.5;
    /// The data the loss-state search tries to keep first: remat-plan passes the time lower
    /// bound's relaxation's choice (TimeLowerBound::live_at_loss).
    std::vector<std::string> loss_state_preferred;
    /// A proof first, where the exact component runs: called with the plan's time as the
    /// target and the seconds it may take (loss_state_proof_share of the component's), it
    /// proves a lower bound on the time of every schedule within the budget, and may find a
    /// faster schedule on the way (LossStateBound, bounds/loss_state_bound.hpp). A faster
    /// schedule replaces the plan; a bound that reaches the plan's time makes it optimal
    /// (status optimal, gap 0), and Auto returns it at once; a lower one above time_bound
    /// replaces that for the rest of the solve. Empty by default (it needs a MILP backend);
    /// remat-plan fills it with loss_state_bound. With `remat-plan --time-limit 10`,
    /// bench_checkmate's 60-op DAG at 60 and 80 % of P_ref, where the time bound alone leaves a
    /// gap of one time unit, is proven optimal from the heuristics' plans. 0: off.
    std::function<LossStateBound(const Problem&, Bytes, double target, double seconds)> loss_state_proof;
    double loss_state_proof_share = 0.5;
    /// Where the exact phase runs, on problems of at most certify_first_max_data data (and
    /// with the certification on, certify_seconds > 0), the certification's exact search runs
    /// first in the phase, before the proof, for up to this share of the component's seconds:
    /// on these small problems it is the strongest method of the phase, a proof as well as a
    /// solver. A faster schedule it finds is optimal; a search that finishes proves the plan
    /// optimal (status optimal, gap 0) and Auto returns it at once; one stopped at its limit
    /// raises time_bound to the bound it proved. On bench_checkmate's 40-op chain (41 data) at
    /// 40 % of P_ref it proves the plan (122) optimal in 16 s, and on its 20-op DAG (36 data)
    /// at 60 % (72) in 6.5 s, where the proof by the states at the loss stays at 55 for 11 s and
    /// Checkmate is optimal only within its passes. On its 40-op DAGs (55-58 data) the search
    /// does not finish in 10 s and the proof does in 1-6 s: hence the limit on the data.
    /// 0: off (the certification still runs at the end).
    double certify_first_share = 0.5;
    std::size_t certify_first_max_data = 48;
    /// Last, under a time limit, on problems of at most bound_from_plan_max_ops ops whose plan
    /// is not proven optimal: a bound proven from the plan, in the seconds left. Called with
    /// the plan and those seconds, it returns a lower bound on the time of every schedule
    /// within the budget; one above time_bound replaces it, and a plan that meets it is
    /// optimal (status optimal, gap 0). Empty by default (it needs a MILP backend); remat-plan
    /// fills it with the time bound's relaxations up to a cut at every op of the longest
    /// chain after the loss, each started from the plan (TimeLowerBoundOptions::start). On a
    /// 61-op random chain at 40 % of P_ref (bench_checkmate's generator), `remat-plan
    /// --time-limit 10` proves RotorRelease's 144 optimal in 3.8 s, where the bound before
    /// planning proves 142; on bench_checkmate's own 61-op chain at 40 %, `--time-limit 60`
    /// proves its 140 in 9.9 s (10 s are too few). The 61 ops are beyond the exact phase's
    /// exact_component_max_ops; the relaxations solve where the exact search does not.
    std::function<double(const Problem&, Bytes, const Plan& plan, double seconds)> bound_from_plan;
    std::size_t bound_from_plan_max_ops = 128;
    /// Last of all, under a time limit and with a time bound (time_bound, or a higher one proven
    /// during the solve), where the plan's certified gap is above refine_target_gap: the
    /// seconds the limit leaves refine the plan (remat::refine_plan, solvers/refine.hpp: the
    /// plan locally improved, other states at the loss and its windows searched exactly where
    /// they reach, then rounds of the greedy's portfolio with fresh noise), until its gap is at
    /// most refine_target_gap or the limit is spent. A longer limit then buys a faster plan on
    /// graphs beyond the exact phase too, where the chosen solver used to return with most of
    /// the limit unspent: `remat-plan --time-limit 60` on bench_hierarchical's 283-op U-Net at
    /// 20 % of P_ref returned H-Rockmate's +39.4 % over T_ref in 8 s (certified gap 11.4 %).
    /// Without a time bound nothing says when to stop, so nothing runs: a time limit alone stays
    /// a cap. Off: refine = false.
    bool refine = true;
    double refine_target_gap = 0.03;
    /// Under a time limit, the share of it kept for the exact component where it runs (and
    /// the polish after it; see window_search_seconds): the analyses get auto_analysis_share
    /// of the rest, and the heuristics plan at the budget within what is left less this
    /// share. Without it, the analyses and the heuristics took the whole limit on
    /// bench_checkmate's 40-op DAG (Rockmate's least-peak search on its 36-op block alone
    /// took 5 s of 10) and the component, which found the best plans there, ran for 0.4 s.
    double exact_component_share = 0.5;
    /// Then, on problems of at most exact_fallback_max_data data, the exact search, for at most
    /// exact_fallback_seconds (and within time_limit_seconds).
    bool exact_fallback = true;
    std::size_t exact_fallback_max_data = 64;
    double exact_fallback_seconds = 10.0;
    /// A proven lower bound on the time of every schedule within the budget of the next solve
    /// (bounds/time_lower_bound.hpp; remat-plan proves one by default). A plan that meets it
    /// is optimal over every schedule: Auto stops there (no second opinion, exact component,
    /// polish or certification; H-Rockmate skips its remaining components) and
    /// returns it with status optimal and gap 0. Any other plan gets the certified gap, plan
    /// time / bound - 1, unless it has a smaller one. The bound holds at one budget only:
    /// leave it empty where one Auto plans several (a sweep). A plan faster than it shows it is
    /// no bound at the budget: solve() then throws InvalidInput (naming this option, or
    /// HRockmateOptions::time_bound, to which Auto passes it on).
    std::optional<double> time_bound;
    /// H-Rockmate's plan beside Rotor's or Rockmate's, the faster kept, on problems of at most
    /// this many ops (0: never). Its analysis shares the time limit with the chosen solver's.
    std::size_t second_opinion_max_ops = 160;
    /// Without a time limit: the seconds of the second opinion's analysis (and half of it for
    /// each budget it plans). On random chains of 8-50 stages, 2 s found plans up to 16 %
    /// faster than Rotor's; H-Rockmate's own defaults (40 s) rarely add more.
    double second_opinion_seconds = 2.0;
};

/// True when the problem is a sequence of at least two blocks of at most `max_block_ops` ops.
[[nodiscard]] inline bool is_sequence_of_small_blocks(const Problem& problem, std::size_t max_block_ops = 64) {
    try {
        const BlockPartition partition = partition_blocks(problem);
        if (partition.blocks.size() < 2) return false;
        for (const Block& block : partition.blocks)
            if (block.forward_ops.size() + block.backward_ops.size() > max_block_ops) return false;
        return true;
    } catch (const Error&) {
        return false;  // no block structure that Rockmate can use
    }
}

/// The solver Auto uses for `problem`.
[[nodiscard]] inline AutoChoice auto_choice(const Problem& problem, std::size_t max_block_ops = 64) {
    if (as_chain(problem)) return AutoChoice::rotor_release;
    if (!problem.loss()) return AutoChoice::greedy;  // the block and hierarchy solvers need a loss
    if (is_sequence_of_small_blocks(problem, max_block_ops)) return AutoChoice::rockmate;
    return AutoChoice::hrockmate;
}

/// Rockmate's analysis under Auto when no time limit is given: this many seconds in all, so
/// that planning stays within a minute. (On a 50-block MobileNet it once took 260 s at 5 s a
/// block, for 0.8 % less overhead than with 20 s in all.)
inline constexpr double auto_default_rockmate_seconds = 45.0;

/// The share of AutoOptions::time_limit_seconds that Rockmate's and H-Rockmate's analyses get;
/// planning at the budget has the rest.
inline constexpr double auto_analysis_share = 0.75;

/// Seconds for planning at a budget when the time limit is `limit` and the analysis took
/// `analysed`: what the analysis left, and at least the rest of its share. remat::Auto and
/// remat-plan's H-Rockmate share a limit so.
[[nodiscard]] inline double auto_planning_seconds(double limit, double analysed) {
    return std::max((1 - auto_analysis_share) * limit, limit - analysed);
}

namespace detail::automatic {

// What one solver Auto tried knows of the smallest budget it plans.
struct Reach {
    std::string solver;
    std::optional<Bytes> least;
    bool proven = false;  // its Infeasible proved that no schedule fits (its least is then the least peak)
};

// The exact search's proven lower bound on the least peak (its bounds alone, no search), on
// problems within its limits.
[[nodiscard]] inline std::optional<Bytes> exact_search_bound(const Problem& problem) {
    if (problem.data_count() > Exhaustive::max_data) return std::nullopt;
    try {
        return Exhaustive{}.least_budget_bound(problem);
    } catch (const InvalidInput&) {  // more than 64 exactly-once ops
        return std::nullopt;
    }
}

// Why no solver Auto tried has a plan: below the proven lower bound, below the least peak of
// any schedule (the exact search's proof), or only beyond the reach of the solvers tried,
// naming the one that reaches lowest. `searched`: exact_search_bound(problem).
[[nodiscard]] inline Infeasible infeasible(const Problem& problem, Bytes budget, const std::vector<Reach>& tried,
                                           const std::optional<Bytes>& exact_least, const std::optional<Bytes>& searched) {
    const MemoryLowerBound bound = memory_lower_bound(problem);
    const auto show = [](const std::optional<Bytes>& b) { return b ? std::to_string(*b) + " bytes" : std::string("unknown"); };
    std::string message = "auto: no plan of '" + problem.name() + "' within " + std::to_string(budget) + " bytes: ";
    std::optional<Bytes> least;
    InfeasibleBecause because = InfeasibleBecause::no_schedule_fits;  // but for the last case below
    const Reach* lowest = nullptr;
    for (const Reach& r : tried)
        if (r.least && (!least || *r.least < *least)) {
            least = r.least;
            lowest = &r;
        }
    if (budget < bound.bytes) {
        message += "the budget is below a proven lower bound: every schedule needs at least " +
                   std::to_string(bound.bytes) + " bytes (" + bound.reason + ")";
    } else if (searched && budget < *searched && !exact_least) {
        message += "the budget is below a proven lower bound: every schedule needs at least " + std::to_string(*searched) +
                   " bytes (the exact search's bounds: what exists before an exactly-once op and is needed after it, "
                   "beside that op, less what can be dropped and written again)";
    } else if (exact_least) {
        message += "the budget is below a proven lower bound: the exact search finds no schedule within it, and the "
                   "least peak of any schedule is " + std::to_string(*exact_least) + " bytes";
        least = exact_least;
    } else if (const auto proof = std::find_if(tried.begin(), tried.end(), [](const Reach& r) { return r.proven; });
               proof != tried.end()) {
        // Below the memory lower bound is the case above: a component's proof is its exact search's.
        message += "the budget is below a proven lower bound: the exact search finds no schedule within it (" +
                   proof->solver + "'s)" +
                   (proof->least ? ", and the least peak of any schedule is " + std::to_string(*proof->least) + " bytes"
                                 : std::string());
        if (proof->least) least = proof->least;
    } else {
        because = InfeasibleBecause::beyond_solver;
        message += "the budget is above the proven lower bound of " + std::to_string(bound.bytes) + " bytes (" +
                   bound.reason + ") but beyond the reach of ";
        for (std::size_t i = 0; i < tried.size(); ++i)
            message += (i == 0 ? "" : i + 1 == tried.size() ? " and " : ", ") + tried[i].solver + " (smallest budget " +
                       show(tried[i].least) + ")";
        if (lowest && tried.size() > 1) message += "; " + lowest->solver + " reaches lowest";
        message += "; an exact solver (checkmate, or exhaustive on small problems) may reach further";
    }
    return Infeasible(message, budget, least, because);
}

[[nodiscard]] inline Infeasible infeasible(const Problem& problem, Bytes budget, const std::vector<Reach>& tried,
                                           const std::optional<Bytes>& exact_least = std::nullopt) {
    return infeasible(problem, budget, tried, exact_least, exact_search_bound(problem));
}

// A budget below the proven lower bound needs no analysis: no solver can meet it. The answer
// carries the smallest budget `least` says (called only then).
template <class Least>
void refuse_below_bound(const Problem& problem, Bytes budget, Least&& least) {
    const std::optional<Bytes> searched = exact_search_bound(problem);
    if (budget < memory_lower_bound(problem).bytes || (searched && budget < *searched))
        throw infeasible(problem, budget, {{"auto", least()}}, std::nullopt, searched);
}

// The smallest budget known without an analysis: the greedy's, and RotorRelease's on a chain.
[[nodiscard]] inline Bytes smallest_budget_without_analysis(const Problem& problem) {
    Bytes least = Greedy(HRockmateOptions::default_greedy()).smallest_budget(problem);
    if (const auto chain = as_chain(problem)) {
        try {
            least = std::min(least, RotorRelease{}.smallest_budget(*chain));
        } catch (const Error&) {
            // the greedy's answer stands
        }
    }
    return least;
}

// Says in the plan's options that auto chose the solver that made it (stats.solver names it).
[[nodiscard]] inline Plan tagged(Plan plan, std::string_view who) {
    plan.stats.options = "chose " + std::string(who) + (plan.stats.options.empty() ? "" : ", " + plan.stats.options);
    return plan;
}

}  // namespace detail::automatic

/// What Auto derives from a problem before the budget comes in: its choice and the chosen
/// solver's analysis (Rockmate's blocks or H-Rockmate's clusters), reusable at any budget —
/// a sweep over budgets analyses once (Auto::analyse, Auto::solve(model, budget)).
struct AutoModel {
    Problem problem;
    AutoChoice choice = AutoChoice::hrockmate;
    std::optional<RockmateModel> rockmate;    ///< when choice == rockmate
    /// When choice == hrockmate, or as the second opinion (AutoOptions::second_opinion_max_ops).
    std::optional<HRockmateModel> hrockmate;
    double seconds = 0.0;
};

/// Picks the solver for the problem's shape (see the top of this file) and falls back to
/// the greedy. Models remat::Solver.
class Auto {
public:
    explicit Auto(AutoOptions options = {}) : options_(std::move(options)) {
        if (!(options_.exact_component_share >= 0 && options_.exact_component_share < 1))
            throw InvalidInput("auto: exact_component_share must be at least 0 and below 1 (the share of the time limit "
                               "kept for the exact component)");
        // The shares of the exact component's seconds for the steps before it.
        const auto require_share = [](double share, std::string_view name, std::string_view what) {
            if (!(share >= 0 && share <= 1))
                throw InvalidInput("auto: " + std::string(name) + " must be between 0 and 1 (the share of the exact "
                                   "component's seconds for " + std::string(what) + ")");
        };
        require_share(options_.backward_search_share, "backward_search_share", "the backward search before it");
        require_share(options_.loss_state_proof_share, "loss_state_proof_share", "the proof by the states at the loss");
        require_share(options_.certify_first_share, "certify_first_share", "the exact search that starts the exact phase");
        require_share(options_.loss_state_search_share, "loss_state_search_share",
                      "the loss-state search before it (of what is left)");
        if (!(options_.refine_target_gap >= 0))
            throw InvalidInput("auto: refine_target_gap must be at least 0 (the certified gap at which the refinement "
                               "of the plan stops; 0.03 stops within 3 % of the time bound)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "auto"; }
    [[nodiscard]] const AutoOptions& options() const noexcept { return options_; }

    [[nodiscard]] AutoModel analyse(const Problem& problem) const {
        const Stopwatch clock;
        AutoModel model{problem, auto_choice(problem, options_.max_block_ops), std::nullopt, std::nullopt, 0.0};
        report_progress(options_.progress,
                        "auto: " + std::string(to_string(model.choice)) + " for '" + problem.name() + "'");
        try {
            if (model.choice == AutoChoice::rockmate)
                model.rockmate = Rockmate<>(rockmate_options(problem)).analyse(problem);
            if (model.choice == AutoChoice::hrockmate)
                model.hrockmate = HRockmate(hrockmate_options(problem, std::nullopt)).analyse(problem);
        } catch (const Error& e) {
            // A solver failure, or a valid problem outside the chosen solver's class (a
            // hierarchy needs forward ops it may recompute): the last resorts still plan, and
            // solve() says why the chosen solver is missing.
            report_progress(options_.progress, "auto: the analysis of " + std::string(to_string(model.choice)) +
                                                   " failed (" + e.what() + "); the last resorts plan alone");
        }
        if (wants_second_opinion(model)) {
            try {
                HRockmateOptions o = second_opinion_options(problem, std::nullopt, clock.seconds());
                // Rockmate is auto's own choice here, its blocks analysed already: H-Rockmate
                // need not analyse them again as its Rockmate component (on a 40-op DAG that
                // took 2.4 s of a 10-s limit).
                if (model.rockmate) o.use_rockmate = false;
                model.hrockmate = HRockmate(o).analyse(problem);
                report_progress(options_.progress, "auto: hrockmate's analysis for a second opinion");
            } catch (const Error& e) {
                report_progress(options_.progress, std::string("auto: no second opinion from hrockmate (") + e.what() + ")");
            }
        }
        model.seconds = clock.seconds();
        return model;
    }

    /// A budget below the proven lower bound (core/bounds.hpp) is refused before any analysis.
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        detail::automatic::refuse_below_bound(
            problem, budget, [&] { return detail::automatic::smallest_budget_without_analysis(problem); });
        AutoModel model = analyse(problem);
        Plan plan = solve(model, budget);
        plan.stats.solve_seconds += model.seconds;
        return plan;
    }

    /// Plans at `budget` with a model from analyse().
    [[nodiscard]] Plan solve(const AutoModel& model, Bytes budget) const {
        const Stopwatch clock;
        detail::automatic::refuse_below_bound(model.problem, budget, [&] { return smallest_budget(model); });
        // Seconds left of the planning's share (see AutoOptions::time_limit_seconds).
        const auto left = [&]() -> std::optional<double> {
            if (!options_.time_limit_seconds) return std::nullopt;
            return std::max(0.0, auto_planning_seconds(*options_.time_limit_seconds, model.seconds) - clock.seconds());
        };
        // What the heuristics (the chosen solver, the second opinion, the window search) may
        // take of it: the exact component keeps its reserve.
        const auto heuristics_left = [&]() -> std::optional<double> {
            const std::optional<double> all = left();
            if (!all) return all;
            return std::max(0.0, *all - exact_reserve(model.problem));
        };
        std::vector<detail::automatic::Reach> tried{{std::string(to_string(model.choice)), std::nullopt}};
        // AutoOptions::time_bound, or the higher one loss_state_proof proves.
        std::optional<double> time_bound = options_.time_bound;
        // Whether `plan` meets the time bound (then marked optimal): nothing can beat it.
        const auto settled = [&](Plan& plan) {
            if (!time_bound) return false;
            require_time_bound_holds(plan.time, *time_bound, "AutoOptions::time_bound");
            return settle_by_time_bound(plan, *time_bound);
        };
        std::optional<Plan> chosen;
        try {
            chosen = detail::automatic::tagged(solve_chosen(model, budget, heuristics_left()), to_string(model.choice));
        } catch (const Infeasible& e) {
            tried.back().least = e.smallest_budget();
            tried.back().proven = e.proven();
            if (!options_.greedy_fallback && !second_opinion_of(model)) throw;
        } catch (const SolverError& e) {
            if (!options_.greedy_fallback && !second_opinion_of(model)) throw;
            report_progress(options_.progress, "auto: " + std::string(to_string(model.choice)) + " failed (" +
                                                   e.what() + ")");
        }
        if (second_opinion_of(model) && !(chosen && settled(*chosen)))
            take_second_opinion(model, budget, heuristics_left(), chosen, tried);
        if (chosen) {
            // Each step only where the plan so far does not meet the proven time bound. The
            // polish comes after the exact component, keeping its seconds: Checkmate's plans
            // were the ones it made faster (see polish()).
            const auto left_for_exact_component = [&]() -> std::optional<double> {
                const std::optional<double> all = left();
                if (!all) return all;
                return std::max(0.0, *all - polish_seconds(model.problem));
            };
            if (!settled(*chosen)) certify_first(model.problem, budget, *chosen, time_bound, left_for_exact_component());
            if (!settled(*chosen)) prove_by_loss_states(model.problem, budget, *chosen, time_bound, left_for_exact_component());
            if (!settled(*chosen)) search_backward(model.problem, budget, *chosen, left_for_exact_component());
            if (!settled(*chosen)) search_loss_states(model.problem, budget, *chosen, time_bound, left_for_exact_component());
            if (!settled(*chosen)) improve_by_exact_component(model.problem, budget, *chosen, left_for_exact_component());
            if (!settled(*chosen)) polish(model.problem, budget, *chosen, left());
            if (!settled(*chosen)) certify(model.problem, budget, *chosen, time_bound, left());
            if (!settled(*chosen)) prove_from_plan(model.problem, budget, *chosen, time_bound, left());
            if (!settled(*chosen)) refine_against_bound(model.problem, budget, *chosen, time_bound, left());
            return finished(std::move(*chosen), clock, time_bound);
        }
        // A component proved that no schedule fits (H-Rockmate's exact search of an unpartitioned
        // problem): the last resorts below would only spend the time left trying.
        const bool proven = std::any_of(tried.begin(), tried.end(), [](const detail::automatic::Reach& r) { return r.proven; });
        if (!options_.greedy_fallback || proven) throw detail::automatic::infeasible(model.problem, budget, tried);
        for (const GreedyOrder order : {GreedyOrder::store_all, GreedyOrder::memory_aware}) {
            const std::string who = order == GreedyOrder::store_all ? "greedy" : "greedy (memory-aware order)";
            tried.push_back({who, std::nullopt});
            std::optional<double> within = left();
            if (options_.greedy_fallback_seconds)
                within = std::min(within.value_or(*options_.greedy_fallback_seconds), *options_.greedy_fallback_seconds);
            try {
                return finished(detail::automatic::tagged(Greedy(greedy_options(within, order)).solve(model.problem, budget),
                                                          who + " (last resort)"),
                                clock);
            } catch (const Infeasible& e) {
                tried.back().least = e.smallest_budget();
            }
        }
        std::optional<Bytes> exact_least;
        if (const auto exact = exact_search(model.problem, left())) {
            report_progress(options_.progress, "auto: no heuristic plan; the exact search of '" + model.problem.name() +
                                                   "' (" + std::to_string(model.problem.data_count()) + " data)");
            try {
                return finished(detail::automatic::tagged(exact->solve(model.problem, budget), "exhaustive (last resort)"),
                                clock);
            } catch (const Infeasible& e) {
                exact_least = e.smallest_budget();  // the least peak of any schedule, when found in time
            } catch (const SolverError& e) {
                report_progress(options_.progress, std::string("auto: the exact search gave up: ") + e.what());
            }
        }
        throw detail::automatic::infeasible(model.problem, budget, tried, exact_least);
    }

    /// The smallest budget the chosen solver or the greedy plans (the lower of the two).
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const { return smallest_budget(analyse(problem)); }
    [[nodiscard]] Bytes smallest_budget(const AutoModel& model) const {
        Bytes least = Greedy(HRockmateOptions::default_greedy()).smallest_budget(model.problem);
        if (options_.greedy_fallback)
            least = std::min(least, Greedy(greedy_options(std::nullopt, GreedyOrder::memory_aware)).smallest_budget(model.problem));
        try {
            if (model.choice == AutoChoice::rotor)
                least = std::min(least, Rotor(rotor_options()).smallest_budget(*as_chain(model.problem)));
            else if (model.choice == AutoChoice::rotor_release)
                least = std::min(least, RotorRelease(rotor_options()).smallest_budget(*as_chain(model.problem)));
            else if (model.rockmate)
                least = std::min(least, Rockmate<>(rockmate_options(model.problem)).smallest_budget(*model.rockmate));
        } catch (const Error&) {
            // the greedy's answer stands
        }
        try {
            if (model.hrockmate)
                least = std::min(least, HRockmate(hrockmate_options(model.problem, std::nullopt)).smallest_budget(*model.hrockmate));
        } catch (const Error&) {
            // the others' answer stands
        }
        return least;
    }

private:
    // H-Rockmate's plan beside the chosen solver's (AutoOptions::second_opinion_max_ops),
    // within `planning` seconds: it replaces `chosen` where faster.
    void take_second_opinion(const AutoModel& model, Bytes budget, const std::optional<double>& planning,
                             std::optional<Plan>& chosen, std::vector<detail::automatic::Reach>& tried) const {
        tried.push_back({"hrockmate (second opinion)", std::nullopt});
        try {
            Plan other = HRockmate(second_opinion_options(model.problem, planning)).solve(*model.hrockmate, budget);
            if (!chosen || other.time < chosen->time) {
                const std::string against = chosen ? "faster than " + std::string(to_string(model.choice)) + " by " +
                                                         format_percent(1.0 - other.time / chosen->time)
                                                   : std::string(to_string(model.choice)) + " had no plan";
                chosen = detail::automatic::tagged(std::move(other), "hrockmate (" + against + ")");
            }
        } catch (const Infeasible& e) {
            tried.back().least = e.smallest_budget();
            tried.back().proven = e.proven();
        } catch (const SolverError& e) {
            report_progress(options_.progress, std::string("auto: hrockmate's second opinion failed (") + e.what() + ")");
        }
    }
    // The plan as solve() returns it: with its certified gap from AutoOptions::time_bound
    // (status optimal where it meets it) and the seconds of planning at the budget.
    // `time_bound`: AutoOptions::time_bound, or the higher one loss_state_proof proved.
    [[nodiscard]] Plan finished(Plan plan, const Stopwatch& clock) const { return finished(std::move(plan), clock, options_.time_bound); }
    [[nodiscard]] Plan finished(Plan plan, const Stopwatch& clock, const std::optional<double>& time_bound) const {
        if (time_bound) {
            require_time_bound_holds(plan.time, *time_bound, "AutoOptions::time_bound");
            certify_by_time_bound(plan, *time_bound);
        }
        plan.stats.solve_seconds = clock.seconds();
        return plan;
    }
    [[nodiscard]] RotorOptions rotor_options() const {
        RotorOptions o;
        o.time_limit_seconds = options_.time_limit_seconds;
        o.progress = options_.progress;
        return o;
    }
    // The seconds of the time limit kept for the exact component on `problem`
    // (AutoOptions::exact_component_share; 0 where it does not run).
    [[nodiscard]] double exact_reserve(const Problem& problem) const {
        if (!options_.time_limit_seconds || !runs_exact_phase(problem)) return 0.0;
        return options_.exact_component_share * *options_.time_limit_seconds;
    }
    // The analysis' share of the time limit, if any (of what the exact component's reserve leaves).
    [[nodiscard]] std::optional<double> analysis_seconds(const Problem& problem) const {
        if (!options_.time_limit_seconds) return std::nullopt;
        return auto_analysis_share * (*options_.time_limit_seconds - exact_reserve(problem));
    }
    // Rockmate's blocks share the analysis' share (auto_default_rockmate_seconds without a
    // limit), each at most H-Rockmate's per-block default.
    [[nodiscard]] RockmateOptions rockmate_options(const Problem& problem) const {
        RockmateOptions o = HRockmateOptions::default_rockmate();
        o.time_limit_seconds = analysis_seconds(problem).value_or(auto_default_rockmate_seconds);
        o.progress = options_.progress;
        return o;
    }
    // Whether H-Rockmate also analyses a problem for which auto chose Rotor or Rockmate.
    [[nodiscard]] bool wants_second_opinion(const AutoModel& model) const {
        return (model.choice == AutoChoice::rotor || model.choice == AutoChoice::rockmate) && model.problem.loss() &&
               model.problem.op_count() <= options_.second_opinion_max_ops;
    }
    [[nodiscard]] static bool second_opinion_of(const AutoModel& model) {
        return model.choice != AutoChoice::hrockmate && model.hrockmate.has_value();
    }
    // The second opinion's: within what the chosen solver's analysis (`analysed` seconds) left
    // of the analysis' share, or second_opinion_seconds without a time limit.
    [[nodiscard]] HRockmateOptions second_opinion_options(const Problem& problem, const std::optional<double>& planning,
                                                          double analysed = 0.0) const {
        HRockmateOptions o = hrockmate_options(problem, planning);
        if (const auto analysis = analysis_seconds(problem)) {
            o.time_limit_seconds = std::max(*analysis - analysed, 1e-3);
        } else {
            o.time_limit_seconds = std::max(options_.second_opinion_seconds, 1e-3);
            o.budget_time_limit_seconds = std::max(options_.second_opinion_seconds / 2, 1e-3);
        }
        return o;
    }
    // `planning`: seconds left for planning at a budget (none: H-Rockmate's own limits).
    [[nodiscard]] HRockmateOptions hrockmate_options(const Problem& problem, const std::optional<double>& planning) const {
        HRockmateOptions o;
        o.time_bound = options_.time_bound;
        if (const auto analysis = analysis_seconds(problem)) o.time_limit_seconds = *analysis;
        if (planning) o.budget_time_limit_seconds = std::max(*planning, 1e-3);
        o.progress = options_.progress;
        return options_.hrockmate_adjustment ? options_.hrockmate_adjustment(std::move(o)) : o;
    }
    // The greedy's portfolio and improvement within `planning` seconds, if given.
    [[nodiscard]] static GreedyOptions greedy_options(const std::optional<double>& planning,
                                                      GreedyOrder order = GreedyOrder::store_all) {
        GreedyOptions o = HRockmateOptions::default_greedy();
        o.order = order;
        return planning ? greedy_within(o, *planning) : o;
    }
    // The seconds polish() takes on `problem` at most (0 where the window search cannot run):
    // where the exact component runs under a time limit, at most a quarter of its reserve.
    [[nodiscard]] double polish_seconds(const Problem& problem) const {
        if (problem.data_count() > Exhaustive::max_data) return 0.0;
        const double seconds = std::max(0.0, options_.window_search_seconds);
        const double reserve = exact_reserve(problem);
        return reserve > 0 ? std::min(seconds, 0.25 * reserve) : seconds;
    }
    // AutoOptions::window_search_seconds: the plan locally improved (solvers/improve.hpp), then
    // its windows searched exactly (see there). The improvement takes a quarter of the
    // seconds at most (milliseconds on 40 ops): Checkmate's plans, rounded from its
    // relaxation, kept recomputations that the budget no longer needed (on bench_checkmate's
    // 40-op DAG at 50 % of P_ref, 119 -> 114, and the windows then 114 -> 112).
    void polish(const Problem& problem, Bytes budget, Plan& plan, const std::optional<double>& planning) const {
        const double seconds = std::min(polish_seconds(problem), planning.value_or(options_.window_search_seconds));
        if (!(seconds > 0.01)) return;
        const Stopwatch clock;
        ImproveOptions io;
        io.time_limit_seconds = seconds / 4;
        adopt_if_faster(problem, budget, plan, improve_schedule(problem, plan.schedule, budget, io), "locally improved");
        report_progress(options_.progress, "auto: searching the windows of the plan of '" + problem.name() + "' exactly");
        WindowSearchOptions o;
        o.time_limit_seconds = std::max(0.0, seconds - clock.seconds());
        o.progress = options_.progress;
        plan = window_search(problem, budget, std::move(plan), o).plan;
    }

    // `schedule` replaces the plan's where the simulator finds it within the budget and faster;
    // the plan's options then say `how` and by how much. Its status becomes heuristic: what its
    // solver proved was about its own schedule.
    void adopt_if_faster(const Problem& problem, Bytes budget, Plan& plan, Schedule schedule, std::string_view how) const {
        const SimulationReport checked = simulate(problem, schedule);  // the simulator's figures, not a claim
        if (!checked.fits(budget) || !(checked.time < plan.time)) return;
        const double before = plan.time;
        plan.schedule = std::move(schedule);
        plan.time = checked.time;
        plan.peak = checked.peak;
        plan.stats.status = SolveStatus::heuristic;
        plan.stats.gap.reset();
        plan.stats.options += ", " + std::string(how) + " (" + format_percent(1.0 - plan.time / before) + " faster)";
    }

    // Whether the exact phase runs on `problem`: the proof, the searches and the exact component,
    // in the component's reserve of the time limit (where either the proof or the component is given).
    [[nodiscard]] bool runs_exact_phase(const Problem& problem) const {
        return (options_.exact_component || options_.loss_state_proof) && problem.op_count() <= options_.exact_component_max_ops;
    }
    // The seconds of the exact component (AutoOptions::exact_component_seconds), given what
    // the time limit leaves it (`planning`, none without a limit).
    [[nodiscard]] double exact_component_seconds(const std::optional<double>& planning) const {
        return planning.value_or(options_.exact_component_seconds);
    }
    // AutoOptions::backward_search_share: the plan's backward searched whole before the exact
    // component, where that runs (see there).
    void search_backward(const Problem& problem, Bytes budget, Plan& plan, const std::optional<double>& planning) const {
        if (!runs_exact_phase(problem) || problem.data_count() > Exhaustive::max_data) return;
        const double seconds = options_.backward_search_share * exact_component_seconds(planning);
        if (!(seconds > 0.01)) return;
        report_progress(options_.progress, "auto: searching the backward of the plan of '" + problem.name() + "' exactly");
        WindowSearchOptions o;
        o.time_limit_seconds = seconds;
        o.max_states_per_window = 0;  // the backward alone; the sliding windows come in the polish
        o.progress = options_.progress;
        plan = window_search(problem, budget, std::move(plan), o).plan;
    }

    // AutoOptions::loss_state_search_share: other states at the loss, before the exact
    // component, where that runs (see there).
    void search_loss_states(const Problem& problem, Bytes budget, Plan& plan, const std::optional<double>& time_bound,
                            const std::optional<double>& planning) const {
        if (!runs_exact_phase(problem)) return;
        const double seconds = options_.loss_state_search_share * exact_component_seconds(planning);
        if (!(seconds > 0.01)) return;
        report_progress(options_.progress, "auto: searching the states at the loss of '" + problem.name() + "'");
        LossStateSearchOptions o;
        o.time_limit_seconds = seconds;
        o.preferred = options_.loss_state_preferred;
        o.time_bound = time_bound;
        o.progress = options_.progress;
        plan = loss_state_search(problem, budget, std::move(plan), o).plan;
    }

    // AutoOptions::loss_state_proof: `plan` replaced by a faster one, proven optimal, or
    // `time_bound` raised (see there).
    void prove_by_loss_states(const Problem& problem, Bytes budget, Plan& plan, std::optional<double>& time_bound,
                              const std::optional<double>& planning) const {
        if (!options_.loss_state_proof || !runs_exact_phase(problem)) return;
        const double seconds = options_.loss_state_proof_share * exact_component_seconds(planning);
        if (!(seconds > 0.01)) return;
        report_progress(options_.progress, "auto: proving the plan of '" + problem.name() + "' by its states at the loss");
        try {
            const LossStateBound proof = options_.loss_state_proof(problem, budget, plan.time, seconds);
            if (!proof.applicable) return;
            if (proof.faster) adopt_if_faster(problem, budget, plan, *proof.faster, "a faster state at the loss from the proof");
            raise_time_bound(plan, time_bound, proof.time, "AutoOptions::loss_state_proof",
                             "proven optimal by its states at the loss");
        } catch (const SolverError& e) {
            report_progress(options_.progress, std::string("auto: the proof failed (") + e.what() + ")");
        }
    }

    // AutoOptions::exact_component: a faster plan from it replaces `plan` (see there).
    void improve_by_exact_component(const Problem& problem, Bytes budget, Plan& plan,
                                    const std::optional<double>& planning) const {
        if (!options_.exact_component || !runs_exact_phase(problem)) return;
        const double seconds = exact_component_seconds(planning);
        if (!(seconds > 0.05)) return;
        report_progress(options_.progress, "auto: the exact component on '" + problem.name() + "', started from the plan");
        try {
            std::optional<Plan> other = options_.exact_component(problem, budget, plan, seconds);
            if (!other) return;
            const SimulationReport checked = simulate(problem, other->schedule);  // the simulator's figures, not the claim
            if (!checked.fits(budget) || !(checked.time < plan.time)) {
                // Nothing faster: where the component proved its optimum, the plan is optimal too.
                if (checked.fits(budget) && other->stats.status == SolveStatus::optimal && checked.time >= plan.time) {
                    plan.stats.status = SolveStatus::optimal;
                    // Checkmate's start met the proven time bound: optimal over every schedule,
                    // not only within the passes its model allows.
                    const bool over_every_schedule =
                        other->stats.options.find("meets the proven time bound") != std::string::npos;
                    plan.stats.options += ", " + other->stats.solver + " found nothing faster" +
                                          (over_every_schedule ? " (its time meets the proven time bound: optimal over every schedule)"
                                                               : " (optimal within its model)");
                }
                return;
            }
            other->time = checked.time;
            other->peak = checked.peak;
            const std::string against = "exact component, faster than " + plan.stats.solver + " by " +
                                        format_percent(1.0 - other->time / plan.time);
            plan = detail::automatic::tagged(std::move(*other), other->stats.solver + " (" + against + ")");
        } catch (const Error& e) {
            report_progress(options_.progress, std::string("auto: the exact component failed (") + e.what() + ")");
        }
    }
    // AutoOptions::certify_seconds: the exact search against the plan (see there). A bound it
    // proves at its limit is stated only where it is above `time_bound`: below it, the time
    // bound's gap is the smaller one, and finished() reports that.
    void certify(const Problem& problem, Bytes budget, Plan& plan, const std::optional<double>& time_bound,
                 const std::optional<double>& planning) const {
        const double seconds = std::min(options_.certify_seconds, planning.value_or(options_.certify_seconds));
        const std::optional<Exhaustive::Certificate> c = certification(problem, budget, plan, seconds);
        if (!c) return;
        if (c->faster) {
            adopt_certified(plan, *c->faster, "certification");
        } else if (c->complete) {
            plan.stats.status = SolveStatus::optimal;
            plan.stats.gap = 0.0;
            plan.stats.options += ", certified optimal by the exact search";
        } else if (const std::optional<double> gap = certified_gap(plan.time, c->lower_bound);
                   gap && (!plan.stats.gap || *gap < *plan.stats.gap) && (!time_bound || c->lower_bound > *time_bound)) {
            // (a smaller gap the plan has, Checkmate's or the time bound's, stays)
            plan.stats.gap = gap;
            plan.stats.options += ", certified gap " + format_percent(*plan.stats.gap) + " (the exact search's bound " +
                                  std::to_string(c->lower_bound) + ")";
        }
    }
    // The certification's exact search against `plan` for `seconds`, where it reaches (see
    // AutoOptions::certify_seconds); none where it does not.
    [[nodiscard]] std::optional<Exhaustive::Certificate> certification(const Problem& problem, Bytes budget, const Plan& plan,
                                                                      double seconds) const {
        if (!(options_.certify_seconds > 0) || !(seconds > 0.01) ||
            problem.data_count() > std::min(options_.exact_fallback_max_data, Exhaustive::max_data))
            return std::nullopt;
        ExhaustiveOptions o;
        o.time_limit_seconds = seconds;
        o.max_states = 2'000'000;
        report_progress(options_.progress, "auto: certifying the plan of '" + problem.name() + "' by the exact search");
        try {
            return Exhaustive(o).certify(problem, budget, plan.time);
        } catch (const InvalidInput&) {
            return std::nullopt;  // beyond the exact search's limits (more than 64 exactly-once ops)
        }
    }
    // The certification's faster schedule (optimal) in place of `plan`, saying which step found it.
    static void adopt_certified(Plan& plan, Plan faster, std::string_view step) {
        faster.stats.gap = 0.0;
        faster.stats.options = "chose exhaustive (" + std::string(step) + ", faster than " + plan.stats.solver + " by " +
                               format_percent(1.0 - faster.time / plan.time) + "), " + plan.stats.options;
        plan = std::move(faster);
    }
    // A lower bound `proven` on every schedule, from `who`: where above `time_bound`, it becomes
    // the bound for the rest of the solve, and a plan that meets it is optimal (`note` says why).
    static void raise_time_bound(Plan& plan, std::optional<double>& time_bound, double proven, std::string_view who,
                                 std::string_view note) {
        if (time_bound && proven <= *time_bound) return;
        require_time_bound_holds(plan.time, proven, who);
        time_bound = proven;
        if (settle_by_time_bound(plan, proven)) plan.stats.options += ", " + std::string(note);
    }
    // AutoOptions::certify_first_share: the certification first in the exact phase; what it
    // proves becomes `time_bound` (see there).
    void certify_first(const Problem& problem, Bytes budget, Plan& plan, std::optional<double>& time_bound,
                       const std::optional<double>& planning) const {
        if (!runs_exact_phase(problem) || problem.data_count() > options_.certify_first_max_data) return;
        const std::optional<Exhaustive::Certificate> c =
            certification(problem, budget, plan, options_.certify_first_share * exact_component_seconds(planning));
        if (!c) return;
        if (c->faster) adopt_certified(plan, *c->faster, "certification first");
        raise_time_bound(plan, time_bound, c->complete ? plan.time : c->lower_bound, "the certification's exact search",
                         "certified optimal by the exact search");
    }
    // AutoOptions::bound_from_plan: under a time limit, the seconds left prove a bound from the
    // plan; it raises `time_bound` (see there).
    void prove_from_plan(const Problem& problem, Bytes budget, Plan& plan, std::optional<double>& time_bound,
                         const std::optional<double>& planning) const {
        if (!options_.bound_from_plan || !planning || !(*planning > 0.01) ||
            problem.op_count() > options_.bound_from_plan_max_ops)
            return;
        report_progress(options_.progress, "auto: proving a bound on '" + problem.name() + "' from its plan");
        try {
            raise_time_bound(plan, time_bound, options_.bound_from_plan(problem, budget, plan, *planning),
                             "AutoOptions::bound_from_plan", "proven optimal by the time bound from the plan");
        } catch (const SolverError& e) {
            report_progress(options_.progress, std::string("auto: the bound from the plan failed (") + e.what() + ")");
        }
    }
    // AutoOptions::refine: under a time limit, the seconds left spent on a faster plan while
    // its certified gap against `time_bound` is above the target (see there).
    void refine_against_bound(const Problem& problem, Bytes budget, Plan& plan, const std::optional<double>& time_bound,
                              const std::optional<double>& planning) const {
        if (!options_.refine || !time_bound || !planning || !(*planning > 0.05)) return;
        const std::optional<double> gap = certified_gap(plan.time, *time_bound);
        if (!gap || *gap <= options_.refine_target_gap) return;
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f s", *planning);
        report_progress(options_.progress, "auto: refining the plan of '" + problem.name() + "' (certified gap " +
                                               format_percent(*gap) + ") for up to " + seconds);
        RefineOptions o;
        o.time_limit_seconds = *planning;
        o.target_gap = options_.refine_target_gap;
        o.loss_state_preferred = options_.loss_state_preferred;
        o.progress = options_.progress;
        plan = refine_plan(problem, budget, std::move(plan), *time_bound, o);
    }
    // The exact search, on a problem small enough and with time left for it.
    [[nodiscard]] std::optional<Exhaustive> exact_search(const Problem& problem,
                                                         const std::optional<double>& planning) const {
        if (!options_.exact_fallback || problem.data_count() > options_.exact_fallback_max_data ||
            problem.data_count() > Exhaustive::max_data)
            return std::nullopt;
        const double seconds = std::min(options_.exact_fallback_seconds, planning.value_or(options_.exact_fallback_seconds));
        if (!(seconds > 0.01)) return std::nullopt;
        ExhaustiveOptions o;
        o.time_limit_seconds = seconds;
        o.max_states = 2'000'000;
        return Exhaustive(o);
    }
    [[nodiscard]] Plan solve_chosen(const AutoModel& model, Bytes budget, const std::optional<double>& planning) const {
        if (model.choice == AutoChoice::rotor) return Rotor(rotor_options()).solve(model.problem, budget);
        if (model.choice == AutoChoice::rotor_release) return RotorRelease(rotor_options()).solve(model.problem, budget);
        if (model.choice == AutoChoice::greedy) return Greedy(greedy_options(planning)).solve(model.problem, budget);
        if (model.rockmate) return Rockmate<>(rockmate_options(model.problem)).solve(*model.rockmate, budget);
        if (model.hrockmate) return HRockmate(hrockmate_options(model.problem, planning)).solve(*model.hrockmate, budget);
        throw SolverError("auto: " + std::string(to_string(model.choice)) + " has no analysis of '" +
                          model.problem.name() + "'");
    }

    AutoOptions options_;
};

static_assert(Solver<Auto>);

}  // namespace remat
