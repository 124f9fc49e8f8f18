// examples/cli/remat_plan.hpp — the `remat-plan` command line, as a function so that the
// tests can run it in-process: plan a problem or chain file within a budget, print a summary
// or one JSON line, write the schedule and a memory-timeline SVG, or sweep budgets.
//
// Exit codes: 0 ok, 2 bad input (arguments or files), 3 infeasible budget, 1 anything else.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/io/svg.hpp>

#include "solver_table.hpp"

namespace remat::cli {

inline constexpr int exit_ok = 0;
inline constexpr int exit_error = 1;
inline constexpr int exit_bad_input = 2;
inline constexpr int exit_infeasible = 3;

[[nodiscard]] inline std::string remat_plan_usage() {
    std::string u =
        "usage: remat-plan FILE.json --budget B [--solver NAME[:VARIANT]] [--out SCHEDULE.json] [--json]\n"
        "                  [--svg TIMELINE.svg] [--explain] [--sweep N] [--sweep-csv F.csv]\n"
        "                  [--sweep-svg F.svg] [--time-limit S] [--verbose] [--quiet]\n"
        "       remat-plan --help | --version\n"
        "\n"
        "Plans the training step of FILE.json (remat.problem/1 or remat.chain/1) within a memory budget.\n"
        "\n"
        "  --budget B        bytes (25088), a size (512MiB, 1.5GiB, 100KB; KiB/MiB/GiB/TiB are powers of 1024,\n"
        "                    KB/MB/GB/TB powers of 1000) or a percentage of the store-all peak P_ref (40%)\n"
        "  --solver NAME     default: auto (rotor for chains, rockmate for sequences of small blocks, hrockmate\n"
        "                    otherwise, greedy as the last resort). Solvers:\n";
    for (const SolverEntry& e : solver_table()) {
        std::string line = "                      " + std::string(e.name);
        line.resize(std::max<std::size_t>(line.size() + 1, 36), ' ');
        u += line + std::string(e.summary) + (e.chains_only ? " [chains]" : "") + "\n";
        if (!e.variant_help.empty()) u += std::string(36, ' ') + std::string(e.variant_help) + "\n";
    }
    u +=
        "  --out FILE        write the schedule (remat.schedule/1)\n"
        "  --json            print one JSON line instead of the summary\n"
        "  --svg FILE        write a picture of memory over the steps of the plan, with the budget line\n"
        "  --sweep N         also plan N budgets from the smallest feasible one to P_ref (--budget optional)\n"
        "  --sweep-csv FILE  write the sweep as CSV (budget, % of P_ref, time, overhead, peak)\n"
        "  --sweep-svg FILE  draw the sweep: overhead against budget, the curve to choose a budget from\n"
        "  --explain         the plan per layer: what is recomputed, at what cost, and what is kept\n"
        "  --time-limit S    give up after S seconds (solvers that search)\n"
        "  --verbose         every progress line of the solver on stderr\n"
        "  --quiet           no progress lines (long solves print one every few seconds on stderr, with the\n"
        "                    elapsed time)\n"
        "\n"
        "Exit codes: 0 ok, 2 bad input, 3 infeasible budget (the message says the smallest feasible one, and\n"
        "whether the budget is below a proven lower bound or only beyond the solver's reach).\n";
    return u;
}

namespace detail {

struct PlanArgs {
    std::string file;
    std::optional<std::string> budget;
    std::optional<std::string> solver;
    std::optional<std::string> out;
    std::optional<std::string> svg;
    std::optional<std::size_t> sweep;
    std::optional<double> time_limit;
    bool json = false;
    bool verbose = false;
    bool quiet = false;
    bool help = false;
    bool version = false;
    bool explain = false;
    std::optional<std::string> sweep_csv;
    std::optional<std::string> sweep_svg;
};

// Thrown for a malformed command line: the usage follows the message.
struct UsageError {
    std::string message;
};

inline std::size_t parse_count(const std::string& flag, const std::string& text) {
    std::size_t value = 0;
    bool ok = !text.empty() && text.size() <= 6;
    for (const char c : text) {
        ok = ok && c >= '0' && c <= '9';
        if (ok) value = value * 10 + static_cast<std::size_t>(c - '0');
    }
    if (!ok || value == 0) throw UsageError{flag + " expects a whole number from 1 to 999999, not '" + text + "'"};
    return value;
}

inline double parse_seconds(const std::string& flag, const std::string& text) {
    try {
        std::size_t used = 0;
        const double value = std::stod(text, &used);
        if (used == text.size() && value > 0 && value < 1e9) return value;
    } catch (const std::exception&) {
    }
    throw UsageError{flag + " expects a positive number of seconds, not '" + text + "'"};
}

inline PlanArgs parse_plan_args(const std::vector<std::string>& args) {
    PlanArgs a;
    for (std::size_t i = 0; i < args.size(); ++i) {
        std::string flag = args[i];
        std::optional<std::string> inline_value;
        if (flag.rfind("--", 0) == 0) {
            if (const auto eq = flag.find('='); eq != std::string::npos) {
                inline_value = flag.substr(eq + 1);
                flag = flag.substr(0, eq);
            }
        }
        const auto value = [&]() -> std::string {
            if (inline_value) return *inline_value;
            if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
            return args[++i];
        };
        const auto once = [&](auto& slot, auto v) {
            if (slot) throw UsageError{flag + " is given twice"};
            slot = std::move(v);
        };
        const auto no_value = [&] {
            if (inline_value) throw UsageError{flag + " takes no value"};
        };
        if (flag == "-h" || flag == "--help") {
            no_value();
            a.help = true;
        } else if (flag == "--version") {
            no_value();
            a.version = true;
        } else if (flag == "--budget" || flag == "-b") once(a.budget, value());
        else if (flag == "--solver" || flag == "-s") once(a.solver, value());
        else if (flag == "--out" || flag == "-o") once(a.out, value());
        else if (flag == "--svg") once(a.svg, value());
        else if (flag == "--sweep-csv") once(a.sweep_csv, value());
        else if (flag == "--sweep-svg") once(a.sweep_svg, value());
        else if (flag == "--explain") {
            no_value();
            a.explain = true;
        }
        else if (flag == "--sweep") once(a.sweep, parse_count(flag, value()));
        else if (flag == "--time-limit") once(a.time_limit, parse_seconds(flag, value()));
        else if (flag == "--json") {
            no_value();
            a.json = true;
        } else if (flag == "--verbose" || flag == "-v") {
            no_value();
            a.verbose = true;
        } else if (flag == "--quiet" || flag == "-q") {
            no_value();
            a.quiet = true;
        } else if (flag.size() > 1 && flag[0] == '-') {
            throw UsageError{"unknown option '" + flag + "'"};
        } else if (a.file.empty()) {
            a.file = flag;
        } else {
            throw UsageError{"one problem file only; got '" + a.file + "' and '" + flag + "'"};
        }
    }
    if (a.help || a.version) return a;
    if (a.file.empty()) throw UsageError{"no problem file given"};
    if (!a.budget && !a.sweep) throw UsageError{"--budget is required (or --sweep N)"};
    if (!a.budget && (a.out || a.svg)) throw UsageError{"--out and --svg need --budget"};
    if (!a.sweep && (a.sweep_csv || a.sweep_svg)) throw UsageError{"--sweep-csv and --sweep-svg need --sweep N"};
    if (a.explain && !a.budget) throw UsageError{"--explain needs --budget"};
    return a;
}

inline std::string number(double value, const char* format = "%.6g") {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, value);
    return buffer;
}

inline std::string percent(double part, double whole) {
    if (whole == 0) return "n/a";
    return number(100.0 * part / whole, "%.1f") + " %";
}

inline std::string signed_percent(double part, double whole) {
    if (whole == 0) return "n/a";
    return number(100.0 * (part / whole - 1.0), "%+.1f") + " %";
}

inline std::string bytes_both(Bytes b) { return std::to_string(b) + " B (" + format_bytes(b) + ")"; }

inline std::string pad(std::string s, std::size_t width, bool right = true) {
    if (s.size() >= width) return s;
    return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

// Progress lines on `err` with the elapsed time, at most one every `every` seconds (the first
// after `every` seconds, so that quick solves print nothing).
[[nodiscard]] inline ProgressCallback progress_printer(std::ostream& err, double every) {
    struct State {
        Stopwatch clock;
        double last = 0.0;
    };
    return [&err, every, state = std::make_shared<State>()](const std::string& line) {
        const double now = state->clock.seconds();
        if (now - state->last < every) return;
        state->last = now;
        err << "remat-plan: [" << number(now, "%.1f") << " s] " << line << "\n";
    };
}

// Display names of the units of explain() and of the timeline: a chain file's stage names
// ("5 layer2.conv1"); nothing for other problems, whose op names already say it.
[[nodiscard]] inline std::map<std::string, std::string> unit_labels(const std::string& file) {
    std::map<std::string, std::string> labels;
    try {
        const Chain chain = io::load_chain(file);
        for (std::size_t i = 0; i < chain.length(); ++i)
            if (!chain.stages[i].name.empty())
                labels[std::to_string(i + 1)] = std::to_string(i + 1) + " " + chain.stages[i].name;
    } catch (const Error&) {
        // not a chain file
    }
    return labels;
}

// After an infeasible budget: below the proven lower bound, or only beyond this solver's reach
// (and the greedy's smallest budget when it reaches lower).
inline void explain_infeasible(std::ostream& err, const Problem& problem, Bytes budget, const std::string& solver,
                               const std::optional<Bytes>& smallest) {
    const MemoryLowerBound bound = memory_lower_bound(problem);
    if (budget < bound.bytes) {
        err << "remat-plan: the budget is below a proven lower bound: every schedule needs at least "
            << bytes_both(bound.bytes) << " (" << bound.reason << ")\n";
        return;
    }
    err << "remat-plan: the budget is above the proven lower bound of " << bytes_both(bound.bytes) << " ("
        << bound.reason << "): it is only beyond the reach of " << solver << "\n";
    if (solver.rfind("greedy", 0) == 0 || solver == "auto") return;
    try {
        const Bytes greedy = Greedy{}.smallest_budget(problem);
        if (!smallest || greedy < *smallest)
            err << "remat-plan: greedy reaches lower: its smallest budget is " << bytes_both(greedy) << " (--solver greedy)\n";
    } catch (const Error&) {
    }
}


}  // namespace detail

/// Runs remat-plan with `args` (without the program name). Output on `out`, messages on `err`.
inline int run_remat_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
    using nlohmann::ordered_json;
    detail::PlanArgs a;
    try {
        a = detail::parse_plan_args(args);
    } catch (const detail::UsageError& e) {
        err << "remat-plan: " << e.message << "\n\n" << remat_plan_usage();
        return exit_bad_input;
    }
    if (a.help) {
        out << remat_plan_usage();
        return exit_ok;
    }
    if (a.version) {
        out << "remat-plan " << REMAT_VERSION_STRING << "\n";
        return exit_ok;
    }
    try {
        const Problem problem = io::load_problem(a.file);
        const Reference ref = store_all_reference(problem);
        SolveOptions options;
        options.time_limit = a.time_limit;
        if (!a.quiet) options.progress = detail::progress_printer(err, a.verbose ? 0.0 : 2.0);
        const SolverEntry& solver = a.solver ? find_solver(*a.solver, options) : default_solver(problem);
        if (!solver.applies(problem))
            throw InvalidInput("solver '" + std::string(solver.name) + "' does not apply to problem '" + problem.name() +
                               "'" + (solver.chains_only ? " (not a chain); use greedy, store-all or exhaustive" : ""));
        const std::string solver_name =
            std::string(solver.name) + (options.variant.empty() ? "" : ":" + options.variant);
        const bool planning = a.budget.has_value();
        const Bytes budget = planning ? parse_budget(*a.budget, ref.peak) : 0;

        // In a sweep, Rockmate, H-Rockmate and auto analyse the problem once for every budget.
        const bool bound =
            (solver.name == "rockmate" || solver.name == "hrockmate" || solver.name == "auto") && a.sweep.has_value();
        const std::function<Plan(Bytes)> plan_at =
            !bound ? std::function<Plan(Bytes)>([&](Bytes b) { return solve_with(solver, problem, b, options); })
            : solver.name == "rockmate"  ? rockmate_planner(problem, options)
            : solver.name == "hrockmate" ? hrockmate_planner(problem, options)
                                         : auto_planner(problem, options);

        // The plan at the budget.
        std::optional<Plan> plan;
        std::optional<Infeasible> infeasible;
        if (planning) {
            try {
                plan = plan_at(budget);
            } catch (const Infeasible& e) {
                infeasible = e;
            }
        }
        // The sweep.
        std::optional<Bytes> smallest;
        std::vector<SweepPoint> rows;
        if (a.sweep) {
            if (infeasible && infeasible->smallest_budget()) {
                smallest = infeasible->smallest_budget();
            } else if (bound) {
                // Asked at budget 0, these answer with their smallest budget.
                try {
                    smallest = plan_at(0).peak;
                } catch (const Infeasible& e) {
                    smallest = e.smallest_budget();
                }
            }
            if (!smallest) smallest = smallest_budget(solver, problem, options, ref.peak);
            if (smallest) rows = sweep(sweep_budgets(*smallest, std::max(ref.peak, *smallest), *a.sweep), plan_at);
        } else if (infeasible) {
            smallest = infeasible->smallest_budget();
        }

        if (a.sweep_csv) io::write_file(*a.sweep_csv, sweep_csv(rows, ref));
        if (a.sweep_svg) io::write_file(*a.sweep_svg, sweep_svg(rows, ref, problem.name() + ": " + solver_name));
        if (plan && a.out) io::write_file(*a.out, io::to_json(problem, *plan));
        if (plan && a.svg) io::write_file(*a.svg, timeline_svg(problem, *plan, ref.peak, detail::unit_labels(a.file)));

        if (a.json) {
            ordered_json line;
            line["solver"] = solver_name;
            if (planning) {
                line["budget"] = budget;
                line["feasible"] = plan.has_value();
                line["time"] = plan ? ordered_json(plan->time) : ordered_json(nullptr);
                line["peak"] = plan ? ordered_json(plan->peak) : ordered_json(nullptr);
            }
            line["T_ref"] = ref.time;
            line["P_ref"] = ref.peak;
            if (planning) {
                line["solve_seconds"] = plan ? plan->stats.solve_seconds : 0.0;
                line["status"] = plan ? std::string(to_string(plan->stats.status)) : std::string("infeasible");
                line["gap"] = plan && plan->stats.gap ? ordered_json(*plan->stats.gap) : ordered_json(nullptr);
            }
            if (infeasible || a.sweep) line["smallest_budget"] = smallest ? ordered_json(*smallest) : ordered_json(nullptr);
            if (a.sweep) {
                ordered_json sweep = ordered_json::array();
                for (const auto& row : rows) {
                    ordered_json r;
                    r["budget"] = row.budget;
                    r["feasible"] = row.plan.has_value();
                    r["time"] = row.plan ? ordered_json(row.plan->time) : ordered_json(nullptr);
                    r["peak"] = row.plan ? ordered_json(row.plan->peak) : ordered_json(nullptr);
                    r["solve_seconds"] = row.plan ? row.plan->stats.solve_seconds : 0.0;
                    sweep.push_back(std::move(r));
                }
                line["sweep"] = std::move(sweep);
            }
            out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        } else {
            const auto chain = as_chain(problem);
            out << problem.name() << ": "
                << (chain ? "chain of " + std::to_string(chain->length()) + (chain->length() == 1 ? " stage, " : " stages, ")
                       : std::string("problem, "))
                << problem.data_count() << " data, " << problem.op_count() << " ops; T_ref "
                << detail::number(ref.time) << ", P_ref " << detail::bytes_both(ref.peak) << "\n";
            if (plan) {
                const Plan& p = *plan;
                const auto runs = static_cast<std::size_t>(
                    std::count_if(p.schedule.begin(), p.schedule.end(), [](const Step& s) { return s.is_run(); }));
                out << "  solver    " << solver_name << ": " << to_string(p.stats.status)
                    << (p.stats.options.empty() ? "" : ", " + p.stats.options)
                    << (p.stats.gap ? ", gap " + detail::number(100 * *p.stats.gap, "%.2f") + " %" : "") << ", solved in "
                    << detail::number(p.stats.solve_seconds * 1e3, "%.3g") << " ms\n";
                out << "  budget    " << detail::bytes_both(p.budget) << ", " << detail::percent(double(p.budget), double(ref.peak))
                    << " of P_ref\n";
                out << "  time      " << detail::number(p.time) << ", overhead "
                    << detail::signed_percent(p.time, ref.time) << " vs T_ref\n";
                out << "  peak      " << detail::bytes_both(p.peak) << ", "
                    << detail::percent(double(p.peak), double(p.budget)) << " of budget, "
                    << detail::percent(double(p.peak), double(ref.peak)) << " of P_ref\n";
                out << "  schedule  " << p.schedule.size() << " steps (" << runs << " runs, "
                    << p.schedule.size() - runs << " frees)\n";
                if (a.out) out << "  wrote     " << *a.out << "\n";
                if (a.svg) out << "  wrote     " << *a.svg << "\n";
                if (a.explain) {
                    ExplainOptions explain_options;
                    explain_options.reference_time = ref.time;
                    explain_options.labels = detail::unit_labels(a.file);
                    out << "\n" << p.explain(problem, explain_options);
                }
            } else if (infeasible) {
                out << "  solver    " << solver_name << ": infeasible at " << detail::bytes_both(budget) << "\n";
            }
            if (a.sweep) {
                out << "\nsweep: " << solver_name << ", " << rows.size() << " budgets from the smallest feasible ";
                out << (smallest ? detail::bytes_both(*smallest) : std::string("(unknown)")) << " to P_ref\n";
                out << "  " << detail::pad("budget", 22, false) << detail::pad("% P_ref", 8) << detail::pad("time", 12)
                    << detail::pad("overhead", 10) << detail::pad("peak", 12) << "\n";
                for (const auto& row : rows) {
                    out << "  " << detail::pad(detail::bytes_both(row.budget), 22, false)
                        << detail::pad(detail::number(100.0 * double(row.budget) / double(std::max<Bytes>(ref.peak, 1)),
                                                      "%.1f"),
                                       8);
                    if (row.plan)
                        out << detail::pad(detail::number(row.plan->time), 12)
                            << detail::pad(detail::signed_percent(row.plan->time, ref.time), 10)
                            << detail::pad(format_bytes(row.plan->peak), 12) << "\n";
                    else
                        out << "  infeasible"
                            << (row.needs ? " (needs " + format_bytes(*row.needs) + ")" : std::string()) << "\n";
                }
            }
        }
        if (infeasible) {
            err << "remat-plan: infeasible: " << infeasible->what() << "\n";
            if (smallest)
                err << "remat-plan: the smallest feasible budget for " << solver_name << " is "
                    << detail::bytes_both(*smallest) << " = "
                    << detail::percent(double(*smallest), double(ref.peak)) << " of P_ref; try --budget " << *smallest
                    << "\n";
            if (planning) detail::explain_infeasible(err, problem, budget, solver_name, smallest);
            return exit_infeasible;
        }
        return exit_ok;
    } catch (const InvalidInput& e) {
        err << "remat-plan: " << e.what() << "\n";
        return exit_bad_input;
    } catch (const Error& e) {
        err << "remat-plan: " << e.what() << "\n";
        return exit_error;
    } catch (const std::exception& e) {
        err << "remat-plan: unexpected error: " << e.what() << "\n";
        return exit_error;
    }
}

}  // namespace remat::cli
