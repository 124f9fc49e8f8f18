// bench_checkmate — how long Checkmate (Jain et al., MLSys 2020) takes to prove its optimum,
// with each MILP backend, and what the optimal schedules cost.
//
// Seeded random chains (docs/formats.md §5) and training-like DAGs of about 10, 20, 40 and 80 ops
// (tests/support/random_problems.hpp), at budgets of 40, 60 and 80 % of P_ref (the store-all
// peak). For each problem and budget it prints the MILP's size, then per backend the solve
// seconds (to the proven optimum, or up to the time limit), the outcome (optimal, the gap
// left at the time limit, no solution, or infeasible with the smallest feasible budget) and
// the schedule's time overhead over store-all (time / T_ref - 1). The exact search (A*,
// solvers/exhaustive.hpp) runs beside the backends, within the same limit, and the table
// cross-checks its optima and infeasible budgets against theirs; "A* no mem" is the same search
// without its memory bound, "A* plain" with only the exactly-once ops' time as its bound. The summary checks the
// issue's aim: a 40-op problem solved to proven optimality in under 10 s by the faster
// backend, and then by any of remat's methods (a backend, the exact search, or Auto's plan
// meeting the proven bound, whichever proves it first). Both backends run single-threaded. A second table gives remat::Auto's plan at the
// same budgets, the proven time bound (bounds/time_lower_bound.hpp) and the certified gap
// between them, which holds whether or not any exact solver finishes. Auto runs as remat-plan
// runs it: after the bound (at most half the limit and 5 s), within the rest of the limit, told
// the bound, with Checkmate on the preferred backend (milp/preferred.hpp) started from its
// plan as its exact component. Progress goes to stderr, the tables to stdout.
//
// A third table gives the root LP bound of the MILP (the relaxation its branch-and-bound
// starts from) before and after its valid inequalities, against the best schedule.
//
//   bench_checkmate [--time-limit S] [--sizes 10,20,40,80] [--quick] [--seed N] [--extra-passes N]
//                   [--time-bound S] [--verbose]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <remat/remat.hpp>
#include <remat/bounds/time_lower_bound.hpp>
#include <remat/solvers/checkmate.hpp>
#ifdef REMAT_WITH_LPSOLVE
#include <remat/milp/lp_solve.hpp>
#endif
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif
#include <remat/milp/preferred.hpp>

#include "../tests/support/random_problems.hpp"
#include "cli/solver_table.hpp"

using namespace remat;

namespace {

constexpr std::size_t aim_ops = 40;
constexpr double aim_seconds = 10.0;
constexpr std::size_t larger_aim_ops = 60;  // and every 60-op budget within 60 s
constexpr double larger_aim_seconds = 60.0;

std::string format(const char* spec, double x) {
    char s[64];
    std::snprintf(s, sizeof s, spec, x);
    return s;
}

struct Case {
    std::string shape;  // "chain" or "dag"
    std::size_t target = 0;
    Problem problem;
    Reference ref;
};

// A chain of L stages has 3L + 1 ops (F, F+ and B per stage, and the loss).
Case make_chain(std::size_t target, std::uint64_t seed) {
    std::mt19937 rng(static_cast<std::mt19937::result_type>(seed * 7919 + target * 2 + 0));
    const std::size_t stages = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround((double(target) - 1) / 3)));
    Problem p = to_problem(testing::random_chain(rng, stages, "chain-" + std::to_string(target)));
    Reference ref = store_all_reference(p);
    return Case{"chain", target, std::move(p), std::move(ref)};
}

// The DAG of about `target` ops (testing::bench_dag, shared with the tests that reproduce a row).
Case make_dag(std::size_t target, std::uint64_t seed) {
    Problem p = testing::bench_dag(target, seed);
    Reference ref = store_all_reference(p);
    return Case{"dag", target, std::move(p), std::move(ref)};
}

struct Outcome {
    enum class Kind { not_built, optimal, feasible, no_solution, infeasible, error };
    Kind kind = Kind::not_built;
    double seconds = 0.0;
    std::optional<double> gap;  // plan time / proven bound - 1 (SolverStats::gap), when bounded
    double time = 0.0;          // of the schedule
    Bytes peak = 0;
    std::optional<Bytes> smallest;  // when infeasible
    bool smallest_proven = false;   // false: a budget known to work, the search ran out of time
    bool proven_optimal = false;    // (auto) its plan proven optimal over every schedule: status optimal, gap 0
    std::string message;
};

template <class Backend>
Outcome solve_with(const Problem& problem, Bytes budget, const CheckmateOptions& options) {
    const Checkmate<Backend> checkmate(options);
    Outcome out;
    const auto start = std::chrono::steady_clock::now();
    try {
        const Plan plan = checkmate.solve(problem, budget);
        out.seconds = seconds_since(start);
        out.kind = plan.stats.status == SolveStatus::optimal ? Outcome::Kind::optimal : Outcome::Kind::feasible;
        out.gap = plan.stats.gap;
        out.time = plan.time;
        out.peak = plan.peak;
    } catch (const Infeasible& e) {
        out.seconds = seconds_since(start);
        out.kind = Outcome::Kind::infeasible;
        out.smallest = e.smallest_budget();
        // Checkmate's message says whether its search for the smallest budget finished.
        out.smallest_proven = std::string_view(e.what()).find("the smallest feasible budget is ") != std::string_view::npos;
        out.message = e.what();
    } catch (const SolverError& e) {
        // Checkmate's way of saying the time limit ran out before any schedule was found.
        out.seconds = seconds_since(start);
        out.kind = Outcome::Kind::no_solution;
        out.message = e.what();
    } catch (const Error& e) {
        out.seconds = seconds_since(start);
        out.kind = Outcome::Kind::error;
        out.message = e.what();
    }
    return out;
}

// Runs a solver that returns a plan and records the outcome: `solved` for a plan, the smallest
// budget known for Infeasible, `at_limit` for a SolverError (its time or state limit),
// `beyond_reach` for InvalidInput (a problem past its size limits), an error otherwise.
struct OutcomeKinds {
    Outcome::Kind solved, at_limit, beyond_reach;
};
template <class PlanIt>
Outcome outcome_of(PlanIt plan_it, OutcomeKinds kinds) {
    Outcome out;
    const auto start = std::chrono::steady_clock::now();
    try {
        const Plan plan = plan_it();
        out.kind = kinds.solved;
        out.time = plan.time;
        out.peak = plan.peak;
        out.gap = plan.stats.gap;
        out.proven_optimal = plan.stats.status == SolveStatus::optimal && plan.stats.gap && *plan.stats.gap <= 0.0;
    } catch (const Infeasible& e) {
        out.kind = Outcome::Kind::infeasible;
        out.smallest = e.smallest_budget();
        out.message = e.what();
    } catch (const InvalidInput& e) {
        out.kind = kinds.beyond_reach;
        out.message = e.what();
    } catch (const SolverError& e) {
        out.kind = kinds.at_limit;
        out.message = e.what();
    } catch (const Error& e) {
        out.kind = Outcome::Kind::error;
        out.message = e.what();
    }
    out.seconds = seconds_since(start);
    return out;
}

// The exact search (solvers/exhaustive.hpp: A* over live data and exactly-once ops done),
// within the same time limit: the combinatorial alternative to the MILP. "n/a" beyond its size
// limits (128 data, 64 exactly-once ops).
struct SearchBounds {
    bool recompute = true;
    bool memory = true;
};
Outcome solve_exactly(const Problem& problem, Bytes budget, double seconds, SearchBounds bounds) {
    ExhaustiveOptions options;
    options.recompute_bound = bounds.recompute;
    options.memory_bound = bounds.memory;
    options.max_memory_bytes = std::size_t{6} << 30;
    options.time_limit_seconds = seconds;
    options.max_states = 20'000'000;
    Outcome out = outcome_of([&] { return Exhaustive(options).solve(problem, budget); },
                             {Outcome::Kind::optimal, Outcome::Kind::no_solution, Outcome::Kind::not_built});
    // Exact unless the search's limits ran out first ("at least X bytes ... and at most Y"): then
    // the smallest budget is the least peak of a schedule it found.
    out.smallest_proven = out.smallest.has_value() && out.message.find("is at least") == std::string::npos;
    return out;
}

struct Backend {
    std::string name;
    std::function<Outcome(const Problem&, Bytes)> solve;  // empty when not built
};

std::string status_text(const Outcome& o, const Reference& ref) {
    switch (o.kind) {
        case Outcome::Kind::not_built: return "n/a";
        case Outcome::Kind::optimal: return "optimal";
        case Outcome::Kind::feasible: return o.gap ? "gap " + format("%.1f", 100.0 * *o.gap) + " %" : "feasible (no bound)";
        case Outcome::Kind::no_solution: return "no solution";
        case Outcome::Kind::error: return "error";
        case Outcome::Kind::infeasible:
            if (!o.smallest) return "infeasible (smallest unknown)";
            return std::string("infeasible (smallest ") + (o.smallest_proven ? "" : "<= ") + std::to_string(*o.smallest) + " B = " +
                   format("%.1f", 100.0 * double(*o.smallest) / double(ref.peak)) + " %)";
    }
    return "?";
}

bool has_schedule(const Outcome& o) {
    return o.kind == Outcome::Kind::optimal || o.kind == Outcome::Kind::feasible;
}

struct Row {
    const Case* c = nullptr;
    double percent = 0.0;
    Bytes budget = 0;
    std::optional<CheckmateModelSize> size;
    std::vector<Outcome> outcomes;  // one per backend
    Outcome automatic;              // remat::Auto within the time limit
    std::optional<TimeLowerBound> bound;
    std::optional<CheckmateRootBounds> root;  // the MILP's LP relaxation, before and after its cuts
};

// Some solver proved that no schedule fits the row's budget.
bool proven_infeasible(const Row& r) {
    const auto infeasible = [](const Outcome& o) { return o.kind == Outcome::Kind::infeasible; };
    return std::any_of(r.outcomes.begin(), r.outcomes.end(), infeasible) || infeasible(r.automatic) ||
           (r.bound && r.bound->budget_infeasible);
}

// The fastest proof of the optimum at the row's budget by any method remat has: a backend
// or exact search that finished, or Auto's plan meeting the proven bound (their seconds
// added). The method's name and seconds; nothing when none proved it.
std::optional<std::pair<std::string, double>> fastest_proof(const Row& r, const std::vector<std::string>& names) {
    std::optional<std::pair<std::string, double>> best;
    const auto offer = [&](const std::string& name, double seconds) {
        if (!best || seconds < best->second) best = {name, seconds};
    };
    for (std::size_t i = 0; i < r.outcomes.size(); ++i)
        if (r.outcomes[i].kind == Outcome::Kind::optimal) offer(names[i], r.outcomes[i].seconds);
    // Auto's plan is proven where it meets the bound, or where its own proof (the states at the
    // loss, the exact search's certificate) says so.
    if (r.automatic.kind == Outcome::Kind::feasible && r.bound && !r.bound->budget_infeasible &&
        (meets_time_bound(r.automatic.time, r.bound->time) || r.automatic.proven_optimal))
        offer("auto + bound", r.automatic.seconds + r.bound->seconds);
    return best;
}

// remat::Auto within `seconds`, as remat-plan runs it: told the proven bound (it stops at a plan
// that meets it), with Checkmate started from its plan as the exact component.
Outcome solve_with_auto(const Problem& problem, Bytes budget, double seconds, const std::optional<TimeLowerBound>& bound) {
    AutoOptions options;
    options.time_limit_seconds = seconds;
    std::optional<double> time_bound;
    if (bound && !bound->budget_infeasible && bound->time > 0) time_bound = bound->time;
    options.time_bound = time_bound;
    if (time_bound) options.loss_state_preferred = bound->live_at_loss;
    options.exact_component = cli::detail::checkmate_from_plan(time_bound);
    options.loss_state_proof = cli::detail::loss_state_proof();
    options.bound_from_plan = cli::detail::bound_from_plan();
    return outcome_of([&] { return Auto(options).solve(problem, budget); },
                      {Outcome::Kind::feasible, Outcome::Kind::error, Outcome::Kind::error});
}

// The proven lower bound on the time of any schedule (bounds/time_lower_bound.hpp).
std::optional<TimeLowerBound> proven_bound(const Problem& problem, Bytes budget, double seconds) {
    TimeLowerBoundOptions o;
    o.time_limit_seconds = seconds;
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    return time_lower_bound(problem, budget, milp::Preferred{}, o);
#else
    (void)problem, (void)budget, (void)o;
    return std::nullopt;
#endif
}

std::vector<std::size_t> parse_sizes(const std::string& text) {
    std::vector<std::size_t> sizes;
    std::size_t at = 0;
    while (at <= text.size()) {
        const std::size_t comma = std::min(text.find(',', at), text.size());
        const std::string item = text.substr(at, comma - at);
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 4) return {};
        sizes.push_back(static_cast<std::size_t>(v));
        at = comma + 1;
    }
    return sizes;
}

int usage() {
    std::fprintf(stderr,
                 "usage: bench_checkmate [--time-limit S] [--sizes 10,20,40,80] [--quick] [--seed N] [--extra-passes N]\n"
                 "                       [--time-bound S] [--verbose]\n"
                 "  --time-limit S  wall-clock limit of each Checkmate solve (default 60)\n"
                 "  --sizes LIST    op counts to aim for, each at least 4 (default 10,20,40,80)\n"
                 "  --quick         sizes 10,20 and a 10 s limit (a smoke run)\n"
                 "  --seed N        seed of the random problems (default 1)\n"
                 "  --extra-passes N  CheckmateOptions::extra_passes (default: 0 on chains, 1 on other graphs)\n"
                 "  --time-bound S  CheckmateOptions::time_bound_seconds (default 5; 0: the MILP without the proven\n"
                 "                  time bound's row, to compare)\n"
                 "  --verbose       Checkmate's own progress lines (model size, MILP outcomes) on stderr\n");
    return 2;
}

}  // namespace

// The aim for remat as a whole on the problems of about `ops` ops: every feasible budget proven
// optimal within `seconds` by whichever of its methods proves it first (a backend, the exact
// searches, auto's plan meeting the bound or proven by auto itself).
void any_method_aim(const std::vector<Row>& rows, const std::vector<Backend>& backends, std::size_t ops, double seconds) {
    std::vector<std::string> names;
    for (const auto& b : backends) names.push_back(b.name);
    std::size_t within = 0, feasible = 0;
    std::string detail;
    for (const Row& r : rows) {
        if (r.c->target != ops || proven_infeasible(r)) continue;
        ++feasible;
        const auto proof = fastest_proof(r, names);
        if (proof && proof->second < seconds) ++within;
        if (!detail.empty()) detail += ", ";
        detail += r.c->shape + " " + std::to_string(r.c->problem.op_count()) + " ops @ " + format("%.0f", r.percent) + " %: " +
                  (proof ? proof->first + " " + format("%.2f", proof->second) + " s" : std::string("not proven"));
    }
    std::printf("aim, %zu ops, any method (the first of the backends, the exact searches, and auto's plan proven optimal): "
                "%s, %zu of %zu feasible budgets proven optimal within %.0f s [%s]\n",
                ops, feasible > 0 && within == feasible ? "PASS" : "MISS", within, feasible, seconds, detail.c_str());
}

int main(int argc, char** argv) {
    double time_limit = 60.0;
    std::vector<std::size_t> sizes{10, 20, 40, 80};
    std::uint64_t seed = 1;
    bool verbose = false;
    std::optional<std::size_t> extra_passes;
    std::optional<double> time_bound_seconds;
    bool quick = false, sizes_given = false, limit_given = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool has_value = i + 1 < argc;
        if (arg == "--time-limit" && has_value) {
            char* end = nullptr;
            time_limit = std::strtod(argv[++i], &end);
            if (*end != '\0' || !(time_limit > 0)) return usage();
            limit_given = true;
        } else if (arg == "--sizes" && has_value) {
            sizes = parse_sizes(argv[++i]);
            if (sizes.empty()) return usage();
            sizes_given = true;
        } else if (arg == "--seed" && has_value) {
            char* end = nullptr;
            seed = std::strtoull(argv[++i], &end, 10);
            if (*end != '\0') return usage();
        } else if (arg == "--extra-passes" && has_value) {
            char* end = nullptr;
            extra_passes = static_cast<std::size_t>(std::strtoull(argv[++i], &end, 10));
            if (*end != '\0') return usage();
        } else if (arg == "--time-bound" && has_value) {
            char* end = nullptr;
            time_bound_seconds = std::strtod(argv[++i], &end);
            if (*end != '\0' || !(*time_bound_seconds >= 0)) return usage();
        } else if (arg == "--quick") {
            quick = true;
        } else if (arg == "--verbose") {
            verbose = true;
        } else {
            return usage();
        }
    }
    if (quick) {
        if (!sizes_given) sizes = {10, 20};
        if (!limit_given) time_limit = 10.0;
    }

    CheckmateOptions options;
    options.time_limit_seconds = time_limit;
    if (verbose) options.progress = [](const std::string& line) { std::clog << line << "\n"; };
    options.extra_passes = extra_passes;
    if (time_bound_seconds) options.time_bound_seconds = *time_bound_seconds;

    std::vector<Backend> backends;
#ifdef REMAT_WITH_LPSOLVE
    backends.push_back({"lp_solve", [options](const Problem& p, Bytes b) { return solve_with<milp::LpSolve>(p, b, options); }});
#else
    backends.push_back({"lp_solve", {}});
#endif
#ifdef REMAT_WITH_CBC
    backends.push_back({"CBC", [options](const Problem& p, Bytes b) { return solve_with<milp::Cbc>(p, b, options); }});
#else
    backends.push_back({"CBC", {}});
#endif
    backends.push_back({"A*", [time_limit](const Problem& p, Bytes b) { return solve_exactly(p, b, time_limit, {true, true}); }});
    // The same search without the memory bound, and with neither it nor the recompute bound
    // (only the exactly-once ops' time), to show what each bound buys.
    backends.push_back(
        {"A* no mem", [time_limit](const Problem& p, Bytes b) { return solve_exactly(p, b, time_limit, {true, false}); }});
    backends.push_back(
        {"A* plain", [time_limit](const Problem& p, Bytes b) { return solve_exactly(p, b, time_limit, {false, false}); }});
    // The model's size does not depend on the backend; any built one computes it.
    std::function<CheckmateModelSize(const Problem&, Bytes)> model_size;
    // The root LP bounds, by the preferred backend.
    std::function<CheckmateRootBounds(const Problem&, Bytes)> root_bounds;
#if defined(REMAT_WITH_LPSOLVE)
    model_size = [options](const Problem& p, Bytes b) { return Checkmate<milp::LpSolve>(options).model_size(p, b); };
#elif defined(REMAT_WITH_CBC)
    model_size = [options](const Problem& p, Bytes b) { return Checkmate<milp::Cbc>(options).model_size(p, b); };
#endif
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    root_bounds = [options](const Problem& p, Bytes b) { return Checkmate<milp::Preferred>(options).root_bounds(p, b); };
#else
    std::fprintf(stderr, "bench_checkmate: built without any MILP backend (neither lp_solve nor CBC was found); "
                         "install one of them and reconfigure\n");
    return 1;
#endif

    std::vector<Case> cases;
    for (const std::size_t target : sizes) {
        cases.push_back(make_chain(target, seed));
        cases.push_back(make_dag(target, seed));
    }
    const std::vector<double> percents{40.0, 60.0, 80.0};

    std::printf("Checkmate (MILP) on seeded random chains and DAGs: seed %llu, time limit %.0f s per solve, "
                "single-threaded backends, warm start on\n",
                static_cast<unsigned long long>(seed), time_limit);
    std::printf("budget = %% of P_ref (store-all peak); overhead = schedule time / T_ref - 1; seconds = wall time of "
                "the whole solve (baselines, one-sweep MILP, full MILP; for infeasible budgets the search for the "
                "smallest feasible one)\n\n");

    std::vector<Row> rows;
    const std::size_t total = cases.size() * percents.size();
    const auto bench_start = std::chrono::steady_clock::now();
    for (const Case& c : cases) {
        for (const double percent : percents) {
            Row row;
            row.c = &c;
            row.percent = percent;
            row.budget = percent_of(c.ref.peak, percent);
            try {
                row.size = model_size(c.problem, row.budget);
            } catch (const Error& e) {
                std::fprintf(stderr, "  model size of %s at %.0f %%: %s\n", c.problem.name().c_str(), percent, e.what());
            }
            for (const Backend& b : backends) {
                if (!b.solve) {
                    row.outcomes.push_back(Outcome{});
                    continue;
                }
                std::fprintf(stderr, "[%zu/%zu, %.0f s] %s, %zu ops, budget %.0f %% (%llu B): %s ...\n", rows.size() + 1,
                             total, seconds_since(bench_start), c.shape.c_str(), c.problem.op_count(), percent,
                             static_cast<unsigned long long>(row.budget), b.name.c_str());
                Outcome o = b.solve(c.problem, row.budget);
                std::fprintf(stderr, "    %s in %.2f s%s%s\n", status_text(o, c.ref).c_str(), o.seconds,
                             o.message.empty() || o.kind == Outcome::Kind::infeasible ? "" : ": ",
                             o.kind == Outcome::Kind::infeasible ? "" : o.message.c_str());
                row.outcomes.push_back(std::move(o));
            }
            // The bound first, as remat-plan proves it: auto then has the rest of the limit.
            row.bound = proven_bound(c.problem, row.budget, std::min(time_limit / 2, 5.0));
            row.automatic = solve_with_auto(c.problem, row.budget,
                                            std::max(time_limit - (row.bound ? row.bound->seconds : 0.0), 1e-3), row.bound);
            try {
                row.root = root_bounds(c.problem, row.budget);
            } catch (const Error&) {  // below the quick memory bound: no MILP, no root
            }
            std::fprintf(stderr, "    auto: %s in %.2f s\n",
                         row.automatic.kind == Outcome::Kind::feasible
                             ? ("overhead " + format("%.1f", 100.0 * (row.automatic.time / c.ref.time - 1.0)) + " %").c_str()
                             : status_text(row.automatic, c.ref).c_str(),
                         row.automatic.seconds);
            rows.push_back(std::move(row));
        }
    }

    // ---------------------------------------------------------------- table
    std::printf("| shape | ops | budget %% | passes | variables | integer vars | rows | nonzeros");
    for (const Backend& b : backends)
        std::printf(" | %s s | %s status | %s overhead", b.name.c_str(), b.name.c_str(), b.name.c_str());
    std::printf(" |\n|---|---|---|---|---|---|---|---");
    for (std::size_t i = 0; i < backends.size(); ++i) std::printf("|---|---|---");
    std::printf("|\n");
    std::vector<std::string> oddities;
    for (const Row& r : rows) {
        const Case& c = *r.c;
        const auto count = [&](std::size_t CheckmateModelSize::*field) {
            return r.size ? std::to_string((*r.size).*field) : std::string("-");
        };
        std::printf("| %s | %zu | %.0f | %s | %s | %s | %s | %s", c.shape.c_str(), c.problem.op_count(), r.percent,
                    count(&CheckmateModelSize::passes).c_str(), count(&CheckmateModelSize::variables).c_str(),
                    count(&CheckmateModelSize::integers).c_str(), count(&CheckmateModelSize::rows).c_str(),
                    count(&CheckmateModelSize::nonzeros).c_str());
        for (const Outcome& o : r.outcomes) {
            const std::string seconds = o.kind == Outcome::Kind::not_built ? "n/a" : format("%.2f", o.seconds);
            const std::string overhead =
                has_schedule(o) ? format("%.1f", 100.0 * (o.time / c.ref.time - 1.0)) + " %"
                                : (o.kind == Outcome::Kind::not_built ? "n/a" : "-");
            std::printf(" | %s | %s | %s", seconds.c_str(), status_text(o, c.ref).c_str(), overhead.c_str());
        }
        std::printf(" |\n");

        // Cross-checks between the backends: two proven optima must have the same time,
        // and a budget one backend finds infeasible the other must not solve.
        const std::string where = c.shape + " " + std::to_string(c.problem.op_count()) + " ops at " +
                                  format("%.0f", r.percent) + " %";
        for (std::size_t i = 0; i < r.outcomes.size(); ++i) {
            const Outcome& a = r.outcomes[i];
            if (a.kind == Outcome::Kind::error)
                oddities.push_back(where + ", " + backends[i].name + ": " + a.message);
            if (has_schedule(a) && a.peak > r.budget)
                oddities.push_back(where + ", " + backends[i].name + ": peak " + std::to_string(a.peak) +
                                   " B above the budget");
            for (std::size_t j = i + 1; j < r.outcomes.size(); ++j) {
                const Outcome& b = r.outcomes[j];
                if (a.kind == Outcome::Kind::optimal && b.kind == Outcome::Kind::optimal &&
                    std::abs(a.time - b.time) > 1e-6 * std::max(1.0, a.time))
                    oddities.push_back(where + ": proven optima differ (" + backends[i].name + " " +
                                       format("%.6g", a.time) + ", " + backends[j].name + " " + format("%.6g", b.time) + ")");
                if ((a.kind == Outcome::Kind::infeasible && has_schedule(b)) ||
                    (b.kind == Outcome::Kind::infeasible && has_schedule(a)))
                    oddities.push_back(where + ": one backend says infeasible, the other found a schedule");
                if (a.kind == Outcome::Kind::optimal && has_schedule(b) && b.time < a.time - 1e-6 * std::max(1.0, a.time))
                    oddities.push_back(where + ": " + backends[j].name + " beat " + backends[i].name + "'s proven optimum");
                if (b.kind == Outcome::Kind::optimal && has_schedule(a) && a.time < b.time - 1e-6 * std::max(1.0, b.time))
                    oddities.push_back(where + ": " + backends[i].name + " beat " + backends[j].name + "'s proven optimum");
            }
        }
    }

    // ---------------------------------------------------------------- auto, certified
    // The default solver's plan against the proven time bound: the certified gap (plan time /
    // bound - 1) needs no exact solver to finish; "proven" where it is 0 or a backend's optimum
    // equals the plan's time.
    std::printf("\nremat::Auto as remat-plan runs it (the bound first, at most half of %.0f s and 5 s; auto the rest, with Checkmate as its exact component): certified gap = plan time / "
                "bound - 1\n\n",
                time_limit);
    std::printf("| shape | ops | budget %% | auto s | auto overhead | bound s | bound overhead | certified gap | "
                "best MILP overhead |\n|---|---|---|---|---|---|---|---|---|\n");
    std::size_t certified = 0, planned = 0;
    for (const Row& r : rows) {
        const Case& c = *r.c;
        const std::string where = c.shape + " " + std::to_string(c.problem.op_count()) + " ops at " +
                                  format("%.0f", r.percent) + " %";
        std::optional<double> best_milp;  // the least time a backend reached
        bool milp_schedule = false;
        for (const Outcome& o : r.outcomes)
            if (has_schedule(o)) {
                milp_schedule = true;
                best_milp = std::min(best_milp.value_or(o.time), o.time);
            }
        const Outcome& a = r.automatic;
        const bool auto_planned = a.kind == Outcome::Kind::feasible;
        std::string bound_seconds = "-", bound_overhead = "-", gap = "-";
        if (r.bound) {
            bound_seconds = format("%.2f", r.bound->seconds);
            bound_overhead = r.bound->budget_infeasible ? "no schedule fits"
                                                        : format("%.1f", 100.0 * (r.bound->time / c.ref.time - 1.0)) + " %";
            std::optional<double> g = certified_gap(a.time, r.bound->time);
            if (g && a.gap) g = std::min(*g, *a.gap);  // auto's own, proved after the bound, where smaller
            if (auto_planned && !r.bound->budget_infeasible && g) {
                gap = format("%.2f", 100.0 * *g) + " %";
                ++planned;
                if (*g <= 1e-9) ++certified;
            }
            // A proven bound above a proven optimum, or a plan below the bound, is a bug.
            for (const Outcome& o : r.outcomes)
                if (o.kind == Outcome::Kind::optimal && !r.bound->budget_infeasible &&
                    r.bound->time > o.time * (1 + 1e-9))
                    oddities.push_back(where + ": the proven bound " + format("%.6g", r.bound->time) +
                                       " is above a proven optimum " + format("%.6g", o.time));
            if (auto_planned && !r.bound->budget_infeasible && a.time < r.bound->time * (1 - 1e-9))
                oddities.push_back(where + ": auto's plan is below the proven bound");
        }
        if (a.kind == Outcome::Kind::infeasible && milp_schedule)
            oddities.push_back(where + ": auto says infeasible where Checkmate found a schedule");
        if (auto_planned && a.peak > r.budget) oddities.push_back(where + ": auto's peak is above the budget");
        std::printf("| %s | %zu | %.0f | %.2f | %s | %s | %s | %s | %s |\n", c.shape.c_str(), c.problem.op_count(),
                    r.percent, a.seconds,
                    auto_planned ? (format("%.1f", 100.0 * (a.time / c.ref.time - 1.0)) + " %").c_str()
                                 : status_text(a, c.ref).c_str(),
                    bound_seconds.c_str(), bound_overhead.c_str(), gap.c_str(),
                    best_milp ? (format("%.1f", 100.0 * (*best_milp / c.ref.time - 1.0)) + " %").c_str() : "-");
    }
    std::printf("\nauto: %zu plans, %zu of them proven optimal (by the bound, or by auto's own proof after it)\n", planned,
                certified);

    // ---------------------------------------------------------------- root LP bound
    // How far the MILP's LP relaxation (the bound its branch-and-bound starts from) lies below
    // the best schedule, before and after the strengthening: the pinned-liveness rows and the
    // row of the proven time bound (CheckmateOptions::time_bound_seconds).
    std::printf("\nRoot LP bound of Checkmate's MILP: root gap = best schedule time / LP bound - 1, before (Checkmate's own "
                "rows) and after the valid inequalities (pinned liveness, proven time bound)\n\n");
    std::printf("| shape | ops | budget %% | best overhead | best proven | LP before | root gap before | LP after | "
                "root gap after |\n|---|---|---|---|---|---|---|---|---|\n");
    std::vector<double> gaps_before, gaps_after;
    for (const Row& r : rows) {
        const Case& c = *r.c;
        std::optional<double> best;
        bool proven = false;
        for (const Outcome& o : r.outcomes)
            if (has_schedule(o)) {
                if (!best || o.time < *best - 1e-9) proven = false;
                best = std::min(best.value_or(o.time), o.time);
                proven = proven || o.kind == Outcome::Kind::optimal;
            }
        if (r.automatic.kind == Outcome::Kind::feasible && (!best || r.automatic.time < *best - 1e-9)) {
            best = r.automatic.time;
            proven = false;
        }
        if (!best || !r.root) continue;
        const auto overhead = [&](double t) {
            if (!std::isfinite(t)) return std::string("-");
            const double percent = 100.0 * (t / c.ref.time - 1.0);
            return format("%.1f", std::abs(percent) < 0.05 ? 0.0 : percent) + " %";  // no "-0.0" from LP round-off
        };
        const auto root_gap = [&](double lp, std::vector<double>& all) {
            if (!std::isfinite(lp) || lp <= 0) return std::string("-");
            const double g = std::max(0.0, *best / lp - 1.0);
            all.push_back(g);
            return format("%.1f", 100.0 * g) + " %";
        };
        const std::string before = root_gap(r.root->plain, gaps_before);
        const std::string after = root_gap(r.root->strengthened, gaps_after);
        std::printf("| %s | %zu | %.0f | %s | %s | %s | %s | %s | %s |\n", c.shape.c_str(), c.problem.op_count(),
                    r.percent, overhead(*best).c_str(), proven ? "yes" : "no", overhead(r.root->plain).c_str(),
                    before.c_str(), overhead(r.root->strengthened).c_str(), after.c_str());
        if (std::isfinite(r.root->strengthened) && std::isfinite(r.root->plain) &&
            r.root->strengthened < r.root->plain * (1 - 1e-6))
            oddities.push_back(c.shape + " " + std::to_string(c.problem.op_count()) + " ops at " + format("%.0f", r.percent) +
                               " %: the strengthened LP bound is below the plain one");
        if (proven && std::isfinite(r.root->strengthened) && r.root->strengthened > *best * (1 + 1e-6))
            oddities.push_back(c.shape + " " + std::to_string(c.problem.op_count()) + " ops at " + format("%.0f", r.percent) +
                               " %: the strengthened LP bound is above a proven optimum");
    }
    const auto mean = [](const std::vector<double>& v) {
        double total = 0.0;
        for (const double x : v) total += x;
        return v.empty() ? 0.0 : total / static_cast<double>(v.size());
    };
    std::printf("\nroot gap, mean over %zu budgets: %.1f %% before, %.1f %% after (worst %.1f %% before, %.1f %% after)\n",
                gaps_after.size(), 100.0 * mean(gaps_before), 100.0 * mean(gaps_after),
                100.0 * (gaps_before.empty() ? 0.0 : *std::max_element(gaps_before.begin(), gaps_before.end())),
                100.0 * (gaps_after.empty() ? 0.0 : *std::max_element(gaps_after.begin(), gaps_after.end())));

    // ---------------------------------------------------------------- summary
    std::printf("\n");
    std::optional<std::size_t> faster;
    std::size_t faster_optimal = 0;
    double faster_seconds = 0.0;
    for (std::size_t i = 0; i < backends.size(); ++i) {
        if (!backends[i].solve) {
            std::printf("%s: not built\n", backends[i].name.c_str());
            continue;
        }
        std::size_t optimal = 0, scheduled = 0, infeasible = 0;
        double seconds = 0.0;
        const Row* largest = nullptr;
        for (const Row& r : rows) {
            const Outcome& o = r.outcomes[i];
            seconds += o.seconds;
            if (has_schedule(o)) ++scheduled;
            if (o.kind == Outcome::Kind::infeasible) ++infeasible;
            if (o.kind != Outcome::Kind::optimal) continue;
            ++optimal;
            if (!largest || r.c->problem.op_count() > largest->c->problem.op_count() ||
                (r.c->problem.op_count() == largest->c->problem.op_count() && o.seconds > largest->outcomes[i].seconds))
                largest = &r;
        }
        std::printf("%s: %zu of %zu solves with a schedule proven optimal (%zu infeasible budgets), %.1f s in all; ",
                    backends[i].name.c_str(), optimal, scheduled, infeasible, seconds);
        if (largest)
            std::printf("largest problem solved to proven optimality: %s, %zu ops, %.0f %% of P_ref, in %.2f s\n",
                        largest->c->shape.c_str(), largest->c->problem.op_count(), largest->percent,
                        largest->outcomes[i].seconds);
        else
            std::printf("no problem solved to proven optimality\n");
        // Faster: more proven optima, then less time in all.
        if (!faster || optimal > faster_optimal || (optimal == faster_optimal && seconds < faster_seconds)) {
            faster = i;
            faster_optimal = optimal;
            faster_seconds = seconds;
        }
    }

    // The aim: every feasible budget of the ≈40-op problems proven optimal within 10 s.
    const auto near_aim = [](std::size_t target) { return target == aim_ops; };
    if (!faster) {
        std::printf("aim (40-op problem optimal < %.0f s with the faster backend): not measured, no backend built\n",
                    aim_seconds);
    } else if (std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return near_aim(c.target); })) {
        std::printf("aim (40-op problem optimal < %.0f s with the faster backend): not measured (--sizes has no 40)\n",
                    aim_seconds);
    } else {
        std::size_t within = 0, feasible = 0;
        double slowest = 0.0;
        std::string detail;
        for (const Row& r : rows) {
            if (!near_aim(r.c->target)) continue;
            const Outcome& o = r.outcomes[*faster];
            if (proven_infeasible(r)) continue;
            ++feasible;
            slowest = std::max(slowest, o.seconds);
            if (o.kind == Outcome::Kind::optimal && o.seconds < aim_seconds) ++within;
            if (!detail.empty()) detail += ", ";
            detail += r.c->shape + " " + std::to_string(r.c->problem.op_count()) + " ops @ " + format("%.0f", r.percent) +
                      " %: " + format("%.2f", o.seconds) + " s " + status_text(o, r.c->ref);
        }
        const bool pass = feasible > 0 && within == feasible;
        std::printf("aim (40-op problem optimal < %.0f s with the faster backend, %s; every feasible budget of both "
                    "shapes): %s, %zu of %zu proven optimal within %.0f s, slowest %.2f s [%s]\n",
                    aim_seconds, backends[*faster].name.c_str(), pass ? "PASS" : "MISS", within, feasible, aim_seconds,
                    slowest, detail.c_str());

        any_method_aim(rows, backends, aim_ops, aim_seconds);
    }
    // Issue 26's aim for 60 ops: every feasible budget proven within 60 s by any method.
    if (std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.target == larger_aim_ops; }))
        any_method_aim(rows, backends, larger_aim_ops, larger_aim_seconds);
    if (!oddities.empty()) {
        std::printf("\nINCONSISTENCIES:\n");
        for (const std::string& s : oddities) std::printf("  %s\n", s.c_str());
        return 1;
    }
    return 0;
}
