// remat/offload/combined.hpp — one device budget for everything a training step holds, split
// between weights and activations: rematerialization and weight offloading chosen together.
//
// The planner iterates the two parts (docs/design.md §4.12): for activation budgets
// from the solver's smallest to store-all's, any remat solver (Rotor on chains, H-Rockmate on
// graphs, remat::Auto) plans the activations (offload/training_state.hpp), the updates go
// back in, and when the step still overflows the total budget, Greedy or Greedy* weight
// offloading (offload/greedy.hpp) covers the rest. The plan with the least makespan wins. The
// candidates include rematerialization alone (the largest activation budget that fits with
// every weight on the device) and weight offloading alone (store-all's activations), so the
// result is never worse than either part alone, and the fastest activation budget of the
// grid is refined by halving the gaps to its neighbours. The solver plans some 40 activation
// budgets of one problem: given remat::Auto, the planner analyses it once and turns off its
// per-budget second opinion and last resorts (seconds each: a 6-op graph took minutes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../core/bounds.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "../io/budget.hpp"
#include "../solvers/auto.hpp"
#include "../solvers/store_all.hpp"
#include "greedy.hpp"
#include "schedule.hpp"
#include "simulate.hpp"
#include "training_state.hpp"

namespace remat::offload {

/// An offloading plan and what the simulator says of it.
struct OffloadPlan {
    OffloadSchedule schedule;
    OffloadReport report;
    Bytes budget = 0;
    /// The activation budget the remat solver planned at (the split of the budget).
    Bytes activation_budget = 0;
    /// "remat", "greedy", "greedy*", "remat+greedy*": what made the plan.
    std::string method;
};

struct CombinedOptions {
    GreedyVariant variant = GreedyVariant::repeated;
    /// Activation budgets tried between the solver's smallest and store-all's (evenly).
    std::size_t activation_budgets = 12;
    std::optional<TransferSettings> transfers;
    /// Whether weights may spend the time between steps on the host (WeightOffloadOptions).
    bool between_steps = true;
    /// Seconds for the whole plan; none: no limit. Each solve of the activations gets at most
    /// what is left (solvers with a time limit: TimeBoundedSolver, Auto and H-Rockmate, which
    /// still return their quickest plan when it is spent). Once it is spent, the best plan so
    /// far stands and no further activation budget is planned; while there is none, the
    /// planner goes on with those quickest plans, so that the limit never turns a budget that
    /// fits into "no plan".
    std::optional<double> time_limit_seconds{};
    /// After those activation budgets (plan_with_offload), rounds of refinement around the
    /// fastest so far: each plans the budgets halfway to its neighbours among those tried (two
    /// solves at most). The makespan is far from smooth in the activation budget: on the
    /// GPT-like example at 20 % of everything the step holds, the grid's best split takes 95.9
    /// and 6 rounds find 70.9, what a grid of 48 finds. 0: the grid alone.
    std::size_t refinement_rounds = 6;
};

/// What the solvers the combined planner runs at its many activation budgets spend, at each,
/// on a component that runs until its time is spent (Auto's greedy last resorts, H-Rockmate's
/// greedy component, also where no plan fits) or seldom finishes there (H-Rockmate's exact
/// search), in seconds.
inline constexpr double many_budgets_component_seconds = 0.05;

/// What H-Rockmate spends at each activation budget in all (its budget_time_limit_seconds),
/// in seconds. Its hierarchy's top search took up to 1.2 s per budget on a 283-op U-Net with a
/// weight per convolution, where its greedy component's plan was the faster one at every
/// budget; the plans of remat-plan --offload there are the same with this limit (12-60 % of
/// everything the step holds), in 6 s instead of 9.3 s at 40 %.
inline constexpr double many_budgets_budget_seconds = 0.5;

/// H-Rockmate as the combined planner runs it at each activation budget: its greedy
/// component's portfolio and improvement cut from 1 s and 0.5 s to
/// many_budgets_component_seconds in all (2 s per budget: 48 s for the GPT-like example's 24
/// budgets, against auto's 0.03 s), its exact search (2 s, on problems of at most 128 data)
/// too, each budget within many_budgets_budget_seconds (or the limit given, if less), and no
/// time bound (it holds at one budget only).
[[nodiscard]] inline HRockmateOptions hrockmate_for_many_budgets(HRockmateOptions options) {
    options.greedy = greedy_within(options.greedy, many_budgets_component_seconds);
    options.exact_component_seconds = many_budgets_component_seconds;
    options.time_bound.reset();
    options.budget_time_limit_seconds =
        std::min(options.budget_time_limit_seconds.value_or(many_budgets_budget_seconds), many_budgets_budget_seconds);
    return options;
}

/// Auto as the combined planner runs it at each activation budget: without what costs seconds
/// at each (the second opinion, the exact search and exact component, up to 10 s, the
/// certification and the polish), with its greedy last resorts' portfolios cut from 1.5 s to
/// many_budgets_component_seconds each, and the H-Rockmate it plans with as
/// hrockmate_for_many_budgets has it (67 s on a 283-op U-Net at 40 % of everything the step
/// holds, 2 s at each activation budget, before). A proven time bound holds at one budget only:
/// it is dropped, and with it the refinement that aims at it.
[[nodiscard]] inline AutoOptions auto_for_many_budgets(AutoOptions options) {
    options.second_opinion_max_ops = 0;
    options.greedy_fallback_seconds = many_budgets_component_seconds;
    options.hrockmate_adjustment = [adjust = std::move(options.hrockmate_adjustment)](HRockmateOptions o) {
        return hrockmate_for_many_budgets(adjust ? adjust(std::move(o)) : std::move(o));
    };
    options.exact_fallback = false;
    options.certify_seconds = 0.0;
    options.window_search_seconds = 0.0;
    options.exact_component = {};
    options.loss_state_proof = {};
    options.bound_from_plan = {};
    options.time_bound.reset();
    return options;
}

namespace detail::combined {

// A solver with an analysis phase (Auto, H-Rockmate: Rockmate's or H-Rockmate's analysis
// takes a second or more), as the planner runs it at many activation budgets of one problem:
// analysed once, and each budget planned once (the grids of plan_remat_only and
// plan_with_offload share their budgets: H-Rockmate's top search takes up to a second at each).
template <class S>
class AnalysedOnce {
public:
    explicit AnalysedOnce(S solver) : solver_(std::move(solver)) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return S::name(); }
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const { return solve(problem, budget, std::nullopt); }
    /// Planning at the budget within at most `seconds`, where given.
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget, std::optional<double> seconds) const {
        const Model& model = model_of(problem);
        auto made = made_.find(budget);
        if (made == made_.end()) {
            try {
                made = made_.emplace(budget, within(seconds).solve(model, budget)).first;
            } catch (const Infeasible& e) {
                made = made_.emplace(budget, e).first;
            }
        }
        if (const Infeasible* none = std::get_if<Infeasible>(&made->second)) throw *none;
        return std::get<Plan>(made->second);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const {
        return solver_.smallest_budget(model_of(problem));
    }

private:
    using Model = std::remove_cvref_t<decltype(std::declval<const S&>().analyse(std::declval<const Problem&>()))>;

    // The solver with its limit for planning at one budget tightened to `seconds`.
    [[nodiscard]] S within(std::optional<double> seconds) const {
        if (!seconds) return solver_;
        auto options = solver_.options();
        if constexpr (std::is_same_v<S, Auto>)
            options.time_limit_seconds = tightened_time_limit(options.time_limit_seconds.value_or(*seconds), *seconds);
        else
            options.budget_time_limit_seconds =
                tightened_time_limit(options.budget_time_limit_seconds.value_or(*seconds), *seconds);
        return S(std::move(options));
    }

    [[nodiscard]] const Model& model_of(const Problem& problem) const {
        if (!model_ || !(model_->problem == problem)) {
            model_.emplace(solver_.analyse(problem));
            made_.clear();
        }
        return *model_;
    }

    S solver_;
    mutable std::optional<Model> model_;                            // the last problem's analysis
    mutable std::map<Bytes, std::variant<Plan, Infeasible>> made_;  // its plans (or none) by budget
};

// The solver as the planner runs it at many activation budgets: Auto and H-Rockmate as above,
// any other solver as given.
template <Solver S>
[[nodiscard]] decltype(auto) for_many_budgets(const S& solver) {
    if constexpr (std::is_same_v<S, Auto>) return AnalysedOnce<Auto>(Auto(auto_for_many_budgets(solver.options())));
    else if constexpr (std::is_same_v<S, HRockmate>)
        return AnalysedOnce<HRockmate>(HRockmate(hrockmate_for_many_budgets(solver.options())));
    else return (solver);
}

// CombinedOptions::time_limit_seconds, from the planner's start.
class Deadline {
public:
    explicit Deadline(std::optional<double> seconds) : seconds_(seconds) {}
    [[nodiscard]] bool passed() const { return seconds_ && clock_.seconds() >= *seconds_; }
    /// Seconds left (none without a limit).
    [[nodiscard]] std::optional<double> left() const {
        if (!seconds_) return std::nullopt;
        return std::max(0.0, *seconds_ - clock_.seconds());
    }

private:
    std::optional<double> seconds_;
    Stopwatch clock_;
};

// The smallest budget the solver plans for (smallest_budget_of) within at most `seconds`,
// where given and the solver has a limit.
template <Solver S>
std::optional<Bytes> smallest_budget_within(const S& solver, const Problem& problem, std::optional<double> seconds) {
    if constexpr (TimeBoundedSolver<S>) {
        if (seconds) return smallest_budget_of(time_bounded(solver, *seconds), problem);
    }
    return smallest_budget_of(solver, problem);
}

// solver.solve(problem, budget) within at most `seconds`, where given and the solver has a limit.
template <Solver S>
Plan solve_within(const S& solver, const Problem& problem, Bytes budget, std::optional<double> seconds) {
    if constexpr (TimeBoundedSolver<S>) {
        if (seconds) return time_bounded(solver, *seconds).solve(problem, budget);
    } else if constexpr (requires { solver.solve(problem, budget, seconds); }) {
        return solver.solve(problem, budget, seconds);
    }
    return solver.solve(problem, budget);
}

// The activation plan at `activation_budget`, with the updates back in; nullopt when the
// solver has no plan there. The solve gets at most `seconds`, where given.
// Store-all where it fits (a solver that rounds memory may lose a little at P_ref).
template <Solver S>
std::optional<Schedule> full_plan(const Problem& full, const TrainingSplit& split, const S& solver, Bytes activation_budget,
                                  std::optional<double> seconds = std::nullopt) {
    try {
        const Plan store_all = StoreAll{}.solve(split.activations, std::numeric_limits<Bytes>::max());
        const Plan plan = store_all.peak <= activation_budget
                              ? store_all
                              : solve_within(solver, split.activations, activation_budget, seconds);
        return with_training_state(full, split, plan.schedule);
    } catch (const Infeasible&) {
        return std::nullopt;
    }
}

inline OffloadPlan make(const Problem& full, OffloadSchedule schedule, Bytes budget, Bytes activation_budget,
                        std::string method, const TransferSettings& transfers) {
    OffloadReport report = simulate(full, schedule, transfers);
    if (report.offloads == 0 && report.prefetches == 0 && method.starts_with("remat+")) method = "remat";  // nothing moved
    return OffloadPlan{std::move(schedule), std::move(report), budget, activation_budget, std::move(method)};
}

// The i-th of `points` activation budgets spaced evenly from `smallest` to `top`.
inline Bytes grid_budget(Bytes smallest, Bytes top, std::size_t i, std::size_t points) {
    return smallest + static_cast<Bytes>(static_cast<double>(top - smallest) * static_cast<double>(i) /
                                         static_cast<double>(points - 1));
}

// The weight-offloading pass the options ask for.
inline WeightOffloadOptions greedy_options(const CombinedOptions& options, const TransferSettings& transfers) {
    WeightOffloadOptions greedy{options.variant, transfers};
    greedy.between_steps = options.between_steps;
    return greedy;
}

inline bool better(const std::optional<OffloadPlan>& candidate, const std::optional<OffloadPlan>& best) {
    return candidate && (!best || candidate->report.makespan < best->report.makespan);
}

// The activation budgets halfway between the fastest of those `tried` (its makespan, where
// one fits) and its neighbours among them; none where no budget fits or the gaps are closed.
inline std::vector<Bytes> halfway_to_neighbours_of_fastest(const std::map<Bytes, std::optional<double>>& tried) {
    auto fastest = tried.end();
    for (auto it = tried.begin(); it != tried.end(); ++it)
        if (it->second && (fastest == tried.end() || *it->second < *fastest->second)) fastest = it;
    std::vector<Bytes> halves;
    if (fastest == tried.end()) return halves;
    const Bytes at = fastest->first;
    if (fastest != tried.begin()) {
        const Bytes below = std::prev(fastest)->first;
        if (at - below > 1) halves.push_back(below + (at - below) / 2);
    }
    if (const auto above = std::next(fastest); above != tried.end() && above->first - at > 1)
        halves.push_back(at + (above->first - at) / 2);
    return halves;
}

}  // namespace detail::combined

/// A proven lower bound on the makespan of any schedule of `full` within a device `budget`:
/// the compute every schedule runs (compute_lower_bound: the exactly-once ops and the only
/// writers of what they need), and the transfers that the state forces. At the start
/// the device holds at most `budget`, so at least (updated offloadable bytes) - (budget - the
/// initial bytes that cannot leave the device) of updated state starts on the host; each of
/// those bytes is prefetched before its update (which runs once, with it on the device) and
/// offloaded after it (the step ends with a current host copy), on each channel in turn.
[[nodiscard]] inline double makespan_lower_bound(const Problem& full, Bytes budget,
                                                 std::optional<TransferSettings> transfers = std::nullopt) {
    const TransferSettings t = transfers.value_or(full.transfers());
    const double compute = compute_lower_bound(full);
    Bytes updated = 0, resident = 0;
    for (const DataId d : full.initial()) {
        if (!full.data(d).offloadable) resident += full.data(d).bytes;
        else if (full.updater(d)) updated += full.data(d).bytes;
    }
    const auto forced = static_cast<double>(std::max<Bytes>(0, updated - std::max<Bytes>(0, budget - resident)));
    const auto channel = [&](double bandwidth) { return bandwidth > 0 ? forced / bandwidth : 0.0; };
    return std::max({compute, channel(t.bandwidth_to_host), channel(t.bandwidth_to_device)});
}

/// A proven lower bound on the device memory of any schedule of `full`, offloading included:
/// every exactly-once op runs with its reads, writes, updates and overhead on the device,
/// next to every initial data that cannot leave it. A budget below it is infeasible for every
/// planner, not only beyond one's reach.
[[nodiscard]] inline Bytes device_memory_lower_bound(const Problem& full) {
    std::vector<char> counted(full.data_count(), 0);
    Bytes resident = 0;
    for (const DataId d : full.initial())
        if (!full.data(d).offloadable) counted[d.index] = 1, resident += full.data(d).bytes;
    Bytes bound = resident;
    for (const Op& op : full.all_ops()) {
        if (!op.exactly_once) continue;
        Bytes bytes = resident + op.overhead;
        std::vector<char> seen = counted;
        for (const std::vector<DataId>* list : {&op.reads, &op.writes, &op.updates})
            for (const DataId d : *list)
                if (!seen[d.index]) seen[d.index] = 1, bytes += full.data(d).bytes;
        bound = std::max(bound, bytes);
    }
    return bound;
}

namespace detail::combined {

// plan_remat_only (below). `until_a_plan`: past the time limit, go on while no plan fits (what
// the public function does); the combined planner, which goes on itself, stops at the limit.
// `solver_smallest`: the solver's smallest activation budget, where the caller has it already.
template <Solver S>
[[nodiscard]] std::optional<OffloadPlan> remat_only(const Problem& full, Bytes budget, const S& solver,
                                                    const CombinedOptions& options, bool until_a_plan,
                                                    std::optional<Bytes> solver_smallest = std::nullopt) {
    const Deadline deadline(options.time_limit_seconds);
    const auto go_on = [&](bool have_plan) { return !deadline.passed() || (until_a_plan && !have_plan); };
    const TransferSettings transfers = options.transfers.value_or(full.transfers());
    const TrainingSplit split = split_training_state(full);
    const Bytes reference = store_all_reference(split.activations).peak;
    const auto& activation_solver = detail::combined::for_many_budgets(solver);
    const auto fitting = [&](Bytes b) -> std::optional<Schedule> {
        auto plan = detail::combined::full_plan(full, split, activation_solver, b, deadline.left());
        if (plan && remat::simulate(full, *plan).peak <= budget) return plan;
        return std::nullopt;
    };
    const Bytes top = std::min(reference, budget);
    if (!solver_smallest)
        solver_smallest = detail::combined::smallest_budget_within(activation_solver, split.activations, deadline.left());
    const Bytes smallest = std::min(top, solver_smallest.value_or(0));
    // The largest activation budget that fits: the top, or else bisected (to 1/10^4 of the
    // range) from the solver's smallest budget where that fits. Below it the solver has no
    // plan, and saying so can cost a search each time (Auto's and H-Rockmate's Infeasible name
    // their smallest budget); where neither end fits, the grid below tries the budgets between.
    std::optional<std::pair<Bytes, Schedule>> best;
    if (auto plan = fitting(top)) best.emplace(top, std::move(*plan));
    const bool smallest_tried = !best && smallest < top && go_on(false);
    if (smallest_tried)
        if (auto plan = fitting(smallest)) best.emplace(smallest, std::move(*plan));
    const Bytes tolerance = std::max<Bytes>(1, top / 10000);
    if (best && best->first != top)
        for (Bytes low = best->first, fails = top; go_on(true) && fails - low > tolerance;) {  // low fits, fails not
            const Bytes mid = low + (fails - low) / 2;
            if (auto plan = fitting(mid)) best.emplace(mid, std::move(*plan)), low = mid;
            else fails = mid;
        }
    // The step's peak is not monotone in the activation budget (the gradients and updates put
    // back peak where the activation plan did not), so the bisection may miss budgets that
    // fit: a grid from the solver's smallest budget up is tried too, and the fastest plan wins.
    std::optional<OffloadPlan> fastest;
    if (best) fastest = detail::combined::make(full, with_no_transfers(best->second), budget, best->first, "remat", transfers);
    const std::size_t points = std::max<std::size_t>(2, options.activation_budgets);
    for (std::size_t i = 0; i + 1 < points && go_on(fastest.has_value()); ++i) {
        const Bytes b = detail::combined::grid_budget(smallest, top, i, points);
        if ((best && b == best->first) || (smallest_tried && b == smallest)) continue;  // planned above
        if (auto plan = fitting(b)) {
            auto candidate = detail::combined::make(full, with_no_transfers(*plan), budget, b, "remat", transfers);
            if (detail::combined::better(candidate, fastest)) fastest = std::move(candidate);
        }
    }
    return fastest;
}

}  // namespace detail::combined

/// Rematerialization alone: the largest activation budget whose plan, with every weight and
/// its state on the device, fits `budget`. nullopt when none does.
template <Solver S>
[[nodiscard]] std::optional<OffloadPlan> plan_remat_only(const Problem& full, Bytes budget, const S& solver,
                                                         const CombinedOptions& options = {}) {
    return detail::combined::remat_only(full, budget, solver, options, true);
}

/// Weight offloading alone: store-all's activations, and Greedy or Greedy* on the weights.
[[nodiscard]] inline std::optional<OffloadPlan> plan_offload_only(const Problem& full, Bytes budget,
                                                                  const CombinedOptions& options = {}) {
    const TransferSettings transfers = options.transfers.value_or(full.transfers());
    const TrainingSplit split = split_training_state(full);
    const Plan store_all = StoreAll{}.solve(split.activations, std::numeric_limits<Bytes>::max());
    const Schedule plan = with_training_state(full, split, store_all.schedule);
    const WeightOffloadOptions greedy = detail::combined::greedy_options(options, transfers);
    auto schedule = offload_weights(full, plan, budget, greedy);
    if (!schedule) return std::nullopt;
    return detail::combined::make(full, std::move(*schedule), budget, store_all.peak,
                                  std::string(to_string(options.variant)), transfers);
}

/// The combined planner (see the header): the least makespan over activation budgets, each
/// completed by weight offloading where the step overflows. nullopt when no split fits.
template <Solver S>
[[nodiscard]] std::optional<OffloadPlan> plan_with_offload(const Problem& full, Bytes budget, const S& solver,
                                                           const CombinedOptions& options = {}) {
    const detail::combined::Deadline deadline(options.time_limit_seconds);
    const TransferSettings transfers = options.transfers.value_or(full.transfers());
    const TrainingSplit split = split_training_state(full);
    const Bytes reference = store_all_reference(split.activations).peak;
    const auto& activation_solver = detail::combined::for_many_budgets(solver);
    const std::optional<Bytes> solver_smallest =
        detail::combined::smallest_budget_within(activation_solver, split.activations, deadline.left());
    const Bytes smallest = solver_smallest.value_or(0);
    CombinedOptions within = options;
    within.time_limit_seconds = deadline.left();
    // Rematerialization alone, from the same smallest budget (asked once: H-Rockmate searches for it).
    std::optional<OffloadPlan> best =
        detail::combined::remat_only(full, budget, activation_solver, within, false, solver_smallest);
    if (auto offload = plan_offload_only(full, budget, options); detail::combined::better(offload, best))
        best = std::move(offload);
    const std::size_t points = std::max<std::size_t>(2, options.activation_budgets);
    const WeightOffloadOptions greedy = detail::combined::greedy_options(options, transfers);
    bool moves_activations = false;
    for (std::size_t k = 0; k < full.data_count(); ++k)
        moves_activations = moves_activations || (full.data(DataId{k}).offloadable && !full.is_initial(DataId{k}));
    // The fastest split at one activation budget, kept in `best` where faster; its makespan,
    // where any fits.
    const auto try_budget = [&](Bytes activation_budget) -> std::optional<double> {
        const std::optional<Schedule> plan =
            detail::combined::full_plan(full, split, activation_solver, activation_budget, deadline.left());
        if (!plan) return std::nullopt;
        std::optional<double> fastest;
        // With offloadable activations, also the weights alone: the greedy's choices ignore
        // bandwidth, and moving activations too may cost more time than it saves.
        for (const bool activations : {true, false}) {
            if (!activations && !moves_activations) break;
            WeightOffloadOptions pass = greedy;
            pass.activations = activations;
            auto schedule = offload_weights(full, *plan, budget, pass);
            if (!schedule) continue;
            auto candidate = detail::combined::make(full, std::move(*schedule), budget, activation_budget,
                                                    "remat+" + std::string(to_string(options.variant)), transfers);
            if (!fastest || candidate.report.makespan < *fastest) fastest = candidate.report.makespan;
            if (detail::combined::better(candidate, best)) best = std::move(candidate);
        }
        return fastest;
    };
    std::map<Bytes, std::optional<double>> tried;  // activation budget -> its fastest makespan
    for (std::size_t i = 0; i < points && (!best || !deadline.passed()); ++i) {
        const Bytes b = detail::combined::grid_budget(smallest, reference, i, points);
        if (!tried.contains(b)) tried.emplace(b, try_budget(b));
    }
    // The makespan is far from smooth in the activation budget (weight offloading fits into
    // what the activation plan leaves): the grid's fastest point is refined by halving the
    // gaps to its neighbours, around whichever point is fastest so far.
    for (std::size_t round = 0; round < options.refinement_rounds && !deadline.passed(); ++round) {
        const std::vector<Bytes> halves = detail::combined::halfway_to_neighbours_of_fastest(tried);
        if (halves.empty()) break;
        for (const Bytes b : halves) tried.emplace(b, try_budget(b));
    }
    return best;
}

/// A total device budget for everything a step holds, as a BudgetSpec says it: bytes, or a
/// percentage of store-all's total. `who` names the caller when the spec is of another kind.
[[nodiscard]] inline Bytes total_budget(const BudgetSpec& spec, Bytes store_all_total, std::string_view who) {
    switch (spec.kind) {
        case BudgetSpec::Kind::bytes: return spec.bytes;
        case BudgetSpec::Kind::percent: return percent_of(store_all_total, spec.percent);
        case BudgetSpec::Kind::above_smallest: break;
    }
    throw InvalidInput(std::string(who) + ": a budget above the smallest is not supported; give budget_bytes(n) or " +
                       "budget_percent(p) of everything the step holds");
}

/// The combined plan within `total` bytes for everything a step holds, `resident` of which
/// lie outside `full` (`resident_what` says what: buffers, tied weights, the caller's
/// optimizer state). Infeasible, naming `who`, says whether `total` is below the proven lower
/// bound (device_memory_lower_bound + resident) or only beyond the planner with `solver`.
template <Solver S>
[[nodiscard]] OffloadPlan plan_within_total(const Problem& full, Bytes total, Bytes resident, Bytes store_all_total,
                                            const S& solver, const CombinedOptions& options, std::string_view who,
                                            std::string_view resident_what) {
    const Bytes bound = device_memory_lower_bound(full) + resident;
    std::optional<OffloadPlan> plan;
    if (total >= bound) plan = plan_with_offload(full, total - resident, solver, options);
    if (plan) return std::move(*plan);
    throw Infeasible(std::string(who) + ": no plan fits " + format_bytes(total) + " for everything the step holds (" +
                         format_bytes(resident) + " of it outside the plan: " + std::string(resident_what) + "); " +
                         (total < bound ? "that is below the proven lower bound of " + format_bytes(bound) +
                                              " (the largest op with its inputs, outputs and everything that cannot "
                                              "leave the device)"
                                        : "it is above the proven lower bound of " + format_bytes(bound) +
                                              ", but beyond the reach of " + std::string(solver.name()) +
                                              " with weight offloading; raise the budget"),
                     total, std::nullopt, store_all_total);
}

}  // namespace remat::offload
