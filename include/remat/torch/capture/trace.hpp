// remat/torch/capture/trace.hpp — the result of interpreting a module's graph once on its
// example inputs (interpret.hpp): every value it computed, and the flat list of nodes that
// compute tensors, which grouping (group.hpp) turns into the problem's ops.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <torch/csrc/jit/ir/constants.h>

#include "program.hpp"

namespace remat::torch::detail::capture {

/// What a value depends on. Constants (and shapes, flags, strings) are frozen at capture;
/// state (computed from parameters and buffers alone) is recomputed inside every op that
/// reads it, so that gradients reach the parameters; activations flow between ops.
enum class Category : unsigned char { constant, state, activation };

[[nodiscard]] constexpr Category widest(Category a, Category b) noexcept { return a > b ? a : b; }

/// How a node computing an activation is grouped: views, scalars read from tensors and
/// container plumbing fold into their consumer, cheap elementwise ops too when they have a
/// single consumer, every other computation roots an op.
enum class ActKind : unsigned char { none, view, scalar, pack, cheap, compute };

/// A tuple, list or dict whose elements capture tracks one by one (value ids), so that
/// indexing it at capture needs no run-time node.
struct Structure {
    ValueTree::Kind kind = ValueTree::Kind::tuple;  // tuple, list or dict
    c10::TypePtr type;                              // list and dict types
    std::vector<std::size_t> elements;
    std::vector<c10::IValue> keys;  // dict: one per element
};

struct ValueRec {
    Category category = Category::constant;
    c10::IValue value;                    ///< its value in the capture run
    std::optional<std::size_t> producer;  ///< the flat node that computes it
    bool module_tensor = false;           ///< holds parameters or buffers, read by reference
    std::optional<std::size_t> input_leaf;///< a tensor leaf of the module's arguments
    std::string name;
    bool requires_grad = false;           ///< would require grad in a training step
    std::optional<std::string> unreadable;///< a constant capture could not read, and why
    std::shared_ptr<const Structure> structure;
};

struct FlatNode {
    const jit::Node* node = nullptr;
    InstrKind kind = InstrKind::operation;
    mutable std::optional<jit::Operation> operation;
    bool vararg = false;
    c10::TypePtr type;
    std::vector<std::size_t> inputs, outputs;  // value ids
    Category category = Category::constant;
    ActKind act = ActKind::none;
    bool random = false;
    bool side_effect = false;    ///< updates a module buffer in place: runs once per step
    std::string rewritten_from;  ///< the in-place op it replaces out of place ("aten::relu_")
};

/// What interpreting the module's forward found.
struct Trace {
    std::vector<ValueRec> values;
    std::vector<FlatNode> flat;
    std::vector<std::size_t> input_leaves;  ///< value id of each tensor leaf of the arguments
    std::vector<InputInfo> inputs;          ///< one per leaf
    std::vector<ValueTree> input_trees;     ///< one per argument
    std::vector<c10::IValue> arguments;     ///< the example arguments, defaults filled in
    std::size_t result = 0;                 ///< value id of forward's result
    std::vector<at::Tensor> parameters;     ///< trainable, each once, in module order
    std::vector<std::string> parameter_names;
    std::unordered_map<const c10::TensorImpl*, std::size_t> parameter_index;
    std::vector<at::Tensor> buffers;
    std::unordered_set<const void*> module_storages;
};

/// Every tensor inside a value (through tuples, lists and dicts).
inline void tensors_in(const c10::IValue& v, std::vector<at::Tensor>& out) {
    if (v.isTensor()) {
        out.push_back(v.toTensor());
    } else if (v.isList()) {
        for (const c10::IValue& item : v.toListRef()) tensors_in(item, out);
    } else if (v.isTuple()) {
        for (const c10::IValue& item : v.toTupleRef().elements()) tensors_in(item, out);
    } else if (v.isGenericDict()) {
        for (const auto& entry : v.toGenericDict()) tensors_in(entry.value(), out);
    }
}

[[nodiscard]] inline bool holds_tensors(const c10::IValue& v) {
    std::vector<at::Tensor> found;
    tensors_in(v, found);
    return !found.empty();
}

[[nodiscard]] inline std::string short_kind(const jit::Node* node) {
    const std::string full = node->kind().toQualString();
    const auto colon = full.rfind("::");
    return colon == std::string::npos ? full : full.substr(colon + 2);
}

template <std::size_t N>
[[nodiscard]] bool one_of(std::string_view kind, const std::string_view (&kinds)[N]) {
    for (const std::string_view k : kinds)
        if (k == kind) return true;
    return false;
}

/// Ops whose result depends only on their inputs' metadata (shapes, types, whether an
/// optional is None): frozen at capture like shape arithmetic, even on activations.
[[nodiscard]] inline bool is_metadata_op(std::string_view kind) {
    static constexpr std::string_view kinds[] = {
        "aten::size",     "aten::dim",      "aten::numel",   "aten::len",        "prim::dtype",
        "prim::device",   "prim::layout",   "prim::is_cuda", "aten::is_floating_point",
        "aten::is_complex", "aten::stride", "aten::__is__",  "aten::__isnot__",  "prim::isinstance",
        "prim::is_sparse", "prim::is_quantized", "prim::is_mkldnn", "prim::is_meta", "prim::is_xpu",
        "aten::get_device", "prim::is_nested", "prim::is_vulkan", "prim::is_ipu",
        "prim::is_mps", "prim::is_ort", "prim::is_hpu", "prim::is_lazy", "aten::is_leaf",
        "aten::sym_size", "aten::sym_numel", "aten::sym_stride", "aten::sym_storage_offset"};
    return one_of(kind, kinds);
}

/// Ops that make a new tensor like another one (its shape, dtype or device) without reading
/// its values: constants, even when that tensor is an activation.
[[nodiscard]] inline bool is_creation_from_metadata(std::string_view kind) {
    static constexpr std::string_view kinds[] = {"aten::new_zeros", "aten::new_ones",  "aten::new_full",
                                                 "aten::new_empty", "aten::new_empty_strided",
                                                 "aten::zeros_like", "aten::ones_like", "aten::full_like",
                                                 "aten::empty_like"};
    return one_of(kind, kinds);
}

/// Elementwise ops cheap enough to recompute inside their single consumer.
[[nodiscard]] inline bool is_cheap_op(std::string_view kind) {
    static constexpr std::string_view kinds[] = {"aten::mul",   "aten::div",     "aten::add",  "aten::sub",
                                                 "aten::rsub",  "aten::neg",     "aten::masked_fill",
                                                 "aten::to",    "aten::type_as", "aten::contiguous",
                                                 "aten::clone", "aten::eq",      "aten::ne",   "aten::fill",
                                                 "aten::zero",  "aten::copy"};
    return one_of(kind, kinds);
}

/// Dropout is elementwise and cheap: folded into its single consumer like the ops above, it
/// makes that op random (replayed on recomputation) and its mask part of that op's saved state.
[[nodiscard]] inline bool is_dropout(std::string_view kind) {
    return kind == "aten::dropout" || kind == "aten::feature_dropout" || kind == "aten::alpha_dropout" ||
           kind == "aten::feature_alpha_dropout";
}

[[nodiscard]] inline bool is_random_node(const jit::Node* node) {
    if (node->isNondeterministic()) return true;
    // Attention draws a dropout mask when its dropout_p is not zero.
    static constexpr std::string_view attention[] = {"aten::scaled_dot_product_attention",
                                                     "aten::_scaled_dot_product_efficient_attention",
                                                     "aten::_scaled_dot_product_flash_attention",
                                                     "aten::_scaled_dot_product_flash_attention_for_cpu"};
    if (one_of(node->kind().toQualString(), attention)) {
        const c10::FunctionSchema* schema = node->maybeSchema();
        if (schema == nullptr) return true;
        const auto index = schema->argumentIndexWithName("dropout_p");
        if (!index || static_cast<std::size_t>(*index) >= node->inputs().size()) return true;
        const auto p = ::torch::jit::toIValue(node->inputs()[*index]);
        return !p || !p->isDouble() || p->toDouble() != 0.0;
    }
    static constexpr std::string_view kinds[] = {
        "aten::dropout",   "aten::dropout_",     "aten::feature_dropout", "aten::alpha_dropout", "aten::bernoulli",
        "aten::bernoulli_", "aten::rand",        "aten::rand_like",       "aten::randn",         "aten::randn_like",
        "aten::randint",   "aten::randint_like", "aten::randperm",        "aten::normal",        "aten::normal_",
        "aten::uniform_",  "aten::exponential_", "aten::multinomial",     "aten::rrelu",         "aten::poisson",
        "aten::native_dropout", "aten::feature_dropout_", "aten::alpha_dropout_", "aten::feature_alpha_dropout",
        "aten::feature_alpha_dropout_", "aten::rrelu_", "aten::random_", "aten::cauchy_", "aten::log_normal_",
        "aten::geometric_"};
    return one_of(node->kind().toQualString(), kinds);
}

}  // namespace remat::torch::detail::capture
