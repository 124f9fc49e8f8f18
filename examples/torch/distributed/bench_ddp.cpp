// bench_ddp — what data-parallel training under a budget costs: the GPT-2-like model of
// ../models.hpp (4 layers, batch 4 per rank, buckets of 128 KiB) through remat::torch::DataParallel, for 1 and 2
// ranks, at 100 % and 40 % of the store-all peak, with and without overlap.
//
// The program is its own launcher: it starts each row's ranks as processes on this machine
// (remat/torch/distributed/local_launch.hpp), each rank times its steps and writes what it
// measured, and the table gives, per row:
//   - the median step time and the largest per-rank peak, measured and predicted;
//   - the time spent in all-reduce: the end-of-step wait of the same row without overlap,
//     where every bucket starts at the end of the backward, so the wait is the reduction;
//   - with overlap, the part of it still waited for at the end, and the share hidden under the
//     backward (1 - exposed / all-reduce).
// On the CPU the ranks share this machine's cores (one intra-op thread each), over Gloo;
// with --device cuda, one rank per GPU over NCCL (world size 1 with one GPU: the code path).
//
//   bench_ddp [--device cpu|cuda] [--steps N] [--quick]
#include <ATen/Parallel.h>
#include <torch/torch.h>


#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/torch/distributed/data_parallel.hpp>
#include <remat/torch/distributed/local_launch.hpp>
#include <remat/torch/memory.hpp>
#include <remat/torch/remove_folder.hpp>
#include <remat/torch/script_module.hpp>

#include "../models.hpp"

namespace {

namespace rt = remat::torch;
namespace rd = remat::torch::distributed;
namespace fs = std::filesystem;

struct Settings {
    std::string device = "cpu";
    int steps = 10;
    bool quick = false;
    // Worker mode (set by the launcher).
    bool worker = false;
    double percent = 100.0;
    bool overlap = true;
    std::string out;
};

[[noreturn]] void usage(const std::string& problem) {
    std::cerr << "bench_ddp: " << problem << "\nusage: bench_ddp [--device cpu|cuda] [--steps N] [--quick]\n";
    std::exit(2);
}

Settings parse(int argc, char** argv) {
    Settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--device") s.device = value();
        else if (a == "--steps") s.steps = std::max(2, std::atoi(value().c_str()));
        else if (a == "--quick") s.quick = true;
        else if (a == "--worker") s.worker = true;
        else if (a == "--percent") s.percent = std::atof(value().c_str());
        else if (a == "--overlap") s.overlap = value() == "1";
        else if (a == "--out") s.out = value();
        else usage("unknown argument " + a);
    }
    if (s.device != "cpu" && s.device != "cuda") usage("--device is cpu or cuda, not " + s.device);
    if (s.quick) s.steps = std::min(s.steps, 3);
    return s;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// ------------------------------------------------------------------ one rank

// Trains the rank's replica and writes what it measured; `probe` measures the memory of `device`.
template <class Probe>
int train_rank(const Settings& s, const rd::LaunchEnvironment& where, const c10::Device& device,
               const rd::ProcessGroupPtr& group, Probe probe) {
    const bool cuda = device.is_cuda();
    torch::manual_seed(1);
    remat_examples::GptConfig config;
    config.layers = 4;
    torch::jit::Module model = remat_examples::make_gpt(config);
    model.to(device);
    model.train();
    const std::int64_t batch = 4;
    const auto tokens = at::TensorOptions().dtype(at::kLong).device(device);
    torch::manual_seed(100 + static_cast<std::uint64_t>(where.rank));
    const at::Tensor input = at::randint(0, config.vocab, {batch, config.block_size}, tokens);
    const at::Tensor targets = at::randint(0, config.vocab, {batch, config.block_size}, tokens);

    rt::ScriptCheckpointOptions options;
    options.progress = [](const std::string&) {};
    auto module = rt::checkpoint(model, {input}, remat::budget_percent(s.percent).or_smallest(), remat::Auto{}, options,
                                 std::move(probe));
    rt::DataParallelOptions ddp_options;
    ddp_options.overlap = s.overlap;
    ddp_options.bucket_bytes = remat::Bytes{128} << 10;
    rt::DataParallel ddp(module, group, ddp_options);
    torch::optim::SGD optimizer(module->parameters(), 1e-3);

    std::vector<double> step_seconds, wait_seconds;
    remat::Bytes measured = 0, predicted = 0;
    for (int step = 0; step <= s.steps; ++step) {  // step 0 warms up
        if (cuda) torch::cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        optimizer.zero_grad();
        const at::Tensor loss = at::cross_entropy_loss(ddp.forward({input}).toTensor().reshape({-1, config.vocab}),
                                                       targets.reshape({-1}));
        loss.backward();
        optimizer.step();
        if (cuda) torch::cuda::synchronize();
        if (step == 0) continue;
        step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        wait_seconds.push_back(ddp.last_reduction().wait_seconds);
        measured = std::max(measured, module->last_report().measured_peak);
        predicted = std::max(predicted, module->last_report().predicted_peak);
    }
    std::ofstream out(s.out + ".rank" + std::to_string(where.rank));
    out << "step " << median(step_seconds) << "\nwait " << median(wait_seconds) << "\nmeasured " << measured
        << "\npredicted " << predicted << "\nbudget " << module->budget() << "\nreference " << module->store_all_peak()
        << "\nbuckets " << ddp.last_reduction().buckets << "\nearly " << ddp.last_reduction().buckets_started_early
        << "\nbytes " << ddp.last_reduction().bytes << '\n';
    return 0;
}

int worker(const Settings& s) {
    at::set_num_threads(1);
    const rd::LaunchEnvironment where = rd::LaunchEnvironment::from_environment();
    const bool cuda = s.device == "cuda";
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(where.rank)) : c10::Device(c10::kCPU);
    rd::GroupOptions group_options;
    const rd::StorePtr store = rd::tcp_rendezvous(where, group_options.timeout);
    rd::ProcessGroupPtr group;
#ifdef REMAT_HAVE_NCCL
    if (cuda) group = rd::make_nccl_group(store, where.rank, where.world_size, group_options);
#endif
    if (!group) group = rd::make_gloo_group(store, where.rank, where.world_size, group_options);
#if REMAT_WITH_CUDA
    // The plan's memory is the GPU's: a CPU probe refuses a model on a GPU.
    if (cuda) return train_rank(s, where, device, group, rt::CudaMemoryProbe(device.index()));
#endif
    if (cuda) throw remat::InvalidInput("--device cuda: this LibTorch was built without CUDA");
    return train_rank(s, where, device, group, rt::CpuMemoryProbe{});
}

// The last lines of each rank's log, for a row that failed (the folder may be on another machine).
void print_log_tails(const fs::path& dir, int world) {
    for (int r = 0; r < world; ++r) {
        std::ifstream in(dir / ("rank" + std::to_string(r) + ".log"));
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        const std::size_t first = lines.size() > 15 ? lines.size() - 15 : 0;
        std::cerr << "  rank " << r << "'s log, last " << lines.size() - first << " lines:\n";
        for (std::size_t i = first; i < lines.size(); ++i) std::cerr << "    " << lines[i] << '\n';
    }
}

// ------------------------------------------------------------------ the launcher

struct Row {
    int world = 1;
    double percent = 100;
    bool overlap = false;
    std::map<std::string, double> rank0;
    double measured = 0, predicted = 0;
    bool ok = false;
};

Row run_row(const Settings& s, const fs::path& dir, int world, double percent, bool overlap) {
    Row row{world, percent, overlap, {}, 0, 0, false};
    const std::string out = (dir / ("row-" + std::to_string(world) + "-" + std::to_string(static_cast<int>(percent)) +
                                    (overlap ? "-overlap" : "")))
                                .string();
    rd::LocalLaunchOptions options;
    options.environment = {"OMP_NUM_THREADS=1"};
    options.log_folder = dir;
    options.deadline = std::chrono::minutes(5);
    const rd::LocalJob job = rd::launch_local(
        fs::read_symlink("/proc/self/exe").string(),
        {"--worker", "--device", s.device, "--steps", std::to_string(s.steps), "--percent", std::to_string(percent),
         "--overlap", overlap ? "1" : "0", "--out", out},
        world, options);
    if (!job.succeeded()) {
        std::cerr << "bench_ddp: the row with " << world << " rank(s) at " << percent << " % failed (logs in " << dir
                  << ")\n";
        print_log_tails(dir, world);
        return row;
    }
    for (int r = 0; r < world; ++r) {
        std::ifstream in(out + ".rank" + std::to_string(r));
        std::map<std::string, double> facts;
        std::string key;
        double value = 0;
        while (in >> key >> value) facts[key] = value;
        if (r == 0) row.rank0 = facts;
        row.measured = std::max(row.measured, facts["measured"]);
        row.predicted = std::max(row.predicted, facts["predicted"]);
    }
    row.ok = true;
    return row;
}

int launcher(const Settings& s) {
    const fs::path dir = fs::temp_directory_path() / ("remat-bench-ddp-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::vector<int> worlds = {1, 2};
    if (s.device == "cuda") {
        const int gpus = static_cast<int>(torch::cuda::device_count());
        if (gpus < 1) usage("--device cuda, but no CUDA device is visible");
        worlds = gpus >= 2 ? std::vector<int>{1, 2} : std::vector<int>{1};
    }
    std::printf("GPT-2-like, 4 layers, batch 4 per rank, %s (%s), one intra-op thread per rank; median of %d steps\n",
                s.device.c_str(), s.device == "cuda" ? "NCCL" : "Gloo", s.steps);
    std::printf("%5s %7s %7s | %9s %9s %9s | %10s %10s %7s | %s\n", "ranks", "budget", "overlap", "step ms",
                "peak", "predicted", "reduce ms", "exposed ms", "hidden", "buckets (started early)");
    bool all_ok = true;
    for (const int world : worlds)
        for (const double percent : {100.0, 40.0}) {
            const Row plain = run_row(s, dir, world, percent, false);
            const Row overlapped = run_row(s, dir, world, percent, true);
            all_ok = all_ok && plain.ok && overlapped.ok;
            for (const Row* row : {&plain, &overlapped}) {
                if (!row->ok) {
                    std::printf("%5d %6.0f%% %7s | failed\n", world, percent, row->overlap ? "on" : "off");
                    continue;
                }
                const double reduce = plain.ok ? plain.rank0.at("wait") : 0.0;
                const double exposed = row->rank0.at("wait");
                const std::string hidden =
                    row->overlap && reduce > 1e-4 ? std::to_string(static_cast<int>(100.0 * (1.0 - exposed / reduce))) + " %" : "-";
                std::printf("%5d %6.0f%% %7s | %9.1f %9s %9s | %10.2f %10.2f %7s | %.0f (%.0f)\n", world, percent,
                            row->overlap ? "on" : "off", row->rank0.at("step") * 1e3,
                            remat::format_bytes(static_cast<remat::Bytes>(row->measured)).c_str(),
                            remat::format_bytes(static_cast<remat::Bytes>(row->predicted)).c_str(), reduce * 1e3,
                            exposed * 1e3, hidden.c_str(), row->rank0.at("buckets"), row->rank0.at("early"));
            }
        }
    if (!all_ok) return 1;
    // Not std::filesystem::remove_all, which crashes in programs linked with the pip wheel's
    // LibTorch (remat/torch/remove_folder.hpp).
    std::error_code ignored;
    rt::remove_folder(dir, ignored);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const Settings settings = parse(argc, argv);
    try {
        return settings.worker ? worker(settings) : launcher(settings);
    } catch (const std::exception& e) {
        std::cerr << "bench_ddp: " << e.what() << '\n';
        return 1;
    }
}
