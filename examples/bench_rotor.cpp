// bench_rotor — how long the chain DPs take, and what they buy: Rotor (Beaumont et al.
// 2019, persistent schedules) and RotorRelease (solvers/rotor_release.hpp, beyond them).
//
// Solve time of remat::Rotor and remat::RotorRelease with their default memory slots on
// seeded heterogeneous chains of L = 10, 50, 100 and 200 stages (median of several
// single-threaded runs), against the targets (Rotor: L = 100 under 50 ms, L = 200 under
// 0.5 s; RotorRelease: under 100 ms and 1 s); then the time overhead over store-all of
// Rotor, RotorRelease and Periodic at a few budgets; then, on chains from the example models
// (their first 8 stages, small enough for the exact search to prove the optimum), each
// solver's time over the optimum (target for RotorRelease: at most 1.01).
//
//   bench_rotor [--runs N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

namespace {

// Stage sizes spread over two orders of magnitude, as along a real network.
remat::Chain heterogeneous_chain(std::size_t length, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(std::log(64.0 * 1024), std::log(4.0 * 1024 * 1024));
    std::uniform_real_distribution<double> log_time(std::log(0.1e-3), std::log(5e-3));
    std::uniform_real_distribution<double> fraction(0.0, 1.0);
    const auto size = [&] { return static_cast<remat::Bytes>(std::exp(log_size(rng))); };
    remat::Chain chain{"heterogeneous-" + std::to_string(length), size(), {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const remat::Bytes out = size();
        const double fwd = std::exp(log_time(rng));
        chain.stages.push_back(remat::Stage{std::to_string(l), fwd, fwd * (1.0 + 2.0 * fraction(rng)), out,
                                            out + static_cast<remat::Bytes>(3.0 * fraction(rng) * static_cast<double>(out)),
                                            static_cast<remat::Bytes>(0.5 * fraction(rng) * static_cast<double>(out)),
                                            static_cast<remat::Bytes>(0.5 * fraction(rng) * static_cast<double>(out))});
    }
    return chain;
}

// Milliseconds of one solve.
template <class Solver>
double solve_ms(const Solver& solver, const remat::Chain& chain, remat::Bytes budget) {
    const auto start = std::chrono::steady_clock::now();
    const remat::Plan plan = solver.solve(chain, budget);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (plan.peak > budget) std::exit(1);  // make_checked_plan already guarantees this
    return ms;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Time over the proven optimum (the exact search) of Rotor and RotorRelease on the first 8
// stages of the example models' chains, at 40-90 % of P_ref. True when RotorRelease stays
// within 1.01 everywhere.
bool example_chains_against_optimum(const remat::Rotor& rotor, const remat::RotorRelease& release) {
    std::printf("\nChains from the example models (first 8 stages): time / proven optimum (exact search)\n\n");
    std::printf("%-20s %8s %12s %10s %14s %10s\n", "chain", "% P_ref", "optimum", "rotor", "rotor-release", "exact s");
    double worst_rotor = 1.0, worst_release = 1.0;
    for (const char* name : {"mlp-12", "transformer-block", "resnet-24"}) {
        remat::Chain chain = remat::io::load_chain(std::string(REMAT_SOURCE_DIR) + "/examples/problems/" + name + ".chain.json");
        chain.stages.resize(std::min<std::size_t>(chain.stages.size(), 8));
        chain.name += "[:8]";
        const remat::Problem problem = remat::to_problem(chain);
        const remat::Reference ref = remat::store_all_reference(problem);
        for (const double percent : {40.0, 50.0, 60.0, 70.0, 80.0, 90.0}) {
            const remat::Bytes budget = remat::percent_of(ref.peak, percent);
            const auto start = std::chrono::steady_clock::now();
            double optimum = 0.0;
            try {
                optimum = remat::Exhaustive{}.solve(problem, budget).time;
            } catch (const remat::Infeasible&) {
                continue;  // below the least peak of any schedule
            }
            const double exact_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const auto ratio = [&](const auto& solver, double& worst) -> std::string {
                try {
                    const double r = solver.solve(problem, budget).time / optimum;
                    worst = std::max(worst, r);
                    char text[32];
                    std::snprintf(text, sizeof text, "%.4f", r);
                    return text;
                } catch (const remat::Infeasible&) {
                    worst = std::max(worst, 99.0);
                    return "no plan";
                }
            };
            const std::string a = ratio(rotor, worst_rotor), b = ratio(release, worst_release);
            std::printf("%-20s %8.0f %12.6f %10s %14s %10.2f\n", chain.name.c_str(), percent, optimum, a.c_str(), b.c_str(),
                        exact_s);
        }
    }
    const bool pass = worst_release <= 1.01;
    std::printf("worst: rotor %.4f, rotor-release %.4f (target <= 1.01: %s)\n", worst_rotor, worst_release,
                pass ? "PASS" : "MISS");
    return pass;
}

}  // namespace

int main(int argc, char** argv) {
    int runs = 7;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--runs" && i + 1 < argc) {
            runs = std::max(1, std::atoi(argv[++i]));
        } else {
            std::fprintf(stderr, "usage: bench_rotor [--runs N]\n");
            return 2;
        }
    }
    const remat::Rotor rotor;  // 500 slots
    const remat::RotorRelease release;
    struct Row {
        std::size_t length;
        std::optional<double> rotor_target_ms;
        std::optional<double> release_target_ms;
    };
    const std::vector<Row> rows{{10, std::nullopt, std::nullopt},
                                {50, std::nullopt, std::nullopt},
                                {100, 50.0, 100.0},
                                {200, 500.0, 1000.0}};

    std::printf("Solve time, single thread, median of %d runs (ms); Rotor with 500 slots, RotorRelease with at least\n"
                "500 (more on short chains: RotorOptions::more_slots_for_short_chains)\n",
                runs);
    std::printf("budget = smallest feasible + 1/3 of the way to P_ref (the store-all peak)\n\n");
    std::printf("%6s %12s %12s %10s %8s %8s %14s %8s %8s %8s\n", "L", "budget MiB", "P_ref MiB", "rotor", "target",
                "result", "rotor-release", "target", "result", "ratio");
    bool all_pass = true;
    const auto verdict = [&](std::optional<double> target, double ms) -> const char* {
        if (!target) return "-";
        const bool pass = ms < *target;
        all_pass = all_pass && pass;
        return pass ? "PASS" : "MISS";
    };
    const auto target_text = [](std::optional<double> target) {
        return target ? std::to_string(static_cast<int>(*target)) : std::string("-");
    };
    for (const Row& row : rows) {
        const remat::Chain chain = heterogeneous_chain(row.length, 1000 + row.length);
        const remat::Problem problem = remat::to_problem(chain);
        const remat::Reference ref = remat::store_all_reference(problem);
        const remat::Bytes least = remat::rotor_smallest_budget(remat::to_rotor_chain(chain));
        const remat::Bytes budget = least + (ref.peak - least) / 3;
        std::vector<double> rotor_ms, release_ms;
        for (int r = 0; r < runs; ++r) {
            rotor_ms.push_back(solve_ms(rotor, chain, budget));
            release_ms.push_back(solve_ms(release, chain, budget));
        }
        const double a = median(rotor_ms), b = median(release_ms);
        std::printf("%6zu %12.1f %12.1f %10.2f %8s %8s %14.2f %8s %8s %7.1fx\n", row.length, budget / 1048576.0,
                    ref.peak / 1048576.0, a, target_text(row.rotor_target_ms).c_str(), verdict(row.rotor_target_ms, a), b,
                    target_text(row.release_target_ms).c_str(), verdict(row.release_target_ms, b), b / a);
    }

    std::printf("\nTime overhead over store-all (time / T_ref - 1), L = 50 and L = 100\n\n");
    std::printf("%6s %10s %12s %10s %14s %10s\n", "L", "% P_ref", "budget MiB", "rotor", "rotor-release", "periodic");
    for (const std::size_t length : {std::size_t{50}, std::size_t{100}}) {
        const remat::Chain chain = heterogeneous_chain(length, 1000 + length);
        const remat::Problem problem = remat::to_problem(chain);
        const remat::Reference ref = remat::store_all_reference(problem);
        for (const double percent : {10.0, 20.0, 30.0, 50.0, 75.0, 100.0}) {
            const remat::Bytes budget = remat::percent_of(ref.peak, percent);
            const auto overhead = [&](const auto& solver) -> std::string {
                try {
                    const remat::Plan plan = solver.solve(problem, budget);
                    char text[32];
                    std::snprintf(text, sizeof text, "%.1f%%", 100.0 * (plan.time / ref.time - 1.0));
                    return text;
                } catch (const remat::Infeasible&) {
                    return "infeasible";
                }
            };
            std::printf("%6zu %10.0f %12.1f %10s %14s %10s\n", length, percent, budget / 1048576.0,
                        overhead(rotor).c_str(), overhead(release).c_str(), overhead(remat::Periodic{}).c_str());
        }
    }
    all_pass = example_chains_against_optimum(rotor, release) && all_pass;
    std::printf("\n%s\n", all_pass ? "all targets met" : "some targets missed");
    return 0;
}
