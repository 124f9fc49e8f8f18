// remat/torch/capture/group.hpp — phase 2 of capture: fold the interpreted nodes into the
// ops of the problem and compile each op's program.
//
// Every node computing on activations that is not a view, a scalar read, container plumbing
// or a cheap single-use elementwise op roots an op (a *group*); a group runs its root and
// everything it needs that no other group computes: views, cheap ops, and values computed
// from parameters alone (recomputed inside every group that reads them, so that gradients
// reach the parameters). Buffer updates join the group that runs next in the module's order.
// Groups are ordered topologically, following the module's order where the graph leaves a
// choice, and each becomes a small program over slots (program.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../../core/errors.hpp"
#include "../../graph/topological.hpp"
#include "trace.hpp"

namespace remat::torch::detail::capture {

/// The ops of the problem, before profiling.
struct Grouping {
    std::vector<Group> groups;                // topological order
    ValueTree output_tree;                    // forward's result
    std::vector<std::size_t> output_values;   // value id of each output leaf
};

class Grouper {
public:
    Grouper(const Trace& trace, std::string who) : trace_(trace), who_(std::move(who)) {}

    [[nodiscard]] Grouping run() {
        result_.output_tree = output_node(trace_.result);
        if (result_.output_values.empty())
            throw InvalidInput(who_ + ": forward returns no tensor computed from the inputs; there is nothing to train");
        mark_needed();
        choose_roots();
        assign_members();
        close_groups();
        order_groups();
        return std::move(result_);
    }

private:
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

    [[noreturn]] void reject(const jit::Node* node, const std::string& what) const {
        throw InvalidInput(who_ + ": node " + where(node) + " " + what);
    }
    [[nodiscard]] const ValueRec& value(std::size_t id) const { return trace_.values[id]; }

    // ---------------------------------------------------------------- outputs

    ValueTree output_node(std::size_t id) {
        const ValueRec& v = value(id);
        ValueTree out;
        if (v.category == Category::constant) {
            out.kind = ValueTree::Kind::constant;
            out.constant = v.value;
            return out;
        }
        if (v.structure) {
            out.kind = v.structure->kind;
            out.type = v.structure->type;
            out.keys = v.structure->keys;
            for (const std::size_t e : v.structure->elements) out.children.push_back(output_node(e));
            return out;
        }
        const std::string what = v.producer ? "node " + where(trace_.flat[*v.producer].node) : "value '" + v.name + "'";
        if (v.category == Category::state)
            throw InvalidInput(who_ + ": forward returns a value computed from parameters alone (" + what +
                               "); return activations only");
        if (v.input_leaf)
            throw InvalidInput(who_ + ": forward returns its input '" + v.name +
                               "' unchanged; there is no computation to plan for it");
        if (!v.value.isTensor())
            throw InvalidInput(who_ + ": forward returns a non-tensor value computed from tensors (" + what +
                               "); return tensors, or tuples, lists and dicts of tensors");
        auto& outputs = result_.output_values;
        const auto found = std::find(outputs.begin(), outputs.end(), id);
        out.kind = ValueTree::Kind::leaf;
        out.leaf = static_cast<std::size_t>(found - outputs.begin());
        if (found == outputs.end()) outputs.push_back(id);
        return out;
    }

    [[nodiscard]] bool is_output(std::size_t id) const {
        const auto& outputs = result_.output_values;
        return std::find(outputs.begin(), outputs.end(), id) != outputs.end();
    }

    // ---------------------------------------------------------------- liveness

    // Nodes the step must run: what the outputs need, random nodes (they draw numbers even
    // when nothing uses them) and buffer updates.
    void mark_needed() {
        const auto& flat = trace_.flat;
        needed_.assign(flat.size(), 0);
        std::vector<std::size_t> work;
        const auto need = [&](std::size_t i) {
            if (!needed_[i]) {
                needed_[i] = 1;
                work.push_back(i);
            }
        };
        for (const std::size_t id : result_.output_values)
            if (const auto p = value(id).producer) need(*p);
        for (std::size_t i = 0; i < flat.size(); ++i)
            if (flat[i].side_effect || (flat[i].category == Category::activation && flat[i].random)) need(i);
        while (!work.empty()) {
            const std::size_t i = work.back();
            work.pop_back();
            for (const std::size_t id : flat[i].inputs)
                if (const auto p = value(id).producer) need(*p);
        }
    }

    // Users (needed flat nodes) of every value.
    [[nodiscard]] std::vector<std::vector<std::size_t>> users() const {
        std::vector<std::vector<std::size_t>> result(trace_.values.size());
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            if (!needed_[i]) continue;
            for (const std::size_t id : trace_.flat[i].inputs) {
                auto& list = result[id];
                if (list.empty() || list.back() != i) list.push_back(i);
            }
        }
        return result;
    }

    // ---------------------------------------------------------------- groups

    void choose_roots() {
        const auto use = users();
        root_.assign(trace_.flat.size(), 0);
        // A node whose list or tuple is unpacked into forward's outputs (`return y.split(4)`)
        // roots an op, which the unpacking joins (assign_members).
        std::vector<char> unpacked_to_output(trace_.flat.size(), 0);
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            const FlatNode& f = trace_.flat[i];
            if (!needed_[i] || (f.kind != InstrKind::list_unpack && f.kind != InstrKind::tuple_unpack)) continue;
            bool output = false;
            for (const std::size_t id : f.outputs) output = output || is_output(id);
            if (const auto p = value(f.inputs[0]).producer; output && p) unpacked_to_output[*p] = 1;
        }
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            const FlatNode& f = trace_.flat[i];
            if (!needed_[i] || f.category != Category::activation || f.side_effect) continue;
            bool output = unpacked_to_output[i] != 0;
            for (const std::size_t id : f.outputs) output = output || is_output(id);
            switch (f.act) {
                case ActKind::compute: root_[i] = 1; break;
                case ActKind::cheap: root_[i] = output || use[f.outputs[0]].size() != 1; break;
                case ActKind::view: root_[i] = output; break;
                case ActKind::scalar:
                case ActKind::pack:
                case ActKind::none: break;
            }
        }
        owner_.assign(trace_.flat.size(), npos);
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            if (!root_[i]) continue;
            owner_[i] = members_.size();
            members_.push_back({i});
        }
    }

    // Unpacking a container an op computed belongs to that op (so that the elements, not the
    // container, cross to other ops); buffer updates join the group that runs next.
    void assign_members() {
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            const FlatNode& f = trace_.flat[i];
            if (!needed_[i] || owner_[i] != npos) continue;
            if (f.kind != InstrKind::list_unpack && f.kind != InstrKind::tuple_unpack) continue;
            const auto p = value(f.inputs[0]).producer;
            if (!p || owner_[*p] == npos) continue;
            owner_[i] = owner_[*p];
            members_[owner_[i]].push_back(i);
        }
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            if (!needed_[i] || !trace_.flat[i].side_effect) continue;
            if (members_.empty()) reject(trace_.flat[i].node, "updates a buffer in a forward that computes nothing else");
            std::size_t g = owner_[members_.back().front()];
            for (std::size_t j = i + 1; j < trace_.flat.size(); ++j)
                if (root_[j]) {
                    g = owner_[j];
                    break;
                }
            owner_[i] = g;
            members_[g].push_back(i);
        }
        for (auto& m : members_) std::sort(m.begin(), m.end());
    }

    // Each group's closure: its members and the unowned nodes they need; a cheap node that
    // two groups would fold becomes a group of its own, and closures are computed again.
    void close_groups() {
        for (;;) {
            closures_.assign(members_.size(), {});
            externals_.assign(members_.size(), {});
            std::vector<std::size_t> folded_by(trace_.flat.size(), npos);
            std::optional<std::size_t> shared_cheap;
            for (std::size_t g = 0; g < members_.size() && !shared_cheap; ++g)
                shared_cheap = close_group(g, folded_by);
            if (!shared_cheap) return;
            root_[*shared_cheap] = 1;
            owner_[*shared_cheap] = members_.size();
            members_.push_back({*shared_cheap});
        }
    }

    std::optional<std::size_t> close_group(std::size_t g, std::vector<std::size_t>& folded_by) {
        std::set<std::size_t> nodes(members_[g].begin(), members_[g].end());
        std::vector<std::size_t> work(members_[g].begin(), members_[g].end());
        std::vector<std::size_t> external;
        const auto add_external = [&external](std::size_t id) {
            if (std::find(external.begin(), external.end(), id) == external.end()) external.push_back(id);
        };
        while (!work.empty()) {
            const std::size_t i = work.back();
            work.pop_back();
            for (const std::size_t id : trace_.flat[i].inputs) {
                const ValueRec& v = value(id);
                if (v.category == Category::constant) continue;
                if (v.input_leaf) {
                    add_external(id);
                    continue;
                }
                const std::size_t p = *v.producer;
                if (nodes.contains(p)) continue;
                if (owner_[p] != npos) {
                    add_external(id);
                    continue;
                }
                if (trace_.flat[p].act == ActKind::cheap) {
                    if (folded_by[p] != npos && folded_by[p] != g) return p;
                    folded_by[p] = g;
                }
                nodes.insert(p);
                work.push_back(p);
            }
        }
        closures_[g].assign(nodes.begin(), nodes.end());
        externals_[g] = std::move(external);
        return std::nullopt;
    }

    void order_groups() {
        const std::size_t n = members_.size();
        std::vector<std::size_t> producer_group(trace_.values.size(), npos);
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t i : members_[g])
                for (const std::size_t id : trace_.flat[i].outputs) producer_group[id] = g;
        std::vector<std::vector<std::size_t>> successors(n);
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t id : externals_[g]) {
                if (value(id).input_leaf) continue;
                const std::size_t p = producer_group[id];
                if (p == npos || p == g) reject(trace_.flat[members_[g][0]].node, "reads a value capture cannot attribute");
                successors[p].push_back(g);
            }
        std::vector<std::size_t> position(n);
        for (std::size_t g = 0; g < n; ++g) position[g] = members_[g][0];
        const std::vector<std::size_t> order = topological(successors, position);
        std::vector<std::vector<std::size_t>> outputs(n);
        const auto add_output = [&](std::size_t id) {
            const std::size_t p = producer_group[id];
            if (p != npos && std::find(outputs[p].begin(), outputs[p].end(), id) == outputs[p].end())
                outputs[p].push_back(id);
        };
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t id : externals_[g])
                if (!value(id).input_leaf) add_output(id);
        for (const std::size_t id : result_.output_values) add_output(id);
        for (std::size_t rank = 0; rank < n; ++rank) {
            const std::size_t g = order[rank];
            result_.groups.push_back(make_group(rank, members_[g], externals_[g], std::move(outputs[g]), closures_[g]));
        }
    }

    // Kahn's order, the group that comes first in the module first: groups are numbered by
    // their first node for the sort, whose ties go to the smallest number.
    std::vector<std::size_t> topological(const std::vector<std::vector<std::size_t>>& successors,
                                         const std::vector<std::size_t>& position) const {
        const std::size_t n = successors.size();
        std::vector<std::size_t> by_position(n);
        for (std::size_t g = 0; g < n; ++g) by_position[g] = g;
        std::sort(by_position.begin(), by_position.end(), [&](std::size_t a, std::size_t b) { return position[a] < position[b]; });
        std::vector<std::size_t> rank(n);
        for (std::size_t r = 0; r < n; ++r) rank[by_position[r]] = r;
        graph::Adjacency ranked(n);
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t s : successors[g]) ranked[rank[g]].push_back(rank[s]);
        const auto order = graph::topological_order(ranked);
        if (!order) throw InvalidInput(who_ + ": the ops read each other's results in a cycle (internal error in capture)");
        std::vector<std::size_t> groups;
        for (const std::size_t r : *order) groups.push_back(by_position[r]);
        return groups;
    }

    Group make_group(std::size_t rank, const std::vector<std::size_t>& members, std::vector<std::size_t> inputs,
                     std::vector<std::size_t> outputs, const std::vector<std::size_t>& closure) const {
        Group group;
        const FlatNode& root = trace_.flat[members.front()];
        group.name = short_kind(root.node) + "." + std::to_string(rank);
        group.where = where(root.node);
        group.inputs = std::move(inputs);
        group.outputs = std::move(outputs);
        // Dead ops (a random op whose result nothing uses) still run: they draw numbers.
        if (group.outputs.empty())
            for (const std::size_t id : root.outputs)
                if (value(id).value.isTensor()) {
                    group.outputs.push_back(id);
                    break;
                }
        if (group.outputs.empty()) reject(root.node, "produces no tensor; capture cannot make it an op");
        group.draw_rank = members.front();
        for (const std::size_t i : closure)
            if (trace_.flat[i].random && trace_.flat[i].act != ActKind::view) {  // a view draws nothing
                group.draw_rank = i;  // closures are sorted
                break;
            }
        for (const std::size_t id : group.inputs)
            group.input_meta.push_back(TensorMeta::of(value(id).value.toTensor()));
        for (const std::size_t id : group.outputs)
            if (!value(id).value.isTensor())
                reject(trace_.flat[*value(id).producer].node,
                       "returns a container that other ops read as a whole (internal error in capture)");
        compile(group, closure);
        return group;
    }

    // The group's program: its nodes in order, arguments resolved to frozen values or slots.
    void compile(Group& group, const std::vector<std::size_t>& nodes) const {
        std::unordered_map<std::size_t, std::size_t> slot;  // value id → slot
        for (const std::size_t id : group.inputs) {
            slot[id] = group.slots;
            group.input_slots.push_back(group.slots++);
        }
        std::set<std::size_t> parameters;
        std::unordered_set<const void*> frozen_storages;
        for (const std::size_t i : nodes) {
            const FlatNode& f = trace_.flat[i];
            Instr instr;
            instr.kind = f.kind;
            instr.operation = f.operation;
            instr.vararg = f.vararg;
            instr.out_of_place = !f.rewritten_from.empty();
            instr.type = f.type;
            instr.node = f.node;
            for (const std::size_t id : f.inputs) {
                const ValueRec& v = value(id);
                if (v.category == Category::constant) {
                    instr.args.push_back(Arg{true, id});
                    note_frozen_tensors(v.value, parameters, frozen_storages);
                    continue;
                }
                const auto found = slot.find(id);
                if (found == slot.end()) reject(f.node, "reads a value that capture did not place (internal error in capture)");
                instr.args.push_back(Arg{false, found->second});
            }
            for (const std::size_t id : f.outputs) {
                slot[id] = group.slots;
                instr.outs.push_back(group.slots++);
            }
            group.program.push_back(std::move(instr));
        }
        for (const std::size_t id : group.outputs) {
            const auto found = slot.find(id);
            if (found == slot.end()) reject(group.program.front().node, "output not computed (internal error in capture)");
            group.output_slots.push_back(found->second);
        }
        group.clone_output.assign(group.outputs.size(), 0);
        group.input_differentiable.assign(group.inputs.size(), 0);
        group.input_uses.assign(group.inputs.size(), 0);
        group.input_seeds.assign(group.inputs.size(), 0);
        for (const Instr& instr : group.program)
            for (const Arg& arg : instr.args)
                for (std::size_t i = 0; i < group.input_slots.size(); ++i)
                    if (!arg.frozen && group.input_slots[i] == arg.index) ++group.input_uses[i];
        group.output_requires_grad.assign(group.outputs.size(), 0);
        for (const std::size_t p : parameters) {
            group.parameters.push_back(p);
            group.trainable.push_back(trace_.parameters[p]);
        }
        group.frozen_storages.assign(frozen_storages.begin(), frozen_storages.end());
    }

    // Parameters read through a frozen value — directly or inside a list, such as an LSTM's
    // flat weights — are the group's to differentiate.
    void note_frozen_tensors(const c10::IValue& v, std::set<std::size_t>& parameters,
                             std::unordered_set<const void*>& storages) const {
        std::vector<at::Tensor> tensors;
        tensors_in(v, tensors);
        for (const at::Tensor& t : tensors) {
            if (const auto it = trace_.parameter_index.find(t.unsafeGetTensorImpl()); it != trace_.parameter_index.end())
                parameters.insert(it->second);
            if (const void* s = storage_of(t)) storages.insert(s);
        }
    }

    const Trace& trace_;
    std::string who_;
    Grouping result_;
    std::vector<char> needed_;
    std::vector<char> root_;
    std::vector<std::size_t> owner_;
    std::vector<std::vector<std::size_t>> members_;
    std::vector<std::vector<std::size_t>> closures_;
    std::vector<std::vector<std::size_t>> externals_;
};

}  // namespace remat::torch::detail::capture
