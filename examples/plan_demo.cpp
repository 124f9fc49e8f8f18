// plan-demo — plans every bundled example problem with every solver that applies, prints a
// budget sweep table per problem, and draws one memory timeline as SVG.
//
//   plan-demo [PROBLEMS_DIR] [--svg FILE]
//
// PROBLEMS_DIR defaults to examples/problems of the source tree; FILE to build/timeline.svg.
// The solvers come from cli/solver_table.hpp, the same table remat-plan uses.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/io/svg.hpp>

#include "cli/solver_table.hpp"

namespace {

namespace fs = std::filesystem;
using remat::Bytes;
using remat::Plan;
using remat::Problem;
using remat::cli::SolverEntry;

constexpr std::size_t sweep_points = 6;
// One solver's cell: time, overhead and peak.
constexpr std::size_t time_width = 8, overhead_width = 9, peak_width = 10;
constexpr std::size_t cell_width = time_width + overhead_width + peak_width;

std::string fixed(double value, const char* format) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, value);
    return buffer;
}

std::string trimmed(std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

std::string pad(std::string s, std::size_t width, bool right = true) {
    if (s.size() >= width) return s;
    return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

struct Outcome {
    std::optional<Plan> plan;
    std::string failure;  // "infeasible" or why the solver gave up
};

Outcome run(const SolverEntry& solver, const Problem& problem, Bytes budget) {
    try {
        return {remat::cli::solve_with(solver, problem, budget, {}), {}};
    } catch (const remat::Infeasible&) {
        return {std::nullopt, "infeasible"};
    } catch (const remat::Error&) {
        return {std::nullopt, "failed"};
    }
}

struct Loaded {
    fs::path path;
    Problem problem;
    remat::Reference reference;
};

void sweep(const Loaded& item) {
    const Problem& problem = item.problem;
    const remat::Reference& ref = item.reference;
    const auto chain = remat::as_chain(problem);
    std::cout << "\n" << problem.name() << "  (" << item.path.filename().string() << ": "
              << (chain ? "chain of " + std::to_string(chain->length()) + (chain->length() == 1 ? " stage, " : " stages, ")
                     : std::string("graph, "))
              << problem.data_count() << " data, " << problem.op_count() << " ops)   T_ref " << fixed(ref.time, "%.4g")
              << "   P_ref " << remat::format_bytes(ref.peak) << "\n";
    if (problem.has_updates()) {  // weights and optimizer state with their updates (docs/formats.md §11)
        std::cout << "  a training step with its weights and optimizer state: try remat-plan "
                  << item.path.filename().string() << " --offload --budget 35%\n";
        return;
    }

    std::vector<const SolverEntry*> solvers;
    for (const SolverEntry& e : remat::cli::solver_table())
        if (e.applies(problem) && e.quick(problem)) solvers.push_back(&e);

    // Budgets from the smallest one any solver meets up to P_ref.
    std::string smallest_line;
    std::optional<Bytes> lo;
    for (const SolverEntry* s : solvers) {
        std::optional<Bytes> b;
        try {
            b = remat::cli::smallest_budget(*s, problem, {}, ref.peak);
        } catch (const remat::Error&) {
        }
        smallest_line += (smallest_line.empty() ? "" : ", ") + std::string(s->name) + " " +
                         (b ? remat::format_bytes(*b) : std::string("unknown"));
        if (b) lo = lo ? std::min(*lo, *b) : *b;
    }
    std::cout << "  smallest feasible budget: " << smallest_line << "\n";
    const Bytes low = lo.value_or(ref.peak);
    const Bytes high = std::max(ref.peak, low);

    std::string header = "  " + pad("budget", 11, false) + pad("% P_ref", 7);
    std::string sub = "  " + std::string(18, ' ');
    for (const SolverEntry* s : solvers) {
        header += " | " + pad(std::string(s->name), cell_width, false);
        sub += " | " + pad("time", time_width) + pad("overhead", overhead_width) + pad("peak", peak_width);
    }
    std::cout << trimmed(header) << "\n" << trimmed(sub) << "\n";
    std::vector<Bytes> budgets;
    for (std::size_t i = 0; i < sweep_points; ++i)
        budgets.push_back(low + static_cast<Bytes>(static_cast<double>(high - low) * static_cast<double>(i) /
                                                   static_cast<double>(sweep_points - 1)));
    budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
    for (const Bytes budget : budgets) {
        std::string line = "  " + pad(remat::format_bytes(budget), 11, false) +
                           pad(fixed(100.0 * static_cast<double>(budget) / static_cast<double>(ref.peak), "%.1f"), 7);
        for (const SolverEntry* s : solvers) {
            const Outcome o = run(*s, problem, budget);
            line += " | ";
            if (o.plan)
                line += pad(fixed(o.plan->time, "%.4g"), time_width) +
                        pad(fixed(100.0 * (o.plan->time / ref.time - 1.0), "%+.1f%%"), overhead_width) +
                        pad(remat::format_bytes(o.plan->peak), peak_width);
            else
                line += pad(o.failure, cell_width, false);
        }
        std::cout << trimmed(line) << "\n";
    }
}

}  // namespace

int main(int argc, char** argv) {
    fs::path dir = fs::path(REMAT_SOURCE_DIR) / "examples" / "problems";
    fs::path svg_path = "build/timeline.svg";
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--svg" && i + 1 < argc) svg_path = argv[++i];
        else if (arg == "-h" || arg == "--help") {
            std::cout << "usage: plan-demo [PROBLEMS_DIR] [--svg FILE]\n";
            return 0;
        } else if (!arg.empty() && arg[0] != '-') dir = arg;
        else {
            std::cerr << "plan-demo: unknown argument '" << arg << "'\nusage: plan-demo [PROBLEMS_DIR] [--svg FILE]\n";
            return 2;
        }
    }
    try {
        std::vector<fs::path> files;
        if (!fs::is_directory(dir)) throw remat::InvalidInput("'" + dir.string() + "' is not a directory");
        for (const auto& entry : fs::directory_iterator(dir))
            if (entry.path().extension() == ".json") files.push_back(entry.path());
        std::sort(files.begin(), files.end());
        std::string names;
        for (const SolverEntry& e : remat::cli::solver_table()) names += (names.empty() ? "" : ", ") + std::string(e.name);
        std::cout << "plan-demo: " << files.size() << " problems in " << dir.string() << "; solvers: " << names
                  << "\n(times in the files' unit; overhead = time / T_ref - 1; each solver's plan is checked by the "
                     "simulator)\n";

        std::vector<Loaded> loaded;
        for (const fs::path& f : files) {
            Problem p = remat::io::load_problem(f);
            remat::Reference ref = remat::store_all_reference(p);
            loaded.push_back(Loaded{f, std::move(p), std::move(ref)});
        }
        for (const Loaded& item : loaded) sweep(item);

        // The picture: rotor on the longest chain at half its store-all peak.
        const Loaded* pick = nullptr;
        std::size_t longest = 0;
        for (const Loaded& item : loaded)
            if (const auto chain = remat::as_chain(item.problem); chain && chain->length() > longest) {
                longest = chain->length();
                pick = &item;
            }
        if (pick == nullptr && !loaded.empty()) pick = &loaded.front();
        if (pick != nullptr) {
            remat::cli::SolveOptions options;
            const SolverEntry& solver = remat::cli::default_solver(pick->problem);
            Bytes budget = remat::percent_of(pick->reference.peak, 50);
            std::optional<Plan> plan;
            try {
                plan = remat::cli::solve_with(solver, pick->problem, budget, options);
            } catch (const remat::Infeasible& e) {
                budget = e.smallest_budget().value_or(pick->reference.peak);
                plan = remat::cli::solve_with(solver, pick->problem, budget, options);
            }
            if (svg_path.has_parent_path()) fs::create_directories(svg_path.parent_path());
            remat::io::write_file(svg_path, remat::timeline_svg(pick->problem, *plan, pick->reference.peak));
            std::cout << "\nwrote " << svg_path.string() << ": " << solver.name << " on " << pick->problem.name()
                      << " at " << remat::format_bytes(budget) << " ("
                      << fixed(100.0 * static_cast<double>(budget) / static_cast<double>(pick->reference.peak), "%.0f")
                      << " % of P_ref): time " << fixed(plan->time, "%.4g") << " ("
                      << fixed(100.0 * (plan->time / pick->reference.time - 1.0), "%+.1f") << " %), peak "
                      << remat::format_bytes(plan->peak) << ", " << plan->schedule.size() << " steps\n";
        }
        return 0;
    } catch (const remat::InvalidInput& e) {
        std::cerr << "plan-demo: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "plan-demo: " << e.what() << "\n";
        return 1;
    }
}
