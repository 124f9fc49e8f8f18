// demo — trains a 26-stage chain MLP (Linear, BatchNorm, ReLU, Dropout blocks) on synthetic
// data on the CPU, plain and through remat's checkpointed module at 100 %, 50 % and 30 % of
// its store-all activation peak, and prints for each budget the predicted and measured
// activation peak, the step time, the overhead versus plain LibTorch, and whether the
// losses equal plain training's step by step.
//
//   demo [--blocks N] [--batch N] [--steps N] [--solver rotor|periodic] [--chain-out FILE]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/periodic.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/torch/module.hpp>

#include "demo_model.hpp"

namespace rt = remat::torch;

namespace {

struct Options {
    remat_demo::Config config;
    int steps = 6;
    std::string solver = "rotor";
    std::string chain_out;
};

[[noreturn]] void usage(int code) {
    std::cout << "usage: demo [--blocks N] [--batch N] [--steps N] [--solver rotor|periodic] [--chain-out FILE]\n"
                 "Trains a chain MLP plainly and under 100 %, 50 % and 30 % of its store-all activation peak.\n";
    std::exit(code);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::cerr << "demo: " << arg << " needs a value\n";
                usage(2);
            }
            return argv[++i];
        };
        const auto number = [&]() {
            const std::string v = value();
            char* end = nullptr;
            const long n = std::strtol(v.c_str(), &end, 10);
            if (end == v.c_str() || *end != '\0' || n <= 0) {
                std::cerr << "demo: " << arg << " needs a positive integer, not '" << v << "'\n";
                usage(2);
            }
            return n;
        };
        if (arg == "--help" || arg == "-h") usage(0);
        else if (arg == "--blocks") o.config.blocks = static_cast<int>(number());
        else if (arg == "--batch") o.config.batch = number();
        else if (arg == "--steps") o.steps = static_cast<int>(std::max(2L, number()));
        else if (arg == "--solver") o.solver = value();
        else if (arg == "--chain-out") o.chain_out = value();
        else {
            std::cerr << "demo: unknown option '" << arg << "'\n";
            usage(2);
        }
    }
    if (o.solver != "rotor" && o.solver != "periodic") {
        std::cerr << "demo: --solver must be rotor or periodic\n";
        usage(2);
    }
    return o;
}

struct Run {
    std::vector<float> losses;
    std::vector<double> seconds;
    std::vector<remat::Bytes> peaks;  // activation peak per step
    [[nodiscard]] double step_seconds() const {  // median, the first (warm-up) step left out
        std::vector<double> s(seconds.begin() + 1, seconds.end());
        std::sort(s.begin(), s.end());
        return s[s.size() / 2];
    }
    [[nodiscard]] remat::Bytes peak() const { return *std::max_element(peaks.begin() + 1, peaks.end()); }
};

void zero_grads(const torch::nn::Sequential& model) {
    // In place, as LibTorch 1.x's zero_grad() does: the gradients stay allocated, so a
    // step's peak is its activations (and the transient gradient buffers) only.
    for (auto& p : model->parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
}

/// One training step (forward, loss, backward, SGD step); returns its loss, time and
/// activation peak (probe: the peak during forward and backward relative to the start,
/// plus the input's bytes, as the simulator counts it).
template <class Forward>
void step(const torch::nn::Sequential& model, torch::optim::SGD& optimizer, const remat_demo::Batch& b,
          std::uint64_t seed, Forward&& forward, Run& run) {
    torch::manual_seed(seed);
    rt::CpuMemoryProbe probe;
    const auto start = std::chrono::steady_clock::now();
    const remat::Bytes before = probe.current();
    probe.reset_peak();
    const at::Tensor loss = torch::nn::functional::cross_entropy(forward(b.x), b.y);
    loss.backward();
    run.peaks.push_back(probe.peak() - before + static_cast<remat::Bytes>(b.x.nbytes()));
    optimizer.step();
    zero_grads(model);
    run.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    run.losses.push_back(loss.item<float>());
}

std::string percent(double fraction) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%+.1f %%", fraction * 100);
    return buffer;
}

std::string milliseconds(double seconds) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.0f ms", seconds * 1e3);
    return buffer;
}

template <class S>
int run_demo(const Options& o, S solver) {
    const remat_demo::Config& c = o.config;
    auto initial = remat_demo::make_model(c);
    initial->train();

    std::cout << "remat demo: a " << c.blocks + 2 << "-stage chain MLP (Linear, BatchNorm1d, ReLU, Dropout "
              << c.dropout << " blocks, widths 160-320), batch " << c.batch << ", " << o.steps
              << " SGD steps on synthetic data, CPU, 1 thread\n\n";

    // Plain LibTorch and the same model behind remat, trained side by side from the same
    // initial state, step by step, so that the time comparison sees the same machine load.
    auto plain = remat_demo::copy_of(initial);
    auto model = remat_demo::copy_of(initial);
    rt::CheckpointOptions options;
    options.profile.name = "demo-mlp";
    options.profile.repeats = 5;
    options.profile.warmup = 1;
    const auto profile_start = std::chrono::steady_clock::now();
    auto m = rt::checkpoint(remat_demo::stages_of(model), remat_demo::batch(c, 0).x, rt::budget_percent(100), solver,
                            options);
    const double profile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - profile_start).count();
    std::printf("profiled %zu stages in %.1f s; store-all activation peak %s (predicted)\n", m->chain().length(),
                profile_seconds, remat::format_bytes(m->store_all_peak()).c_str());
    if (!o.chain_out.empty()) {
        remat::io::write_file(o.chain_out, remat::io::to_json(m->chain()));
        std::cout << "wrote the profiled chain to " << o.chain_out << " (try: remat-plan " << o.chain_out
                  << " --budget 30% --solver rotor --sweep 8)\n";
    }
    std::cout << '\n';

    std::printf("%-15s %10s %10s %10s %9s %9s %9s %10s  %s\n", "run", "budget", "predicted", "measured", "step",
                "plain", "overhead", "(planned)", "losses vs plain, step by step");
    bool all_match = true;
    Run first_plain;
    for (const double budget_percent : {100.0, 50.0, 30.0}) {
        remat_demo::load_state(model, initial);
        remat_demo::load_state(plain, initial);
        const std::string name = std::string(solver.name()) + " " + std::to_string(int(budget_percent)) + "%";
        try {
            m->replan(rt::budget_percent(budget_percent));
        } catch (const remat::Infeasible& e) {
            std::printf("%-15s %10s  infeasible: needs at least %s\n", name.c_str(),
                        remat::format_bytes(remat::percent_of(m->store_all_peak(), budget_percent)).c_str(),
                        remat::format_bytes(e.smallest_budget().value_or(0)).c_str());
            continue;
        }
        torch::optim::SGD plain_optimizer(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        Run reference, run;
        for (int s = 0; s < o.steps; ++s) {
            const remat_demo::Batch b = remat_demo::batch(c, s);
            const std::uint64_t seed = remat_demo::dropout_seed(c, s);
            step(plain, plain_optimizer, b, seed, [&](const at::Tensor& x) { return plain->forward(x); }, reference);
            step(model, optimizer, b, seed, [&](const at::Tensor& x) { return m->forward(x); }, run);
            run.peaks.back() = m->last_report().measured_peak;  // the executor's own measure, op by op
        }
        if (first_plain.losses.empty()) {
            first_plain = reference;
            std::printf("%-15s %10s %10s %10s %9s %9s %9s %10s  %s\n", "plain LibTorch", "-", "-",
                        remat::format_bytes(reference.peak()).c_str(), milliseconds(reference.step_seconds()).c_str(),
                        "", "", "", "");
        }
        std::size_t identical = 0;
        double worst = 0;
        for (std::size_t s = 0; s < run.losses.size(); ++s) {
            identical += run.losses[s] == reference.losses[s] ? 1 : 0;
            worst = std::max(worst, std::abs(double(run.losses[s]) - reference.losses[s]));
        }
        all_match = all_match && identical == run.losses.size();
        const std::string match = std::to_string(identical) + "/" + std::to_string(run.losses.size()) + " identical" +
                                  (identical == run.losses.size() ? "" : ", max diff " + std::to_string(worst));
        const double planned = m->plan().time / m->store_all_time() - 1;
        std::printf("%-15s %10s %10s %10s %9s %9s %9s %10s  %s\n", name.c_str(), remat::format_bytes(m->budget()).c_str(),
                    remat::format_bytes(m->executable_plan().predicted_peak()).c_str(), remat::format_bytes(run.peak()).c_str(),
                    milliseconds(run.step_seconds()).c_str(), milliseconds(reference.step_seconds()).c_str(),
                    percent(run.step_seconds() / reference.step_seconds() - 1).c_str(), percent(planned).c_str(),
                    match.c_str());
    }
    const Run& reference = first_plain;
    std::cout << "\nlosses per step (plain):";
    for (const float l : reference.losses) std::cout << ' ' << l;
    std::cout << "\n\npredicted: the simulator's activation peak for the plan, on the profiled problem. measured: the\n"
                 "tracking allocator's peak during the step relative to its start (parameters and gradients\n"
                 "excluded). step / plain: median step times of the two models trained side by side from the\n"
                 "same state. (planned): the plan's own time estimate versus store-all.\n";
    return all_match ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    at::set_num_threads(1);
    const rt::CpuMemoryProbe probe;  // installed before any tensor is made
    try {
        return o.solver == "rotor" ? run_demo(o, remat::Rotor{}) : run_demo(o, remat::Periodic{});
    } catch (const remat::Error& e) {
        std::cerr << "demo: " << e.what() << '\n';
        return 3;
    }
}
