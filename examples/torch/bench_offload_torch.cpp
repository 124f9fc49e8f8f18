// bench_offload_torch — a LibTorch chain trained by offloading plans (remat/torch/offload.hpp):
// an MLP whose weights and SGD momentum move between the device and host memory, on the CPU
// (remat::CpuTransfers) or a GPU (remat::torch::CudaTransfers).
//
// The link is measured first (each direction, a copy of 64 MiB, the median of 5), and the
// plans are made at those rates. For total device budgets (weights, gradients, momentum and
// activations, % of store-all's P_ref), the table gives each plan's predicted overhead (the
// simulator's makespan over T_ref) against the measured one (the median step over plain
// LibTorch training's, torch::optim::SGD, in the same run), the predicted and measured device
// and host peaks (the tracking allocator on the CPU, the caching allocator's requested bytes
// on a GPU), and the bandwidth the plan's copies reached.
//
// A second table does the same for the drop-in module (remat/torch/offload_module.hpp): the
// caller's loss.backward() and torch::optim::Adam step after it, the Adam state on the device
// and in the budget, weights offloaded only inside the step. Its budgets count everything the
// step holds, Adam's state included; "remat alone" is the predicted overhead of
// rematerialization without offloading at the same budget.
//
//   bench_offload_torch [--device cpu|cuda] [--quick] [--steps N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/torch/cuda_transfers.hpp>
#include <remat/torch/detail/runtime.hpp>
#include <remat/torch/memory.hpp>
#include <remat/torch/offload.hpp>
#include <remat/torch/offload_module.hpp>
#include <remat/torch/profile.hpp>
#include <remat/torch/sequential.hpp>

namespace {

namespace rt = remat::torch;

struct Settings {
    c10::Device device{c10::kCPU};
    std::int64_t width = 1024, blocks = 6, batch = 512;
    std::size_t steps = 5;
};

void synchronize(const c10::Device& device) { rt::detail::synchronize(device); }

// The median wall time of `runs` calls, each ended by a device synchronisation.
double median_seconds(std::size_t runs, const c10::Device& device, const std::function<void()>& f) {
    std::vector<double> times;
    for (std::size_t i = 0; i < runs; ++i) {
        synchronize(device);
        const auto t0 = std::chrono::steady_clock::now();
        f();
        synchronize(device);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// Where the host waited, for a step measured well above its prediction: the schedule steps
// that took the engine longest to issue (on a GPU, issuing is quick unless something waits).
void print_slowest_steps(const remat::Problem& problem, const remat::offload::OffloadSchedule& schedule,
                         const remat::OffloadStepReport& report) {
    std::vector<std::size_t> order(report.issue_seconds_timeline.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    const std::size_t shown = std::min<std::size_t>(4, order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                      [&](std::size_t a, std::size_t b) { return report.issue_seconds_timeline[a] > report.issue_seconds_timeline[b]; });
    double total = 0.0;
    for (const double t : report.issue_seconds_timeline) total += t;
    std::printf("        measured above predicted; the engine issued the step in %.2f ms, longest:", total * 1e3);
    for (std::size_t k = 0; k < shown; ++k)
        std::printf(" %s %.2f ms%s", remat::offload::describe(problem, schedule.steps[order[k]]).c_str(),
                    report.issue_seconds_timeline[order[k]] * 1e3, k + 1 < shown ? "," : "\n");
}

// Where a measured device peak differs from the predicted one: the first steps whose measured
// memory (while an op ran, after anything else) is not the simulator's, in bytes, so that a
// difference names the op or transfer behind it.
void print_peak_differences(const remat::Problem& problem, const remat::offload::OffloadSchedule& schedule,
                            const remat::offload::OffloadReport& predicted, const remat::OffloadStepReport& report) {
    std::printf("        device peak %lld B predicted, %lld B measured; host peak %lld B predicted, %lld B measured\n",
                static_cast<long long>(report.predicted_device_peak), static_cast<long long>(report.measured_device_peak),
                static_cast<long long>(report.predicted_host_peak), static_cast<long long>(report.measured_host_peak));
    std::size_t shown = 0;
    for (std::size_t i = 0; i < schedule.steps.size() && i < predicted.timeline.size() && shown < 8; ++i) {
        const remat::offload::TransferTimelinePoint& point = predicted.timeline[i];
        const remat::Bytes expected = schedule.steps[i].is_run() ? point.device_during : point.device_after;
        const remat::Bytes measured = report.measured_device_timeline[i];
        if (measured == expected) continue;
        std::printf("        step %zu, %s: %lld B predicted, %lld B measured (%+lld B)\n", i,
                    remat::offload::describe(problem, schedule.steps[i]).c_str(), static_cast<long long>(expected),
                    static_cast<long long>(measured), static_cast<long long>(measured - expected));
        ++shown;
    }
}

// Bytes per second of a 64 MiB copy each way between the device and (pinned, on a GPU) host memory.
std::pair<double, double> link_rates(const c10::Device& device) {
    const std::int64_t n = std::int64_t{64} << 20;
    const auto options = at::TensorOptions().dtype(at::kByte);
    const at::Tensor on_device = at::empty({n}, options.device(device));
    const at::Tensor on_host = at::empty({n}, options.pinned_memory(device.is_cuda()));
    const double to_host = median_seconds(5, device, [&] { on_host.copy_(on_device, /*non_blocking=*/true); });
    const double to_device = median_seconds(5, device, [&] { on_device.copy_(on_host, /*non_blocking=*/true); });
    return {double(n) / to_host, double(n) / to_device};
}

torch::nn::Sequential make_mlp(const Settings& s) {
    torch::nn::Sequential model;
    for (std::int64_t b = 0; b < s.blocks; ++b) {
        model->push_back(torch::nn::Linear(s.width, s.width));
        model->push_back(torch::nn::ReLU());
    }
    model->push_back(torch::nn::Linear(s.width, 10));
    model->to(s.device);
    return model;
}

template <class Probe, class Transfers, class MakeTransfers>
void table(const Settings& s, Probe probe, MakeTransfers make_transfers) {
    at::manual_seed(1);
    torch::nn::Sequential model = make_mlp(s);
    torch::nn::Sequential reference(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
    const rt::StageList stages = rt::group_stages_before(rt::stages_of(model), rt::starts_with<torch::nn::LinearImpl>);
    const at::Tensor x = at::randn({s.batch, s.width}, at::TensorOptions().device(s.device));
    const at::Tensor y = at::randint(0, 10, {s.batch}, at::TensorOptions().device(s.device).dtype(at::kLong));
    const rt::ChainLoss loss = [y](const at::Tensor& out) { return at::cross_entropy_loss(out, y); };

    const auto [to_host, to_device] = link_rates(s.device);
    rt::ProfileOptions profile_options;
    profile_options.repeats = 3;
    const rt::ChainProfile profile = rt::profile_chain(stages, x, profile_options, probe);
    remat::offload::TrainingStateOptions options;
    options.transfers = remat::TransferSettings{std::nullopt, to_host, to_device};
    const rt::OffloadTrainingProblems problems = rt::offload_training_problems(stages, profile, loss, x, options, probe);
    const remat::Reference ref = remat::store_all_reference(problems.predicting);

    torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    const double plain = median_seconds(s.steps, s.device, [&] {
        sgd.zero_grad();
        loss(reference->forward(x)).backward();
        sgd.step();
    });
    std::printf("\n%s: MLP of %lld blocks of width %lld, batch %lld (fp32, SGD with momentum); link measured at %.1f GB/s to "
                "the host, %.1f GB/s to the device; plain step %.2f ms (median of %zu), predicted T_ref %.2f ms; P_ref %s\n",
                s.device.str().c_str(), static_cast<long long>(s.blocks), static_cast<long long>(s.width),
                static_cast<long long>(s.batch), to_host / 1e9, to_device / 1e9, plain * 1e3, s.steps, ref.time * 1e3,
                remat::format_bytes(ref.peak).c_str());
    std::printf("    %-18s| %-14s %8s %8s %9s | %10s %10s | %10s %10s | %s\n", "budget", "method", "pred ovh", "meas ovh",
                "no rollbk", "dev pred", "dev meas", "host pred", "host meas", "copies (measured GB/s out, in)");

    rt::OffloadedChain training(stages, problems.predicting, loss, {0.01, 0.9}, x);
    Transfers transfers = make_transfers(training, problems.predicting);
    for (const int percent : {100, 70, 50, 40, 30, 25}) {
        const remat::Bytes budget = remat::percent_of(ref.peak, percent);
        const auto plan = remat::offload::plan_with_offload(problems.planned, budget, remat::Rotor{});
        std::printf("    %5d%% %10s | ", percent, remat::format_bytes(budget).c_str());
        if (!plan) {
            std::printf("no plan\n");
            continue;
        }
        remat::place_for(plan->schedule, transfers);
        remat::OffloadStepReport last;
        const auto measure = [&](bool rollback) {
            return median_seconds(s.steps, s.device, [&] {
                remat::OffloadStep<rt::OffloadedChain, Transfers, Probe> step(
                    problems.predicting, plan->schedule, training, transfers, probe, remat::OffloadStepOptions{rollback});
                step.run();
                training.end_step();
                last = step.report();
            });
        };
        const double without_rollback = measure(false);
        const double measured = measure(true);
        const remat::offload::OffloadReport predicted = remat::offload::simulate(problems.predicting, plan->schedule);
        std::printf("%-14s %+7.1f%% %+7.1f%% %+8.1f%% | %10s %10s | %10s %10s | %s out + %s in", plan->method.c_str(),
                    100.0 * (predicted.makespan / ref.time - 1.0), 100.0 * (measured / plain - 1.0),
                    100.0 * (without_rollback / plain - 1.0),
                    remat::format_bytes(last.predicted_device_peak).c_str(),
                    remat::format_bytes(last.measured_device_peak).c_str(),
                    remat::format_bytes(last.predicted_host_peak).c_str(), remat::format_bytes(last.measured_host_peak).c_str(),
                    remat::format_bytes(predicted.bytes_to_host).c_str(), remat::format_bytes(predicted.bytes_to_device).c_str());
#if REMAT_WITH_CUDA
        if constexpr (requires { transfers.timing(); }) {
            const rt::TransferTiming t = transfers.timing();
            std::printf(" (%.1f, %.1f)", t.to_host_rate() / 1e9, t.to_device_rate() / 1e9);
            transfers.reset_timing();
        }
#endif
        const bool exact = last.measured_device_peak == last.predicted_device_peak &&
                           last.measured_host_peak == last.predicted_host_peak;
        std::printf("%s\n", exact ? "" : "  <- measured peak differs");
        if (!exact) print_peak_differences(problems.predicting, plan->schedule, predicted, last);
        if (without_rollback / plain > 1.2 * predicted.makespan / ref.time)
            print_slowest_steps(problems.predicting, plan->schedule, last);
        remat::return_to_device(plan->schedule, transfers);
    }
}

// The drop-in module at budgets from store-all's total down, in steps of 5 %, until none fits.
// Half the width and four times the batch: its weights, gradients and Adam's state are all on
// the device at the end of the step, so it saves memory where activations dominate.
template <class Probe, class Transfers>
void module_table(Settings s, Probe probe) {
    s.width /= 2;
    s.batch *= 4;
    at::manual_seed(2);
    torch::nn::Sequential model = make_mlp(s);
    torch::nn::Sequential reference(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
    const at::Tensor x = at::randn({s.batch, s.width}, at::TensorOptions().device(s.device));
    const at::Tensor y = at::randint(0, 10, {s.batch}, at::TensorOptions().device(s.device).dtype(at::kLong));
    const auto [to_host, to_device] = link_rates(s.device);
    rt::OffloadModuleOptions options;
    options.profile.repeats = 3;
    options.transfers = remat::TransferSettings{std::nullopt, to_host, to_device};
    options.optimizer_state_per_parameter = 2.0;
    rt::OffloadCheckpointed<remat::Rotor, Transfers, Probe> m(std::make_shared<rt::OffloadCheckpointedImpl<remat::Rotor, Transfers, Probe>>(
        rt::group_stages_before(rt::stages_of(model), rt::starts_with<torch::nn::LinearImpl>), x, rt::budget_percent(100),
        remat::Rotor{}, options, probe));
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));
    torch::optim::Adam adam_ref(reference->parameters(), torch::optim::AdamOptions(1e-4));
    const double plain = median_seconds(s.steps, s.device, [&] {
        at::cross_entropy_loss(reference->forward(x), y).backward();
        adam_ref.step();
        adam_ref.zero_grad();
    });
    const double store_all_time = remat::store_all_reference(m->problem()).time;
    std::printf("\n%s, the drop-in module: MLP of %lld blocks of width %lld, batch %lld, torch::optim::Adam after each step; "
                "plain step %.2f ms; store-all total %s (%s of it outside the plan: Adam's state, buffers)\n",
                s.device.str().c_str(), static_cast<long long>(s.blocks), static_cast<long long>(s.width),
                static_cast<long long>(s.batch), plain * 1e3, remat::format_bytes(m->store_all_total()).c_str(),
                remat::format_bytes(m->resident_bytes()).c_str());
    std::printf("    %-18s| %-12s %-14s %8s %8s | %10s %10s | %10s %10s\n", "budget", "remat alone", "offloading", "pred ovh",
                "meas ovh", "dev pred", "dev meas", "host pred", "host meas");
    remat::offload::CombinedOptions alone;
    alone.transfers = options.transfers;
    alone.between_steps = false;
    for (int percent = 100; percent >= 5; percent -= 5) {
        try {
            m->replan(rt::budget_percent(percent));
        } catch (const remat::Infeasible&) {
            std::printf("    %5d%% %10s | no plan\n", percent,
                        remat::format_bytes(remat::percent_of(m->store_all_total(), percent)).c_str());
            break;
        }
        const auto remat_alone =
            remat::offload::plan_remat_only(m->planned_problem(), m->budget() - m->resident_bytes(), remat::Rotor{}, alone);
        char remat_column[32] = "no plan";
        if (remat_alone)
            std::snprintf(remat_column, sizeof remat_column, "%+.1f%%",
                          100.0 * (remat::offload::simulate(m->problem(), remat_alone->schedule).makespan / store_all_time - 1.0));
        const double measured = median_seconds(s.steps, s.device, [&] {
            at::cross_entropy_loss(m->forward(x), y).backward();
            adam.step();
            adam.zero_grad();
        });
        const remat::OffloadStepReport& r = m->last_report();
        const bool exact = r.measured_device_peak == r.predicted_device_peak && r.measured_host_peak == r.predicted_host_peak;
        std::printf("    %5d%% %10s | %-12s %-14s %+7.1f%% %+7.1f%% | %10s %10s | %10s %10s%s\n", percent,
                    remat::format_bytes(m->budget()).c_str(), remat_column,
                    m->plan().method.c_str(), 100.0 * (m->plan().report.makespan / store_all_time - 1.0),
                    100.0 * (measured / plain - 1.0), remat::format_bytes(r.predicted_device_peak).c_str(),
                    remat::format_bytes(r.measured_device_peak).c_str(), remat::format_bytes(r.predicted_host_peak).c_str(),
                    remat::format_bytes(r.measured_host_peak).c_str(), exact ? "" : "  <- measured peak differs");
        if (!exact)
            print_peak_differences(m->problem(), m->plan().schedule, remat::offload::simulate(m->problem(), m->plan().schedule), r);
        if (measured / plain > 1.2 * m->plan().report.makespan / store_all_time)
            print_slowest_steps(m->problem(), m->plan().schedule, r);
    }
}

}  // namespace

int main(int argc, char** argv) {
    Settings s;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--quick") quick = true;
        else if (arg == "--device" && i + 1 < argc) s.device = c10::Device(argv[++i]);
        else if (arg == "--steps" && i + 1 < argc) s.steps = std::stoul(argv[++i]);
        else {
            std::fprintf(stderr, "usage: bench_offload_torch [--device cpu|cuda] [--quick] [--steps N]\n");
            return 2;
        }
    }
    at::set_num_threads(1);
    if (s.device.is_cuda()) {
        s.width = quick ? 2048 : 4096;
        s.blocks = 8;
        s.batch = quick ? 1024 : 2048;
#if REMAT_WITH_CUDA
        table<rt::CudaMemoryProbe, rt::CudaTransfers<rt::OffloadedChain>>(
            s, rt::CudaMemoryProbe(s.device.has_index() ? s.device.index() : 0),
            [&](rt::OffloadedChain& chain, const remat::Problem& problem) {
                return rt::CudaTransfers<rt::OffloadedChain>(chain, problem, s.device);
            });
        module_table<rt::CudaMemoryProbe, rt::CudaTransfers<rt::OffloadedChain>>(
            s, rt::CudaMemoryProbe(s.device.has_index() ? s.device.index() : 0));
        return 0;
#else
        std::fprintf(stderr, "bench_offload_torch: this LibTorch has no CUDA\n");
        return 2;
#endif
    }
    if (quick) s.width = 512;
    table<rt::CpuMemoryProbe, remat::CpuTransfers<rt::OffloadedChain>>(
        s, rt::CpuMemoryProbe{}, [](rt::OffloadedChain& chain, const remat::Problem& problem) {
            return remat::CpuTransfers<rt::OffloadedChain>(chain, problem);
        });
    module_table<rt::CpuMemoryProbe, remat::CpuTransfers<rt::OffloadedChain>>(s, rt::CpuMemoryProbe{});
}
