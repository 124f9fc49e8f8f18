// examples/cli/offload_plan.hpp — `remat-plan --offload`: one device budget for everything a
// training step holds (docs/formats.md §11), split between weights and activations by the
// combined planner (remat/offload/combined.hpp); a summary or one JSON line, the
// `remat.schedule/2` file and a timeline SVG with a lane per transfer channel. With
// --solver checkmate (where a MILP backend is built), Checkmate's MILP with offload variables
// (remat/offload/checkmate.hpp) also runs, started from the combined planner's plan.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include <remat/io/budget.hpp>
#include <remat/io/offload_json.hpp>
#include <remat/io/offload_svg.hpp>
#include <remat/offload/combined.hpp>
#ifdef REMAT_WITH_LPSOLVE
#include <remat/milp/lp_solve.hpp>
#include <remat/offload/checkmate.hpp>
#endif
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif

#include "format.hpp"
#include "solver_table.hpp"

namespace remat::cli::detail {

/// A remat-plan solver entry as a remat::Solver, for the combined planner, which plans some 25
/// activation budgets of one problem: bound to the last problem it was given (planner_for),
/// so that Rockmate analyses it once.
class EntrySolver {
public:
    EntrySolver(const SolverEntry& entry, const SolveOptions& options) : entry_(&entry), options_(&options) {}

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        if (!bound_ || !(bound_->problem == problem)) bound_.emplace(Bound{problem, planner_for(*entry_, problem, *options_)});
        return bound_->plan(budget);
    }
    /// Within at most `seconds` (the planner's time limit's rest), where given: an entry that
    /// analyses once keeps the limit it was bound with; any other gets the smaller limit.
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget, std::optional<double> seconds) const {
        if (!seconds || analyses_once(*entry_)) return solve(problem, budget);
        SolveOptions within = *options_;
        within.time_limit = tightened_time_limit(options_->time_limit.value_or(*seconds), *seconds);
        return solve_with(*entry_, problem, budget, within);
    }
    [[nodiscard]] std::string_view name() const { return entry_->name; }

private:
    struct Bound {
        Problem problem;
        std::function<Plan(Bytes)> plan;
    };
    const SolverEntry* entry_;
    const SolveOptions* options_;
    mutable std::optional<Bound> bound_;
};

/// Calls `use` with the activations' solver: remat::Auto and remat::HRockmate themselves, so
/// that the combined planner runs them as it runs every library caller's
/// (offload::detail::combined::for_many_budgets: analysed once, without what costs seconds
/// at each budget), and any other entry as an EntrySolver.
template <class Use>
decltype(auto) with_activation_solver(const SolverEntry& entry, const SolveOptions& options, Use&& use) {
    if (entry.name == "auto") return use(Auto(auto_options(options)));
    if (entry.name == "hrockmate") return use(HRockmate(hrockmate_options(options)));
    return use(EntrySolver(entry, options));
}

/// "12GB/s", "900MiB/s" or "1e9": bytes per unit of the problem's time (seconds when profiled).
inline double parse_bandwidth(const std::string& flag, std::string text) {
    if (text.size() > 2 && text.compare(text.size() - 2, 2, "/s") == 0) text.resize(text.size() - 2);
    try {
        if (text.find('%') == std::string::npos) {
            const Bytes bytes = parse_budget(text, 0);
            if (bytes > 0) return static_cast<double>(bytes);
        }
    } catch (const InvalidInput&) {
    }
    throw InvalidInput(flag + " expects a positive rate such as 12GB/s, 900MiB/s or 25e9, not '" + printable(text, 80) + "'");
}

inline void print_offload_json(std::ostream& out, const Reference& ref, Bytes budget, const std::string& solver,
                               const std::optional<offload::OffloadPlan>& plan, double seconds,
                               const TransferSettings& transfers) {
    using nlohmann::ordered_json;
    ordered_json line;
    line["solver"] = solver;
    line["budget"] = budget;
    line["feasible"] = plan.has_value();
    line["time"] = plan ? ordered_json(plan->report.makespan) : ordered_json(nullptr);
    line["peak"] = plan ? ordered_json(plan->report.device_peak) : ordered_json(nullptr);
    line["host_peak"] = plan ? ordered_json(plan->report.host_peak) : ordered_json(nullptr);
    line["T_ref"] = ref.time;
    line["P_ref"] = ref.peak;
    line["solve_seconds"] = seconds;
    line["status"] = plan ? "heuristic" : "infeasible";
    line["gap"] = nullptr;
    if (plan) {
        const offload::OffloadReport& r = plan->report;
        line["offload"] = ordered_json{{"method", plan->method},
                                       {"activation_budget", plan->activation_budget},
                                       {"compute_time", r.compute_time},
                                       {"stall_time", r.stall_time()},
                                       {"offloads", r.offloads},
                                       {"prefetches", r.prefetches},
                                       {"bytes_to_host", r.bytes_to_host},
                                       {"bytes_to_device", r.bytes_to_device},
                                       {"bandwidth_to_host", transfers.bandwidth_to_host},
                                       {"bandwidth_to_device", transfers.bandwidth_to_device}};
    }
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

inline void print_offload_summary(std::ostream& out, const Problem& problem, const Reference& ref, Bytes budget,
                                  const std::string& solver, const offload::OffloadPlan& plan,
                                  const TransferSettings& transfers, double seconds) {
    const offload::OffloadReport& r = plan.report;
    const auto rate = [](double b) { return b > 0 ? format_bytes(static_cast<Bytes>(b)) + "/s" : std::string("unlimited"); };
    out << printable(problem.name()) << ": problem, " << problem.data_count() << " data, " << problem.op_count()
        << " ops; T_ref " << number(ref.time) << ", P_ref " << bytes_both(ref.peak) << " (everything the step holds)\n";
    const std::string how = plan.method == "checkmate+offload"
                                ? "Checkmate's MILP with offload variables, started from the combined planner's plan"
                                : "activations by " + solver + " at " + bytes_both(plan.activation_budget);
    out << "  planner   " << plan.method << " (" << how << "), solved in " << number(seconds * 1e3, "%.3g") << " ms\n";
    out << "  budget    " << bytes_both(budget) << ", " << percent(double(budget), double(ref.peak)) << " of P_ref\n";
    out << "  time      " << number(r.makespan) << ", overhead " << signed_percent(r.makespan, ref.time)
        << " vs T_ref (compute " << number(r.compute_time) << ", waiting for transfers " << number(r.stall_time()) << ")\n";
    out << "  device    peak " << bytes_both(r.device_peak) << ", " << percent(double(r.device_peak), double(budget))
        << " of budget\n";
    out << "  host      peak " << bytes_both(r.host_peak)
        << (transfers.host_limit ? ", limit " + bytes_both(*transfers.host_limit) : std::string()) << "\n";
    out << "  transfers " << r.offloads << " offloads (" << format_bytes(r.bytes_to_host) << " at "
        << rate(transfers.bandwidth_to_host) << "), " << r.prefetches << " prefetches ("
        << format_bytes(r.bytes_to_device) << " at " << rate(transfers.bandwidth_to_device) << ")\n";
    out << "  schedule  " << plan.schedule.steps.size() << " steps"
        << (plan.schedule.start_on_host.empty()
                ? std::string()
                : ", " + std::to_string(plan.schedule.start_on_host.size()) + " data kept on the host between steps")
        << "\n";
}

// The transfer settings: the problem's, then --bandwidth and --host-limit, then 12 GB/s.
inline TransferSettings offload_settings(const Problem& problem, const std::optional<std::string>& bandwidth,
                                         const std::optional<std::string>& host_limit) {
    TransferSettings t = problem.transfers();
    if (bandwidth) t.bandwidth_to_host = t.bandwidth_to_device = parse_bandwidth("--bandwidth", *bandwidth);
    if (t.bandwidth_to_host <= 0) t.bandwidth_to_host = 12e9;
    if (t.bandwidth_to_device <= 0) t.bandwidth_to_device = 12e9;
    if (host_limit) t.host_limit = parse_budget(*host_limit, 0);
    return t;
}

/// --offload --solver checkmate[:lpsolve|:cbc]: the combined planner (its activations by the
/// default solver), then Checkmate's MILP with offload variables started from its plan, within
/// --time-limit (60 s by default); the faster plan.
template <Solver Activations>
std::optional<offload::OffloadPlan> plan_with_offload_milp(const Problem& problem, Bytes budget,
                                                           const Activations& activations, const SolveOptions& options,
                                                           const offload::CombinedOptions& combined) {
#ifdef REMAT_WITH_LPSOLVE
    offload::OffloadCheckmateOptions milp;
    milp.time_limit_seconds = options.time_limit.value_or(60.0);
    milp.transfers = combined.transfers;
    milp.progress = options.progress;
#ifdef REMAT_WITH_CBC
    if (options.variant != "lpsolve")
        return offload::plan_with_offload(problem, budget, activations, offload::OffloadCheckmate<milp::Cbc>(milp), combined);
#endif
    return offload::plan_with_offload(problem, budget, activations, offload::OffloadCheckmate<milp::LpSolve>(milp), combined);
#else
    (void)options;
    return offload::plan_with_offload(problem, budget, activations, combined);  // no MILP backend: never listed
#endif
}

/// remat-plan --offload (or a problem with updates, planned without transfers when
/// `transfers_allowed` is false). Returns the exit code.
inline int run_offload(const std::string& file, const std::optional<std::string>& budget_text,
                       const std::optional<std::string>& solver_name, const std::optional<std::string>& out_file,
                       const std::optional<std::string>& svg_file, const std::optional<std::string>& bandwidth,
                       const std::optional<std::string>& host_limit, bool transfers_allowed, bool json,
                       const SolveOptions& base_options, std::ostream& out, std::ostream& err) {
    const Problem problem = io::load_problem(file);
    if (transfers_allowed && std::none_of(problem.all_data().begin(), problem.all_data().end(),
                                          [&](const Data& d) { return d.offloadable; }))
        throw InvalidInput("problem '" + printable(problem.name()) + "' has nothing to offload: no data is marked "
                           "\"offloadable\" (remat.problem/2, docs/formats.md §11)");
    const Reference ref = store_all_reference(problem);
    const Bytes budget = parse_budget(*budget_text, ref.peak);
    TransferSettings transfers = offload_settings(problem, bandwidth, host_limit);
    const offload::TrainingSplit split = offload::split_training_state(problem);
    SolveOptions options = base_options;
    const SolverEntry& entry = solver_name ? find_solver(*solver_name, options) : default_solver(split.activations);
    const std::string solver_label = std::string(entry.name) + (options.variant.empty() ? "" : ":" + options.variant);
    // With --solver checkmate the MILP runs after the combined planner, whose activations the
    // default solver plans (its variant is the MILP backend's).
    const bool with_milp = transfers_allowed && entry.name == "checkmate";
    const SolverEntry& activation_entry = with_milp ? default_solver(split.activations) : entry;
    SolveOptions activation_options = options;
    if (with_milp) activation_options.variant.clear();
    const std::string activation_label = with_milp ? std::string(activation_entry.name) : solver_label;
    offload::CombinedOptions combined{offload::GreedyVariant::repeated, 12, transfers};
    combined.time_limit_seconds = options.time_limit;  // the whole plan; the MILP's runs in what is left
    const Stopwatch clock;
    const std::optional<offload::OffloadPlan> plan =
        with_activation_solver(activation_entry, activation_options, [&](const auto& activations) {
            return !transfers_allowed ? offload::plan_remat_only(problem, budget, activations, combined)
                   : with_milp        ? plan_with_offload_milp(problem, budget, activations, options, combined)
                                      : offload::plan_with_offload(problem, budget, activations, combined);
        });
    const double seconds = clock.seconds();
    if (plan && out_file)
        io::write_file(*out_file, io::to_json(problem, io::SavedOffloadSchedule{
                                                           problem.name(), plan->method, budget,
                                                           io::OffloadPrediction{plan->report.makespan,
                                                                                 plan->report.device_peak,
                                                                                 plan->report.host_peak},
                                                           plan->schedule}));
    if (plan && svg_file) io::write_file(*svg_file, offload_timeline_svg(problem, plan->schedule, plan->report, budget));
    if (json) print_offload_json(out, ref, budget, solver_label, plan, seconds, transfers);
    else if (plan) print_offload_summary(out, problem, ref, budget, activation_label, *plan, transfers, seconds);
    if (plan) return exit_ok;
    const Bytes bound = offload::device_memory_lower_bound(problem);
    err << "remat-plan: infeasible: no split of " << bytes_both(budget) << " between weights and activations fits ("
        << (transfers_allowed ? "rematerialization with weight offloading" : "rematerialization alone, every weight on the device")
        << ", activations by " << activation_label << ")\n";
    if (budget < bound)
        err << "remat-plan: the budget is below a proven lower bound: every schedule needs at least " << bytes_both(bound)
            << " (an exactly-once op with what it reads, writes and updates, and the data that cannot leave the device)\n";
    else
        err << "remat-plan: the budget is above the proven lower bound of " << bytes_both(bound)
            << ": it is only beyond the reach of this planner" << (transfers_allowed ? "" : "; try --offload") << "\n";
    return exit_infeasible;
}

/// remat-plan FILE --check SCHEDULE for a `remat.schedule/2` file: the offload simulator's
/// figures, against the budget (--budget, or the file's), the problem's host limit and what
/// the file predicts. Returns the exit code (0, or 1 naming the first thing wrong).
inline int run_offload_check(const Problem& problem, const Reference& ref, const std::string& file,
                             const std::optional<std::string>& budget_text, bool json, std::ostream& out,
                             std::ostream& err) {
    using nlohmann::ordered_json;
    const io::SavedOffloadSchedule saved = io::load_offload_schedule(problem, file);
    const std::optional<Bytes> budget = budget_text ? std::optional<Bytes>(parse_budget(*budget_text, ref.peak)) : saved.budget;
    const offload::OffloadReport r = offload::simulate(problem, saved.schedule);
    const std::optional<Bytes> host_limit = problem.transfers().host_limit;
    std::string wrong;
    if (!r.valid) wrong = "invalid: " + r.error;
    else if (budget && r.device_peak > *budget)
        wrong = "device peak " + bytes_both(r.device_peak) + " above the budget of " + bytes_both(*budget);
    else if (host_limit && r.host_peak > *host_limit)
        wrong = "host peak " + bytes_both(r.host_peak) + " above the problem's host limit of " + bytes_both(*host_limit);
    else if (saved.predicted && (saved.predicted->peak != r.device_peak || saved.predicted->host_peak != r.host_peak ||
                                 std::abs(saved.predicted->time - r.makespan) > 1e-9 * std::max(1.0, r.makespan)))
        wrong = "the file predicts time " + number(saved.predicted->time, "%.17g") + ", peak " +
                std::to_string(saved.predicted->peak) + " and host peak " + std::to_string(saved.predicted->host_peak) +
                ", but the simulation gives " + number(r.makespan, "%.17g") + ", " + std::to_string(r.device_peak) + " and " +
                std::to_string(r.host_peak);
    if (json) {
        ordered_json line;
        line["valid"] = wrong.empty();
        line["error"] = wrong.empty() ? ordered_json(nullptr) : ordered_json(wrong);
        line["error_step"] = r.error_step ? ordered_json(*r.error_step) : ordered_json(nullptr);
        line["time"] = r.valid ? ordered_json(r.makespan) : ordered_json(nullptr);
        line["peak"] = r.valid ? ordered_json(r.device_peak) : ordered_json(nullptr);
        line["host_peak"] = r.valid ? ordered_json(r.host_peak) : ordered_json(nullptr);
        line["budget"] = budget ? ordered_json(*budget) : ordered_json(nullptr);
        line["T_ref"] = ref.time;
        line["P_ref"] = ref.peak;
        out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (r.valid) {
        out << printable(file, 200) << ": " << saved.schedule.steps.size() << " steps with transfers for '"
            << printable(problem.name()) << "'\n  time      " << number(r.makespan) << ", overhead "
            << signed_percent(r.makespan, ref.time) << " vs T_ref (compute " << number(r.compute_time) << ")\n  device    peak "
            << bytes_both(r.device_peak) << (budget ? ", " + percent(double(r.device_peak), double(*budget)) + " of the budget" : "")
            << "\n  host      peak " << bytes_both(r.host_peak) << "\n  transfers " << r.offloads << " offloads, "
            << r.prefetches << " prefetches\n";
    }
    if (wrong.empty()) return exit_ok;
    err << "remat-plan: " << printable(file, 200) << ": " << wrong << "\n";
    return exit_error;
}

}  // namespace remat::cli::detail
