// bench_executor — the chain executor on the demo model (CPU, one thread).
//
// Rows: plain LibTorch training steps; the executor running the store-all plan (target:
// step time ≤ 1.03 × plain, paired by round, and activation peak ≤ 1.02 × plain); the drop-in module with the
// store-all plan; and Periodic (best segment length that fits) and Rotor at 50 % and 30 %
// of the store-all peak. Every round runs one step of every row, in a rotating order, on
// the same batch, so that machine load hits all rows alike; times are medians (and
// minima) over the rounds after a warm-up round.
//
//   bench_executor [--rounds N] [--blocks N] [--batch N]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/periodic.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/torch/executor.hpp>
#include <remat/torch/module.hpp>
#include <remat/torch/profile.hpp>

#include "demo_model.hpp"

namespace rt = remat::torch;

namespace {

struct Row {
    std::string name;
    remat::Bytes budget = 0;     // 0: none
    remat::Bytes predicted = 0;  // 0: not planned
    double planned_time = 0;     // plan time / T_ref
    std::function<remat::Bytes(const remat_demo::Batch&)> step;  // runs a step, returns its activation peak
    std::vector<double> seconds;
    std::vector<remat::Bytes> peaks;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& y) { return torch::nn::functional::cross_entropy(out, y); }

void clear_grads(const torch::nn::Sequential& model) {
    for (auto& p : model->parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
}

}  // namespace

int main(int argc, char** argv) {
    remat_demo::Config config;
    int rounds = 15;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (i + 1 < argc && (arg == "--rounds" || arg == "--blocks" || arg == "--batch")) {
            const long n = std::strtol(argv[++i], nullptr, 10);
            if (n <= 0) {
                std::cerr << "bench_executor: " << arg << " needs a positive integer\n";
                return 2;
            }
            if (arg == "--rounds") rounds = static_cast<int>(n);
            if (arg == "--blocks") config.blocks = static_cast<int>(n);
            if (arg == "--batch") config.batch = n;
        } else {
            std::cerr << "usage: bench_executor [--rounds N] [--blocks N] [--batch N]\n";
            return 2;
        }
    }
    at::set_num_threads(1);
    rt::CpuMemoryProbe probe;
    auto model = remat_demo::make_model(config);
    model->train();
    const rt::StageList stages = remat_demo::stages_of(model);
    const at::Tensor sample = remat_demo::batch(config, 0).x;

    rt::ProfileOptions profile_options;
    profile_options.name = "demo-mlp";
    rt::ChainExecutor<> executor(stages, rt::profile_chain(stages, sample, profile_options));
    const remat::Problem& problem = executor.problem();
    const remat::Reference reference = remat::store_all_reference(problem);
    const std::size_t L = executor.chain().length();

    std::printf("bench_executor: demo model, %zu stages, batch %lld, CPU, 1 thread, %d rounds (+1 warm-up)\n",
                L, static_cast<long long>(config.batch), rounds);
    std::printf("store-all reference: T_ref %.1f ms (profiled), P_ref %s\n\n", reference.time * 1e3,
                remat::format_bytes(reference.peak).c_str());

    std::vector<Row> rows;
    // Plain LibTorch: the activation peak is the probe's peak over forward and backward
    // relative to the start, plus the input, as the simulator counts it.
    rows.push_back({"plain LibTorch", 0, 0, 0, [&](const remat_demo::Batch& b) {
                        const remat::Bytes before = probe.current();
                        probe.reset_peak();
                        cross_entropy(model->forward(b.x), b.y).backward();
                        return probe.peak() - before + static_cast<remat::Bytes>(b.x.nbytes());
                    }, {}, {}});
    const auto executor_row = [&](std::string name, remat::Plan plan) {
        const rt::ExecutablePlan executable = executor.prepare(plan);
        rows.push_back({std::move(name), plan.budget, executable.predicted_peak(),
                        executable.predicted_time() / reference.time, [&, executable](const remat_demo::Batch& b) {
                            const rt::StepResult r = executor.step(
                                executable, b.x, [&](const at::Tensor& out) { return cross_entropy(out, b.y); });
                            return r.report.measured_peak;
                        }, {}, {}});
    };
    executor_row("executor store-all", remat::StoreAll{}.solve(problem, reference.peak));

    // The drop-in module (its own profile; the store-all plan does not depend on times).
    rt::CheckpointOptions module_options;
    module_options.profile.repeats = 3;
    auto module = rt::checkpoint(stages, sample, rt::budget_percent(100), remat::StoreAll{}, module_options);
    rows.push_back({"module store-all", module->budget(), module->executable_plan().predicted_peak(), 1.0, [&](const remat_demo::Batch& b) {
                        cross_entropy(module->forward(b.x), b.y).backward();
                        return module->last_report().measured_peak;
                    }, {}, {}});

    for (const double percent : {50.0, 30.0}) {
        const remat::Bytes budget = remat::percent_of(reference.peak, percent);
        const std::string tag = " " + std::to_string(int(percent)) + "%";
        // Periodic: the fastest segment length whose plan fits.
        std::optional<remat::Plan> best;
        std::size_t best_k = 0;
        for (std::size_t k = 1; k <= L; ++k) {
            try {
                remat::Plan p = remat::Periodic{k}.solve(problem, budget);
                if (!best || p.time < best->time) {
                    best = std::move(p);
                    best_k = k;
                }
            } catch (const remat::Infeasible&) {
            }
        }
        if (best)
            executor_row("periodic k=" + std::to_string(best_k) + tag, std::move(*best));
        else
            std::printf("periodic%s: no segment length fits %s\n", tag.c_str(), remat::format_bytes(budget).c_str());
        try {
            executor_row("rotor" + tag, remat::Rotor{}.solve(problem, budget));
        } catch (const remat::Infeasible& e) {
            std::printf("rotor%s: infeasible (smallest %s)\n", tag.c_str(),
                        remat::format_bytes(e.smallest_budget().value_or(0)).c_str());
        }
    }

    for (int round = 0; round <= rounds; ++round) {
        const remat_demo::Batch b = remat_demo::batch(config, round);
        for (std::size_t k = 0; k < rows.size(); ++k) {
            Row& row = rows[(k + static_cast<std::size_t>(round)) % rows.size()];
            torch::manual_seed(remat_demo::dropout_seed(config, round));
            const auto start = std::chrono::steady_clock::now();
            const remat::Bytes peak = row.step(b);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            clear_grads(model);
            if (round == 0) continue;  // warm-up
            row.seconds.push_back(seconds);
            row.peaks.push_back(peak);
        }
    }

    const Row& plain = rows.front();
    const double plain_median = median(plain.seconds);
    const remat::Bytes plain_peak = *std::max_element(plain.peaks.begin(), plain.peaks.end());
    std::printf("%-22s %10s %10s %10s %10s %10s %10s %9s %10s\n", "row", "budget", "predicted", "measured", "median",
                "time/plain", "paired", "planned", "peak/plain");
    double store_all_paired = 0.0, store_all_peak = 0.0;
    for (const Row& row : rows) {
        // Paired: the median over rounds of this row's time over plain's in the same round,
        // which cancels load that changes from round to round.
        std::vector<double> ratios;
        for (std::size_t r = 0; r < row.seconds.size(); ++r) ratios.push_back(row.seconds[r] / plain.seconds[r]);
        const remat::Bytes peak = *std::max_element(row.peaks.begin(), row.peaks.end());
        char planned[16] = "-";
        if (row.planned_time > 0) std::snprintf(planned, sizeof planned, "%.3f", row.planned_time);
        if (row.name == "executor store-all") {
            store_all_paired = median(ratios);
            store_all_peak = double(peak) / double(plain_peak);
        }
        std::printf("%-22s %10s %10s %10s %7.1f ms %10.3f %10.3f %9s %10.3f\n", row.name.c_str(),
                    row.budget ? remat::format_bytes(row.budget).c_str() : "-",
                    row.predicted ? remat::format_bytes(row.predicted).c_str() : "-",
                    remat::format_bytes(peak).c_str(), median(row.seconds) * 1e3, median(row.seconds) / plain_median,
                    median(ratios), planned, double(peak) / double(plain_peak));
    }
    std::printf("\ntargets: executor store-all paired time <= 1.03 and peak/plain <= 1.02: %.3f and %.3f, %s\n",
                store_all_paired, store_all_peak, store_all_paired <= 1.03 && store_all_peak <= 1.02 ? "met" : "MISSED");
    std::printf("time/plain: ratio of median step times (forward, loss, backward); paired: median over rounds of the\n"
                "ratio to plain's step in the same round; planned: the plan's predicted time / T_ref; measured:\n"
                "activation peak (parameters and gradients excluded), the executor's own op-by-op measure for its rows.\n");
    return 0;
}
