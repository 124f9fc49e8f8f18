// examples/cli/solver_table.hpp — the solvers the command-line programs offer, in one table.
//
// remat-plan (--solver NAME[:VARIANT]) and plan-demo both read this table; adding a solver
// to the programs means adding one entry here. Solvers that need a MILP backend are listed
// only when the programs were built with one (REMAT_WITH_LPSOLVE / REMAT_WITH_CBC). The
// library itself dispatches at compile time (the Solver concept); this runtime table exists
// only for the programs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <remat/remat.hpp>
#include <remat/solvers/periodic.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/solvers/exhaustive.hpp>
#include <remat/solvers/greedy.hpp>
#include <remat/solvers/rockmate.hpp>
#include <remat/solvers/hierarchical.hpp>
#include <remat/solvers/auto.hpp>
#include <remat/partition/blocks.hpp>
#include <remat/core/bounds.hpp>
#include <remat/bounds/loss_state_bound.hpp>
#include <remat/bounds/time_lower_bound.hpp>
#ifdef REMAT_WITH_LPSOLVE
#include <remat/milp/lp_solve.hpp>
#include <remat/solvers/checkmate.hpp>
#include <remat/solvers/rockmate_milp.hpp>
#endif
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif
#include <remat/milp/preferred.hpp>

namespace remat::cli {

/// What the command line says about how to solve, besides the budget.
struct SolveOptions {
    std::string variant;               ///< the part after ':' in --solver NAME:VARIANT, or empty
    std::optional<double> time_limit;  ///< --time-limit S, for solvers that search
    /// Progress lines of the solvers; remat-plan prints them with the elapsed time (every
    /// line with --verbose, one every few seconds by default, none with --quiet).
    ProgressCallback progress;
    /// --solver auto: H-Rockmate's second opinion beside Rotor or Rockmate on small problems
    /// (AutoOptions::second_opinion_max_ops); off where one plan costs too much time to repeat.
    bool second_opinion = true;
    /// --certify S: auto's certification by the exact search (AutoOptions::certify_seconds).
    std::optional<double> certify;
    /// --solver auto: Checkmate started from auto's plan on problems of at most 60 ops
    /// (AutoOptions::exact_component), in builds with a MILP backend; off where one plan costs
    /// too much time to repeat (sweeps, the activations of an offloading plan).
    bool exact_component = true;
    /// A proven lower bound on the time at this budget (bounds/time_lower_bound.hpp), when
    /// remat-plan has one before planning: Checkmate (by name or as auto's exact component)
    /// uses it instead of proving its own (CheckmateOptions::time_bound), and auto and
    /// H-Rockmate stop once a plan meets it (AutoOptions::time_bound, HRockmateOptions::time_bound).
    std::optional<double> time_bound;
    /// With that bound, the data its relaxation keeps at the loss (TimeLowerBound::live_at_loss):
    /// auto's loss-state search tries them first (AutoOptions::loss_state_preferred).
    std::vector<std::string> loss_state_preferred;
};

struct SolverEntry {
    std::string_view name;
    std::string_view summary;       ///< one line for --help
    std::string_view variant_help;  ///< what NAME:VARIANT accepts; empty when no variant
    /// What a problem must have for this entry to apply, after "needs" ("a chain"); empty: any
    /// problem. --help shows it, and a problem without it is refused with it.
    std::string_view requirement;
    /// Chosen when --solver is not given: the first applicable entry with this flag.
    bool default_choice = false;
    /// Applies to this problem at all (hard limits of the method).
    std::function<bool(const Problem&)> applies;
    /// Finishes in about a second on this problem (the demo runs only those).
    std::function<bool(const Problem&)> quick;
    /// Plans at a budget: a Plan, or Infeasible carrying the smallest feasible budget.
    std::function<Plan(const Problem&, Bytes, const SolveOptions&)> solve;
};

namespace detail {

inline bool is_chain(const Problem& problem) { return as_chain(problem).has_value(); }
inline bool always(const Problem&) { return true; }
inline constexpr std::string_view needs_chain = "a chain (docs/formats.md §5)";
inline constexpr std::string_view needs_loss = "a loss op";

inline std::size_t positive_variant(std::string_view name, std::string_view help, const SolveOptions& options) {
    const std::string& v = options.variant;
    std::size_t value = 0;
    bool ok = !v.empty() && v.size() <= 9;
    for (const char c : v) {
        ok = ok && c >= '0' && c <= '9';
        if (ok) value = value * 10 + static_cast<std::size_t>(c - '0');
    }
    if (!ok || value == 0)
        throw InvalidInput("solver '" + std::string(name) + ":" + v + "': expected " + std::string(help));
    return value;
}

inline constexpr std::string_view rockmate_variant_help = "rockmate:GRID, peak and saved budgets per block (default 8)";

inline void no_variant(std::string_view name, const SolveOptions& options) {
    if (!options.variant.empty())
        throw InvalidInput("solver '" + std::string(name) + "' takes no ':" + options.variant + "' variant");
}

inline constexpr std::string_view hrockmate_variant_help =
    "hrockmate:OPTIONS, comma-separated: children=N (cluster size cap, default 4), grid=N (peak and saved "
    "budgets per cluster, default 4), options=N (options per cluster, default 5), hierarchy-only (no greedy, "
    "Rockmate or exact component)";

// A key=N part of a variant.
inline std::size_t variant_number(std::string_view name, std::string_view help, const std::string& part) {
    SolveOptions o;
    o.variant = part.substr(part.find('=') + 1);
    return positive_variant(name, help, o);
}

inline HRockmateOptions hrockmate_options(const SolveOptions& o) {
    constexpr std::string_view name = "hrockmate";
    constexpr std::string_view help = hrockmate_variant_help;
    HRockmateOptions options;
    std::size_t from = 0;
    while (from < o.variant.size()) {
        const std::size_t comma = std::min(o.variant.find(',', from), o.variant.size());
        const std::string part = o.variant.substr(from, comma - from);
        from = comma + 1;
        if (part.rfind("children=", 0) == 0) {
            options.hierarchy.max_children = std::max<std::size_t>(2, variant_number(name, help, part));
        } else if (part.rfind("grid=", 0) == 0) {
            options.peak_budgets = options.saved_budgets = variant_number(name, help, part);
        } else if (part.rfind("options=", 0) == 0) {
            options.max_options = variant_number(name, help, part);
        } else if (part == "hierarchy-only") {
            options.compare_with_greedy = false;
            options.use_rockmate = false;
        } else {
            throw InvalidInput("solver 'hrockmate:" + o.variant + "': unknown option '" + part + "'; expected " +
                               std::string(help));
        }
    }
    // --time-limit covers the analysis and the planning at a budget, shared as remat::Auto
    // shares its limit (hrockmate_planner sets the planning's part once the analysis is done).
    if (o.time_limit) options.time_limit_seconds = auto_analysis_share * *o.time_limit;
    options.time_bound = o.time_bound;
    options.progress = o.progress;
    return options;
}

}  // namespace detail

/// H-Rockmate bound to one problem: the hierarchy and every cluster's options are analysed
/// once; each call plans one budget. The first plan's solve time includes the analysis. With
/// --time-limit S, the analysis gets auto_analysis_share of S and each budget what it left (at
/// least the rest of the share), every component together.
[[nodiscard]] inline std::function<Plan(Bytes)> hrockmate_planner(const Problem& problem, const SolveOptions& o) {
    HRockmateOptions options = detail::hrockmate_options(o);
    auto model = std::make_shared<const HRockmateModel>(HRockmate(options).analyse(problem));
    if (o.time_limit)
        options.budget_time_limit_seconds = std::max(auto_planning_seconds(*o.time_limit, model->seconds), 1e-3);
    const HRockmate solver(options);
    return [solver, model = std::move(model), first = true](Bytes budget) mutable {
        Plan plan = solver.solve(*model, budget);
        if (first) plan.stats.solve_seconds += model->seconds;
        first = false;
        return plan;
    };
}

/// Rockmate bound to one problem: the block analysis (every block's grid of options), which
/// does not depend on the budget, runs once here; each call of the result runs only the
/// sequence solver across the blocks. The first plan's solve time includes the analysis.
/// remat-plan --sweep plans all its budgets with one.
[[nodiscard]] inline std::function<Plan(Bytes)> rockmate_planner(const Problem& problem, const SolveOptions& o) {
    constexpr std::string_view name = "rockmate";
    constexpr std::string_view help = detail::rockmate_variant_help;
    RockmateOptions options;
    if (!o.variant.empty()) options.peak_budgets = options.saved_budgets = detail::positive_variant(name, help, o);
    // --time-limit covers the whole analysis, shared by the blocks' grids.
    if (o.time_limit) options.time_limit_seconds = *o.time_limit;
    options.progress = o.progress;
#ifdef REMAT_WITH_LPSOLVE
    using Planner = RockmateMilp<>;
#else
    using Planner = Rockmate<>;
#endif
    const Planner rockmate(options);
    return [rockmate, model = std::make_shared<const RockmateModel>(rockmate.analyse(problem)),
            first = true](Bytes budget) mutable {
        Plan plan = rockmate.solve(*model, budget);
        if (first) plan.stats.solve_seconds += model->seconds;
        first = false;
        return plan;
    };
}

namespace detail {

// AutoOptions::exact_component: Checkmate on the build's preferred backend (milp/preferred.hpp),
// started from auto's plan; empty without a backend.
[[nodiscard]] inline decltype(AutoOptions::exact_component) checkmate_from_plan(std::optional<double> time_bound) {
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    return [time_bound](const Problem& problem, Bytes budget, const Plan& incumbent,
                        double seconds) -> std::optional<Plan> {
        CheckmateOptions o;
        o.time_limit_seconds = seconds;
        o.start = incumbent.schedule;
        o.time_bound = time_bound;
        return Checkmate<milp::Preferred>(o).solve(problem, budget);
    };
#else
    (void)time_bound;
    return {};
#endif
}

// AutoOptions::loss_state_proof: loss_state_bound (bounds/loss_state_bound.hpp) on the build's
// preferred backend; empty without a backend.
[[nodiscard]] inline decltype(AutoOptions::loss_state_proof) loss_state_proof() {
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    return [](const Problem& problem, Bytes budget, double target, double seconds) {
        LossStateBoundOptions o;
        o.time_limit_seconds = seconds;
        return loss_state_bound(problem, budget, milp::Preferred{}, target, o);
    };
#else
    return {};
#endif
}

// AutoOptions::bound_from_plan: the time bound's relaxations (bounds/time_lower_bound.hpp) on
// the build's preferred backend, up to a cut at every op of the longest chain after the loss,
// each started from the plan (TimeLowerBoundOptions::start); empty without a backend.
[[nodiscard]] inline decltype(AutoOptions::bound_from_plan) bound_from_plan() {
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    return [](const Problem& problem, Bytes budget, const Plan& plan, double seconds) {
        TimeLowerBoundOptions o;
        o.time_limit_seconds = seconds;
        o.max_cuts = std::max(o.cuts, problem.op_count());  // every op of the chain: the longest has fewer
        o.start = plan.schedule;
        return time_lower_bound(problem, budget, milp::Preferred{}, o).time;
    };
#else
    return {};
#endif
}

}  // namespace detail

/// What --solver auto picks for a problem (remat::auto_choice, solvers/auto.hpp).
[[nodiscard]] inline std::string auto_choice(const Problem& problem) { return std::string(to_string(remat::auto_choice(problem))); }

namespace detail {

/// remat::Auto's options as the command line gives them.
[[nodiscard]] inline AutoOptions auto_options(const SolveOptions& o) {
    AutoOptions options;
    options.time_limit_seconds = o.time_limit;
    options.time_bound = o.time_bound;
    options.loss_state_preferred = o.loss_state_preferred;
    options.progress = o.progress;
    if (!o.second_opinion) options.second_opinion_max_ops = 0;
    options.certify_seconds = o.certify.value_or(o.exact_component ? options.certify_seconds : 0.0);
    if (!o.exact_component) options.window_search_seconds = 0.0;  // a sweep plans many budgets
    if (o.exact_component) {
        options.exact_component = checkmate_from_plan(o.time_bound);
        options.loss_state_proof = loss_state_proof();
        options.bound_from_plan = bound_from_plan();
    }
    return options;
}

}  // namespace detail

/// --solver auto bound to one problem: remat::Auto itself (solvers/auto.hpp), the library's
/// one auto path, with its analysis run once for all the budgets of a sweep — and not at all
/// for a budget below the proven lower bound, which is answered at once.
[[nodiscard]] inline std::function<Plan(Bytes)> auto_planner(const Problem& problem, const SolveOptions& o) {
    AutoOptions options = detail::auto_options(o);
    const Auto solver(std::move(options));
    return [solver, p = std::make_shared<const Problem>(problem), model = std::shared_ptr<const AutoModel>(),
            first = true](Bytes budget) mutable -> Plan {
        if (!model)
            remat::detail::automatic::refuse_below_bound(
                *p, budget, [&] { return remat::detail::automatic::smallest_budget_without_analysis(*p); });
        if (!model) model = std::make_shared<const AutoModel>(solver.analyse(*p));
        Plan plan = solver.solve(*model, budget);
        if (first) plan.stats.solve_seconds += model->seconds;
        first = false;
        return plan;
    };
}

/// Every solver the programs offer, in the order --help lists them.
[[nodiscard]] inline const std::vector<SolverEntry>& solver_table() {
    static const std::vector<SolverEntry> table = [] {
        std::vector<SolverEntry> t;
        {
            SolverEntry e{"rotor", "optimal persistent schedule of a chain (Beaumont et al. 2019)",
                          "rotor:SLOTS, the number of memory slots of the DP (default 500)", detail::needs_chain, false, {},
                          {}, {}};
            e.applies = detail::is_chain;
            e.quick = detail::is_chain;
            e.solve = [name = e.name, help = e.variant_help](const Problem& p, Bytes budget, const SolveOptions& o) {
                RotorOptions options;
                if (!o.variant.empty()) options.slots = detail::positive_variant(name, help, o);
                options.time_limit_seconds = o.time_limit;
                options.progress = o.progress;
                return Rotor(options).solve(p, budget);
            };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"rotor-release",
                          "Rotor's DP beyond persistent schedules: checkpoints freed after their last use and "
                          "recomputed (remat)",
                          "rotor-release:SLOTS, the least number of memory slots of the DP (default 500; short "
                          "chains get more)",
                          detail::needs_chain, false, {}, {}, {}};
            e.applies = detail::is_chain;
            e.quick = detail::is_chain;
            e.solve = [name = e.name, help = e.variant_help](const Problem& p, Bytes budget, const SolveOptions& o) {
                RotorOptions options;
                if (!o.variant.empty()) options.slots = detail::positive_variant(name, help, o);
                options.time_limit_seconds = o.time_limit;
                options.progress = o.progress;
                return RotorRelease(options).solve(p, budget);
            };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"periodic", "checkpoint every k-th stage input (Chen et al. 2016)",
                          "periodic:K, the stages per segment (default ceil(sqrt(L)))", detail::needs_chain, false, {}, {},
                          {}};
            e.applies = detail::is_chain;
            e.quick = detail::is_chain;
            e.solve = [name = e.name, help = e.variant_help](const Problem& p, Bytes budget, const SolveOptions& o) {
                std::optional<std::size_t> k;
                if (!o.variant.empty()) k = detail::positive_variant(name, help, o);
                return Periodic(k).solve(p, budget);
            };
            t.push_back(std::move(e));
        }
#ifdef REMAT_WITH_LPSOLVE
        {
            SolverEntry e{"checkmate", "optimal schedule of any graph by integer programming (Jain et al. 2020)",
#ifdef REMAT_WITH_CBC
                          "checkmate:lpsolve or checkmate:cbc, the MILP backend (default cbc)",
#else
                          "checkmate:lpsolve, the MILP backend (the only one built)",
#endif
                          "", false, {}, {}, {}};
            e.applies = detail::always;
            e.quick = [](const Problem& p) { return p.op_count() <= 12; };
            e.solve = [name = e.name](const Problem& p, Bytes budget, const SolveOptions& o) -> Plan {
                CheckmateOptions options;
                if (o.time_limit) options.time_limit_seconds = *o.time_limit;
                options.progress = o.progress;
                options.time_bound = o.time_bound;
#ifdef REMAT_WITH_CBC
                if (o.variant.empty() || o.variant == "cbc") return Checkmate<milp::Cbc>(options).solve(p, budget);
#endif
                if (o.variant.empty() || o.variant == "lpsolve") return Checkmate<milp::LpSolve>(options).solve(p, budget);
                throw InvalidInput("solver '" + std::string(name) + ":" + o.variant + "': unknown MILP backend; " +
#ifdef REMAT_WITH_CBC
                                   "use checkmate:lpsolve or checkmate:cbc");
#else
                                   "use checkmate:lpsolve (this build has no CBC)");
#endif
            };
            t.push_back(std::move(e));
        }
#endif
        {
            SolverEntry e{"rockmate", "exact block options, Rotor across the blocks (Zhao et al. 2023)",
                          detail::rockmate_variant_help, detail::needs_loss, false, {}, {}, {}};
            e.applies = [](const Problem& p) { return p.loss().has_value(); };
            e.quick = [](const Problem& p) { return p.data_count() <= 200; };
            e.solve = [](const Problem& p, Bytes budget, const SolveOptions& o) { return rockmate_planner(p, o)(budget); };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"greedy", "fast greedy eviction and recomputation, any graph (after DTR, Kirisame et al. 2021)",
                          "greedy:dtr or greedy:belady, one eviction rule (default: both, the faster plan)", "", false,
                          {}, {}, {}};
            e.applies = detail::always;
            e.quick = detail::always;
            e.solve = [name = e.name, help = e.variant_help](const Problem& p, Bytes budget, const SolveOptions& o) {
                GreedyOptions options;
                if (o.variant == "dtr")
                    options.eviction = GreedyEviction::dtr;
                else if (o.variant == "belady")
                    options.eviction = GreedyEviction::farthest_next_use;
                else if (!o.variant.empty())
                    throw InvalidInput("solver '" + std::string(name) + ":" + o.variant + "': expected " + std::string(help));
                return Greedy(options).solve(p, budget);
            };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"hrockmate", "hierarchy of small exact searches for any graph, with the greedy and Rockmate "
                          "as components (after H-Rockmate/HiRemate, Zhao et al. 2025)",
                          detail::hrockmate_variant_help, detail::needs_loss, false, {}, {}, {}};
            e.applies = [](const Problem& p) { return p.loss().has_value(); };
            e.quick = [](const Problem& p) { return p.op_count() <= 40; };
            e.solve = [](const Problem& p, Bytes budget, const SolveOptions& o) { return hrockmate_planner(p, o)(budget); };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"auto", "the default: rotor for chains, rockmate for sequences of small blocks, hrockmate "
                          "otherwise; greedy as the last resort", "", "", true, {}, {}, {}};
            e.applies = detail::always;
            e.quick = [](const Problem& p) { return p.op_count() <= 40 || detail::is_chain(p); };
            e.solve = [](const Problem& p, Bytes budget, const SolveOptions& o) { return auto_planner(p, o)(budget); };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"exhaustive", "exact optimum over all schedules by A* search (small problems)", "",
                          "at most 128 data and 64 exactly-once ops", false, {}, {}, {}};
            e.applies = [](const Problem& p) { return Exhaustive::handles(p); };
            e.quick = [](const Problem& p) { return p.data_count() <= 20; };
            e.solve = [name = e.name](const Problem& p, Bytes budget, const SolveOptions& o) {
                detail::no_variant(name, o);
                ExhaustiveOptions options;
                if (o.time_limit) options.time_limit_seconds = *o.time_limit;
                return Exhaustive(options).solve(p, budget);
            };
            t.push_back(std::move(e));
        }
        {
            SolverEntry e{"store-all", "no rematerialization: the framework's own order (the reference)", "", "",
                          false, {}, {}, {}};
            e.applies = detail::always;
            e.quick = detail::always;
            e.solve = [name = e.name](const Problem& p, Bytes budget, const SolveOptions& o) {
                detail::no_variant(name, o);
                return StoreAll{}.solve(p, budget);
            };
            t.push_back(std::move(e));
        }
        return t;
    }();
    return table;
}

/// The entry named by NAME or NAME:VARIANT (the variant goes to `options`).
[[nodiscard]] inline const SolverEntry& find_solver(std::string_view spec, SolveOptions& options) {
    const auto colon = spec.find(':');
    const std::string_view name = spec.substr(0, colon);
    options.variant = colon == std::string_view::npos ? std::string() : std::string(spec.substr(colon + 1));
    for (const SolverEntry& e : solver_table())
        if (e.name == name) {
            if (colon != std::string_view::npos && e.variant_help.empty())
                throw InvalidInput("solver '" + std::string(name) + "' takes no ':VARIANT'");
            if (colon != std::string_view::npos && options.variant.empty())
                throw InvalidInput("solver '" + std::string(name) + ":' has an empty variant; write '" +
                                   std::string(name) + "' alone or " + std::string(e.variant_help));
            return e;
        }
    std::string known;
    for (const SolverEntry& e : solver_table()) known += (known.empty() ? "" : ", ") + std::string(e.name);
    throw InvalidInput("unknown solver '" + printable(name) + "'; known solvers: " + known);
}

/// The solver used when none is named: the first applicable default choice.
[[nodiscard]] inline const SolverEntry& default_solver(const Problem& problem) {
    for (const SolverEntry& e : solver_table())
        if (e.default_choice && e.applies(problem)) return e;
    return solver_table().back();
}

/// The names of the solvers that apply to a problem, from the table (for messages).
[[nodiscard]] inline std::string applicable_solvers(const Problem& problem) {
    std::string names;
    for (const SolverEntry& e : solver_table())
        if (e.applies(problem)) names += (names.empty() ? "" : ", ") + std::string(e.name);
    return names;
}

/// Refuses a problem the entry does not apply to: an InvalidInput that says what the entry
/// needs, the problem's size, and the solvers that apply.
inline void require_applies(const SolverEntry& entry, const Problem& problem) {
    if (entry.applies(problem)) return;
    std::string why = "solver '" + std::string(entry.name) + "' does not apply to problem '" + printable(problem.name()) +
                      "' (" + std::to_string(problem.data_count()) + " data, " + std::to_string(problem.op_count()) + " ops";
    if (!entry.requirement.empty()) why += "): it needs " + std::string(entry.requirement);
    else why += ")";
    throw InvalidInput(why + "; solvers that apply: " + applicable_solvers(problem));
}

/// Runs an entry, turning "does not apply" into a clear InvalidInput naming those that apply.
[[nodiscard]] inline Plan solve_with(const SolverEntry& entry, const Problem& problem, Bytes budget,
                                     const SolveOptions& options) {
    require_applies(entry, problem);
    return entry.solve(problem, budget, options);
}

/// Whether the entry analyses a problem before planning at a budget (Rockmate, H-Rockmate,
/// auto): planner_for then analyses once for every budget, and a plan asked at budget 0
/// answers with the smallest budget.
[[nodiscard]] inline bool analyses_once(const SolverEntry& entry) {
    return entry.name == "rockmate" || entry.name == "hrockmate" || entry.name == "auto";
}

/// The entry bound to one problem, for planning many budgets of it (a sweep, the activations
/// of an offloading plan): Rockmate, H-Rockmate and auto analyse the problem once, here or at
/// the first budget; every other entry plans each budget anew, as solve_with does.
[[nodiscard]] inline std::function<Plan(Bytes)> planner_for(const SolverEntry& entry, const Problem& problem,
                                                            const SolveOptions& options) {
    require_applies(entry, problem);
    if (entry.name == "rockmate") return rockmate_planner(problem, options);
    if (entry.name == "hrockmate") return hrockmate_planner(problem, options);
    if (entry.name == "auto") return auto_planner(problem, options);
    return [&entry, p = std::make_shared<const Problem>(problem), options](Bytes budget) {
        return entry.solve(*p, budget, options);
    };
}

/// The smallest budget at which the entry has a plan: asked at budget 0, the solver answers
/// with Infeasible carrying it. A solver that does not know it is searched by bisection
/// between 0 and `upper` (a budget known to work, e.g. P_ref), assuming monotonicity.
[[nodiscard]] inline std::optional<Bytes> smallest_budget(const SolverEntry& entry, const Problem& problem,
                                                            const SolveOptions& options, Bytes upper) {
    try {
        return solve_with(entry, problem, 0, options).peak;
    } catch (const Infeasible& e) {
        if (e.smallest_budget()) return e.smallest_budget();
    }
    const auto feasible = [&](Bytes b) {
        try {
            (void)solve_with(entry, problem, b, options);
            return true;
        } catch (const Infeasible&) {
            return false;
        }
    };
    if (!feasible(upper)) return std::nullopt;
    Bytes lo = 0, hi = upper;  // infeasible at lo, feasible at hi
    while (hi - lo > 1) {
        const Bytes mid = lo + (hi - lo) / 2;
        (feasible(mid) ? hi : lo) = mid;
    }
    return hi;
}

/// Whether this build has a MILP backend for proven_time_bound.
inline constexpr bool have_time_bound_backend = milp::have_preferred_backend;

/// The proven lower bound on the time of any schedule within `budget`
/// (bounds/time_lower_bound.hpp), with the build's preferred MILP backend (milp/preferred.hpp).
/// `grown_cuts` (TimeLowerBoundOptions::grown_cuts): 0 for the quick bound that returns once
/// its default cuts are solved; more spends the time limit on a tighter one.
[[nodiscard]] inline TimeLowerBound proven_time_bound(const Problem& problem, Bytes budget, const SolveOptions& options,
                                                      std::size_t grown_cuts = 0) {
    TimeLowerBoundOptions o;
    if (options.time_limit) o.time_limit_seconds = *options.time_limit;
    o.grown_cuts = grown_cuts;
    o.progress = options.progress;
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    return time_lower_bound(problem, budget, milp::Preferred{}, o);
#else
    (void)problem, (void)budget, (void)o;
    throw InvalidInput("--bound solves a small integer program, and this remat-plan was built without a MILP backend; "
                       "rebuild with lp_solve or CBC (liblpsolve55-dev, coinor-libcbc-dev)");
#endif
}

}  // namespace remat::cli
