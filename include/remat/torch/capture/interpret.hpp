// remat/torch/capture/interpret.hpp — phase 1 of capture: run a module's forward graph once,
// node by node, on the example inputs, and record what every node computed (trace.hpp).
//
// docs/design.md §5 (capture). The graph is copied and inlined; capture then plans one fixed graph for
// the inputs' shapes, as tracing does, so everything that is not tensor work is evaluated
// here, once, and frozen:
//   - constants of every kind, shape arithmetic, string formatting, `prim::If` whose
//     condition depends only on shapes, flags or constants (the branch taken is walked, the
//     other dropped with the exceptions it would raise), loops with a trip count known at
//     capture (unrolled);
//   - tuples, lists and dicts are tracked element by element, so that indexing, unpacking,
//     `append`, item assignment and dict results cost no run-time node;
//   - in-place ops on activations (`relu_`, `add_`, `div_`, `copy_` into a fresh tensor, …)
//     become their out-of-place equivalents, or run on a copy where none has the same
//     arguments (`normal_`) or where it draws other numbers (`dropout_`, on CUDA); later
//     readers see the new value, and a rewrite whose old value is read later through another
//     name (a view) is refused;
//   - in-place updates of module buffers (batch norm's `num_batches_tracked`) are side
//     effects that the executor runs on the first forward of their op in a step only.
// What cannot be kept — control flow on tensor values, updates of parameters or graph
// inputs — throws remat::InvalidInput naming the node and its source line.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "../../core/errors.hpp"
#include "options.hpp"
#include "trace.hpp"

namespace remat::torch::detail::capture {

class Interpreter {
public:
    Interpreter(const jit::Module& module, std::shared_ptr<jit::Graph> graph, const std::vector<c10::IValue>& sample,
                const CaptureOptions& options, std::string who)
        : module_(module), graph_(std::move(graph)), sample_(sample), options_(options), who_(std::move(who)) {}

    /// Interprets the whole forward graph. The module's buffers are changed by the run
    /// (batch norm): the caller restores them.
    [[nodiscard]] Trace run() {
        collect_module_tensors();
        bind_arguments();
        walk(graph_->block());
        if (graph_->outputs().size() != 1)
            throw InvalidInput(who_ + ": forward returns " + std::to_string(graph_->outputs().size()) +
                               " values; expected one");
        trace_.result = id_of(graph_->outputs()[0], graph_->return_node());
        track_result(trace_.result);
        check_rewrites();
        return std::move(trace_);
    }

private:
    [[noreturn]] void reject(const jit::Node* node, const std::string& what) const {
        throw InvalidInput(who_ + ": node " + where(node) + " " + what);
    }

    // ---------------------------------------------------------------- values

    std::size_t add_value(std::string name, Category category, c10::IValue value) {
        ValueRec rec;
        rec.category = category;
        rec.value = std::move(value);
        rec.name = std::move(name);
        trace_.values.push_back(std::move(rec));
        return trace_.values.size() - 1;
    }
    std::size_t add_value(const jit::Value* v, Category category, c10::IValue value) {
        const std::size_t id = add_value(v->debugName(), category, std::move(value));
        ids_[v] = id;
        return id;
    }
    [[nodiscard]] ValueRec& value(std::size_t id) { return trace_.values[id]; }
    [[nodiscard]] const ValueRec& value(std::size_t id) const { return trace_.values[id]; }

    std::size_t id_of(const jit::Value* v, const jit::Node* user) const {
        const auto it = ids_.find(v);
        if (it == ids_.end()) reject(user, "reads a value that capture never computed (internal error in capture)");
        return it->second;
    }

    // A tensor value would require grad in a training step when anything it is computed
    // from does and it is floating point or complex.
    [[nodiscard]] static bool differentiable_tensor(const c10::IValue& v) {
        return v.isTensor() && v.toTensor().defined() && differentiable_type(v.toTensor());
    }

    // ---------------------------------------------------------------- module and arguments

    void collect_module_tensors() {
        for (const auto& named : module_.named_parameters(true)) {
            const at::Tensor& p = named.value;
            trace_.module_storages.insert(storage_of(p));
            // A tensor under two names (tied weights) is one parameter: it gets the sum of the
            // gradients of every op that reads it, under its first name.
            if (!p.requires_grad() || trace_.parameter_index.contains(p.unsafeGetTensorImpl())) continue;
            trace_.parameter_index.emplace(p.unsafeGetTensorImpl(), trace_.parameters.size());
            trace_.parameters.push_back(p);
            trace_.parameter_names.push_back(named.name);
        }
        for (const at::Tensor& b : module_.buffers(true)) {
            trace_.module_storages.insert(storage_of(b));
            if (b.defined()) trace_.buffers.push_back(b);
        }
    }

    void bind_arguments() {
        const auto inputs = graph_->inputs();
        if (inputs.empty()) throw InvalidInput(who_ + ": the forward graph has no self input");
        add_value(inputs[0], Category::constant, c10::IValue(module_._ivalue()));
        trace_.arguments = with_defaults(inputs.size() - 1);
        const std::vector<c10::IValue>& arguments = trace_.arguments;
        for (std::size_t i = 1; i < inputs.size(); ++i) {
            ValueTree tree;
            const std::size_t id = bind_argument(arguments[i - 1], inputs[i]->debugName(), tree);
            ids_[inputs[i]] = id;
            trace_.input_trees.push_back(std::move(tree));
        }
    }

    // The example arguments, followed by the defaults of forward's arguments that they leave
    // out (nn.MultiheadAttention's key_padding_mask=None, need_weights=True, ...).
    [[nodiscard]] std::vector<c10::IValue> with_defaults(std::size_t parameters) const {
        std::vector<c10::IValue> arguments = sample_;
        if (arguments.size() > parameters)
            throw InvalidInput(who_ + ": forward takes " + std::to_string(parameters) + " arguments but " +
                               std::to_string(arguments.size()) + " example arguments were given");
        if (arguments.size() == parameters) return arguments;
        const c10::FunctionSchema& schema = module_.get_method("forward").function().getSchema();
        for (std::size_t i = arguments.size(); i < parameters; ++i) {
            const c10::Argument& argument = schema.arguments().at(i + 1);  // after self
            if (!argument.default_value())
                throw InvalidInput(who_ + ": forward takes " + std::to_string(parameters) + " arguments but " +
                                   std::to_string(sample_.size()) + " example arguments were given, and '" +
                                   argument.name() + "' has no default value");
            arguments.push_back(*argument.default_value());
        }
        return arguments;
    }

    // One argument (or an element of one): tensors become input leaves, containers holding
    // tensors are tracked element by element, everything else is a constant.
    std::size_t bind_argument(const c10::IValue& sample, const std::string& name, ValueTree& tree) {
        if (sample.isTensor()) return bind_input_tensor(sample.toTensor(), name, tree);
        if (!holds_tensors(sample) || !(sample.isTuple() || sample.isList() || sample.isGenericDict())) {
            tree.kind = ValueTree::Kind::constant;
            tree.constant = sample;
            return add_value(name, Category::constant, sample);
        }
        Structure s;
        std::vector<std::pair<c10::IValue, c10::IValue>> items;
        if (sample.isTuple()) {
            s.kind = ValueTree::Kind::tuple;
            for (const c10::IValue& e : sample.toTupleRef().elements()) items.emplace_back(c10::IValue(), e);
        } else if (sample.isList()) {
            s.kind = ValueTree::Kind::list;
            s.type = c10::ListType::create(sample.toList().elementType());
            for (const c10::IValue& e : sample.toListRef()) items.emplace_back(c10::IValue(), e);
        } else {
            s.kind = ValueTree::Kind::dict;
            const auto dict = sample.toGenericDict();
            s.type = c10::DictType::create(dict.keyType(), dict.valueType());
            for (const auto& entry : dict) items.emplace_back(entry.key(), entry.value());
        }
        tree.kind = s.kind;
        tree.type = s.type;
        for (std::size_t k = 0; k < items.size(); ++k) {
            ValueTree child;
            const std::string child_name =
                s.kind == ValueTree::Kind::dict ? name + "[" + key_text(items[k].first) + "]" : name + "." + std::to_string(k);
            s.elements.push_back(bind_argument(items[k].second, child_name, child));
            if (s.kind == ValueTree::Kind::dict) {
                s.keys.push_back(items[k].first);
                tree.keys.push_back(items[k].first);
            }
            tree.children.push_back(std::move(child));
        }
        return make_structure(std::move(s), name, graph_->param_node());
    }

    std::size_t bind_input_tensor(const at::Tensor& t, const std::string& name, ValueTree& tree) {
        const std::string which = "example input '" + name + "'";
        if (!t.defined()) throw InvalidInput(who_ + ": " + which + " is undefined");
        if (!t.has_storage()) throw InvalidInput(who_ + ": " + which + " is not a dense tensor");
        const std::size_t id = add_value(name, Category::activation, c10::IValue(t.detach()));
        value(id).input_leaf = trace_.input_leaves.size();
        value(id).requires_grad = t.requires_grad() && differentiable_type(t);
        InputInfo info;
        info.name = name;
        info.sizes = t.sizes().vec();
        info.dtype = t.scalar_type();
        info.device = t.device();
        info.requires_grad = t.requires_grad();
        trace_.inputs.push_back(std::move(info));
        tree.kind = ValueTree::Kind::leaf;
        tree.leaf = trace_.input_leaves.size();
        trace_.input_leaves.push_back(id);
        return id;
    }

    [[nodiscard]] static std::string key_text(const c10::IValue& key) {
        if (key.isString()) return "'" + key.toStringRef() + "'";
        if (key.isInt()) return std::to_string(key.toInt());
        return key.tagKind();
    }

    // ---------------------------------------------------------------- structures

    // A value for structure `s`: a constant when every element is one, else a value whose
    // producer is a construct node over the elements (for consumers that read it whole).
    std::size_t make_structure(Structure s, const std::string& name, const jit::Node* node) {
        Category category = Category::constant;
        bool requires_grad = false, module_tensor = false;
        for (const std::size_t e : s.elements) {
            category = widest(category, value(e).category);
            requires_grad = requires_grad || value(e).requires_grad;
            module_tensor = module_tensor || value(e).module_tensor;
        }
        const std::size_t id = add_value(name, category, build_container(s));
        value(id).requires_grad = requires_grad;
        value(id).module_tensor = module_tensor && category == Category::constant;
        if (category != Category::constant) {
            FlatNode f;
            f.node = node;
            f.kind = s.kind == ValueTree::Kind::tuple  ? InstrKind::tuple_construct
                     : s.kind == ValueTree::Kind::list ? InstrKind::list_construct
                                                       : InstrKind::dict_construct;
            f.type = s.type;
            for (std::size_t k = 0; k < s.elements.size(); ++k) {
                if (s.kind == ValueTree::Kind::dict)
                    f.inputs.push_back(add_value("key", Category::constant, s.keys[k]));
                f.inputs.push_back(s.elements[k]);
            }
            f.outputs = {id};
            f.category = category;
            f.act = ActKind::pack;
            value(id).producer = trace_.flat.size();
            trace_.flat.push_back(std::move(f));
        }
        value(id).structure = std::make_shared<const Structure>(std::move(s));
        return id;
    }

    [[nodiscard]] c10::IValue build_container(const Structure& s) const {
        switch (s.kind) {
            case ValueTree::Kind::tuple: {
                std::vector<c10::IValue> items;
                for (const std::size_t e : s.elements) items.push_back(value(e).value);
                return c10::ivalue::Tuple::create(std::move(items));
            }
            case ValueTree::Kind::list: {
                c10::impl::GenericList list(s.type->castRaw<c10::ListType>()->getElementType());
                for (const std::size_t e : s.elements) list.push_back(value(e).value);
                return c10::IValue(std::move(list));
            }
            default: {
                const auto* type = s.type->castRaw<c10::DictType>();
                c10::impl::GenericDict dict(type->getKeyType(), type->getValueType());
                for (std::size_t k = 0; k < s.elements.size(); ++k) dict.insert_or_assign(s.keys[k], value(s.elements[k]).value);
                return c10::IValue(std::move(dict));
            }
        }
    }

    // The elements of a container value, tracked from now on: the elements of a constant
    // become constants, those of a container an op computed come from an unpack node.
    // nullptr when the value is not a tuple, list or dict.
    const Structure* structure_of(std::size_t id, const jit::Node* user) {
        if (value(id).structure) return value(id).structure.get();
        const c10::IValue v = value(id).value;
        if (!(v.isTuple() || v.isList() || v.isGenericDict())) return nullptr;
        Structure s;
        std::vector<c10::IValue> items;
        if (v.isTuple()) {
            s.kind = ValueTree::Kind::tuple;
            for (const c10::IValue& e : v.toTupleRef().elements()) items.push_back(e);
        } else if (v.isList()) {
            s.kind = ValueTree::Kind::list;
            s.type = c10::ListType::create(v.toList().elementType());
            for (const c10::IValue& e : v.toListRef()) items.push_back(e);
        } else {
            s.kind = ValueTree::Kind::dict;
            const auto dict = v.toGenericDict();
            s.type = c10::DictType::create(dict.keyType(), dict.valueType());
            for (const auto& entry : dict) {
                s.keys.push_back(entry.key());
                items.push_back(entry.value());
            }
        }
        const ValueRec& container = value(id);
        const Category category = container.category;
        if (category != Category::constant && s.kind == ValueTree::Kind::dict)
            reject(user, "reads a dict that an op computed; capture tracks dicts built in the model");
        const std::string base = container.name;
        const bool module_tensor = container.module_tensor, requires_grad = container.requires_grad;
        for (std::size_t k = 0; k < items.size(); ++k) {
            const std::size_t e = add_value(base + "." + std::to_string(k), category, items[k]);
            value(e).module_tensor = module_tensor && holds_tensors(items[k]);
            value(e).requires_grad = requires_grad && differentiable_tensor(items[k]);
            s.elements.push_back(e);
        }
        if (category != Category::constant) {
            FlatNode f;
            f.node = user;
            f.kind = s.kind == ValueTree::Kind::tuple ? InstrKind::tuple_unpack : InstrKind::list_unpack;
            f.inputs = {id};
            f.outputs = s.elements;
            f.category = category;
            f.act = ActKind::pack;
            for (const std::size_t e : s.elements) value(e).producer = trace_.flat.size();
            trace_.flat.push_back(std::move(f));
        }
        value(id).structure = std::make_shared<const Structure>(std::move(s));
        return value(id).structure.get();
    }

    // A container an op computed, read whole by another op: rebuilt from its elements, so that
    // only tensors cross the boundaries between ops.
    std::size_t materialized(std::size_t id, const jit::Node* user) {
        const ValueRec& v = value(id);
        if (v.category == Category::constant || v.value.isTensor() || !v.producer) return id;
        if (trace_.flat[*v.producer].kind != InstrKind::operation) return id;
        if (!(v.value.isTuple() || v.value.isList())) return id;
        if (const auto it = materialized_.find(id); it != materialized_.end()) return it->second;
        const Structure* s = structure_of(id, user);
        const std::size_t rebuilt = make_structure(*s, value(id).name, user);
        materialized_[id] = rebuilt;
        return rebuilt;
    }

    // ---------------------------------------------------------------- walking the graph

    void walk(const jit::Block* block) {
        for (const jit::Node* node : block->nodes()) visit(node);
    }

    void visit(const jit::Node* node) {
        const std::string kind = node->kind().toQualString();
        if (kind == "prim::Constant") return visit_constant(node);
        if (kind == "prim::GetAttr") return visit_get_attr(node);
        if (kind == "prim::If") return visit_if(node);
        if (kind == "prim::Loop") return visit_loop(node);
        if (kind == "prim::RaiseException")
            reject(node, "raises an exception for these example inputs (the model refuses them when run as is)");
        if (kind == "prim::Uninitialized") {
            add_value(node->output(), Category::constant, c10::IValue());
            return;
        }
        if (kind == "prim::SetAttr") reject(node, "assigns a module attribute; a captured forward must not");
        if (kind == "aten::warn" || kind == "prim::Print") return;  // no effect on the step
        if (kind == "prim::unchecked_cast") {
            ids_[node->output()] = id_of(node->input(), node);
            return;
        }
        if (kind == "prim::TupleConstruct" || kind == "prim::ListConstruct" || kind == "prim::DictConstruct")
            return visit_construct(node);
        if (select(node)) return;
        if (mutate_container(node)) return;
        generic(node);
    }

    void visit_constant(const jit::Node* node) {
        if (const auto v = jit::toIValue(node->output())) {
            add_value(node->output(), Category::constant, *v);
            return;
        }
        // Function constants and the like stay in inlined graphs, unused: refused only if read.
        const std::size_t id = add_value(node->output(), Category::constant, c10::IValue());
        value(id).unreadable = "a constant of type " + node->output()->type()->repr_str() + " that capture cannot read";
    }

    void visit_get_attr(const jit::Node* node) {
        const ValueRec& owner = value(id_of(node->input(), node));
        if (owner.category != Category::constant || !owner.value.isObject())
            reject(node, "reads an attribute of something that is not a module");
        c10::IValue attribute = owner.value.toObject()->getAttr(node->s(jit::attr::name));
        const bool tensors = holds_tensors(attribute);
        bool requires_grad = false;
        if (attribute.isTensor()) requires_grad = attribute.toTensor().requires_grad();
        const std::size_t id = add_value(node->output(), Category::constant, std::move(attribute));
        value(id).module_tensor = tensors;
        value(id).requires_grad = requires_grad;
    }

    void visit_if(const jit::Node* node) {
        const ValueRec& condition = value(checked_id(node->input(0), node));
        if (condition.category != Category::constant || !condition.value.isBool())
            reject(node, "is control flow that depends on tensor values; capture plans one fixed graph — "
                         "compute both branches with torch.where, or move the decision out of the model");
        const jit::Block* branch = node->blocks()[condition.value.toBool() ? 0 : 1];
        walk(branch);
        for (std::size_t k = 0; k < node->outputs().size(); ++k)
            ids_[node->outputs()[k]] = id_of(branch->outputs()[k], node);
    }

    // Loops run at capture as often as they would on the example inputs: their trip count
    // and their condition must be known without tensor values.
    void visit_loop(const jit::Node* node) {
        const ValueRec& trips = value(checked_id(node->input(0), node));
        const ValueRec& start = value(checked_id(node->input(1), node));
        if (trips.category != Category::constant || start.category != Category::constant || !trips.value.isInt() ||
            !start.value.isBool())
            reject(node, "is a loop whose trip count depends on tensor values; capture plans one fixed graph — "
                         "make the count depend on shapes or constants, or trace the model");
        const std::int64_t max_trips = trips.value.toInt();
        bool go_on = start.value.toBool();
        std::vector<std::size_t> carried;
        for (std::size_t k = 2; k < node->inputs().size(); ++k) carried.push_back(id_of(node->input(k), node));
        const jit::Block* body = node->blocks()[0];
        for (std::int64_t i = 0; go_on && i < max_trips; ++i) {
            if (++loop_iterations_ > options_.max_loop_iterations)
                reject(node, "unrolls into more than " + std::to_string(options_.max_loop_iterations) +
                                 " iterations (CaptureOptions::max_loop_iterations); capture plans every iteration");
            add_value(body->inputs()[0], Category::constant, c10::IValue(i));
            for (std::size_t k = 0; k < carried.size(); ++k) ids_[body->inputs()[k + 1]] = carried[k];
            walk(body);
            const ValueRec& condition = value(id_of(body->outputs()[0], node));
            if (condition.category != Category::constant || !condition.value.isBool())
                reject(node, "is a loop whose continuation depends on tensor values; capture plans one fixed graph");
            go_on = condition.value.toBool();
            for (std::size_t k = 0; k < carried.size(); ++k) carried[k] = id_of(body->outputs()[k + 1], node);
        }
        for (std::size_t k = 0; k < node->outputs().size(); ++k) ids_[node->outputs()[k]] = carried[k];
    }

    void visit_construct(const jit::Node* node) {
        const std::string kind = node->kind().toQualString();
        Structure s;
        const auto inputs = node->inputs();
        if (kind == "prim::TupleConstruct") {
            s.kind = ValueTree::Kind::tuple;
            for (const jit::Value* v : inputs) s.elements.push_back(checked_id(v, node));
        } else if (kind == "prim::ListConstruct") {
            s.kind = ValueTree::Kind::list;
            s.type = node->output()->type();
            if (!s.type->castRaw<c10::ListType>()) reject(node, "builds a list of unknown type");
            for (const jit::Value* v : inputs) s.elements.push_back(checked_id(v, node));
        } else {
            s.kind = ValueTree::Kind::dict;
            s.type = node->output()->type();
            if (!s.type->castRaw<c10::DictType>()) reject(node, "builds a dict of unknown type");
            for (std::size_t k = 0; k + 1 < inputs.size(); k += 2) {
                const ValueRec& key = value(checked_id(inputs[k], node));
                if (key.category != Category::constant) reject(node, "builds a dict whose keys depend on tensor values");
                insert_or_assign(s, key.value, checked_id(inputs[k + 1], node));
            }
        }
        ids_[node->output()] = make_structure(std::move(s), node->output()->debugName(), node);
    }

    static void insert_or_assign(Structure& s, const c10::IValue& key, std::size_t element) {
        for (std::size_t k = 0; k < s.keys.size(); ++k)
            if (s.keys[k] == key) {
                s.elements[k] = element;
                return;
            }
        s.keys.push_back(key);
        s.elements.push_back(element);
    }

    std::size_t checked_id(const jit::Value* v, const jit::Node* user) const {
        const std::size_t id = id_of(v, user);
        if (value(id).unreadable) reject(user, "reads " + *value(id).unreadable);
        return id;
    }

    // Unpacking and indexing with indices known at capture: the result is the element itself.
    bool select(const jit::Node* node) {
        const std::string kind = node->kind().toQualString();
        const bool unpack = kind == "prim::TupleUnpack" || kind == "prim::ListUnpack";
        const bool index = kind == "prim::TupleIndex" || kind == "aten::__getitem__" || kind == "prim::ListIndex";
        const bool length = kind == "aten::len";
        const bool copy = kind == "aten::list" || kind == "aten::copy" || kind == "aten::dict";
        if (!unpack && !index && !length && !copy) return false;
        if (node->inputs().empty()) return false;
        const std::size_t container = checked_id(node->input(0), node);
        if (copy && (node->inputs().size() != 1 || value(container).value.isTensor())) return false;
        if (index && node->inputs().size() != 2) return false;
        const bool constant = value(container).category == Category::constant && !value(container).structure;
        if (constant && !unpack && !(index && kind == "prim::TupleIndex")) return false;  // evaluated as usual
        const Structure* s = structure_of(container, node);
        if (s == nullptr) return false;
        if (length) {
            add_value(node->output(), Category::constant, c10::IValue(static_cast<std::int64_t>(s->elements.size())));
            return true;
        }
        if (copy) {
            ids_[node->output()] = make_structure(*s, node->output()->debugName(), node);
            return true;
        }
        if (unpack) {
            if (s->elements.size() != node->outputs().size())
                reject(node, "unpacks " + std::to_string(s->elements.size()) + " values into " +
                                 std::to_string(node->outputs().size()));
            for (std::size_t k = 0; k < s->elements.size(); ++k) ids_[node->outputs()[k]] = s->elements[k];
            return true;
        }
        ids_[node->output()] = element_at(*s, checked_id(node->input(1), node), node);
        return true;
    }

    std::size_t element_at(const Structure& s, std::size_t index_id, const jit::Node* node) const {
        const ValueRec& index = value(index_id);
        if (index.category != Category::constant) reject(node, "indexes a container with a value computed from tensors");
        if (s.kind == ValueTree::Kind::dict) {
            for (std::size_t k = 0; k < s.keys.size(); ++k)
                if (s.keys[k] == index.value) return s.elements[k];
            reject(node, "looks up a key the dict does not hold for these example inputs");
        }
        if (!index.value.isInt()) reject(node, "indexes a list or tuple with something that is not an integer");
        return s.elements[normalized_index(index.value.toInt(), s.elements.size(), node)];
    }

    std::size_t normalized_index(std::int64_t i, std::size_t size, const jit::Node* node) const {
        const auto n = static_cast<std::int64_t>(size);
        if (i < 0) i += n;
        if (i < 0 || i >= n) reject(node, "indexes out of range for these example inputs");
        return static_cast<std::size_t>(i);
    }

    // append, item assignment, insert and extend on a list or dict that holds activations
    // (or receives one): a new tracked value, which the container's name refers to from now on.
    bool mutate_container(const jit::Node* node) {
        const std::string kind = node->kind().toQualString();
        if (node->inputs().empty()) return false;
        const bool list_add = kind == "aten::add_" && node->input(0)->type()->castRaw<c10::ListType>() != nullptr;
        if (kind != "aten::append" && kind != "aten::_set_item" && kind != "aten::insert" && kind != "aten::extend" &&
            !list_add)
            return false;
        const c10::TypePtr type = node->input(0)->type();
        if (!type->castRaw<c10::ListType>() && !type->castRaw<c10::DictType>()) return false;
        bool all_constant = true;
        for (const jit::Value* v : node->inputs()) all_constant = all_constant && value(checked_id(v, node)).category == Category::constant;
        const std::size_t container = checked_id(node->input(0), node);
        if (all_constant && !value(container).structure) return false;  // evaluated on a copy (generic)
        Structure s = *structure_of(container, node);
        if (kind == "aten::append") {
            s.elements.push_back(checked_id(node->input(1), node));
        } else if (kind == "aten::extend" || list_add) {
            const Structure* other = structure_of(checked_id(node->input(1), node), node);
            if (other == nullptr) reject(node, "extends a list with something capture cannot track");
            s.elements.insert(s.elements.end(), other->elements.begin(), other->elements.end());
        } else if (kind == "aten::insert") {
            const ValueRec& index = value(checked_id(node->input(1), node));
            if (index.category != Category::constant) reject(node, "inserts at a position computed from tensors");
            const auto n = static_cast<std::int64_t>(s.elements.size());
            std::int64_t i = index.value.toInt();
            i = i < 0 ? std::max<std::int64_t>(0, i + n) : std::min(i, n);
            s.elements.insert(s.elements.begin() + i, checked_id(node->input(2), node));
        } else if (s.kind == ValueTree::Kind::dict) {
            const ValueRec& key = value(checked_id(node->input(1), node));
            if (key.category != Category::constant) reject(node, "assigns a dict item under a key computed from tensors");
            insert_or_assign(s, key.value, checked_id(node->input(2), node));
        } else {
            const ValueRec& index = value(checked_id(node->input(1), node));
            if (index.category != Category::constant) reject(node, "assigns a list item at a position computed from tensors");
            s.elements[normalized_index(index.value.toInt(), s.elements.size(), node)] = checked_id(node->input(2), node);
        }
        const std::size_t updated = make_structure(std::move(s), node->input(0)->debugName(), node);
        ids_[node->input(0)] = updated;
        for (const jit::Value* out : node->outputs()) ids_[out] = updated;
        return true;
    }

    // ---------------------------------------------------------------- nodes that compute

    void generic(const jit::Node* node) {
        FlatNode f;
        f.node = node;
        f.kind = InstrKind::operation;
        if (node->maybeOperator() == nullptr)
            reject(node, "is a node kind capture cannot run (no operator is registered for it)");
        try {
            f.operation.emplace(node->getOperation());
        } catch (const std::exception& e) {
            reject(node, "has no runnable operator: " + error_message(e));
        }
        f.vararg = node->schema().is_vararg();
        for (const jit::Value* v : node->inputs()) f.inputs.push_back(materialized(checked_id(v, node), node));
        f.random = is_random_node(node);
        f.category = category_of(f);

        const std::optional<std::size_t> written = written_argument(node);
        if (written) {
            const ValueRec& target = value(f.inputs[*written]);
            if (target.module_tensor) {
                mark_buffer_update(f, *written);
            } else if (writable_constant(f, target)) {
                // A tensor made inside the forward from constants (a mask: zeros, then slices
                // filled in place) that nothing computed at run time has read yet: the write is
                // plain dataflow, done here once; every later reader sees the new values.
            } else if (target.value.isTensor()) {
                return functionalize(std::move(f), *written);
            } else if (f.category == Category::constant) {
                return update_constant_container(std::move(f), *written);
            } else {
                reject(node, "updates a container of activations in a way capture cannot track "
                             "(it tracks append, item assignment, insert and extend)");
            }
        }
        std::vector<c10::IValue> results = evaluate(f);
        record(std::move(f), std::move(results));
    }

    [[nodiscard]] std::optional<std::size_t> written_argument(const jit::Node* node) const {
        const c10::FunctionSchema* schema = node->maybeSchema();
        if (schema == nullptr) return std::nullopt;
        std::optional<std::size_t> written;
        const auto& arguments = schema->arguments();
        for (std::size_t i = 0; i < arguments.size() && i < node->inputs().size(); ++i) {
            const c10::AliasInfo* alias = arguments[i].alias_info();
            if (alias == nullptr || !alias->isWrite()) continue;
            if (written) reject(node, "updates two of its arguments in place");
            written = i;
        }
        return written;
    }

    // Whether an in-place op on a constant tensor can run on it at capture: the op reads
    // constants only, and no node that runs in the step has read that memory before (it would
    // see the new values).
    [[nodiscard]] bool writable_constant(const FlatNode& f, const ValueRec& target) const {
        if (f.category != Category::constant || target.category != Category::constant || !target.value.isTensor())
            return false;
        const void* storage = storage_of(target.value.toTensor());
        return storage != nullptr && !trace_.module_storages.contains(storage) &&
               !constants_read_in_step_.contains(storage);
    }

    [[nodiscard]] Category category_of(const FlatNode& f) const {
        const std::string kind = f.node->kind().toQualString();
        if (kind == "prim::requires_grad" || kind == "aten::is_grad_enabled" || is_metadata_op(kind))
            return Category::constant;
        // A new tensor shaped like another (x.new_zeros(...), zeros_like(x)) depends on that
        // tensor's metadata only.
        if (is_creation_from_metadata(kind) && !f.random) return Category::constant;
        bool any_activation = false, any_state = false;
        for (const std::size_t id : f.inputs) {
            const ValueRec& v = value(id);
            any_activation = any_activation || v.category == Category::activation;
            any_state = any_state || v.category == Category::state || v.module_tensor;
        }
        if (any_activation || f.random) return Category::activation;
        return any_state ? Category::state : Category::constant;
    }

    // A buffer updated in place (running statistics, counters): a side effect of the step.
    void mark_buffer_update(FlatNode& f, std::size_t written) {
        const ValueRec& target = value(f.inputs[written]);
        std::vector<at::Tensor> tensors;
        tensors_in(target.value, tensors);
        for (const at::Tensor& t : tensors)
            if (trace_.parameter_index.contains(t.unsafeGetTensorImpl()))
                reject(f.node, "updates a trainable parameter in place; capture cannot recompute it "
                               "(update it outside the forward, or use an out-of-place op)");
        if (!target.value.isTensor()) reject(f.node, "updates a container of module tensors in place");
        f.side_effect = true;
        if (f.category == Category::constant) f.category = Category::state;
    }

    // `x.relu_()` on an activation (or on a tensor made at capture, like torch.zeros(...)):
    // run `relu(x)` instead; from now on x names the result.
    void functionalize(FlatNode f, std::size_t written) {
        const jit::Node* node = f.node;
        const std::size_t target = f.inputs[written];
        const ValueRec& old = value(target);
        if (old.input_leaf)
            reject(node, "updates a graph input in place; the input belongs to the caller (clone it first)");
        const std::string kind = node->kind().toQualString();
        const c10::FunctionSchema& schema = node->schema();
        if (schema.name() == "aten::copy_" && schema.arguments().size() == 3) {
            f.operation.emplace(copy_out_of_place());
            f.vararg = false;
        } else if (const std::shared_ptr<jit::Operator> functional =
                       runs_on_a_copy(schema) ? nullptr : out_of_place_operator(schema)) {
            f.operation.emplace(functional->getOperation(node));
            f.vararg = functional->schema().is_vararg();
        } else if (!schema.is_vararg()) {
            f.operation.emplace(on_a_copy(std::move(*f.operation), written, schema.arguments().size()));
            f.vararg = false;
        } else {
            reject(node, "updates a tensor in place and capture knows no out-of-place '" + schema.name() +
                             "' with the same arguments; use an out-of-place op");
        }
        f.rewritten_from = kind;
        f.category = category_of(f);
        std::vector<c10::IValue> results = evaluate(f);
        if (results.size() != 1 || !results[0].isTensor()) reject(node, "has an out-of-place form that returns no tensor");
        const at::Tensor& before = old.value.toTensor();
        const at::Tensor& after = results[0].toTensor();
        if (after.sizes() != before.sizes() || after.scalar_type() != before.scalar_type())
            reject(node, "updates a tensor in place with values of another shape or dtype; write it out of place");
        rewrites_.push_back({trace_.flat.size(), target, storage_of(before), trace_.values.size()});
        const jit::Value* target_name = node->inputs()[written];
        record(std::move(f), std::move(results));
        const std::size_t result = trace_.values.size() - 1;
        // Every name of the updated tensor — what earlier in-place ops on it returned
        // (`g.mul_(0.5).add_(h)` updates g) — names the result from now on.
        auto& names = alias_names_[target_name];
        if (!names) names = std::make_shared<std::vector<const jit::Value*>>(1, target_name);
        for (const jit::Value* out : node->outputs()) {
            names->push_back(out);
            alias_names_[out] = names;
        }
        for (const jit::Value* name : *names) ids_[name] = result;
    }

    // `y.copy_(src)` out of place: src in y's dtype and on y's device, broadcast to y's shape,
    // as a new tensor. Not aten::copy, its functional form: from LibTorch 2.x on it has no
    // derivative formula, and a backward through it raises an error.
    [[nodiscard]] static jit::Operation copy_out_of_place() {
        return jit::Operation([](jit::Stack& stack) {
            const bool non_blocking = jit::pop(stack).toBool();
            const at::Tensor src = jit::pop(stack).toTensor();
            const at::Tensor self = jit::pop(stack).toTensor();
            jit::push(stack, src.to(self.options(), non_blocking).expand_as(self).clone());
        });
    }

    // An in-place op whose out-of-place form draws other numbers: `dropout_`. On CUDA,
    // `dropout` runs a fused kernel that draws another mask from the same generator state, so
    // only the in-place op is eager PyTorch's step (nn.Dropout(inplace=True): MobileNetV3's and
    // EfficientNet's classifiers). The CPU has no such kernel.
    [[nodiscard]] static bool runs_on_a_copy(const c10::FunctionSchema& schema) {
        return schema.name() == "aten::dropout_";
    }

    // The in-place op itself on a copy of the tensor it writes (argument `written` of
    // `arguments`): eager's values and draws, in memory of its own. For the ops above, and for
    // those with no out-of-place form of the same arguments (`normal_`, whose functional form
    // is `normal_functional` in 2.x).
    [[nodiscard]] static jit::Operation on_a_copy(jit::Operation in_place, std::size_t written, std::size_t arguments) {
        return jit::Operation([in_place = std::move(in_place), written, arguments](jit::Stack& stack) mutable {
            c10::IValue& target = stack[stack.size() - arguments + written];
            target = target.toTensor().clone();
            in_place(stack);
        });
    }

    // The operator `aten::foo` for an in-place `aten::foo_`: same arguments, one tensor result.
    [[nodiscard]] static std::shared_ptr<jit::Operator> out_of_place_operator(const c10::FunctionSchema& schema) {
        std::string name = schema.name();
        if (name.empty() || name.back() != '_') return nullptr;
        name.pop_back();
        const auto& arguments = schema.arguments();
        for (const std::shared_ptr<jit::Operator>& op : jit::getAllOperatorsFor(c10::Symbol::fromQualString(name))) {
            const c10::FunctionSchema& candidate = op->schema();
            if (candidate.returns().size() != 1 || candidate.returns()[0].type()->kind() != c10::TypeKind::TensorType)
                continue;
            if (candidate.arguments().size() != arguments.size() || candidate.is_vararg() != schema.is_vararg()) continue;
            bool same = true;
            for (std::size_t i = 0; i < arguments.size() && same; ++i)
                same = candidate.arguments()[i].type()->str() == arguments[i].type()->str() &&
                       candidate.arguments()[i].kwarg_only() == arguments[i].kwarg_only();
            if (same) return op;
        }
        return nullptr;
    }

    // An in-place update of a constant list or dict by constants: run on a copy, so that
    // what read the container before keeps the old contents.
    void update_constant_container(FlatNode f, std::size_t written) {
        const std::size_t target = f.inputs[written];
        const c10::IValue& old = value(target).value;
        c10::IValue copy;
        if (old.isList())
            copy = c10::IValue(old.toList().copy());
        else if (old.isGenericDict())
            copy = c10::IValue(old.toGenericDict().copy());
        else
            reject(f.node, "updates in place a constant capture cannot copy");
        const std::size_t fresh = add_value(value(target).name, Category::constant, copy);
        f.inputs[written] = fresh;
        const jit::Value* target_name = f.node->inputs()[written];
        std::vector<c10::IValue> results = evaluate(f);
        record(std::move(f), std::move(results));
        ids_[target_name] = fresh;
    }

    // Adds the node's results as values and the node to the flat list.
    void record(FlatNode f, std::vector<c10::IValue> results) {
        const jit::Node* node = f.node;
        if (results.size() != node->outputs().size())
            reject(node, "returned " + std::to_string(results.size()) + " values instead of " +
                             std::to_string(node->outputs().size()));
        bool requires_grad = false;
        for (const std::size_t id : f.inputs) requires_grad = requires_grad || value(id).requires_grad;
        const std::string kind = node->kind().toQualString();
        if (kind == "aten::detach" || kind == "aten::detach_") requires_grad = false;
        const std::size_t index = trace_.flat.size();
        for (std::size_t k = 0; k < results.size(); ++k) {
            const std::size_t id = add_value(node->outputs()[k], f.category, std::move(results[k]));
            ValueRec& v = value(id);
            v.producer = index;
            v.requires_grad = requires_grad && (differentiable_tensor(v.value) || v.value.isTuple() || v.value.isList());
            if (f.side_effect) {
                // What an in-place update returns is the buffer itself: read by reference.
                v.category = Category::constant;
                v.module_tensor = true;
                v.producer.reset();
            }
            f.outputs.push_back(id);
        }
        if (f.category == Category::activation && !f.side_effect) f.act = classify(f);
        if (f.category != Category::constant)
            for (const std::size_t id : f.inputs) {
                std::vector<at::Tensor> read;
                if (value(id).category == Category::constant) tensors_in(value(id).value, read);
                for (const at::Tensor& t : read)
                    if (const void* storage = storage_of(t)) constants_read_in_step_.insert(storage);
            }
        trace_.flat.push_back(std::move(f));
    }

    std::vector<c10::IValue> evaluate(const FlatNode& f) {
        const at::NoGradGuard no_grad;
        const jit::Node* node = f.node;
        const std::string kind = node->kind().toQualString();
        // Capture evaluates without autograd, but plans a step that runs with it.
        if (kind == "aten::is_grad_enabled") return {c10::IValue(true)};
        if (kind == "prim::requires_grad") return {c10::IValue(value(f.inputs[0]).requires_grad)};
        try {
            jit::Stack stack;
            for (const std::size_t id : f.inputs) stack.push_back(value(id).value);
            if (f.vararg) stack.emplace_back(static_cast<std::int64_t>(f.inputs.size()));
            (*f.operation)(stack);
            return stack;
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            reject(node, "failed on the example inputs: " + error_message(e));
        }
    }

    [[nodiscard]] ActKind classify(const FlatNode& f) const {
        std::string kind = f.node->kind().toQualString();
        if (!f.rewritten_from.empty()) kind.pop_back();  // classified as its out-of-place form
        if (kind == "aten::__getitem__" || kind == "aten::list" || kind == "prim::ListIndex" ||
            kind == "prim::TupleIndex")
            return ActKind::pack;
        std::vector<at::Tensor> outs;
        bool non_tensor = false;
        for (const std::size_t id : f.outputs) {
            const c10::IValue& v = value(id).value;
            if (v.isTensor() || v.isList() || v.isTuple())
                tensors_in(v, outs);
            else
                non_tensor = true;
        }
        if (outs.empty()) return non_tensor ? ActKind::scalar : ActKind::pack;
        std::unordered_set<const void*> input_storages;
        for (const std::size_t id : f.inputs) {
            std::vector<at::Tensor> ins;
            tensors_in(value(id).value, ins);
            for (const at::Tensor& t : ins)
                if (const void* s = storage_of(t)) input_storages.insert(s);
        }
        bool all_alias = true;
        for (const at::Tensor& t : outs) all_alias = all_alias && input_storages.contains(storage_of(t));
        if (all_alias && f.rewritten_from.empty()) return ActKind::view;
        if (f.random && !is_dropout(kind)) return ActKind::compute;
        if (options_.fold_cheap_ops && (is_cheap_op(kind) || is_dropout(kind)) && f.outputs.size() == 1 &&
            value(f.outputs[0]).value.isTensor())
            return ActKind::cheap;
        return ActKind::compute;
    }

    // ---------------------------------------------------------------- in-place rewrites

    struct Rewrite {
        std::size_t flat;        // the rewritten node
        std::size_t target;      // the value it updated
        const void* storage;     // that value's memory
        std::size_t first_after; // values from this id on were made after the update
    };

    // A rewrite is exact unless the old value is seen later through another name that shares
    // its memory (a view of it, or what it is a view of): PyTorch would show the update there.
    void check_rewrites() const {
        if (rewrites_.empty()) return;
        constexpr std::size_t end_of_step = std::numeric_limits<std::size_t>::max();
        std::vector<std::size_t> last_read(trace_.values.size(), 0);
        for (std::size_t i = 0; i < trace_.flat.size(); ++i) {
            const FlatNode& f = trace_.flat[i];
            if (is_metadata_op(f.node->kind().toQualString())) continue;
            for (const std::size_t id : f.inputs) last_read[id] = std::max(last_read[id], i + 1);
        }
        std::vector<std::size_t> returned;
        leaves_of(trace_.result, returned);
        for (const std::size_t id : returned) last_read[id] = end_of_step;
        for (const Rewrite& r : rewrites_) {
            if (r.storage == nullptr) continue;
            for (std::size_t id = 0; id < r.first_after; ++id) {
                const ValueRec& v = trace_.values[id];
                if (!v.value.isTensor() || storage_of(v.value.toTensor()) != r.storage) continue;
                if (last_read[id] <= r.flat + 1) continue;
                reject(trace_.flat[r.flat].node,
                       "updates in place a tensor whose memory '" + v.name +
                           "' shares (a view), and '" + v.name + "' is read afterwards; capture runs the update out of "
                           "place and would give '" + v.name + "' the old values — write the update out of place");
            }
        }
    }

    // Containers among forward's results are tracked element by element (their leaves are
    // the outputs), also when an op computed them.
    void track_result(std::size_t id) {
        const ValueRec& v = value(id);
        if (v.category == Category::constant || v.value.isTensor()) return;
        const Structure* s = structure_of(id, graph_->return_node());
        if (s == nullptr) return;
        const std::vector<std::size_t> elements = s->elements;
        for (const std::size_t e : elements) track_result(e);
    }

    void leaves_of(std::size_t id, std::vector<std::size_t>& out) const {
        const ValueRec& v = trace_.values[id];
        out.push_back(id);
        if (v.structure)
            for (const std::size_t e : v.structure->elements) leaves_of(e, out);
    }

    jit::Module module_;
    std::shared_ptr<jit::Graph> graph_;
    const std::vector<c10::IValue>& sample_;
    const CaptureOptions& options_;
    std::string who_;
    Trace trace_;
    std::unordered_map<const jit::Value*, std::size_t> ids_;
    std::unordered_map<std::size_t, std::size_t> materialized_;
    std::unordered_map<const jit::Value*, std::shared_ptr<std::vector<const jit::Value*>>> alias_names_;
    std::vector<Rewrite> rewrites_;
    std::unordered_set<const void*> constants_read_in_step_;  // storages of constants run-time nodes read
    std::size_t loop_iterations_ = 0;
};

}  // namespace remat::torch::detail::capture
