// remat/torch/capture/profile_ops.hpp — phase 3 of capture: measure every op group with the
// executor's own primitives (program.hpp), under a memory probe.
//
// docs/design.md §1, principle 2: bytes are what freeing really gives back, so that the simulator's
// predicted peak is the executor's measured one. Per group: output bytes, saved state,
// transient overheads, median times of the three passes, whether it draws random numbers
// or updates buffers, and what its backward really reads — found by overwriting each
// candidate's memory (NaN, then other values) under a retained graph and comparing the
// gradients. Last, every parameter that plain autograd gives a gradient must get one from
// some group: capture refuses rather than drop a gradient.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../../core/errors.hpp"
#include "../../io/budget.hpp"
#include "../detail/op_clock.hpp"
#include "../detail/runtime.hpp"
#include "../memory.hpp"
#include "../profile.hpp"
#include "group.hpp"
#include "options.hpp"
#include "trace.hpp"

namespace remat::torch::detail::capture {

/// What profiling found beyond the groups' own fields.
struct Profile {
    std::vector<CapturedOp> info;                              // per group
    std::vector<std::vector<std::size_t>> backward_reads;      // per group: value ids its backward reads
    std::map<std::pair<std::size_t, std::size_t>, Bytes> grad_bytes;  // (group, input) → bytes
    std::vector<char> requires_grad;                           // per value id
};

[[nodiscard]] inline Bytes distinct_bytes(const std::vector<at::Tensor>& tensors) {
    return distinct_storage_bytes(tensors);
}

/// Every parameter that plain autograd gives a gradient (`plain_grads`, from the reference
/// step of reference.hpp) must be among `reached` (the parameters some captured backward
/// differentiates), or training through the capture would silently leave it out.
inline void check_gradient_coverage(const std::vector<at::Tensor>& plain_grads, const std::vector<std::string>& names,
                                    const std::unordered_set<std::size_t>& reached, const std::string& who) {
    for (std::size_t p = 0; p < plain_grads.size(); ++p)
        if (plain_grads[p].defined() && !reached.contains(p))
            throw InvalidInput(who + ": parameter '" + names.at(p) +
                               "' gets a gradient from plain autograd but from no captured op; training through this "
                               "capture would leave it out. This is a bug in capture: please report it with the model");
}

template <class Probe>
class Profiler {
public:
    /// `plain_grads`: each parameter's gradient in plain autograd (reference.hpp).
    Profiler(Core& core, const Trace& trace, const Grouping& grouping, const std::vector<at::Tensor>& plain_grads,
             const CaptureOptions& options, Probe& probe, std::string who)
        : core_(core), trace_(trace), grouping_(grouping), plain_grads_(plain_grads),
          options_(options), probe_(probe), who_(std::move(who)), start_buffers_(trace.buffers) {}

    [[nodiscard]] Profile run() {
        check_device();
        profile_.info.assign(core_.groups.size(), CapturedOp{});
        profile_.requires_grad.assign(trace_.values.size(), 0);
        for (std::size_t i = 0; i < trace_.input_leaves.size(); ++i)
            profile_.requires_grad[trace_.input_leaves[i]] = trace_.inputs[i].requires_grad && differentiable_type(input(i));
        start_ = Clock::now();
        if (!core_.device.is_cpu()) warm_up_backward_thread();
        for (std::size_t k = 0; k < core_.groups.size(); ++k) profile_forward(k);
        for (const std::size_t id : grouping_.output_values)
            if (profile_.requires_grad[id]) {
                contributions_[id].push_back(npos);  // the loss
                contribution_layouts_[id].emplace_back();
            }
        profile_.backward_reads.assign(core_.groups.size(), {});
        for (std::size_t k = core_.groups.size(); k-- > 0;) profile_backward(k);
        for (std::size_t k = 0; k < core_.groups.size(); ++k) describe(k);
        order_shared_buffers();
        check_gradient_coverage();
        return std::move(profile_);
    }

private:
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

    [[nodiscard]] const at::Tensor& input(std::size_t leaf) const {
        return trace_.values[trace_.input_leaves[leaf]].value.toTensor();
    }

    void check_device() const { check_probe_device(probe_, core_.device, who_); }

    [[nodiscard]] std::vector<at::Tensor> inputs_of(const Group& g) const {
        std::vector<at::Tensor> result;
        for (const std::size_t id : g.inputs) result.push_back(trace_.values[id].value.toTensor());
        return result;
    }

    [[nodiscard]] bool rushed() const {
        return options_.time_limit_seconds && seconds_since(start_) > *options_.time_limit_seconds;
    }
    [[nodiscard]] std::size_t runs() const { return rushed() ? 1 : options_.warmup + options_.repeats; }
    [[nodiscard]] bool timed(std::size_t r) const { return rushed() || r >= options_.warmup; }

    // Profiling runs a group several times; its buffer updates must not accumulate.
    void restore_buffers() { start_buffers_.restore(trace_.buffers); }

    template <class F>
    auto run_guarded(const Group& g, F&& f) -> decltype(f()) {
        try {
            return f();
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            throw InvalidInput(who_ + ": op '" + g.name + "' (root " + g.where + ") failed when run on its own: " +
                               error_message(e));
        }
    }

    // Every op's forward once, without and with autograd, on the thread that runs the
    // device's backward, where the drop-in modules recompute (detail::run_on_backward_thread
    // says why): the libraries' per-thread workspaces are then allocated before anything is
    // measured. (The reference step has run every backward there already.)
    void warm_up_backward_thread() {
        run_on_backward_thread(core_.device, [&] {
            for (const Group& g : core_.groups) {
                const std::vector<at::Tensor> inputs = inputs_of(g);
                run_guarded(g, [&] {
                    (void)run_no_grad(core_, g, inputs);
                    (void)run_with_grad(core_, g, inputs);
                });
            }
        });
        restore_buffers();
    }

    // ---------------------------------------------------------------- forward

    void profile_forward(std::size_t k) {
        Group& g = core_.groups[k];
        CapturedOp& info = profile_.info[k];
        const std::vector<at::Tensor> inputs = inputs_of(g);
        for (std::size_t i = 0; i < g.inputs.size(); ++i)
            g.input_differentiable[i] = profile_.requires_grad[g.inputs[i]] && differentiable_type(inputs[i]);
        check_outputs(g, inputs);
        measure_no_grad(g, info, inputs);
        measure_with_grad(g, info, inputs);
        info.forward_time = time_no_grad(g, inputs);
    }

    // Outputs must own their memory: one that shares storage with an input, a parameter, a
    // buffer, a frozen tensor or another output is copied (freeing it would free the other).
    void check_outputs(Group& g, const std::vector<at::Tensor>& inputs) {
        std::vector<at::Tensor> outs = run_guarded(g, [&] { return run_no_grad(core_, g, inputs); });
        std::unordered_set<const void*> taken(trace_.module_storages.begin(), trace_.module_storages.end());
        for (const at::Tensor& t : inputs) taken.insert(storage_of(t));
        for (const void* s : g.frozen_storages) taken.insert(s);
        for (std::size_t o = 0; o < outs.size(); ++o) {
            if (!outs[o].defined() || !outs[o].has_storage())
                throw InvalidInput(who_ + ": op '" + g.name + "' (root " + g.where +
                                   ") returns a tensor without storage; capture needs dense tensors");
            if (!taken.insert(storage_of(outs[o])).second) g.clone_output[o] = 1;
        }
        restore_buffers();
    }

    // Without autograd: bytes, overhead, randomness, buffers it updates.
    void measure_no_grad(Group& g, CapturedOp& info, const std::vector<at::Tensor>& inputs) {
        const BufferSnapshot before(trace_.buffers);
        const RngState rng = RngState::capture(core_.device);
        probe_.reset_peak();
        const Bytes c0 = probe_.current();
        std::vector<at::Tensor> outs = run_guarded(g, [&] { return run_no_grad(core_, g, inputs); });
        info.output_bytes = distinct_bytes(outs);
        info.forward_overhead = std::max<Bytes>(probe_.peak() - c0 - info.output_bytes, 0);
        g.random = !(RngState::capture(core_.device) == rng);
        for (std::size_t b = 0; b < trace_.buffers.size(); ++b)
            if (!before.same_as(b, trace_.buffers[b])) g.buffers.push_back(trace_.buffers[b]);
        restore_buffers();
    }

    // With autograd: saved state, overhead, which outputs need gradients.
    void measure_with_grad(Group& g, CapturedOp& info, const std::vector<at::Tensor>& inputs) {
        probe_.reset_peak();
        {
            GroupGraph graph = run_guarded(g, [&] { return run_with_grad(core_, g, inputs); });
            const Bytes c1 = probe_.current();
            info.forward_grad_overhead = std::max<Bytes>(probe_.peak() - c1, 0);
            std::vector<at::Tensor> kept;
            for (std::size_t o = 0; o < graph.outputs.size(); ++o) {
                const bool rg = graph.outputs[o].requires_grad();
                g.output_requires_grad[o] = rg;
                profile_.requires_grad[g.outputs[o]] = rg;
                g.has_backward = g.has_backward || rg;
                kept.push_back(graph.outputs[o].detach());
            }
            graph.clear();
            info.saved_bytes = std::max<Bytes>(c1 - probe_.current(), 0);
        }
        restore_buffers();
    }

    double time_no_grad(const Group& g, const std::vector<at::Tensor>& inputs) {
        IntervalTimer timer(core_.device);
        std::vector<double> times;
        const std::size_t n = runs();
        for (std::size_t r = 0; r < n; ++r) {
            timer.start();
            double seconds = 0.0;
            {
                const std::vector<at::Tensor> o = run_no_grad(core_, g, inputs);
                seconds = timer.stop();
            }
            if (timed(r)) times.push_back(seconds);
        }
        restore_buffers();
        return median(times);
    }

    // ---------------------------------------------------------------- backward

    // Incoming gradients for a backward: one random contribution per consumer whose backward
    // gives one, in the layout that consumer's backward gave it (the consumers are profiled
    // first), and one from the loss, like the output, for returned outputs. The layout
    // matters: a backward handed a strided gradient (a transpose's) may copy it first, and the
    // step pays that copy.
    [[nodiscard]] std::vector<std::vector<at::Tensor>> incoming_for(const Group& g,
                                                                    const std::vector<at::Tensor>& outs) const {
        std::vector<std::vector<at::Tensor>> incoming(g.outputs.size());
        const at::NoGradGuard no_grad;
        for (std::size_t o = 0; o < g.outputs.size(); ++o) {
            if (!g.output_requires_grad[o]) continue;
            const auto found = contribution_layouts_.find(g.outputs[o]);
            if (found == contribution_layouts_.end()) continue;
            for (const std::optional<TensorMeta>& layout : found->second)
                incoming[o].push_back(layout && layout->sizes == outs[o].sizes().vec() ? random_in(*layout)
                                                                                        : at::randn_like(outs[o]));
        }
        return incoming;
    }

    // Contributions like those the group's backward adds first (Group::input_seeds), per input.
    [[nodiscard]] std::vector<std::vector<at::Tensor>> seeds_for(std::size_t k, const std::vector<at::Tensor>& inputs) const {
        const Group& g = core_.groups[k];
        std::vector<std::vector<at::Tensor>> seeds(g.inputs.size());
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < g.inputs.size(); ++i) {
            if (g.input_seeds[i] == 0) continue;
            const auto& layouts = contribution_layouts_.at(g.inputs[i]);
            for (std::size_t c = 0; c < g.input_seeds[i]; ++c) {
                const std::optional<TensorMeta>& layout = layouts[c];
                seeds[i].push_back(layout && layout->sizes == inputs[i].sizes().vec() ? random_in(*layout)
                                                                                      : at::randn_like(inputs[i]));
            }
        }
        return seeds;
    }

    // Random values in a tensor of this layout, filled through its whole storage (the strides
    // may overlap, as an expanded gradient's do).
    [[nodiscard]] static at::Tensor random_in(const TensorMeta& layout) {
        const at::Tensor t = at::empty_strided(layout.sizes, layout.strides, layout.options);
        const auto elements = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
        t.as_strided({elements}, {1}, 0).normal_();
        return t;
    }

    static bool same(const at::Tensor& a, const at::Tensor& b) {
        if (a.defined() != b.defined()) return false;
        if (!a.defined()) return true;
        return a.sizes() == b.sizes() && at::equal(a, b);
    }
    static bool same(const BackwardResult& a, const BackwardResult& b) {
        for (std::size_t i = 0; i < a.input_grads.size(); ++i)
            if (!same(a.input_grads[i], b.input_grads[i])) return false;
        for (std::size_t i = 0; i < a.parameter_grads.size(); ++i)
            if (!same(a.parameter_grads[i], b.parameter_grads[i])) return false;
        return true;
    }

    // Whether the backward reads the memory of `t`: overwrite it (NaN, then other values) and
    // compare the gradients with the reference. Memory is written through a tensor of its own
    // on the same storage, so no version counter notices, and put back afterwards.
    bool backward_reads(const Group& g, GroupGraph& graph, const std::vector<std::vector<at::Tensor>>& incoming,
                        const BackwardResult& reference, const at::Tensor& t) const {
        if (!differentiable_type(t) || !t.has_storage()) return true;
        const at::NoGradGuard no_grad;
        const c10::Storage storage = t.storage();
        const auto n = static_cast<std::int64_t>(storage.nbytes() / t.element_size());
        at::Tensor raw = at::empty({0}, t.options().requires_grad(false));
        raw.set_(storage, 0, {n}, {1});
        if (raw.is_complex()) raw = at::view_as_real(raw);  // NaN and random values, part by part
        const at::Tensor original = raw.clone();
        bool used = false;
        for (int pass = 0; pass < 2 && !used; ++pass) {
            if (pass == 0)
                raw.fill_(std::numeric_limits<double>::quiet_NaN());
            else
                raw.uniform_(-3.0, 3.0);
            try {
                const BackwardResult r = run_backward(g, graph, incoming, /*retain_graph=*/true);
                used = !same(r, reference);
            } catch (const std::exception&) {
                used = true;
            }
        }
        raw.copy_(original);
        return used;
    }

    void profile_backward(std::size_t k) {
        Group& g = core_.groups[k];
        if (!g.has_backward) return;
        const std::vector<at::Tensor> inputs = inputs_of(g);
        find_backward_reads(k, inputs);
        measure_backward(k, inputs);
        time_backward(k, inputs);
    }

    // What the backward reads, which inputs it gives a gradient, which parameters it reaches.
    void find_backward_reads(std::size_t k, const std::vector<at::Tensor>& inputs) {
        const Group& g = core_.groups[k];
        {
            GroupGraph graph = run_guarded(g, [&] { return run_with_grad(core_, g, inputs); });
            const auto incoming = incoming_for(g, graph.outputs);
            const BackwardResult reference = run_backward(g, graph, incoming, /*retain_graph=*/true);
            for (std::size_t j = 0; j < g.parameters.size(); ++j)
                if (reference.parameter_grads[j].defined()) reached_.insert(g.parameters[j]);
            auto& reads = profile_.backward_reads[k];
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                if (reference.input_grads[i].defined()) {
                    // Autograd's engine adds every contribution of a value in one order (the
                    // loss's, then its consumers' from the last node); a group that reads it
                    // twice adds the others' first, or the sum rounds otherwise.
                    const std::size_t earlier = contributions_[g.inputs[i]].size();
                    if (g.input_uses[i] >= 2 && earlier > 0) core_.groups[k].input_seeds[i] = earlier;
                    contributions_[g.inputs[i]].push_back(k);
                    contribution_layouts_[g.inputs[i]].push_back(TensorMeta::of(reference.input_grads[i]));
                }
                if (backward_reads(g, graph, incoming, reference, graph.leaves[i])) reads.push_back(g.inputs[i]);
            }
            for (std::size_t o = 0; o < g.outputs.size(); ++o)
                if (backward_reads(g, graph, incoming, reference, graph.outputs[o])) reads.push_back(g.outputs[o]);
        }
        restore_buffers();
    }

    // Bytes and overhead of the backward.
    void measure_backward(std::size_t k, const std::vector<at::Tensor>& inputs) {
        const Group& g = core_.groups[k];
        {
            GroupGraph graph = run_with_grad(core_, g, inputs);
            const auto incoming = incoming_for(g, graph.outputs);
            const auto seeds = seeds_for(k, inputs);
            const Bytes c0 = probe_.current();
            probe_.reset_peak();
            const BackwardResult r = run_backward(g, graph, incoming, /*retain_graph=*/false, seeds);
            const Bytes written = distinct_bytes(r.input_grads);
            profile_.info[k].backward_overhead = std::max<Bytes>(probe_.peak() - c0 - written, 0);
            for (std::size_t i = 0; i < g.inputs.size(); ++i)
                if (r.input_grads[i].defined()) profile_.grad_bytes[{k, i}] = storage_bytes(r.input_grads[i]);
        }
        restore_buffers();
    }

    // Times of the forward with autograd and of the backward.
    void time_backward(std::size_t k, const std::vector<at::Tensor>& inputs) {
        const Group& g = core_.groups[k];
        IntervalTimer timer(core_.device);
        std::vector<double> forward_times, backward_times;
        const std::size_t n = runs();
        for (std::size_t r = 0; r < n; ++r) {
            timer.start();
            GroupGraph graph = run_with_grad(core_, g, inputs);
            const double forward_seconds = timer.stop();
            const auto incoming = incoming_for(g, graph.outputs);
            const auto seeds = seeds_for(k, inputs);
            double backward_seconds = 0.0;
            timer.start();
            {
                const BackwardResult result = run_backward(g, graph, incoming, /*retain_graph=*/false, seeds);
                backward_seconds = timer.stop();
            }
            if (timed(r)) {
                forward_times.push_back(forward_seconds);
                backward_times.push_back(backward_seconds);
            }
        }
        restore_buffers();
        profile_.info[k].forward_grad_time = median(forward_times);
        profile_.info[k].backward_time = median(backward_times);
    }

    // ---------------------------------------------------------------- summary and checks

    void describe(std::size_t k) {
        const Group& g = core_.groups[k];
        CapturedOp& info = profile_.info[k];
        if (!g.has_backward) info.forward_grad_time = info.forward_time;
        info.name = g.name;
        info.source = g.where;
        info.random = g.random;
        info.mutates_buffers = !g.buffers.empty();
        info.has_backward = g.has_backward;
        for (const Instr& instr : g.program) info.nodes.push_back(label(instr));
        std::ostringstream line;
        line << "capture op " << g.name << " (" << info.nodes.size() << " nodes): fwd " << info.forward_time * 1e3
             << " ms, fwd+ " << info.forward_grad_time * 1e3 << " ms, bwd " << info.backward_time * 1e3 << " ms, out "
             << format_bytes(info.output_bytes) << ", saved " << format_bytes(info.saved_bytes)
             << (g.random ? ", random" : "") << (g.buffers.empty() ? "" : ", updates buffers");
        report_progress(options_.op_progress, line.str());
    }

    // A buffer one op updates and another op reads (or updates too) would see the updates in
    // the order the plan runs them, which may not be the module's. Every plan keeps the
    // module's order of their first runs, and a recomputation starts from the buffers its
    // first run found and puts back those it found (KeepsStateForReruns, rerun_buffers):
    // - the reader needs the updater's output: each of its runs comes after the update (a
    //   step counter added to an output);
    // - the updater needs the reader's output: the reader's first run comes before the
    //   update, and the buffer joins the reader's rerun_buffers (an average scaled by one op,
    //   added to by the next);
    // - no data orders them (one batch norm applied to two independent branches): the later
    //   one in the module's order reads a zero-byte datum the earlier one writes
    //   (Group::runs_after), and the buffer joins the earlier one's rerun_buffers when the
    //   later one updates it.
    void order_shared_buffers() {
        for (Group& g : core_.groups) g.rerun_buffers = g.buffers;
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            if (core_.groups[k].buffers.empty()) continue;
            const std::vector<bool> after = groups_needing(k);
            for (const at::Tensor& b : core_.groups[k].buffers) {
                const void* s = storage_of(b);
                for (std::size_t j = 0; j < core_.groups.size(); ++j) {
                    Group& reader = core_.groups[j];
                    const auto& read = reader.frozen_storages;
                    if (j == k || after[j] || std::find(read.begin(), read.end(), s) == read.end()) continue;
                    if (!groups_needing(j)[k]) order_first_runs(std::min(j, k), std::max(j, k));
                    if (j < k) keep_for_reruns(reader, b);
                }
            }
        }
    }

    static void keep_for_reruns(Group& reader, const at::Tensor& buffer) {
        const void* s = storage_of(buffer);
        auto& kept = reader.rerun_buffers;
        if (std::none_of(kept.begin(), kept.end(), [&](const at::Tensor& t) { return storage_of(t) == s; }))
            kept.push_back(buffer);
    }

    void order_first_runs(std::size_t earlier, std::size_t later) {
        auto& list = core_.groups[later].runs_after;
        if (std::find(list.begin(), list.end(), earlier) == list.end()) list.push_back(earlier);
    }

    // The groups that read, directly or through others, an output of group k (groups are in
    // the module's order: a reader comes after what it reads).
    [[nodiscard]] std::vector<bool> groups_needing(std::size_t k) const {
        std::vector<bool> needs(core_.groups.size(), false);
        std::unordered_set<std::size_t> reached(core_.groups[k].outputs.begin(), core_.groups[k].outputs.end());
        for (std::size_t j = k + 1; j < core_.groups.size(); ++j) {
            const Group& g = core_.groups[j];
            needs[j] = std::any_of(g.inputs.begin(), g.inputs.end(), [&](std::size_t id) { return reached.contains(id); });
            if (needs[j]) reached.insert(g.outputs.begin(), g.outputs.end());
        }
        return needs;
    }

    void check_gradient_coverage() const {
        capture::check_gradient_coverage(plain_grads_, trace_.parameter_names, reached_, who_);
    }

    Core& core_;
    const Trace& trace_;
    const Grouping& grouping_;
    const std::vector<at::Tensor>& plain_grads_;
    const CaptureOptions& options_;
    Probe& probe_;
    std::string who_;
    BufferSnapshot start_buffers_;
    Profile profile_;
    std::unordered_map<std::size_t, std::vector<std::size_t>> contributions_;  // value → consumer groups
    // value → the layout of each contribution (none: the loss's)
    std::unordered_map<std::size_t, std::vector<std::optional<TensorMeta>>> contribution_layouts_;
    std::unordered_set<std::size_t> reached_;  // parameters some backward differentiates
    Clock::time_point start_ = Clock::now();
};

}  // namespace remat::torch::detail::capture
