// remat/torch/detail/runtime.hpp — the primitives the executors and the profiler share.
//
// docs/design.md §6 (execution engine): a per-stage autograd cut (each stage runs on a detached leaf copy of its
// input and is back-propagated on its own), "free" as releasing the storage while keeping
// every tensor handle, replay of the random generator for recomputations, and buffers
// (running statistics) restored around recomputations. The profiler measures with exactly
// these functions, which is what makes a plan's predicted peak the measured one
// (docs/design.md §1, principle 2).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#if REMAT_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "../../core/errors.hpp"
#include "compat.hpp"
#include "../stage.hpp"

namespace remat::torch {

/// An exception's message without the C++ backtrace LibTorch appends to its own errors.
[[nodiscard]] inline std::string error_message(const std::exception& e) {
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
    return e.what();
}

}  // namespace remat::torch

namespace remat::torch::detail {

using Clock = std::chrono::steady_clock;

/// Waits for queued device work, so that wall-clock time measures the work itself.
inline void synchronize([[maybe_unused]] const c10::Device& device) {
#if REMAT_WITH_CUDA
    if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

/// The device of the first defined tensor among `tensors` (a model's parameters and buffers),
/// if any.
[[nodiscard]] inline std::optional<c10::Device> device_of_tensors(const std::vector<at::Tensor>& tensors) {
    for (const at::Tensor& t : tensors)
        if (t.defined()) return t.device();
    return std::nullopt;
}

/// Throws InvalidInput, naming both devices, when an input is not on the model's device: the
/// plan would otherwise be made again for it and fail deep inside an op.
inline void check_input_device(const std::optional<c10::Device>& model_device, const at::Tensor& input,
                               const std::string& who) {
    if (!model_device || !input.defined() || input.device() == *model_device) return;
    throw InvalidInput(who + ": the model is on " + model_device->str() + " but an input is on " +
                       input.device().str() + "; move the input to the model's device (input.to(" +
                       model_device->str() + ")), or the model with model->to(device) and checkpoint it again");
}

/// Whether autograd differentiates a tensor of this type: floating point or complex (an FFT's
/// spectrum between two real layers).
[[nodiscard]] inline bool differentiable_type(const at::Tensor& t) { return t.is_floating_point() || t.is_complex(); }

/// Bytes that releasing this tensor's storage gives back.
[[nodiscard]] inline Bytes storage_bytes(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return 0;
    return static_cast<Bytes>(t.storage().nbytes());
}

/// Bytes that releasing all these tensors would give back: a storage several of them share
/// counts once (a gradient may alias another).
[[nodiscard]] inline Bytes distinct_storage_bytes(const std::vector<at::Tensor>& tensors) {
    Bytes total = 0;
    std::unordered_set<const void*> counted;
    for (const at::Tensor& t : tensors)
        if (t.defined() && t.has_storage() && counted.insert(t.storage().unsafeGetStorageImpl()).second)
            total += storage_bytes(t);
    return total;
}

// ------------------------------------------------------------------------------ random numbers

/// The state of the generators a stage may draw from: the CPU default generator, and the
/// default CUDA generator of the device when the stage runs there (torch.utils.checkpoint
/// stashes the same ones). Stored outside the tensor allocator so it costs no tracked bytes.
class RngState {
public:
    [[nodiscard]] static RngState capture(const c10::Device& device) {
        RngState state;
        state.cpu_ = read(at::detail::getDefaultCPUGenerator());
#if REMAT_WITH_CUDA
        if (device.is_cuda()) {
            state.cuda_device_ = device.index() < 0 ? c10::cuda::current_device() : device.index();
            state.cuda_ = read(at::cuda::detail::getDefaultCUDAGenerator(state.cuda_device_));
        }
#else
        (void)device;
#endif
        return state;
    }

    void restore() const {
        write(at::detail::getDefaultCPUGenerator(), cpu_);
#if REMAT_WITH_CUDA
        if (!cuda_.empty()) write(at::cuda::detail::getDefaultCUDAGenerator(cuda_device_), cuda_);
#endif
    }

    [[nodiscard]] bool empty() const noexcept { return cpu_.empty(); }
    friend bool operator==(const RngState&, const RngState&) = default;

private:
    static std::vector<std::uint8_t> read(const at::Generator& generator) {
        at::Generator gen = generator;
        std::lock_guard<std::mutex> lock(gen.mutex());
        const at::Tensor state = gen.get_state().contiguous();
        const auto* bytes = state.data_ptr<std::uint8_t>();
        return {bytes, bytes + state.numel()};
    }
    static void write(const at::Generator& generator, const std::vector<std::uint8_t>& bytes) {
        at::Generator gen = generator;
        std::lock_guard<std::mutex> lock(gen.mutex());
        // from_blob does not allocate; set_state copies what it needs.
        auto* data = const_cast<std::uint8_t*>(bytes.data());
        gen.set_state(at::from_blob(data, {static_cast<std::int64_t>(bytes.size())}, at::kByte));
    }

    std::vector<std::uint8_t> cpu_;
    std::vector<std::uint8_t> cuda_;
    c10::DeviceIndex cuda_device_ = -1;
};

/// Runs with `replay` as the generators' state, then puts back the state they had, so that a
/// recomputation draws the numbers of the first run and leaves the sequence untouched.
class RngReplay {
public:
    RngReplay(const RngState& replay, const c10::Device& device) : saved_(RngState::capture(device)) { replay.restore(); }
    ~RngReplay() { saved_.restore(); }
    RngReplay(const RngReplay&) = delete;
    RngReplay& operator=(const RngReplay&) = delete;

private:
    RngState saved_;
};

// ------------------------------------------------------------------------------------ buffers

/// Copies of buffers, to put their values back. Restoring writes through variable_data(),
/// which has its own version counter: batch norm saves its running statistics for the
/// backward, and a visible in-place write would fail that backward's version check.
class BufferSnapshot {
public:
    BufferSnapshot() = default;
    explicit BufferSnapshot(const std::vector<at::Tensor>& buffers) {
        const at::NoGradGuard no_grad;
        for (const at::Tensor& b : buffers) copies_.push_back(b.defined() ? b.detach().clone() : at::Tensor());
    }
    void save(const std::vector<at::Tensor>& buffers) {
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < buffers.size() && i < copies_.size(); ++i)
            if (copies_[i].defined()) copies_[i].copy_(buffers[i].detach());
    }
    void restore(const std::vector<at::Tensor>& buffers) const {
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < buffers.size() && i < copies_.size(); ++i)
            if (copies_[i].defined()) buffers[i].variable_data().copy_(copies_[i]);
    }
    [[nodiscard]] bool empty() const noexcept { return copies_.empty(); }
    /// Whether buffer `i` still holds the values saved here.
    [[nodiscard]] bool same_as(std::size_t i, const at::Tensor& buffer) const {
        if (i >= copies_.size() || !copies_[i].defined()) return true;
        const at::NoGradGuard no_grad;
        return at::equal(copies_[i], buffer.detach());
    }

private:
    std::vector<at::Tensor> copies_;
};

/// Saves the stage's buffers into `snapshot` now and restores them when it goes out of scope.
class BufferGuard {
public:
    BufferGuard(BufferSnapshot& snapshot, const std::vector<at::Tensor>& buffers)
        : snapshot_(snapshot), buffers_(buffers) {
        snapshot_.save(buffers_);
    }
    ~BufferGuard() { snapshot_.restore(buffers_); }
    BufferGuard(const BufferGuard&) = delete;
    BufferGuard& operator=(const BufferGuard&) = delete;

private:
    BufferSnapshot& snapshot_;
    const std::vector<at::Tensor>& buffers_;
};

// ------------------------------------------------------------------------------ activations

/// One activation a_l of a step. Its identity is a storage: every tensor that shows a_l —
/// the executor's handle, the next stage's detached input and the views its autograd graph
/// saved, the stage's own saved output — shares it. Freeing releases that storage's memory
/// while every handle stays; recomputing moves the new memory into it. When a recomputation
/// with autograd creates a second storage that its graph saved, both storages show the same
/// memory (one owns it, the other points at it), so neither graph notices.
class Activation {
public:
    [[nodiscard]] bool live() const noexcept { return live_; }
    [[nodiscard]] bool defined() const noexcept { return tensor_.defined(); }
    /// The activation (no autograd history). Precondition: live().
    [[nodiscard]] const at::Tensor& tensor() const noexcept { return tensor_; }

    /// The caller's tensor (the chain input): never released, only forgotten.
    void set_external(const at::Tensor& t) {
        clear();
        tensor_ = t.detach();
        live_ = true;
        exposed_ = true;
    }

    /// From now on the caller holds a view of this activation: releasing it only drops the
    /// executor's references, so the caller's tensor stays valid.
    void expose() noexcept { exposed_ = true; }

    /// A new production of the value. `graph_holds_storage`: an autograd graph of the stage
    /// keeps the produced storage (a run with grad), so it must go on showing the memory.
    void install(const at::Tensor& produced, bool graph_holds_storage, const std::string& stage) {
        if (!produced.has_storage())
            throw ExecutionError("stage '" + stage + "' returned a tensor without storage (" +
                                 std::string(produced.toString()) + "); the chain executor needs dense tensors");
        if (live_) release();
        if (!tensor_.defined()) {
            tensor_ = produced.detach();
            owner_ = tensor_.storage();
            nbytes_ = owner_.nbytes();
            live_ = true;
            return;
        }
        if (produced.sizes() != tensor_.sizes() || produced.strides() != tensor_.strides() ||
            produced.storage_offset() != tensor_.storage_offset() || produced.dtype() != tensor_.dtype() ||
            produced.storage().nbytes() != nbytes_)
            throw ExecutionError("stage '" + stage +
                                 "' recomputed its output with a different shape, layout or dtype than its first run; "
                                 "a stage must be a deterministic function of its input to be recomputed");
        const c10::Storage& fresh = produced.storage();
        const c10::Device device = fresh.device();
        at::DataPtr memory = fresh.set_data_ptr(at::DataPtr(nullptr, device));
        void* raw = memory.get();
        owner_.set_data_ptr_noswap(std::move(memory));
        owner_.set_nbytes(nbytes_);
        for (const c10::Storage& alias : aliases_) {
            alias.set_data_ptr_noswap(at::DataPtr(raw, device));
            alias.set_nbytes(nbytes_);
        }
        if (graph_holds_storage) {
            fresh.set_data_ptr_noswap(at::DataPtr(raw, device));
            fresh.set_nbytes(nbytes_);
            aliases_.push_back(fresh);
        }
        live_ = true;
    }

    /// Frees the memory now (or, once exposed, forgets it).
    void release() {
        if (!live_) return;
        live_ = false;
        if (exposed_) {
            forget();
            return;
        }
        const c10::Device device = owner_.device();
        std::vector<c10::Storage> still_used;
        for (const c10::Storage& alias : aliases_) {
            alias.set_data_ptr_noswap(at::DataPtr(nullptr, device));
            alias.set_nbytes(std::size_t{0});
            if (alias.use_count() > 1) still_used.push_back(alias);
        }
        aliases_ = std::move(still_used);
        owner_.set_data_ptr_noswap(at::DataPtr(nullptr, device));  // the allocator gets it back here
        owner_.set_nbytes(std::size_t{0});
    }

    /// Drops every reference (end of a step): memory goes back once no graph holds it.
    void clear() noexcept {
        forget();
        live_ = false;
        exposed_ = false;
    }

private:
    void forget() noexcept {
        tensor_ = at::Tensor();
        owner_ = c10::Storage();
        aliases_.clear();
        nbytes_ = 0;
    }

    at::Tensor tensor_;
    c10::Storage owner_;
    std::vector<c10::Storage> aliases_;
    std::size_t nbytes_ = 0;
    bool live_ = false;
    bool exposed_ = false;
};

// ------------------------------------------------------------------------------ stage runs

/// The autograd graph of one stage run with grad: its detached input leaf and its output.
struct StageGraph {
    at::Tensor input;
    at::Tensor output;
    [[nodiscard]] bool live() const noexcept { return output.defined(); }
    void clear() noexcept {
        input = at::Tensor();
        output = at::Tensor();
    }
};

/// Runs a stage with no autograd graph.
[[nodiscard]] inline at::Tensor run_no_grad(const ChainStage& stage, const at::Tensor& input) {
    const at::NoGradGuard no_grad;
    return stage.forward(input);
}

/// Runs a stage on a detached leaf of its input, so that its graph is its own.
[[nodiscard]] inline StageGraph run_with_grad(const ChainStage& stage, const at::Tensor& input, bool input_requires_grad) {
    const ::torch::autograd::AutoGradMode grad_mode(true);
    StageGraph graph;
    graph.input = input.detach();
    if (input_requires_grad) graph.input.requires_grad_(true);
    graph.output = stage.forward(graph.input);
    return graph;
}

/// Back-propagates one stage: returns the gradient of its input (undefined when not wanted)
/// and writes the gradient of each trainable parameter into `parameter_grads` (undefined
/// when the stage does not reach it). The graph's saved tensors are freed as it runs, as
/// in plain autograd, unless `keep_saved` (then they go when the graph does).
[[nodiscard]] inline at::Tensor run_backward(StageGraph& graph, const at::Tensor& grad_output, bool want_input_grad,
                                             const std::vector<at::Tensor>& trainable,
                                             std::vector<at::Tensor>& parameter_grads, bool keep_saved = false) {
    parameter_grads.assign(trainable.size(), at::Tensor());
    if (!graph.output.requires_grad()) return at::Tensor();
    std::vector<at::Tensor> inputs;
    inputs.reserve(trainable.size() + 1);
    const bool input_grad = want_input_grad && graph.input.requires_grad();
    if (input_grad) inputs.push_back(graph.input);
    inputs.insert(inputs.end(), trainable.begin(), trainable.end());
    if (inputs.empty()) return at::Tensor();
    std::vector<at::Tensor> grads = ::torch::autograd::grad({graph.output}, inputs, {grad_output},
                                                            /*retain_graph=*/keep_saved, /*create_graph=*/false,
                                                            /*allow_unused=*/true);
    const std::size_t first = input_grad ? 1 : 0;
    for (std::size_t i = 0; i < trainable.size(); ++i) parameter_grads[i] = std::move(grads[first + i]);
    return input_grad ? std::move(grads[0]) : at::Tensor();
}

/// Runs `work` on the thread where autograd runs this device's backward: the engine's thread
/// for the device on a GPU, the calling thread on the CPU. Why: cuBLAS and cuBLASLt give each
/// thread a workspace of their own (tens of MiB), allocated through the caching allocator at
/// that thread's first call and kept for the life of the process. The drop-in modules run
/// recomputations inside autograd's backward, on that thread; profiling runs the model there
/// once first, so that no step is charged for this one-time allocation and no op's measured
/// overhead contains it (docs/design.md §6, "Library workspaces").
template <class Work>
void run_on_backward_thread(const c10::Device& device, Work&& work) {
    const at::Tensor seed = at::zeros({1}, at::TensorOptions().device(device)).requires_grad_(true);
    at::Tensor relay;
    {
        const ::torch::autograd::AutoGradMode grad_mode(true);
        relay = seed * 2;  // not a leaf: a hook on it runs inside the backward
    }
    std::exception_ptr failure;
    relay.register_hook([&](const at::Tensor& grad) {
        try {
            work();
        } catch (...) {
            failure = std::current_exception();
        }
        return grad;
    });
    ::torch::autograd::backward({relay.sum()});
    if (failure) std::rethrow_exception(failure);
}

/// Runs a step's backward phase, `work`, where autograd runs the backward of `device`. A step
/// issued from the caller's thread back-propagates each op group with its own call into the
/// autograd engine. On a GPU the engine runs every such call on its device thread: the caller
/// hands the work over and sleeps until it is done, two thread wake-ups per call (tens of
/// microseconds), per op group, where a model's own backward pays them once per step. A call
/// made on that thread runs there at once (a nested backward), so the whole phase runs there,
/// as the drop-in modules' backward already does (inside autograd's backward). On the CPU the
/// engine runs on the calling thread anyway: `work` runs directly, with nothing allocated
/// around it (the CPU's measured peaks are exact).
template <class Work>
void run_backward_phase(const c10::Device& device, Work&& work) {
    if (device.is_cpu()) {
        work();
        return;
    }
    run_on_backward_thread(device, std::forward<Work>(work));
}

// ------------------------------------------------------------------------------ parameters

/// The trainable parameters of a chain, each once, and which of them each stage uses.
struct ParameterTable {
    std::vector<at::Tensor> parameters;
    std::vector<std::vector<std::size_t>> of_stage;  ///< indices into `parameters`
    std::vector<std::vector<at::Tensor>> trainable;  ///< per stage, the tensors themselves

    explicit ParameterTable(const StageList& stages) {
        of_stage.resize(stages.size());
        trainable.resize(stages.size());
        for (std::size_t l = 0; l < stages.size(); ++l) {
            for (const at::Tensor& p : stages[l].parameters) {
                if (!p.defined() || !p.requires_grad()) continue;
                std::size_t index = parameters.size();
                for (std::size_t k = 0; k < parameters.size(); ++k)
                    if (parameters[k].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) index = k;
                if (index == parameters.size()) parameters.push_back(p);
                bool listed = false;
                for (const std::size_t k : of_stage[l]) listed = listed || k == index;
                if (listed) continue;
                of_stage[l].push_back(index);
                trainable[l].push_back(p);
            }
        }
    }
};

/// Everything of a stage's output that could make releasing it unsafe: a stage that returns
/// (a view of) its input, a parameter or a buffer would have that tensor's memory freed.
inline void check_output_is_fresh(const ChainStage& stage, const at::Tensor& input, const at::Tensor& output) {
    if (!output.defined())
        throw InvalidInput("stage '" + stage.name + "' returned an undefined tensor; every stage must return its output");
    if (!output.has_storage()) return;
    const auto* impl = output.storage().unsafeGetStorageImpl();
    const auto same = [impl](const at::Tensor& t) {
        return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == impl;
    };
    if (same(input))
        throw InvalidInput("stage '" + stage.name +
                           "' returns a view of (or writes in place into) its input; fuse it with a neighbouring "
                           "stage (remat::torch::fuse_aliasing_stages does it for you)");
    for (const at::Tensor& p : stage.parameters)
        if (same(p)) throw InvalidInput("stage '" + stage.name + "' returns (a view of) one of its parameters");
    for (const at::Tensor& b : stage.buffers)
        if (same(b)) throw InvalidInput("stage '" + stage.name + "' returns (a view of) one of its buffers");
}

/// Gives a tensor's memory back while the tensor, its storage and its shape stay (the storage
/// is left empty).
inline void release_memory(const at::Tensor& t) {
    c10::Storage storage = t.storage();
    storage.set_data_ptr_noswap(at::DataPtr(nullptr, storage.device()));
    storage.set_nbytes(std::size_t{0});
}

/// Memory a step has let go of that someone else still holds, counted outside the plan while it
/// lives: outputs the caller keeps after the plan frees them, output gradients that autograd
/// keeps until the step's backward returns.
class HeldOutside {
public:
    void add(const at::Tensor& t) {
        if (t.defined() && t.has_storage()) items_.emplace_back(t.storage().getWeakStorageImpl(), storage_bytes(t));
    }
    [[nodiscard]] Bytes bytes() const noexcept {
        Bytes total = 0;
        for (const auto& [storage, bytes] : items_)
            if (storage.use_count() > 0) total += bytes;
        return total;
    }
    void clear() noexcept { items_.clear(); }

private:
    std::vector<std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, Bytes>> items_;
};

/// Drops a planned step's reference to the gradient of one of its outputs, which the plan frees.
/// When the gradient came from autograd into a custom Function's backward (`from_autograd`) and
/// autograd keeps its own reference until that backward returns (LibTorch 1.13, compat.hpp),
/// the memory is given back now if that reference is the only other one (no other tensor on
/// its memory, no hook that kept it): autograd then drops an empty tensor, which it does not
/// read. Memory that someone else still holds is counted in `held`.
inline void release_output_gradient(at::Tensor& gradient, [[maybe_unused]] bool from_autograd, HeldOutside& held) {
    if (!gradient.defined()) return;
    if constexpr (compat::custom_function_keeps_output_gradients) {
        if (from_autograd && gradient.use_count() == 2 && gradient.has_storage() &&
            gradient.storage().use_count() == 1 && !gradient.is_view())
            release_memory(gradient);
    }
    held.add(gradient);
    gradient = at::Tensor();
}

}  // namespace remat::torch::detail
