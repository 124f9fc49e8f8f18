// bench_rotor — how long the Rotor DP (Beaumont et al. 2019) takes, and what it buys.
//
// Solve time of remat::Rotor with its default 500 memory slots on seeded heterogeneous
// chains of L = 10, 50, 100 and 200 stages (median of several single-threaded runs), against
// the targets of the issue (L = 100 under 50 ms, L = 200 under 0.5 s), then the time
// overhead over store-all of Rotor and Periodic at a few budgets.
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

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
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
    struct Row {
        std::size_t length;
        std::optional<double> target_ms;
    };
    const std::vector<Row> rows{{10, std::nullopt}, {50, std::nullopt}, {100, 50.0}, {200, 500.0}};

    std::printf("Rotor solve time, 500 slots, single thread, median of %d runs\n", runs);
    std::printf("budget = smallest feasible + 1/3 of the way to P_ref (the store-all peak)\n\n");
    std::printf("%6s %12s %12s %10s %10s %10s %10s %8s\n", "L", "budget MiB", "P_ref MiB", "min ms", "median ms",
                "max ms", "target ms", "result");
    bool all_pass = true;
    for (const Row& row : rows) {
        const remat::Chain chain = heterogeneous_chain(row.length, 1000 + row.length);
        const remat::Problem problem = remat::to_problem(chain);
        const remat::Reference ref = remat::store_all_reference(problem);
        const remat::Bytes least = remat::rotor_smallest_budget(remat::to_rotor_chain(chain));
        const remat::Bytes budget = least + (ref.peak - least) / 3;
        std::vector<double> ms;
        for (int r = 0; r < runs; ++r) {
            const auto start = std::chrono::steady_clock::now();
            const remat::Plan plan = rotor.solve(chain, budget);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
            if (plan.peak > budget) return 1;  // make_checked_plan already guarantees this
        }
        const double med = median(ms);
        const bool pass = !row.target_ms || med < *row.target_ms;
        all_pass = all_pass && pass;
        std::printf("%6zu %12.1f %12.1f %10.2f %10.2f %10.2f %10s %8s\n", row.length, budget / 1048576.0,
                    ref.peak / 1048576.0, *std::min_element(ms.begin(), ms.end()), med,
                    *std::max_element(ms.begin(), ms.end()),
                    row.target_ms ? std::to_string(static_cast<int>(*row.target_ms)).c_str() : "-",
                    row.target_ms ? (pass ? "PASS" : "MISS") : "-");
    }

    std::printf("\nTime overhead over store-all (time / T_ref - 1), L = 50 and L = 100\n\n");
    std::printf("%6s %10s %12s %10s %10s\n", "L", "% P_ref", "budget MiB", "rotor", "periodic");
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
            std::printf("%6zu %10.0f %12.1f %10s %10s\n", length, percent, budget / 1048576.0,
                        overhead(rotor).c_str(), overhead(remat::Periodic{}).c_str());
        }
    }
    std::printf("\n%s\n", all_pass ? "all targets met" : "some targets missed");
    return 0;
}
