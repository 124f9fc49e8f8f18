// bench_greedy — the greedy planner (solvers/greedy.hpp: a static replay in the spirit of DTR,
// Kirisame et al., ICLR 2021) on generated GPT-2-like op-level problems of about 200, 1,000 and
// 2,500 ops (tests/support/op_level_problems.hpp). For budgets from 20 to 100 % of the
// store-all peak P_ref it prints, for each eviction rule, the time overhead of the plan
// (time / T_ref − 1, simulated: docs/formats.md §3) and the solve time, and first the smallest
// budget each rule fits with the time its bisection took. "-" means the rule does not fit.
//
//   bench_greedy [LAYERS...]     (defaults: 5 24 60)
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/solvers/greedy.hpp>

#include "../tests/support/op_level_problems.hpp"

using namespace remat;

namespace {

constexpr GreedyEviction rules[] = {GreedyEviction::dtr, GreedyEviction::farthest_next_use, GreedyEviction::both};

Greedy with_rule(GreedyEviction rule) {
    GreedyOptions options;
    options.eviction = rule;
    return Greedy(options);
}

struct Cell {
    std::optional<double> overhead;  // time / T_ref - 1
    double seconds = 0.0;
};

std::string show(const Cell& c) {
    char s[48];
    if (c.overhead)
        std::snprintf(s, sizeof s, "%6.1f %% %7.1f ms", 100.0 * *c.overhead, 1e3 * c.seconds);
    else
        std::snprintf(s, sizeof s, "%8s %7.1f ms", "-", 1e3 * c.seconds);
    return s;
}

void bench(std::size_t layers) {
    testing::TransformerShape shape;
    shape.layers = layers;
    const Problem p = testing::transformer_like(shape, "gpt-" + std::to_string(layers));
    const Reference ref = store_all_reference(p);
    std::printf("\n%s: %zu ops, %zu data, P_ref %.0f MiB, lower bound %.1f %% of P_ref (%s)\n", p.name().c_str(),
                p.op_count(), p.data_count(), static_cast<double>(ref.peak) / (1 << 20),
                100.0 * static_cast<double>(memory_lower_bound(p).bytes) / static_cast<double>(ref.peak),
                memory_lower_bound(p).reason.c_str());
    std::printf("%-10s", "budget");
    for (const GreedyEviction rule : rules) std::printf(" | %-19s", std::string(to_string(rule)).c_str());
    std::printf("\n");
    std::vector<Bytes> smallest;
    std::printf("%-10s", "smallest");
    for (const GreedyEviction rule : rules) {
        const Stopwatch clock;
        smallest.push_back(with_rule(rule).smallest_budget(p));
        const double percent = 100.0 * static_cast<double>(smallest.back()) / static_cast<double>(ref.peak);
        std::printf(" | %6.1f %% %7.1f ms", percent, 1e3 * clock.seconds());
    }
    std::printf("\n");
    for (int percent = 20; percent <= 100; percent += 10) {
        const Bytes budget = percent_of(ref.peak, percent);
        std::printf("%8d %%", percent);
        for (std::size_t r = 0; r < std::size(rules); ++r) {
            Cell cell;
            if (budget >= smallest[r]) {  // below, solve() would only bisect to say so
                const Stopwatch clock;
                const Plan plan = with_rule(rules[r]).solve(p, budget);
                cell.seconds = clock.seconds();
                cell.overhead = plan.time / ref.time - 1.0;
            }
            std::printf(" | %s", show(cell).c_str());
        }
        std::printf("\n");
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::size_t> layers;
    for (int i = 1; i < argc; ++i) {
        const int n = std::atoi(argv[i]);
        if (n <= 0) {
            std::fprintf(stderr, "usage: bench_greedy [LAYERS...]  (positive layer counts; default 5 24 60)\n");
            return 2;
        }
        layers.push_back(static_cast<std::size_t>(n));
    }
    if (layers.empty()) layers = {5, 24, 60};
    std::printf("greedy planner on GPT-2-like op-level problems: overhead = time / T_ref - 1 (simulated), and solve time\n");
    for (const std::size_t l : layers) bench(l);
    return 0;
}
