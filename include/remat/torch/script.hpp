// remat/torch/script.hpp — op-level capture of a TorchScript module into a remat.problem/1
// problem, with the executable table of its ops.
//
// Rockmate (Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, ICML 2023) plans on the
// graph of a model's forward and backward operations; Checkmate (Jain et al., MLSys 2020)
// on the same kind of graph. This header builds that graph from a torch::jit::Module
// (written in C++ with Module::define, or saved from Python and loaded with
// torch::jit::load), following DESIGN.md §4.7:
//   - the forward graph is copied and inlined, and run node by node with
//     Node::getOperation() on example inputs; prim::Constant, prim::GetAttr and the list and
//     tuple nodes are interpreted by hand, prim::If with a condition that does not depend on
//     tensor values takes its branch (plans are per input shape anyway);
//   - values that depend only on constants and shapes are computed once and frozen; values
//     computed from parameters and buffers alone are recomputed inside every op that uses
//     them (so gradients reach the parameters); views, scalars read from tensors, list and
//     tuple plumbing and cheap single-use elementwise ops are folded into their consumer;
//     every other node computing on activations roots an op (an in-place update joins the
//     op that produced the updated value);
//   - per op G the problem has a no-grad forward `F:G`, a forward with autograd `F+:G` that
//     also writes the saved state `s:G`, and a backward `B:G` (exactly once) that reads the
//     gradient contributions of G's outputs, `s:G`, and only those of G's inputs and outputs
//     that its backward really reads, and writes one contribution `g:X<G` per input X it
//     differentiates. What the backward reads is measured: each candidate's memory is
//     overwritten (NaN, then other values) under a retained graph and the gradients compared.
//   - bytes, overheads and times (medians) are measured with the same primitives the executor
//     runs (graph_executor.hpp), under a memory probe (DESIGN.md principle 2); random ops are
//     detected by the generator's state and replayed by the executor.
// Unsupported constructs — control flow on tensor values, loops, in-place updates of a
// graph input, a parameter, a buffer or a view, node kinds without an operator — throw
// remat::InvalidInput naming the node kind and its source line; a capture never guesses.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <time.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../io/budget.hpp"
#include "detail/runtime.hpp"
#include "memory.hpp"
#include "profile.hpp"

namespace remat::torch {

struct CaptureOptions {
    /// Name of the resulting problem.
    std::string name = "model";
    /// Timed runs per op and pass; the median is kept. On the CPU with one intra-op thread
    /// (at::set_num_threads(1)) ops are timed with the thread's CPU time, which other
    /// processes do not disturb; otherwise with the wall clock.
    std::size_t repeats = 5;
    /// Untimed runs before the timed ones.
    std::size_t warmup = 1;
    /// When capture has run this long, the remaining ops are timed once, without warm-up.
    std::optional<double> time_limit_seconds;
    /// Fold cheap single-use elementwise ops (scalar arithmetic, masked_fill, copies) into
    /// their consumer; off, each of them becomes an op of its own.
    bool fold_cheap_ops = true;
    /// One line per op on stderr.
    bool verbose = false;
    /// Called with each progress line (instead of stderr when set).
    std::function<void(const std::string&)> progress;
};

/// What capture found about one op of the problem (a group of TorchScript nodes).
struct CapturedOp {
    std::string name;                 ///< "linear.7": the root node's kind and the op's index
    std::vector<std::string> nodes;   ///< node kinds of the group, in execution order
    std::string source;               ///< the root node and its source line
    std::vector<std::string> inputs;  ///< data the forward reads
    std::vector<std::string> outputs; ///< data the forward writes
    std::vector<std::string> backward_reads;  ///< inputs/outputs its backward really reads
    bool random = false;              ///< draws random numbers (replayed on recomputation)
    bool mutates_buffers = false;     ///< updates buffers (restored around recomputations)
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

/// An exception's message without the C++ backtrace LibTorch appends to its own errors.
[[nodiscard]] inline std::string error_message(const std::exception& e) {
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
    return e.what();
}

namespace detail::script {

namespace jit = ::torch::jit;

// ------------------------------------------------------------------------ node descriptions

/// "'aten::foo' at line 12 (`y = torch.foo(x)`)": what error messages name.
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

[[nodiscard]] inline std::string short_kind(const jit::Node* node) {
    const std::string full = node->kind().toQualString();
    const auto colon = full.rfind("::");
    return colon == std::string::npos ? full : full.substr(colon + 2);
}

// Ops whose result is a function of their inputs' metadata only (shapes, types, whether an
// optional value is None): frozen at capture like shape arithmetic, even when their input is
// an activation.
inline bool is_metadata_op(std::string_view kind) {
    static constexpr std::string_view kinds[] = {"aten::size",       "aten::dim",   "aten::numel",
                                                 "aten::len",        "prim::dtype", "prim::device",
                                                 "prim::layout",     "prim::is_cuda", "aten::is_floating_point",
                                                 "aten::is_complex", "aten::stride", "aten::__is__",
                                                 "aten::__isnot__",  "prim::isinstance"};
    return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

// Elementwise ops cheap enough to recompute inside their single consumer.
inline bool is_cheap_op(std::string_view kind) {
    static constexpr std::string_view kinds[] = {"aten::mul",   "aten::div",      "aten::add",   "aten::sub",
                                                 "aten::rsub",  "aten::neg",      "aten::masked_fill",
                                                 "aten::to",    "aten::type_as",  "aten::contiguous",
                                                 "aten::clone", "aten::eq",       "aten::ne"};
    return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

// Dropout is elementwise and cheap: folded into its single consumer like the ops above, it
// makes that op random (replayed on recomputation) and its mask part of that op's saved state.
inline bool is_dropout(std::string_view kind) {
    return kind == "aten::dropout" || kind == "aten::feature_dropout" || kind == "aten::alpha_dropout" ||
           kind == "aten::feature_alpha_dropout";
}

inline bool is_random_node(const jit::Node* node) {
    if (node->isNondeterministic()) return true;
    static constexpr std::string_view kinds[] = {
        "aten::dropout",   "aten::dropout_",  "aten::feature_dropout", "aten::alpha_dropout", "aten::bernoulli",
        "aten::bernoulli_", "aten::rand",     "aten::rand_like",       "aten::randn",         "aten::randn_like",
        "aten::randint",   "aten::randint_like", "aten::randperm",     "aten::normal",        "aten::normal_",
        "aten::uniform_",  "aten::exponential_", "aten::multinomial",  "aten::rrelu",         "aten::poisson",
        "aten::native_dropout"};
    const std::string kind = node->kind().toQualString();
    return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

// ------------------------------------------------------------------------ timing

/// Seconds on a clock for timing ops: the calling thread's CPU time when every op runs on
/// this thread (CPU tensors, one intra-op thread) — unaffected by other processes taking the
/// CPU — and the wall clock otherwise (CUDA, several threads).
class OpClock {
public:
    explicit OpClock(const c10::Device& device)
        : thread_time_(device.is_cpu() && at::get_num_threads() == 1 && thread_clock_works()) {}
    [[nodiscard]] double now() const {
#if defined(CLOCK_THREAD_CPUTIME_ID)
        if (thread_time_) {
            timespec t{};
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
            return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
        }
#endif
        return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    }
    [[nodiscard]] bool thread_time() const noexcept { return thread_time_; }

private:
    static bool thread_clock_works() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
        timespec t{};
        return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0;
#else
        return false;
#endif
    }
    bool thread_time_;
};

// ------------------------------------------------------------------------ the executable table

/// Where an instruction finds an argument: a frozen value of the capture, or a slot of the
/// group's frame.
struct Arg {
    bool frozen = false;
    std::size_t index = 0;
};

enum class InstrKind : unsigned char { operation, list_construct, tuple_construct, list_unpack, tuple_unpack, tuple_index, identity };

struct Instr {
    InstrKind kind = InstrKind::operation;
    // Mutable: Operation::operator() is not const in LibTorch 1.x, though calling it changes nothing.
    mutable std::optional<jit::Operation> operation;
    c10::TypePtr element_type;  // list_construct
    std::vector<Arg> args;
    std::vector<std::size_t> outs;  // slots
    const jit::Node* node = nullptr;
};

/// One op of the problem: the nodes it runs, what it reads and writes, and its ids.
struct Group {
    std::string name;
    std::string where;
    std::vector<Instr> program;
    std::size_t slots = 0;
    std::vector<std::size_t> input_slots;   // aligned with inputs
    std::vector<std::size_t> output_slots;  // aligned with outputs
    std::vector<std::size_t> inputs;        // activation values (canonical ids)
    std::vector<std::size_t> outputs;
    std::vector<char> clone_output;
    std::vector<char> input_differentiable;
    std::vector<char> output_requires_grad;
    std::vector<std::size_t> parameters;  // indices into Core::parameters
    std::vector<at::Tensor> trainable;    // the same tensors
    std::vector<at::Tensor> buffers;      // buffers its forward updates
    std::vector<const void*> frozen_storages;  // storages of frozen tensors it reads
    bool random = false;
    bool has_backward = false;
    // Ids in the problem.
    std::optional<OpId> fwd, fwd_grad, bwd;
    std::vector<DataId> input_data, output_data;
    std::optional<DataId> saved, marker;
    std::vector<std::vector<DataId>> incoming;      // per output: contributions B reads
    std::vector<std::optional<DataId>> input_grad;  // per input: the contribution B writes
};

/// The module's outputs: a tree of tuples and lists whose leaves are activations (by index
/// into Core::output_values) or constants.
struct OutputNode {
    enum class Kind : unsigned char { activation, constant, tuple, list } kind = Kind::constant;
    std::size_t index = 0;
    c10::IValue constant;
    c10::TypePtr element_type;
    std::vector<OutputNode> children;
};

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
    bool input = false;     // activation of a graph input
    std::size_t output = 0; // index into the producing group's outputs, or the input index
};

/// Everything the executor needs, immutable after capture.
struct Core {
    jit::Module module;
    std::shared_ptr<jit::Graph> graph;  // owns the nodes the instructions point at
    std::string name;
    std::vector<c10::IValue> frozen;
    std::vector<Group> groups;  // topological order
    std::vector<at::Tensor> parameters;
    std::vector<InputInfo> inputs;
    OutputNode output_tree;
    std::vector<DataId> output_data;  // per output leaf
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

[[nodiscard]] inline const c10::IValue& fetch(const Core& core, const std::vector<c10::IValue>& frame, const Arg& a) {
    return a.frozen ? core.frozen[a.index] : frame[a.index];
}

/// Runs the group's nodes in the current grad mode on `inputs` and returns its outputs.
[[nodiscard]] inline std::vector<at::Tensor> run_program(const Core& core, const Group& g,
                                                         const std::vector<at::Tensor>& inputs) {
    std::vector<c10::IValue> frame(g.slots);
    for (std::size_t i = 0; i < inputs.size(); ++i) frame[g.input_slots[i]] = inputs[i];
    jit::Stack stack;
    for (const Instr& instr : g.program) {
        stack.clear();
        switch (instr.kind) {
            case InstrKind::operation: {
                for (const Arg& a : instr.args) stack.push_back(fetch(core, frame, a));
                (*instr.operation)(stack);
                if (stack.size() != instr.outs.size())
                    throw ExecutionError("node " + where(instr.node) + " returned " + std::to_string(stack.size()) +
                                         " values instead of " + std::to_string(instr.outs.size()));
                for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = std::move(stack[k]);
                break;
            }
            case InstrKind::list_construct: {
                c10::impl::GenericList list(instr.element_type);
                list.reserve(instr.args.size());
                for (const Arg& a : instr.args) list.push_back(fetch(core, frame, a));
                frame[instr.outs[0]] = c10::IValue(std::move(list));
                break;
            }
            case InstrKind::tuple_construct: {
                std::vector<c10::IValue> items;
                for (const Arg& a : instr.args) items.push_back(fetch(core, frame, a));
                frame[instr.outs[0]] = c10::ivalue::Tuple::create(std::move(items));
                break;
            }
            case InstrKind::list_unpack: {
                const auto items = fetch(core, frame, instr.args[0]).toListRef();
                if (items.size() != instr.outs.size())
                    throw ExecutionError("node " + where(instr.node) + " unpacks " + std::to_string(items.size()) +
                                         " values into " + std::to_string(instr.outs.size()));
                for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = items[k];
                break;
            }
            case InstrKind::tuple_unpack: {
                const c10::IValue tuple = fetch(core, frame, instr.args[0]);
                const auto& items = tuple.toTupleRef().elements();
                for (std::size_t k = 0; k < instr.outs.size(); ++k) frame[instr.outs[k]] = items[k];
                break;
            }
            case InstrKind::tuple_index: {
                const c10::IValue tuple = fetch(core, frame, instr.args[0]);
                const auto& items = tuple.toTupleRef().elements();
                std::int64_t i = fetch(core, frame, instr.args[1]).toInt();
                if (i < 0) i += static_cast<std::int64_t>(items.size());
                frame[instr.outs[0]] = items.at(static_cast<std::size_t>(i));
                break;
            }
            case InstrKind::identity: frame[instr.outs[0]] = fetch(core, frame, instr.args[0]); break;
        }
    }
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
    [[nodiscard]] bool live() const noexcept { return !outputs.empty(); }
    void clear() noexcept {
        leaves.clear();
        outputs.clear();
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
    return graph;
}

[[nodiscard]] inline const void* storage_of(const at::Tensor& t) {
    return t.defined() && t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : nullptr;
}

/// Bytes of the distinct storages of `tensors`.
[[nodiscard]] inline Bytes distinct_bytes(const std::vector<at::Tensor>& tensors) {
    std::unordered_set<const void*> seen;
    Bytes total = 0;
    for (const at::Tensor& t : tensors)
        if (const void* s = storage_of(t); s != nullptr && seen.insert(s).second) total += storage_bytes(t);
    return total;
}

struct BackwardResult {
    std::vector<at::Tensor> input_grads;  // per input (undefined when not differentiated)
    std::vector<at::Tensor> parameter_grads;  // per group parameter
};

/// Back-propagates one group: `incoming[k]` are the gradient contributions of output k,
/// summed here. Input gradients that share memory with an incoming gradient or with each
/// other (autograd passes some through unchanged) are copied, so that every contribution
/// owns the bytes the problem gives it; parameter gradients likewise.
[[nodiscard]] inline BackwardResult run_backward(const Group& g, GroupGraph& graph,
                                                 const std::vector<std::vector<at::Tensor>>& incoming,
                                                 bool retain_graph = false) {
    BackwardResult result;
    result.input_grads.assign(g.inputs.size(), at::Tensor());
    result.parameter_grads.assign(g.trainable.size(), at::Tensor());
    std::vector<at::Tensor> roots, root_grads;
    std::unordered_set<const void*> taken;
    for (std::size_t k = 0; k < graph.outputs.size(); ++k) {
        if (!graph.outputs[k].requires_grad() || k >= incoming.size()) continue;
        at::Tensor sum;
        {
            const at::NoGradGuard no_grad;
            for (const at::Tensor& c : incoming[k]) {
                if (!c.defined()) continue;
                taken.insert(storage_of(c));
                sum = sum.defined() ? sum + c : c;
            }
        }
        if (!sum.defined()) continue;
        roots.push_back(graph.outputs[k]);
        root_grads.push_back(std::move(sum));
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
    if (roots.empty() || wrt.empty()) return result;
    std::vector<at::Tensor> grads = ::torch::autograd::grad(roots, wrt, root_grads, retain_graph,
                                                            /*create_graph=*/false, /*allow_unused=*/true);
    const at::NoGradGuard no_grad;
    const auto own = [&taken](at::Tensor t) {
        if (!t.defined()) return t;
        if (const void* s = storage_of(t); s != nullptr && !taken.insert(s).second) t = t.clone();
        taken.insert(storage_of(t));
        return t;
    };
    for (std::size_t j = 0; j < wrt_input.size(); ++j) result.input_grads[wrt_input[j]] = own(std::move(grads[j]));
    for (std::size_t j = 0; j < g.trainable.size(); ++j)
        result.parameter_grads[j] = own(std::move(grads[first_parameter + j]));
    return result;
}

// ------------------------------------------------------------------------ interpretation

enum class Category : unsigned char { constant, state, activation };
enum class ActKind : unsigned char { none, view, scalar, pack, cheap, compute, inplace };

struct ValueRec {
    Category category = Category::constant;
    c10::IValue value;                // value of the capture run
    std::optional<std::size_t> producer;  // flat node index
    bool module_tensor = false;       // a parameter or buffer, read by reference
    std::optional<std::size_t> input; // graph input index
    std::string name;
    std::size_t canonical = 0;        // in-place results stand for their target
    bool read_by_graph = false;       // a constant read by an op capture does not freeze
};

struct FlatNode {
    const jit::Node* node = nullptr;
    InstrKind kind = InstrKind::operation;
    mutable std::optional<jit::Operation> operation;
    c10::TypePtr element_type;
    std::vector<std::size_t> inputs, outputs;  // value ids
    Category category = Category::constant;
    ActKind act = ActKind::none;
    bool random = false;
    std::optional<std::size_t> inplace_target;  // value id written in place
};

/// Builds the Core: interprets the graph, groups the nodes, profiles the groups, and writes
/// the problem.
template <class Probe>
class Builder {
public:
    Builder(const jit::Module& module, const std::vector<at::Tensor>& inputs, const CaptureOptions& options, Probe probe)
        : options_(options), probe_(std::move(probe)), sample_(inputs) {
        core_ = std::make_shared<Core>();
        core_->module = module;
        core_->name = options.name;
        core_->training = module.is_training();
        who_ = "capture of '" + options.name + "'";
    }

    std::shared_ptr<Core> build() {
        const auto start = Clock::now();
        if (!core_->module.find_method("forward"))
            throw InvalidInput(who_ + ": the module has no forward method");
        core_->graph = core_->module.get_method("forward").graph()->copy();
        jit::Inline(*core_->graph);
        collect_module_tensors();
        {
            const StateGuard guard(buffers_, device());
            interpret();
        }
        core_->frozen.assign(values_.size(), c10::IValue());
        for (std::size_t i = 0; i < values_.size(); ++i)
            if (values_[i].category == Category::constant) core_->frozen[i] = values_[i].value;
        resolve_outputs();
        mark_needed();
        form_groups();
        order_groups();
        {
            const StateGuard guard(buffers_, device());
            profile_forward();
            profile_backward();
        }
        build_problem();
        for (ValueRec& v : values_)
            if (v.category == Category::activation) v.value = c10::IValue();
        core_->seconds = seconds_since(start);
        return core_;
    }

private:
    // Restores buffers and the random generators on exit: capture leaves no trace.
    class StateGuard {
    public:
        StateGuard(const std::vector<at::Tensor>& buffers, const c10::Device& device)
            : buffers_(buffers), snapshot_(buffers), rng_(RngState::capture(device)) {}
        ~StateGuard() {
            snapshot_.restore(buffers_);
            rng_.restore();
        }
        StateGuard(const StateGuard&) = delete;
        StateGuard& operator=(const StateGuard&) = delete;

    private:
        const std::vector<at::Tensor>& buffers_;
        BufferSnapshot snapshot_;
        RngState rng_;
    };

    [[nodiscard]] c10::Device device() const {
        for (const at::Tensor& t : sample_)
            if (t.defined()) return t.device();
        return c10::Device(c10::DeviceType::CPU);
    }

    [[noreturn]] void reject(const jit::Node* node, const std::string& what) const {
        throw InvalidInput(who_ + ": node " + where(node) + " " + what);
    }

    void collect_module_tensors() {
        for (const at::Tensor& p : core_->module.parameters(true)) {
            module_storages_.insert(storage_of(p));
            if (p.requires_grad()) {
                parameter_index_.emplace(p.unsafeGetTensorImpl(), core_->parameters.size());
                core_->parameters.push_back(p);
            }
        }
        for (const at::Tensor& b : core_->module.buffers(true)) {
            module_storages_.insert(storage_of(b));
            if (b.defined()) buffers_.push_back(b);
        }
        start_buffers_ = BufferSnapshot(buffers_);
    }

    std::size_t add_value(const jit::Value* v, Category c, c10::IValue value) {
        ValueRec rec;
        rec.category = c;
        rec.value = std::move(value);
        rec.name = v != nullptr ? v->debugName() : std::string("?");
        rec.canonical = values_.size();
        values_.push_back(std::move(rec));
        if (v != nullptr) ids_[v] = values_.size() - 1;
        return values_.size() - 1;
    }

    std::size_t id_of(const jit::Value* v, const jit::Node* user) const {
        const auto it = ids_.find(v);
        if (it == ids_.end()) reject(user, "reads a value that capture never computed (internal error in capture)");
        return it->second;
    }

    // ---------------------------------------------------------------- interpretation

    void interpret() {
        const jit::Graph& g = *core_->graph;
        const auto graph_inputs = g.inputs();
        if (graph_inputs.empty()) throw InvalidInput(who_ + ": the forward graph has no self input");
        add_value(graph_inputs[0], Category::constant, c10::IValue(core_->module._ivalue()));
        if (graph_inputs.size() - 1 != sample_.size())
            throw InvalidInput(who_ + ": forward takes " + std::to_string(graph_inputs.size() - 1) + " inputs but " +
                               std::to_string(sample_.size()) + " example inputs were given");
        for (std::size_t i = 1; i < graph_inputs.size(); ++i) {
            const at::Tensor& t = sample_[i - 1];
            if (!t.defined()) throw InvalidInput(who_ + ": example input " + std::to_string(i - 1) + " is undefined");
            if (!t.has_storage())
                throw InvalidInput(who_ + ": example input " + std::to_string(i - 1) + " is not a dense tensor");
            const std::size_t id = add_value(graph_inputs[i], Category::activation, c10::IValue(t.detach()));
            values_[id].input = i - 1;
            InputInfo info;
            info.name = graph_inputs[i]->debugName();
            info.sizes = t.sizes().vec();
            info.dtype = t.scalar_type();
            info.device = t.device();
            info.requires_grad = t.requires_grad();
            core_->inputs.push_back(std::move(info));
            input_ids_.push_back(id);
        }
        core_->device = device();
        walk(g.block());
        return_ids_.clear();
        for (const jit::Value* v : g.outputs()) return_ids_.push_back(id_of(v, g.return_node()));
    }

    void walk(const jit::Block* block) {
        for (const jit::Node* node : block->nodes()) visit(node);
    }

    void visit(const jit::Node* node) {
        const auto kind = node->kind();
        if (kind == jit::prim::Constant) {
            const auto value = jit::toIValue(node->output());
            if (!value) reject(node, "is a constant capture cannot read");
            add_value(node->output(), Category::constant, *value);
            return;
        }
        if (kind == jit::prim::GetAttr) {
            const ValueRec& owner = values_[id_of(node->input(), node)];
            if (owner.category != Category::constant || !owner.value.isObject())
                reject(node, "reads an attribute of something that is not a module");
            c10::IValue value = owner.value.toObject()->getAttr(node->s(jit::attr::name));
            const bool tensor = value.isTensor();
            const std::size_t id = add_value(node->output(), Category::constant, std::move(value));
            values_[id].module_tensor = tensor;
            return;
        }
        if (kind == jit::prim::If) {
            const ValueRec& cond = values_[id_of(node->input(0), node)];
            if (cond.category != Category::constant)
                reject(node, "is control flow that depends on tensor values; capture plans one fixed graph — "
                             "compute both branches with torch.where, or move the decision out of the model");
            const jit::Block* branch = node->blocks()[cond.value.toBool() ? 0 : 1];
            walk(branch);
            for (std::size_t k = 0; k < node->outputs().size(); ++k)
                ids_[node->outputs()[k]] = id_of(branch->outputs()[k], node);
            return;
        }
        if (kind == jit::prim::Loop)
            reject(node, "is a loop; capture plans one fixed graph — unroll it (loops over module lists are "
                         "unrolled by TorchScript itself) or trace the model");
        if (kind == jit::prim::RaiseException)
            reject(node, "raises an exception for these example inputs");
        if (kind == jit::prim::Uninitialized) {
            add_value(node->output(), Category::constant, c10::IValue());
            return;
        }
        if (kind == jit::prim::SetAttr) reject(node, "assigns a module attribute; a captured forward must not");
        generic(node);
    }

    void generic(const jit::Node* node) {
        FlatNode f;
        f.node = node;
        const auto kind = node->kind();
        if (kind == jit::prim::ListConstruct) {
            f.kind = InstrKind::list_construct;
            const auto list_type = node->output()->type()->cast<c10::ListType>();
            if (!list_type) reject(node, "builds a list of unknown type");
            f.element_type = list_type->getElementType();
        } else if (kind == jit::prim::TupleConstruct) {
            f.kind = InstrKind::tuple_construct;
        } else if (kind == jit::prim::ListUnpack) {
            f.kind = InstrKind::list_unpack;
        } else if (kind == jit::prim::TupleUnpack) {
            f.kind = InstrKind::tuple_unpack;
        } else if (kind == jit::prim::TupleIndex) {
            f.kind = InstrKind::tuple_index;
        } else if (kind == jit::prim::unchecked_cast) {
            f.kind = InstrKind::identity;
        } else if (node->maybeOperator() != nullptr) {
            f.kind = InstrKind::operation;
            try {
                f.operation.emplace(node->getOperation());
            } catch (const std::exception& e) {
                reject(node, "has no runnable operator: " + error_message(e));
            }
        } else {
            reject(node, "is a node kind capture cannot run (no operator is registered for it)");
        }
        for (const jit::Value* v : node->inputs()) f.inputs.push_back(id_of(v, node));

        // Category of the results.
        bool any_activation = false, any_state = false;
        for (const std::size_t id : f.inputs) {
            const ValueRec& v = values_[id];
            any_activation = any_activation || v.category == Category::activation;
            any_state = any_state || v.category == Category::state || v.module_tensor;
        }
        const std::string kind_name = node->kind().toQualString();
        f.random = is_random_node(node);
        if (f.kind == InstrKind::operation && is_metadata_op(kind_name))
            f.category = Category::constant;
        else if (any_activation || f.random)
            f.category = Category::activation;
        else if (any_state)
            f.category = Category::state;
        else
            f.category = Category::constant;

        // Writes.
        if (const c10::FunctionSchema* schema = node->maybeSchema()) {
            const auto& arguments = schema->arguments();
            for (std::size_t i = 0; i < arguments.size() && i < f.inputs.size(); ++i) {
                const c10::AliasInfo* alias = arguments[i].alias_info();
                if (alias == nullptr || !alias->isWrite()) continue;
                const ValueRec& target = values_[f.inputs[i]];
                if (target.category == Category::constant && !target.module_tensor) {
                    // A tensor computed once at capture: updating it from activations would
                    // accumulate over runs, and ops that read it earlier would see the update.
                    if (any_activation || any_state)
                        reject(node, "updates in place a tensor computed from constants (such as torch.zeros(...)) "
                                     "with values computed from inputs or parameters; build it out of place "
                                     "(torch.cat, torch.where, torch.nn.functional.pad)");
                    if (target.read_by_graph)
                        reject(node, "updates in place a constant tensor that an earlier op read; build it out of place");
                    continue;
                }
                if (target.module_tensor)
                    reject(node, "updates a module parameter or buffer in place; capture cannot recompute it "
                                 "(use an out-of-place op)");
                if (target.category == Category::state)
                    reject(node, "updates in place a value computed from parameters; use an out-of-place op");
                if (target.category == Category::activation) {
                    if (target.input)
                        reject(node, "updates a graph input in place; the input belongs to the caller (clone it first)");
                    if (!values_[f.inputs[i]].value.isTensor())
                        reject(node, "updates a list of activations in place; capture supports lists built once");
                    if (f.inplace_target)
                        reject(node, "updates two activations in place");
                    f.inplace_target = values_[f.inputs[i]].canonical;
                    f.category = Category::activation;
                }
            }
        }

        if (f.category != Category::constant)
            for (const std::size_t id : f.inputs)
                if (values_[id].category == Category::constant) values_[id].read_by_graph = true;
        // Evaluate once, without autograd: values for what follows, and the frozen constants.
        std::vector<c10::IValue> results = evaluate(f);
        if (results.size() != node->outputs().size())
            reject(node, "returned " + std::to_string(results.size()) + " values instead of " +
                             std::to_string(node->outputs().size()));
        const std::size_t index = flat_.size();
        for (std::size_t k = 0; k < results.size(); ++k) {
            const std::size_t id = add_value(node->outputs()[k], f.category, std::move(results[k]));
            values_[id].producer = index;
            f.outputs.push_back(id);
        }
        if (f.inplace_target)
            for (const std::size_t id : f.outputs) values_[id].canonical = *f.inplace_target;
        if (f.category == Category::activation) f.act = classify(f);
        flat_.push_back(std::move(f));
    }

    std::vector<c10::IValue> evaluate(const FlatNode& f) {
        const at::NoGradGuard no_grad;
        const jit::Node* node = f.node;
        auto value = [&](std::size_t k) -> const c10::IValue& { return values_[f.inputs[k]].value; };
        try {
            switch (f.kind) {
                case InstrKind::operation: {
                    // Capture evaluates without autograd, but plans a step that runs with it.
                    if (node->kind() == c10::Symbol::fromQualString("aten::is_grad_enabled")) return {c10::IValue(true)};
                    jit::Stack stack;
                    for (std::size_t k = 0; k < f.inputs.size(); ++k) stack.push_back(value(k));
                    (*f.operation)(stack);
                    return stack;
                }
                case InstrKind::list_construct: {
                    c10::impl::GenericList list(f.element_type);
                    for (std::size_t k = 0; k < f.inputs.size(); ++k) list.push_back(value(k));
                    return {c10::IValue(std::move(list))};
                }
                case InstrKind::tuple_construct: {
                    std::vector<c10::IValue> items;
                    for (std::size_t k = 0; k < f.inputs.size(); ++k) items.push_back(value(k));
                    return {c10::IValue(c10::ivalue::Tuple::create(std::move(items)))};
                }
                case InstrKind::list_unpack: {
                    const auto items = value(0).toListRef();
                    return std::vector<c10::IValue>(items.begin(), items.end());
                }
                case InstrKind::tuple_unpack: {
                    const auto& items = value(0).toTupleRef().elements();
                    return std::vector<c10::IValue>(items.begin(), items.end());
                }
                case InstrKind::tuple_index: {
                    const auto& items = value(0).toTupleRef().elements();
                    std::int64_t i = value(1).toInt();
                    if (i < 0) i += static_cast<std::int64_t>(items.size());
                    return {items.at(static_cast<std::size_t>(i))};
                }
                case InstrKind::identity: return {value(0)};
            }
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            reject(node, "failed on the example inputs: " + error_message(e));
        }
        return {};
    }

    static void tensors_in(const c10::IValue& v, std::vector<at::Tensor>& out) {
        if (v.isTensor()) {
            out.push_back(v.toTensor());
        } else if (v.isList()) {
            for (const c10::IValue& item : v.toListRef()) tensors_in(item, out);
        } else if (v.isTuple()) {
            for (const c10::IValue& item : v.toTupleRef().elements()) tensors_in(item, out);
        }
    }

    ActKind classify(const FlatNode& f) const {
        if (f.inplace_target) return ActKind::inplace;
        if (f.kind != InstrKind::operation) return ActKind::pack;
        const std::string kind = f.node->kind().toQualString();
        if (kind == "aten::__getitem__" || kind == "aten::list" || kind == "prim::ListIndex") return ActKind::pack;
        std::vector<at::Tensor> outs;
        bool non_tensor = false;
        for (const std::size_t id : f.outputs) {
            const c10::IValue& v = values_[id].value;
            if (v.isTensor() || v.isList() || v.isTuple())
                tensors_in(v, outs);
            else
                non_tensor = true;
        }
        if (outs.empty()) return non_tensor ? ActKind::scalar : ActKind::pack;
        std::unordered_set<const void*> input_storages;
        for (const std::size_t id : f.inputs) {
            std::vector<at::Tensor> ins;
            tensors_in(values_[id].value, ins);
            for (const at::Tensor& t : ins)
                if (const void* s = storage_of(t)) input_storages.insert(s);
        }
        bool all_alias = true;
        for (const at::Tensor& t : outs) all_alias = all_alias && input_storages.contains(storage_of(t));
        if (all_alias) return ActKind::view;
        if (f.random && !is_dropout(kind)) return ActKind::compute;
        if (options_.fold_cheap_ops && (is_cheap_op(kind) || is_dropout(kind)) && f.outputs.size() == 1 && values_[f.outputs[0]].value.isTensor())
            return ActKind::cheap;
        return ActKind::compute;
    }

    // ---------------------------------------------------------------- outputs, liveness, groups

    void resolve_outputs() {
        if (return_ids_.size() != 1)
            throw InvalidInput(who_ + ": forward returns " + std::to_string(return_ids_.size()) + " values; expected one");
        core_->output_tree = output_node(return_ids_[0]);
        if (output_values_.empty())
            throw InvalidInput(who_ + ": forward returns no tensor computed from the inputs; there is nothing to train");
    }

    OutputNode output_node(std::size_t id) {
        const ValueRec& v = values_[id];
        OutputNode out;
        if (v.category == Category::constant) {
            out.kind = OutputNode::Kind::constant;
            out.constant = v.value;
            return out;
        }
        if (v.producer) {
            const FlatNode& f = flat_[*v.producer];
            if (f.kind == InstrKind::tuple_construct || f.kind == InstrKind::list_construct) {
                out.kind = f.kind == InstrKind::tuple_construct ? OutputNode::Kind::tuple : OutputNode::Kind::list;
                out.element_type = f.element_type;
                for (const std::size_t child : f.inputs) out.children.push_back(output_node(child));
                return out;
            }
        }
        const std::string what = v.producer ? "node " + where(flat_[*v.producer].node) : "input '" + v.name + "'";
        if (v.category == Category::state)
            throw InvalidInput(who_ + ": forward returns a value computed from parameters alone (" + what +
                               "); return activations only");
        if (v.input)
            throw InvalidInput(who_ + ": forward returns its input '" + v.name +
                               "' unchanged; there is no computation to plan for it");
        if (!v.value.isTensor())
            throw InvalidInput(who_ + ": forward returns a non-tensor value computed from tensors (" + what +
                               "); return tensors, or tuples and lists of tensors");
        const std::size_t canonical = v.canonical;
        const auto found = std::find(output_values_.begin(), output_values_.end(), canonical);
        out.kind = OutputNode::Kind::activation;
        out.index = static_cast<std::size_t>(found - output_values_.begin());
        if (found == output_values_.end()) output_values_.push_back(canonical);
        return out;
    }

    void mark_needed() {
        needed_.assign(flat_.size(), 0);
        std::vector<std::size_t> work;
        const auto need_value = [&](std::size_t id) {
            for (const std::size_t v : {id, values_[id].canonical})
                if (const auto p = values_[v].producer; p && !needed_[*p]) {
                    needed_[*p] = 1;
                    work.push_back(*p);
                }
        };
        for (const std::size_t id : output_values_) need_value(id);
        for (std::size_t i = 0; i < flat_.size(); ++i)
            if (flat_[i].category == Category::activation && flat_[i].random && !needed_[i]) {
                needed_[i] = 1;
                work.push_back(i);
            }
        for (bool changed = true; changed;) {
            changed = false;
            while (!work.empty()) {
                const std::size_t i = work.back();
                work.pop_back();
                for (const std::size_t id : flat_[i].inputs) need_value(id);
            }
            // An in-place update of a needed value is needed.
            for (std::size_t i = 0; i < flat_.size(); ++i) {
                const FlatNode& f = flat_[i];
                if (needed_[i] || !f.inplace_target) continue;
                const auto p = values_[*f.inplace_target].producer;
                if (p && needed_[*p]) {
                    needed_[i] = 1;
                    work.push_back(i);
                    changed = true;
                }
            }
        }
    }

    // Users (needed flat nodes) of every canonical activation value.
    std::vector<std::vector<std::size_t>> users() const {
        std::vector<std::vector<std::size_t>> result(values_.size());
        for (std::size_t i = 0; i < flat_.size(); ++i) {
            if (!needed_[i]) continue;
            for (const std::size_t id : flat_[i].inputs) {
                auto& list = result[values_[id].canonical];
                if (list.empty() || list.back() != i) list.push_back(i);
            }
        }
        return result;
    }

    void form_groups() {
        const auto use = users();
        const auto is_output = [&](std::size_t id) {
            return std::find(output_values_.begin(), output_values_.end(), values_[id].canonical) != output_values_.end();
        };
        root_.assign(flat_.size(), 0);
        for (std::size_t i = 0; i < flat_.size(); ++i) {
            const FlatNode& f = flat_[i];
            if (!needed_[i] || f.category != Category::activation) continue;
            bool output = false;
            for (const std::size_t id : f.outputs) output = output || is_output(id);
            switch (f.act) {
                case ActKind::compute: root_[i] = 1; break;
                case ActKind::cheap: root_[i] = output || use[values_[f.outputs[0]].canonical].size() != 1; break;
                case ActKind::view: root_[i] = output; break;
                case ActKind::scalar:
                case ActKind::pack:
                case ActKind::inplace:
                case ActKind::none: break;
            }
        }
        // In-place updates join the op that produced their target.
        owner_.assign(flat_.size(), npos);
        for (std::size_t i = 0; i < flat_.size(); ++i) {
            const FlatNode& f = flat_[i];
            if (!needed_[i] || !f.inplace_target) continue;
            const ValueRec& target = values_[*f.inplace_target];
            if (!target.producer) reject(f.node, "updates a graph input in place; clone it first");
            const std::size_t p = *target.producer;
            const FlatNode& producer = flat_[p];
            if (producer.act == ActKind::view)
                reject(f.node, "updates a view of an activation in place (" + where(producer.node) +
                                   " made the view); capture cannot recompute that — use out-of-place ops");
            if (producer.act == ActKind::cheap) root_[p] = 1;
            if (!root_[p] && !producer.inplace_target)
                reject(f.node, "updates in place a value made by " + where(producer.node) +
                                   ", which capture folds into its consumers; use an out-of-place op");
            for (const std::size_t reader : use[*f.inplace_target]) {
                if (reader <= p || reader >= i || flat_[reader].inplace_target == f.inplace_target) continue;
                const ActKind k = flat_[reader].act;
                if (k == ActKind::view || k == ActKind::pack) continue;
                reject(f.node, "updates in place a value that " + where(flat_[reader].node) +
                                   " read before the update; capture would give it the updated value");
            }
        }
        // Groups: one per root, in-place updates with the root of their target.
        for (std::size_t i = 0; i < flat_.size(); ++i) {
            if (!root_[i]) continue;
            owner_[i] = members_.size();
            members_.push_back({i});
        }
        for (std::size_t i = 0; i < flat_.size(); ++i) {
            const FlatNode& f = flat_[i];
            if (!needed_[i] || !f.inplace_target) continue;
            std::size_t p = *values_[*f.inplace_target].producer;
            while (owner_[p] == npos && flat_[p].inplace_target) p = *values_[*flat_[p].inplace_target].producer;
            owner_[i] = owner_[p];
            members_[owner_[i]].push_back(i);
        }
        // Closures; a cheap node that two groups would fold becomes a root of its own.
        for (;;) {
            closures_.assign(members_.size(), {});
            externals_.assign(members_.size(), {});
            std::vector<std::size_t> folded_by(flat_.size(), npos);
            std::optional<std::size_t> shared_cheap;
            for (std::size_t g = 0; g < members_.size() && !shared_cheap; ++g) {
                std::set<std::size_t> nodes(members_[g].begin(), members_[g].end());
                std::vector<std::size_t> work(members_[g].begin(), members_[g].end());
                std::vector<std::size_t> external;
                while (!work.empty()) {
                    const std::size_t i = work.back();
                    work.pop_back();
                    for (const std::size_t id : flat_[i].inputs) {
                        const ValueRec& v = values_[id];
                        if (v.category == Category::constant) continue;
                        if (v.input) {
                            if (std::find(external.begin(), external.end(), id) == external.end()) external.push_back(id);
                            continue;
                        }
                        const std::size_t p = *v.producer;
                        if (nodes.contains(p)) continue;
                        if (owner_[p] != npos) {
                            const std::size_t c = v.canonical;
                            if (std::find(external.begin(), external.end(), c) == external.end()) external.push_back(c);
                            continue;
                        }
                        if (flat_[p].act == ActKind::cheap) {
                            if (folded_by[p] != npos && folded_by[p] != g) {
                                shared_cheap = p;
                                break;
                            }
                            folded_by[p] = g;
                        }
                        nodes.insert(p);
                        work.push_back(p);
                    }
                }
                closures_[g].assign(nodes.begin(), nodes.end());
                externals_[g] = std::move(external);
            }
            if (!shared_cheap) break;
            root_[*shared_cheap] = 1;
            owner_[*shared_cheap] = members_.size();
            members_.push_back({*shared_cheap});
        }
    }

    void order_groups() {
        const std::size_t n = members_.size();
        // Which group produces each canonical activation.
        std::vector<std::size_t> producer_group(values_.size(), npos);
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t i : members_[g])
                for (const std::size_t id : flat_[i].outputs) producer_group[values_[id].canonical] = g;
        std::vector<std::vector<std::size_t>> successors(n);
        std::vector<std::size_t> missing(n, 0);
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t id : externals_[g]) {
                if (values_[id].input) continue;
                const std::size_t p = producer_group[id];
                if (p == npos || p == g) reject(flat_[members_[g][0]].node, "reads a value capture cannot attribute");
                successors[p].push_back(g);
                ++missing[g];
            }
        std::vector<std::size_t> position(n);
        for (std::size_t g = 0; g < n; ++g) position[g] = members_[g][0];
        std::vector<std::size_t> ready, order;
        for (std::size_t g = 0; g < n; ++g)
            if (missing[g] == 0) ready.push_back(g);
        while (!ready.empty()) {
            const auto best = std::min_element(ready.begin(), ready.end(),
                                               [&](std::size_t a, std::size_t b) { return position[a] < position[b]; });
            const std::size_t g = *best;
            ready.erase(best);
            order.push_back(g);
            for (const std::size_t s : successors[g])
                if (--missing[s] == 0) ready.push_back(s);
        }
        if (order.size() != n)
            throw InvalidInput(who_ + ": the ops read each other's results in a cycle (an in-place update "
                                      "between them); use out-of-place ops");
        // Outputs of each group: what other groups read and what the module returns.
        std::vector<std::vector<std::size_t>> outputs(n);
        const auto add_output = [&](std::size_t id) {
            const std::size_t p = producer_group[id];
            if (p != npos && std::find(outputs[p].begin(), outputs[p].end(), id) == outputs[p].end())
                outputs[p].push_back(id);
        };
        for (std::size_t g = 0; g < n; ++g)
            for (const std::size_t id : externals_[g])
                if (!values_[id].input) add_output(id);
        for (const std::size_t id : output_values_) add_output(id);

        for (std::size_t rank = 0; rank < n; ++rank) {
            const std::size_t g = order[rank];
            Group group;
            const FlatNode& root = flat_[members_[g][0]];
            group.name = short_kind(root.node) + "." + std::to_string(rank);
            group.where = where(root.node);
            group.inputs = externals_[g];
            group.outputs = outputs[g];
            // Dead ops (a random op whose result nothing uses) still run: they draw numbers.
            if (group.outputs.empty())
                for (const std::size_t id : root.outputs)
                    if (values_[id].value.isTensor()) {
                        group.outputs.push_back(values_[id].canonical);
                        break;
                    }
            if (group.outputs.empty()) reject(root.node, "produces no tensor; capture cannot make it an op");
            for (const std::size_t id : group.outputs)
                if (!values_[id].value.isTensor())
                    reject(flat_[*values_[id].producer].node,
                           "returns a list or tuple of new tensors that other ops read as a whole; capture needs "
                           "tensors between ops");
            compile(group, closures_[g]);
            core_->groups.push_back(std::move(group));
        }
    }

    // The group's program: its nodes in order, arguments resolved to frozen values or slots.
    void compile(Group& group, const std::vector<std::size_t>& nodes) {
        std::unordered_map<std::size_t, std::size_t> slot;  // value id → slot
        const auto new_slot = [&group]() { return group.slots++; };
        for (const std::size_t id : group.inputs) {
            const std::size_t s = new_slot();
            slot[id] = s;
            group.input_slots.push_back(s);
        }
        std::set<std::size_t> parameters;
        std::unordered_set<const void*> frozen_storages;
        for (const std::size_t i : nodes) {
            const FlatNode& f = flat_[i];
            Instr instr;
            instr.kind = f.kind;
            instr.operation = f.operation;
            instr.element_type = f.element_type;
            instr.node = f.node;
            for (const std::size_t id : f.inputs) {
                const ValueRec& v = values_[id];
                if (v.category == Category::constant) {
                    instr.args.push_back(Arg{true, id});
                    if (v.value.isTensor()) {
                        const at::Tensor& t = v.value.toTensor();
                        if (const auto it = parameter_index_.find(t.unsafeGetTensorImpl()); it != parameter_index_.end())
                            parameters.insert(it->second);
                        if (const void* s = storage_of(t)) frozen_storages.insert(s);
                    }
                    continue;
                }
                auto found = slot.find(id);
                if (found == slot.end()) found = slot.find(v.canonical);
                if (found == slot.end())
                    reject(f.node, "reads a value that capture did not place (internal error in capture)");
                instr.args.push_back(Arg{false, found->second});
            }
            for (const std::size_t id : f.outputs) {
                const std::size_t s = new_slot();
                slot[id] = s;
                instr.outs.push_back(s);
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
        group.output_requires_grad.assign(group.outputs.size(), 0);
        for (const std::size_t p : parameters) {
            group.parameters.push_back(p);
            group.trainable.push_back(core_->parameters[p]);
        }
        group.frozen_storages.assign(frozen_storages.begin(), frozen_storages.end());
    }

    // ---------------------------------------------------------------- profiling

    [[nodiscard]] std::vector<at::Tensor> inputs_of(const Group& g) const {
        std::vector<at::Tensor> result;
        for (const std::size_t id : g.inputs) result.push_back(values_[id].value.toTensor());
        return result;
    }

    [[nodiscard]] bool rushed() const {
        return options_.time_limit_seconds && seconds_since(start_) > *options_.time_limit_seconds;
    }

    void profile_forward() {
        start_ = Clock::now();
        const c10::Device dev = device();
        const OpClock clock(dev);
        if (dev.type() != probe_.device_type())
            throw InvalidInput(who_ + ": the inputs are on " + dev.str() + " but the memory probe ('" +
                               std::string(probe_.name()) + "') measures " + c10::DeviceTypeName(probe_.device_type()) +
                               " memory; use a probe for the model's device");
        requires_grad_.assign(values_.size(), 0);
        for (std::size_t i = 0; i < input_ids_.size(); ++i) {
            const at::Tensor& t = values_[input_ids_[i]].value.toTensor();
            requires_grad_[input_ids_[i]] = sample_[i].requires_grad() && t.is_floating_point();
        }
        core_->info.assign(core_->groups.size(), CapturedOp{});
        for (std::size_t k = 0; k < core_->groups.size(); ++k) {
            Group& g = core_->groups[k];
            CapturedOp& info = core_->info[k];
            const std::vector<at::Tensor> inputs = inputs_of(g);
            for (std::size_t i = 0; i < g.inputs.size(); ++i)
                g.input_differentiable[i] = requires_grad_[g.inputs[i]] && inputs[i].is_floating_point();
            check_outputs(g, inputs);

            // Without autograd: bytes, overhead, randomness, buffers it updates.
            std::vector<at::Tensor> before;
            {
                const at::NoGradGuard no_grad;
                for (const at::Tensor& b : buffers_) before.push_back(b.detach().clone());
            }
            const RngState rng = RngState::capture(device());
            probe_.reset_peak();
            Bytes c0 = probe_.current();
            std::vector<at::Tensor> outs = run_guarded(g, [&] { return run_no_grad(*core_, g, inputs); });
            info.output_bytes = distinct_bytes(outs);
            info.forward_overhead = std::max<Bytes>(probe_.peak() - c0 - info.output_bytes, 0);
            g.random = !(RngState::capture(device()) == rng);
            {
                const at::NoGradGuard no_grad;
                for (std::size_t b = 0; b < buffers_.size(); ++b)
                    if (!at::equal(buffers_[b], before[b])) {
                        g.buffers.push_back(buffers_[b]);
                        buffers_[b].variable_data().copy_(before[b]);
                    }
            }
            outs.clear();

            // With autograd: saved state, overhead, which outputs need gradients.
            c0 = probe_.current();
            probe_.reset_peak();
            {
                GroupGraph graph = run_guarded(g, [&] { return run_with_grad(*core_, g, inputs); });
                const Bytes c1 = probe_.current();
                info.forward_grad_overhead = std::max<Bytes>(probe_.peak() - c1, 0);
                std::vector<at::Tensor> kept;
                for (std::size_t o = 0; o < graph.outputs.size(); ++o) {
                    const bool rg = graph.outputs[o].requires_grad();
                    g.output_requires_grad[o] = rg;
                    requires_grad_[g.outputs[o]] = rg;
                    g.has_backward = g.has_backward || rg;
                    kept.push_back(graph.outputs[o].detach());
                }
                graph.clear();
                info.saved_bytes = std::max<Bytes>(c1 - probe_.current(), 0);
            }
            restore_buffers();

            // Time of the forward without autograd.
            const bool hurry = rushed();
            std::vector<double> times;
            for (std::size_t r = 0; r < (hurry ? 1 : options_.warmup + options_.repeats); ++r) {
                synchronize(dev);
                const double t0 = clock.now();
                {
                    const std::vector<at::Tensor> o = run_no_grad(*core_, g, inputs);
                    synchronize(dev);
                }
                if (hurry || r >= options_.warmup) times.push_back(clock.now() - t0);
            }
            restore_buffers();
            info.forward_time = median(times);
        }
    }

    // Profiling runs a group several times; its buffer updates must not accumulate.
    void restore_buffers() { start_buffers_.restore(buffers_); }

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

    // Outputs must own their memory: one that shares storage with an input, a parameter, a
    // buffer, a frozen tensor or another output is copied (freeing it would free the other).
    void check_outputs(Group& g, const std::vector<at::Tensor>& inputs) {
        std::vector<at::Tensor> outs = run_guarded(g, [&] { return run_no_grad(*core_, g, inputs); });
        std::unordered_set<const void*> taken(module_storages_.begin(), module_storages_.end());
        for (const at::Tensor& t : inputs) taken.insert(storage_of(t));
        for (const void* s : g.frozen_storages) taken.insert(s);
        for (std::size_t o = 0; o < outs.size(); ++o) {
            if (!outs[o].defined() || !outs[o].has_storage())
                throw InvalidInput(who_ + ": op '" + g.name + "' (root " + g.where +
                                   ") returns a tensor without storage; capture needs dense tensors");
            if (!taken.insert(storage_of(outs[o])).second) g.clone_output[o] = 1;
        }
        start_buffers_.restore(buffers_);
    }

    // Incoming gradients for a backward: one random contribution per consumer whose backward
    // gives one, and one from the loss for returned outputs.
    std::vector<std::vector<at::Tensor>> incoming_for(const Group& g, const std::vector<at::Tensor>& outs) const {
        std::vector<std::vector<at::Tensor>> incoming(g.outputs.size());
        const at::NoGradGuard no_grad;
        for (std::size_t o = 0; o < g.outputs.size(); ++o) {
            if (!g.output_requires_grad[o]) continue;
            const std::size_t n = contributions_.contains(g.outputs[o]) ? contributions_.at(g.outputs[o]).size() : 0;
            for (std::size_t c = 0; c < n; ++c) incoming[o].push_back(at::randn_like(outs[o]));
        }
        return incoming;
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
        if (!t.is_floating_point() || !t.has_storage()) return true;
        const at::NoGradGuard no_grad;
        const c10::Storage storage = t.storage();
        const std::int64_t n = static_cast<std::int64_t>(storage.nbytes() / t.element_size());
        at::Tensor raw = at::empty({0}, t.options().requires_grad(false));
        raw.set_(storage, 0, {n}, {1});
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

    void profile_backward() {
        const c10::Device dev = device();
        const OpClock clock(dev);
        for (std::size_t o = 0; o < output_values_.size(); ++o) {
            if (!requires_grad_[output_values_[o]]) continue;
            contributions_[output_values_[o]].push_back(npos);  // the loss
        }
        reads_.assign(core_->groups.size(), {});
        for (std::size_t k = core_->groups.size(); k-- > 0;) {
            Group& g = core_->groups[k];
            CapturedOp& info = core_->info[k];
            if (!g.has_backward) continue;
            const std::vector<at::Tensor> inputs = inputs_of(g);

            // What the backward reads, and which inputs it gives a gradient.
            {
                GroupGraph graph = run_guarded(g, [&] { return run_with_grad(*core_, g, inputs); });
                const auto incoming = incoming_for(g, graph.outputs);
                const BackwardResult reference = run_backward(g, graph, incoming, /*retain_graph=*/true);
                for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                    if (reference.input_grads[i].defined()) contributions_[g.inputs[i]].push_back(k);
                    if (values_[g.inputs[i]].input) {
                        // Initial data are always live: what matters is only whether it is read.
                        if (backward_reads(g, graph, incoming, reference, graph.leaves[i]))
                            reads_[k].push_back(g.inputs[i]);
                        continue;
                    }
                    if (backward_reads(g, graph, incoming, reference, graph.leaves[i])) reads_[k].push_back(g.inputs[i]);
                }
                for (std::size_t o = 0; o < g.outputs.size(); ++o)
                    if (backward_reads(g, graph, incoming, reference, graph.outputs[o])) reads_[k].push_back(g.outputs[o]);
            }
            restore_buffers();

            // Bytes and overhead of the backward.
            {
                GroupGraph graph = run_with_grad(*core_, g, inputs);
                const auto incoming = incoming_for(g, graph.outputs);
                const Bytes c0 = probe_.current();
                probe_.reset_peak();
                BackwardResult r = run_backward(g, graph, incoming);
                const Bytes written = distinct_bytes(r.input_grads);
                info.backward_overhead = std::max<Bytes>(probe_.peak() - c0 - written, 0);
                for (std::size_t i = 0; i < g.inputs.size(); ++i)
                    if (r.input_grads[i].defined()) grad_bytes_[{k, i}] = storage_bytes(r.input_grads[i]);
            }
            restore_buffers();

            // Times of the forward with autograd and of the backward.
            const bool hurry = rushed();
            std::vector<double> forward_times, backward_times;
            for (std::size_t r = 0; r < (hurry ? 1 : options_.warmup + options_.repeats); ++r) {
                synchronize(dev);
                double t0 = clock.now();
                GroupGraph graph = run_with_grad(*core_, g, inputs);
                synchronize(dev);
                const double forward_seconds = clock.now() - t0;
                const auto incoming = incoming_for(g, graph.outputs);
                synchronize(dev);
                t0 = clock.now();
                {
                    const BackwardResult result = run_backward(g, graph, incoming);
                    synchronize(dev);
                }
                if (hurry || r >= options_.warmup) {
                    forward_times.push_back(forward_seconds);
                    backward_times.push_back(clock.now() - t0);
                }
            }
            restore_buffers();
            info.forward_grad_time = median(forward_times);
            info.backward_time = median(backward_times);
        }
        for (std::size_t k = 0; k < core_->groups.size(); ++k) {
            Group& g = core_->groups[k];
            CapturedOp& info = core_->info[k];
            if (!g.has_backward) info.forward_grad_time = info.forward_time;
            info.name = g.name;
            info.source = g.where;
            info.random = g.random;
            info.mutates_buffers = !g.buffers.empty();
            info.has_backward = g.has_backward;
            for (const Instr& instr : g.program) info.nodes.push_back(instr.node->kind().toQualString());
            std::ostringstream line;
            line << "capture op " << g.name << " (" << info.nodes.size() << " nodes): fwd "
                 << info.forward_time * 1e3 << " ms, fwd+ " << info.forward_grad_time * 1e3 << " ms, bwd "
                 << info.backward_time * 1e3 << " ms, out " << format_bytes(info.output_bytes) << ", saved "
                 << format_bytes(info.saved_bytes) << (g.random ? ", random" : "")
                 << (g.buffers.empty() ? "" : ", updates buffers");
            if (options_.progress)
                options_.progress(line.str());
            else if (options_.verbose)
                std::cerr << line.str() << '\n';
        }
    }

    // ---------------------------------------------------------------- the problem

    std::string data_name(std::size_t id) const {
        const auto it = data_names_.find(id);
        return it == data_names_.end() ? values_[id].name : it->second;
    }

    void build_problem() {
        Core& core = *core_;
        ProblemBuilder b(core.name);
        std::unordered_map<std::size_t, DataId> activation;  // canonical value → data
        std::vector<DataEntry> data_entries;
        std::vector<Bytes> data_bytes;
        std::vector<OpEntry> op_entries;
        const auto add_data = [&](const std::string& name, Bytes bytes, DataEntry entry) {
            const DataId id = b.add_data(name, bytes);
            data_entries.push_back(entry);
            data_bytes.push_back(bytes);
            return id;
        };
        const auto add_op = [&](OpSpec spec, OpEntry entry) {
            const OpId id = b.add_op(std::move(spec));
            op_entries.push_back(entry);
            return id;
        };
        // Graph inputs.
        for (std::size_t i = 0; i < input_ids_.size(); ++i) {
            InputInfo& in = core.inputs[i];
            const DataId d = add_data("in:" + in.name, storage_bytes(values_[input_ids_[i]].value.toTensor()),
                                      DataEntry{DataRole::activation, 0, true, i});
            in.data = d;
            b.add_initial(d);
            activation[input_ids_[i]] = d;
            data_names_[input_ids_[i]] = "in:" + in.name;
        }
        // Activations and saved state, group by group.
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            Group& g = core.groups[k];
            const std::vector<at::Tensor> outs = [&] {
                std::vector<at::Tensor> r;
                for (const std::size_t id : g.outputs) r.push_back(values_[id].value.toTensor());
                return r;
            }();
            for (std::size_t o = 0; o < g.outputs.size(); ++o) {
                const std::string name = g.outputs.size() == 1 ? g.name : g.name + ":" + std::to_string(o);
                // Bytes of the output as the group's run makes it (a copy when it had to be cloned).
                Bytes bytes = storage_bytes(outs[o]);
                if (g.clone_output[o]) bytes = static_cast<Bytes>(outs[o].numel()) * static_cast<Bytes>(outs[o].element_size());
                const DataId d = add_data(name, bytes, DataEntry{DataRole::activation, k, false, o});
                g.output_data.push_back(d);
                activation[g.outputs[o]] = d;
                data_names_[g.outputs[o]] = name;
            }
            if (g.has_backward) g.saved = add_data("s:" + g.name, core.info[k].saved_bytes, DataEntry{DataRole::saved, k, false, 0});
        }
        // Gradient contributions: g:X<G for every input X that G's backward differentiates.
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            Group& g = core.groups[k];
            g.input_data.clear();
            for (const std::size_t id : g.inputs) g.input_data.push_back(activation.at(id));
            g.input_grad.assign(g.inputs.size(), std::nullopt);
            if (!g.has_backward) continue;
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                const auto found = grad_bytes_.find({k, i});
                if (found == grad_bytes_.end()) continue;
                g.input_grad[i] = add_data("g:" + data_name(g.inputs[i]) + "<" + g.name, found->second,
                                           DataEntry{DataRole::gradient, k, false, i});
            }
            bool writes = false;
            for (const auto& d : g.input_grad) writes = writes || d.has_value();
            if (!writes) g.marker = add_data("done:" + g.name, 0, DataEntry{DataRole::marker, k, false, 0});
        }
        // Loss contributions.
        core.output_data.clear();
        core.output_grad.assign(output_values_.size(), std::nullopt);
        for (std::size_t o = 0; o < output_values_.size(); ++o) {
            const std::size_t id = output_values_[o];
            core.output_data.push_back(activation.at(id));
            if (requires_grad_[id])
                core.output_grad[o] = add_data("g:" + data_name(id) + "<loss", data_bytes[activation.at(id).index],
                                               DataEntry{DataRole::gradient, npos, false, o});
        }
        bool any_grad = false;
        for (const auto& d : core.output_grad) any_grad = any_grad || d.has_value();
        if (!any_grad)
            throw InvalidInput(who_ + ": no output of forward requires a gradient (no parameter or input that requires "
                                      "grad reaches it); there is nothing to train");
        // Incoming contributions per output.
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            Group& g = core.groups[k];
            g.incoming.assign(g.outputs.size(), {});
        }
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            const Group& g = core.groups[k];
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                if (!g.input_grad[i]) continue;
                const std::size_t id = g.inputs[i];
                if (values_[id].input) {
                    core.inputs[*values_[id].input].grads.push_back(*g.input_grad[i]);
                    continue;
                }
                for (Group& p : core.groups)
                    for (std::size_t o = 0; o < p.outputs.size(); ++o)
                        if (p.outputs[o] == id) p.incoming[o].push_back(*g.input_grad[i]);
            }
        }
        for (std::size_t o = 0; o < output_values_.size(); ++o) {
            if (!core.output_grad[o]) continue;
            for (Group& p : core.groups)
                for (std::size_t j = 0; j < p.outputs.size(); ++j)
                    if (p.outputs[j] == output_values_[o]) p.incoming[j].push_back(*core.output_grad[o]);
        }
        // Ops.
        std::vector<OpId> forward_order, backward_order;
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            Group& g = core.groups[k];
            const CapturedOp& info = core.info[k];
            OpSpec f{"F:" + g.name, info.forward_time, info.forward_overhead, g.input_data, g.output_data, false};
            g.fwd = add_op(f, OpEntry{OpRole::forward, k});
            if (!g.has_backward) {
                forward_order.push_back(*g.fwd);
                continue;
            }
            std::vector<DataId> writes = g.output_data;
            writes.push_back(*g.saved);
            g.fwd_grad = add_op(OpSpec{"F+:" + g.name, info.forward_grad_time, info.forward_grad_overhead, g.input_data,
                                       writes, false},
                                OpEntry{OpRole::forward_grad, k});
            forward_order.push_back(*g.fwd_grad);
        }
        std::vector<DataId> loss_reads = core.output_data;
        std::vector<DataId> loss_writes;
        for (const auto& d : core.output_grad)
            if (d) loss_writes.push_back(*d);
        core.loss = add_op(OpSpec{"loss", 0.0, 0, loss_reads, loss_writes, true}, OpEntry{OpRole::loss, npos});
        for (std::size_t k = core.groups.size(); k-- > 0;) {
            Group& g = core.groups[k];
            CapturedOp& info = core.info[k];
            if (!g.has_backward) continue;
            std::vector<DataId> reads;
            for (const auto& list : g.incoming) reads.insert(reads.end(), list.begin(), list.end());
            reads.push_back(*g.saved);
            for (const std::size_t id : reads_[k]) {
                const DataId d = activation.at(id);
                if (std::find(reads.begin(), reads.end(), d) == reads.end()) reads.push_back(d);
                info.backward_reads.push_back(data_name(id));
            }
            std::vector<DataId> writes;
            for (const auto& d : g.input_grad)
                if (d) writes.push_back(*d);
            if (g.marker) writes.push_back(*g.marker);
            g.bwd = add_op(OpSpec{"B:" + g.name, info.backward_time, info.backward_overhead, reads, writes, true},
                           OpEntry{OpRole::backward, k});
            backward_order.push_back(*g.bwd);
        }
        b.set_loss(core.loss);
        for (const InputInfo& in : core.inputs)
            for (const DataId d : in.grads) b.add_final(d);
        std::vector<OpId> order = forward_order;
        order.push_back(core.loss);
        order.insert(order.end(), backward_order.begin(), backward_order.end());
        b.set_autograd_order(std::move(order));
        for (std::size_t k = 0; k < core.groups.size(); ++k) {
            const Group& g = core.groups[k];
            CapturedOp& info = core.info[k];
            for (const std::size_t id : g.inputs) info.inputs.push_back(data_name(id));
            for (const std::size_t id : g.outputs) info.outputs.push_back(data_name(id));
        }
        core.problem = b.build();
        core.ops = std::move(op_entries);
        core.data = std::move(data_entries);
    }

    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

    CaptureOptions options_;
    Probe probe_;
    std::vector<at::Tensor> sample_;
    std::shared_ptr<Core> core_;
    std::string who_;
    std::vector<ValueRec> values_;
    std::unordered_map<const jit::Value*, std::size_t> ids_;
    std::vector<FlatNode> flat_;
    std::vector<std::size_t> input_ids_;
    std::vector<std::size_t> return_ids_;
    std::vector<std::size_t> output_values_;
    std::vector<char> needed_;
    std::vector<char> root_;
    std::vector<std::size_t> owner_;
    std::vector<std::vector<std::size_t>> members_;
    std::vector<std::vector<std::size_t>> closures_;
    std::vector<std::vector<std::size_t>> externals_;
    std::vector<at::Tensor> buffers_;
    BufferSnapshot start_buffers_;
    std::unordered_set<const void*> module_storages_;
    std::unordered_map<const c10::TensorImpl*, std::size_t> parameter_index_;
    std::vector<char> requires_grad_;
    std::unordered_map<std::size_t, std::vector<std::size_t>> contributions_;  // value → consumer groups
    std::map<std::pair<std::size_t, std::size_t>, Bytes> grad_bytes_;        // (group, input) → bytes
    std::vector<std::vector<std::size_t>> reads_;                             // per group: values B reads
    std::unordered_map<std::size_t, std::string> data_names_;
    Clock::time_point start_ = Clock::now();
};

}  // namespace detail::script

/// A captured, profiled module: the problem every solver can plan, and the executable table
/// the executor (graph_executor.hpp) runs. Copies share the same capture.
class ScriptCapture {
public:
    explicit ScriptCapture(std::shared_ptr<const detail::script::Core> core) : core_(std::move(core)) {}

    [[nodiscard]] const Problem& problem() const noexcept { return core_->problem; }
    /// One entry per op group, in the problem's forward order.
    [[nodiscard]] const std::vector<CapturedOp>& ops() const noexcept { return core_->info; }
    [[nodiscard]] const ::torch::jit::Module& module() const noexcept { return core_->module; }
    /// The module's trainable parameters, each once, in module order (the order the
    /// executor's gradients use).
    [[nodiscard]] const std::vector<at::Tensor>& parameters() const noexcept { return core_->parameters; }
    [[nodiscard]] std::size_t input_count() const noexcept { return core_->inputs.size(); }
    /// Number of tensors the module returns (the leaves of its output structure).
    [[nodiscard]] std::size_t output_count() const noexcept { return core_->output_data.size(); }
    [[nodiscard]] bool training() const noexcept { return core_->training; }
    [[nodiscard]] double seconds() const noexcept { return core_->seconds; }

    /// Whether `inputs` look like the example inputs (shapes, dtypes, devices): plans are
    /// valid for those only.
    [[nodiscard]] bool matches(const std::vector<at::Tensor>& inputs) const {
        if (inputs.size() != core_->inputs.size()) return false;
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            const auto& in = core_->inputs[i];
            const at::Tensor& t = inputs[i];
            if (!t.defined() || t.sizes().vec() != in.sizes || t.scalar_type() != in.dtype || t.device() != in.device)
                return false;
        }
        return true;
    }

    /// The module's output structure (tuples, lists, constants) with `tensors` (one per
    /// output leaf, as the executor returns them) in place.
    [[nodiscard]] c10::IValue pack_outputs(const std::vector<at::Tensor>& tensors) const {
        if (tensors.size() != core_->output_data.size())
            throw InvalidInput("pack_outputs: " + std::to_string(tensors.size()) + " tensors for " +
                               std::to_string(core_->output_data.size()) + " outputs");
        return pack(core_->output_tree, tensors);
    }

    /// A table of the ops (for `remat-capture --verbose` and logs).
    [[nodiscard]] std::string summary() const {
        std::ostringstream out;
        out << "problem '" << core_->problem.name() << "': " << core_->info.size() << " op groups, "
            << core_->problem.op_count() << " problem ops, " << core_->problem.data_count() << " data; captured in "
            << core_->seconds << " s\n";
        for (const CapturedOp& op : core_->info) {
            out << "  " << op.name << ": " << op.nodes.size() << " nodes, out " << format_bytes(op.output_bytes)
                << ", saved " << format_bytes(op.saved_bytes) << ", fwd " << op.forward_time * 1e3 << " ms, bwd "
                << op.backward_time * 1e3 << " ms";
            if (op.random) out << ", random";
            if (op.mutates_buffers) out << ", updates buffers";
            out << "; backward reads {";
            for (std::size_t i = 0; i < op.backward_reads.size(); ++i) out << (i ? ", " : "") << op.backward_reads[i];
            out << "}\n";
        }
        return out.str();
    }

    [[nodiscard]] const std::shared_ptr<const detail::script::Core>& core() const noexcept { return core_; }

private:
    static c10::IValue pack(const detail::script::OutputNode& node, const std::vector<at::Tensor>& tensors) {
        using Kind = detail::script::OutputNode::Kind;
        switch (node.kind) {
            case Kind::activation: return tensors.at(node.index);
            case Kind::constant: return node.constant;
            case Kind::tuple: {
                std::vector<c10::IValue> items;
                for (const auto& child : node.children) items.push_back(pack(child, tensors));
                return c10::ivalue::Tuple::create(std::move(items));
            }
            case Kind::list: {
                c10::impl::GenericList list(node.element_type);
                for (const auto& child : node.children) list.push_back(pack(child, tensors));
                return c10::IValue(std::move(list));
            }
        }
        return {};
    }

    std::shared_ptr<const detail::script::Core> core_;
};

/// Captures `module` (its forward method) on example `inputs` — tensors, one per forward
/// argument — into an op-level problem, profiled with `probe`. The module's parameters,
/// gradients, buffers and random generators are left as they were. Plans made for the
/// problem are valid for inputs of the same shapes, dtypes and devices, in the same
/// training mode; capture again for others. Throws InvalidInput for what capture cannot
/// plan, naming the node and its source line.
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ScriptCapture capture_script(const ::torch::jit::Module& module, const std::vector<at::Tensor>& inputs,
                                           const CaptureOptions& options = {}, Probe probe = Probe{}) {
    if (options.repeats == 0) throw InvalidInput("capture_script: repeats must be at least 1");
    detail::script::Builder<Probe> builder(module, inputs, options, std::move(probe));
    return ScriptCapture(builder.build());
}

}  // namespace remat::torch
