// bench_models — whole models captured from TorchScript, planned at a range of budgets and
// run on the CPU: a GPT-2-like model (12 layers) and a ResNet-like network, each at a size
// that steps in about a second with one thread.
//
// For budgets from the smallest Rockmate can plan to 100 % of the store-all peak, the table
// gives, for each plan, the predicted and measured activation peak and the step-time
// overhead versus the store-all plan (predicted by the simulator / measured: the fastest of
// the timed steps, in thread CPU time) for:
//   store-all           the framework's own order, no recomputation (the 100 % row);
//   periodic            every block checkpointed: its input kept, its forward run again with
//                       autograd before its backward (what torch.utils.checkpoint gives);
//   rotor over blocks   Rotor's optimal persistent schedule with each block one stage
//                       (Rockmate with only the store-all option per block);
//   rockmate            Rockmate (Zhao et al., ICML 2023): per-block options from exact block
//                       solves, multi-option Rotor across blocks;
// and the solve time of each. Step times are measured within this run only (docs/design.md §8, LibTorch notes).
//
// With --device cuda (a LibTorch with CUDA, and a GPU) the models run on the GPU at GPU sizes
// (a GPT-2-small-like model: 12 layers, d = 768, 12 heads, 512 tokens, batch 8, vocabulary
// 50257; ResNet-50 on 224x224 images, batch 32): peaks
// come from the caching allocator (allocated bytes) and step times from the wall clock after
// a device synchronisation, and the plain LibTorch step is the reference of the overheads.
//
//   bench_models [--quick] [--steps N] [--model gpt|resnet|both] [--layers N] [--device cpu|cuda]
#include <time.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/solvers/rockmate.hpp>
#include <remat/solvers/store_all.hpp>
#include <remat/torch/graph_executor.hpp>
#include <remat/torch/memory.hpp>
#include <remat/torch/script.hpp>

#include "models.hpp"

namespace {

using remat::Bytes;
using Clock = std::chrono::steady_clock;
using Loss = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The device the models run on; CUDA only where LibTorch has it.
bool on_cuda = false;  // set once by main() from --device, before any step

// Step times: on the CPU this thread's CPU time (one intra-op thread: other processes on a
// shared machine then disturb them far less than the wall clock); on CUDA the wall clock,
// after waiting for the queued kernels.
double step_clock() {
    if (on_cuda) {
        remat::torch::detail::synchronize(c10::Device(c10::DeviceType::CUDA));
        return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    }
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Options {
    bool quick = false;
    int steps = 3;
    std::string model = "both";
    std::int64_t layers = 12;
    std::string device = "cpu";
};

struct Measured {
    Bytes predicted_peak = 0;
    Bytes measured_peak = 0;
    double predicted_time = 0.0;
    double seconds = 0.0;   // fastest timed step (step_clock)
    double overhead = 0.0;  // versus the store-all steps interleaved with it
};

struct Workload {
    std::string title;
    torch::jit::Module module;
    std::vector<at::Tensor> inputs;
    Loss loss;
};

// Runs `plan` `steps` times, each timed step right after a timed step of `reference` (the
// store-all plan), so that both see the same machine: the overhead is the ratio of the
// fastest of each. One untimed step of each first.
template <class Probe>
Measured run(const remat::torch::ScriptExecutor<Probe>& ex, const remat::Plan& plan, const remat::Plan& reference,
             const Workload& w, int steps, bool time_each_op = false) {
    const auto prepared = ex.prepare(plan);
    const auto prepared_reference = ex.prepare(reference);
    Measured m;
    m.predicted_peak = prepared.predicted_peak();
    m.predicted_time = prepared.predicted_time();
    double best = 1e300, best_reference = 1e300;
    const auto timed = [&](const remat::torch::ScriptPlan& p, Bytes* peak) {
        const double t0 = step_clock();
        const auto result = ex.step(p, w.inputs, w.loss, time_each_op && peak != nullptr);
        const double t = step_clock() - t0;
        if (peak != nullptr) *peak = std::max(*peak, result.report.measured_peak);
        for (const at::Tensor& param : ex.parameters()) param.mutable_grad() = at::Tensor();
        return t;
    };
    for (int s = 0; s < steps + 1; ++s) {
        const double r = timed(prepared_reference, nullptr);
        const double t = timed(prepared, &m.measured_peak);
        if (s == 0) continue;
        best_reference = std::min(best_reference, r);
        best = std::min(best, t);
    }
    m.seconds = best;
    m.overhead = best / best_reference - 1.0;
    return m;
}

double plain_step_seconds(Workload& w, const std::vector<at::Tensor>& parameters, int steps) {
    double best = 1e300;
    for (int s = 0; s < steps + 3; ++s) {  // the TorchScript executor optimizes after its first runs
        const double t0 = step_clock();
        const c10::IValue out = w.module.forward(std::vector<c10::IValue>(w.inputs.begin(), w.inputs.end()));
        w.loss({out.toTensor()}).backward();
        if (s >= 3) best = std::min(best, step_clock() - t0);
        for (const at::Tensor& p : parameters) p.mutable_grad() = at::Tensor();
    }
    return best;
}

// Every block checkpointed: forward without grad block by block (each block's input is kept),
// then, from the last block, its forward again with autograd and its backward.
remat::Plan periodic_plan(const remat::RockmateModel& model) {
    using K = remat::RotorAction::Kind;
    const std::size_t n = model.blocks.size();
    std::vector<remat::RotorAction> actions;
    for (std::size_t l = 1; l < n; ++l) actions.push_back({K::forward_nograd, l, 0});
    actions.push_back({K::forward, n, 0});
    actions.push_back({K::loss, 0, 0});
    actions.push_back({K::backward, n, 0});
    for (std::size_t l = n - 1; l >= 1; --l) {
        actions.push_back({K::free_activation, l, 0});
        actions.push_back({K::forward, l, 0});
        actions.push_back({K::backward, l, 0});
    }
    const remat::Schedule schedule = model.to_schedule(actions);
    const remat::SimulationReport r = remat::simulate(model.problem, schedule);
    if (!r.valid) throw remat::SolverError("periodic plan is not valid: " + r.error);
    remat::SolverStats stats;
    stats.solver = "periodic";
    return remat::make_checked_plan(model.problem, schedule, r.peak, stats);
}

std::string mib(Bytes b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", double(b) / (1024.0 * 1024.0));
    return buf;
}

std::string pct(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * v);
    return buf;
}

template <class Probe>
void bench(Workload w, const Options& o, Probe probe) {
    std::cout << "\n=== " << w.title << " ===\n";
    remat::torch::CaptureOptions co;
    co.name = w.title;
    co.repeats = o.quick ? 1 : 3;
    co.warmup = 1;
    auto t0 = Clock::now();
    const remat::torch::ScriptCapture cap = remat::torch::capture_script(w.module, w.inputs, co, probe);
    const double capture_seconds = seconds_since(t0);
    const remat::Problem& p = cap.problem();
    remat::torch::ScriptExecutor<Probe> ex(cap, probe);
    std::cout << "capture: " << cap.ops().size() << " op groups, " << p.op_count() << " ops, " << p.data_count()
              << " data, in " << capture_seconds << " s\n";

    // Plans.
    t0 = Clock::now();
    const remat::Plan store_all = remat::StoreAll{}.solve(p, Bytes{1} << 62);
    const double store_all_solve = seconds_since(t0);

    remat::RockmateOptions blocks_only;
    blocks_only.store_all_only = true;
    const remat::Rockmate<> rotor_blocks(blocks_only);
    t0 = Clock::now();
    const remat::RockmateModel blocks_model = rotor_blocks.analyse(p);
    const double blocks_analyse = seconds_since(t0);

    t0 = Clock::now();
    const remat::Plan periodic = periodic_plan(blocks_model);
    const double periodic_solve = seconds_since(t0) + blocks_analyse;

    remat::RockmateOptions rockmate_options;
    if (o.quick) {
        rockmate_options.peak_budgets = 2;
        rockmate_options.saved_budgets = 2;
        rockmate_options.block_time_limit_seconds = 5;
    }
    // On a GPU the whole run must fit scripts/gpu-check's 10 minutes.
    if (on_cuda) rockmate_options.block_time_limit_seconds = std::min(rockmate_options.block_time_limit_seconds, 3.0);
    const remat::Rockmate<> rockmate(rockmate_options);
    t0 = Clock::now();
    const remat::RockmateModel rock_model = rockmate.analyse(p);
    const double rock_analyse = seconds_since(t0);
    const Bytes smallest = rockmate.smallest_budget(rock_model);
    const Bytes smallest_blocks = rotor_blocks.smallest_budget(blocks_model);
    std::size_t options = 0;
    for (const auto& b : rock_model.blocks) options += b.options.size();
    std::cout << "blocks: " << rock_model.blocks.size() << "; Rockmate options: " << options
              << "; analyse: Rotor over blocks " << blocks_analyse << " s, Rockmate " << rock_analyse << " s\n";

    // Reference numbers.
    const double plain = plain_step_seconds(w, cap.parameters(), o.steps);
    const Measured reference = run(ex, store_all, store_all, w, o.steps);
    const char* clock = on_cuda ? " s" : " s CPU";
    std::cout << "plain LibTorch step " << plain << clock << "; store-all plan: peak " << mib(reference.predicted_peak)
              << " MiB predicted, " << mib(reference.measured_peak) << " MiB measured, step " << reference.seconds
              << clock << " (" << pct(reference.seconds / plain - 1) << " vs plain), solved in " << store_all_solve
              << " s\n";
    // The executor waits for the device only at the end of each phase; waiting after each op
    // (time_each_op, to time ops one by one) costs a GPU its queue of kernels.
    const Measured each_op = run(ex, store_all, store_all, w, o.steps, /*time_each_op=*/true);
    std::cout << "store-all plan waiting for the device after each op (time_each_op): step " << each_op.seconds << clock
              << " (" << pct(each_op.seconds / plain - 1) << " vs plain, " << pct(each_op.overhead)
              << " vs the store-all steps without it)\n";
    const Measured periodic_m = run(ex, periodic, store_all, w, o.steps);
    std::cout << "periodic (every block checkpointed): peak " << mib(periodic_m.predicted_peak) << " MiB predicted ("
              << 100.0 * double(periodic_m.predicted_peak) / double(store_all.peak) << " %), "
              << mib(periodic_m.measured_peak) << " MiB measured; overhead "
              << pct(periodic_m.predicted_time / store_all.time - 1) << " predicted, "
              << pct(periodic_m.overhead) << " measured; solved in " << periodic_solve << " s\n";
    std::cout << "smallest budgets: Rockmate " << mib(smallest) << " MiB ("
              << 100.0 * double(smallest) / double(store_all.peak) << " %), Rotor over blocks " << mib(smallest_blocks)
              << " MiB (" << 100.0 * double(smallest_blocks) / double(store_all.peak) << " %)\n\n";

    std::vector<Bytes> budgets{smallest};
    for (const double f : {0.2, 0.25, 0.33, 0.4, 0.5, 0.6, 0.8, 1.0}) {
        const Bytes b = remat::percent_of(store_all.peak, 100.0 * f);
        if (b > smallest) budgets.push_back(b);
    }
    std::printf("%-16s | %-31s | %-42s | %-42s\n", "budget", "periodic", "rotor over blocks", "rockmate");
    std::printf("%-8s %7s | %7s %7s %15s | %7s %7s %17s %8s | %7s %7s %17s %8s\n", "MiB", "%", "pred", "meas",
                "ovh pred/meas", "pred", "meas", "ovh pred/meas", "solve s", "pred", "meas", "ovh pred/meas",
                "solve s");
    int rock_better = 0, rock_worse = 0;
    double reduction_at_20 = 1.0;  // store-all's measured peak over the plan's, within 20 % measured overhead
    double worst_peak_error = 0.0; // |measured - predicted| / predicted, over Rockmate's plans
    for (const Bytes budget : budgets) {
        std::printf("%-8s %6.1f%% |", mib(budget).c_str(), 100.0 * double(budget) / double(store_all.peak));
        if (periodic.peak <= budget)
            std::printf(" %7s %7s %7s/%-7s |", mib(periodic_m.predicted_peak).c_str(), mib(periodic_m.measured_peak).c_str(),
                        pct(periodic_m.predicted_time / store_all.time - 1).c_str(),
                        pct(periodic_m.overhead).c_str());
        else
            std::printf(" %31s |", "does not fit");
        double blocks_time = -1;
        if (budget >= smallest_blocks) {
            t0 = Clock::now();
            const remat::Plan plan = rotor_blocks.solve(blocks_model, budget);
            const double solve = seconds_since(t0) + blocks_analyse;
            const Measured m = run(ex, plan, store_all, w, o.steps);
            blocks_time = m.predicted_time;
            std::printf(" %7s %7s %8s/%-8s %8.3f |", mib(m.predicted_peak).c_str(), mib(m.measured_peak).c_str(),
                        pct(m.predicted_time / store_all.time - 1).c_str(), pct(m.overhead).c_str(), solve);
        } else {
            std::printf(" %42s |", "infeasible");
        }
        t0 = Clock::now();
        const remat::Plan plan = rockmate.solve(rock_model, budget);
        const double solve = seconds_since(t0) + rock_analyse;
        const Measured m = run(ex, plan, store_all, w, o.steps);
        std::printf(" %7s %7s %8s/%-8s %8.3f\n", mib(m.predicted_peak).c_str(), mib(m.measured_peak).c_str(),
                    pct(m.predicted_time / store_all.time - 1).c_str(), pct(m.overhead).c_str(), solve);
        std::fflush(stdout);
        if (blocks_time < 0 || m.predicted_time < blocks_time * (1 - 1e-9)) ++rock_better;
        if (blocks_time >= 0 && m.predicted_time > blocks_time * (1 + 1e-9)) ++rock_worse;
        if (m.overhead <= 0.20 && m.measured_peak > 0)
            reduction_at_20 = std::max(reduction_at_20, double(reference.measured_peak) / double(m.measured_peak));
        worst_peak_error = std::max(worst_peak_error, std::abs(double(m.measured_peak) - double(m.predicted_peak)) /
                                                          double(std::max<Bytes>(m.predicted_peak, 1)));
    }
    std::cout << "\nRockmate vs Rotor over blocks (predicted time): better at " << rock_better << " budgets, worse at "
              << rock_worse << "; largest activation-memory reduction within 20 % measured overhead: "
              << reduction_at_20 << "x; measured peak vs predicted: within " << 100.0 * worst_peak_error
              << " %; Rockmate analyse " << rock_analyse << " s\n";
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::cerr << a << " needs a value\n";
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--quick") {
            o.quick = true;
        } else if (a == "--steps") {
            o.steps = std::max(1, std::atoi(next().c_str()));
        } else if (a == "--model") {
            o.model = next();
        } else if (a == "--layers") {
            o.layers = std::max(1, std::atoi(next().c_str()));
        } else if (a == "--device") {
            o.device = next();
            if (o.device != "cpu" && o.device != "cuda") {
                std::cerr << "bench_models: --device " << o.device << ": cpu or cuda\n";
                std::exit(2);
            }
        } else {
            std::cerr << "usage: bench_models [--quick] [--steps N] [--model gpt|resnet|both] [--layers N] "
                         "[--device cpu|cuda]\n";
            std::exit(a == "--help" ? 0 : 2);
        }
    }
    if (o.quick) {
        o.steps = 1;
        if (o.layers == 12) o.layers = 2;
    }
    return o;
}

// The GPT-like workload: CPU size by default, GPT-2-small-like on CUDA.
Workload gpt_workload(const Options& o, const at::TensorOptions& device) {
    at::manual_seed(0);
    remat_examples::GptConfig c;
    c.layers = o.layers;
    c.embed = on_cuda ? 768 : 64;
    c.heads = on_cuda ? 12 : 4;
    c.vocab = on_cuda ? 50257 : 512;
    c.block_size = on_cuda ? 512 : 64;
    c.dropout = 0.1;
    const std::int64_t batch = on_cuda ? 8 : 4, tokens = c.block_size;
    if (on_cuda && o.quick) c.embed = 256, c.heads = 4;
    Workload w;
    w.module = remat_examples::make_gpt(c);
    w.module.to(device.device());
    w.title = "GPT-2-like, " + std::to_string(c.layers) + " layers (batch " + std::to_string(batch) + ", " +
              std::to_string(tokens) + " tokens, embedding " + std::to_string(c.embed) + ", vocabulary " +
              std::to_string(c.vocab) + ", dropout " + std::to_string(c.dropout).substr(0, 3) + ", " +
              o.device + ")";
    const auto tokens_on = device.dtype(at::kLong);
    w.inputs = {at::randint(0, c.vocab, {batch, tokens}, tokens_on)};
    const at::Tensor targets = at::randint(0, c.vocab, {batch, tokens}, tokens_on);
    const std::int64_t vocab = c.vocab;
    w.loss = [targets, vocab](const std::vector<at::Tensor>& out) {
        return at::cross_entropy_loss(out[0].reshape({-1, vocab}), targets.reshape({-1}));
    };
    return w;
}

// The ResNet workload: a ResNet-like network of basic blocks on 32x32 images on the CPU;
// ResNet-50 on 224x224 images at batch 32 on CUDA.
Workload resnet_workload(const Options& o, const at::TensorOptions& device) {
    at::manual_seed(1);
    if (on_cuda) {
        const std::int64_t batch = o.quick ? 8 : 32, classes = 1000;
        Workload w;
        w.module = remat_examples::make_resnet50(classes);
        w.module.to(device.device());
        w.title = "ResNet-50 (batch " + std::to_string(batch) + ", 3x224x224, cuda)";
        w.inputs = {at::randn({batch, 3, 224, 224}, device)};
        const at::Tensor targets = at::randint(0, classes, {batch}, device.dtype(at::kLong));
        w.loss = [targets](const std::vector<at::Tensor>& out) { return at::cross_entropy_loss(out[0], targets); };
        return w;
    }
    remat_examples::ResNetConfig c;
    c.width = o.quick ? 16 : 32;
    c.stages = 3;
    c.blocks_per_stage = o.quick ? 1 : 2;
    const std::int64_t batch = o.quick ? 4 : 64;
    const std::int64_t side = 32;
    Workload w;
    w.module = remat_examples::make_resnet(c);
    w.module.to(device.device());
    w.title = "ResNet-like, " + std::to_string(c.stages * c.blocks_per_stage) + " basic blocks (batch " +
              std::to_string(batch) + ", 3x" + std::to_string(side) + "x" + std::to_string(side) + ", width " +
              std::to_string(c.width) + ")";
    w.inputs = {at::randn({batch, 3, side, side}, device)};
    const at::Tensor targets = at::randint(0, c.classes, {batch}, device.dtype(at::kLong));
    w.loss = [targets](const std::vector<at::Tensor>& out) { return at::cross_entropy_loss(out[0], targets); };
    return w;
}

template <class Probe>
void bench_all(const Options& o, const at::TensorOptions& device, const Probe& probe) {
    if (o.model == "gpt" || o.model == "both") bench(gpt_workload(o, device), o, probe);
    if (o.model == "resnet" || o.model == "both") bench(resnet_workload(o, device), o, probe);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse(argc, argv);
        at::set_num_threads(1);
        if (o.device == "cuda") {
#if REMAT_WITH_CUDA
            on_cuda = true;
            const remat::torch::CudaMemoryProbe probe(0);  // a clear error without a device
            bench_all(o, at::TensorOptions().device(at::kCUDA, 0), probe);
            return 0;
#else
            std::cerr << "bench_models: --device cuda needs a LibTorch with CUDA (scripts/test --torch pip builds "
                         "one); this build has none\n";
            return 2;
#endif
        }
        const remat::torch::CpuMemoryProbe probe;
        bench_all(o, at::TensorOptions(), probe);
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "bench_models: " << e.what() << "\n";
        return 1;
    }
}
