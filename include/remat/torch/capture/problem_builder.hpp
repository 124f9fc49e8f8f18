// remat/torch/capture/problem_builder.hpp — phase 4 of capture: write the remat.problem/1
// problem (docs/formats.md §1 (problems)) of the profiled op groups.
//
// Per group G: a no-grad forward `F:G`, a forward with autograd `F+:G` that also writes
// the saved state `s:G`, and an exactly-once backward `B:G` that reads the gradient
// contributions of G's outputs, `s:G`, and the inputs and outputs its backward really
// reads, and writes one contribution `g:X<G` per input X it differentiates (or a marker
// `done:G` when it differentiates none). The loss reads the outputs and writes their
// gradients `g:X<loss`. A zero-byte `order:A<B` keeps the module's order of two groups that
// share a buffer one of them updates (Group::runs_after). The autograd order is every
// forward with grad, the loss, then every backward from the last: what plain autograd runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "group.hpp"
#include "profile_ops.hpp"
#include "trace.hpp"

namespace remat::torch::detail::capture {

class ProblemWriter {
public:
    ProblemWriter(Core& core, const Trace& trace, const Grouping& grouping, Profile& profile, std::string who)
        : core_(core), trace_(trace), grouping_(grouping), profile_(profile), who_(std::move(who)), builder_(core.name) {}

    void run() {
        add_inputs();
        add_activations();
        add_gradients();
        add_loss_gradients();
        add_order_data();
        connect_contributions();
        add_ops();
        name_op_data();
        core_.problem = builder_.build();
        core_.ops = std::move(ops_);
        core_.data = std::move(data_);
        core_.info = std::move(profile_.info);
    }

private:
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

    DataId add_data(const std::string& name, Bytes bytes, DataEntry entry) {
        const DataId id = builder_.add_data(name, bytes);
        data_.push_back(entry);
        bytes_.push_back(bytes);
        return id;
    }
    OpId add_op(OpSpec spec, OpEntry entry) {
        const OpId id = builder_.add_op(std::move(spec));
        ops_.push_back(entry);
        return id;
    }
    [[nodiscard]] std::string data_name(std::size_t id) const {
        const auto it = names_.find(id);
        return it == names_.end() ? trace_.values[id].name : it->second;
    }

    void add_inputs() {
        for (std::size_t i = 0; i < trace_.input_leaves.size(); ++i) {
            InputInfo& in = core_.inputs[i];
            const std::size_t id = trace_.input_leaves[i];
            const std::string name = "in:" + in.name;
            in.data = add_data(name, storage_bytes(trace_.values[id].value.toTensor()), DataEntry{DataRole::activation, 0, true, i});
            builder_.add_initial(in.data);
            activation_[id] = in.data;
            names_[id] = name;
        }
    }

    // Activations and saved state, group by group.
    void add_activations() {
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            Group& g = core_.groups[k];
            for (std::size_t o = 0; o < g.outputs.size(); ++o) {
                const std::string name = g.outputs.size() == 1 ? g.name : g.name + ":" + std::to_string(o);
                const at::Tensor& t = trace_.values[g.outputs[o]].value.toTensor();
                // Bytes of the output as the group's run makes it (a copy when it had to be cloned).
                const Bytes bytes = g.clone_output[o] ? static_cast<Bytes>(t.numel()) * static_cast<Bytes>(t.element_size())
                                                      : storage_bytes(t);
                const DataId d = add_data(name, bytes, DataEntry{DataRole::activation, k, false, o});
                g.output_data.push_back(d);
                activation_[g.outputs[o]] = d;
                names_[g.outputs[o]] = name;
            }
            if (g.has_backward)
                g.saved = add_data("s:" + g.name, profile_.info[k].saved_bytes, DataEntry{DataRole::saved, k, false, 0});
        }
    }

    // Gradient contributions: g:X<G for every input X that G's backward differentiates.
    void add_gradients() {
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            Group& g = core_.groups[k];
            g.input_data.clear();
            for (const std::size_t id : g.inputs) g.input_data.push_back(activation_.at(id));
            g.input_grad.assign(g.inputs.size(), std::nullopt);
            if (!g.has_backward) continue;
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                const auto found = profile_.grad_bytes.find({k, i});
                if (found == profile_.grad_bytes.end()) continue;
                g.input_grad[i] = add_data("g:" + data_name(g.inputs[i]) + "<" + g.name, found->second,
                                           DataEntry{DataRole::gradient, k, false, i});
            }
            const bool writes = std::any_of(g.input_grad.begin(), g.input_grad.end(), [](const auto& d) { return d.has_value(); });
            if (!writes) g.marker = add_data("done:" + g.name, 0, DataEntry{DataRole::marker, k, false, 0});
        }
    }

    void add_loss_gradients() {
        const auto& outputs = grouping_.output_values;
        core_.output_data.clear();
        core_.output_grad.assign(outputs.size(), std::nullopt);
        for (std::size_t o = 0; o < outputs.size(); ++o) {
            const std::size_t id = outputs[o];
            const DataId d = activation_.at(id);
            core_.output_data.push_back(d);
            // Autograd makes the loss's gradient dense, of the output's shape: not of its
            // storage, which a kernel may have allocated larger (col2im's is the input's size).
            const at::Tensor& t = trace_.values[id].value.toTensor();
            const Bytes gradient_bytes = static_cast<Bytes>(t.numel()) * static_cast<Bytes>(t.element_size());
            if (profile_.requires_grad[id])
                core_.output_grad[o] =
                    add_data("g:" + data_name(id) + "<loss", gradient_bytes, DataEntry{DataRole::gradient, npos, false, o});
        }
        const bool any = std::any_of(core_.output_grad.begin(), core_.output_grad.end(), [](const auto& d) { return d.has_value(); });
        if (!any)
            throw InvalidInput(who_ + ": no output of forward requires a gradient (no parameter or input that requires "
                                      "grad reaches it); there is nothing to train");
    }

    // A zero-byte datum per pair of groups whose first runs must keep the module's order (a
    // buffer they share, Group::runs_after): the earlier one's forwards write it, the later
    // one's read it.
    void add_order_data() {
        order_writes_.assign(core_.groups.size(), {});
        order_reads_.assign(core_.groups.size(), {});
        for (std::size_t later = 0; later < core_.groups.size(); ++later)
            for (const std::size_t earlier : core_.groups[later].runs_after) {
                const DataId d = add_data("order:" + core_.groups[earlier].name + "<" + core_.groups[later].name, 0,
                                          DataEntry{DataRole::marker, earlier, false, 0});
                order_writes_[earlier].push_back(d);
                order_reads_[later].push_back(d);
            }
    }

    // Which contributions each group's backward reads, per output, in the order plain
    // autograd's engine sums them — the loss's first, then the consumers' from the last one —
    // so that a sum of three or more rounds as it does there. A consumer that reads the value
    // more than once adds the contributions before its own itself (Group::seed), between
    // which the engine adds its uses one by one.
    void connect_contributions() {
        std::unordered_map<std::size_t, std::pair<std::size_t, std::size_t>> producer;  // value → (group, output)
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            Group& g = core_.groups[k];
            g.incoming.assign(g.outputs.size(), {});
            for (std::size_t o = 0; o < g.outputs.size(); ++o) producer[g.outputs[o]] = {k, o};
        }
        const auto deliver = [&](std::size_t id, DataId contribution) {
            const auto [k, o] = producer.at(id);
            core_.groups[k].incoming[o].push_back(contribution);
        };
        for (std::size_t o = 0; o < grouping_.output_values.size(); ++o)
            if (core_.output_grad[o]) deliver(grouping_.output_values[o], *core_.output_grad[o]);
        for (std::size_t k = core_.groups.size(); k-- > 0;) {
            Group& g = core_.groups[k];
            g.seed.assign(g.inputs.size(), {});
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                if (!g.input_grad[i]) continue;
                const std::size_t id = g.inputs[i];
                std::vector<DataId>& so_far = contributions_so_far(id, producer);
                if (g.input_seeds[i] > 0) {
                    // Its backward adds those first, and writes the sum (Group::input_seeds).
                    g.seed[i] = std::move(so_far);
                    so_far.clear();
                }
                so_far.push_back(*g.input_grad[i]);
            }
        }
    }

    // The contributions to a value's gradient delivered so far, in the order they are added.
    std::vector<DataId>& contributions_so_far(std::size_t id,
                                              const std::unordered_map<std::size_t, std::pair<std::size_t, std::size_t>>& producer) {
        if (const auto leaf = trace_.values[id].input_leaf) return core_.inputs[*leaf].grads;
        const auto [k, o] = producer.at(id);
        return core_.groups[k].incoming[o];
    }

    void add_ops() {
        std::vector<OpId> order;
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            Group& g = core_.groups[k];
            const CapturedOp& info = profile_.info[k];
            std::vector<DataId> reads = g.input_data;
            reads.insert(reads.end(), order_reads_[k].begin(), order_reads_[k].end());
            std::vector<DataId> writes = g.output_data;
            writes.insert(writes.end(), order_writes_[k].begin(), order_writes_[k].end());
            g.fwd = add_op(OpSpec{"F:" + g.name, info.forward_time, info.forward_overhead, reads, writes, false},
                           OpEntry{OpRole::forward, k});
            if (!g.has_backward) {
                order.push_back(*g.fwd);
                continue;
            }
            writes.push_back(*g.saved);
            g.fwd_grad = add_op(OpSpec{"F+:" + g.name, info.forward_grad_time, info.forward_grad_overhead, std::move(reads),
                                       std::move(writes), false},
                                OpEntry{OpRole::forward_grad, k});
            order.push_back(*g.fwd_grad);
        }
        std::vector<DataId> loss_writes;
        for (const auto& d : core_.output_grad)
            if (d) loss_writes.push_back(*d);
        core_.loss = add_op(OpSpec{"loss", 0.0, 0, core_.output_data, std::move(loss_writes), true}, OpEntry{OpRole::loss, npos});
        order.push_back(core_.loss);
        for (std::size_t k = core_.groups.size(); k-- > 0;)
            if (core_.groups[k].has_backward) order.push_back(add_backward(k));
        builder_.set_loss(core_.loss);
        for (const InputInfo& in : core_.inputs)
            for (const DataId d : in.grads) builder_.add_final(d);
        builder_.set_autograd_order(std::move(order));
    }

    OpId add_backward(std::size_t k) {
        Group& g = core_.groups[k];
        CapturedOp& info = profile_.info[k];
        std::vector<DataId> reads;
        for (const auto& list : g.incoming) reads.insert(reads.end(), list.begin(), list.end());
        for (const auto& list : g.seed) reads.insert(reads.end(), list.begin(), list.end());
        reads.push_back(*g.saved);
        for (const std::size_t id : profile_.backward_reads[k]) {
            const DataId d = activation_.at(id);
            if (std::find(reads.begin(), reads.end(), d) == reads.end()) reads.push_back(d);
            info.backward_reads.push_back(data_name(id));
        }
        std::vector<DataId> writes;
        for (const auto& d : g.input_grad)
            if (d) writes.push_back(*d);
        if (g.marker) writes.push_back(*g.marker);
        g.bwd = add_op(OpSpec{"B:" + g.name, info.backward_time, info.backward_overhead, std::move(reads), std::move(writes), true},
                       OpEntry{OpRole::backward, k});
        return *g.bwd;
    }

    void name_op_data() {
        for (std::size_t k = 0; k < core_.groups.size(); ++k) {
            const Group& g = core_.groups[k];
            CapturedOp& info = profile_.info[k];
            for (const std::size_t id : g.inputs) info.inputs.push_back(data_name(id));
            for (const std::size_t id : g.outputs) info.outputs.push_back(data_name(id));
        }
    }

    Core& core_;
    const Trace& trace_;
    const Grouping& grouping_;
    Profile& profile_;
    std::string who_;
    ProblemBuilder builder_;
    std::unordered_map<std::size_t, DataId> activation_;  // value id → data
    std::unordered_map<std::size_t, std::string> names_;
    std::vector<DataEntry> data_;
    std::vector<Bytes> bytes_;
    std::vector<OpEntry> ops_;
    std::vector<std::vector<DataId>> order_writes_, order_reads_;  // per group: the order data of add_order_data
};

}  // namespace remat::torch::detail::capture
