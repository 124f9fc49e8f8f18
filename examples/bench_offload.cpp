// bench_offload — one device budget for everything a GPT-like training step holds: what
// rematerialization alone, weight offloading alone (Greedy, Greedy*) and the combined planner
// (remat/offload/combined.hpp) predict, at 12 and 25 GB/s.
//
// The model: L transformer blocks of width d on T tokens in fp32, each block two chain stages
// (attention, MLP) with their weights, gradients and Adam state (docs/formats.md §11,
// remat::offload::training_problem). Op times come from FLOP counts at a stated compute rate
// (and the optimizer step from its bytes at a memory bandwidth), so the same model is shown
// at a CPU-like rate (transfers are cheap next to compute) and a GPU-like one (they are not).
// Weights + gradients + optimizer state are more than half of store-all's memory. The last
// column lets the combined planner offload the stages' outputs and saved states too (POFO).
//
// Then the CPU backend, measured: minigrad (examples/embedding) trained with SGD with momentum
// inside the plan, weights and momentum copied by remat::CpuTransfers' worker threads. Its
// chain, the optimizer step's time and the copy bandwidth are measured on this machine; each
// plan's predicted overhead is set against its measured one (median step time against plain
// training's), with the device and host peaks.
//
// Where a MILP backend is built in, the combined planner's iteration is also set against
// Checkmate's MILP with offload variables (remat/offload/checkmate.hpp) on 1- and 2-block models.
//
//   bench_offload [--layers L] [--width d] [--tokens T] [--steps N] [--milp-seconds S]
//                 [--write-problem FILE.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>
#include <remat/milp/preferred.hpp>
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
#include <remat/offload/checkmate.hpp>
#endif

#include "embedding/minigrad_offload.hpp"

namespace {

using remat::Bytes;
using namespace remat::offload;

struct Model {
    std::size_t layers = 8;
    double width = 2048;
    double tokens = 4096;  // batch x sequence
    double sequence = 1024;
};

struct Machine {
    const char* name;
    double flops;             // compute rate, FLOP/s
    double memory_bandwidth;  // for the optimizer step, bytes/s
};

// The chain of a GPT-like model and its stages' parameter bytes.
std::pair<remat::Chain, std::vector<Bytes>> gpt_like(const Model& m, const Machine& machine) {
    const double d = m.width, T = m.tokens, f = 4.0;  // fp32
    remat::Chain chain{"gpt-like-" + std::to_string(m.layers), static_cast<Bytes>(T * d * f), {}};
    std::vector<Bytes> params;
    for (std::size_t l = 1; l <= m.layers; ++l) {
        const double attention_flops = 2 * T * 4 * d * d + 4 * T * m.sequence * d;
        const double mlp_flops = 2 * T * 8 * d * d;
        const auto t = [&](double flops) { return flops / machine.flops; };
        const auto bytes = [&](double values) { return static_cast<Bytes>(values * f); };
        // Attention keeps its normalised input, Q, K, V and its output (flash-style, no scores).
        chain.stages.push_back({"attn" + std::to_string(l), t(attention_flops), 2 * t(attention_flops), bytes(T * d),
                                bytes(6 * T * d), 0, bytes(T * d)});
        // The MLP keeps its normalised input, the hidden layer and its activation.
        chain.stages.push_back({"mlp" + std::to_string(l), t(mlp_flops), 2 * t(mlp_flops), bytes(T * d), bytes(10 * T * d),
                                bytes(4 * T * d), bytes(4 * T * d)});
        params.push_back(bytes(4 * d * d + 4 * d));
        params.push_back(bytes(8 * d * d + 5 * d));
    }
    return {chain, params};
}

remat::Problem training(const Model& m, const Machine& machine, double bandwidth, bool offload_activations = false) {
    const auto [chain, params] = gpt_like(m, machine);
    // Adam: 2 bytes of state per byte of weight; its step reads w, g, m, v and writes w, m, v.
    TrainingStateOptions options{2.0, 7.0 / machine.memory_bandwidth, true,
                                 remat::TransferSettings{std::nullopt, bandwidth, bandwidth}};
    options.offloadable_activations = offload_activations;
    return training_problem(chain, params, options);
}

std::string cell(const std::optional<OffloadPlan>& plan, double reference_time) {
    char text[32];
    if (!plan) return "         -";
    std::snprintf(text, sizeof text, "%+9.1f%%", 100.0 * (plan->report.makespan / reference_time - 1.0));
    return text;
}

// The smallest total budget (to 0.5 % of P_ref) at which `plan_at` has a plan with at most
// `max_overhead` predicted overhead.
template <class F>
std::optional<Bytes> smallest_total(F plan_at, Bytes reference_peak, double reference_time, double max_overhead) {
    const auto ok = [&](Bytes b) {
        const auto plan = plan_at(b);
        return plan && plan->report.makespan <= reference_time * (1.0 + max_overhead);
    };
    if (!ok(reference_peak)) return std::nullopt;
    Bytes good = reference_peak, bad = 0;
    while (good - bad > reference_peak / 200) {
        const Bytes mid = bad + (good - bad) / 2;
        (ok(mid) ? good : bad) = mid;
    }
    return good;
}

void table(const Model& m, const Machine& machine, double bandwidth) {
    const remat::Problem full = training(m, machine, bandwidth);
    const remat::Problem full_activations = training(m, machine, bandwidth, true);
    const remat::Reference ref = remat::store_all_reference(full);
    const TrainingSplit split = split_training_state(full);
    Bytes state = 0;
    for (const remat::DataId d : full.initial()) state += full.is_initial(d) && full.data(d).offloadable ? full.data(d).bytes : 0;
    std::printf("\n%s, %.0f GB/s both ways: T_ref %.4g s, P_ref %s; weights + Adam state %s, with gradients %.0f %% of "
                "P_ref; activations' P_ref %s\n",
                machine.name, bandwidth / 1e9, ref.time, remat::format_bytes(ref.peak).c_str(),
                remat::format_bytes(state).c_str(), 100.0 * (4.0 / 3.0) * double(state) / double(ref.peak),
                remat::format_bytes(remat::store_all_reference(split.activations).peak).c_str());
    std::printf("  %8s %10s | %10s %10s %10s %10s %10s  %s\n", "budget", "", "remat", "greedy", "greedy*", "combined",
                "+act.", "combined: method, activation budget, transfers");
    const remat::Rotor rotor;
    const auto options = [&](GreedyVariant v) { return CombinedOptions{v, 12, std::nullopt}; };
    for (int percent = 100; percent >= 10; percent -= 10) {
        const Bytes budget = remat::percent_of(ref.peak, percent);
        const auto remat_only = plan_remat_only(full, budget, rotor, options(GreedyVariant::repeated));
        const auto greedy = plan_offload_only(full, budget, options(GreedyVariant::once));
        const auto greedy_star = plan_offload_only(full, budget, options(GreedyVariant::repeated));
        const auto combined = plan_with_offload(full, budget, rotor, options(GreedyVariant::repeated));
        const auto activations = plan_with_offload(full_activations, budget, rotor, options(GreedyVariant::repeated));
        std::printf("  %7d%% %10s | %s %s %s %s %s", percent, remat::format_bytes(budget).c_str(),
                    cell(remat_only, ref.time).c_str(), cell(greedy, ref.time).c_str(), cell(greedy_star, ref.time).c_str(),
                    cell(combined, ref.time).c_str(), cell(activations, ref.time).c_str());
        if (combined)
            std::printf("  %s, %s, %s out + %s in", combined->method.c_str(),
                        remat::format_bytes(combined->activation_budget).c_str(),
                        remat::format_bytes(combined->report.bytes_to_host).c_str(),
                        remat::format_bytes(combined->report.bytes_to_device).c_str());
        std::printf("\n");
        const bool never_worse = !combined || ((!remat_only || combined->report.makespan <= remat_only->report.makespan) &&
                                               (!greedy_star || combined->report.makespan <= greedy_star->report.makespan));
        if (!never_worse) std::printf("  ^ the combined planner is worse than a part alone here\n");
        if (!remat_only && !greedy && !greedy_star && !combined && !activations) break;
    }
    const auto remat_smallest = smallest_total(
        [&](Bytes b) { return plan_remat_only(full, b, rotor, options(GreedyVariant::repeated)); }, ref.peak, ref.time, 1e9);
    const auto combined_30 = smallest_total(
        [&](Bytes b) { return plan_with_offload(full, b, rotor, options(GreedyVariant::repeated)); }, ref.peak, ref.time, 0.30);
    const auto activations_30 = smallest_total(
        [&](Bytes b) { return plan_with_offload(full_activations, b, rotor, options(GreedyVariant::repeated)); }, ref.peak,
        ref.time, 0.30);
    std::printf("  smallest total: remat alone %s; combined at <= 30 %% overhead %s (activations offloaded too: %s)",
                remat_smallest ? remat::format_bytes(*remat_smallest).c_str() : "none",
                combined_30 ? remat::format_bytes(*combined_30).c_str() : "none",
                activations_30 ? remat::format_bytes(*activations_30).c_str() : "none");
    std::printf("\n");
    if (remat_smallest && combined_30)
        std::printf("  combined / remat alone: %.2fx lower (target >= 2x: %s)", double(*remat_smallest) / double(*combined_30),
                    double(*remat_smallest) >= 2.0 * double(*combined_30) ? "met" : "not met");
    std::printf("\n");
    if (remat_smallest) {
        // What any schedule at half of remat's smallest total must transfer (makespan_lower_bound).
        const Bytes half = *remat_smallest / 2;
        const double bound = makespan_lower_bound(full, half);
        std::printf("  at %s (half of remat's smallest): any plan's overhead >= %+.1f %% (proven: the state that cannot "
                    "start on the device crosses each channel)%s\n",
                    remat::format_bytes(half).c_str(), std::max(0.0, 100.0 * (bound / ref.time - 1.0)),
                    bound > 1.3 * ref.time ? "; the 30 % target is out of reach here" : "");
    }
}

// ------------------------------------------- the iteration against Checkmate's MILP with offloads

#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
using MilpBackend = remat::milp::Preferred;

// Where both run (small models): the combined planner's iteration, and the MILP started from
// its plan, at the same budgets. The MILP's bound is proven for its model (its passes and
// points), not for every schedule; makespan_lower_bound is proven for every schedule.
void iteration_against_milp(const Model& small, const Machine& machine, double bandwidth, double seconds) {
    const remat::Problem full = training(small, machine, bandwidth);
    const remat::Reference ref = remat::store_all_reference(full);
    OffloadCheckmateOptions options;
    options.time_limit_seconds = seconds;
    const OffloadCheckmate<MilpBackend> milp(options);
    std::printf("\n%s, %zu block(s), %.0f GB/s: iteration vs Checkmate's MILP with offload variables (%s, %.0f s, started "
                "from the iteration's plan); T_ref %.4g s, P_ref %s\n",
                machine.name, small.layers, bandwidth / 1e9, std::string(MilpBackend{}.name()).c_str(), seconds, ref.time,
                remat::format_bytes(ref.peak).c_str());
    std::printf("  %8s %10s | %10s %10s %10s %10s | %9s %s\n", "budget", "", "iteration", "milp", "milp bnd", "proven",
                "iter/milp", "milp status");
    double worst = 1.0, sum = 0.0;
    std::size_t rows = 0;
    for (const int percent : {100, 90, 80, 70, 60, 50, 40, 30}) {
        const Bytes budget = remat::percent_of(ref.peak, percent);
        const auto iteration = plan_with_offload(full, budget, remat::Rotor{});
        const OffloadMilpResult r = milp.solve(full, budget, iteration ? std::optional(iteration->schedule) : std::nullopt);
        const double bound = makespan_lower_bound(full, budget);
        char milp_bound[32];
        std::snprintf(milp_bound, sizeof milp_bound, "%+9.1f%%", 100.0 * (std::max(r.model_bound, bound) / ref.time - 1.0));
        std::printf("  %7d%% %10s | %s %s %s %+9.1f%% |", percent, remat::format_bytes(budget).c_str(),
                    cell(iteration, ref.time).c_str(), cell(r.plan, ref.time).c_str(),
                    r.plan ? milp_bound : "         -", 100.0 * (bound / ref.time - 1.0));
        if (iteration && r.plan) {
            const double ratio = iteration->report.makespan / r.plan->report.makespan;
            worst = std::max(worst, ratio);
            sum += ratio;
            ++rows;
            std::printf(" %8.3fx", ratio);
        } else {
            std::printf(" %9s", "-");
        }
        std::printf(" %s in %.1f s%s\n", remat::milp::to_string(r.status).data(), r.seconds,
                    r.started ? "" : (iteration ? ", could not start from the iteration's plan" : ""));
        if (!iteration && !r.plan && r.status == remat::milp::Status::infeasible) break;
    }
    if (rows > 0)
        std::printf("  the iteration's makespan over the MILP's: %.3fx on average, %.3fx at worst (%zu budgets)\n",
                    sum / double(rows), worst, rows);
}
#endif

// ---------------------------------------------------------------- the CPU backend, measured

template <class F>
double median_seconds(std::size_t runs, F&& f) {
    std::vector<double> times;
    for (std::size_t r = 0; r < runs; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
    return times[times.size() / 2];
}

// What a copy between two buffers of this machine sustains, bytes per second.
double copy_bandwidth() {
    const std::size_t n = std::size_t{32} << 20;
    std::vector<std::byte> from(n, std::byte{1}), to(n);
    const double seconds = median_seconds(7, [&] { std::memcpy(to.data(), from.data(), n); });
    return static_cast<double>(n) / seconds;
}

// Seconds per parameter byte of one SGD-with-momentum update.
double update_seconds_per_byte(minigrad::Allocator& memory) {
    std::mt19937 g(5);
    minigrad::Matrix p = minigrad::random_matrix(memory, 512, 512, g, 1.0f), v(memory, 512, 512);
    const minigrad::Matrix grad = minigrad::random_matrix(memory, 512, 512, g, 1.0f);
    return median_seconds(7, [&] { minigrad::momentum_update(p, v, grad, 0.01f, 0.9f); }) / static_cast<double>(p.bytes());
}

void measured_on_cpu_backend(std::size_t steps) {
    using namespace minigrad;
    constexpr float lr = 0.01f, mu = 0.9f;
    Allocator memory;
    minigrad::Model model = make_model(memory, 128, 128, 512, 4, 16);
    std::mt19937 data(3);
    const Matrix x = random_matrix(memory, 64, 128, data, 1.0f), target = random_matrix(memory, 64, 16, data, 1.0f);
    // Plain training (every activation kept, the optimizer after the backward): the reference.
    std::vector<std::vector<Matrix>> velocity;
    for (Layer& layer : model.layers) {
        velocity.emplace_back();
        for (Matrix* p : parameters(layer)) velocity.back().emplace_back(memory, p->rows(), p->cols());
    }
    const auto plain_training_step = [&] {
        const PlainStep plain = plain_step(model, x, target);
        for (std::size_t l = 0; l < model.layers.size(); ++l) {
            const auto ps = parameters(model.layers[l]);
            for (std::size_t k = 0; k < ps.size(); ++k) momentum_update(*ps[k], velocity[l][k], plain.gradients[l][k], lr, mu);
        }
    };
    plain_training_step();  // warm-up
    const double plain_seconds = median_seconds(steps, plain_training_step);
    velocity.clear();

    const Profile profiled = profile(model, memory, x);
    const double bandwidth = copy_bandwidth();
    remat::offload::TrainingStateOptions options{1.0, update_seconds_per_byte(memory), true,
                                                 remat::TransferSettings{std::nullopt, bandwidth, bandwidth}, true};
    const std::vector<Bytes> params = parameter_bytes(model);
    const remat::Problem planned = remat::offload::training_problem(profiled.chain, params, options);
    const remat::Problem predicting = remat::offload::training_problem(profiled.problem, params, options);
    const remat::Reference ref = remat::store_all_reference(planned);
    std::printf("\nCPU backend, measured (minigrad, %zu layers; SGD with momentum in the plan; copies on 2 worker threads "
                "at %.1f GB/s measured): plain step %.2f ms (median of %zu), predicted T_ref %.2f ms; P_ref %s\n",
                model.layers.size(), bandwidth / 1e9, 1e3 * plain_seconds, steps, 1e3 * ref.time,
                remat::format_bytes(ref.peak).c_str());
    std::printf("  %8s %10s | %-16s %9s %9s | %10s %10s | %10s %10s | %s\n", "budget", "", "method", "pred ovh", "meas ovh",
                "dev pred", "dev meas", "host pred", "host meas", "transfers");
    for (const int percent : {100, 70, 50, 40, 35, 30, 25, 20}) {
        const Bytes budget = remat::percent_of(ref.peak, percent);
        const auto plan = remat::offload::plan_with_offload(planned, budget, remat::Rotor{});
        if (!plan) {
            std::printf("  %7d%% %10s | no plan\n", percent, remat::format_bytes(budget).c_str());
            continue;
        }
        OffloadTraining training(model, memory, x, target, predicting, lr, mu);
        remat::CpuTransfers<OffloadTraining> copies(training, predicting);
        AllocatorProbe probe{&memory};
        remat::place_for(plan->schedule, copies);
        remat::OffloadStepReport last;
        const auto offloaded_step = [&] {
            remat::OffloadStep<OffloadTraining, remat::CpuTransfers<OffloadTraining>, AllocatorProbe> run(
                predicting, plan->schedule, training, copies, probe);
            run.run();
            last = run.report();
            training.end_step();
        };
        offloaded_step();  // warm-up
        const double seconds = median_seconds(steps, offloaded_step);
        remat::return_to_device(plan->schedule, copies);  // for the next plan, which starts elsewhere
        std::printf("  %7d%% %10s | %-16s %+8.1f%% %+8.1f%% | %10s %10s | %10s %10s | %s out + %s in\n", percent,
                    remat::format_bytes(budget).c_str(), plan->method.c_str(),
                    100.0 * (last.predicted_makespan / ref.time - 1.0), 100.0 * (seconds / plain_seconds - 1.0),
                    remat::format_bytes(last.predicted_device_peak).c_str(),
                    remat::format_bytes(last.measured_device_peak).c_str(),
                    remat::format_bytes(last.predicted_host_peak).c_str(),
                    remat::format_bytes(last.measured_host_peak).c_str(),
                    remat::format_bytes(plan->report.bytes_to_host).c_str(),
                    remat::format_bytes(plan->report.bytes_to_device).c_str());
    }
    std::printf("  (measured overhead: median step through remat::OffloadStep, rollback copies included, against the "
                "plain step; the prediction's own reference is T_ref)\n");
}

}  // namespace

int main(int argc, char** argv) {
    Model m;
    std::size_t steps = 5;
    double milp_seconds = 20;
    std::optional<std::string> write_problem;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const auto value = [&] {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_offload: %s needs a value\n", arg.c_str());
                std::exit(2);
            }
            return std::string(argv[++i]);
        };
        if (arg == "--layers") m.layers = std::stoul(value());
        else if (arg == "--width") m.width = std::stod(value());
        else if (arg == "--tokens") m.tokens = std::stod(value());
        else if (arg == "--write-problem") write_problem = value();
        else if (arg == "--steps") steps = std::stoul(value());
        else if (arg == "--milp-seconds") milp_seconds = std::stod(value());
        else {
            std::fprintf(stderr, "usage: bench_offload [--layers L] [--width d] [--tokens T] [--steps N] [--milp-seconds S] "
                                 "[--write-problem FILE]\n");
            return 2;
        }
    }
    const Machine cpu{"CPU-like (100 GFLOP/s, 20 GB/s memory)", 1e11, 2e10};
    const Machine gpu{"GPU-like (100 TFLOP/s, 2 TB/s memory)", 1e14, 2e12};
    if (write_problem) {
        remat::io::write_file(*write_problem, remat::io::to_json(training(m, cpu, 12e9)));
        std::printf("wrote %s\n", write_problem->c_str());
        return 0;
    }
    std::printf("bench_offload: GPT-like, %zu blocks of width %.0f on %.0f tokens (fp32, Adam); predicted overhead vs "
                "T_ref (store-all, optimizer step after the backward) at total device budgets (%% of P_ref)\n",
                m.layers, m.width, m.tokens);
    for (const Machine& machine : {cpu, gpu})
        for (const double bandwidth : {12e9, 25e9}) table(m, machine, bandwidth);
#if defined(REMAT_WITH_CBC) || defined(REMAT_WITH_LPSOLVE)
    if (milp_seconds > 0)
        for (const std::size_t layers : {1, 2}) {
            Model small = m;
            small.layers = layers;
            for (const Machine& machine : {cpu, gpu}) iteration_against_milp(small, machine, 12e9, milp_seconds);
        }
#endif
    if (steps > 0) measured_on_cpu_backend(steps);
}
