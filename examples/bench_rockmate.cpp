// bench_rockmate — Rockmate (Zhao et al., ICML 2023) on a generated GPT-2-like op-level
// problem, against two baselines planned on the same blocks: checkpointing every block (what
// torch.utils.checkpoint applied per block gives) and Rotor over the blocks with each block's
// store-all sub-schedule as its only option. For budgets from the smallest one Rockmate can
// plan for up to 100 % of the store-all peak it prints the time overhead of each (simulated,
// docs/formats.md §3) and the solve times.
//
//   bench_rockmate [LAYERS] [GRID]     (defaults: 12 layers, an 8 × 8 grid per block)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#ifdef REMAT_WITH_LPSOLVE
#include <remat/solvers/rockmate_milp.hpp>
#endif

#include "../tests/support/op_level_problems.hpp"

using namespace remat;

namespace {

#ifdef REMAT_WITH_LPSOLVE
using Planner = RockmateMilp<>;
constexpr const char* planner_name = "exhaustive, then checkmate/lp_solve";
#else
using Planner = Rockmate<>;
constexpr const char* planner_name = "exhaustive";
#endif

// torch.utils.checkpoint on every block: forward without grad keeping every block input,
// then each block from the last recomputed with grad (its store-all option) and back-propagated.
std::vector<RotorAction> checkpoint_every_block(std::size_t blocks) {
    using K = RotorAction::Kind;
    std::vector<RotorAction> a;
    for (std::size_t l = 1; l < blocks; ++l) a.push_back({K::forward_nograd, l, 0});
    for (std::size_t l = blocks; l >= 1; --l) {
        if (l < blocks) a.push_back({K::free_activation, l, 0});
        a.push_back({K::forward, l, 0});
        if (l == blocks) a.push_back({K::loss, 0, 0});
        a.push_back({K::backward, l, 0});
    }
    return a;
}

std::string mib(Bytes b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.0f", static_cast<double>(b) / (1 << 20));
    return s;
}

std::string overhead(std::optional<double> time, double reference) {
    if (!time) return "-";
    char s[32];
    std::snprintf(s, sizeof s, "%.1f %%", 100.0 * (*time / reference - 1.0));
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    testing::TransformerShape shape;
    if (argc > 1) shape.layers = static_cast<std::size_t>(std::atoi(argv[1]));
    const std::size_t grid = argc > 2 ? static_cast<std::size_t>(std::atoi(argv[2])) : RockmateOptions{}.peak_budgets;
    const Problem p = testing::transformer_like(shape, "gpt-" + std::to_string(shape.layers));
    const Reference ref = store_all_reference(p);

    RockmateOptions options;
    options.peak_budgets = grid;
    options.saved_budgets = grid;
    const Planner rockmate(options);
    RockmateOptions only = options;
    only.store_all_only = true;
    const Planner rotor_blocks(only);

    auto start = std::chrono::steady_clock::now();
    const RockmateModel model = rockmate.analyse(p);
    const double analyse_seconds = seconds_since(start);
    start = std::chrono::steady_clock::now();
    const RockmateModel blocks_model = rotor_blocks.analyse(p);
    const double blocks_analyse_seconds = seconds_since(start);

    std::size_t unique = 0, options_total = 0, solves = 0;
    for (const RockmateBlock& b : model.blocks) {
        options_total += b.options.size();
        if (!b.same_as) {
            ++unique;
            solves += b.solves + b.failed_solves;
        }
    }
    const std::vector<RotorAction> periodic_actions = checkpoint_every_block(blocks_model.blocks.size());
    const RotorEvaluation periodic = rotor_evaluate(blocks_model.rotor_chain(), periodic_actions);
    const SimulationReport periodic_sim = simulate(p, blocks_model.to_schedule(periodic_actions));
    if (!periodic_sim.valid || periodic_sim.peak != periodic.peak) {
        std::fprintf(stderr, "checkpoint-every-block schedule: %s\n", periodic_sim.error.c_str());
        return 1;
    }

    std::printf("problem %s: %zu ops, %zu data; T_ref %.4f, P_ref %s MiB\n", p.name().c_str(), p.op_count(),
                p.data_count(), ref.time, mib(ref.peak).c_str());
    std::printf("blocks: %zu (%zu solved, the rest identical), %zu options in all, %zu block solves (%s), grid %zux%zu\n",
                model.blocks.size(), unique, options_total, solves, planner_name, grid, grid);
    std::printf("analysis: rockmate %.2f s, rotor over blocks %.2f s\n\n", analyse_seconds, blocks_analyse_seconds);

    const Bytes least = rockmate.smallest_budget(model);
    const Bytes least_blocks = rotor_blocks.smallest_budget(blocks_model);
    std::printf("smallest budget: rockmate %s MiB (%.1f %% of P_ref), rotor over blocks %s MiB (%.1f %%); "
                "checkpoint every block peaks at %s MiB (%.1f %%)\n\n",
                mib(least).c_str(), 100.0 * double(least) / double(ref.peak), mib(least_blocks).c_str(),
                100.0 * double(least_blocks) / double(ref.peak), mib(periodic.peak).c_str(),
                100.0 * double(periodic.peak) / double(ref.peak));

    std::printf("| budget | %% of P_ref | checkpoint every block | rotor over blocks | rockmate | rockmate peak | DP s (rotor/rockmate) |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    const int steps = 12;
    for (int i = 0; i <= steps; ++i) {
        const Bytes budget = least + (ref.peak - least) * i / steps;
        std::optional<double> t_periodic, t_blocks, t_rockmate;
        Bytes rockmate_peak = 0;
        double dp_blocks = 0.0, dp_rockmate = 0.0;
        if (periodic.peak <= budget) t_periodic = periodic.time;
        try {
            const Plan plan = rotor_blocks.solve(blocks_model, budget);
            t_blocks = plan.time;
            dp_blocks = plan.stats.solve_seconds;
        } catch (const Infeasible&) {
        }
        const Plan plan = rockmate.solve(model, budget);
        t_rockmate = plan.time;
        rockmate_peak = plan.peak;
        dp_rockmate = plan.stats.solve_seconds;
        std::printf("| %s MiB | %.1f | %s | %s | %s | %s MiB | %.3f / %.3f |\n", mib(budget).c_str(),
                    100.0 * double(budget) / double(ref.peak), overhead(t_periodic, ref.time).c_str(),
                    overhead(t_blocks, ref.time).c_str(), overhead(t_rockmate, ref.time).c_str(),
                    mib(rockmate_peak).c_str(), dp_blocks, dp_rockmate);
    }
    return 0;
}
