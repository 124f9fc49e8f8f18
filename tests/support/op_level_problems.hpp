// Seeded op-level problems shaped like captured networks (docs/design.md §5, capture), for the tests and
// benchmarks of block partitioning and Rockmate: every forward op has a no-grad writer F and
// a with-grad writer F+ (which also writes the op's saved state when it has one), every op an
// exactly-once backward B that reads the gradient contributions of its outputs, its saved
// state and the inputs/outputs its derivative uses, and writes one gradient contribution per
// input that needs a gradient; a loss reads the last activation and writes its gradient.
// Blocks: chains of single ops, residual blocks, diamonds, attention-like blocks (an op with
// three outputs, a large score matrix, softmax saving its output) and MLP blocks.
#pragma once

#include <cstddef>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <remat/core/problem.hpp>

namespace remat::testing {

/// prefix + number + suffix, built by appending (GCC 12 warns falsely, -Wrestrict, on
/// `"literal" + std::string` once inlined).
[[nodiscard]] inline std::string numbered(std::string_view prefix, std::size_t number, std::string_view suffix = {}) {
    std::string out(prefix);
    out.append(std::to_string(number)).append(suffix);
    return out;
}

/// Records a forward graph of values and ops, then expands it into a remat.problem/1 problem.
class OpLevelBuilder {
public:
    using Value = std::size_t;

    struct OpDesc {
        std::string name;
        std::vector<Value> inputs;
        std::vector<std::pair<std::string, Bytes>> outputs;
        Bytes saved = 0;  ///< saved state beyond inputs/outputs (written by F+ only)
        double fwd_time = 1.0;
        double bwd_time = 2.0;
        Bytes fwd_overhead = 0;
        Bytes bwd_overhead = 0;
        bool bwd_reads_inputs = true;
        bool bwd_reads_outputs = false;
    };

    explicit OpLevelBuilder(std::string name) : name_(std::move(name)) {}

    Value input(std::string name, Bytes bytes, bool needs_grad) {
        values_.push_back({std::move(name), bytes, needs_grad, true});
        return values_.size() - 1;
    }

    std::vector<Value> op(OpDesc desc) {
        std::vector<Value> outs;
        for (auto& [name, bytes] : desc.outputs) {
            values_.push_back({name, bytes, true, false});
            outs.push_back(values_.size() - 1);
        }
        ops_.push_back({std::move(desc), outs});
        return outs;
    }
    Value op1(OpDesc desc) { return op(std::move(desc)).front(); }
    [[nodiscard]] Bytes bytes(Value v) const { return values_.at(v).bytes; }

    /// The problem: forward ops (F, F+), the loss reading `out` (and `extra_loss_reads`, e.g.
    /// targets), backward ops; final = the gradient contributions of inputs that need one.
    [[nodiscard]] Problem finish(Value out, double loss_time = 0.0, std::vector<Value> extra_loss_reads = {}) const {
        ProblemBuilder b(name_);
        const std::size_t n_ops = ops_.size();
        const std::size_t loss_consumer = n_ops;
        // consumers[v] = forward ops (index) reading v, then the loss.
        std::vector<std::vector<std::size_t>> consumers(values_.size());
        for (std::size_t i = 0; i < n_ops; ++i)
            for (const Value v : ops_[i].desc.inputs) consumers[v].push_back(i);
        consumers[out].push_back(loss_consumer);
        for (const Value v : extra_loss_reads) consumers[v].push_back(loss_consumer);
        const auto consumer_name = [&](std::size_t c) { return c == loss_consumer ? std::string("loss") : ops_[c].desc.name; };
        const auto needs_grad = [&](Value v) { return values_[v].needs_grad; };

        std::vector<DataId> data(values_.size());
        for (Value v = 0; v < values_.size(); ++v) data[v] = b.add_data(values_[v].name, values_[v].bytes);
        std::vector<std::optional<DataId>> saved(n_ops);
        for (std::size_t i = 0; i < n_ops; ++i)
            if (ops_[i].desc.saved > 0) saved[i] = b.add_data("s." + ops_[i].desc.name, ops_[i].desc.saved);
        // grad[v][j] = contribution to the gradient of v from its j-th consumer.
        std::vector<std::vector<std::optional<DataId>>> grad(values_.size());
        for (Value v = 0; v < values_.size(); ++v) {
            grad[v].resize(consumers[v].size());
            if (!needs_grad(v)) continue;
            for (std::size_t j = 0; j < consumers[v].size(); ++j)
                grad[v][j] = b.add_data("g." + values_[v].name + "." + consumer_name(consumers[v][j]), values_[v].bytes);
        }
        const auto contribution = [&](Value v, std::size_t consumer) -> std::optional<DataId> {
            for (std::size_t j = 0; j < consumers[v].size(); ++j)
                if (consumers[v][j] == consumer) return grad[v][j];
            return std::nullopt;
        };

        std::vector<OpId> order;
        for (std::size_t i = 0; i < n_ops; ++i) {
            const OpDesc& d = ops_[i].desc;
            std::vector<DataId> reads, writes;
            for (const Value v : d.inputs) reads.push_back(data[v]);
            for (const Value v : ops_[i].outputs) writes.push_back(data[v]);
            b.add_op({"F" + d.name, d.fwd_time, d.fwd_overhead, reads, writes, false});
            if (saved[i]) writes.push_back(*saved[i]);
            order.push_back(b.add_op({"F" + d.name + "+", d.fwd_time, d.fwd_overhead, reads, writes, false}));
        }
        {
            std::vector<DataId> reads{data[out]}, writes;
            for (const Value v : extra_loss_reads) reads.push_back(data[v]);
            std::vector<Value> read_values{out};
            read_values.insert(read_values.end(), extra_loss_reads.begin(), extra_loss_reads.end());
            for (const Value v : read_values)
                if (const auto g = contribution(v, loss_consumer)) writes.push_back(*g);
            const OpId loss = b.add_op({"loss", loss_time, 0, reads, writes, true});
            b.set_loss(loss);
            order.push_back(loss);
        }
        for (std::size_t i = n_ops; i-- > 0;) {
            const OpDesc& d = ops_[i].desc;
            std::vector<DataId> reads, writes;
            for (const Value v : ops_[i].outputs)
                for (const auto& g : grad[v])
                    if (g) reads.push_back(*g);
            if (saved[i]) reads.push_back(*saved[i]);
            if (d.bwd_reads_inputs)
                for (const Value v : d.inputs) reads.push_back(data[v]);
            if (d.bwd_reads_outputs)
                for (const Value v : ops_[i].outputs) reads.push_back(data[v]);
            for (const Value v : d.inputs)
                if (const auto g = contribution(v, i)) writes.push_back(*g);
            if (writes.empty()) writes.push_back(b.add_data("done." + d.name, 0));
            dedupe(reads);
            order.push_back(b.add_op({"B" + d.name, d.bwd_time, d.bwd_overhead, reads, writes, true}));
        }
        for (Value v = 0; v < values_.size(); ++v)
            if (values_[v].is_input) {
                b.add_initial(data[v]);
                for (const auto& g : grad[v])
                    if (g) b.add_final(*g);
            }
        b.set_autograd_order(std::move(order));
        return b.build();
    }

private:
    static void dedupe(std::vector<DataId>& v) {
        std::vector<DataId> out;
        for (const DataId d : v) {
            bool seen = false;
            for (const DataId e : out) seen = seen || e == d;
            if (!seen) out.push_back(d);
        }
        v = std::move(out);
    }

    struct ValueInfo {
        std::string name;
        Bytes bytes;
        bool needs_grad;
        bool is_input;
    };
    struct OpInfo {
        OpDesc desc;
        std::vector<Value> outputs;
    };
    std::string name_;
    std::vector<ValueInfo> values_;
    std::vector<OpInfo> ops_;
};

enum class BlockKind { chain, residual, diamond, attention, mlp };

struct OpLevelShape {
    std::size_t blocks = 3;
    std::vector<BlockKind> kinds{BlockKind::chain, BlockKind::residual, BlockKind::diamond, BlockKind::attention,
                                 BlockKind::mlp};
    /// The input's gradients are final (else the input needs none, like token ids).
    bool input_gradient = true;
    /// An initial mask read by attention scores and a target read by the loss.
    bool side_inputs = false;
    /// Sizes are multiples of this.
    Bytes unit = 16;
    int max_units = 8;
};

namespace detail {

struct Gen {
    std::mt19937& rng;
    Bytes unit;
    int max_units;
    int size() { return std::uniform_int_distribution<int>(1, max_units)(rng); }
    Bytes bytes() { return size() * unit; }
    double time() { return double(std::uniform_int_distribution<int>(1, 5)(rng)); }
    bool coin(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p; }
    Bytes maybe(double p, Bytes v) { return coin(p) ? v : 0; }

    OpLevelBuilder::OpDesc desc(std::string name, std::vector<OpLevelBuilder::Value> inputs, Bytes out_bytes) {
        OpLevelBuilder::OpDesc d;
        d.name = name;
        d.inputs = std::move(inputs);
        d.outputs = {{name, out_bytes}};
        d.saved = maybe(0.6, bytes());
        d.fwd_time = time();
        d.bwd_time = time();
        d.fwd_overhead = maybe(0.3, unit);
        d.bwd_overhead = maybe(0.3, 2 * unit);
        d.bwd_reads_inputs = coin(0.7);
        d.bwd_reads_outputs = coin(0.3);
        return d;
    }
    // Elementwise add: nothing saved, the backward reads only gradients.
    OpLevelBuilder::OpDesc add(std::string name, std::vector<OpLevelBuilder::Value> inputs, Bytes out_bytes) {
        OpLevelBuilder::OpDesc d;
        d.name = std::move(name);
        d.inputs = std::move(inputs);
        d.outputs = {{d.name, out_bytes}};
        d.fwd_time = 1.0;
        d.bwd_time = 1.0;
        d.bwd_reads_inputs = false;
        return d;
    }
};

}  // namespace detail

/// Appends one block of `kind` after activation `a` (of `a_bytes`); returns its output.
inline OpLevelBuilder::Value append_block(OpLevelBuilder& g, detail::Gen& gen, BlockKind kind, OpLevelBuilder::Value a,
                                          Bytes a_bytes, const std::string& p, std::optional<OpLevelBuilder::Value> mask) {
    switch (kind) {
        case BlockKind::chain: {
            const int n = std::uniform_int_distribution<int>(1, 3)(gen.rng);
            OpLevelBuilder::Value v = a;
            for (int i = 0; i < n; ++i) v = g.op1(gen.desc(numbered(p + "c", static_cast<std::size_t>(i)), {v}, gen.bytes()));
            return v;
        }
        case BlockKind::residual: {
            const auto h1 = g.op1(gen.desc(p + "r1", {a}, gen.bytes()));
            const auto h2 = g.op1(gen.desc(p + "r2", {h1}, a_bytes));
            return g.op1(gen.add(p + "add", {a, h2}, a_bytes));
        }
        case BlockKind::diamond: {
            const auto b = g.op1(gen.desc(p + "b", {a}, gen.bytes()));
            const auto c = g.op1(gen.desc(p + "c", {a}, gen.bytes()));
            return g.op1(gen.desc(p + "d", {b, c}, gen.bytes()));
        }
        case BlockKind::attention: {
            auto ln = gen.desc(p + "ln", {a}, a_bytes);
            ln.saved = gen.unit;
            const auto n = g.op1(ln);
            OpLevelBuilder::OpDesc qkv = gen.desc(p + "qkv", {n}, 0);
            qkv.outputs = {{p + "q", a_bytes}, {p + "k", a_bytes}, {p + "v", a_bytes}};
            qkv.saved = 0;
            qkv.bwd_reads_inputs = true;
            const auto qkv_out = g.op(qkv);
            const Bytes scores_bytes = 2 * a_bytes;
            std::vector<OpLevelBuilder::Value> sin{qkv_out[0], qkv_out[1]};
            if (mask) sin.push_back(*mask);
            auto sc = gen.desc(p + "scores", sin, scores_bytes);
            sc.saved = 0;
            sc.bwd_reads_inputs = true;
            const auto s = g.op1(sc);
            auto sm = gen.desc(p + "softmax", {s}, scores_bytes);
            sm.saved = gen.maybe(0.5, scores_bytes / 2);  // a dropout mask
            sm.bwd_reads_inputs = false;
            sm.bwd_reads_outputs = true;
            const auto prob = g.op1(sm);
            auto av = gen.desc(p + "av", {prob, qkv_out[2]}, a_bytes);
            av.saved = 0;
            av.bwd_reads_inputs = true;
            const auto ctx = g.op1(av);
            const auto o = g.op1(gen.desc(p + "proj", {ctx}, a_bytes));
            return g.op1(gen.add(p + "add", {a, o}, a_bytes));
        }
        case BlockKind::mlp: {
            auto ln = gen.desc(p + "ln", {a}, a_bytes);
            ln.saved = gen.unit;
            const auto n = g.op1(ln);
            const auto h = g.op1(gen.desc(p + "fc1", {n}, 4 * a_bytes));
            auto act = gen.desc(p + "gelu", {h}, 4 * a_bytes);
            act.saved = 0;
            act.bwd_reads_inputs = true;
            const auto ge = g.op1(act);
            const auto o = g.op1(gen.desc(p + "fc2", {ge}, a_bytes));
            return g.op1(gen.add(p + "add", {a, o}, a_bytes));
        }
    }
    return a;
}

/// A random network of `shape.blocks` blocks of the allowed kinds.
inline Problem random_op_level_problem(std::mt19937& rng, const OpLevelShape& shape, const std::string& name = "net") {
    detail::Gen gen{rng, shape.unit, shape.max_units};
    OpLevelBuilder g(name);
    Bytes a_bytes = gen.bytes();
    auto a = g.input("x", a_bytes, shape.input_gradient);
    std::optional<OpLevelBuilder::Value> mask, target;
    if (shape.side_inputs) {
        mask = g.input("mask", shape.unit, false);
        target = g.input("target", shape.unit, false);
    }
    for (std::size_t i = 0; i < shape.blocks; ++i) {
        const BlockKind kind = shape.kinds[std::uniform_int_distribution<std::size_t>(0, shape.kinds.size() - 1)(rng)];
        a = append_block(g, gen, kind, a, a_bytes, numbered("b", i + 1, "."), mask);
        a_bytes = g.bytes(a);  // chains and diamonds change the size
    }
    std::vector<OpLevelBuilder::Value> extra;
    if (target) extra.push_back(*target);
    return g.finish(a, 0.0, extra);
}

/// Sizes of a GPT-2-like model (fp32) for transformer_like(); times are in arbitrary units
/// proportional to the floating-point work (matrix products) or bytes moved (the rest).
struct TransformerShape {
    std::size_t layers = 12;
    Bytes batch = 8;
    Bytes tokens = 512;
    Bytes width = 768;
    Bytes heads = 12;
    Bytes vocab = 8192;
    bool dropout = true;
};

/// Token and position embeddings, `layers` pre-norm blocks (causal self-attention with dropout
/// on the attention weights, a GELU MLP), a final norm and an LM head, as capture would see it:
/// the token ids need no gradient; the loss reads the logits.
inline Problem transformer_like(const TransformerShape& t, const std::string& name = "gpt") {
    OpLevelBuilder g(name);
    const Bytes f = 4;  // fp32
    const Bytes act = t.batch * t.tokens * t.width * f;
    const Bytes scores = t.batch * t.heads * t.tokens * t.tokens * f;
    const double mm = 1e-9;  // time per multiply-add
    const double mv = 2e-10; // time per byte moved
    const double bt = double(t.batch * t.tokens);
    const auto linear = [&](std::string n, OpLevelBuilder::Value in, Bytes in_features, Bytes out_features) {
        OpLevelBuilder::OpDesc d;
        d.name = n;
        d.inputs = {in};
        d.outputs = {{n, t.batch * t.tokens * out_features * f}};
        d.fwd_time = mm * bt * double(in_features * out_features);
        d.bwd_time = 2 * d.fwd_time;
        d.bwd_overhead = in_features * out_features * f;  // the weight gradient
        d.bwd_reads_inputs = true;
        return g.op1(d);
    };
    const auto elementwise = [&](std::string n, std::vector<OpLevelBuilder::Value> in, Bytes bytes, Bytes saved,
                                 bool reads_inputs, bool reads_outputs) {
        OpLevelBuilder::OpDesc d;
        d.name = n;
        d.inputs = std::move(in);
        d.outputs = {{n, bytes}};
        d.saved = saved;
        d.fwd_time = mv * double(bytes) * double(d.inputs.size() + 1);
        d.bwd_time = 2 * d.fwd_time;
        d.bwd_reads_inputs = reads_inputs;
        d.bwd_reads_outputs = reads_outputs;
        return g.op1(d);
    };
    const auto norm = [&](std::string n, OpLevelBuilder::Value in) {
        return elementwise(n, {in}, act, 2 * t.batch * t.tokens * f, true, false);
    };
    const auto ids = g.input("tokens", t.batch * t.tokens * 8, false);
    OpLevelBuilder::OpDesc emb;
    emb.name = "embed";
    emb.inputs = {ids};
    emb.outputs = {{"embed", act}};
    emb.fwd_time = mv * double(act) * 2;
    emb.bwd_time = mv * double(act) * 3;
    emb.bwd_overhead = t.vocab * t.width * f;
    auto h = g.op1(emb);
    for (std::size_t l = 0; l < t.layers; ++l) {
        const std::string p = numbered("h", l, ".");
        const auto n1 = norm(p + "ln1", h);
        OpLevelBuilder::OpDesc qkv;
        qkv.name = p + "qkv";
        qkv.inputs = {n1};
        qkv.outputs = {{p + "q", act}, {p + "k", act}, {p + "v", act}};
        qkv.fwd_time = mm * bt * double(3 * t.width * t.width);
        qkv.bwd_time = 2 * qkv.fwd_time;
        qkv.bwd_overhead = 3 * t.width * t.width * f;
        const auto qkv_out = g.op(qkv);
        OpLevelBuilder::OpDesc sc;
        sc.name = p + "scores";
        sc.inputs = {qkv_out[0], qkv_out[1]};
        sc.outputs = {{p + "scores", scores}};
        sc.fwd_time = mm * double(t.batch * t.tokens * t.tokens * t.width);
        sc.bwd_time = 2 * sc.fwd_time;
        const auto s = g.op1(sc);
        auto pr = elementwise(p + "softmax", {s}, scores, 0, false, true);
        if (t.dropout) pr = elementwise(p + "drop", {pr}, scores, scores / f, false, false);
        OpLevelBuilder::OpDesc av;
        av.name = p + "av";
        av.inputs = {pr, qkv_out[2]};
        av.outputs = {{p + "av", act}};
        av.fwd_time = sc.fwd_time;
        av.bwd_time = 2 * av.fwd_time;
        const auto ctx = g.op1(av);
        const auto o = linear(p + "proj", ctx, t.width, t.width);
        h = elementwise(p + "add1", {h, o}, act, 0, false, false);
        const auto n2 = norm(p + "ln2", h);
        const auto up = linear(p + "fc1", n2, t.width, 4 * t.width);
        const auto ge = elementwise(p + "gelu", {up}, 4 * act, 0, true, false);
        auto down = linear(p + "fc2", ge, 4 * t.width, t.width);
        if (t.dropout) down = elementwise(p + "drop2", {down}, act, act / f, false, false);
        h = elementwise(p + "add2", {h, down}, act, 0, false, false);
    }
    const auto nf = norm("lnf", h);
    const auto logits = linear("head", nf, t.width, t.vocab);
    return g.finish(logits, mv * double(t.batch * t.tokens * t.vocab * f));
}

/// A U-Net as capture would see it: `levels` levels down and up, `convs` (convolution,
/// batch norm, ReLU) per level and side, max pooling, transposed convolutions and skip
/// concatenations, a 1x1 head; the image needs no gradient.
struct UNetShape {
    std::size_t levels = 4;
    std::size_t convs = 3;
    Bytes batch = 4;
    Bytes channels = 16;  ///< at the top level; doubled per level down
    Bytes pixels = 64;    ///< image side at the top level; halved per level down
};

inline Problem unet_like(const UNetShape& u, const std::string& name = "unet") {
    OpLevelBuilder g(name);
    using V = OpLevelBuilder::Value;
    const Bytes f = 4;
    const double mm = 1e-9, mv = 2e-10;
    const auto act = [&](std::size_t level, Bytes channels) {
        const Bytes side = u.pixels >> level;
        return u.batch * channels * side * side * f;
    };
    const auto op = [&](std::string n, std::vector<V> in, Bytes out, double time, Bytes saved, bool reads_in,
                        bool reads_out, Bytes bwd_overhead) {
        OpLevelBuilder::OpDesc d;
        d.name = std::move(n);
        d.inputs = std::move(in);
        d.outputs = {{d.name, out}};
        d.saved = saved;
        d.fwd_time = time;
        d.bwd_time = 2 * time;
        d.bwd_reads_inputs = reads_in;
        d.bwd_reads_outputs = reads_out;
        d.bwd_overhead = bwd_overhead;
        return g.op1(d);
    };
    const auto conv_block = [&](const std::string& p, V x, std::size_t level, Bytes cin, Bytes cout) {
        const Bytes side = u.pixels >> level;
        for (std::size_t c = 0; c < u.convs; ++c) {
            const Bytes in_ch = c == 0 ? cin : cout;
            const Bytes out = act(level, cout);
            const double flops = double(u.batch * side * side * in_ch * cout * 9);
            x = op(numbered(p + "conv", c), {x}, out, mm * flops, 0, true, false, in_ch * cout * 9 * f);
            x = op(numbered(p + "bn", c), {x}, out, mv * double(out) * 2, 2 * cout * f, true, false, 0);
            x = op(numbered(p + "relu", c), {x}, out, mv * double(out) * 2, 0, false, true, 0);
        }
        return x;
    };
    V x = g.input("image", u.batch * 3 * u.pixels * u.pixels * f, false);
    std::vector<V> skips;
    Bytes ch = u.channels, in_ch = 3;
    for (std::size_t l = 0; l < u.levels; ++l) {
        x = conv_block(numbered("down", l, "."), x, l, in_ch, ch);
        skips.push_back(x);
        x = op(numbered("pool", l), {x}, act(l + 1, ch), mv * double(act(l, ch)), act(l + 1, ch) / 4, true, false, 0);
        in_ch = ch;
        ch *= 2;
    }
    x = conv_block("bottom.", x, u.levels, in_ch, ch);
    for (std::size_t l = u.levels; l-- > 0;) {
        const Bytes out_ch = ch / 2;
        const double flops = double(u.batch * (u.pixels >> l) * (u.pixels >> l) * ch * out_ch);
        const V up = op(numbered("up", l), {x}, act(l, out_ch), mm * flops, 0, true, false, ch * out_ch * 4 * f);
        const V cat = op(numbered("cat", l), {up, skips[l]}, act(l, 2 * out_ch), mv * double(act(l, 2 * out_ch)), 0, false,
                         false, 0);
        x = conv_block(numbered("dec", l, "."), cat, l, 2 * out_ch, out_ch);
        ch = out_ch;
    }
    const V head = op("head", {x}, act(0, 2), mm * double(u.batch * u.pixels * u.pixels * ch * 2), 0, true, false, 0);
    return g.finish(head, mv * double(act(0, 2)));
}

/// An encoder-decoder transformer as capture would see it: two inputs (source and target
/// embeddings), `encoder` self-attention layers, `decoder` layers of self-attention, cross-
/// attention reading the encoder's output, and an MLP, each sub-layer with a residual add
/// and dropout; the loss reads the decoder's output.
struct EncoderDecoderShape {
    std::size_t encoder = 3;
    std::size_t decoder = 3;
    Bytes batch = 4;
    Bytes source = 64;
    Bytes target = 48;
    Bytes width = 128;
    Bytes heads = 4;
};

inline Problem encoder_decoder_like(const EncoderDecoderShape& t, const std::string& name = "encdec") {
    OpLevelBuilder g(name);
    using V = OpLevelBuilder::Value;
    const Bytes f = 4;
    const double mm = 1e-9, mv = 2e-10;
    const auto act = [&](Bytes tokens) { return t.batch * tokens * t.width * f; };
    const auto op = [&](std::string n, std::vector<V> in, Bytes out, double time, Bytes saved, bool reads_in, bool reads_out,
                        Bytes bwd_overhead) {
        OpLevelBuilder::OpDesc d;
        d.name = std::move(n);
        d.inputs = std::move(in);
        d.outputs = {{d.name, out}};
        d.saved = saved;
        d.fwd_time = time;
        d.bwd_time = 2 * time;
        d.bwd_reads_inputs = reads_in;
        d.bwd_reads_outputs = reads_out;
        d.bwd_overhead = bwd_overhead;
        return g.op1(d);
    };
    const auto linear = [&](std::string n, V in, Bytes tokens) {
        return op(std::move(n), {in}, act(tokens), mm * double(t.batch * tokens * t.width * t.width), 0, true, false,
                  t.width * t.width * f);
    };
    // Attention of queries from `q` (tq tokens) over keys and values from `kv` (tk tokens).
    const auto attention = [&](const std::string& p, V q_in, Bytes tq, V kv_in, Bytes tk) {
        const V q = linear(p + "q", q_in, tq);
        const V k = linear(p + "k", kv_in, tk);
        const V v = linear(p + "v", kv_in, tk);
        const Bytes scores = t.batch * t.heads * tq * tk * f;
        const double sflops = double(t.batch * tq * tk * t.width);
        const V s = op(p + "scores", {q, k}, scores, mm * sflops, 0, true, false, 0);
        const V sm = op(p + "softmax", {s}, scores, mv * double(scores) * 2, 0, false, true, 0);
        const V dr = op(p + "drop", {sm}, scores, mv * double(scores) * 2, scores / f, false, false, 0);
        const V av = op(p + "av", {dr, v}, act(tq), mm * sflops, 0, true, false, 0);
        const V proj = linear(p + "proj", av, tq);
        return op(p + "add", {q_in, proj}, act(tq), mv * double(act(tq)) * 3, 0, false, false, 0);
    };
    const auto mlp = [&](const std::string& p, V x, Bytes tokens) {
        const V n = op(p + "ln", {x}, act(tokens), mv * double(act(tokens)) * 2, 2 * t.batch * tokens * f, true, false, 0);
        const V up = op(p + "fc1", {n}, 4 * act(tokens), mm * double(t.batch * tokens * t.width * 4 * t.width), 0, true,
                        false, 4 * t.width * t.width * f);
        const V ge = op(p + "gelu", {up}, 4 * act(tokens), mv * double(4 * act(tokens)) * 2, 0, true, false, 0);
        const V down = op(p + "fc2", {ge}, act(tokens), mm * double(t.batch * tokens * t.width * 4 * t.width), 0, true,
                          false, 4 * t.width * t.width * f);
        return op(p + "add", {x, down}, act(tokens), mv * double(act(tokens)) * 3, 0, false, false, 0);
    };
    V src = g.input("source", act(t.source), false);
    V tgt = g.input("target", act(t.target), false);
    for (std::size_t l = 0; l < t.encoder; ++l) {
        const std::string p = numbered("enc", l, ".");
        src = attention(p + "self.", src, t.source, src, t.source);
        src = mlp(p + "mlp.", src, t.source);
    }
    const V memory = op("enc.ln", {src}, act(t.source), mv * double(act(t.source)) * 2, 2 * t.batch * t.source * f, true,
                        false, 0);
    for (std::size_t l = 0; l < t.decoder; ++l) {
        const std::string p = numbered("dec", l, ".");
        tgt = attention(p + "self.", tgt, t.target, tgt, t.target);
        tgt = attention(p + "cross.", tgt, t.target, memory, t.source);
        tgt = mlp(p + "mlp.", tgt, t.target);
    }
    const V out = linear("head", tgt, t.target);
    return g.finish(out, mv * double(act(t.target)));
}

}  // namespace remat::testing
