// remat/torch/capture/program.hpp — what a captured TorchScript module is at run time: the
// executable table of its op groups, and the primitives that run one group.
//
// Capture (script.hpp and the phase headers beside this one) turns a module into an op-level
// remat.problem/1 problem — the graph model of Checkmate (Jain et al., MLSys 2020) and
// Rockmate (Zhao et al., ICML 2023). Each op of that problem is a *group* of TorchScript
// nodes compiled into a small program of instructions over slots. This header holds that
// table and how a group runs (docs/design.md §6 (execution engine)): without autograd, on detached leaves of its
// inputs so that its autograd graph is its own, and back-propagated alone. The executor
// (graph_executor.hpp) needs this header and captured.hpp, never the capture phases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../detail/runtime.hpp"

namespace remat::torch {

namespace detail {
/// The attribute of a module read from a .pt2 file (exported.hpp) that records the training
/// mode the program was exported in, which the program cannot switch.
inline constexpr const char* exported_mode_attribute = "_remat_exported_training";
}  // namespace detail

namespace detail::capture {

namespace jit = ::torch::jit;

/// "'aten::foo' at line 12 of code/m.py (`y = torch.foo(x)`)": how messages name a node.
[[nodiscard]] inline std::string where(const jit::Node* node) {
    std::string text = "'" + std::string(node->kind().toQualString()) + "'";
    const jit::SourceRange range = node->sourceRange();
    const auto& source = range.source();
    if (!source) return text + " (no source location)";
    const std::size_t line = source->lineno_for_offset(range.start());
    std::string code = source->get_line(line).str();
    while (!code.empty() && (code.back() == '\n' || code.back() == '\r' || code.back() == ' ')) code.pop_back();
    std::size_t first = 0;
    while (first < code.size() && code[first] == ' ') ++first;
    code = code.substr(first);
    const bool has_file = source->filename().has_value();
    const std::size_t shown = has_file ? source->lineno_to_source_lineno(line) : line + 1;
    text += " at line " + std::to_string(shown);
    if (has_file) text += " of " + *source->filename();
    if (!code.empty()) text += " (`" + code + "`)";
    return text;
}

// ------------------------------------------------------------------------ structured values

/// The shape of a structured value (a module's argument or its result): tuples, lists and
/// dicts whose leaves are tensors (numbered in order) or constants frozen at capture.
struct ValueTree {
    enum class Kind : unsigned char { leaf, constant, tuple, list, dict } kind = Kind::constant;
    std::size_t leaf = 0;          ///< leaf: index of the tensor among the leaves
    c10::IValue constant;          ///< constant
    c10::TypePtr type;             ///< list, dict: the container's type
    std::vector<c10::IValue> keys; ///< dict: one key per child
    std::vector<ValueTree> children;
};

/// Rebuilds the structured value with `tensors` (one per leaf) in place.
[[nodiscard]] inline c10::IValue pack(const ValueTree& tree, const std::vector<at::Tensor>& tensors) {
    using Kind = ValueTree::Kind;
    switch (tree.kind) {
        case Kind::leaf: return tensors.at(tree.leaf);
        case Kind::constant: return tree.constant;
        case Kind::tuple: {
            std::vector<c10::IValue> items;
            for (const ValueTree& child : tree.children) items.push_back(pack(child, tensors));
            return c10::ivalue::Tuple::create(std::move(items));
        }
        case Kind::list: {
            c10::impl::GenericList list(tree.type->castRaw<c10::ListType>()->getElementType());
            for (const ValueTree& child : tree.children) list.push_back(pack(child, tensors));
            return c10::IValue(std::move(list));
        }
        case Kind::dict: {
            const auto* dict_type = tree.type->castRaw<c10::DictType>();
            c10::impl::GenericDict dict(dict_type->getKeyType(), dict_type->getValueType());
            for (std::size_t i = 0; i < tree.children.size(); ++i)
                dict.insert_or_assign(tree.keys[i], pack(tree.children[i], tensors));
            return c10::IValue(std::move(dict));
        }
    }
    return {};
}

/// The tensors at the leaves of `value`, which must have the tree's shape; `what` names the
/// value in messages. Constants must equal the ones capture froze.
inline void flatten(const ValueTree& tree, const c10::IValue& value, std::vector<at::Tensor>& out,
                    const std::string& what) {
    using Kind = ValueTree::Kind;
    const auto mismatch = [&what](const std::string& why) {
        throw InvalidInput(what + " " + why + " than at capture; capture again for such inputs");
    };
    switch (tree.kind) {
        case Kind::leaf:
            if (!value.isTensor()) mismatch("is not a tensor, but was one");
            if (out.size() <= tree.leaf) out.resize(tree.leaf + 1);
            out[tree.leaf] = value.toTensor();
            return;
        case Kind::constant:
            if (!(value == tree.constant)) mismatch("has another value");
            return;
        case Kind::tuple: {
            if (!value.isTuple() || value.toTupleRef().elements().size() != tree.children.size())
                mismatch("has another structure");
            const auto& items = value.toTupleRef().elements();
            for (std::size_t i = 0; i < tree.children.size(); ++i)
                flatten(tree.children[i], items[i], out, what + "[" + std::to_string(i) + "]");
            return;
        }
        case Kind::list: {
            if (!value.isList() || value.toListRef().size() != tree.children.size()) mismatch("has another structure");
            const auto items = value.toListRef();
            for (std::size_t i = 0; i < tree.children.size(); ++i)
                flatten(tree.children[i], items[i], out, what + "[" + std::to_string(i) + "]");
            return;
        }
        case Kind::dict: {
            if (!value.isGenericDict() || value.toGenericDict().size() != tree.children.size())
                mismatch("has another structure");
            const auto dict = value.toGenericDict();
            for (std::size_t i = 0; i < tree.children.size(); ++i) {
                const auto found = dict.find(tree.keys[i]);
                if (found == dict.end()) mismatch("has other keys");
                flatten(tree.children[i], found->value(), out, what + "[" + tree.keys[i].tagKind() + " key]");
            }
            return;
        }
    }
}

// ------------------------------------------------------------------------ the executable table

/// Where an instruction finds an argument: a value frozen at capture, or a slot of the
/// group's frame.
struct Arg {
    bool frozen = false;
    std::size_t index = 0;
};

enum class InstrKind : unsigned char {
    operation,
    list_construct,
    tuple_construct,
    dict_construct,
    list_unpack,
    tuple_unpack,
    identity
};

struct Instr {
    InstrKind kind = InstrKind::operation;
    // Mutable: Operation::operator() is not const in LibTorch 1.x, though calling it changes nothing.
    mutable std::optional<jit::Operation> operation;
    bool vararg = false;   ///< the operation takes its argument count on the stack
    bool out_of_place = false;  ///< runs the out-of-place form of the node's in-place op
    c10::TypePtr type;     ///< list_construct, dict_construct: the container's type
    std::vector<Arg> args; ///< dict_construct: key, value, key, value, ...
    std::vector<std::size_t> outs;
    const jit::Node* node = nullptr;
};

/// The kind of node an instruction runs: "aten::relu" also for an `aten::relu_` node that
/// capture runs out of place.
[[nodiscard]] inline std::string label(const Instr& instr) {
    std::string kind = instr.node->kind().toQualString();
    if (instr.out_of_place && !kind.empty() && kind.back() == '_') kind.pop_back();
    return kind;
}

/// One op of the problem: the nodes it runs, what it reads and writes, and its ids.
/// The shape, strides and options of a tensor, to make one like it.
struct TensorMeta {
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> strides;
    at::TensorOptions options;
    [[nodiscard]] static TensorMeta of(const at::Tensor& t) {
        return {t.sizes().vec(), t.strides().vec(), t.options().requires_grad(false)};
    }
    /// A tensor of this shape and layout that any op accepts: ones when floating point (a
    /// valid probability, divisor or logarithm's argument), zeros otherwise (a valid index).
    [[nodiscard]] at::Tensor placeholder() const {
        const at::Tensor t = at::empty_strided(sizes, strides, options);
        const auto elements = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
        // Filled through a flat view of its whole storage: the strides may overlap (expand).
        t.as_strided({elements}, {1}, 0).fill_(at::isFloatingType(t.scalar_type()) ? 1 : 0);
        return t;
    }
};

struct Group {
    std::string name;
    std::string where;
    std::vector<Instr> program;
    std::size_t slots = 0;
    std::vector<std::size_t> input_slots;   // aligned with inputs
    std::vector<std::size_t> output_slots;  // aligned with outputs
    std::vector<std::size_t> inputs;        // capture's value ids of the activations it reads
    std::vector<std::size_t> outputs;       // ... and of those it writes
    std::vector<char> clone_output;
    std::vector<char> input_differentiable;
    std::vector<std::size_t> input_uses;  // per input: the arguments of its program that read it
    // Per input: how many contributions of other consumers its backward adds first (`seed`),
    // where it reads the input more than once and others read it too; 0: none.
    std::vector<std::size_t> input_seeds;
    std::vector<char> output_requires_grad;
    std::vector<std::size_t> parameters;  // indices into Core::parameters
    std::vector<at::Tensor> trainable;    // the same tensors
    std::vector<at::Tensor> buffers;      // buffers its forward updates (once per step)
    // What a recomputation must find as its first run did: the buffers it updates, and those
    // it reads that a later op updates.
    std::vector<at::Tensor> rerun_buffers;
    std::vector<const void*> frozen_storages;  // storages of frozen tensors it reads
    // Groups whose forward must first run before this group's (they share a buffer with it
    // that one of the two updates, and no data orders them): a zero-byte datum each orders it.
    std::vector<std::size_t> runs_after;
    bool random = false;
    /// Where its random numbers come in the module's forward: the position of its first
    /// random node (of its root when it has none); groups draw in increasing order.
    std::size_t draw_rank = 0;
    std::vector<TensorMeta> input_meta;  // aligned with inputs
    bool has_backward = false;
    // Ids in the problem.
    std::optional<OpId> fwd, fwd_grad, bwd;
    std::vector<DataId> input_data, output_data;
    std::optional<DataId> saved, marker;
    std::vector<std::vector<DataId>> incoming;      // per output: contributions B reads
    std::vector<std::optional<DataId>> input_grad;  // per input: the contribution B writes
    // Per input: the contributions of other consumers that autograd adds before this group's
    // (input_seeds); B reads them, adds its own and writes the sum as input_grad.
    std::vector<std::vector<DataId>> seed;
};

/// One tensor leaf of the module's arguments.
struct InputInfo {
    std::string name;
    std::vector<std::int64_t> sizes;
    at::ScalarType dtype = at::kFloat;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    bool requires_grad = false;
    DataId data;
    std::vector<DataId> grads;  // contributions to its gradient (final data)
};

enum class OpRole : unsigned char { forward, forward_grad, backward, loss };
enum class DataRole : unsigned char { activation, saved, gradient, marker };

struct OpEntry {
    OpRole role = OpRole::forward;
    std::size_t group = 0;
};
struct DataEntry {
    DataRole role = DataRole::activation;
    std::size_t group = 0;  // saved / marker: its group; activation: producing group (or input)
    bool input = false;     // activation of a module input leaf
    std::size_t output = 0; // index into the producing group's outputs, or the input leaf
};

}  // namespace detail::capture

/// What capture found about one op of the problem (a group of TorchScript nodes).
struct CapturedOp {
    std::string name;                 ///< "linear.7": the root node's kind and the op's index
    std::vector<std::string> nodes;   ///< node kinds of the group, in execution order
    std::string source;               ///< the root node and its source line
    std::vector<std::string> inputs;  ///< data the forward reads
    std::vector<std::string> outputs; ///< data the forward writes
    std::vector<std::string> backward_reads;  ///< inputs/outputs its backward really reads
    bool random = false;              ///< draws random numbers (replayed on recomputation)
    bool mutates_buffers = false;     ///< updates buffers (once per step, never on recomputation)
    bool has_backward = false;
    double forward_time = 0.0;        ///< no-grad forward, seconds
    double forward_grad_time = 0.0;   ///< forward with autograd
    double backward_time = 0.0;
    Bytes output_bytes = 0;
    Bytes saved_bytes = 0;
    Bytes forward_overhead = 0;
    Bytes forward_grad_overhead = 0;
    Bytes backward_overhead = 0;
};

namespace detail::capture {

/// Everything the executor needs, immutable after capture.
struct Core {
    jit::Module module;
    std::shared_ptr<jit::Graph> graph;  // owns the nodes the instructions point at
    std::string name;
    std::vector<c10::IValue> frozen;
    std::vector<Group> groups;  // topological order
    std::vector<at::Tensor> parameters;
    std::vector<std::string> parameter_names;
    std::vector<InputInfo> inputs;        // one per tensor leaf of the arguments
    std::vector<ValueTree> input_trees;   // one per argument of forward
    ValueTree output_tree;
    std::vector<DataId> output_data;                 // per output leaf
    std::vector<std::optional<DataId>> output_grad;  // per output leaf: g:X<loss
    Problem problem = ProblemBuilder("unbuilt").build();
    OpId loss{};
    std::vector<OpEntry> ops;
    std::vector<DataEntry> data;
    std::vector<CapturedOp> info;
    bool training = true;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    double seconds = 0.0;
};

// ------------------------------------------------------------------------ running a group

[[nodiscard]] inline const c10::IValue& fetch(const std::vector<c10::IValue>& frozen,
                                              const std::vector<c10::IValue>& frame, const Arg& a) {
    return a.frozen ? frozen[a.index] : frame[a.index];
}

/// Runs one instruction on the frame.
inline void execute(const Instr& instr, const std::vector<c10::IValue>& frozen, std::vector<c10::IValue>& frame,
                    jit::Stack& stack) {
    stack.clear();
    const auto arg = [&](std::size_t k) -> const c10::IValue& { return fetch(frozen, frame, instr.args[k]); };
    switch (instr.kind) {
        case InstrKind::operation: {
            for (std::size_t k = 0; k < instr.args.size(); ++k) stack.push_back(arg(k));
            if (instr.vararg) stack.emplace_back(static_cast<std::int64_t>(instr.args.size()));
            (*instr.operation)(stack);
            if (stack.size() != instr.outs.size())
                throw ExecutionError("node " + where(instr.node) + " returned " + std::to_string(stack.size()) +
                                     " values instead of " + std::to_string(instr.outs.size()));
            for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = std::move(stack[k]);
            return;
        }
        case InstrKind::list_construct: {
            c10::impl::GenericList list(instr.type->castRaw<c10::ListType>()->getElementType());
            list.reserve(instr.args.size());
            for (std::size_t k = 0; k < instr.args.size(); ++k) list.push_back(arg(k));
            frame[instr.outs[0]] = c10::IValue(std::move(list));
            return;
        }
        case InstrKind::tuple_construct: {
            std::vector<c10::IValue> items;
            for (std::size_t k = 0; k < instr.args.size(); ++k) items.push_back(arg(k));
            frame[instr.outs[0]] = c10::ivalue::Tuple::create(std::move(items));
            return;
        }
        case InstrKind::dict_construct: {
            const auto* type = instr.type->castRaw<c10::DictType>();
            c10::impl::GenericDict dict(type->getKeyType(), type->getValueType());
            for (std::size_t k = 0; k + 1 < instr.args.size(); k += 2) dict.insert_or_assign(arg(k), arg(k + 1));
            frame[instr.outs[0]] = c10::IValue(std::move(dict));
            return;
        }
        case InstrKind::list_unpack: {
            const auto items = arg(0).toListRef();
            if (items.size() != instr.outs.size())
                throw ExecutionError("node " + where(instr.node) + " unpacks " + std::to_string(items.size()) +
                                     " values into " + std::to_string(instr.outs.size()));
            for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = items[k];
            return;
        }
        case InstrKind::tuple_unpack: {
            const c10::IValue tuple = arg(0);
            const auto& items = tuple.toTupleRef().elements();
            for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = items[k];
            return;
        }
        case InstrKind::identity: frame[instr.outs[0]] = arg(0); return;
    }
}

/// Runs the group's nodes in the current grad mode on `inputs` and returns its outputs.
[[nodiscard]] inline std::vector<at::Tensor> run_program(const Core& core, const Group& g,
                                                         const std::vector<at::Tensor>& inputs) {
    std::vector<c10::IValue> frame(g.slots);
    for (std::size_t i = 0; i < inputs.size(); ++i) frame[g.input_slots[i]] = inputs[i];
    jit::Stack stack;
    for (const Instr& instr : g.program) execute(instr, core.frozen, frame, stack);
    std::vector<at::Tensor> outputs;
    outputs.reserve(g.output_slots.size());
    for (std::size_t k = 0; k < g.output_slots.size(); ++k) {
        at::Tensor t = frame[g.output_slots[k]].toTensor();
        if (g.clone_output[k]) t = t.clone();
        outputs.push_back(std::move(t));
    }
    return outputs;
}

/// The autograd graph of one run with grad: the detached leaves of the inputs and the outputs.
struct GroupGraph {
    std::vector<at::Tensor> leaves;
    std::vector<at::Tensor> outputs;
    // Per seeded input (Group::input_seeds): a view of its leaf made after the group's nodes,
    // so the last in autograd's order on every thread: the seeds enter through it.
    std::vector<at::Tensor> aliases;
    [[nodiscard]] bool live() const noexcept { return !outputs.empty(); }
    void clear() noexcept {
        leaves.clear();
        outputs.clear();
        aliases.clear();
    }
};

[[nodiscard]] inline std::vector<at::Tensor> run_no_grad(const Core& core, const Group& g,
                                                         const std::vector<at::Tensor>& inputs) {
    const at::NoGradGuard no_grad;
    return run_program(core, g, inputs);
}

/// Runs the group on detached leaves of its inputs, so that its autograd graph is its own.
[[nodiscard]] inline GroupGraph run_with_grad(const Core& core, const Group& g, const std::vector<at::Tensor>& inputs) {
    const ::torch::autograd::AutoGradMode grad_mode(true);
    GroupGraph graph;
    graph.leaves.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        at::Tensor leaf = inputs[i].detach();
        if (g.input_differentiable[i]) leaf.requires_grad_(true);
        graph.leaves.push_back(std::move(leaf));
    }
    graph.outputs = run_program(core, g, graph.leaves);
    graph.aliases.resize(graph.leaves.size());
    for (std::size_t i = 0; i < g.input_seeds.size(); ++i)
        if (g.input_seeds[i] > 0 && graph.leaves[i].requires_grad()) graph.aliases[i] = graph.leaves[i].view_as(graph.leaves[i]);
    return graph;
}

[[nodiscard]] inline const void* storage_of(const at::Tensor& t) {
    return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : nullptr;
}

struct BackwardResult {
    std::vector<at::Tensor> input_grads;      // per input (undefined when not differentiated)
    std::vector<at::Tensor> parameter_grads;  // per group parameter
};

/// A copy of `t` in memory of its own, with its strides where its storage is no larger than
/// a dense copy: an expanded gradient stays expanded (the bytes of its storage, not of its
/// shape), and the kernels that read it take the path they take in eager PyTorch
/// (elementwise kernels round differently on an expanded input than on a dense one). A view
/// into a larger storage (a slice of a concatenation's gradient) is copied densely.
[[nodiscard]] inline at::Tensor copy_with_layout(const at::Tensor& t) {
    const at::NoGradGuard no_grad;
    const auto dense_bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    if (t.is_non_overlapping_and_dense() || t.storage().nbytes() > dense_bytes) return t.clone(at::MemoryFormat::Preserve);
    const auto elements = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
    const at::Tensor whole = at::empty({0}, t.options()).set_(t.storage(), 0, {elements}, {1});
    return whole.clone().as_strided(t.sizes(), t.strides(), t.storage_offset());
}

/// The summed incoming contributions of each output that needs a gradient: autograd's roots.
struct BackwardRoots {
    std::vector<at::Tensor> roots, grads;
    std::unordered_set<const void*> taken;  // storages of the contributions
};

[[nodiscard]] inline BackwardRoots backward_roots(const GroupGraph& graph,
                                                  const std::vector<std::vector<at::Tensor>>& incoming) {
    BackwardRoots r;
    const at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < graph.outputs.size(); ++k) {
        if (!graph.outputs[k].requires_grad() || k >= incoming.size()) continue;
        at::Tensor sum;
        for (const at::Tensor& c : incoming[k]) {
            if (!c.defined()) continue;
            r.taken.insert(storage_of(c));
            sum = sum.defined() ? sum + c : c;
        }
        if (!sum.defined()) continue;
        r.roots.push_back(graph.outputs[k]);
        r.grads.push_back(std::move(sum));
    }
    return r;
}

/// Back-propagates one group: `incoming[k]` are the gradient contributions of output k,
/// summed here. Input gradients that share memory with an incoming gradient or with each
/// other (autograd passes some through unchanged) are copied, so that every contribution
/// owns the bytes the problem gives it; parameter gradients likewise.
///
/// `seeds[i]`: contributions to input i's gradient that autograd's engine adds before this
/// group's own (those of consumers it runs first, Group::seed). Their sum enters as the
/// gradient of a view of the input made after the group's nodes (GroupGraph::aliases), the
/// first node in the engine's order: the engine adds it first, then the group's uses one by
/// one, as eager PyTorch adds them all.
[[nodiscard]] inline BackwardResult run_backward(const Group& g, GroupGraph& graph,
                                                 const std::vector<std::vector<at::Tensor>>& incoming,
                                                 bool retain_graph = false,
                                                 const std::vector<std::vector<at::Tensor>>& seeds = {}) {
    BackwardResult result;
    result.input_grads.assign(g.inputs.size(), at::Tensor());
    result.parameter_grads.assign(g.trainable.size(), at::Tensor());
    BackwardRoots roots = backward_roots(graph, incoming);
    for (std::size_t i = 0; i < seeds.size() && i < graph.leaves.size(); ++i) {
        if (seeds[i].empty() || !graph.leaves[i].requires_grad()) continue;
        at::Tensor sum;
        {
            const at::NoGradGuard no_grad;
            for (const at::Tensor& c : seeds[i]) {
                roots.taken.insert(storage_of(c));
                sum = sum.defined() ? sum + c : c;
            }
        }
        // run_with_grad made the view for every seeded input; a graph without it was made
        // before input_seeds was set, and the seed would enter in the wrong order.
        if (i >= graph.aliases.size() || !graph.aliases[i].defined())
            throw ExecutionError("capture: the backward of an op is seeded but its graph has no view of input " +
                                 std::to_string(i) + " to seed it through (a bug in remat; please report it)");
        roots.roots.push_back(graph.aliases[i]);
        roots.grads.push_back(std::move(sum));
    }
    std::vector<at::Tensor> wrt;
    std::vector<std::size_t> wrt_input;
    for (std::size_t i = 0; i < graph.leaves.size(); ++i)
        if (graph.leaves[i].requires_grad()) {
            wrt.push_back(graph.leaves[i]);
            wrt_input.push_back(i);
        }
    const std::size_t first_parameter = wrt.size();
    for (const at::Tensor& p : g.trainable) wrt.push_back(p);
    if (roots.roots.empty() || wrt.empty()) return result;
    std::vector<at::Tensor> grads = ::torch::autograd::grad(roots.roots, wrt, roots.grads, retain_graph,
                                                            /*create_graph=*/false, /*allow_unused=*/true);
    const at::NoGradGuard no_grad;
    const auto own = [&taken = roots.taken](at::Tensor t) {
        if (!t.defined()) return t;
        if (const void* s = storage_of(t); s != nullptr && !taken.insert(s).second) t = copy_with_layout(t);
        taken.insert(storage_of(t));
        return t;
    };
    for (std::size_t j = 0; j < wrt_input.size(); ++j) result.input_grads[wrt_input[j]] = own(std::move(grads[j]));
    for (std::size_t j = 0; j < g.trainable.size(); ++j)
        result.parameter_grads[j] = own(std::move(grads[first_parameter + j]));
    return result;
}

}  // namespace detail::capture
}  // namespace remat::torch
