// remat/solvers/hierarchical.hpp — H-Rockmate: plans any graph through a hierarchy of small
// exact searches.
//
// H-Rockmate (ICLR 2024 submission) / HiRemate (Zhao et al., ICML 2025); docs/design.md.
// Rockmate (rockmate.hpp) needs a sequence of blocks; U-Nets, encoder-decoders and DenseNets
// have almost none, and their middle becomes one block no exact solver finishes. H-Rockmate
// clusters the forward graph into a tree of small clusters (partition/hierarchy.hpp) and
// plans it bottom-up:
//   1. each cluster is planned on its abstract problem (hierarchical/cluster.hpp): its atom
//      children with their real ops, each cluster child as a unit with a fast forward and
//      its options; the exact best-first search of exhaustive.hpp, with the backwards of one
//      child as a choice group, solves it at a grid of (peak, saved) budgets — the saved
//      budget imposed through the boundary's overhead, as Rockmate does — and every solution,
//      flattened and measured by the simulator on the cluster's real sub-problem, becomes an
//      option of the cluster; the greedy on the cluster's own ops adds lean options on the
//      same grid (Pareto-distinct ones kept, at most `max_options` offered to the parent:
//      the fastest, the leanest, the one that keeps least, others spread over saved bytes);
//   2. structurally equal clusters (same ops, sizes and edges) are planned once;
//   3. the top is planned at the user's budget by the exact search and by a coordinate
//      descent over which option each child gets (the greedy planning each assignment),
//      flattened, and checked by the simulator.
// Where the reference solves every cluster with an integer program (up to 24 MILPs of 60 s
// per cluster with Gurobi, hours for a 2,500-node transformer), remat's clusters are small
// enough for an exact search that settles each grid point in milliseconds (docs/design.md §4.4 (exhaustive search)
// measured such searches far ahead of CBC on problems of this size); a search that runs out
// of its limits leaves the options found so far, and a cluster always has its store-all
// option (each child's fastest option, in order).
//
// The plan is never worse than the greedy (greedy.hpp), which is also planned at the same
// budget and returned when it is faster, and never over budget: the flattened schedule is
// simulated on the whole problem, and a schedule that does not fit falls back to the greedy.
// An infeasible budget says whether it is below a proven lower bound (core/bounds.hpp) or
// only beyond what these solvers reach.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
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
#include "../partition/hierarchy.hpp"
#include "exhaustive.hpp"
#include "greedy.hpp"
#include "hierarchical/cluster.hpp"
#include "improve.hpp"
#include "rockmate.hpp"
#include "store_all.hpp"

namespace remat {

struct HRockmateOptions {
    HierarchyOptions hierarchy{};
    /// Peak budgets per cluster, evenly from the least peak of its abstract problem to the
    /// peak of its fastest schedule.
    std::size_t peak_budgets = 4;
    /// Saved budgets per peak budget, from the least the boundary needs to what the fastest
    /// schedule keeps.
    std::size_t saved_budgets = 4;
    /// Options of a cluster its parent sees (Pareto-distinct, spread over the saved bytes).
    std::size_t max_options = 5;
    /// Limits of one search (one grid point of one cluster, or the top at the budget).
    std::size_t max_states = 100000;
    double search_time_limit_seconds = 1.0;
    /// Limit of the grid of one cluster; the options found by then are kept.
    double cluster_time_limit_seconds = 3.0;
    /// Limit of the whole analysis: clusters still to plan get their store-all option only,
    /// and Rockmate's blocks (use_rockmate) share what is left.
    double time_limit_seconds = 40.0;
    /// The top is searched at the budget times each of these factors: the options' costs are
    /// upper bounds of what their steps use, so a plan made for a larger abstract budget often
    /// still fits the real one (the simulator decides); the fastest that fits is kept.
    std::vector<double> top_budget_factors{1.0, 1.05, 1.1, 1.2, 1.35, 1.5};
    /// Limit of the top's searches at one budget, all factors together.
    double top_time_limit_seconds = 2.0;
    /// When the exact search of a cluster or the top hits its limits, the weighted search
    /// (a schedule at most this many times slower than the abstract optimum) is tried.
    double fallback_weight = 3.0;
    /// Local improvement of every candidate plan (solvers/improve.hpp), at most this long each.
    bool improve_plans = true;
    ImproveOptions improve{0.5, 4096};
    /// Problems of at most this many data are not partitioned: the top is the whole problem,
    /// searched exactly (as the reference solves graphs of 40 nodes or fewer with one ILP).
    std::size_t flat_up_to_data = 64;
    /// Limits of that exact search: the state limit bounds its memory; the time limit is
    /// generous, so that the answer does not depend on how loaded the machine is.
    std::size_t flat_max_states = 2'000'000;
    double flat_time_limit_seconds = 30.0;
    /// The same search is tried on partitioned problems of at most 128 data, as one component
    /// among others: within this many seconds (and the state limit above), as it seldom
    /// finishes there at low budgets and would otherwise hold up every budget of a sweep.
    double exact_component_seconds = 2.0;
    /// Limit of planning at one budget (solve with a model), all components together: each
    /// gets at most its own limit above and a share of what is left, in the order hierarchy,
    /// exact search, greedy, Rockmate. The greedy's first replay (milliseconds) and Rockmate's
    /// table lookup always run, so that a plan is never lost to the clock. None: the
    /// components' own limits only (about 7 s at most, and up to flat_time_limit_seconds more
    /// on an unpartitioned problem, whose exact search is the top).
    std::optional<double> budget_time_limit_seconds;
    /// A proven lower bound on the time of every schedule within the budget of the next solve
    /// (bounds/time_lower_bound.hpp): once a component's plan meets it, the components after
    /// it are skipped, and the plan is returned with status optimal and gap 0. It holds at one
    /// budget only: leave it empty where one H-Rockmate plans several (a plan faster than it
    /// makes solve() throw InvalidInput).
    std::optional<double> time_bound;
    /// Also plan with the greedy at the same budget and keep the faster plan.
    bool compare_with_greedy = true;
    /// The greedy used then: a portfolio of eviction scores, improved (greedy.hpp), along
    /// each order in turn (its `order` is set for each).
    GreedyOptions greedy = default_greedy();
    /// Also plan with Rockmate (rockmate.hpp) when the problem is a sequence of at least two
    /// blocks of at most `rockmate_max_block_ops` ops each, and keep the faster plan.
    bool use_rockmate = true;
    std::size_t rockmate_max_block_ops = 64;
    RockmateOptions rockmate = default_rockmate();

    [[nodiscard]] static GreedyOptions default_greedy() {
        GreedyOptions g;
        g.portfolio_seconds = 1.0;
        g.improve_seconds = 0.5;
        return g;
    }
    [[nodiscard]] static RockmateOptions default_rockmate() {
        RockmateOptions r;
        r.block_time_limit_seconds = 5.0;
        return r;
    }
    /// Called with a line per planned cluster and per solve.
    ProgressCallback progress;
};

/// What H-Rockmate derives from a problem before the budget comes in.
struct HRockmateModel {
    Problem problem;
    Hierarchy hierarchy;
    /// Per node id: a cluster's interface and options (atoms: none).
    std::vector<std::optional<detail::hrockmate::NodeOptions>> nodes;
    detail::hrockmate::Interface top;
    /// Rockmate's blocks and options, when the problem has a sequence of small blocks.
    std::optional<RockmateModel> rockmate;
    std::size_t unique_clusters = 0;
    std::size_t searches = 0;
    std::size_t failed_searches = 0;
    double seconds = 0.0;
};

namespace detail::hrockmate {

struct SearchLimits {
    std::size_t max_states = 0;
    double seconds = 0.0;
    double weight = 1.0;
};

// What a search on an abstract problem ended with: a schedule, none at all (proven), or a
// limit that stopped it.
struct SearchOutcome {
    std::optional<exhaustive::ExhaustiveSearch::Result> result;
    bool stopped = false;
};

[[nodiscard]] inline SearchOutcome search_outcome(const AbstractProblem& a, exhaustive::SearchGoal goal, Bytes budget,
                                                  SearchLimits limits) {
    try {
        ExhaustiveOptions o;
        o.max_states = limits.max_states;
        o.time_limit_seconds = limits.seconds;
        o.weight = limits.weight;
        const exhaustive::ExhaustiveSearch s(a.problem, o, a.choice_groups);
        exhaustive::ExhaustiveSearch::Result r = s.run(goal, budget);
        if (!r.found) return {};
        return {std::move(r), false};
    } catch (const Error&) {
        return {std::nullopt, true};
    }
}

// The exact search on an abstract problem; nullopt when no schedule fits or a limit stopped it.
[[nodiscard]] inline std::optional<exhaustive::ExhaustiveSearch::Result> search(const AbstractProblem& a,
                                                                                exhaustive::SearchGoal goal,
                                                                                Bytes budget, SearchLimits limits) {
    return search_outcome(a, goal, budget, limits).result;
}

// The exact search, and when its limits stop it, the weighted search (bounded suboptimal,
// far fewer states) with the same state limit; `limits.seconds` is for both together: the
// exact search gets 60 % of it (all of it without a fallback), the weighted one the rest.
// (Each had all of it once: a stopped exact search doubled the time, and H-Rockmate under
// Auto ran 5.7 s of a 3.9 s planning share on a 40-op DAG.)
inline constexpr double exact_share_before_weighted = 0.6;
[[nodiscard]] inline std::optional<exhaustive::ExhaustiveSearch::Result> search_or_weighted(const AbstractProblem& a,
                                                                                            Bytes budget,
                                                                                            SearchLimits limits,
                                                                                            double weight) {
    const Stopwatch clock;
    const double total = limits.seconds;
    if (weight > 1.0) limits.seconds = exact_share_before_weighted * total;
    SearchOutcome exact = search_outcome(a, exhaustive::SearchGoal::least_time, budget, limits);
    if (exact.result || !exact.stopped || weight <= 1.0) return std::move(exact.result);
    limits.weight = weight;
    limits.seconds = total - clock.seconds();
    if (!(limits.seconds > 0)) return std::nullopt;
    return search_outcome(a, exhaustive::SearchGoal::least_time, budget, limits).result;
}

// The children with one option each, `assignment[c]` for cluster child c (atoms as they are):
// a plain problem (no choice group has two members), which store-all and the greedy can plan.
// `storage` holds the reduced options the result points into.
[[nodiscard]] inline std::vector<Child> with_options(const std::vector<Child>& children,
                                                     const std::vector<std::size_t>& assignment,
                                                     std::vector<NodeOptions>& storage) {
    storage.clear();
    storage.reserve(children.size());
    std::vector<Child> out;
    for (std::size_t c = 0; c < children.size(); ++c) {
        if (children[c].real_ops) {
            out.push_back(children[c]);
            continue;
        }
        NodeOptions n = *children[c].options;
        if (!n.options.empty()) n.options = {n.options.at(assignment[c])};
        storage.push_back(std::move(n));
        out.push_back(Child{std::nullopt, &storage.back()});
    }
    return out;
}

// Each cluster child with its fastest option (the first).
[[nodiscard]] inline std::vector<Child> fastest_only(const std::vector<Child>& children,
                                                     std::vector<NodeOptions>& storage) {
    return with_options(children, std::vector<std::size_t>(children.size(), 0), storage);
}

}  // namespace detail::hrockmate

/// The H-Rockmate solver (see the top of this header).
class HRockmate {
public:
    explicit HRockmate(HRockmateOptions options = {}) : options_(std::move(options)) {
        if (options_.peak_budgets == 0 || options_.saved_budgets == 0 || options_.max_options == 0)
            throw InvalidInput("hrockmate: peak_budgets, saved_budgets and max_options must be at least 1");
        if (!(options_.search_time_limit_seconds > 0) || !(options_.cluster_time_limit_seconds > 0) ||
            !(options_.time_limit_seconds > 0) || !(options_.top_time_limit_seconds > 0) ||
            !(options_.exact_component_seconds > 0) ||
            (options_.budget_time_limit_seconds && !(*options_.budget_time_limit_seconds > 0)))
            throw InvalidInput("hrockmate: time limits must be positive numbers of seconds");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "hrockmate"; }
    [[nodiscard]] const HRockmateOptions& options() const noexcept { return options_; }

    /// The hierarchy and every cluster's options: everything that does not depend on the budget.
    [[nodiscard]] HRockmateModel analyse(const Problem& problem) const {
        const Stopwatch clock;
        HierarchyOptions shape = options_.hierarchy;
        if (problem.data_count() <= options_.flat_up_to_data) shape.max_children = problem.op_count() + 2;
        HRockmateModel model{problem, partition_hierarchy(problem, shape), {}, {}, std::nullopt, 0, 0, 0, 0.0};
        const Hierarchy& h = model.hierarchy;
        const std::vector<char> gradient = detail::hrockmate::gradient_data(problem);
        model.nodes.resize(h.node_count());
        std::map<std::vector<std::int64_t>, std::size_t> planned;  // structure → node planned
        for (std::size_t c = 0; c < h.clusters.size(); ++c) {
            const std::size_t node = h.atoms.size() + c;
            plan_cluster(model, node, gradient, planned, clock);
        }
        std::vector<OpId> top_ops = h.top_ops;
        for (const std::size_t n : h.top) {
            const auto ops = h.ops_of(n);
            top_ops.insert(top_ops.end(), ops.begin(), ops.end());
        }
        model.top = detail::hrockmate::interface_of(problem, std::move(top_ops), gradient);
        model.rockmate = rockmate_model(problem, clock);
        model.seconds = clock.seconds();
        report("hrockmate: analysed '" + problem.name() + "': " + std::to_string(h.atoms.size()) + " atoms, " +
               std::to_string(h.clusters.size()) + " clusters (" + std::to_string(model.unique_clusters) +
               " planned, depth " + std::to_string(h.depth()) + "), " + std::to_string(model.searches) + " searches in " +
               std::to_string(model.seconds) + " s");
        return model;
    }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const Stopwatch clock;
        Plan plan = solve(analyse(problem), budget);
        plan.stats.solve_seconds = clock.seconds();
        return plan;
    }

    /// Plans at `budget` with a model from analyse(): the hierarchy's plan, and with
    /// compare_with_greedy the greedy's, each locally improved; the faster is returned, and its
    /// stats name the component that made it.
    [[nodiscard]] Plan solve(const HRockmateModel& model, Bytes budget) const {
        const Stopwatch clock;
        std::optional<Plan> best;
        // Each candidate in turn; a listener hears the best plan so far after each.
        const auto consider = [&](std::string_view component, std::optional<Plan> plan) {
            if (plan && (!best || plan->time < best->time)) best = std::move(plan);
            if (!options_.progress) return;
            std::ostringstream line;
            line << "hrockmate: " << component << " done after " << clock.seconds() << " s; best plan so far: ";
            if (best)
                line << "time " << best->time << ", peak " << best->peak << " bytes (" << best->stats.options << ")";
            else
                line << "none";
            report(line.str());
        };
        // Seconds left of budget_time_limit_seconds (infinity without one).
        const auto left = [&] {
            return options_.budget_time_limit_seconds ? std::max(0.0, *options_.budget_time_limit_seconds - clock.seconds())
                                                      : std::numeric_limits<double>::infinity();
        };
        // A component's search gets at most a share of what is left, and the local improvement
        // of its plan a quarter.
        const auto improve = [&] { return std::min(options_.improve.time_limit_seconds, 0.25 * left()); };
        // An unpartitioned problem's top is the whole problem: its exact search is the main
        // component and has the larger share.
        const bool flat = model.hierarchy.clusters.empty();
        const double top_seconds = flat ? std::min(options_.flat_time_limit_seconds, 0.6 * left())
                                        : std::min(options_.top_time_limit_seconds, 0.4 * left());
        // Whether the best plan so far meets the proven time bound: no component can beat it.
        const auto settled = [&] { return best && options_.time_bound && meets_time_bound(best->time, *options_.time_bound); };
        consider("hierarchy", solve_top(model, budget, top_seconds, improve()));
        // No plan of an unpartitioned problem: the exact search says at once whether any schedule
        // fits, where the greedy's portfolio would spend its whole share trying. Asked once: the
        // answer also serves the Infeasible at the end.
        std::optional<Bytes> least_peak;
        if (flat && !best) {
            least_peak = flat_least_peak(model, 0.25 * left());
            if (least_peak && budget < *least_peak) throw infeasible(model, budget, left(), least_peak);
        }
        if (!flat && left() > 0 && !settled())
            consider("exact search",
                     exact_plan(model.problem, budget, std::min(options_.exact_component_seconds, 0.5 * left()), improve()));
        if ((options_.compare_with_greedy || !best) && !settled())
            consider("greedy", greedy_plan(model.problem, budget, 0.5 * left(), improve()));
        if (model.rockmate && (left() > 0 || !best) && !settled())
            consider("rockmate", rockmate_plan(*model.rockmate, budget, improve()));
        if (!best) throw infeasible(model, budget, left(), least_peak);
        if (options_.time_bound) {
            require_time_bound_holds(best->time, *options_.time_bound, "HRockmateOptions::time_bound");
            settle_by_time_bound(*best, *options_.time_bound);
        }
        best->stats.solve_seconds = clock.seconds();
        return *std::move(best);
    }

    /// The smallest budget H-Rockmate (hierarchy, greedy along either order, Rockmate) plans
    /// for; with `seconds`, the hierarchy's search for it gets at most that long (none:
    /// skipped), the greedy's and Rockmate's answers, which need no search, stand.
    [[nodiscard]] Bytes smallest_budget(const HRockmateModel& model,
                                        double seconds = std::numeric_limits<double>::infinity()) const {
        return smallest_budget_given(model, seconds, flat_least_peak(model, seconds));
    }

private:
    // smallest_budget() once flat_least_peak() has answered: its least peak, which no component
    // goes below and the flat top reaches, or the components' smallest budgets.
    [[nodiscard]] Bytes smallest_budget_given(const HRockmateModel& model, double seconds,
                                              std::optional<Bytes> least_peak) const {
        if (least_peak) return *least_peak;
        Bytes least = std::numeric_limits<Bytes>::max();
        if (const auto top = top_search(model, detail::exhaustive::SearchGoal::least_peak,
                                        std::numeric_limits<Bytes>::max(), seconds))
            least = top->peak;
        if (options_.compare_with_greedy)
            for (const GreedyOrder order : {GreedyOrder::store_all, GreedyOrder::memory_aware})
                least = std::min(least, Greedy{greedy_along(order)}.smallest_budget(model.problem));
        if (model.rockmate) {
            try {
                least = std::min(least, Rockmate<>(options_.rockmate).smallest_budget(*model.rockmate));
            } catch (const Error&) {
            }
        }
        return least;
    }

    void report(const std::string& line) const {
        if (options_.progress) options_.progress(line);
    }

    // An unpartitioned problem's least peak by the exact search's own method (its bounds, then a
    // search below a schedule it found): the plain least-peak search of the top visits every
    // state below the peak it has, 2 s on the 14-data diamond of examples/problems against
    // under a millisecond. Nullopt where the problem is partitioned or the limits run out.
    [[nodiscard]] std::optional<Bytes> flat_least_peak(const HRockmateModel& model, double seconds) const {
        if (!model.hierarchy.clusters.empty() || model.problem.data_count() > Exhaustive::max_data) return std::nullopt;
        ExhaustiveOptions limits;
        limits.max_states = options_.flat_max_states;
        limits.time_limit_seconds = std::min(options_.flat_time_limit_seconds, seconds);
        if (!(limits.time_limit_seconds > 1e-3)) return std::nullopt;
        try {
            return Exhaustive(limits).smallest_budget(model.problem);
        } catch (const Error&) {  // beyond its limits (TooLarge), or more than 64 exactly-once ops
            return std::nullopt;
        }
    }

    [[nodiscard]] detail::hrockmate::SearchLimits limits() const {
        return {options_.max_states, options_.search_time_limit_seconds};
    }

    // Limits of a search at the top and its weighted fallback together (search_or_weighted
    // splits them): an unpartitioned problem gets the flat limits (at most the top's
    // `seconds`); otherwise the search limit, at most the top's time left (`left`).
    [[nodiscard]] detail::hrockmate::SearchLimits top_limits(bool flat, double left, double seconds) const {
        if (flat) return {options_.flat_max_states, std::min(options_.flat_time_limit_seconds, seconds)};
        detail::hrockmate::SearchLimits l = limits();
        l.seconds = std::min(2 * l.seconds, left);
        return l;
    }

    // The children of a node as the abstract problem takes them.
    [[nodiscard]] static std::vector<detail::hrockmate::Child> children_of(const HRockmateModel& model,
                                                                          const std::vector<std::size_t>& nodes) {
        std::vector<detail::hrockmate::Child> children;
        for (const std::size_t n : nodes) {
            if (model.hierarchy.is_atom(n)) {
                const Atom& a = model.hierarchy.atoms[n];
                std::vector<OpId> ops = a.forward_ops;
                ops.insert(ops.end(), a.backward_ops.begin(), a.backward_ops.end());
                children.push_back({std::move(ops), nullptr});
            } else {
                children.push_back({std::nullopt, &*model.nodes[n]});
            }
        }
        return children;
    }

    // ---------------------------------------------------------------- clusters

    void plan_cluster(HRockmateModel& model, std::size_t node, const std::vector<char>& gradient,
                      std::map<std::vector<std::int64_t>, std::size_t>& planned, const Stopwatch& analysis) const {
        using namespace detail::hrockmate;
        const Problem& p = model.problem;
        const Hierarchy& h = model.hierarchy;
        const Stopwatch clock;
        const std::string name = p.name() + "/c" + std::to_string(node - h.atoms.size());
        NodeOptions n;
        n.interface = interface_of(p, h.ops_of(node), gradient);
        const SubProblem sub = sub_problem(p, n.interface, false, 0, name);
        set_fast(n, p, sub, fast_forward(sub, n.interface));
        const std::vector<std::int64_t> key = graph::structure_key(sub.problem, false);  // sizes, not times
        std::string how;
        if (const auto it = planned.find(key); it != planned.end()) {
            n.options = translated(model, it->second, sub);
            how = "as cluster " + std::to_string(it->second - h.atoms.size());
        } else {
            const std::vector<Child> children = children_of(model, h.cluster(node).children);
            // The grid stops at the cluster's limit or at the analysis', whichever comes first.
            const double seconds = std::min(options_.cluster_time_limit_seconds,
                                            options_.time_limit_seconds - analysis.seconds());
            const bool in_time = seconds > 0;
            n.options =
                in_time ? grid_options(model, n.interface, sub, children, name, clock, seconds) : std::vector<Option>{};
            if (n.options.empty()) n.options = store_all_options(p, n.interface, sub, children, name);
            if (in_time) add_real_greedy_options(p, n.interface, sub, name, n.options);
            planned.emplace(key, node);
            ++model.unique_clusters;
            how = std::to_string(n.options.size()) + " options";
        }
        prune(n.options);
        n.options = spread(std::move(n.options), options_.max_options);
        report("hrockmate: cluster " + std::to_string(node - h.atoms.size()) + " (" +
               std::to_string(h.cluster(node).children.size()) + " children, " + std::to_string(n.interface.ops.size()) +
               " ops): " + how + " in " + std::to_string(clock.seconds()) + " s");
        model.nodes[node] = std::move(n);
    }

    // The options of an equal cluster, in this cluster's ids (same local numbering).
    [[nodiscard]] static std::vector<detail::hrockmate::Option> translated(const HRockmateModel& model, std::size_t source,
                                                                          const detail::hrockmate::SubProblem& sub) {
        using namespace detail::hrockmate;
        const Problem& p = model.problem;
        const NodeOptions& from = *model.nodes[source];
        const SubProblem other = sub_problem(p, from.interface, false, 0, "source");
        const auto move = [&](const Schedule& s) {
            Schedule out;
            for (const Step& st : s) {
                if (st.is_run())
                    out.push_back(Step::run(*sub.global_op.at(other.local_op.at(st.op().index).index)));
                else
                    out.push_back(Step::free(*sub.global_data.at(other.local(st.data())->index)));
            }
            return out;
        };
        const auto move_data = [&](const std::vector<DataId>& v) {
            std::vector<DataId> out;
            for (const DataId d : v) out.push_back(*sub.global_data.at(other.local(d)->index));
            std::sort(out.begin(), out.end());
            return out;
        };
        std::vector<Option> options;
        for (const Option& o : from.options) {
            Option t = o;
            t.forward = move(o.forward);
            t.backward = move(o.backward);
            t.forward_time = time_of(p, t.forward);
            t.backward_time = time_of(p, t.backward);
            t.forward_reads = move_data(o.forward_reads);
            t.backward_reads = move_data(o.backward_reads);
            t.held = move_data(o.held);
            options.push_back(std::move(t));
        }
        return options;
    }

    // The option of an abstract schedule (or nothing when it does not check out).
    [[nodiscard]] static std::optional<detail::hrockmate::Option> option_of(const Problem& p,
                                                                           const detail::hrockmate::Interface& f,
                                                                           const detail::hrockmate::SubProblem& sub,
                                                                           const detail::hrockmate::AbstractProblem& a,
                                                                           const std::vector<detail::hrockmate::Child>& children,
                                                                           const Schedule& abstract) {
        using namespace detail::hrockmate;
        const Flattened flat = flatten(p, a, children, abstract, f.inputs);
        return option_from(p, sub, f, to_local(sub, flat));
    }

    // Every child with its fastest option, in the order store-all chooses: the option that
    // always exists.
    [[nodiscard]] static std::vector<detail::hrockmate::Option> store_all_options(
        const Problem& p, const detail::hrockmate::Interface& f, const detail::hrockmate::SubProblem& sub,
        const std::vector<detail::hrockmate::Child>& children, const std::string& name) {
        using namespace detail::hrockmate;
        std::vector<NodeOptions> storage;
        const std::vector<Child> single = fastest_only(children, storage);
        const AbstractProblem a = abstract_problem(p, f, single, {}, false, 0, name);
        const Reference ref = store_all_reference(a.problem);
        std::vector<Option> out;
        if (auto o = option_of(p, f, sub, a, single, ref.schedule)) out.push_back(std::move(*o));
        if (out.empty())
            throw SolverError("hrockmate: the store-all option of '" + name + "' does not check out (this is a bug in "
                              "the solver; please report it with the problem file)");
        return out;
    }

    // Options at a grid of (peak, saved) budgets, from the largest down, skipping points below
    // an infeasible one (the feasible schedules shrink with both budgets). The peaks run from
    // the least the greedy reaches on the abstract problem (each child with its fastest
    // option: proving the least peak exactly is a search over every state) to the peak of the
    // fastest schedule; a grid point the exact search cannot settle within its limits gets the
    // greedy's plan there. Within `seconds` in all (`clock` counts from the cluster's start).
    [[nodiscard]] std::vector<detail::hrockmate::Option> grid_options(HRockmateModel& model,
                                                                    const detail::hrockmate::Interface& f,
                                                                    const detail::hrockmate::SubProblem& sub,
                                                                    const std::vector<detail::hrockmate::Child>& children,
                                                                    const std::string& name, const Stopwatch& clock,
                                                                    double seconds) const {
        using namespace detail::hrockmate;
        const Problem& p = model.problem;
        const AbstractProblem base = abstract_problem(p, f, children, {}, false, 0, name);
        if (base.problem.data_count() > Exhaustive::max_data) return {};
        const Bytes unlimited = std::numeric_limits<Bytes>::max() / 4;
        // One search's limits, within what is left of `seconds`.
        const auto search_limits = [&] {
            SearchLimits l = limits();
            l.seconds = std::max(1e-3, std::min(l.seconds, seconds - clock.seconds()));
            return l;
        };
        ++model.searches;
        const auto fastest = search(base, detail::exhaustive::SearchGoal::least_time, unlimited, search_limits());
        if (!fastest) {
            ++model.failed_searches;
            return {};
        }
        std::vector<Option> options;
        if (auto o = option_of(p, f, sub, base, children, fastest->schedule)) options.push_back(std::move(*o));
        std::vector<NodeOptions> storage;
        const std::vector<Child> single = fastest_only(children, storage);
        const Bytes peak_hi = fastest->peak;
        const Bytes peak_lo = std::min(peak_hi, greedy_option(p, f, sub, single, name, 0, std::nullopt, options));
        const Bytes floor_saved = bytes_of(p, f.inputs) + bytes_of(p, f.outputs) + bytes_of(p, f.output_grads);
        const Bytes saved_hi = boundary_memory(base, fastest->schedule);
        const auto step = [](Bytes lo, Bytes hi, std::size_t i, std::size_t count) {
            return count <= 1 ? hi : lo + (hi - lo) * static_cast<Bytes>(i) / static_cast<Bytes>(count - 1);
        };
        std::vector<std::pair<Bytes, Bytes>> infeasible;
        for (std::size_t i = options_.peak_budgets; i-- > 0;) {
            const Bytes peak = step(peak_lo, peak_hi, i, options_.peak_budgets);
            const Bytes top = std::min(peak, saved_hi);
            for (std::size_t j = options_.saved_budgets; j-- > 0;) {
                if (clock.seconds() > seconds) return options;
                const Bytes saved = step(floor_saved, top, j, options_.saved_budgets);
                if (saved < floor_saved) continue;
                if (std::any_of(infeasible.begin(), infeasible.end(),
                                [&](const auto& x) { return peak <= x.first && saved <= x.second; }))
                    continue;
                const AbstractProblem a = abstract_problem(p, f, children, {}, false, peak - saved, name);
                ++model.searches;
                if (const auto r = search(a, detail::exhaustive::SearchGoal::least_time, peak, search_limits())) {
                    if (auto o = option_of(p, f, sub, a, children, r->schedule)) options.push_back(std::move(*o));
                    continue;
                }
                ++model.failed_searches;
                if (greedy_option(p, f, sub, single, name, peak - saved, peak, options) > peak)
                    infeasible.emplace_back(peak, saved);
            }
        }
        return options;
    }

    // The greedy on the cluster's own ops (its real sub-problem, not its children's few
    // options) at a grid of (peak, saved) budgets from the least peak it reaches to its
    // store-all peak: the lean options. The abstract grid cannot find them when every child's
    // exported options recompute with a large peak, nor at all when the cluster is too large
    // for the search; without them a parent at a low budget finds no plan.
    void add_real_greedy_options(const Problem& p, const detail::hrockmate::Interface& f,
                                 const detail::hrockmate::SubProblem& sub, const std::string& name,
                                 std::vector<detail::hrockmate::Option>& options) const {
        using namespace detail::hrockmate;
        const Greedy greedy;
        Bytes peak_lo = 0;
        try {
            peak_lo = greedy.smallest_budget(sub.problem);
        } catch (const Error&) {
            return;
        }
        const Bytes peak_hi = std::max(peak_lo, store_all_reference(sub.problem).peak);
        const Bytes floor_saved = bytes_of(p, f.inputs) + bytes_of(p, f.outputs) + bytes_of(p, f.output_grads);
        const auto step = [](Bytes lo, Bytes hi, std::size_t i, std::size_t count) {
            return count <= 1 ? lo : lo + (hi - lo) * static_cast<Bytes>(i) / static_cast<Bytes>(count - 1);
        };
        for (std::size_t i = 0; i < options_.peak_budgets; ++i) {
            const Bytes peak = step(peak_lo, peak_hi, i, options_.peak_budgets);
            for (std::size_t j = 0; j < options_.saved_budgets; ++j) {
                const Bytes saved = step(floor_saved, peak, j, options_.saved_budgets);
                const SubProblem squeezed = sub_problem(p, f, false, std::max<Bytes>(0, peak - saved), name);
                try {
                    const Plan plan = greedy.solve(squeezed.problem, peak);
                    if (auto o = option_from(p, sub, f, plan.schedule)) options.push_back(std::move(*o));
                } catch (const Error&) {
                    break;  // a smaller saved budget at this peak does not fit either
                }
            }
        }
    }

    // The greedy on the abstract problem with each child's fastest option (boundary overhead
    // `boundary`): at `budget`, or at the smallest budget it reaches when none is given. Adds
    // the option it plans; returns the peak of that plan (above `budget` when it found none).
    [[nodiscard]] static Bytes greedy_option(const Problem& p, const detail::hrockmate::Interface& f,
                                             const detail::hrockmate::SubProblem& sub,
                                             const std::vector<detail::hrockmate::Child>& single, const std::string& name,
                                             Bytes boundary, std::optional<Bytes> budget,
                                             std::vector<detail::hrockmate::Option>& options) {
        using namespace detail::hrockmate;
        const AbstractProblem a = abstract_problem(p, f, single, {}, false, boundary, name);
        try {
            const Greedy greedy;
            const Bytes at = budget ? *budget : greedy.smallest_budget(a.problem);
            const Plan plan = greedy.solve(a.problem, at);
            if (auto o = option_of(p, f, sub, a, single, plan.schedule)) options.push_back(std::move(*o));
            return plan.peak;
        } catch (const Error&) {
            return std::numeric_limits<Bytes>::max();
        }
    }

    // Memory at the boundary in a schedule of the abstract problem (live data + its writes).
    [[nodiscard]] static Bytes boundary_memory(const detail::hrockmate::AbstractProblem& a, const Schedule& s) {
        const SimulationReport r = simulate(a.problem, s);
        for (std::size_t i = 0; i < s.size() && i < r.timeline.size(); ++i)
            if (s[i].is_run() && s[i].op() == *a.boundary) return r.timeline[i].during;
        return r.peak;
    }

    // ---------------------------------------------------------------- the top

    [[nodiscard]] std::optional<detail::exhaustive::ExhaustiveSearch::Result> top_search(
        const HRockmateModel& model, detail::exhaustive::SearchGoal goal, Bytes budget,
        double seconds = std::numeric_limits<double>::infinity()) const {
        using namespace detail::hrockmate;
        detail::hrockmate::SearchLimits limits = top_limits(model.hierarchy.clusters.empty(),
                                                            options_.top_time_limit_seconds,
                                                            options_.flat_time_limit_seconds);
        limits.seconds = std::min(limits.seconds, seconds);
        if (!(limits.seconds > 1e-3)) return std::nullopt;
        const std::vector<Child> children = children_of(model, model.hierarchy.top);
        const AbstractProblem a =
            abstract_problem(model.problem, model.top, children, model.hierarchy.top_ops, true, 0, model.problem.name());
        if (a.problem.data_count() > Exhaustive::max_data) return std::nullopt;
        return search(a, goal, budget, limits);
    }

    // The top searched at the budget and at the larger abstract budgets of
    // top_budget_factors; each flattened schedule is tidied, and the fastest that fits the
    // real budget is improved and returned. Two misses in a row (a plan over the budget) end
    // the climb. Within `seconds` (an unpartitioned problem: its flat limit, if lower), and
    // `improve_seconds` for the improvement.
    [[nodiscard]] std::optional<Plan> solve_top(const HRockmateModel& model, Bytes budget, double seconds,
                                                double improve_seconds) const {
        using namespace detail::hrockmate;
        const Stopwatch clock;
        const std::vector<Child> children = children_of(model, model.hierarchy.top);
        const AbstractProblem a =
            abstract_problem(model.problem, model.top, children, model.hierarchy.top_ops, true, 0, model.problem.name());
        std::optional<Schedule> best;
        double best_time = 0.0;
        std::size_t misses = 0;
        const std::vector<DataId> initial(model.problem.initial().begin(), model.problem.initial().end());
        const bool flat = model.hierarchy.clusters.empty();  // the abstract problem is the real one
        const std::size_t factors = flat ? 1 : options_.top_budget_factors.size();
        for (std::size_t i = 0; i < factors && misses < 2 && a.problem.data_count() <= Exhaustive::max_data; ++i) {
            const double left = seconds - clock.seconds();
            if (left <= 0 && !flat) break;
            const double factor = flat ? 1.0 : options_.top_budget_factors[i];
            const double scaled = static_cast<double>(budget) * factor;  // saturated: budgets may be near 2^63
            const Bytes abstract_budget =
                scaled < 9223372036854775808.0 ? static_cast<Bytes>(scaled) : std::numeric_limits<Bytes>::max();
            const auto r = search_or_weighted(a, abstract_budget, top_limits(flat, left, seconds), options_.fallback_weight);
            if (!r) continue;
            Schedule steps = tidy_schedule(model.problem, flatten(model.problem, a, children, r->schedule, initial).steps);
            const SimulationReport sim = simulate(model.problem, steps);
            if (!sim.fits(budget)) {
                ++misses;
                continue;
            }
            misses = 0;
            if (!best || sim.time < best_time) {
                best = std::move(steps);
                best_time = sim.time;
            }
        }
        if (!flat)
            if (auto assigned = top_by_assignment(model, budget, clock, seconds);
                assigned && (!best || assigned->second < best_time)) {
                best = std::move(assigned->first);
                best_time = assigned->second;
            }
        std::optional<Plan> plan;
        if (best) plan = finished(model.problem, *std::move(best), budget, "hierarchy", improve_seconds);
        report("hrockmate: top of '" + model.problem.name() + "' at " + std::to_string(budget) + " bytes: " +
               (plan ? "plan of time " + std::to_string(plan->time) : std::string("no plan")) + " in " +
               std::to_string(clock.seconds()) + " s");
        return plan;
    }

    // The top with one option per cluster child, planned by the greedy (which may still run a
    // child's fast forward or its option again to recompute): the exact search of the top
    // explodes at low budgets, where each child's forward options and their phantoms combine
    // into millions of live sets, while this plans in milliseconds. Which option each child
    // gets is found by coordinate descent from two starts, every child with its fastest option
    // and every child with its leanest; each assignment is flattened, tidied and simulated on
    // the whole problem, and the fastest schedule that fits is returned with its time.
    // Bounded by the top's `seconds` (`clock` counts from the start of the top).
    [[nodiscard]] std::optional<std::pair<Schedule, double>> top_by_assignment(const HRockmateModel& model, Bytes budget,
                                                                              const Stopwatch& clock, double seconds) const {
        using namespace detail::hrockmate;
        const std::vector<Child> children = children_of(model, model.hierarchy.top);
        const std::vector<DataId> initial(model.problem.initial().begin(), model.problem.initial().end());
        std::optional<std::pair<Schedule, double>> best;
        std::map<std::vector<std::size_t>, double> seen;  // assignment → time of its plan (infinity: none)
        const auto evaluate = [&](const std::vector<std::size_t>& assignment) {
            if (const auto it = seen.find(assignment); it != seen.end()) return it->second;
            double time = std::numeric_limits<double>::infinity();
            if (auto steps = assigned_top(model, children, assignment, budget, initial)) {
                time = simulate(model.problem, *steps).time;
                if (!best || time < best->second) best = std::make_pair(std::move(*steps), time);
            }
            seen.emplace(assignment, time);
            return time;
        };
        const auto out_of_time = [&] { return clock.seconds() > seconds; };
        for (const bool lean : {false, true}) {
            std::vector<std::size_t> assignment = start_assignment(children, lean);
            double current = evaluate(assignment);
            for (bool improved = true; improved && !out_of_time();) {
                improved = false;
                for (std::size_t c = 0; c < children.size() && !out_of_time(); ++c) {
                    if (children[c].real_ops) continue;
                    for (std::size_t o = 0; o < children[c].options->options.size() && !out_of_time(); ++o) {
                        if (o == assignment[c]) continue;
                        std::vector<std::size_t> next = assignment;
                        next[c] = o;
                        const double time = evaluate(next);
                        if (time < current) {
                            current = time;
                            assignment = std::move(next);
                            improved = true;
                        }
                    }
                }
            }
            if (out_of_time()) break;
        }
        return best;
    }

    // Per child: its fastest option (the first), or its leanest (least footprint).
    [[nodiscard]] static std::vector<std::size_t> start_assignment(const std::vector<detail::hrockmate::Child>& children,
                                                                   bool lean) {
        std::vector<std::size_t> assignment(children.size(), 0);
        for (std::size_t c = 0; c < children.size() && lean; ++c) {
            if (children[c].real_ops) continue;
            const auto& options = children[c].options->options;
            for (std::size_t o = 1; o < options.size(); ++o)
                if (detail::hrockmate::footprint(options[o]) < detail::hrockmate::footprint(options[assignment[c]]))
                    assignment[c] = o;
        }
        return assignment;
    }

    // The greedy's schedule of the top with the given option of each cluster child, flattened
    // and tidied; nullopt when the greedy finds none or the real schedule does not fit.
    [[nodiscard]] static std::optional<Schedule> assigned_top(const HRockmateModel& model,
                                                              const std::vector<detail::hrockmate::Child>& children,
                                                              const std::vector<std::size_t>& assignment, Bytes budget,
                                                              const std::vector<DataId>& initial) {
        using namespace detail::hrockmate;
        std::vector<NodeOptions> storage;
        const std::vector<Child> single = with_options(children, assignment, storage);
        const AbstractProblem a =
            abstract_problem(model.problem, model.top, single, model.hierarchy.top_ops, true, 0, model.problem.name());
        try {
            const Plan plan = Greedy{}.solve(a.problem, budget);
            Schedule steps = tidy_schedule(model.problem, flatten(model.problem, a, single, plan.schedule, initial).steps);
            if (!simulate(model.problem, steps).fits(budget)) return std::nullopt;
            return steps;
        } catch (const Error&) {
            return std::nullopt;
        }
    }

    // Rockmate's blocks and options when the problem is a sequence of at least two blocks,
    // each small enough for the exact block solver (rockmate_max_block_ops).
    // Its blocks share what is left of the analysis' time limit (`analysis` counts from its
    // start), at most RockmateOptions::block_time_limit_seconds each.
    [[nodiscard]] std::optional<RockmateModel> rockmate_model(const Problem& problem, const Stopwatch& analysis) const {
        if (!options_.use_rockmate) return std::nullopt;
        try {
            const BlockPartition part = partition_blocks(problem, options_.rockmate.partition);
            if (part.blocks.size() < 2) return std::nullopt;
            for (const Block& b : part.blocks)
                if (b.forward_ops.size() + b.backward_ops.size() > options_.rockmate_max_block_ops) return std::nullopt;
            const Stopwatch clock;
            RockmateOptions o = options_.rockmate;
            const double left = std::max(0.0, options_.time_limit_seconds - analysis.seconds());
            o.time_limit_seconds = std::min(o.time_limit_seconds.value_or(left), left);
            RockmateModel model = Rockmate<>(o).analyse(problem);
            report("hrockmate: rockmate on " + std::to_string(model.blocks.size()) + " blocks in " +
                   std::to_string(clock.seconds()) + " s");
            return model;
        } catch (const Error&) {
            return std::nullopt;
        }
    }

    // The exact search on the whole problem when it is small enough for it (at most 128 data)
    // but was partitioned: within `seconds` (and `improve_seconds` for the improvement), else
    // nothing.
    [[nodiscard]] std::optional<Plan> exact_plan(const Problem& problem, Bytes budget, double seconds,
                                                 double improve_seconds) const {
        if (problem.data_count() > Exhaustive::max_data) return std::nullopt;
        try {
            ExhaustiveOptions o;
            o.max_states = options_.flat_max_states;
            o.time_limit_seconds = seconds;
            const detail::exhaustive::ExhaustiveSearch s(problem, o);
            detail::exhaustive::ExhaustiveSearch::Result r = s.run(detail::exhaustive::SearchGoal::least_time, budget);
            if (!r.found) return std::nullopt;
            return finished(problem, std::move(r.schedule), budget, "exact", improve_seconds);
        } catch (const Error&) {
            return std::nullopt;
        }
    }

    // Rockmate's plan, improved within `improve_seconds`; nullopt when it has none.
    [[nodiscard]] std::optional<Plan> rockmate_plan(const RockmateModel& model, Bytes budget,
                                                    double improve_seconds) const {
        try {
            Plan r = Rockmate<>(options_.rockmate).solve(model, budget);
            return finished(model.problem, std::move(r.schedule), budget, "rockmate", improve_seconds);
        } catch (const Error&) {
            return std::nullopt;
        }
    }

    // HRockmateOptions::greedy along `order`.
    [[nodiscard]] GreedyOptions greedy_along(GreedyOrder order) const {
        GreedyOptions o = options_.greedy;
        o.order = order;
        return o;
    }
    // The greedy's plan (the portfolio of HRockmateOptions::greedy, its replays and its own
    // improvement), the faster along the store-all order and along the memory-aware order,
    // each within half of `seconds` (a plan may fit or be faster by reordering: on a 40-op
    // random DAG at 70 % of P_ref, 96 against 100), improved within `improve_seconds`; nullopt
    // when it fits no plan at this budget along either.
    [[nodiscard]] std::optional<Plan> greedy_plan(const Problem& problem, Bytes budget, double seconds,
                                                  double improve_seconds) const {
        std::optional<Plan> best;
        for (const GreedyOrder order : {GreedyOrder::store_all, GreedyOrder::memory_aware}) {
            try {
                Plan g = Greedy{greedy_within(greedy_along(order), seconds / 2)}.solve(problem, budget);
                if (!best || g.time < best->time) best = std::move(g);
            } catch (const Infeasible&) {
                // the other order may still fit
            }
        }
        if (!best) return std::nullopt;
        return finished(problem, std::move(best->schedule), budget, "greedy (" + best->stats.options + ")", improve_seconds);
    }

    // A candidate schedule that fits, locally improved when asked (within `improve_seconds`,
    // at most ImproveOptions' limit), as a checked plan whose stats name the component that
    // made it.
    [[nodiscard]] Plan finished(const Problem& problem, Schedule schedule, Bytes budget, const std::string& component,
                                double improve_seconds) const {
        if (options_.improve_plans) {
            ImproveOptions o = options_.improve;
            o.time_limit_seconds = std::max(0.0, std::min(o.time_limit_seconds, improve_seconds));
            schedule = improve_schedule(problem, std::move(schedule), budget, o);
        }
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt,
                          "component=" + component + (options_.improve_plans ? ", improved" : "")};
        return make_checked_plan(problem, std::move(schedule), budget, std::move(stats));
    }

    // Within the `seconds` left of the solve's limit: its smallest budget's search gets no more.
    // `least_peak`: what flat_least_peak() answered (nullopt also for a partitioned problem).
    [[nodiscard]] Infeasible infeasible(const HRockmateModel& model, Bytes budget, double seconds,
                                        std::optional<Bytes> least_peak) const {
        const MemoryLowerBound bound = memory_lower_bound(model.problem);
        const Bytes least = smallest_budget_given(model, seconds, least_peak);
        const bool proven = budget < bound.bytes || (least_peak && budget < *least_peak);
        std::ostringstream m;
        m << "hrockmate cannot plan '" << model.problem.name() << "' within " << budget << " bytes: ";
        if (budget < bound.bytes)
            m << "the budget is below a proven lower bound: every schedule needs at least " << bound.bytes << " bytes ("
              << bound.reason << ")";
        else if (proven)
            m << "the budget is below a proven lower bound: the exact search finds no schedule within it, and the least "
                 "peak of any schedule is " << *least_peak << " bytes";
        else
            m << "the budget is above the proven lower bound of " << bound.bytes << " bytes (" << bound.reason
              << ") but beyond what the hierarchy, the greedy" << (model.rockmate ? " and Rockmate" : "")
              << " reach; an exact solver (checkmate) may plan it";
        if (least != std::numeric_limits<Bytes>::max() && !(proven && least_peak))
            m << "; hrockmate's smallest budget is " << least << " bytes";
        return Infeasible(m.str(), budget,
                          least != std::numeric_limits<Bytes>::max() ? std::optional<Bytes>(least) : std::nullopt,
                          proven ? InfeasibleBecause::no_schedule_fits : InfeasibleBecause::beyond_solver);
    }

    HRockmateOptions options_;
};

}  // namespace remat
