// remat/torch/capture/exported_program.hpp — the .pt2 front end: a torch.export program
// (exported_archive.hpp) as the op-level program capture reads, a module whose parameters and
// buffers are the program's and whose forward graph calls the program's ATen operators.
//
// Capture (script.hpp) reads one program model whichever front end made it: a graph of
// dispatcher operators over a module's tensors. A TorchScript module is one already; a
// torch.export program becomes one here, node by node:
//   - `torch.ops.aten.convolution.default` is the dispatcher's `aten::convolution` with the
//     overload named in the target (`default` is the empty overload name); arguments come by
//     their schema names, and those the program omits get the schema's defaults;
//   - parameters and buffers (the graph signature's input specs) are attributes of a module
//     with the program's qualified names, read with prim::GetAttr, so that they keep their
//     identity: the tensors a user's optimizer updates are the ones the program reads, and two
//     names saved from one tensor (tied weights) are one tensor;
//   - user inputs and outputs keep the structure of the program's pytree specs (tuples, lists,
//     dicts), kwargs following the positional arguments in the spec's key order;
//   - symbolic sizes (`aten::sym_size`, `_operator.mul`, …) become the integer operators that
//     capture evaluates on the example inputs' shapes;
//   - buffer mutations that the signature lists as outputs are written back with `copy_`, which
//     capture runs once per step; in-place updates in the graph itself stay as they are.
//   - a `with torch.no_grad():` block (wrap_with_set_grad_enabled) is inlined, its results
//     detached;
// A torch.autocast region (wrap_with_autocast) is refused with the fix: run_decompositions({})
// before saving writes its casts into the graph as aten._to_copy ops.
// What no single graph can hold — control flow (`cond`, `map`, `while_loop`), custom objects,
// effect tokens, joint forward-backward programs, mutations of user inputs — is refused with
// the node and the Python source line that the program's metadata names. The backward is never
// read from the program: autograd records the dispatched forward ops, as for TorchScript.
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "../../core/errors.hpp"
#include "exported_archive.hpp"
#include "program.hpp"

namespace remat::torch::detail::exported {

namespace jit = ::torch::jit;

/// The Python frame a node comes from: the innermost frame outside PyTorch's own modules
/// (torch/nn/...), which is the model's code; the innermost frame when all are PyTorch's.
struct SourceLine {
    std::string file;
    std::size_t line = 0;
    std::string code;
};

[[nodiscard]] inline std::optional<SourceLine> source_line(const Json& node) {
    if (!node.contains("metadata") || !node.at("metadata").contains("stack_trace")) return std::nullopt;
    const std::string trace = node.at("metadata").at("stack_trace").get<std::string>();
    std::optional<SourceLine> innermost, model;
    std::size_t at = 0;
    while ((at = trace.find("File \"", at)) != std::string::npos) {
        SourceLine frame;
        const std::size_t file_end = trace.find('"', at + 6);
        if (file_end == std::string::npos) break;
        frame.file = trace.substr(at + 6, file_end - at - 6);
        const std::size_t line_at = trace.find("line ", file_end);
        if (line_at != std::string::npos) frame.line = std::strtoull(trace.c_str() + line_at + 5, nullptr, 10);
        const std::size_t code_start = trace.find('\n', file_end);
        if (code_start != std::string::npos) {
            const std::size_t code_end = trace.find('\n', code_start + 1);
            std::string code = trace.substr(code_start + 1, code_end == std::string::npos ? std::string::npos
                                                                                           : code_end - code_start - 1);
            const auto first = code.find_first_not_of(' ');
            frame.code = first == std::string::npos ? "" : code.substr(first);
        }
        const bool pytorch = frame.file.find("/torch/") != std::string::npos &&
                             (frame.file.find("site-packages/torch/") != std::string::npos ||
                              frame.file.find("dist-packages/torch/") != std::string::npos);
        if (!pytorch) model = frame;
        innermost = frame;
        at = file_end;
    }
    return model ? model : innermost;
}

// ------------------------------------------------------------------------ pytree specs

/// One node of a pytree spec (torch.utils._pytree's serialized TreeSpec): a leaf, or a
/// tuple, list or dict (keys in `keys`) of children.
struct Spec {
    enum class Kind : unsigned char { leaf, tuple, list, dict } kind = Kind::leaf;
    std::vector<Json> keys;
    std::vector<Spec> children;
    [[nodiscard]] std::size_t leaves() const {
        if (kind == Kind::leaf) return 1;
        std::size_t n = 0;
        for (const Spec& c : children) n += c.leaves();
        return n;
    }
};

[[nodiscard]] inline Spec parse_spec_node(const Json& node, const std::string& what) {
    Spec spec;
    const Json& type = node.at("type");
    if (type.is_null()) return spec;
    const std::string name = type.get<std::string>();
    if (name == "builtins.tuple" || name == "collections.namedtuple" || name.ends_with(".namedtuple")) {
        spec.kind = Spec::Kind::tuple;
    } else if (name == "builtins.list" || name == "torch.fx.immutable_collections.immutable_list") {
        spec.kind = Spec::Kind::list;
    } else if (name == "builtins.dict" || name == "collections.OrderedDict" ||
               name == "torch.fx.immutable_collections.immutable_dict" || name == "collections.defaultdict") {
        spec.kind = Spec::Kind::dict;
        const Json& context = node.at("context");
        const Json keys = context.is_string() ? Json::parse(context.get<std::string>()) : context;
        if (name == "collections.defaultdict")
            throw InvalidInput(what + " holds a defaultdict; use a dict");
        for (const Json& k : keys) spec.keys.push_back(k);
    } else {
        throw InvalidInput(what + " holds a '" + name +
                           "', a structure remat does not read (it reads tensors, numbers, tuples, lists and dicts)");
    }
    for (const Json& child : node.at("children_spec")) spec.children.push_back(parse_spec_node(child, what));
    if (spec.kind == Spec::Kind::dict && spec.keys.size() != spec.children.size())
        throw InvalidInput(what + ": a dict's keys and values disagree in number");
    return spec;
}

[[nodiscard]] inline Spec parse_spec(const Json& text, const std::string& what) {
    const Json spec = text.is_string() ? Json::parse(text.get<std::string>()) : text;
    if (!spec.is_array() || spec.size() != 2) throw InvalidInput(what + " is not a pytree spec");
    return parse_spec_node(spec.at(1), what);
}

// ------------------------------------------------------------------------ the translation

struct TranslateOptions {
    /// Where the program's parameters, buffers and constants go, and its device arguments that
    /// named the device it was exported on; none: where they were saved.
    std::optional<c10::Device> device;
};

class Translator {
public:
    Translator(const Archive& archive, TranslateOptions options)
        : archive_(archive),
          options_(std::move(options)),
          who_("'" + archive.file + "'"),
          unit_(std::make_shared<jit::CompilationUnit>()),
          graph_(std::make_shared<jit::Graph>()) {}

    /// The program as a module: what capture reads (a jit::Module whose forward calls the
    /// program's operators, with the exported training mode in exported_mode_attribute).
    [[nodiscard]] jit::Module run() {
        const Json& gm = archive_.program.at("graph_module");
        const Json& graph = gm.at("graph");
        const Json& signature = gm.at("signature");
        training_ = exported_training(graph);
        root_.emplace(c10::QualifiedName("__torch__.remat.exported.Program"), unit_, /*shouldMangle=*/true);
        root_->register_attribute("training", c10::BoolType::get(), training_);
        self_ = graph_->addInput("self")->setType(root_->type());
        bind_state(signature.at("input_specs"));
        bind_user_inputs(gm, signature.at("input_specs"));
        for (const Json& node : graph.at("nodes")) translate(node);
        bind_outputs(gm, signature.at("output_specs"), graph.at("outputs"));
        root_->register_attribute(exported_mode_attribute, c10::BoolType::get(), training_);
        graph_->lint();
        jit::Function* forward =
            unit_->create_function(c10::QualifiedName(*root_->type()->name(), "forward"), graph_);
        root_->type()->addMethod(forward);
        return *root_;
    }

private:
    // ---------------------------------------------------------------- errors and names

    [[nodiscard]] static std::string node_text(const Json& node) {
        std::string text = "'" + node.value("target", std::string("?")) + "'";
        if (node.contains("name")) text += " (node '" + node.at("name").get<std::string>() + "')";
        if (const auto line = source_line(node)) {
            text += " at line " + std::to_string(line->line) + " of " + line->file;
            if (!line->code.empty()) text += " (`" + line->code + "`)";
        } else {
            text += " (no source location)";
        }
        return text;
    }
    [[noreturn]] void reject(const Json& node, const std::string& what) const {
        throw InvalidInput(who_ + ": node " + node_text(node) + " " + what);
    }

    [[nodiscard]] jit::Value* named(const std::string& name, const Json& node) const {
        const auto it = values_.find(name);
        if (it == values_.end()) reject(node, "reads '" + name + "', which no earlier node or input defines");
        return it->second;
    }
    void define(const std::string& name, jit::Value* v) {
        values_[name] = v;
        if (!name.empty() && name.find_first_not_of("0123456789") != std::string::npos &&
            name.find('.') == std::string::npos)
            v->setDebugName(name);
    }

    // ---------------------------------------------------------------- the training mode

    // The mode the program was exported in: dropout's `train` and batch norm's `training`
    // flags are constants of the graph. Training when the graph has neither.
    [[nodiscard]] static bool exported_training(const Json& graph) {
        for (const Json& node : graph.at("nodes")) {
            const std::string target = node.value("target", std::string());
            const bool dropout = target.find(".dropout.") != std::string::npos ||
                                 target.find("feature_dropout") != std::string::npos ||
                                 target.find("alpha_dropout") != std::string::npos;
            const bool batch_norm = target == "torch.ops.aten.batch_norm.default";
            if (!dropout && !batch_norm) continue;
            for (const Json& input : node.at("inputs")) {
                const std::string name = input.value("name", std::string());
                if ((name == "train" || name == "training") && input.at("arg").contains("as_bool"))
                    return input.at("arg").at("as_bool").get<bool>();
            }
        }
        return true;
    }

    // ---------------------------------------------------------------- parameters and buffers

    [[nodiscard]] at::Tensor placed(const at::Tensor& t) const {
        if (!options_.device || t.device() == *options_.device) return t;
        return t.to(*options_.device);
    }

    // The module at `path` ("encoder.layers.0"), made on first use.
    jit::Module submodule(const std::string& path) {
        if (path.empty()) return *root_;
        if (const auto it = modules_.find(path); it != modules_.end()) return it->second;
        const auto dot = path.rfind('.');
        jit::Module parent = submodule(dot == std::string::npos ? "" : path.substr(0, dot));
        std::string type_name;
        for (const char c : path) type_name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
        jit::Module child(c10::QualifiedName("__torch__.remat.exported." + type_name), unit_, /*shouldMangle=*/true);
        child.register_attribute("training", c10::BoolType::get(), training_);
        parent.register_module(dot == std::string::npos ? path : path.substr(dot + 1), child);
        modules_.emplace(path, child);
        return child;
    }

    // prim::GetAttr from self down to the attribute at `path` ("encoder.layers.0.weight").
    [[nodiscard]] jit::Value* attribute(const std::string& path) {
        if (const auto it = attributes_.find(path); it != attributes_.end()) return it->second;
        const auto dot = path.rfind('.');
        jit::Value* owner = dot == std::string::npos ? self_ : attribute(path.substr(0, dot));
        jit::Value* v = graph_->insertGetAttr(owner, dot == std::string::npos ? path : path.substr(dot + 1));
        attributes_.emplace(path, v);
        return v;
    }

    void register_tensor(const std::string& path, const at::Tensor& tensor, bool parameter) {
        if (registered_.contains(path)) return;
        registered_.insert(path);
        const auto dot = path.rfind('.');
        jit::Module owner = submodule(dot == std::string::npos ? "" : path.substr(0, dot));
        const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
        if (parameter)
            owner.register_parameter(name, tensor, /*is_buffer=*/false);
        else
            owner.register_buffer(name, tensor);
    }

    // The tensor saved under `name`, the same tensor object for names saved from one tensor.
    [[nodiscard]] at::Tensor state_tensor(const std::string& name, bool parameter, const std::string& what) {
        const auto& source = archive_.weights.contains(name) ? archive_.weights : archive_.constants;
        const auto it = source.find(name);
        if (it == source.end()) throw InvalidInput(who_ + ": " + what + " '" + name + "' has no saved tensor");
        const void* key = it->second.unsafeGetTensorImpl();
        if (const auto done = placed_.find(key); done != placed_.end()) return done->second;
        at::Tensor t = placed(it->second);
        if (parameter) t.requires_grad_(true);
        placed_.emplace(key, t);
        return t;
    }

    // Parameters and buffers become the module's attributes, in the signature's order; every
    // saved parameter is one, used by the graph or not (a tied name the graph does not read
    // still names the tensor).
    void bind_state(const Json& input_specs) {
        for (const Json& spec : input_specs) {
            if (spec.contains("parameter")) {
                const Json& p = spec.at("parameter");
                const std::string name = p.at("parameter_name").get<std::string>();
                register_tensor(name, state_tensor(name, true, "parameter"), true);
                define(p.at("arg").at("name").get<std::string>(), attribute(name));
            } else if (spec.contains("buffer")) {
                const Json& b = spec.at("buffer");
                const std::string name = b.at("buffer_name").get<std::string>();
                register_tensor(name, state_tensor(name, false, "buffer"), false);
                jit::Value* buffer = attribute(name);
                buffers_.insert(buffer);
                define(b.at("arg").at("name").get<std::string>(), buffer);
            } else if (spec.contains("tensor_constant")) {
                const Json& c = spec.at("tensor_constant");
                const std::string name = c.at("tensor_constant_name").get<std::string>();
                define(c.at("arg").at("name").get<std::string>(),
                       graph_->insertConstant(state_tensor(name, false, "tensor constant")));
            } else if (spec.contains("custom_obj")) {
                throw InvalidInput(who_ + ": the program reads a custom object ('" +
                                   spec.at("custom_obj").at("custom_obj_name").get<std::string>() +
                                   "'); remat captures tensor programs only");
            } else if (spec.contains("token")) {
                throw InvalidInput(who_ + ": the program threads effect tokens (ops with side effects); remat "
                                          "captures programs without them");
            }
        }
        for (const auto& [name, is_parameter] : archive_.weight_is_parameter)
            if (is_parameter && !registered_.contains(name))
                register_tensor(name, state_tensor(name, true, "parameter"), true);
    }

    // ---------------------------------------------------------------- user inputs

    struct Leaf {
        std::optional<std::string> tensor;  // the placeholder's name
        c10::IValue constant;
    };

    [[nodiscard]] static c10::IValue constant_leaf(const Json& arg, const std::string& what) {
        if (arg.contains("as_none")) return c10::IValue();
        if (arg.contains("as_int")) return arg.at("as_int").get<std::int64_t>();
        if (arg.contains("as_float")) return number(arg.at("as_float"));
        if (arg.contains("as_bool")) return arg.at("as_bool").get<bool>();
        if (arg.contains("as_string")) return arg.at("as_string").get<std::string>();
        throw InvalidInput(what + " is an input of a kind remat does not read: " + arg.dump());
    }

    [[nodiscard]] static double number(const Json& v) {
        if (v.is_string()) {
            const std::string s = v.get<std::string>();
            if (s == "Infinity") return std::numeric_limits<double>::infinity();
            if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
            if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
            throw InvalidInput("'" + s + "' is not a number");
        }
        return v.get<double>();
    }

    [[nodiscard]] static const Json& call_signature(const Json& gm, const std::string& who) {
        for (const Json& entry : gm.at("module_call_graph"))
            if (entry.value("fqn", std::string("?")).empty() && entry.contains("signature") &&
                !entry.at("signature").is_null())
                return entry.at("signature");
        throw InvalidInput(who + ": the program has no call signature for its root module (module_call_graph)");
    }

    void bind_user_inputs(const Json& gm, const Json& input_specs) {
        std::vector<Leaf> leaves;
        for (const Json& spec : input_specs) {
            if (spec.contains("user_input")) {
                const Json& arg = spec.at("user_input").at("arg");
                Leaf leaf;
                if (arg.contains("as_tensor"))
                    leaf.tensor = arg.at("as_tensor").at("name").get<std::string>();
                else
                    leaf.constant = constant_leaf(arg, who_ + ": a user input");
                leaves.push_back(std::move(leaf));
            } else if (spec.contains("constant_input")) {
                const Json& c = spec.at("constant_input");
                define(c.at("name").get<std::string>(),
                       graph_->insertConstant(constant_leaf(c.at("value"), who_ + ": constant input")));
            }
        }
        const Json& call = call_signature(gm, who_);
        const Spec in = parse_spec(call.at("in_spec"), who_ + ": the input structure");
        if (in.kind != Spec::Kind::tuple || in.children.size() != 2)
            throw InvalidInput(who_ + ": the input structure is not (args, kwargs)");
        if (in.leaves() != leaves.size())
            throw InvalidInput(who_ + ": the input structure has " + std::to_string(in.leaves()) + " leaves but the " +
                               "signature " + std::to_string(leaves.size()) + " user inputs");
        std::vector<std::string> names;
        if (call.contains("forward_arg_names"))
            for (const Json& n : call.at("forward_arg_names")) names.push_back(n.get<std::string>());
        std::size_t next_leaf = 0, argument = 0;
        const auto bind = [&](const Spec& spec, std::string name) {
            if (name.empty() || name == "self") name = "input_" + std::to_string(argument);
            ++argument;
            jit::Value* input = graph_->addInput(name);
            input->setType(type_of(spec, leaves, next_leaf));
            unpack(spec, input, leaves, next_leaf);
        };
        for (const Spec& arg : in.children[0].children) bind(arg, argument < names.size() ? names[argument] : "");
        for (std::size_t k = 0; k < in.children[1].children.size(); ++k) {
            const Json& key = in.children[1].keys[k];
            bind(in.children[1].children[k], key.is_string() ? key.get<std::string>() : "");
        }
    }

    [[nodiscard]] c10::TypePtr type_of(const Spec& spec, const std::vector<Leaf>& leaves, std::size_t first) const {
        switch (spec.kind) {
            case Spec::Kind::leaf: {
                const Leaf& leaf = leaves.at(first);
                if (leaf.tensor) return c10::TensorType::get();
                return leaf.constant.isNone() ? c10::TypePtr(c10::NoneType::get()) : leaf.constant.type();
            }
            case Spec::Kind::tuple: {
                std::vector<c10::TypePtr> types;
                for (const Spec& c : spec.children) {
                    types.push_back(type_of(c, leaves, first));
                    first += c.leaves();
                }
                return c10::TupleType::create(types);
            }
            case Spec::Kind::list:
            case Spec::Kind::dict: {
                c10::TypePtr element;
                for (const Spec& c : spec.children) {
                    c10::TypePtr t = type_of(c, leaves, first);
                    first += c.leaves();
                    if (element && *element != *t)
                        throw InvalidInput(who_ + ": an input list or dict mixes element types (" + element->str() +
                                           ", " + t->str() + "); use a tuple");
                    element = t;
                }
                if (!element) element = c10::TensorType::get();
                if (spec.kind == Spec::Kind::list) return c10::ListType::create(element);
                const bool string_keys = spec.keys.empty() || spec.keys.front().is_string();
                return c10::DictType::create(string_keys ? c10::TypePtr(c10::StringType::get()) : c10::IntType::get(),
                                             element);
            }
        }
        return c10::TensorType::get();
    }

    // Binds the placeholders inside an input value, unpacking its containers in the graph.
    void unpack(const Spec& spec, jit::Value* value, const std::vector<Leaf>& leaves, std::size_t& next_leaf) {
        switch (spec.kind) {
            case Spec::Kind::leaf: {
                const Leaf& leaf = leaves.at(next_leaf++);
                if (leaf.tensor) define(*leaf.tensor, value);
                return;
            }
            case Spec::Kind::tuple:
            case Spec::Kind::list: {
                jit::Node* n = spec.kind == Spec::Kind::tuple
                                   ? graph_->createTupleUnpack(value)
                                   : graph_->createListUnpack(value, spec.children.size());
                graph_->insertNode(n);
                for (std::size_t k = 0; k < spec.children.size(); ++k) unpack(spec.children[k], n->output(k), leaves, next_leaf);
                return;
            }
            case Spec::Kind::dict: {
                const auto* dict = value->type()->castRaw<c10::DictType>();
                for (std::size_t k = 0; k < spec.children.size(); ++k) {
                    const Json& key = spec.keys[k];
                    jit::Value* key_value = key.is_string() ? graph_->insertConstant(key.get<std::string>())
                                                            : graph_->insertConstant(key.get<std::int64_t>());
                    jit::Node* get = graph_->create(c10::Symbol::fromQualString("aten::__getitem__"), {value, key_value});
                    get->output()->setType(dict->getValueType());
                    graph_->insertNode(get);
                    unpack(spec.children[k], get->output(), leaves, next_leaf);
                }
                return;
            }
        }
    }

    // ---------------------------------------------------------------- outputs

    void bind_outputs(const Json& gm, const Json& output_specs, const Json& graph_outputs) {
        std::vector<jit::Value*> user;
        for (std::size_t i = 0; i < output_specs.size(); ++i) {
            const Json& spec = output_specs[i];
            const Json& produced = graph_outputs.at(i);
            if (spec.contains("user_output")) {
                user.push_back(argument_value(spec.at("user_output").at("arg"), nullptr, Json{{"target", "output"}}));
            } else if (spec.contains("buffer_mutation")) {
                const std::string buffer = spec.at("buffer_mutation").at("buffer_name").get<std::string>();
                write_back(attribute(buffer), argument_value(produced, nullptr, Json{{"target", "output"}}));
            } else {
                const std::string kind = spec.is_object() && !spec.empty() ? spec.begin().key() : "?";
                throw InvalidInput(who_ + ": the program has a '" + kind + "' output; " + unsupported_output(kind));
            }
        }
        const Spec out = parse_spec(call_signature(gm, who_).at("out_spec"), who_ + ": the output structure");
        if (out.leaves() != user.size())
            throw InvalidInput(who_ + ": the output structure has " + std::to_string(out.leaves()) +
                               " leaves but the signature " + std::to_string(user.size()) + " user outputs");
        std::size_t next = 0;
        graph_->registerOutput(pack(out, user, next));
    }

    [[nodiscard]] static std::string unsupported_output(const std::string& kind) {
        if (kind == "user_input_mutation")
            return "the forward updates one of its inputs in place, which belongs to the caller; clone it first";
        if (kind == "parameter_mutation") return "the forward updates a parameter in place, which remat cannot recompute";
        if (kind == "loss_output" || kind == "gradient_to_parameter" || kind == "gradient_to_user_input")
            return "it is a joint forward-backward program; export the forward alone (torch.export.export)";
        if (kind == "token") return "the program threads effect tokens; remat captures programs without them";
        return "remat does not read such outputs";
    }

    void write_back(jit::Value* buffer, jit::Value* value) {
        jit::Node* copy = graph_->create(c10::Symbol::fromQualString("aten::copy_"),
                                         {buffer, value, graph_->insertConstant(false)});
        copy->output()->setType(c10::TensorType::get());
        graph_->insertNode(copy);
    }

    [[nodiscard]] jit::Value* pack(const Spec& spec, const std::vector<jit::Value*>& leaves, std::size_t& next) {
        if (spec.kind == Spec::Kind::leaf) return leaves.at(next++);
        std::vector<jit::Value*> items;
        for (const Spec& c : spec.children) items.push_back(pack(c, leaves, next));
        if (spec.kind == Spec::Kind::tuple) return graph_->insertNode(graph_->createTuple(items))->output();
        c10::TypePtr element;
        for (const jit::Value* v : items) element = element ? c10::unifyTypes(element, v->type()).value_or(c10::AnyType::get()) : v->type();
        if (!element) element = c10::TensorType::get();
        if (spec.kind == Spec::Kind::list) return graph_->insertNode(graph_->createList(element, items))->output();
        std::vector<jit::Value*> keys;
        for (const Json& k : spec.keys)
            keys.push_back(k.is_string() ? graph_->insertConstant(k.get<std::string>())
                                         : graph_->insertConstant(k.get<std::int64_t>()));
        const c10::TypePtr key_type = spec.keys.empty() || spec.keys.front().is_string()
                                          ? c10::TypePtr(c10::StringType::get())
                                          : c10::TypePtr(c10::IntType::get());
        return graph_->insertNode(graph_->createDict(key_type, element, keys, items))->output();
    }

    // ---------------------------------------------------------------- nodes

    // Nodes that only check what the program was exported with: capture is specialised to the
    // example inputs' shapes and dtypes anyway.
    [[nodiscard]] static bool is_check(std::string_view target) {
        return target == "torch.ops.aten._assert_tensor_metadata.default" ||
               target == "torch.ops.aten._assert_async.msg" || target == "torch.ops.aten._assert_async.default" ||
               target == "torch.ops.aten._assert_scalar.default" ||
               target == "torch.ops.aten.sym_constrain_range.default" ||
               target == "torch.ops.aten.sym_constrain_range_for_size.default" ||
               target == "torch.ops.aten._functional_assert_async.msg";
    }

    // Python's integer operators on symbolic sizes, as TorchScript's integer operators.
    [[nodiscard]] static std::optional<std::string> python_operator(std::string_view target) {
        static const std::map<std::string_view, std::string> ops = {
            {"_operator.add", "aten::add"},       {"_operator.sub", "aten::sub"},
            {"_operator.mul", "aten::mul"},       {"_operator.floordiv", "aten::floordiv"},
            {"_operator.truediv", "aten::div"},   {"_operator.mod", "aten::remainder"},
            {"_operator.neg", "aten::neg"},       {"_operator.pow", "aten::pow"},
            {"_operator.eq", "aten::eq"},         {"_operator.ne", "aten::ne"},
            {"_operator.lt", "aten::lt"},         {"_operator.le", "aten::le"},
            {"_operator.gt", "aten::gt"},         {"_operator.ge", "aten::ge"},
            {"torch.sym_max", "prim::max"},       {"torch.sym_min", "prim::min"},
            {"math.ceil", "aten::ceil"},          {"math.floor", "aten::floor"},
            {"torch.sym_float", "aten::Float"},   {"torch.sym_int", "aten::Int"},
            {"_operator.and_", "aten::__and__"},  {"_operator.or_", "aten::__or__"}};
        const auto it = ops.find(target);
        if (it == ops.end()) return std::nullopt;
        return it->second;
    }

    void translate(const Json& node) {
        const std::string target = node.at("target").get<std::string>();
        if (is_check(target)) return;
        if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled") return translate_grad_mode_region(node);
        if (target == "torch.ops.higher_order.wrap_with_autocast")
            reject(node, "is a torch.autocast region, whose casts torch.export leaves to run time; write them into "
                         "the graph before saving: program = program.run_decompositions({}) (each cast becomes an "
                         "aten._to_copy op), then torch.export.save(program, ...)");
        if (target.starts_with("torch.ops.higher_order."))
            reject(node, "is control flow or another higher-order op ('" + target.substr(23) +
                             "'); remat plans one fixed graph of tensor ops: rewrite it without torch.cond / "
                             "torch.map / while_loop, or with Python control flow on shapes, which export resolves");
        if (const auto python = python_operator(target)) return translate_python_operator(node, *python);
        if (!target.starts_with("torch.ops.")) reject(node, "calls a Python function that is no ATen operator");
        const std::string rest = target.substr(10);
        const auto first_dot = rest.find('.');
        const auto last_dot = rest.rfind('.');
        if (first_dot == std::string::npos || first_dot == last_dot) reject(node, "has a target remat cannot parse");
        const std::string qualified = rest.substr(0, first_dot) + "::" + rest.substr(first_dot + 1, last_dot - first_dot - 1);
        std::string overload = rest.substr(last_dot + 1);
        if (overload == "default") overload.clear();
        translate_operator(node, qualified, overload);
    }

    // `with torch.no_grad():` in the forward: torch.export wraps the block in
    // wrap_with_set_grad_enabled(enabled, subgraph, *arguments). Its ops join the graph in
    // place of the call; where grad is off, they read their arguments detached, except the
    // module's buffers (no history, and the block may write them: spectral norm's power
    // iteration updates u and v with out= ops, once per step as capture runs buffer updates).
    // So nothing the block computes has history, and an op that autograd refuses with a
    // gradient (an out= variant) runs as in eager's block. The subgraph's names are its own:
    // the program's are put back after it, and its results take the call's output names.
    void translate_grad_mode_region(const Json& node) {
        const Json& inputs = node.at("inputs");
        if (inputs.size() < 2 || !inputs[0].at("arg").contains("as_bool") || !inputs[1].at("arg").contains("as_graph"))
            reject(node, "is a grad-mode block remat cannot read (it expects the mode, a subgraph, then arguments)");
        const bool enabled = inputs[0].at("arg").at("as_bool").get<bool>();
        const Json& body = inputs[1].at("arg").at("as_graph").at("graph");
        const Json& parameters = body.at("inputs");
        if (parameters.size() + 2 != inputs.size())
            reject(node, "passes " + std::to_string(inputs.size() - 2) + " arguments to a block of " +
                             std::to_string(parameters.size()));
        std::vector<jit::Value*> arguments;
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            jit::Value* v = block_value(inputs[i + 2].at("arg"), node);
            arguments.push_back(enabled || buffers_.contains(v) ? v : detached(v));
        }
        const std::unordered_map<std::string, jit::Value*> outer = values_;
        for (std::size_t i = 0; i < parameters.size(); ++i) define(block_name(parameters[i], node), arguments[i]);
        for (const Json& inner : body.at("nodes")) translate(inner);
        std::vector<jit::Value*> results;
        for (const Json& out : body.at("outputs")) {
            results.push_back(named(block_name(out, node), node));
        }
        values_ = outer;
        const Json& outputs = node.at("outputs");
        if (outputs.size() != results.size())
            reject(node, "has " + std::to_string(outputs.size()) + " outputs where its block returns " +
                             std::to_string(results.size()));
        for (std::size_t k = 0; k < results.size(); ++k) define(block_name(outputs[k], node), results[k]);
    }
    // `v` without history where it is a tensor (the same memory: an in-place op on it is one
    // on `v`, as in eager's block), `v` itself otherwise.
    [[nodiscard]] jit::Value* detached(jit::Value* v) {
        if (!v->type()->cast<c10::TensorType>()) return v;
        jit::Node* detach = graph_->insertNode(graph_->create(c10::Symbol::fromQualString("aten::detach"), {v}));
        detach->output()->setType(v->type());
        return detach->output();
    }
    // The name of a tensor or symbolic integer that a block passes or returns.
    [[nodiscard]] std::string block_name(const Json& value, const Json& node) const {
        if (value.contains("as_tensor")) return value.at("as_tensor").at("name").get<std::string>();
        if (value.contains("as_sym_int") && value.at("as_sym_int").contains("as_name"))
            return value.at("as_sym_int").at("as_name").get<std::string>();
        reject(node, "passes a value of a kind remat does not read into or out of a grad-mode block: " + value.dump());
    }
    [[nodiscard]] jit::Value* block_value(const Json& value, const Json& node) const {
        return named(block_name(value, node), node);
    }

    [[nodiscard]] std::shared_ptr<jit::Operator> find_operator(const Json& node, const std::string& qualified,
                                                                const std::string& overload) const {
        for (const std::shared_ptr<jit::Operator>& op : jit::getAllOperatorsFor(c10::Symbol::fromQualString(qualified)))
            if (op->schema().overload_name() == overload) return op;
        reject(node, "calls '" + qualified + (overload.empty() ? "" : "." + overload) +
                         "', an operator this LibTorch does not have (a custom op whose library is not loaded, or "
                         "one newer than this LibTorch)");
    }

    void translate_operator(const Json& node, const std::string& qualified, const std::string& overload) {
        const std::shared_ptr<jit::Operator> op = find_operator(node, qualified, overload);
        const c10::FunctionSchema& schema = op->schema();
        std::map<std::string, const Json*> given;
        for (const Json& input : node.at("inputs")) given[input.at("name").get<std::string>()] = &input.at("arg");
        std::vector<jit::Value*> inputs;
        for (const c10::Argument& argument : schema.arguments()) {
            const auto it = given.find(argument.name());
            if (it != given.end()) {
                inputs.push_back(argument_value(*it->second, argument.type(), node));
                given.erase(it);
            } else if (argument.default_value()) {
                inputs.push_back(graph_->insertConstant(*argument.default_value()));
            } else {
                reject(node, "gives no '" + argument.name() + "', which '" + schema.name() + "' needs");
            }
        }
        if (!given.empty()) reject(node, "gives '" + given.begin()->first + "', which '" + schema.name() + "' does not take");
        if (schema.is_vararg()) reject(node, "calls an operator with variable arguments");
        jit::Node* n = graph_->create(c10::Symbol::fromQualString(qualified), inputs, schema.returns().size());
        for (std::size_t k = 0; k < schema.returns().size(); ++k) n->output(k)->setType(schema.returns()[k].type());
        if (const auto line = source_line(node)) n->setSourceRange(range_of(*line));
        graph_->insertNode(n);
        const c10::FunctionSchema* matched = n->maybeSchema();
        if (matched == nullptr || matched->overload_name() != overload)
            reject(node, "matches " + (matched ? "the overload '" + matched->overload_name() + "'" : std::string("no overload")) +
                             " of '" + schema.name() + "' for its argument types instead of the one it names");
        bind_node_outputs(node, n);
    }

    void translate_python_operator(const Json& node, const std::string& qualified) {
        std::vector<jit::Value*> inputs;
        for (const Json& input : node.at("inputs")) inputs.push_back(argument_value(input.at("arg"), nullptr, node));
        jit::Node* n = graph_->create(c10::Symbol::fromQualString(qualified), inputs, 1);
        if (const auto line = source_line(node)) n->setSourceRange(range_of(*line));
        graph_->insertNode(n);
        const c10::FunctionSchema* schema = nullptr;
        for (const std::shared_ptr<jit::Operator>& op : jit::getAllOperatorsFor(n->kind()))
            if (op->schema().returns().size() == 1 && !op->schema().is_vararg() && n->matches(op->schema())) {
                schema = &op->schema();
                break;
            }
        if (schema == nullptr) reject(node, "computes on symbolic sizes with operand types remat has no operator for");
        n->output()->setType(schema->returns()[0].type());
        bind_node_outputs(node, n);
    }

    [[nodiscard]] jit::SourceRange range_of(const SourceLine& line) {
        auto& source = sources_[line.file + ":" + std::to_string(line.line)];
        if (!source)
            source = std::make_shared<jit::Source>(line.code.empty() ? std::string(" ") : line.code, line.file, line.line);
        return jit::SourceRange(source, 0, source->size());
    }

    void bind_node_outputs(const Json& node, jit::Node* n) {
        const Json& outputs = node.at("outputs");
        if (outputs.size() != n->outputs().size())
            reject(node, "has " + std::to_string(outputs.size()) + " outputs where its operator returns " +
                             std::to_string(n->outputs().size()));
        for (std::size_t k = 0; k < outputs.size(); ++k) {
            const Json& out = outputs[k];
            jit::Value* v = n->output(k);
            if (out.contains("as_tensor")) {
                define(out.at("as_tensor").at("name").get<std::string>(), v);
            } else if (out.contains("as_tensors") || out.contains("as_optional_tensors")) {
                const Json& items = out.contains("as_tensors") ? out.at("as_tensors") : out.at("as_optional_tensors");
                jit::Node* unpack = graph_->insertNode(graph_->createListUnpack(v, items.size()));
                for (std::size_t i = 0; i < items.size(); ++i) {
                    const Json& item = items[i];
                    if (item.contains("name"))
                        define(item.at("name").get<std::string>(), unpack->output(i));
                    else if (item.contains("as_tensor"))
                        define(item.at("as_tensor").at("name").get<std::string>(), unpack->output(i));
                }
            } else if (out.contains("as_sym_int") || out.contains("as_sym_float") || out.contains("as_sym_bool")) {
                const Json& sym = out.contains("as_sym_int") ? out.at("as_sym_int")
                                  : out.contains("as_sym_float") ? out.at("as_sym_float") : out.at("as_sym_bool");
                if (sym.contains("as_name")) define(sym.at("as_name").get<std::string>(), v);
            } else if (out.contains("as_int") || out.contains("as_none") || out.contains("as_float") ||
                       out.contains("as_bool")) {
                // An output the program never reads.
            } else {
                reject(node, "has an output of a kind remat does not read: " + out.dump());
            }
        }
    }

    // ---------------------------------------------------------------- arguments

    [[nodiscard]] static bool wants(const c10::TypePtr& expected, c10::TypeKind kind) {
        if (!expected) return false;
        if (expected->kind() == kind) return true;
        if (const auto* optional = expected->castRaw<c10::OptionalType>()) return optional->getElementType()->kind() == kind;
        return false;
    }

    [[nodiscard]] jit::Value* constant(const c10::IValue& v) { return graph_->insertConstant(v); }

    // A Python number where the operator takes a tensor (`x.add_(1)` is add_.Tensor): a 0-dim
    // "wrapped number" tensor, as eager PyTorch passes it, so that type promotion is the same.
    [[nodiscard]] jit::Value* wrapped_number(const c10::Scalar& s) {
        at::Tensor t = at::scalar_to_tensor(s);
        t.unsafeGetTensorImpl()->set_wrapped_number(true);
        return constant(t);
    }

    [[nodiscard]] jit::Value* device_value(const Json& device) {
        c10::Device d = device_of(device);
        if (options_.device && d.type() == exported_device_type()) d = *options_.device;
        return constant(d);
    }

    // The device type the weights were saved on: device arguments that name it follow the
    // weights when they are placed elsewhere.
    [[nodiscard]] c10::DeviceType exported_device_type() const {
        for (const auto& [name, t] : archive_.weights) return t.device().type();
        return c10::DeviceType::CPU;
    }

    [[nodiscard]] jit::Value* sym_value(const Json& sym, const Json& node, c10::TypeKind kind) {
        if (sym.contains("as_name")) return named(sym.at("as_name").get<std::string>(), node);
        if (sym.contains("as_int")) {
            if (kind == c10::TypeKind::FloatType) return constant(static_cast<double>(sym.at("as_int").get<std::int64_t>()));
            return constant(sym.at("as_int").get<std::int64_t>());
        }
        if (sym.contains("as_float")) return constant(number(sym.at("as_float")));
        if (sym.contains("as_bool")) return constant(sym.at("as_bool").get<bool>());
        reject(node, "has a symbolic value remat cannot read: " + sym.dump());
    }

    // The graph value of one argument; `expected` (the schema's type, null for Python's
    // operators) decides between int and float where the program wrote an integer.
    [[nodiscard]] jit::Value* argument_value(const Json& arg, const c10::TypePtr& expected, const Json& node) {
        if (!arg.is_object() || arg.size() != 1) reject(node, "has an argument remat cannot read: " + arg.dump());
        const auto only = arg.begin();  // one iterator: g++ 13 takes a reference through a temporary's for dangling
        const std::string kind = only.key();
        const Json& v = only.value();
        if (kind == "as_none") return constant(c10::IValue());
        if (kind == "as_tensor") return named(v.at("name").get<std::string>(), node);
        if (kind == "as_optional_tensor")
            return v.contains("as_tensor") ? named(v.at("as_tensor").at("name").get<std::string>(), node)
                                           : constant(c10::IValue());
        if (kind == "as_tensors" || kind == "as_optional_tensors") return tensor_list(v, kind, expected, node);
        if ((kind == "as_int" || kind == "as_float" || kind == "as_bool") && wants(expected, c10::TypeKind::TensorType))
            return wrapped_number(kind == "as_int"     ? c10::Scalar(v.get<std::int64_t>())
                                  : kind == "as_float" ? c10::Scalar(number(v))
                                                       : c10::Scalar(v.get<bool>()));
        if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool")
            return sym_value(v, node, wants(expected, c10::TypeKind::FloatType) ? c10::TypeKind::FloatType : c10::TypeKind::IntType);
        if (kind == "as_sym_ints" || kind == "as_sym_floats" || kind == "as_sym_bools") return sym_list(v, kind, node);
        if (kind == "as_scalar_type") return constant(dtype_of(v.get<std::int64_t>(), who_ + ": node " + node_text(node)));
        if (kind == "as_layout") return constant(layout_of(v.get<std::int64_t>(), who_ + ": node " + node_text(node)));
        if (kind == "as_memory_format")
            return constant(memory_format_of(v.get<std::int64_t>(), who_ + ": node " + node_text(node)));
        if (kind == "as_device") return device_value(v);
        if (kind == "as_graph") reject(node, "takes a subgraph (control flow); remat plans one fixed graph of tensor ops");
        if (kind == "as_custom_obj") reject(node, "takes a custom object; remat captures tensor programs only");
        if (const auto value = plain_constant(kind, v, expected)) return constant(*value);
        reject(node, "has an argument of kind '" + kind + "', which remat does not read");
    }

    // Numbers, strings, booleans and lists of them.
    [[nodiscard]] static std::optional<c10::IValue> plain_constant(const std::string& kind, const Json& v,
                                                                   const c10::TypePtr& expected) {
        if (kind == "as_int") {
            if (wants(expected, c10::TypeKind::FloatType)) return c10::IValue(static_cast<double>(v.get<std::int64_t>()));
            return c10::IValue(v.get<std::int64_t>());
        }
        if (kind == "as_float") return c10::IValue(number(v));
        if (kind == "as_bool") return c10::IValue(v.get<bool>());
        if (kind == "as_string") return c10::IValue(v.get<std::string>());
        if (kind == "as_complex") return c10::IValue(c10::complex<double>(number(v.at("real")), number(v.at("imag"))));
        if (kind == "as_ints") {
            if (wants(expected, c10::TypeKind::ListType) && expected->str().find("float") != std::string::npos) {
                std::vector<double> values;
                for (const Json& i : v) values.push_back(static_cast<double>(i.get<std::int64_t>()));
                return c10::IValue(values);
            }
            return c10::IValue(v.get<std::vector<std::int64_t>>());
        }
        if (kind == "as_floats") {
            std::vector<double> values;
            for (const Json& f : v) values.push_back(number(f));
            return c10::IValue(values);
        }
        if (kind == "as_bools") {
            c10::List<bool> values;
            for (const Json& b : v) values.push_back(b.get<bool>());
            return c10::IValue(values);
        }
        if (kind == "as_strings") return c10::IValue(v.get<std::vector<std::string>>());
        return std::nullopt;
    }

    // Tensor[] and Tensor?[]: a list built in the graph from the named tensors.
    [[nodiscard]] jit::Value* tensor_list(const Json& v, const std::string& kind, const c10::TypePtr& expected,
                                          const Json& node) {
        std::vector<jit::Value*> items;
        const bool optional = kind == "as_optional_tensors";
        for (const Json& item : v) {
            if (!optional)
                items.push_back(named(item.at("name").get<std::string>(), node));
            else if (item.contains("as_tensor"))
                items.push_back(named(item.at("as_tensor").at("name").get<std::string>(), node));
            else
                items.push_back(constant(c10::IValue()));
        }
        // The schema's element type decides: a Tensor?[] argument may come as plain tensors.
        const bool optional_elements = optional || (expected && expected->str().find("Tensor?[]") != std::string::npos);
        const c10::TypePtr element = optional_elements ? c10::TypePtr(c10::OptionalType::create(c10::TensorType::get()))
                                                       : c10::TypePtr(c10::TensorType::get());
        return graph_->insertNode(graph_->createList(element, items))->output();
    }

    // SymInt[] (and float, bool): a constant list when every item is concrete, else a list
    // built in the graph from the symbolic values.
    [[nodiscard]] jit::Value* sym_list(const Json& v, const std::string& kind, const Json& node) {
        const bool floats = kind == "as_sym_floats", bools = kind == "as_sym_bools";
        bool concrete = true;
        for (const Json& item : v) concrete = concrete && !item.contains("as_name");
        if (concrete) {
            if (floats) {
                std::vector<double> values;
                for (const Json& item : v) values.push_back(number(item.at("as_float")));
                return constant(values);
            }
            if (bools) {
                c10::List<bool> values;
                for (const Json& item : v) values.push_back(item.at("as_bool").get<bool>());
                return constant(values);
            }
            std::vector<std::int64_t> values;
            for (const Json& item : v) values.push_back(item.at("as_int").get<std::int64_t>());
            return constant(values);
        }
        std::vector<jit::Value*> items;
        for (const Json& item : v)
            items.push_back(sym_value(item, node, floats ? c10::TypeKind::FloatType : c10::TypeKind::IntType));
        const c10::TypePtr type = floats  ? c10::TypePtr(c10::FloatType::get())
                                  : bools ? c10::TypePtr(c10::BoolType::get())
                                          : c10::TypePtr(c10::IntType::get());
        return graph_->insertNode(graph_->createList(type, items))->output();
    }

    const Archive& archive_;
    TranslateOptions options_;
    std::string who_;
    std::shared_ptr<jit::CompilationUnit> unit_;
    std::shared_ptr<jit::Graph> graph_;
    std::optional<jit::Module> root_;
    jit::Value* self_ = nullptr;
    bool training_ = true;
    std::unordered_map<std::string, jit::Value*> values_;
    std::unordered_set<const jit::Value*> buffers_;  // the module's buffers, as the graph reads them
    std::map<std::string, jit::Module> modules_;
    std::map<std::string, jit::Value*> attributes_;
    std::set<std::string> registered_;
    std::unordered_map<const void*, at::Tensor> placed_;
    std::map<std::string, std::shared_ptr<jit::Source>> sources_;
};

}  // namespace remat::torch::detail::exported
