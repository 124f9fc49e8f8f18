// ddp-train — trains the GPT-2-like model of ../models.hpp data-parallel under a memory budget:
// one process per rank, each with its share of the batch, over c10d's Gloo (CPU) or NCCL (one
// GPU per process), all running rank 0's plan (remat/torch/distributed/data_parallel.hpp).
//
// The processes meet as torchrun's do, through environment variables:
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ddp_train [options] &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ddp_train [options]
// (scripts/ddp-demo N starts N of them on this machine). Across machines: the same binary on
// each, MASTER_ADDR rank 0's address, --address each machine's own.
//
//   ddp_train [--budget 40%] [--steps 5] [--batch 4] [--no-overlap] [--device cpu|cuda]
//             [--address A] [--timeout S]
// Exit codes: 0 ok, 2 bad arguments, 3 infeasible budget, 1 any other failure.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/torch/distributed/data_parallel.hpp>
#include <remat/torch/script_module.hpp>

#include "../models.hpp"

namespace {

namespace rt = remat::torch;
namespace rd = remat::torch::distributed;

struct Settings {
    std::string budget = "40%";
    int steps = 5;
    std::int64_t batch = 4;  // sequences per rank
    bool overlap = true;
    std::string device = "cpu";
    std::string address = "127.0.0.1";
    int timeout_seconds = 60;
};

[[noreturn]] void usage(const std::string& problem) {
    std::cerr << "ddp_train: " << problem
              << "\nusage: ddp_train [--budget 40%] [--steps N] [--batch N] [--no-overlap] [--device cpu|cuda] "
                 "[--address A] [--timeout S]\n(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them)\n";
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
        const auto number = [&](long low, long high) {
            const std::string text = value();
            char* end = nullptr;
            const long v = std::strtol(text.c_str(), &end, 10);
            if (*end != '\0' || v < low || v > high)
                usage(a + " takes an integer from " + std::to_string(low) + " to " + std::to_string(high) + ", not '" +
                      text + "'");
            return v;
        };
        if (a == "--budget") s.budget = value();
        else if (a == "--steps") s.steps = static_cast<int>(number(1, 100000));
        else if (a == "--batch") s.batch = number(1, 4096);
        else if (a == "--no-overlap") s.overlap = false;
        else if (a == "--device") s.device = value();
        else if (a == "--address") s.address = value();
        else if (a == "--timeout") s.timeout_seconds = static_cast<int>(number(1, 86400));
        else usage("unknown argument " + a);
    }
    if (s.device != "cpu" && s.device != "cuda") usage("--device is cpu or cuda, not " + s.device);
    return s;
}

// Every rank's value of x, gathered through the group (all-reduce of one slot per rank).
std::vector<double> gather(const rd::ProcessGroupPtr& group, double x, const c10::Device& device) {
    at::Tensor slots = at::zeros({group->getSize()}, at::TensorOptions().dtype(at::kDouble).device(device));
    slots[group->getRank()] = x;
    std::vector<at::Tensor> list{slots};
    group->allreduce(list)->wait();
    const at::Tensor host = list[0].cpu();
    return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
}

int run(const Settings& s) {
    at::set_num_threads(1);
    const rd::LaunchEnvironment where = rd::LaunchEnvironment::from_environment();
    const bool cuda = s.device == "cuda";
    if (cuda && !torch::cuda::is_available()) usage("--device cuda, but no CUDA device is visible");
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(where.rank % torch::cuda::device_count()))
                                    : c10::Device(c10::kCPU);
    rd::GroupOptions group_options;
    group_options.timeout = std::chrono::seconds(s.timeout_seconds);
    group_options.address = s.address;
    const rd::StorePtr store = rd::tcp_rendezvous(where, group_options.timeout);
    rd::ProcessGroupPtr group;
    if (cuda) {
#ifdef REMAT_HAVE_NCCL
        group = rd::make_nccl_group(store, where.rank, where.world_size, group_options);
#else
        usage("--device cuda needs a LibTorch with NCCL");
#endif
    } else {
        group = rd::make_gloo_group(store, where.rank, where.world_size, group_options);
    }

    // The replicas start from different weights; DataParallel copies rank 0's to all.
    torch::manual_seed(1 + static_cast<std::uint64_t>(where.rank));
    remat_examples::GptConfig config;
    config.layers = 4;
    torch::jit::Module model = remat_examples::make_gpt(config);
    model.to(device);
    model.train();
    const auto tokens = at::TensorOptions().dtype(at::kLong).device(device);
    // This rank's share of the batch: its own sequences.
    const at::Tensor input = at::randint(0, config.vocab, {s.batch, config.block_size}, tokens);
    const at::Tensor targets = at::randint(0, config.vocab, {s.batch, config.block_size}, tokens);

    rt::ScriptCheckpointOptions options;
    if (where.rank == 0) options.progress = [](const std::string& line) { std::cout << line << '\n'; };
    else options.progress = [](const std::string&) {};
    auto module = rt::checkpoint(model, {input}, remat::parse_budget_spec(s.budget).or_smallest(), remat::Auto{}, options);
    rt::DataParallelOptions ddp_options;
    ddp_options.overlap = s.overlap;
    rt::DataParallel ddp(module, group, ddp_options);
    if (where.rank == 0)
        std::cout << "ddp_train: " << where.world_size << " rank(s) on " << s.device << " ("
                  << (cuda ? "NCCL" : "Gloo") << "), plan " << std::hex << ddp.plan_fingerprint() << std::dec
                  << " on every rank, budget " << remat::format_bytes(module->budget()) << " of store-all's "
                  << remat::format_bytes(module->store_all_peak()) << ", overlap " << (s.overlap ? "on" : "off") << '\n';

    torch::optim::AdamW optimizer(module->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int step = 1; step <= s.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        optimizer.zero_grad();
        const at::Tensor logits = ddp.forward({input}).toTensor();
        const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, config.vocab}), targets.reshape({-1}));
        loss.backward();
        optimizer.step();
        if (cuda) torch::cuda::synchronize();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::vector<double> losses = gather(group, loss.item<double>(), device);
        const remat::StepReport& r = module->last_report();
        if (where.rank == 0) {
            double mean = 0;
            for (const double l : losses) mean += l / static_cast<double>(losses.size());
            std::printf("step %d: mean loss %.4f, %.3f s, peak %s (predicted %s), all-reduce wait %.2f ms over %zu "
                        "buckets (%zu started during the backward)\n",
                        step, mean, seconds, remat::format_bytes(r.measured_peak).c_str(),
                        remat::format_bytes(r.predicted_peak).c_str(), ddp.last_reduction().wait_seconds * 1e3,
                        ddp.last_reduction().buckets, ddp.last_reduction().buckets_started_early);
        }
    }
    double checksum = 0;
    for (const at::Tensor& p : module->parameters()) checksum += p.detach().to(at::kDouble).sum().item<double>();
    const std::vector<double> sums = gather(group, checksum, device);
    bool identical = true;
    for (const double x : sums) identical = identical && x == sums[0];
    if (where.rank == 0)
        std::cout << "ddp_train: parameters after " << s.steps << " steps "
                  << (identical ? "identical on every rank" : "DIFFER between ranks") << '\n';
    return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const Settings settings = parse(argc, argv);
    try {
        return run(settings);
    } catch (const remat::Infeasible& e) {
        std::cerr << "ddp_train: " << e.what() << '\n';
        return 3;
    } catch (const remat::InvalidInput& e) {
        std::cerr << "ddp_train: " << e.what() << '\n';
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "ddp_train: " << e.what() << '\n';
        return 1;
    }
}
