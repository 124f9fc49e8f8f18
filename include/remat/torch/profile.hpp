// remat/torch/profile.hpp — measures a chain of stages into a remat.chain/1 Chain.
//
// Rotor's cost model (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal
// checkpointing for heterogeneous chains", 2019) needs per stage the forward and backward
// times, the output size, what a forward with autograd keeps, and the transient memory of
// both passes (docs/formats.md §5 (chains)). Following docs/design.md §1, principle 2, the bytes are measured by
// running and freeing with the executor's own primitives under a memory probe, so that
// the simulator's predicted peak is the peak the executor really reaches; times are medians
// of repeated runs. Write the result with remat::io::to_json(profile.chain) (io/json.hpp)
// for `remat-plan` to study.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "../core/chain.hpp"
#include "../core/problem.hpp"
#include "../core/errors.hpp"
#include "../core/progress.hpp"
#include "../core/timing.hpp"
#include "../io/budget.hpp"
#include "detail/op_clock.hpp"
#include "detail/runtime.hpp"
#include "memory.hpp"
#include "stage.hpp"

namespace remat::torch {

struct ProfileOptions {
    /// Name of the resulting chain.
    std::string name = "chain";
    /// Timed runs per stage; the median is kept.
    std::size_t repeats = 11;
    /// Untimed runs per stage before the timed ones.
    std::size_t warmup = 2;
    /// When profiling has run this long, the remaining stages are timed once, without warm-up.
    std::optional<double> time_limit_seconds;
    /// Receives one line when profiling starts and one when it ends (core/progress.hpp).
    ProgressCallback progress;
    /// Receives one line per stage with what was measured (remat-capture --verbose).
    ProgressCallback stage_progress;
};

/// What profiling found, beyond the chain itself.
struct ChainProfile {
    Chain chain;
    /// Per stage: whether its forward draws random numbers (the executor replays them).
    std::vector<char> random;
    /// The sample input the chain was measured on: plans are valid for inputs like it.
    std::vector<std::int64_t> input_sizes;
    at::ScalarType input_dtype = at::kFloat;
    c10::Device input_device = c10::Device(c10::DeviceType::CPU);
    bool input_requires_grad = false;
    /// Bytes a forward with autograd allocated beyond its output and what freeing its graph
    /// gave back, per stage: non-zero when a stage keeps tensors of its own between calls.
    std::vector<Bytes> unreleased_bytes;
    /// Per stage, the transient memory of the forward without autograd (above its input and
    /// output) and with autograd (above that and what it keeps). A chain has one forward
    /// overhead, the larger of the two (safe for both ops); measured_problem() keeps both.
    std::vector<Bytes> no_grad_overhead;
    std::vector<Bytes> grad_overhead;
    double seconds = 0.0;
};

/// Whether a tensor looks like the one a profile was made for (shape, dtype, device).
[[nodiscard]] inline bool matches(const ChainProfile& profile, const at::Tensor& input) {
    return input.defined() && input.sizes().vec() == profile.input_sizes && input.scalar_type() == profile.input_dtype &&
           input.device() == profile.input_device;
}

namespace detail {

inline std::string sizes_string(const std::vector<std::int64_t>& sizes) {
    std::string s = "[";
    for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
    return s + "]";
}

inline double median(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

using remat::seconds_since;

}  // namespace detail

namespace detail::profile {

/// Puts the model's buffers and the random generators back as they were, whatever happens
/// in between: profiling must leave no trace on the model.
class ModelStateGuard {
public:
    // Keeps the buffer handles themselves: the stage list may change (or be moved away)
    // before the guard restores them.
    ModelStateGuard(const StageList& stages, const c10::Device& device) : rng_(RngState::capture(device)) {
        for (const ChainStage& s : stages) {
            targets_.push_back(s.buffers);
            buffers_.emplace_back(s.buffers);
        }
    }
    ~ModelStateGuard() {
        for (std::size_t i = 0; i < targets_.size(); ++i) buffers_[i].restore(targets_[i]);
        rng_.restore();
    }
    ModelStateGuard(const ModelStateGuard&) = delete;
    ModelStateGuard& operator=(const ModelStateGuard&) = delete;

private:
    std::vector<std::vector<at::Tensor>> targets_;
    RngState rng_;
    std::vector<BufferSnapshot> buffers_;
};

/// Runs every stage once, forward (without and with autograd) and backward, both on the
/// calling thread, which runs the forwards that profiling measures and an executor issues, and
/// on the thread that runs the device's backward (detail::run_on_backward_thread says why),
/// before anything is measured. What it allocates for good — the libraries' per-thread
/// workspaces — is then part of the memory every measure starts from, not of a stage's
/// overhead. (Warming the backward thread alone left the calling thread's first matrix
/// product, stage 1's forward, charged with its cuBLAS and cuBLASLt workspaces: 33 MiB on an
/// H100, predicted but never allocated again by a step.)
inline void warm_up_threads(const StageList& stages, const at::Tensor& sample, const ParameterTable& table,
                            bool input_requires_grad) {
    const auto every_stage_once = [&] {
        at::Tensor x = sample.detach();
        for (std::size_t l = 0; l < stages.size(); ++l) {
            at::Tensor y = run_no_grad(stages[l], x);
            StageGraph graph = run_with_grad(stages[l], x, l > 0 || input_requires_grad);
            std::vector<at::Tensor> parameter_grads;
            (void)run_backward(graph, at::ones_like(graph.output), true, table.trainable[l], parameter_grads);
            x = std::move(y);
        }
    };
    every_stage_once();
    run_on_backward_thread(sample.device(), every_stage_once);
}

}  // namespace detail::profile

/// The chain's problem (docs/formats.md §5 (chains), the same data, ops and ids as to_problem) with each
/// forward's own measured overhead: F_l the no-grad one, F_l+ the with-grad one. Solvers
/// plan on the chain, whose single forward overhead is the larger of the two; a schedule of
/// one is a schedule of the other, and simulating it on this problem predicts the peak the
/// executor reaches, which the chain can only bound from above.
/// `loss_overhead`: the transient bytes of the loss, when the plan runs it (an offloading step
/// does; the drop-in module leaves it to the caller and measures it apart).
[[nodiscard]] inline Problem measured_problem(const ChainProfile& profile, Bytes loss_overhead = 0) {
    Problem chain_problem = to_problem(profile.chain);
    const std::size_t L = profile.chain.length();
    const bool both_forwards = profile.no_grad_overhead.size() == L && profile.grad_overhead.size() == L;
    if (!both_forwards && loss_overhead == 0) return chain_problem;
    const ChainIds ids = chain_ids(L);
    std::vector<Bytes> overhead;
    for (const Op& op : chain_problem.all_ops()) overhead.push_back(op.overhead);
    for (std::size_t l = 1; l <= L && both_forwards; ++l) {
        overhead[ids.fwd[l].index] = profile.no_grad_overhead[l - 1];
        overhead[ids.fwd_grad[l].index] = profile.grad_overhead[l - 1];
    }
    if (loss_overhead > 0) overhead[ids.loss.index] = loss_overhead;
    return chain_problem.with_overheads(overhead);
}

/// Fuses every stage whose output shares storage with its input (a view such as flatten,
/// or an in-place op) into its predecessor (or, for the first stage, its successor): the
/// executor frees an activation by releasing its storage, which must belong to it alone.
/// Runs the chain once without autograd on `sample`; the model's buffers and the random
/// generators are left as they were.
[[nodiscard]] inline StageList fuse_aliasing_stages(StageList stages, const at::Tensor& sample) {
    if (stages.empty()) throw InvalidInput("fuse_aliasing_stages: no stages");
    const detail::profile::ModelStateGuard guard(stages, sample.device());
    for (bool changed = true; changed;) {
        changed = false;
        at::Tensor x = sample.detach().clone();
        for (std::size_t l = 0; l < stages.size(); ++l) {
            const auto* input_storage = x.has_storage() ? x.storage().unsafeGetStorageImpl() : nullptr;
            at::Tensor y = detail::run_no_grad(stages[l], x);
            if (!y.defined())
                throw InvalidInput("stage '" + stages[l].name + "' returned an undefined tensor");
            const bool aliases = y.has_storage() && y.storage().unsafeGetStorageImpl() == input_storage;
            if (aliases) {
                if (stages.size() == 1)
                    throw InvalidInput("the only stage, '" + stages[0].name +
                                       "', returns a view of its input; there is nothing to checkpoint");
                const std::size_t first = l == 0 ? 0 : l - 1;
                ChainStage fused = fuse(stages, first, first + 2);
                stages.erase(stages.begin() + static_cast<std::ptrdiff_t>(first),
                             stages.begin() + static_cast<std::ptrdiff_t>(first + 2));
                stages.insert(stages.begin() + static_cast<std::ptrdiff_t>(first), std::move(fused));
                changed = true;
                break;
            }
            x = std::move(y);
        }
    }
    return stages;
}

/// Measures each stage on `sample` (the input of the first stage) and returns the chain.
/// The model's parameters, gradients, buffers and random generators are left unchanged.
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ChainProfile profile_chain(const StageList& stages, const at::Tensor& sample,
                                         const ProfileOptions& options = {}, Probe probe = Probe{}) {
    if (stages.empty()) throw InvalidInput("profile_chain: no stages");
    if (!sample.defined()) throw InvalidInput("profile_chain: the sample input is undefined");
    if (options.repeats == 0) throw InvalidInput("profile_chain: repeats must be at least 1");
    check_probe_device(probe, sample.device(), "profile_chain");
    const auto start = detail::Clock::now();
    report_progress(options.progress, "remat: profiling '" + options.name + "' (" + std::to_string(stages.size()) +
                                          " stages, " + std::to_string(options.warmup) + " + " +
                                          std::to_string(options.repeats) + " runs each)");
    const c10::Device device = sample.device();
    const detail::profile::ModelStateGuard guard(stages, device);
    const detail::ParameterTable table(stages);

    ChainProfile result;
    result.chain.name = options.name;
    result.chain.input_bytes = detail::storage_bytes(sample);
    result.input_sizes = sample.sizes().vec();
    result.input_dtype = sample.scalar_type();
    result.input_device = device;
    result.input_requires_grad = sample.requires_grad();

    if (!device.is_cpu()) detail::profile::warm_up_threads(stages, sample, table, result.input_requires_grad);

    at::Tensor x = sample.detach();
    for (std::size_t l = 0; l < stages.size(); ++l) {
        const ChainStage& stage = stages[l];
        const bool input_grad = l > 0 || result.input_requires_grad;
        const std::string who = "stage " + std::to_string(l + 1) + " ('" + stage.name + "')";
        Stage measured;
        measured.name = stage.name;

        // Output, randomness, and the forward without autograd.
        const detail::RngState before = detail::RngState::capture(device);
        probe.reset_peak();
        Bytes c0 = probe.current();
        at::Tensor y;
        try {
            y = detail::run_no_grad(stage, x);
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            throw ExecutionError("profiling " + who + ": its forward threw: " + e.what());
        }
        detail::check_output_is_fresh(stage, x, y);
        const Bytes out_bytes = detail::storage_bytes(y);
        const Bytes overhead_no_grad = probe.peak() - c0 - out_bytes;
        result.random.push_back(detail::RngState::capture(device) == before ? 0 : 1);
        measured.out_bytes = out_bytes;

        // The forward with autograd: what stays, and what freeing its graph gives back.
        Bytes overhead_grad = 0;
        {
            c0 = probe.current();
            probe.reset_peak();
            detail::StageGraph graph = detail::run_with_grad(stage, x, input_grad);
            const at::Tensor kept_output = graph.output.detach();
            const Bytes c1 = probe.current();
            overhead_grad = probe.peak() - c1;
            graph.clear();
            const Bytes freed = c1 - probe.current();
            measured.saved_bytes = out_bytes + std::max<Bytes>(freed, 0);
            result.unreleased_bytes.push_back(std::max<Bytes>((c1 - c0) - out_bytes - freed, 0));
        }
        measured.fwd_overhead = std::max<Bytes>({overhead_no_grad, overhead_grad, 0});
        result.no_grad_overhead.push_back(std::max<Bytes>(overhead_no_grad, 0));
        result.grad_overhead.push_back(std::max<Bytes>(overhead_grad, 0));

        // The backward: transient memory above its inputs and the input gradient it writes.
        {
            detail::StageGraph graph = detail::run_with_grad(stage, x, input_grad);
            const at::Tensor kept_output = graph.output.detach();
            const at::Tensor grad = at::ones_like(kept_output);
            std::vector<at::Tensor> parameter_grads;
            c0 = probe.current();
            probe.reset_peak();
            const at::Tensor input_grad_tensor =
                detail::run_backward(graph, grad, input_grad, table.trainable[l], parameter_grads);
            measured.bwd_overhead = std::max<Bytes>(probe.peak() - c0 - detail::storage_bytes(input_grad_tensor), 0);
        }

        // Times: medians of runs with autograd (the forward that a backward needs) and backwards.
        const bool rushed = options.time_limit_seconds && detail::seconds_since(start) > *options.time_limit_seconds;
        const std::size_t warmup = rushed ? 0 : options.warmup;
        const std::size_t repeats = rushed ? 1 : options.repeats;
        std::vector<double> forward_times, backward_times;
        const at::Tensor grad = at::ones_like(y);
        // The executors' clock (thread CPU time with one thread on the CPU; CUDA events on a GPU).
        detail::IntervalTimer timer(device);
        for (std::size_t r = 0; r < warmup + repeats; ++r) {
            std::vector<at::Tensor> parameter_grads;
            timer.start();
            detail::StageGraph graph = detail::run_with_grad(stage, x, input_grad);
            const double forward_seconds = timer.stop();
            timer.start();
            const at::Tensor g = detail::run_backward(graph, grad, input_grad, table.trainable[l], parameter_grads);
            const double backward_seconds = timer.stop();
            if (r >= warmup) {
                forward_times.push_back(forward_seconds);
                backward_times.push_back(backward_seconds);
            }
        }
        measured.fwd_time = detail::median(forward_times);
        measured.bwd_time = detail::median(backward_times);

        std::ostringstream line;
        line << "profile " << who << ": fwd " << measured.fwd_time * 1e3 << " ms, bwd " << measured.bwd_time * 1e3
             << " ms, out " << format_bytes(measured.out_bytes) << ", saved " << format_bytes(measured.saved_bytes)
             << ", overheads " << format_bytes(measured.fwd_overhead) << " / " << format_bytes(measured.bwd_overhead)
             << (result.random.back() ? ", random" : "") << (rushed ? " (time limit: timed once)" : "");
        if (result.unreleased_bytes.back() > 0)
            line << "; warning: " << format_bytes(result.unreleased_bytes.back())
                 << " allocated by its forward are held elsewhere (a stage should keep no tensors between calls)";
        report_progress(options.stage_progress, line.str());

        result.chain.stages.push_back(std::move(measured));
        x = std::move(y);
    }
    validate(result.chain);
    result.seconds = detail::seconds_since(start);
    report_progress(options.progress, "remat: profiled '" + options.name + "' in " + std::to_string(result.seconds) + " s");
    return result;
}

}  // namespace remat::torch
