// examples/cli/remat_plan.hpp — the `remat-plan` command line, as a function so that the
// tests can run it in-process: plan a problem or chain file within a budget, print a summary
// or one JSON line, write the schedule and a memory-timeline SVG, or sweep budgets.
//
// Exit codes: 0 ok, 2 bad input (arguments or files), 3 infeasible budget, 4 the problem is
// too large for the solver (its memory cap or time limit; the message names one that scales),
// 1 anything else (and, with --check, an invalid schedule).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <exception>
#include <filesystem>
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

#include "format.hpp"
#include "offload_plan.hpp"
#include "solver_table.hpp"

namespace remat::cli {

[[nodiscard]] inline std::string remat_plan_usage() {
    std::string u =
        "usage: remat-plan FILE.json --budget B [--solver NAME[:VARIANT]] [--out SCHEDULE.json] [--json]\n"
        "                  [--svg TIMELINE.svg] [--explain] [--sweep N] [--sweep-csv F.csv]\n"
        "                  [--sweep-svg F.svg] [--time-limit S] [--bound|--no-bound] [--certify S] [--refine S]\n"
        "                  [--verbose] [--quiet]\n"
        "       remat-plan FILE.json --offload --budget B [--bandwidth 12GB/s] [--host-limit B] [--solver NAME]\n"
        "                  [--out SCHEDULE.json] [--svg TIMELINE.svg] [--json]\n"
        "       remat-plan FILE.json --check SCHEDULE.json [--budget B] [--json]   (remat.schedule/1 or /2)\n"
        "       remat-plan --help | --version\n"
        "\n"
        "Plans the training step of FILE.json (remat.problem/1 or remat.chain/1) within a memory budget,\n"
        "or checks a schedule of it (remat.schedule/1).\n"
        "\n"
        "  --budget B        bytes (25088), a size (512MiB, 1.5GiB, 100KB; KiB/MiB/GiB/TiB are powers of 1024,\n"
        "                    KB/MB/GB/TB powers of 1000) or a percentage of the store-all peak P_ref (40%)\n"
        "  --solver NAME     default: auto (rotor-release for chains, rockmate for sequences of small blocks, hrockmate\n"
        "                    otherwise, greedy as the last resort). Solvers:\n";
    for (const SolverEntry& e : solver_table()) {
        std::string line = "                      " + std::string(e.name);
        line.resize(std::max<std::size_t>(line.size() + 1, 36), ' ');
        u += line + std::string(e.summary) + (e.requirement.empty() ? "" : " [needs " + std::string(e.requirement) + "]") + "\n";
        if (!e.variant_help.empty()) u += std::string(36, ' ') + std::string(e.variant_help) + "\n";
    }
    u +=
        "  --out FILE        write the schedule (remat.schedule/1), atomically (a temporary file renamed);\n"
        "                    never the input file. When the run ends without a plan (any exit code but 0),\n"
        "                    an --out or --svg file left by an earlier run is removed\n"
        "  --json            print one JSON line instead of the summary\n"
        "  --svg FILE        write a picture of memory over the steps of the plan, with the budget line\n"
        "  --sweep N         also plan N budgets from the smallest feasible one to P_ref (--budget optional)\n"
        "  --sweep-csv FILE  write the sweep as CSV (budget, % of P_ref, time, overhead, peak)\n"
        "  --sweep-svg FILE  draw the sweep: overhead against budget, the curve to choose a budget from\n"
        "  --explain         the plan per layer: what is recomputed, at what cost, and what is kept\n"
        "  --time-limit S    give up after S seconds (solvers that search; also the limit of --bound). auto\n"
        "                    spends what its plan leaves of S on faster plans while the plan's certified gap\n"
        "                    to the bound is above 3 %. With --offload, S covers the whole plan (its some 25\n"
        "                    activation budgets and the MILP together)\n"
        "  --bound           also prove a lower bound on the time of any schedule within the budget, and say\n"
        "                    how far the plan can be from the optimum (a small integer program; 10 s at most\n"
        "                    unless --time-limit; needs a build with lp_solve or CBC). auto does it by default\n"
        "                    (5 s and half of --time-limit at most): its plan gets the certified gap, or status\n"
        "                    optimal where it meets it. Asked for with --time-limit, it spends that time on a\n"
        "                    tighter bound (cuts grown one at a time by what they prove)\n"
        "  --no-bound        (--solver auto) skip that bound (and the refinement under --time-limit)\n"
        "  --certify S       (--solver auto, problems of at most 64 data) then the exact search, for up to S\n"
        "                    seconds, looks for a faster schedule than the plan: it finds one, proves the plan\n"
        "                    optimal (gap 0 %), or prints the gap to the lower bound it proved\n"
        "  --refine S        prove the bound as --bound does, then spend up to S seconds on faster plans (the\n"
        "                    plan locally improved, other states at the loss and its windows searched exactly,\n"
        "                    then rounds of the greedy's portfolio with fresh noise),\n"
        "                    stopping once the certified gap is at most 3 %\n"
        "  --offload         (remat.problem/2, docs/formats.md §11) the budget counts everything the step holds:\n"
        "                    split it between weights and activations, offloading weights and optimizer state to\n"
        "                    host memory and recomputing activations (--solver plans the activations;\n"
        "                    --solver checkmate also runs Checkmate's MILP with offload variables); --out\n"
        "                    writes a remat.schedule/2 file, --svg adds a lane per transfer channel\n"
        "  --bandwidth R     transfer rate of both directions, in bytes per unit of the problem's time (12GB/s\n"
        "                    for profiled problems, whose times are seconds); default: the file's, else 12GB/s\n"
        "  --host-limit B    host memory the offloaded copies may take (default: the file's, else unlimited)\n"
        "  --check SCHEDULE  simulate SCHEDULE.json on FILE.json and print its time and peak: exit 0 when it\n"
        "                    is valid (and fits --budget when given, and its 'predicted' figures are right),\n"
        "                    1 with the first invalid step otherwise\n"
        "  --verbose         every progress line of the solver on stderr\n"
        "  --quiet           no progress lines (long solves print one every few seconds on stderr, with the\n"
        "                    elapsed time)\n"
        "\n"
        "Exit codes: 0 ok, 2 bad input, 3 infeasible budget (the message says the smallest feasible one, and\n"
        "whether the budget is below a proven lower bound or only beyond the solver's reach), 4 the problem is\n"
        "too large for the solver (its tables would exceed its memory cap, or its time limit ran out; the\n"
        "message names a solver that scales: greedy, hrockmate or auto), 1 any other error (with --check: the\n"
        "schedule is invalid, does not fit or its predictions are wrong).\n";
    return u;
}

namespace detail {

struct PlanArgs {
    std::string file;
    std::optional<std::string> budget;
    std::optional<std::string> solver;
    std::optional<std::string> out;
    std::optional<std::string> svg;
    std::optional<std::string> check;
    std::optional<std::size_t> sweep;
    std::optional<double> time_limit;
    std::optional<double> certify;
    std::optional<double> refine;
    bool json = false;
    bool verbose = false;
    bool quiet = false;
    bool help = false;
    bool version = false;
    bool explain = false;
    bool bound = false;
    bool no_bound = false;
    bool offload = false;
    std::optional<std::string> bandwidth;
    std::optional<std::string> host_limit;
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
        else if (flag == "--bound") {
            no_value();
            a.bound = true;
        }
        else if (flag == "--no-bound") {
            no_value();
            a.no_bound = true;
        }
        else if (flag == "--check") once(a.check, value());
        else if (flag == "--offload") {
            no_value();
            a.offload = true;
        }
        else if (flag == "--bandwidth") once(a.bandwidth, value());
        else if (flag == "--host-limit") once(a.host_limit, value());
        else if (flag == "--sweep") once(a.sweep, parse_count(flag, value()));
        else if (flag == "--time-limit") once(a.time_limit, parse_seconds(flag, value()));
        else if (flag == "--certify") once(a.certify, parse_seconds(flag, value()));
        else if (flag == "--refine") once(a.refine, parse_seconds(flag, value()));
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
    if (a.check && (a.out || a.svg || a.sweep || a.solver || a.time_limit || a.explain || a.bound || a.sweep_csv ||
                    a.sweep_svg || a.certify || a.refine))
        throw UsageError{"--check takes only --budget, --json and --quiet besides the problem file"};
    if (a.check) return a;
    if ((a.bandwidth || a.host_limit) && !a.offload) throw UsageError{"--bandwidth and --host-limit need --offload"};
    if (a.offload && (a.sweep || a.bound || a.explain || a.sweep_csv || a.sweep_svg || a.certify || a.refine))
        throw UsageError{"--offload plans one budget: it takes no --sweep, --bound, --explain, --certify or --refine"};
    if (a.certify && a.solver && *a.solver != "auto") throw UsageError{"--certify needs --solver auto"};
    if (a.offload && !a.budget) throw UsageError{"--offload needs --budget (a total: weights, their state and activations)"};
    if (!a.budget && !a.sweep) throw UsageError{"--budget is required (or --sweep N)"};
    if (!a.budget && (a.out || a.svg)) throw UsageError{"--out and --svg need --budget"};
    if (!a.sweep && (a.sweep_csv || a.sweep_svg)) throw UsageError{"--sweep-csv and --sweep-svg need --sweep N"};
    if (a.explain && !a.budget) throw UsageError{"--explain needs --budget"};
    if (a.bound && !a.budget) throw UsageError{"--bound needs --budget"};
    if (a.bound && a.no_bound) throw UsageError{"--bound and --no-bound contradict each other"};
    if (a.refine && (!a.budget || a.sweep)) throw UsageError{"--refine plans one --budget: it takes no --sweep"};
    if (a.refine && a.no_bound) throw UsageError{"--refine needs the proven bound that --no-bound turns off"};
    return a;
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

// The least peak of any schedule, where a solver found no plan above the memory lower bound and
// the exact search answers within `seconds` (problems of at most Exhaustive::max_data data):
// whether the budget is beyond every schedule or only beyond that solver. Milliseconds on the
// small problems where the memory lower bound is loose (the 14-data diamond: 33 MiB against 37).
inline constexpr double exact_least_peak_seconds = 1.0;  // at most, and within --time-limit
inline constexpr std::size_t exact_least_peak_max_states = 2'000'000;  // as H-Rockmate's flat limit
[[nodiscard]] inline std::optional<Bytes> exact_least_peak_within(const Problem& problem, double seconds) {
    if (problem.data_count() > Exhaustive::max_data || !(seconds > 1e-3)) return std::nullopt;
    ExhaustiveOptions limits;
    limits.time_limit_seconds = seconds;
    limits.max_states = exact_least_peak_max_states;
    try {
        return Exhaustive(limits).smallest_budget(problem);
    } catch (const Error&) {  // beyond its limits, or more than 64 exactly-once ops
        return std::nullopt;
    }
}

// After an infeasible budget: below the proven lower bound, proven too small by the solver
// itself or by the exact least peak (`least_peak`), or only beyond this solver's reach (and
// the exact search's or the greedy's smallest budget when it reaches lower).
inline void explain_infeasible(std::ostream& err, const Problem& problem, const Infeasible& infeasible,
                               const std::string& solver, const std::optional<Bytes>& smallest,
                               const std::optional<Bytes>& least_peak) {
    const Bytes budget = infeasible.budget();
    const MemoryLowerBound bound = memory_lower_bound(problem);
    if (budget < bound.bytes) {
        err << "remat-plan: the budget is below a proven lower bound: every schedule needs at least "
            << bytes_both(bound.bytes) << " (" << bound.reason << ")\n";
        return;
    }
    if (infeasible.proven()) {
        err << "remat-plan: the budget is below a proven lower bound: no schedule at all fits it, as " << solver
            << " proves (the memory lower bound, " << bytes_both(bound.bytes) << ", is weaker)\n";
        return;
    }
    if (least_peak && budget < *least_peak) {
        err << "remat-plan: the budget is below a proven lower bound: no schedule at all fits it, as the exact search "
               "proves: the least peak of any schedule is "
            << bytes_both(*least_peak) << " (the memory lower bound, " << bytes_both(bound.bytes) << ", is weaker)\n";
        return;
    }
    err << "remat-plan: the budget is above the proven lower bound of " << bytes_both(bound.bytes) << " ("
        << bound.reason << "): it is only beyond the reach of " << solver << "\n";
    if (least_peak)
        err << "remat-plan: schedules fit from " << bytes_both(*least_peak)
            << " on, as the exact search finds (--solver exhaustive, or auto)\n";
    if (solver.rfind("greedy", 0) == 0 || solver == "auto") return;
    try {
        const Bytes greedy = Greedy{}.smallest_budget(problem);
        if (!smallest || greedy < *smallest)
            err << "remat-plan: greedy reaches lower: its smallest budget is " << bytes_both(greedy) << " (--solver greedy)\n";
    } catch (const Error&) {
    }
}

// Display names of the units of explain() and of the timeline: a chain file's stage names
// ("5 layer2.conv1"); nothing for other problems, whose op names already say it.
[[nodiscard]] inline std::map<std::string, std::string> unit_labels(const std::string& file) {
    std::map<std::string, std::string> labels;
    try {
        labels = stage_labels(io::load_chain(file), true);
    } catch (const Error&) {
        // not a chain file
    }
    return labels;
}

namespace fs = std::filesystem;

// Two paths name the same file (hard and symbolic links included), or would once created.
inline bool same_file(const std::string& x, const std::string& y) {
    std::error_code ec1, ec2;
    if (fs::equivalent(x, y, ec1)) return true;
    const fs::path cx = fs::weakly_canonical(x, ec1);
    const fs::path cy = fs::weakly_canonical(y, ec2);
    return !ec1 && !ec2 && cx == cy;
}

// The files a run writes, with their flags.
inline std::vector<std::pair<const char*, const std::optional<std::string>*>> output_files(const PlanArgs& a) {
    return {{"--out", &a.out}, {"--svg", &a.svg}, {"--sweep-csv", &a.sweep_csv}, {"--sweep-svg", &a.sweep_svg}};
}

// Output files never overwrite the input, each other or a directory.
inline void check_output_paths(const PlanArgs& a) {
    const auto outputs = output_files(a);
    for (const auto& [flag, path] : outputs) {
        if (!*path) continue;
        std::error_code ec;
        if (fs::is_directory(**path, ec))
            throw InvalidInput(std::string(flag) + " '" + printable(**path, 200) + "' is a directory; give a file name");
        if (same_file(**path, a.file))
            throw InvalidInput(std::string(flag) + " '" + printable(**path, 200) +
                               "' is the problem file itself; write the output to another file");
    }
    for (std::size_t i = 0; i < outputs.size(); ++i)
        for (std::size_t j = i + 1; j < outputs.size(); ++j)
            if (*outputs[i].second && *outputs[j].second && same_file(**outputs[i].second, **outputs[j].second))
                throw InvalidInput(std::string(outputs[i].first) + " and " + outputs[j].first + " name the same file '" +
                                   printable(**outputs[i].second, 200) + "'; give two files");
}

// After a run without a plan: an --out or --svg file of an earlier run must not pass for this one's.
inline void remove_stale_outputs(const PlanArgs& a, std::ostream& err) {
    for (const auto& [flag, path] : output_files(a)) {
        std::error_code ec;
        if (*path && fs::is_regular_file(**path, ec) && fs::remove(**path, ec))
            err << "remat-plan: removed '" << printable(**path, 200) << "', left by an earlier run (this run has no plan)\n";
    }
}

// --check: the schedule simulated on the problem, against --budget (or the budget the file
// names) and against the figures the file predicts.
inline int run_check(const PlanArgs& a, std::ostream& out, std::ostream& err) {
    using nlohmann::ordered_json;
    const Problem problem = io::load_problem(a.file);
    const Reference ref = store_all_reference(problem);
    if (io::detail::json::read_text_file(*a.check).find("\"remat.schedule/2\"") != std::string::npos)
        return run_offload_check(problem, ref, *a.check, a.budget, a.json, out, err);
    const io::SavedSchedule saved = io::load_schedule(problem, *a.check);
    const std::optional<Bytes> budget = a.budget ? std::optional<Bytes>(parse_budget(*a.budget, ref.peak)) : saved.budget;
    const SimulationReport r = simulate(problem, saved.steps);
    std::string problem_text;  // the first thing wrong, if any
    if (!r.valid) {
        problem_text = "invalid: " + r.error;
    } else if (budget && r.peak > *budget) {
        problem_text = "peak " + bytes_both(r.peak) + " above the budget of " + bytes_both(*budget);
    } else if (saved.predicted && (saved.predicted->peak != r.peak ||
                                   std::abs(saved.predicted->time - r.time) > 1e-9 * std::max(1.0, std::abs(r.time)))) {
        problem_text = "the file predicts time " + number(saved.predicted->time, "%.17g") + " and peak " +
                       std::to_string(saved.predicted->peak) + ", but the simulation gives time " +
                       number(r.time, "%.17g") + " and peak " + std::to_string(r.peak);
    }
    if (a.json) {
        ordered_json line;
        line["valid"] = problem_text.empty();
        line["error"] = problem_text.empty() ? ordered_json(nullptr) : ordered_json(problem_text);
        line["error_step"] = r.error_step ? ordered_json(*r.error_step) : ordered_json(nullptr);
        line["time"] = r.valid ? ordered_json(r.time) : ordered_json(nullptr);
        line["peak"] = r.valid ? ordered_json(r.peak) : ordered_json(nullptr);
        line["budget"] = budget ? ordered_json(*budget) : ordered_json(nullptr);
        line["T_ref"] = ref.time;
        line["P_ref"] = ref.peak;
        out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (r.valid) {
        out << printable(*a.check, 200) << ": " << saved.steps.size() << " steps for '" << printable(problem.name())
            << "'\n  time      " << number(r.time) << ", overhead " << signed_percent(r.time, ref.time)
            << " vs T_ref\n  peak      " << bytes_both(r.peak) << ", " << percent(double(r.peak), double(ref.peak))
            << " of P_ref" << (budget ? ", " + percent(double(r.peak), double(*budget)) + " of the budget" : "") << "\n";
    }
    if (problem_text.empty()) return exit_ok;
    err << "remat-plan: " << printable(*a.check, 200) << ": " << problem_text << "\n";
    return exit_error;
}

// What one planning run found, for the printers.
struct PlanRun {
    std::string solver_name;
    bool planning = false;
    Bytes budget = 0;
    std::optional<Plan> plan;
    std::optional<Infeasible> infeasible;
    std::optional<Bytes> smallest;
    std::vector<SweepPoint> rows;
    std::optional<TimeLowerBound> bound;  // with --bound
    // Where the solver found no plan and did not prove that none exists: the exact least peak of
    // any schedule, when the exact search finds it in time (exact_least_peak_within()).
    std::optional<Bytes> least_peak;
};

// Whether no schedule at all fits the infeasible budget: the solver proved it, it is below the
// proven memory lower bound, or below the exact least peak.
[[nodiscard]] inline bool no_schedule_fits(const Problem& problem, const PlanRun& run) {
    if (!run.infeasible) return false;
    const Infeasible& infeasible = *run.infeasible;
    return infeasible.proven() || infeasible.budget() < memory_lower_bound(problem).bytes ||
           (run.least_peak && infeasible.budget() < *run.least_peak);
}

inline void print_json(std::ostream& out, const PlanArgs& a, const Problem& problem, const Reference& ref,
                       const PlanRun& run) {
    using nlohmann::ordered_json;
    const auto plan_fields = [](ordered_json& j, const std::optional<Plan>& plan) {
        j["time"] = plan ? ordered_json(plan->time) : ordered_json(nullptr);
        j["peak"] = plan ? ordered_json(plan->peak) : ordered_json(nullptr);
    };
    ordered_json line;
    line["solver"] = run.solver_name;
    if (run.planning) {
        line["budget"] = run.budget;
        line["feasible"] = run.plan.has_value();
        plan_fields(line, run.plan);
    }
    line["T_ref"] = ref.time;
    line["P_ref"] = ref.peak;
    if (run.planning) {
        line["solve_seconds"] = run.plan ? run.plan->stats.solve_seconds : 0.0;
        line["status"] = run.plan ? std::string(to_string(run.plan->stats.status)) : std::string("infeasible");
        line["gap"] = run.plan && run.plan->stats.gap ? ordered_json(*run.plan->stats.gap) : ordered_json(nullptr);
    }
    const bool proven_infeasible = no_schedule_fits(problem, run);
    if (run.planning && run.infeasible) line["no_schedule_fits"] = proven_infeasible;
    if (run.bound) {
        // What the solver proved counts too: an infeasible budget has no time to bound.
        const bool none_fits = run.bound->budget_infeasible || proven_infeasible;
        ordered_json b;
        b["time"] = none_fits ? ordered_json(nullptr) : ordered_json(run.bound->time);
        b["no_schedule_fits"] = none_fits;
        b["relaxation_solved"] = run.bound->relaxation_solved;
        b["seconds"] = run.bound->seconds;
        line["time_lower_bound"] = std::move(b);
    }
    if (run.infeasible || a.sweep) line["smallest_budget"] = run.smallest ? ordered_json(*run.smallest) : ordered_json(nullptr);
    if (run.least_peak) line["least_peak"] = *run.least_peak;
    if (a.sweep) {
        ordered_json sweep = ordered_json::array();
        for (const auto& row : run.rows) {
            ordered_json r;
            r["budget"] = row.budget;
            r["feasible"] = row.plan.has_value();
            plan_fields(r, row.plan);
            r["solve_seconds"] = row.plan ? row.plan->stats.solve_seconds : 0.0;
            sweep.push_back(std::move(r));
        }
        line["sweep"] = std::move(sweep);
    }
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

inline void print_plan(std::ostream& out, const PlanArgs& a, const Reference& ref, const Plan& p, const std::string& solver) {
    const auto runs = static_cast<std::size_t>(
        std::count_if(p.schedule.begin(), p.schedule.end(), [](const Step& s) { return s.is_run(); }));
    // Optimal in its solver's model, but not proven so over all schedules: say which.
    const bool model_only = p.stats.status == SolveStatus::optimal && p.stats.gap && *p.stats.gap > 0;
    out << "  solver    " << solver << ": " << (model_only ? "optimal within its model" : to_string(p.stats.status))
        << (p.stats.options.empty() ? "" : ", " + p.stats.options)
        << (p.stats.gap ? ", gap " + number(100 * *p.stats.gap, "%.2f") + " %" : "") << ", solved in "
        << number(p.stats.solve_seconds * 1e3, "%.3g") << " ms\n";
    out << "  budget    " << bytes_both(p.budget) << ", " << percent(double(p.budget), double(ref.peak)) << " of P_ref\n";
    out << "  time      " << number(p.time) << ", overhead " << signed_percent(p.time, ref.time) << " vs T_ref\n";
    out << "  peak      " << bytes_both(p.peak) << ", " << percent(double(p.peak), double(p.budget)) << " of budget, "
        << percent(double(p.peak), double(ref.peak)) << " of P_ref\n";
    out << "  schedule  " << p.schedule.size() << " steps (" << runs << " runs, " << p.schedule.size() - runs << " frees)\n";
    if (a.out) out << "  wrote     " << *a.out << "\n";
    if (a.svg) out << "  wrote     " << *a.svg << "\n";
    if (a.sweep_csv) out << "  wrote     " << *a.sweep_csv << "\n";
    if (a.sweep_svg) out << "  wrote     " << *a.sweep_svg << "\n";
}

// The seconds of the proven bound auto's plans get by default (at most half of --time-limit,
// whose rest, and what the bound leaves of its half, goes to the plan; on problems of more than
// 128 ops, a third of a --time-limit above 15 s, with grown cuts).
inline constexpr double auto_bound_seconds = 5.0;
// The cuts grown for --bound and --refine under --time-limit (TimeLowerBoundOptions::grown_cuts).
inline constexpr std::size_t grown_bound_cuts = 8;

// The plan's certified gap from the proven bound (plan time / bound - 1), unless it has a
// smaller one; status optimal where its time meets the bound.
inline void certify_by_bound(Plan& plan, const TimeLowerBound& bound) {
    if (bound.budget_infeasible || !(bound.time > 0)) return;
    certify_by_time_bound(plan, bound.time);
}

// --bound: the proven lower bound, and how far above it the plan is.
inline void print_bound(std::ostream& out, const Reference& ref, const PlanRun& run) {
    const TimeLowerBound& b = *run.bound;
    const std::string how = std::string(b.relaxation_solved ? "" : " (at the time limit; a solved bound may be higher)") +
                            ", " + std::to_string(b.cuts.size()) + (b.cuts.size() == 1 ? " cut, " : " cuts, ") + number(b.seconds, "%.2f") + " s";
    if (b.budget_infeasible) {
        out << "  bound     no schedule fits this budget (proven)" << how << "\n";
        return;
    }
    if (run.infeasible && run.infeasible->proven()) {  // the relaxation did not see it; the solver proved it
        out << "  bound     no schedule fits this budget (proven by " << run.solver_name << ")\n";
        return;
    }
    if (run.least_peak && run.budget < *run.least_peak) {
        out << "  bound     no schedule fits this budget (proven by the exact search: the least peak is "
            << bytes_both(*run.least_peak) << ")\n";
        return;
    }
    out << "  bound     time >= " << number(b.time) << ", overhead >= " << signed_percent(b.time, ref.time)
        << " vs T_ref for any schedule within the budget" << how << "\n";
    if (!run.plan) return;
    // The plan's own gap where it is smaller: proved after this bound (auto's proof by the states
    // at the loss, or the exact search's certification).
    const std::optional<double> own = run.plan->stats.gap;
    const double over_bound = run.plan->time / std::max(b.time, 1e-300) - 1.0;
    if (meets_time_bound(run.plan->time, b.time))
        out << "  optimum   this plan is optimal: its time meets the bound\n";
    else if (run.plan->stats.status == SolveStatus::optimal && own && *own <= 0.0)
        out << "  optimum   this plan is optimal: proven after this bound (see its solver line)\n";
    else
        out << "  optimum   this plan is at most " << number(100.0 * std::min(over_bound, own.value_or(HUGE_VAL)), "%.2f")
            << " % slower than the best schedule" << (own && *own < over_bound ? " (a bound proven after this one)" : "")
            << "\n";
}

inline void print_summary(std::ostream& out, const PlanArgs& a, const Problem& problem, const Reference& ref,
                          const PlanRun& run) {
    const auto chain = as_chain(problem);
    out << printable(problem.name()) << ": "
        << (chain ? "chain of " + std::to_string(chain->length()) + (chain->length() == 1 ? " stage, " : " stages, ")
                  : std::string("problem, "))
        << problem.data_count() << " data, " << problem.op_count() << " ops; T_ref " << number(ref.time) << ", P_ref "
        << bytes_both(ref.peak) << "\n";
    if (run.plan) print_plan(out, a, ref, *run.plan, run.solver_name);
    if (run.plan && a.explain) {
        ExplainOptions explain_options;
        explain_options.reference_time = ref.time;
        explain_options.labels = unit_labels(a.file);
        out << "\n" << run.plan->explain(problem, explain_options);
    }
    else if (run.infeasible) out << "  solver    " << run.solver_name << ": infeasible at " << bytes_both(run.budget) << "\n";
    if (run.bound) print_bound(out, ref, run);
    if (!a.sweep) return;
    out << "\nsweep: " << run.solver_name << ", " << run.rows.size() << " budgets from the smallest feasible ";
    out << (run.smallest ? bytes_both(*run.smallest) : std::string("(unknown)")) << " to P_ref\n";
    out << "  " << pad("budget", 22, false) << pad("% P_ref", 8) << pad("time", 12) << pad("overhead", 10)
        << pad("peak", 12) << "\n";
    for (const auto& row : run.rows) {
        out << "  " << pad(bytes_both(row.budget), 22, false)
            << pad(number(100.0 * double(row.budget) / double(std::max<Bytes>(ref.peak, 1)), "%.1f"), 8);
        if (row.plan)
            out << pad(number(row.plan->time), 12) << pad(signed_percent(row.plan->time, ref.time), 10)
                << pad(format_bytes(row.plan->peak), 12) << "\n";
        else
            out << "  infeasible" << (row.needs ? " (needs " + format_bytes(*row.needs) + ")" : std::string()) << "\n";
    }
}

// Plans at the budget and over the sweep; the plan and the schedule files on success.
inline int run_plan(const PlanArgs& a, std::ostream& out, std::ostream& err) {
    const Stopwatch command_clock;
    const Problem problem = io::load_problem(a.file);
    SolveOptions options;
    options.time_limit = a.time_limit;
    options.certify = a.certify;
    options.exact_component = !a.sweep;  // at most 10 s per budget
    if (!a.quiet) options.progress = progress_printer(err, a.verbose ? 0.0 : 2.0);
    // A step with optimizer updates (docs/formats.md §11): its activations are planned apart.
    if (a.offload || problem.has_updates()) {
        if (a.sweep || a.bound || a.explain)
            throw InvalidInput("problem '" + printable(problem.name()) + "' has in-place updates (remat.problem/2): "
                               "--sweep, --bound and --explain do not apply to it yet; plan one --budget");
        return run_offload(a.file, a.budget, a.solver, a.out, a.svg, a.bandwidth, a.host_limit, a.offload, a.json,
                           options, out, err);
    }
    const Reference ref = store_all_reference(problem);
    const SolverEntry& solver = a.solver ? find_solver(*a.solver, options) : default_solver(problem);
    require_applies(solver, problem);
    PlanRun run;
    run.solver_name = std::string(solver.name) + (options.variant.empty() ? "" : ":" + options.variant);
    run.planning = a.budget.has_value();
    run.budget = run.planning ? parse_budget(*a.budget, ref.peak) : 0;

    // In a sweep, Rockmate, H-Rockmate and auto analyse the problem once for every budget.
    const std::function<Plan(Bytes)> plan_at =
        a.sweep ? planner_for(solver, problem, options)
                : std::function<Plan(Bytes)>([&](Bytes b) { return solve_with(solver, problem, b, options); });
    // The bound first: Checkmate (by name or as auto's exact component) then starts from it.
    if (a.bound || a.refine) {
        // Asked for with a time limit: that time is spent on the tightest bound (grown cuts).
        run.bound = proven_time_bound(problem, run.budget, options, options.time_limit ? grown_bound_cuts : 0);
    } else if (solver.name == "auto" && !a.no_bound && run.planning && !a.sweep && have_time_bound_backend) {
        SolveOptions within = options;
        within.time_limit = options.time_limit ? std::min(*options.time_limit / 2, auto_bound_seconds) : auto_bound_seconds;
        // Beyond the bound from the plan (AutoOptions::bound_from_plan_max_ops), auto proves no
        // bound after planning: there a long limit buys a tighter one first, in a third of it.
        std::size_t grown = 0;
        if (options.time_limit && problem.op_count() > AutoOptions{}.bound_from_plan_max_ops &&
            *options.time_limit / 3 > auto_bound_seconds) {
            within.time_limit = *options.time_limit / 3;
            grown = grown_bound_cuts;
        }
        const Stopwatch clock;
        run.bound = proven_time_bound(problem, run.budget, within, grown);
        // --time-limit covers the whole command (plan_at reads `options` when it plans).
        if (options.time_limit) options.time_limit = std::max(*options.time_limit - clock.seconds(), 1e-3);
    }
    if (run.bound && !run.bound->budget_infeasible && !a.sweep) {
        options.time_bound = run.bound->time;
        options.loss_state_preferred = run.bound->live_at_loss;
    }
    if (run.planning) {
        try {
            run.plan = plan_at(run.budget);
        } catch (const Infeasible& e) {
            run.infeasible = e;
        }
    }
    if (run.infeasible && !no_schedule_fits(problem, run)) {
        const double left = a.time_limit ? *a.time_limit - command_clock.seconds() : exact_least_peak_seconds;
        run.least_peak = exact_least_peak_within(problem, std::min(exact_least_peak_seconds, left));
    }
    if (run.bound && run.plan) certify_by_bound(*run.plan, *run.bound);
    if (a.refine && run.bound && run.plan && !run.bound->budget_infeasible && run.bound->time > 0) {
        RefineOptions ro;
        ro.time_limit_seconds = *a.refine;
        ro.loss_state_preferred = run.bound->live_at_loss;
        ro.progress = options.progress;
        // A smaller gap the plan already had (--certify's exact search) stays while the plan does.
        const std::optional<double> gap_before = run.plan->stats.gap;
        const double time_before = run.plan->time;
        run.plan = refine_plan(problem, run.budget, std::move(*run.plan), run.bound->time, ro);
        if (gap_before && run.plan->time >= time_before && *gap_before < *run.plan->stats.gap)
            run.plan->stats.gap = gap_before;
    }
    if (a.sweep) {
        if (run.infeasible && run.infeasible->smallest_budget()) {
            run.smallest = run.infeasible->smallest_budget();
        } else if (analyses_once(solver)) {
            try {  // asked at budget 0, these answer with their smallest budget
                run.smallest = plan_at(0).peak;
            } catch (const Infeasible& e) {
                run.smallest = e.smallest_budget();
            }
        }
        if (!run.smallest) run.smallest = smallest_budget(solver, problem, options, ref.peak);
        if (run.smallest)
            run.rows = sweep(sweep_budgets(*run.smallest, std::max(ref.peak, *run.smallest), *a.sweep), plan_at);
    } else if (run.infeasible) {
        run.smallest = run.infeasible->smallest_budget();
    }
    if (a.sweep_csv) io::write_file(*a.sweep_csv, sweep_csv(run.rows, ref));
    if (a.sweep_svg) io::write_file(*a.sweep_svg, sweep_svg(run.rows, ref, problem.name() + ": " + run.solver_name));
    if (run.plan && a.out) io::write_file(*a.out, io::to_json(problem, *run.plan));
    if (run.plan && a.svg) io::write_file(*a.svg, timeline_svg(problem, *run.plan, ref.peak, unit_labels(a.file)));
    if (a.json) print_json(out, a, problem, ref, run);
    else print_summary(out, a, problem, ref, run);
    if (!run.infeasible) return exit_ok;
    err << "remat-plan: infeasible: " << run.infeasible->what() << "\n";
    if (run.smallest)
        err << "remat-plan: the smallest feasible budget for " << run.solver_name << " is " << bytes_both(*run.smallest)
            << " = " << percent(double(*run.smallest), double(ref.peak)) << " of P_ref; try --budget " << *run.smallest << "\n";
    if (run.planning) explain_infeasible(err, problem, *run.infeasible, run.solver_name, run.smallest, run.least_peak);
    return exit_infeasible;
}

// The run, with remat's exceptions turned into exit codes.
inline int run_guarded(const PlanArgs& a, std::ostream& out, std::ostream& err) {
    try {
        return a.check ? run_check(a, out, err) : run_plan(a, out, err);
    } catch (const InvalidInput& e) {
        err << "remat-plan: " << e.what() << "\n";
        return exit_bad_input;
    } catch (const TooLarge& e) {
        err << "remat-plan: too large for this solver: " << e.what() << "\n";
        return exit_too_large;
    } catch (const Error& e) {
        err << "remat-plan: " << e.what() << "\n";
        return exit_error;
    } catch (const std::exception& e) {
        err << "remat-plan: unexpected error: " << e.what() << "\n";
        return exit_error;
    }
}

}  // namespace detail

/// Runs remat-plan with `args` (without the program name). Output on `out`, messages on `err`.
inline int run_remat_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
    detail::PlanArgs a;
    try {
        a = detail::parse_plan_args(args);
    } catch (const detail::UsageError& e) {
        err << "remat-plan: " << printable(e.message, 300) << "\n\n" << remat_plan_usage();
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
        detail::check_output_paths(a);
    } catch (const InvalidInput& e) {
        err << "remat-plan: " << e.what() << "\n";
        return exit_bad_input;
    }
    const int code = detail::run_guarded(a, out, err);
    if (code != exit_ok) detail::remove_stale_outputs(a, err);
    return code;
}

}  // namespace remat::cli
