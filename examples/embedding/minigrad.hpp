// minigrad — a tiny neural-network framework that is not LibTorch, and how it plugs into
// remat's execution engine (remat/exec/executor.hpp) to train under a memory budget.
//
// The framework: float matrices whose memory comes from a tracking allocator, layers with an
// explicit forward (with or without the state a backward needs) and backward, and a model
// that is a chain of such layers (Linear, ReLU, Dropout, a residual block). The integration:
//   - profile(): each layer measured with the framework's own allocator and clock into a
//     remat.chain/1 Chain (docs/formats.md §5 (chains)) and the exact problem predictions use;
//   - Backend: the ExecutionBackend the engine drives (exec/backend.hpp): activations,
//     saved states and gradients per layer, the parameter gradients collected until the step
//     completes, the random generator read and restored for dropout's replay;
//   - AllocatorProbe: the MemoryReader over the allocator.
// Standard library only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <remat/core/chain.hpp>
#include <remat/core/problem.hpp>
#include <remat/exec/executor.hpp>

namespace minigrad {

using remat::Bytes;

/// Counts every byte of every matrix: current use and the peak since the last reset.
class Allocator {
public:
    void take(Bytes bytes) {
        current_ += bytes;
        peak_ = std::max(peak_, current_);
    }
    void give_back(Bytes bytes) noexcept { current_ -= bytes; }
    [[nodiscard]] Bytes current() const noexcept { return current_; }
    [[nodiscard]] Bytes peak() const noexcept { return peak_; }
    void reset_peak() noexcept { peak_ = current_; }

private:
    Bytes current_ = 0;
    Bytes peak_ = 0;
};

/// A rows × cols matrix of floats; copies share the memory, which goes back to the allocator
/// when the last copy goes.
class Matrix {
public:
    Matrix() = default;
    Matrix(Allocator& allocator, std::size_t rows, std::size_t cols)
        : rows_(rows), cols_(cols), memory_(std::make_shared<Memory>(allocator, rows * cols)) {}

    [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
    [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
    [[nodiscard]] bool defined() const noexcept { return memory_ != nullptr; }
    [[nodiscard]] Bytes bytes() const noexcept {
        return memory_ ? static_cast<Bytes>(memory_->values.size() * sizeof(float)) : 0;
    }
    [[nodiscard]] float& at(std::size_t r, std::size_t c) { return memory_->values[r * cols_ + c]; }
    [[nodiscard]] float at(std::size_t r, std::size_t c) const { return memory_->values[r * cols_ + c]; }
    [[nodiscard]] const std::vector<float>& values() const { return memory_->values; }
    [[nodiscard]] std::vector<float>& values() { return memory_->values; }
    [[nodiscard]] Allocator& allocator() const { return *memory_->allocator; }

private:
    struct Memory {
        Memory(Allocator& a, std::size_t n) : allocator(&a), values(n, 0.0f) { a.take(static_cast<Bytes>(n * sizeof(float))); }
        ~Memory() { allocator->give_back(static_cast<Bytes>(values.size() * sizeof(float))); }
        Memory(const Memory&) = delete;
        Memory& operator=(const Memory&) = delete;
        Allocator* allocator;
        std::vector<float> values;
    };
    std::size_t rows_ = 0, cols_ = 0;
    std::shared_ptr<Memory> memory_;
};

// ---------------------------------------------------------------- layers

/// What a layer's backward needs from its forward (beyond its input and output).
using Saved = std::vector<Matrix>;

/// A layer's parameter gradients, one per parameter.
using Gradients = std::vector<Matrix>;

struct Linear {
    Matrix weight, bias;  // in × out, 1 × out
};
struct ReLU {};
struct Dropout {
    float p = 0.1f;
};
/// y = x + relu(x · w1) · w2
struct Residual {
    Matrix w1, w2;  // d × h, h × d
};
using Layer = std::variant<Linear, ReLU, Dropout, Residual>;

/// The layers of a model and the generator its dropout draws from.
struct Model {
    std::vector<Layer> layers;
    std::vector<std::string> names;
    std::mt19937 generator{1234};
};

/// y = x · w (+ bias per row).
[[nodiscard]] inline Matrix matmul(const Matrix& x, const Matrix& w, const Matrix* bias = nullptr) {
    Matrix y(x.allocator(), x.rows(), w.cols());
    for (std::size_t r = 0; r < x.rows(); ++r)
        for (std::size_t c = 0; c < w.cols(); ++c) {
            float sum = bias ? bias->at(0, c) : 0.0f;
            for (std::size_t k = 0; k < x.cols(); ++k) sum += x.at(r, k) * w.at(k, c);
            y.at(r, c) = sum;
        }
    return y;
}
/// x · wᵀ
[[nodiscard]] inline Matrix matmul_transposed(const Matrix& x, const Matrix& w) {
    Matrix y(x.allocator(), x.rows(), w.rows());
    for (std::size_t r = 0; r < x.rows(); ++r)
        for (std::size_t c = 0; c < w.rows(); ++c) {
            float sum = 0.0f;
            for (std::size_t k = 0; k < x.cols(); ++k) sum += x.at(r, k) * w.at(c, k);
            y.at(r, c) = sum;
        }
    return y;
}
/// xᵀ · g
[[nodiscard]] inline Matrix transposed_matmul(const Matrix& x, const Matrix& g) {
    Matrix y(x.allocator(), x.cols(), g.cols());
    for (std::size_t a = 0; a < x.cols(); ++a)
        for (std::size_t b = 0; b < g.cols(); ++b) {
            float sum = 0.0f;
            for (std::size_t r = 0; r < x.rows(); ++r) sum += x.at(r, a) * g.at(r, b);
            y.at(a, b) = sum;
        }
    return y;
}

struct Forward {
    Matrix output;
    Saved saved;
};

// Runs a layer; with `keep`, also returns what its backward needs.
[[nodiscard]] inline Forward forward(Layer& layer, const Matrix& x, std::mt19937& generator, bool keep) {
    if (auto* l = std::get_if<Linear>(&layer)) return {matmul(x, l->weight, &l->bias), {}};
    if (std::holds_alternative<ReLU>(layer)) {
        Matrix y(x.allocator(), x.rows(), x.cols());
        for (std::size_t i = 0; i < y.values().size(); ++i) y.values()[i] = std::max(0.0f, x.values()[i]);
        return {y, {}};
    }
    if (const auto* d = std::get_if<Dropout>(&layer)) {
        Matrix mask(x.allocator(), x.rows(), x.cols());
        std::bernoulli_distribution keep_it(1.0 - d->p);
        for (float& m : mask.values()) m = keep_it(generator) ? 1.0f / (1.0f - d->p) : 0.0f;
        Matrix y(x.allocator(), x.rows(), x.cols());
        for (std::size_t i = 0; i < y.values().size(); ++i) y.values()[i] = x.values()[i] * mask.values()[i];
        return {y, keep ? Saved{mask} : Saved{}};
    }
    auto& r = std::get<Residual>(layer);
    Matrix h = matmul(x, r.w1);
    for (float& v : h.values()) v = std::max(0.0f, v);
    Matrix y = matmul(h, r.w2);
    for (std::size_t i = 0; i < y.values().size(); ++i) y.values()[i] += x.values()[i];
    return {y, keep ? Saved{h} : Saved{}};
}

struct Backward {
    Matrix input_gradient;
    Gradients parameters;
};

// The gradient of the layer's input and of its parameters, from its input x, output y, saved
// state and the gradient g of its output.
[[nodiscard]] inline Backward backward(const Layer& layer, const Matrix& x, const Matrix& y, const Saved& saved,
                                       const Matrix& g) {
    if (const auto* l = std::get_if<Linear>(&layer)) {
        Matrix gb(g.allocator(), 1, g.cols());
        for (std::size_t r = 0; r < g.rows(); ++r)
            for (std::size_t c = 0; c < g.cols(); ++c) gb.at(0, c) += g.at(r, c);
        return {matmul_transposed(g, l->weight), {transposed_matmul(x, g), gb}};
    }
    if (std::holds_alternative<ReLU>(layer)) {
        Matrix gx(g.allocator(), g.rows(), g.cols());
        for (std::size_t i = 0; i < gx.values().size(); ++i) gx.values()[i] = y.values()[i] > 0.0f ? g.values()[i] : 0.0f;
        return {gx, {}};
    }
    if (std::holds_alternative<Dropout>(layer)) {
        Matrix gx(g.allocator(), g.rows(), g.cols());
        for (std::size_t i = 0; i < gx.values().size(); ++i) gx.values()[i] = g.values()[i] * saved[0].values()[i];
        return {gx, {}};
    }
    const auto& r = std::get<Residual>(layer);
    const Matrix& h = saved[0];
    Matrix gw2 = transposed_matmul(h, g);
    Matrix gh = matmul_transposed(g, r.w2);
    for (std::size_t i = 0; i < gh.values().size(); ++i)
        if (h.values()[i] <= 0.0f) gh.values()[i] = 0.0f;
    Matrix gw1 = transposed_matmul(x, gh);
    Matrix gx = matmul_transposed(gh, r.w1);
    for (std::size_t i = 0; i < gx.values().size(); ++i) gx.values()[i] += g.values()[i];
    return {gx, {gw1, gw2}};
}

/// The parameters of a layer, in the order its gradients come.
[[nodiscard]] inline std::vector<Matrix*> parameters(Layer& layer) {
    if (auto* l = std::get_if<Linear>(&layer)) return {&l->weight, &l->bias};
    if (auto* r = std::get_if<Residual>(&layer)) return {&r->w1, &r->w2};
    return {};
}

[[nodiscard]] inline Matrix random_matrix(Allocator& a, std::size_t rows, std::size_t cols, std::mt19937& g, float scale) {
    Matrix m(a, rows, cols);
    std::normal_distribution<float> normal(0.0f, scale);
    for (float& v : m.values()) v = normal(g);
    return m;
}

/// An MLP with residual blocks and dropout: in → width, (residual, relu, dropout) × blocks, → out.
[[nodiscard]] inline Model make_model(Allocator& a, std::size_t in, std::size_t width, std::size_t hidden, std::size_t blocks,
                                      std::size_t out, std::uint32_t seed = 7) {
    std::mt19937 g(seed);
    Model m;
    const auto add = [&m](Layer l, std::string name) {
        m.layers.push_back(std::move(l));
        m.names.push_back(std::move(name));
    };
    const auto scale = [](std::size_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
    add(Linear{random_matrix(a, in, width, g, scale(in)), random_matrix(a, 1, width, g, 0.1f)}, "linear0");
    for (std::size_t b = 0; b < blocks; ++b) {
        add(Residual{random_matrix(a, width, hidden, g, scale(width)), random_matrix(a, hidden, width, g, 0.5f * scale(hidden))},
            "residual" + std::to_string(b));
        add(ReLU{}, "relu" + std::to_string(b));
        add(Dropout{0.1f}, "dropout" + std::to_string(b));
    }
    add(Linear{random_matrix(a, width, out, g, scale(width)), random_matrix(a, 1, out, g, 0.1f)}, "head");
    return m;
}

// ---------------------------------------------------------------- plain training

/// Σ (y − t)² / rows and its gradient.
struct Loss {
    double value = 0.0;
    Matrix gradient;
};
[[nodiscard]] inline Loss mse(const Matrix& y, const Matrix& target) {
    Loss l;
    l.gradient = Matrix(y.allocator(), y.rows(), y.cols());
    for (std::size_t i = 0; i < y.values().size(); ++i) {
        const float d = y.values()[i] - target.values()[i];
        l.value += static_cast<double>(d) * d / static_cast<double>(y.rows());
        l.gradient.values()[i] = 2.0f * d / static_cast<float>(y.rows());
    }
    return l;
}

/// The reference: every activation and saved state kept, then backward through all layers.
/// Returns the parameter gradients (per layer) and the loss.
struct PlainStep {
    std::vector<Gradients> gradients;
    double loss = 0.0;
};
[[nodiscard]] inline PlainStep plain_step(Model& m, const Matrix& x, const Matrix& target) {
    std::vector<Matrix> acts{x};
    std::vector<Saved> saved;
    for (Layer& l : m.layers) {
        Forward f = forward(l, acts.back(), m.generator, true);
        acts.push_back(f.output);
        saved.push_back(std::move(f.saved));
    }
    Loss loss = mse(acts.back(), target);
    PlainStep out;
    out.loss = loss.value;
    out.gradients.resize(m.layers.size());
    Matrix g = loss.gradient;
    for (std::size_t i = m.layers.size(); i-- > 0;) {
        Backward b = backward(m.layers[i], acts[i], acts[i + 1], saved[i], g);
        out.gradients[i] = std::move(b.parameters);
        g = b.input_gradient;
    }
    return out;
}

// ---------------------------------------------------------------- remat integration

/// The chain remat plans on, and the problem predictions use (each forward with its own
/// measured overhead; the chain has one per stage, the larger).
struct Profile {
    remat::Chain chain;
    remat::Problem problem = remat::ProblemBuilder("unbuilt").build();
};

namespace detail {

template <class F>
double seconds_of(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

/// Measures every layer on `sample` with the framework's allocator: output and saved bytes,
/// the transient bytes of each pass (parameter gradients count in the backward's, as they
/// exist while it runs), and times. The generator is put back afterwards.
[[nodiscard]] inline Profile profile(Model& m, Allocator& a, const Matrix& sample) {
    const std::mt19937 generator = m.generator;
    Profile out;
    out.chain = remat::Chain{"minigrad", sample.bytes(), {}};
    std::vector<Bytes> fwd_nograd, fwd_grad;
    Matrix x = sample;
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
        remat::Stage stage{m.names[l], 0.0, 0.0, 0, 0, 0, 0};
        a.reset_peak();
        Bytes before = a.current();
        Forward plain;
        stage.fwd_time = detail::seconds_of([&] { plain = forward(m.layers[l], x, m.generator, false); });
        stage.out_bytes = plain.output.bytes();
        fwd_nograd.push_back(a.peak() - before - stage.out_bytes);
        plain = Forward{};
        a.reset_peak();
        before = a.current();
        Forward kept = forward(m.layers[l], x, m.generator, true);
        Bytes saved = 0;
        for (const Matrix& s : kept.saved) saved += s.bytes();
        stage.saved_bytes = stage.out_bytes + saved;
        fwd_grad.push_back(a.peak() - before - stage.out_bytes - saved);
        stage.fwd_overhead = std::max(fwd_nograd.back(), fwd_grad.back());
        Matrix g(a, kept.output.rows(), kept.output.cols());
        a.reset_peak();
        before = a.current();
        Backward b;
        stage.bwd_time = detail::seconds_of([&] { b = backward(m.layers[l], x, kept.output, kept.saved, g); });
        stage.bwd_overhead = a.peak() - before - b.input_gradient.bytes();
        out.chain.stages.push_back(stage);
        x = kept.output;
    }
    m.generator = generator;
    const remat::Problem chain_problem = remat::to_problem(out.chain);
    std::vector<Bytes> overhead;
    for (const remat::Op& op : chain_problem.all_ops()) overhead.push_back(op.overhead);
    const remat::ChainIds ids = remat::chain_ids(out.chain.length());
    for (std::size_t l = 1; l <= out.chain.length(); ++l) {
        overhead[ids.fwd[l].index] = fwd_nograd[l - 1];
        overhead[ids.fwd_grad[l].index] = fwd_grad[l - 1];
    }
    out.problem = chain_problem.with_overheads(overhead);
    return out;
}

/// The execution table of a chain of L layers: unit l for layer l's ops and data.
[[nodiscard]] inline remat::ExecutionTable chain_table(const remat::Problem& p, std::size_t layers) {
    remat::ExecutionTable t;
    t.units = layers + 1;
    const remat::ChainIds ids = remat::chain_ids(layers);
    t.op_role.assign(p.op_count(), remat::ExecOpRole::forward);
    t.op_unit.assign(p.op_count(), 0);
    t.data_role.assign(p.data_count(), remat::ExecDataRole::activation);
    t.data_unit.assign(p.data_count(), 0);
    for (std::size_t l = 1; l <= layers; ++l) {
        t.op_role[ids.fwd_grad[l].index] = remat::ExecOpRole::forward_grad;
        t.op_role[ids.bwd[l].index] = remat::ExecOpRole::backward;
        for (const remat::OpId k : {ids.fwd[l], ids.fwd_grad[l], ids.bwd[l]}) t.op_unit[k.index] = l;
        t.data_role[ids.s[l].index] = remat::ExecDataRole::saved;
        t.data_unit[ids.s[l].index] = t.data_unit[ids.a[l].index] = l;
    }
    for (std::size_t l = 0; l <= layers; ++l) {
        t.data_role[ids.g[l].index] = remat::ExecDataRole::gradient;
        t.data_unit[ids.g[l].index] = l;
    }
    t.op_role[ids.loss.index] = remat::ExecOpRole::loss;
    return t;
}

/// The engine's probe over the allocator.
struct AllocatorProbe {
    Allocator* allocator;
    [[nodiscard]] Bytes current() const { return allocator->current(); }
    [[nodiscard]] Bytes peak() const { return allocator->peak(); }
    void reset_peak() { allocator->reset_peak(); }
};

/// One step's state for the engine: activations a_l, saved states s_l, gradients g_l of a
/// chain of layers (data ids as docs/formats.md §5 (chains) numbers them), parameter gradients collected.
class Backend {
public:
    using RngState = std::mt19937;

    Backend(Model& m, const Matrix& input) : m_(&m) {
        const std::size_t L = m.layers.size();
        ids_ = remat::chain_ids(L);
        a_.resize(L + 1);
        s_.resize(L + 1);
        g_.resize(L + 1);
        pending_.resize(L + 1);
        a_[0] = input;
        for (std::size_t d = 0; d < 3 * L + 2; ++d) slot_.emplace_back();
        for (std::size_t l = 0; l <= L; ++l) {
            slot_[ids_.a[l].index] = {Kind::activation, l};
            slot_[ids_.g[l].index] = {Kind::gradient, l};
            if (l > 0) slot_[ids_.s[l].index] = {Kind::saved, l};
        }
    }

    [[nodiscard]] RngState capture_rng() const { return m_->generator; }
    void restore_rng(const RngState& state) const { m_->generator = state; }
    [[nodiscard]] bool random(std::size_t l) const { return l > 0 && std::holds_alternative<Dropout>(m_->layers[l - 1]); }

    void forward(std::size_t l, bool with_grad, bool) {
        Forward f = minigrad::forward(m_->layers[l - 1], a_[l - 1], m_->generator, with_grad);
        a_[l] = std::move(f.output);
        if (with_grad) s_[l] = std::move(f.saved);
    }
    void backward(std::size_t l) {
        Backward b = minigrad::backward(m_->layers[l - 1], a_[l - 1], a_[l], s_[l], g_[l]);
        g_[l - 1] = std::move(b.input_gradient);
        pending_[l] = std::move(b.parameters);
    }
    void release(remat::DataId d) {
        const auto [kind, l] = slot_.at(d.index);
        if (kind == Kind::activation) a_[l] = Matrix();
        if (kind == Kind::saved) s_[l].clear();
        if (kind == Kind::gradient) g_[l] = Matrix();
    }
    [[nodiscard]] Bytes pending_gradient_bytes() const {
        Bytes total = 0;
        for (const Gradients& gs : pending_)
            for (const Matrix& g : gs) total += g.bytes();
        return total;
    }
    [[nodiscard]] Bytes caller_bytes() const { return 0; }
    void begin_step() { generator_ = m_->generator; }
    void commit() { committed_ = std::move(pending_); }
    void rollback(bool generators_too) noexcept {
        if (generators_too) m_->generator = generator_;
    }
    void clear() noexcept {
        for (auto& a : a_) a = Matrix();
        for (auto& s : s_) s.clear();
        for (auto& g : g_) g = Matrix();
        for (auto& p : pending_) p.clear();
    }
    void synchronize() {}
    [[nodiscard]] std::string describe(std::size_t l) const {
        return l > 0 ? " (layer '" + m_->names[l - 1] + "')" : "";
    }

    [[nodiscard]] const Matrix& output() const { return a_.back(); }
    /// The parameter gradients layer l's backward collected (until commit()).
    [[nodiscard]] Gradients& collected(std::size_t l) { return pending_.at(l); }
    void set_output_gradient(Matrix g) { g_.back() = std::move(g); }
    /// After a completed step: the parameter gradients per layer (index l − 1).
    [[nodiscard]] std::vector<Gradients> take_gradients() {
        std::vector<Gradients> out(committed_.begin() + 1, committed_.end());
        committed_.clear();
        return out;
    }

private:
    enum class Kind : unsigned char { activation, saved, gradient };
    Model* m_;
    remat::ChainIds ids_;
    std::vector<std::pair<Kind, std::size_t>> slot_;
    std::vector<Matrix> a_;
    std::vector<Saved> s_;
    std::vector<Matrix> g_;
    std::vector<Gradients> pending_, committed_;
    RngState generator_;
};

static_assert(remat::ExecutionBackend<Backend>);
static_assert(remat::MemoryReader<AllocatorProbe>);

}  // namespace minigrad
