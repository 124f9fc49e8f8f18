// remat/solvers/hierarchical/cluster.hpp — one cluster of H-Rockmate's hierarchy as problems
// the solver can plan, and its solutions as options its parent can use.
//
// For a node of the hierarchy (partition/hierarchy.hpp) this header builds:
//   - its interface: the data it reads from outside (inputs), the forward data it hands out
//     (outputs), the gradients it receives (output grads) and those it gives back (input grads);
//   - its *real* sub-problem: every op under it, its inputs as initial data, its input grads
//     as final data, and a boundary op standing for the rest of the network (it reads the
//     outputs and writes the output grads), as Rockmate's blocks have (blocks.hpp);
//   - its *abstract* problem, the one a search plans: its atom children keep their real ops,
//     and each cluster child becomes a unit with a fast forward (no saved state), and per
//     option a forward writing the child's outputs and a phantom of the option's saved bytes,
//     and a backward reading that phantom, the output grads and the interface data the
//     option's backward reads; the backwards of one child form a choice group (exactly one
//     runs, exhaustive.hpp).
// An abstract schedule is flattened into real steps (each unit replaced by its sub-schedule,
// phantom frees dropped) and its costs are measured by the simulator on the real sub-problem
// (docs/formats.md §3 (simulation semantics)). An option's costs make its abstract ops an upper bound on what its real
// steps use in any context: forward overhead = forward peak − the state at the boundary;
// backward overhead = backward peak − (state at the boundary + output grads + input grads);
// an option never frees the cluster's outputs or output grads (its parent decides when).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "../../core/simulate.hpp"
#include "../../graph/structure_key.hpp"
#include "../../partition/hierarchy.hpp"
#include "../fast_forward.hpp"

namespace remat::detail::hrockmate {

inline constexpr std::size_t none = static_cast<std::size_t>(-1);

/// What crosses a node's boundary. Lists are sorted by id.
struct Interface {
    std::vector<OpId> ops;             ///< every op under the node (or at the top)
    std::vector<DataId> inputs;        ///< read inside, written outside or initial
    std::vector<DataId> outputs;       ///< forward data written inside, read outside
    std::vector<DataId> output_grads;  ///< gradients read inside, written outside
    std::vector<DataId> input_grads;   ///< gradients written inside, read outside or final
};

/// Which data are gradients: written by exactly-once ops (the loss and the backward ops).
[[nodiscard]] inline std::vector<char> gradient_data(const Problem& p) {
    std::vector<char> backward(p.data_count(), 0);
    for (const Op& op : p.all_ops())
        if (op.exactly_once)
            for (const DataId d : op.writes) backward[d.index] = 1;
    return backward;
}

[[nodiscard]] inline Interface interface_of(const Problem& p, std::vector<OpId> ops, const std::vector<char>& gradient) {
    std::sort(ops.begin(), ops.end());
    std::vector<char> inside(p.op_count(), 0), written(p.data_count(), 0), read(p.data_count(), 0);
    for (const OpId k : ops) inside[k.index] = 1;
    for (const OpId k : ops) {
        for (const DataId d : p.op(k).writes) written[d.index] = 1;
        for (const DataId d : p.op(k).reads) read[d.index] = 1;
    }
    Interface f;
    f.ops = std::move(ops);
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const DataId id{d};
        if (read[d] && !written[d]) (gradient[d] ? f.output_grads : f.inputs).push_back(id);
        if (!written[d]) continue;
        bool outside = p.is_final(id);
        for (const OpId r : p.readers(id)) outside = outside || !inside[r.index];
        if (outside) (gradient[d] ? f.input_grads : f.outputs).push_back(id);
    }
    return f;
}

[[nodiscard]] inline Bytes bytes_of(const Problem& p, const std::vector<DataId>& data) {
    Bytes sum = 0;
    for (const DataId d : data) sum += p.data(d).bytes;
    return sum;
}

// ---------------------------------------------------------------- the real sub-problem

/// A node's real sub-problem. Local ids are assigned in a canonical order (ops as listed,
/// data by first use), so that structurally equal nodes get equal sub-problems.
struct SubProblem {
    Problem problem = ProblemBuilder("unbuilt").build();
    std::vector<std::optional<DataId>> global_data;  ///< none for the boundary's token
    std::vector<std::optional<OpId>> global_op;      ///< none for the boundary
    std::optional<OpId> boundary;                    ///< none at the top
    std::unordered_map<std::size_t, DataId> local_data;  ///< global index → local id
    std::unordered_map<std::size_t, OpId> local_op;

    [[nodiscard]] std::optional<DataId> local(DataId global) const {
        const auto it = local_data.find(global.index);
        return it == local_data.end() ? std::nullopt : std::optional<DataId>(it->second);
    }
};

/// `top`: the whole problem's top (no boundary; its own initial and final data).
[[nodiscard]] inline SubProblem sub_problem(const Problem& p, const Interface& f, bool top, Bytes boundary_overhead,
                                            const std::string& name) {
    SubProblem s;
    ProblemBuilder b(name);
    const auto map = [&](DataId d) {
        if (const auto it = s.local_data.find(d.index); it != s.local_data.end()) return it->second;
        const DataId local = b.add_data(p.data(d).name, p.data(d).bytes);
        s.local_data.emplace(d.index, local);
        s.global_data.push_back(d);
        return local;
    };
    const auto map_all = [&](const std::vector<DataId>& v) {
        std::vector<DataId> r;
        for (const DataId d : v) r.push_back(map(d));
        return r;
    };
    for (const DataId d : f.inputs) map(d);
    if (top)
        for (const DataId d : p.initial()) map(d);  // unread initial data still take memory
    const auto add = [&](OpId k) {
        const Op& op = p.op(k);
        const OpId local = b.add_op({op.name, op.time, op.overhead, map_all(op.reads), map_all(op.writes), op.exactly_once});
        s.local_op.emplace(k.index, local);
        s.global_op.push_back(k);
    };
    for (const OpId k : f.ops)
        if (!p.op(k).exactly_once) add(k);
    if (!top) {
        std::vector<DataId> writes = map_all(f.output_grads);
        if (writes.empty()) {
            writes.push_back(b.add_data("(gradient of " + name + ")", 0));
            s.global_data.push_back(std::nullopt);
        }
        s.boundary = b.add_op({"(rest after " + name + ")", 0.0, boundary_overhead, map_all(f.outputs), std::move(writes), true});
        s.global_op.push_back(std::nullopt);
    }
    for (const OpId k : f.ops)
        if (p.op(k).exactly_once) add(k);
    if (top) {
        for (const DataId d : p.initial()) b.add_initial(*s.local(d));
        for (const DataId d : p.final_data()) b.add_final(map(d));
        b.set_loss(s.local_op.at(p.loss()->index));
    } else {
        for (const DataId d : f.inputs) b.add_initial(map(d));
        for (const DataId d : f.input_grads) b.add_final(map(d));
        b.set_loss(*s.boundary);
    }
    s.problem = b.build();
    return s;
}

// ---------------------------------------------------------------- options

/// One way to run a cluster: a forward and a backward sub-schedule in the whole problem's
/// ids, with the costs its abstract unit charges (see the top of this header).
struct Option {
    Schedule forward, backward;
    double forward_time = 0.0, backward_time = 0.0;
    Bytes saved = 0;             ///< kept from the end of the forward to the backward, interface excluded
    Bytes forward_overhead = 0;
    Bytes backward_overhead = 0;
    /// When the backward's peak is below its start state plus the input grads (it frees its
    /// saved data while it writes them), the unit's backward is two ops: the first charges the
    /// peak and lets go of all but `gradient_reserve` of the saved bytes, the second writes the
    /// input grads in that reserve (see abstract_problem). 0: one op.
    Bytes gradient_reserve = 0;
    std::vector<DataId> forward_reads;   ///< inputs the forward reads
    std::vector<DataId> backward_reads;  ///< inputs and outputs the backward reads
    std::vector<DataId> held;            ///< the internal data the forward leaves live (its saved bytes)
};

/// Everything a parent needs of a cluster child.
struct NodeOptions {
    Interface interface;
    Schedule fast;  ///< the outputs without autograd, nothing else left
    double fast_time = 0.0;
    Bytes fast_overhead = 0;
    std::vector<DataId> fast_reads;
    std::vector<Option> options;
};

[[nodiscard]] inline double time_of(const Problem& p, const Schedule& s) {
    double t = 0.0;
    for (const Step& step : s)
        if (step.is_run()) t += p.op(step.op()).time;
    return t;
}

// The interface data among `candidates` that the runs of `steps` read.
[[nodiscard]] inline std::vector<DataId> read_among(const Problem& p, const Schedule& steps, const std::vector<DataId>& candidates) {
    std::set<std::size_t> wanted;
    for (const DataId d : candidates) wanted.insert(d.index);
    std::set<std::size_t> found;
    for (const Step& s : steps)
        if (s.is_run())
            for (const DataId d : p.op(s.op()).reads)
                if (wanted.contains(d.index)) found.insert(d.index);
    std::vector<DataId> out;
    for (const std::size_t d : found) out.push_back(DataId{d});
    return out;
}

/// The option of a complete real schedule of a node's sub-problem (local ids, the boundary
/// run once): split at the boundary, interface frees dropped, costs from the simulator.
/// nullopt when the schedule is not valid or runs a backward op before the boundary.
[[nodiscard]] inline std::optional<Option> option_from(const Problem& p, const SubProblem& s, const Interface& f,
                                                       const Schedule& local) {
    std::set<std::size_t> kept;  // interface data an option never frees
    for (const DataId d : f.outputs) kept.insert(s.local(d)->index);
    for (const DataId d : f.output_grads) kept.insert(s.local(d)->index);
    Schedule steps;
    for (const Step& st : local)
        if (!(st.is_free() && kept.contains(st.data().index))) steps.push_back(st);
    const SimulationReport r = simulate(s.problem, steps);
    if (!r.valid) return std::nullopt;
    std::size_t k = 0;
    while (k < steps.size() && !(steps[k].is_run() && steps[k].op() == *s.boundary)) ++k;
    if (k == steps.size()) return std::nullopt;
    Option o;
    const auto global = [&](const Step& st) {
        return st.is_run() ? Step::run(*s.global_op[st.op().index]) : Step::free(*s.global_data[st.data().index]);
    };
    for (std::size_t i = 0; i < steps.size(); ++i) {
        if (i == k) continue;
        const Step& st = steps[i];
        if (st.is_free() && !s.global_data[st.data().index]) continue;
        if (i < k && st.is_run() && s.problem.op(st.op()).exactly_once) return std::nullopt;
        (i < k ? o.forward : o.backward).push_back(global(st));
    }
    const Bytes at_boundary = k == 0 ? r.initial : r.timeline[k - 1].after;
    Bytes forward_peak = r.initial;
    for (std::size_t i = 0; i < k; ++i) forward_peak = std::max({forward_peak, r.timeline[i].during, r.timeline[i].after});
    const Bytes grads_out = bytes_of(s.problem, s.problem.op(*s.boundary).writes);
    Bytes backward_peak = at_boundary + grads_out;
    for (std::size_t i = k + 1; i < steps.size(); ++i)
        backward_peak = std::max({backward_peak, r.timeline[i].during, r.timeline[i].after});
    o.forward_time = time_of(p, o.forward);
    o.backward_time = time_of(p, o.backward);
    o.saved = at_boundary - r.initial - bytes_of(p, f.outputs);
    o.forward_overhead = forward_peak - at_boundary;
    const Bytes grads_in = bytes_of(p, f.input_grads);
    const Bytes whole = backward_peak - (at_boundary + grads_out + grads_in);
    if (whole < 0) {
        o.backward_overhead = backward_peak - (at_boundary + grads_out);
        o.gradient_reserve = grads_in;
    } else {
        o.backward_overhead = std::max<Bytes>(0, whole);
    }
    if (o.saved < 0 || o.forward_overhead < 0) return std::nullopt;
    o.forward_reads = read_among(p, o.forward, f.inputs);
    {
        std::vector<char> live(s.problem.data_count(), 0);
        for (const DataId d : s.problem.initial()) live[d.index] = 1;
        for (std::size_t i = 0; i < k; ++i) {
            if (steps[i].is_run())
                for (const DataId d : s.problem.op(steps[i].op()).writes) live[d.index] = 1;
            else
                live[steps[i].data().index] = 0;
        }
        std::set<std::size_t> interface_data;
        for (const DataId d : f.inputs) interface_data.insert(d.index);
        for (const DataId d : f.outputs) interface_data.insert(d.index);
        for (std::size_t d = 0; d < live.size(); ++d)
            if (live[d] && s.global_data[d] && !interface_data.contains(s.global_data[d]->index))
                o.held.push_back(*s.global_data[d]);
    }
    std::vector<DataId> interface_data = f.inputs;
    interface_data.insert(interface_data.end(), f.outputs.begin(), f.outputs.end());
    o.backward_reads = read_among(p, o.backward, interface_data);
    return o;
}

/// The node's outputs computed without autograd (solvers/fast_forward.hpp), in the local ids
/// of the sub-problem.
[[nodiscard]] inline Schedule fast_forward(const SubProblem& s, const Interface& f) {
    std::vector<DataId> targets;
    for (const DataId d : f.outputs) targets.push_back(*s.local(d));
    return remat::detail::fast_forward(s.problem, targets, "hrockmate");
}

/// The fast forward's costs in a node's options, from its local schedule.
inline void set_fast(NodeOptions& node, const Problem& p, const SubProblem& s, const Schedule& local) {
    const SimulationReport r = simulate(s.problem, local);  // exactly-once ops never run: ends "invalid"
    if (r.timeline.size() != local.size())
        throw SolverError("hrockmate: the fast forward of '" + s.problem.name() + "' is not runnable: " + r.error +
                          " (this is a bug in the solver; please report it)");
    Bytes peak = r.initial;
    for (const TimelinePoint& t : r.timeline) peak = std::max({peak, t.during, t.after});
    node.fast.clear();
    for (const Step& st : local)
        node.fast.push_back(st.is_run() ? Step::run(*s.global_op[st.op().index]) : Step::free(*s.global_data[st.data().index]));
    node.fast_time = time_of(p, node.fast);
    node.fast_overhead = std::max<Bytes>(0, peak - (r.initial + bytes_of(p, node.interface.outputs)));
    node.fast_reads = read_among(p, node.fast, node.interface.inputs);
}

// ---------------------------------------------------------------- the abstract problem

enum class UnitKind : unsigned char { real, fast, forward, backward, backward_end, boundary };

/// What an op of the abstract problem stands for.
struct AbstractOp {
    UnitKind kind = UnitKind::real;
    OpId real{};              ///< kind real: the op itself
    std::size_t child = 0;    ///< fast, forward, backward: index into the children
    std::size_t option = 0;   ///< forward, backward
};

struct AbstractProblem {
    Problem problem = ProblemBuilder("unbuilt").build();
    std::vector<AbstractOp> ops;
    std::vector<std::optional<DataId>> global_data;  ///< none for phantoms and tokens
    std::vector<std::vector<OpId>> choice_groups;
    std::optional<OpId> boundary;
};

/// A child of the node being planned: an atom keeps its real ops; a cluster comes with the
/// options it exported (at most `max_options` of them are offered).
struct Child {
    std::optional<std::vector<OpId>> real_ops;
    const NodeOptions* options = nullptr;
};

[[nodiscard]] inline AbstractProblem abstract_problem(const Problem& p, const Interface& f, const std::vector<Child>& children,
                                                      const std::vector<OpId>& top_ops, bool top, Bytes boundary_overhead,
                                                      const std::string& name) {
    AbstractProblem a;
    ProblemBuilder b(name);
    std::unordered_map<std::size_t, DataId> local;
    const auto map = [&](DataId d) {
        if (const auto it = local.find(d.index); it != local.end()) return it->second;
        const DataId id = b.add_data(p.data(d).name, p.data(d).bytes);
        local.emplace(d.index, id);
        a.global_data.push_back(d);
        return id;
    };
    const auto map_all = [&](const std::vector<DataId>& v) {
        std::vector<DataId> r;
        for (const DataId d : v) r.push_back(map(d));
        return r;
    };
    const auto token = [&](const std::string& what, Bytes bytes) {
        a.global_data.push_back(std::nullopt);
        return b.add_data(what, bytes);
    };
    for (const DataId d : f.inputs) map(d);
    if (top)
        for (const DataId d : p.initial()) map(d);  // unread initial data still take memory
    const auto add_real = [&](OpId k) {
        const Op& op = p.op(k);
        b.add_op({op.name, op.time, op.overhead, map_all(op.reads), map_all(op.writes), op.exactly_once});
        a.ops.push_back({UnitKind::real, k, 0, 0});
    };
    // Forward units first, the boundary, then backward units: ids in a natural order.
    std::vector<std::vector<DataId>> phantom_of(children.size());
    std::map<std::pair<std::size_t, std::size_t>, DataId> reserve_of;
    for (std::size_t c = 0; c < children.size(); ++c) {
        const Child& child = children[c];
        if (child.real_ops) {
            for (const OpId k : *child.real_ops)
                if (!p.op(k).exactly_once) add_real(k);
            continue;
        }
        const NodeOptions& n = *child.options;
        const std::string cname = name + "/" + std::to_string(c);
        b.add_op({cname + ":fast", n.fast_time, n.fast_overhead, map_all(n.fast_reads), map_all(n.interface.outputs), false});
        a.ops.push_back({UnitKind::fast, {}, c, 0});
        for (std::size_t o = 0; o < n.options.size(); ++o) {
            const Option& opt = n.options[o];
            // A split backward (see Option::gradient_reserve) has its saved bytes in two parts:
            // the first is released by the first backward op, the second (the reserve, at most
            // the saved bytes, topped up by a token of the first op) is where the input grads go.
            const Bytes reserve = std::min(opt.saved, opt.gradient_reserve);
            const DataId phantom = token(cname + ":saved" + std::to_string(o), opt.saved - reserve);
            phantom_of[c].push_back(phantom);
            std::vector<DataId> writes = map_all(n.interface.outputs);
            writes.push_back(phantom);
            if (opt.gradient_reserve > 0) {
                reserve_of[{c, o}] = token(cname + ":reserve" + std::to_string(o), reserve);
                writes.push_back(reserve_of[{c, o}]);
            }
            b.add_op({cname + ":F" + std::to_string(o), opt.forward_time, opt.forward_overhead, map_all(opt.forward_reads),
                      std::move(writes), false});
            a.ops.push_back({UnitKind::forward, {}, c, o});
        }
    }
    if (!top) {
        std::vector<DataId> writes = map_all(f.output_grads);
        if (writes.empty()) writes.push_back(token("(gradient of " + name + ")", 0));
        a.boundary = b.add_op({"(rest after " + name + ")", 0.0, boundary_overhead, map_all(f.outputs), std::move(writes), true});
        a.ops.push_back({UnitKind::boundary, {}, 0, 0});
    } else {
        for (const OpId k : top_ops) add_real(k);
    }
    std::vector<DataId> done_tokens;
    for (std::size_t c = 0; c < children.size(); ++c) {
        const Child& child = children[c];
        if (child.real_ops) {
            for (const OpId k : *child.real_ops)
                if (p.op(k).exactly_once) add_real(k);
            continue;
        }
        const NodeOptions& n = *child.options;
        const std::string cname = name + "/" + std::to_string(c);
        std::vector<DataId> writes = map_all(n.interface.input_grads);
        if (writes.empty()) {
            writes.push_back(token(cname + ":done", 0));
            done_tokens.push_back(writes.back());
        }
        std::vector<OpId> group, second;
        for (std::size_t o = 0; o < n.options.size(); ++o) {
            const Option& opt = n.options[o];
            std::vector<DataId> reads = map_all(n.interface.output_grads);
            const std::vector<DataId> extra = map_all(opt.backward_reads);
            reads.insert(reads.end(), extra.begin(), extra.end());
            reads.push_back(phantom_of[c][o]);
            const auto reserve = reserve_of.find({c, o});
            if (reserve != reserve_of.end()) reads.push_back(reserve->second);
            std::sort(reads.begin(), reads.end());
            reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
            if (reserve == reserve_of.end()) {
                group.push_back(b.add_op({cname + ":B" + std::to_string(o), opt.backward_time, opt.backward_overhead,
                                          std::move(reads), writes, true}));
                a.ops.push_back({UnitKind::backward, {}, c, o});
                continue;
            }
            const Bytes topping = opt.gradient_reserve - std::min(opt.saved, opt.gradient_reserve);
            const DataId handed = token(cname + ":handed" + std::to_string(o), topping);
            group.push_back(b.add_op({cname + ":B" + std::to_string(o), opt.backward_time, opt.backward_overhead,
                                      std::move(reads), {handed}, true}));
            a.ops.push_back({UnitKind::backward, {}, c, o});
            second.push_back(b.add_op({cname + ":B" + std::to_string(o) + "'", 0.0, 0, {reserve->second, handed}, writes, true}));
            a.ops.push_back({UnitKind::backward_end, {}, c, o});
        }
        a.choice_groups.push_back(std::move(group));
        if (!second.empty()) a.choice_groups.push_back(std::move(second));
    }
    if (top) {
        for (const DataId d : p.initial()) b.add_initial(local.at(d.index));
        for (const DataId d : p.final_data()) b.add_final(map(d));
        b.set_loss(OpId{static_cast<std::size_t>(std::find_if(a.ops.begin(), a.ops.end(), [&](const AbstractOp& o) {
                                                         return o.kind == UnitKind::real && o.real == *p.loss();
                                                     }) - a.ops.begin())});
    } else {
        for (const DataId d : f.inputs) b.add_initial(map(d));
        for (const DataId d : f.input_grads) b.add_final(map(d));
        b.set_loss(*a.boundary);
    }
    for (const DataId d : done_tokens) b.add_final(d);
    a.problem = b.build();
    return a;
}

/// The real steps of an abstract schedule, in the whole problem's ids; the boundary (when
/// there is one) stays as the single step `boundary_at` points at.
struct Flattened {
    Schedule steps;
    std::optional<std::size_t> boundary_at;
};

/// Replaces each unit by its sub-schedule, keeping track of the real live data: a unit may
/// run while an option of the same child holds its saved data (a fast forward recomputing
/// the outputs, say), so a run whose writes are all live is skipped, and the data an option
/// holds are not freed by another unit's steps; they go with that option's backward, or when
/// the parent frees its phantom. `initially_live`: the whole problem's initial data at the
/// top, the node's inputs in a cluster.
[[nodiscard]] inline Flattened flatten(const Problem& p, const AbstractProblem& a, const std::vector<Child>& children,
                                       const Schedule& abstract, const std::vector<DataId>& initially_live) {
    Flattened out;
    std::vector<char> live(p.data_count(), 0);
    std::vector<int> held(p.data_count(), 0);
    for (const DataId d : initially_live) live[d.index] = 1;
    std::map<std::pair<std::size_t, std::size_t>, bool> holding;  // (child, option) → holds its saved data
    std::map<std::size_t, std::pair<std::size_t, std::size_t>> phantom;  // abstract data → (child, option)
    for (std::size_t k = 0; k < a.ops.size(); ++k)
        if (a.ops[k].kind == UnitKind::forward)
            for (const DataId d : a.problem.op(OpId{k}).writes)
                if (!a.global_data[d.index]) phantom[d.index] = {a.ops[k].child, a.ops[k].option};  // saved and reserve
    const auto run = [&](OpId k) {
        const Op& op = p.op(k);
        if (!op.exactly_once && std::all_of(op.writes.begin(), op.writes.end(), [&](DataId d) { return live[d.index] != 0; }))
            return;
        out.steps.push_back(Step::run(k));
        for (const DataId d : op.writes) live[d.index] = 1;
    };
    const auto free = [&](DataId d) {
        if (!live[d.index] || held[d.index] > 0) return;
        out.steps.push_back(Step::free(d));
        live[d.index] = 0;
    };
    const auto emit = [&](const Schedule& s) {
        for (const Step& st : s) st.is_run() ? run(st.op()) : free(st.data());
    };
    const auto release = [&](std::size_t child, std::size_t option, bool free_them) {
        auto it = holding.find({child, option});
        if (it == holding.end() || !it->second) return;
        it->second = false;
        for (const DataId d : children[child].options->options[option].held) {
            --held[d.index];
            if (free_them) free(d);
        }
    };
    for (const Step& st : abstract) {
        if (st.is_free()) {
            if (const auto d = a.global_data.at(st.data().index)) {
                free(*d);
            } else if (const auto it = phantom.find(st.data().index); it != phantom.end()) {
                release(it->second.first, it->second.second, true);
            }
            continue;
        }
        const AbstractOp& op = a.ops.at(st.op().index);
        switch (op.kind) {
            case UnitKind::real: run(op.real); break;
            case UnitKind::boundary:
                out.boundary_at = out.steps.size();
                out.steps.push_back(st);  // a placeholder; to_local maps it to the sub-problem's boundary
                break;
            case UnitKind::fast: emit(children[op.child].options->fast); break;
            case UnitKind::forward: {
                const Option& o = children[op.child].options->options[op.option];
                emit(o.forward);
                bool& holds = holding[{op.child, op.option}];
                if (!holds)
                    for (const DataId d : o.held) ++held[d.index];
                holds = true;
                break;
            }
            case UnitKind::backward:
                release(op.child, op.option, false);
                emit(children[op.child].options->options[op.option].backward);
                break;
            case UnitKind::backward_end: break;  // its real steps ran with the first backward op
        }
    }
    return out;
}

/// The flattened steps in the sub-problem's local ids (the boundary placeholder becomes its
/// boundary op). Frees of data the sub-problem does not have cannot occur: every flattened
/// step touches data under the node.
[[nodiscard]] inline Schedule to_local(const SubProblem& s, const Flattened& f) {
    Schedule local;
    for (std::size_t i = 0; i < f.steps.size(); ++i) {
        const Step& st = f.steps[i];
        if (f.boundary_at && i == *f.boundary_at) {
            local.push_back(Step::run(*s.boundary));
        } else if (st.is_run()) {
            local.push_back(Step::run(s.local_op.at(st.op().index)));
        } else if (const auto d = s.local(st.data())) {
            local.push_back(Step::free(*d));
        }
    }
    return local;
}

/// Options that another beats on time and on every memory term, and duplicates, removed;
/// the rest sorted by total time.
inline void prune(std::vector<Option>& options) {
    const auto time = [](const Option& o) { return o.forward_time + o.backward_time; };
    const auto no_worse = [&](const Option& x, const Option& y) {
        const auto covers = [](const std::vector<DataId>& big, const std::vector<DataId>& small) {
            return std::includes(big.begin(), big.end(), small.begin(), small.end());
        };
        return time(x) <= time(y) && x.saved <= y.saved && x.saved + x.forward_overhead <= y.saved + y.forward_overhead &&
               x.saved + x.backward_overhead <= y.saved + y.backward_overhead && covers(y.backward_reads, x.backward_reads) &&
               covers(y.forward_reads, x.forward_reads);
    };
    std::vector<Option> kept;
    for (std::size_t i = 0; i < options.size(); ++i) {
        bool beaten = false;
        for (std::size_t j = 0; j < options.size() && !beaten; ++j)
            if (i != j && no_worse(options[j], options[i])) beaten = !no_worse(options[i], options[j]) || j < i;
        if (!beaten) kept.push_back(std::move(options[i]));
    }
    std::sort(kept.begin(), kept.end(), [&](const Option& x, const Option& y) {
        return time(x) < time(y) || (time(x) == time(y) && x.saved < y.saved);
    });
    options = std::move(kept);
}

/// What an option adds to its parent's memory at its worst moment: its saved bytes, plus the
/// larger of its two overheads.
[[nodiscard]] inline Bytes footprint(const Option& o) { return o.saved + std::max(o.forward_overhead, o.backward_overhead); }

/// At most `count` options: the fastest, the leanest (least footprint), the one that keeps the
/// least (ties: the leanest), and the others spread evenly over the saved bytes from the most
/// to the least. The first three are what a parent needs at a large, a small and a squeezed
/// budget; without the leanest, a parent at a low budget sees only options whose backward
/// recomputes with a large peak.
[[nodiscard]] inline std::vector<Option> spread(std::vector<Option> options, std::size_t count) {
    if (options.size() <= count) return options;
    const auto time = [](const Option& o) { return o.forward_time + o.backward_time; };
    std::vector<Option> out;
    const auto take = [&](auto better) {
        if (out.size() >= count || options.empty()) return;
        const auto at = std::min_element(options.begin(), options.end(), better);
        out.push_back(std::move(*at));
        options.erase(at);
    };
    take([&](const Option& x, const Option& y) { return time(x) < time(y); });
    take([&](const Option& x, const Option& y) {
        return footprint(x) < footprint(y) || (footprint(x) == footprint(y) && time(x) < time(y));
    });
    take([&](const Option& x, const Option& y) {
        return x.saved < y.saved || (x.saved == y.saved && footprint(x) < footprint(y));
    });
    if (out.size() >= count || options.empty()) return out;
    std::sort(options.begin(), options.end(), [](const Option& x, const Option& y) { return x.saved > y.saved; });
    const std::size_t more = std::min(count - out.size(), options.size());
    for (std::size_t i = 0; i < more; ++i) {
        const std::size_t at = more == 1 ? options.size() / 2 : i * (options.size() - 1) / (more - 1);
        out.push_back(options[at]);
    }
    return out;
}

}  // namespace remat::detail::hrockmate
