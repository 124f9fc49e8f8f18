// remat/torch/offload.hpp — a LibTorch chain trained by an offloading plan (docs/formats.md
// §11, docs/design.md §4.12): the stages of a checkpointed Sequential (or functor stages), the
// loss and one SGD-with-momentum step per stage run inside the plan, while the stages'
// parameters and momentum buffers move between the device and host memory through a transfer
// backend (exec/transfer.hpp; on the CPU, remat::CpuTransfers; on a GPU,
// remat::torch::CudaTransfers from torch/cuda_transfers.hpp).
//
// OffloadedChain is what the offloading engine (exec/offload_step.hpp) runs the ops with
// (StepCompute) and where the moving data live (DeviceStore). It runs the loss and the optimizer
// inside the plan, or leaves both to the caller (the drop-in module of torch/offload_module.hpp:
// the loss op takes the output's gradient the caller's backward gives, and each update hands
// the stage's gradients over). A stage's weights are the data
// `w<l>`, its momentum buffers `m<l>`, its parameter gradients `gw<l>`, as
// remat::offload::training_problem names them; offload_training_problems() builds the problems
// to plan and to predict with from a profile.
//
// Parameters keep their identity. A parameter that leaves the device keeps its tensor, its
// storage and its shape: only the storage's memory is released (and allocated again, from the
// device's allocator, when it comes back), so the optimizer, the module and the autograd graphs
// that saved it go on seeing the same tensor. The optimizer step is torch::optim::SGD's with
// momentum (no dampening, no Nesterov, no weight decay), applied stage by stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/autograd/autograd.h>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../exec/offload_step.hpp"
#include "../exec/transfer.hpp"
#include "../offload/training_state.hpp"
#include "detail/runtime.hpp"
#include "memory.hpp"
#include "profile.hpp"
#include "stage.hpp"

namespace remat::torch {

/// torch::optim::SGD with momentum, as the plan's update ops apply it.
struct SgdMomentum {
    double lr = 0.01;
    double momentum = 0.9;
};

/// The loss of the chain's output (the targets are the function's own).
using ChainLoss = std::function<at::Tensor(const at::Tensor& output)>;

/// The problems of training a profiled chain with its parameters and momentum offloadable:
/// `planned` for the solvers (the chain's stage overheads), `predicting` for the simulator
/// (each forward's own overhead, and the loss's).
struct OffloadTrainingProblems {
    Problem planned;
    Problem predicting;
    std::vector<Bytes> parameter_bytes;  ///< per stage
};

namespace detail::offload {

/// The trainable parameters of each stage; a parameter in two stages is refused (it would have
/// to be in two places at once).
[[nodiscard]] inline std::vector<std::vector<at::Tensor>> stage_parameters(const StageList& stages) {
    std::vector<std::vector<at::Tensor>> out;
    std::vector<const c10::TensorImpl*> seen;
    for (const ChainStage& stage : stages) {
        out.emplace_back();
        for (const at::Tensor& p : stage.parameters) {
            if (!p.defined() || !p.requires_grad()) continue;
            for (const c10::TensorImpl* other : seen)
                if (other == p.unsafeGetTensorImpl())
                    throw InvalidInput("offloading: stage '" + stage.name +
                                       "' shares a parameter with an earlier stage; tied parameters cannot be offloaded "
                                       "stage by stage (fuse the stages that share it)");
            if (!p.is_contiguous() || p.storage_offset() != 0 || p.storage().nbytes() != p.nbytes())
                throw InvalidInput("offloading: a parameter of stage '" + stage.name +
                                   "' does not own its whole storage contiguously (a view or a slice); offloading moves "
                                   "storages, so each parameter needs its own");
            seen.push_back(p.unsafeGetTensorImpl());
            out.back().push_back(p);
        }
    }
    return out;
}

/// The transient bytes of computing the loss and its gradient on `output`, above the gradient.
template <MemoryProbe Probe>
[[nodiscard]] Bytes loss_overhead(const ChainLoss& loss, const at::Tensor& output, Probe& probe) {
    const at::Tensor leaf = output.detach().requires_grad_(true);
    probe.reset_peak();
    const Bytes before = probe.current();
    const at::Tensor value = loss(leaf);
    const at::Tensor gradient = ::torch::autograd::grad({value}, {leaf})[0];
    return std::max<Bytes>(probe.peak() - before - detail::storage_bytes(gradient), 0);
}

/// Per stage, the transient bytes of its backward above its inputs (the saved state kept, as
/// OffloadedChain keeps it until the plan frees it) and the gradients it writes (the input's
/// and the parameters'): what the training problem's B<l> needs, the weight gradients being
/// data there. Measured on the second run of each backward (the first may set up caches).
template <MemoryProbe Probe>
[[nodiscard]] std::vector<Bytes> backward_overheads(const StageList& stages,
                                                    const std::vector<std::vector<at::Tensor>>& parameters,
                                                    const at::Tensor& sample, Probe& probe) {
    const detail::profile::ModelStateGuard guard(stages, sample.device());
    std::vector<Bytes> out;
    at::Tensor x = sample.detach();
    for (std::size_t l = 0; l < stages.size(); ++l) {
        Bytes overhead = 0;
        for (int run = 0; run < 2; ++run) {
            StageGraph graph = run_with_grad(stages[l], x, l > 0);
            const at::Tensor grad = at::ones_like(graph.output);
            std::vector<at::Tensor> parameter_grads;
            probe.reset_peak();
            const Bytes before = probe.current();
            const at::Tensor input_grad = run_backward(graph, grad, l > 0, parameters[l], parameter_grads, true);
            Bytes written = input_grad.defined() ? storage_bytes(input_grad) : 0;
            for (const at::Tensor& g : parameter_grads) written += g.defined() ? storage_bytes(g) : 0;
            overhead = std::max<Bytes>(probe.peak() - before - written, 0);
            if (run == 1) x = graph.output.detach();
        }
        out.push_back(overhead);
    }
    return out;
}

/// Moves a tensor's memory back in (detail::release_memory moved it out) while the tensor, its
/// storage and its shape stay.
inline void allocate_memory(const at::Tensor& t, std::size_t nbytes) {
    c10::Storage storage = t.storage();
    if (storage.device().is_cpu()) {
        storage.set_data_ptr_noswap(c10::GetAllocator(c10::kCPU)->allocate(nbytes));
    } else {
        // Another device's memory comes from its own allocator (the CUDA caching allocator on
        // the current stream) through an empty block whose memory the storage takes.
        const at::Tensor block = at::empty({static_cast<std::int64_t>(nbytes)}, at::TensorOptions().dtype(at::kByte).device(storage.device()));
        storage.set_data_ptr_noswap(block.storage().set_data_ptr(at::DataPtr(nullptr, storage.device())));
    }
    storage.set_nbytes(nbytes);
}

/// Moves a CPU tensor's memory into a block of the CPU allocator installed now, values and
/// identity kept: a weight allocated before a memory probe was installed would otherwise be
/// freed unseen by the probe when it leaves the device, and seen when it comes back.
inline void adopt_memory(const at::Tensor& t) {
    c10::Storage storage = t.storage();
    if (!storage.device().is_cpu() || storage.nbytes() == 0) return;
    const std::size_t nbytes = storage.nbytes();
    at::DataPtr block = c10::GetAllocator(c10::kCPU)->allocate(nbytes);
    std::memcpy(block.get(), storage.data(), nbytes);
    storage.set_data_ptr_noswap(std::move(block));
}

/// Tensors' values in plain host memory, outside the tensor allocators (a step's measured
/// memory does not see them), to put back after a failed step.
class HostSnapshot {
public:
    explicit HostSnapshot(const std::vector<at::Tensor>& tensors) {
        for (const at::Tensor& t : tensors) {
            bytes_.emplace_back();
            if (!t.defined()) continue;
            const at::Tensor host = t.detach().to(at::kCPU).contiguous();  // the tensor itself on the CPU
            const auto* first = static_cast<const std::byte*>(host.data_ptr());
            bytes_.back().assign(first, first + host.nbytes());
        }
    }
    void restore(const std::vector<at::Tensor>& tensors) const {
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < tensors.size() && i < bytes_.size(); ++i) {
            if (!tensors[i].defined() || bytes_[i].empty()) continue;
            auto* data = const_cast<std::byte*>(bytes_[i].data());  // from_blob does not write
            tensors[i].variable_data().copy_(at::from_blob(data, tensors[i].sizes(), tensors[i].options().device(at::kCPU)));
        }
    }

private:
    std::vector<std::vector<std::byte>> bytes_;
};

}  // namespace detail::offload

namespace detail::offload {

/// The planned and predicting problems of a profiled chain, its backward overheads measured
/// again as OffloadedChain runs them, with `loss_bytes` of loss overhead.
template <MemoryProbe Probe>
[[nodiscard]] OffloadTrainingProblems training_problems(const StageList& stages, const ChainProfile& profile,
                                                        const at::Tensor& sample, Bytes loss_bytes,
                                                        remat::offload::TrainingStateOptions options, Probe& probe) {
    const std::vector<std::vector<at::Tensor>> parameters = stage_parameters(stages);
    std::vector<Bytes> parameter_bytes;
    for (const auto& of_stage : parameters) {
        Bytes bytes = 0;
        for (const at::Tensor& p : of_stage) bytes += static_cast<Bytes>(p.nbytes());
        parameter_bytes.push_back(bytes);
    }
    ChainProfile measured = profile;
    const std::vector<Bytes> backward = backward_overheads(stages, parameters, sample, probe);
    for (std::size_t l = 0; l < backward.size(); ++l) measured.chain.stages[l].bwd_overhead = backward[l];
    // OffloadedChain takes no gradient of the input (set_input detaches it): the prediction
    // gives g0 no memory. The solvers' problem keeps it, for Rotor's chain form (a safe excess).
    remat::offload::TrainingStateOptions predicting = options;
    predicting.input_gradient = false;
    return {remat::offload::training_problem(to_problem(measured.chain), parameter_bytes, options),
            remat::offload::training_problem(measured_problem(measured, loss_bytes), parameter_bytes, predicting),
            parameter_bytes};
}

inline void check_profile(const StageList& stages, const ChainProfile& profile) {
    if (stages.size() != profile.chain.length())
        throw InvalidInput("offloading: " + std::to_string(stages.size()) + " stages for a profile of " +
                           std::to_string(profile.chain.length()));
}

}  // namespace detail::offload

/// The training problems of a profiled chain (profile_chain on `sample`): its stages'
/// parameter sizes, each backward's overhead measured again as OffloadedChain runs it (the
/// weight gradients are data of the problem, the saved state stays until the plan frees it),
/// and the loss's overhead on the chain's output for `sample` (the model's buffers and
/// generators are left as they were). The momentum buffers are the optimizer state
/// (`options.optimizer_state_per_parameter` becomes 1).
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] OffloadTrainingProblems offload_training_problems(const StageList& stages, const ChainProfile& profile,
                                                                const ChainLoss& loss, const at::Tensor& sample,
                                                                remat::offload::TrainingStateOptions options,
                                                                Probe probe = Probe{}) {
    detail::offload::check_profile(stages, profile);
    at::Tensor sample_output = sample.detach();
    {
        const detail::profile::ModelStateGuard guard(stages, sample.device());
        for (const ChainStage& stage : stages) sample_output = detail::run_no_grad(stage, sample_output);
    }
    options.optimizer_state_per_parameter = 1.0;
    options.backward_overhead_includes_gradients = false;
    options.gradients_to_caller = false;
    const Bytes loss_bytes = detail::offload::loss_overhead(loss, sample_output, probe);
    return detail::offload::training_problems(stages, profile, sample, loss_bytes, options, probe);
}

/// The training problems of a profiled chain whose caller computes the loss and runs the
/// optimizer after the step (TrainingStateOptions::gradients_to_caller), for
/// OffloadedChain's constructor without loss and SGD: the loss's memory is the caller's.
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] OffloadTrainingProblems caller_optimizer_problems(const StageList& stages, const ChainProfile& profile,
                                                                const at::Tensor& sample, TransferSettings transfers,
                                                                Probe probe = Probe{}) {
    detail::offload::check_profile(stages, profile);
    remat::offload::TrainingStateOptions options;
    options.transfers = transfers;
    options.gradients_to_caller = true;
    return detail::offload::training_problems(stages, profile, sample, 0, options, probe);
}

/// Runs a chain's training ops for OffloadStep and keeps its moving data; see the top of this
/// header. The momentum buffers start at zero, as torch::optim::SGD's.
class OffloadedChain {
public:
    /// `problem`: offload_training_problems(...).predicting (or another training problem of the
    /// same chain); `input`: the chain's input for the steps to come (set_input changes it).
    OffloadedChain(StageList stages, const Problem& problem, ChainLoss loss, SgdMomentum sgd, at::Tensor input)
        : OffloadedChain(std::move(stages), problem, std::move(loss), std::optional<SgdMomentum>(sgd), std::move(input)) {}

    /// The caller's loss and optimizer: the loss op takes the gradient given to
    /// set_output_gradient(), and each update hands its stage's gradients over, for
    /// take_gradients() once the step is done. `problem`: caller_optimizer_problems(...).predicting
    /// (made with TrainingStateOptions::gradients_to_caller).
    OffloadedChain(StageList stages, const Problem& problem, at::Tensor input)
        : OffloadedChain(std::move(stages), problem, ChainLoss{}, std::nullopt, std::move(input)) {}

private:
    OffloadedChain(StageList stages, const Problem& problem, ChainLoss loss, std::optional<SgdMomentum> sgd,
                   at::Tensor input)
        : stages_(std::move(stages)), loss_(std::move(loss)), sgd_(sgd), device_(input.device()) {
        if (sgd_ && !loss_) throw InvalidInput("OffloadedChain: the loss function is empty");
        if (!device_.is_cpu() && !device_.is_cuda())
            throw InvalidInput("OffloadedChain: the chain's input is on " + device_.str() +
                               "; offloading has transfer backends for the CPU (remat::CpuTransfers) and CUDA "
                               "(remat::torch::CudaTransfers) only");
        const std::size_t L = stages_.size();
        const ChainIds ids = chain_ids(L);
        parameters_ = detail::offload::stage_parameters(stages_);
        a_.resize(L + 1);
        s_.resize(L + 1);
        g_.resize(L + 1);
        gw_.resize(L + 1);
        first_rng_.resize(L + 1);
        role_.assign(problem.data_count(), {Role::marker, 0});
        op_kind_.assign(problem.op_count(), {OpKind::loss, 0});
        for (std::size_t l = 0; l <= L; ++l) {
            role_[ids.a[l].index] = {Role::activation, l};
            role_[ids.g[l].index] = {Role::activation_gradient, l};
            if (l == 0) continue;
            role_[ids.s[l].index] = {Role::saved, l};
            op_kind_[ids.fwd[l].index] = {OpKind::forward, l};
            op_kind_[ids.fwd_grad[l].index] = {OpKind::forward_grad, l};
            op_kind_[ids.bwd[l].index] = {OpKind::backward, l};
        }
        const at::NoGradGuard no_grad;
        momentum_.resize(L + 1);
        momentum_factor_.resize(L + 1);
        handed_.resize(L + 1);
        for (std::size_t l = 1; l <= L; ++l) {
            recompute_buffers_.emplace_back(stages_[l - 1].buffers);
            check_caller_problem(problem, l);
            for (const at::Tensor& p : parameters_[l - 1]) {
                detail::offload::adopt_memory(p);
                if (!sgd_) continue;
                momentum_[l].push_back(at::zeros_like(p));
                momentum_factor_[l].push_back(at::scalar_tensor(sgd_->momentum, at::TensorOptions().dtype(p.scalar_type())));
                momentum_factor_[l].back().unsafeGetTensorImpl()->set_wrapped_number(true);
            }
            const std::string n = std::to_string(l);
            if (const auto w = problem.find_data("w" + n)) role_[w->index] = {Role::weights, l};
            if (const auto m = problem.find_data("m" + n)) role_[m->index] = {Role::momentum, l};
            if (const auto gw = problem.find_data("gw" + n)) role_[gw->index] = {Role::gradients, l};
            if (const auto u = problem.find_data("u" + n)) role_[u->index] = {Role::marker, l};
            if (const auto op = problem.find_op("U" + n)) op_kind_[op->index] = {OpKind::update, l};
        }
        set_input(std::move(input));
    }

public:
    /// The input of the next steps (its gradient is not taken).
    void set_input(at::Tensor input) {
        input_ = input.detach();
        a_[0].set_external(input_);
    }

    // ---- StepCompute
    /// Before the op's measured window: the step's starting state, and the generators' state
    /// that a forward's first run records and a recomputation replays (reading it allocates).
    void prepare(OpId op) {
        prepared_ = op;
        if (!step_started_) start_step();
        const auto [kind, l] = op_kind_[op.index];
        if (kind != OpKind::forward && kind != OpKind::forward_grad) return;
        if (!first_rng_[l]) {
            first_rng_[l] = detail::RngState::capture(device_);
        } else {
            resume_rng_ = detail::RngState::capture(device_);
            first_rng_[l]->restore();
        }
    }
    void run(OpId op) {
        if (prepared_ != op) prepare(op);
        prepared_.reset();
        const auto [kind, l] = op_kind_[op.index];
        switch (kind) {
            case OpKind::forward: return forward(l, false);
            case OpKind::forward_grad: return forward(l, true);
            case OpKind::loss: return run_loss();
            case OpKind::backward: return backward(l);
            case OpKind::update: return update(l);
        }
    }
    void release(DataId d) {
        const auto [role, l] = role_[d.index];
        switch (role) {
            case Role::activation:
                if (l == stages_.size() && !sgd_) held_outside_.add(a_[l].tensor());  // exposed: the caller may keep it
                return a_[l].release();
            case Role::saved: return s_[l].clear();
            case Role::activation_gradient:
                if (l == stages_.size()) return detail::release_output_gradient(g_[l], gradient_from_autograd_, held_outside_);
                return void(g_[l] = at::Tensor());
            case Role::gradients: return gw_[l].clear();
            case Role::weights:
            case Role::momentum: return drop_device_copy(d);
            case Role::marker: return;
        }
    }
    /// A failed step: the generators and the stages' buffers go back to the step's start, and
    /// its activations, graphs and gradients are dropped.
    void abort_step() {
        if (step_started_) {
            step_rng_.restore();
            for (std::size_t l = 0; l < stages_.size(); ++l) step_buffers_[l].restore(stages_[l].buffers);
        }
        end_step();
    }

    // ---- DeviceStore
    [[nodiscard]] std::vector<std::span<std::byte>> device_bytes(DataId d) {
        std::vector<std::span<std::byte>> out;
        for (const at::Tensor& t : tensors_of(d))
            if (t.storage().nbytes() > 0) out.emplace_back(static_cast<std::byte*>(t.data_ptr()), t.nbytes());
        return out;
    }
    void make_device_copy(DataId d) {
        for (const at::Tensor& t : tensors_of(d)) detail::offload::allocate_memory(t, t.nbytes());
    }
    void drop_device_copy(DataId d) {
        for (const at::Tensor& t : tensors_of(d)) detail::release_memory(t);
    }

    /// Bytes the plan freed that the caller still holds: the output it kept, the output's
    /// gradient where autograd keeps it until the backward returns (LibTorch 1.13).
    [[nodiscard]] Bytes held_outside() const noexcept { return held_outside_.bytes(); }

    // ---- The caller's loss and optimizer
    /// The chain's output after the forward phase: the caller's from now on (the plan's frees
    /// of it then only drop this object's references).
    [[nodiscard]] at::Tensor expose_output() {
        a_.back().expose();
        return a_.back().tensor().detach();
    }
    /// The gradient of the output, for the loss op; `from_autograd`: it came into a custom
    /// Function's backward (LibTorch 1.13 keeps its own reference until that returns).
    void set_output_gradient(at::Tensor gradient, bool from_autograd) {
        if (sgd_) throw InvalidInput("OffloadedChain: this chain runs its own loss; set_output_gradient() is for a chain "
                                     "made without loss and optimizer");
        if (!gradient.defined()) throw InvalidInput("OffloadedChain: the gradient of the output is undefined");
        output_gradient_ = std::move(gradient);
        gradient_from_autograd_ = from_autograd;
    }
    /// The parameter gradients the updates handed over, in the order of the stages'
    /// trainable parameters (undefined where a parameter got none); moved out.
    [[nodiscard]] std::vector<at::Tensor> take_gradients() {
        std::vector<at::Tensor> out;
        for (std::size_t l = 1; l < handed_.size(); ++l)
            for (std::size_t k = 0; k < parameters_[l - 1].size(); ++k)
                out.push_back(k < handed_[l].size() ? std::move(handed_[l][k]) : at::Tensor());
        for (auto& h : handed_) h.clear();
        return out;
    }
    /// The stages' trainable parameters, by stage (0-based): what the problem's w<l> are.
    [[nodiscard]] const std::vector<std::vector<at::Tensor>>& stage_parameters() const noexcept { return parameters_; }

    /// The loss of the last step (a chain that runs its own loss).
    /// The last step's loss (read when asked: reading it in the step would make the host wait
    /// for the device there).
    [[nodiscard]] double loss() const {
        if (loss_on_host_.defined()) {
            detail::synchronize(device_);
            loss_value_ = loss_on_host_.item<double>();
            loss_on_host_ = at::Tensor();
        }
        return loss_value_;
    }
    /// The momentum buffers of stage l (1-based), in the order of its trainable parameters.
    [[nodiscard]] const std::vector<at::Tensor>& momentum(std::size_t l) const { return momentum_.at(l); }
    /// Drops the step's activations, graphs and gradients, for the next step.
    void end_step() {
        for (auto& a : a_) a.clear();
        for (auto& s : s_) s.clear();
        for (auto& g : g_) g = at::Tensor();
        for (auto& gw : gw_) gw.clear();
        for (auto& h : handed_) h.clear();
        output_gradient_ = at::Tensor();
        gradient_from_autograd_ = false;
        held_outside_.clear();
        for (auto& r : first_rng_) r.reset();
        resume_rng_.reset();
        prepared_.reset();
        a_[0].set_external(input_);
        step_started_ = false;
    }

private:
    enum class Role : unsigned char { activation, saved, activation_gradient, weights, momentum, gradients, marker };
    enum class OpKind : unsigned char { forward, forward_grad, loss, backward, update };

    [[nodiscard]] const std::vector<at::Tensor>& tensors_of(DataId d) const {
        static const std::vector<at::Tensor> none;
        const auto [role, l] = role_[d.index];
        if (role == Role::weights) return parameters_[l - 1];
        if (role == Role::momentum) return momentum_[l];
        return none;
    }

    // Each stage with weights: momentum buffers m<l> in the problem exactly when this chain runs
    // SGD with momentum itself, and gradients that outlive the step when the caller's optimizer
    // takes them.
    void check_caller_problem(const Problem& problem, std::size_t l) const {
        const std::string n = std::to_string(l);
        const auto gw = problem.find_data("gw" + n);
        if (!gw) return;
        if (sgd_ && (problem.is_final(*gw) || !problem.find_data("m" + n)))
            throw InvalidInput("OffloadedChain: '" + problem.name() + "' hands its gradients to the caller "
                               "(TrainingStateOptions::gradients_to_caller); use the constructor without loss and SGD");
        if (!sgd_ && (!problem.is_final(*gw) || problem.find_data("m" + n)))
            throw InvalidInput("OffloadedChain: '" + problem.name() + "' keeps optimizer state or frees the gradients in "
                               "the step; the caller's optimizer needs a problem made with "
                               "TrainingStateOptions::gradients_to_caller (caller_optimizer_problems)");
    }

    void start_step() {
        step_rng_ = detail::RngState::capture(device_);
        resume_rng_.reset();
        step_buffers_.clear();
        for (const ChainStage& stage : stages_) step_buffers_.emplace_back(stage.buffers);
        step_started_ = true;
    }

    // The first run of a stage draws from the generators as they stand; a recomputation
    // replays those numbers (prepare() has put them back) and leaves the generators and the
    // buffers as the first run left them.
    void forward(std::size_t l, bool with_grad) {
        const ChainStage& stage = stages_[l - 1];
        const at::Tensor input = a_[l - 1].tensor();
        std::optional<detail::BufferGuard> buffers;
        struct Resume {
            std::optional<detail::RngState>& state;
            ~Resume() {
                if (state) state->restore();
                state.reset();
            }
        } resume{resume_rng_};
        if (resume_rng_ && !stage.buffers.empty()) buffers.emplace(recompute_buffers_[l - 1], stage.buffers);
        if (with_grad) {
            detail::StageGraph graph = detail::run_with_grad(stage, input, l > 1);
            a_[l].install(graph.output, /*graph_holds_storage=*/true, stage.name);
            s_[l] = std::move(graph);
        } else {
            a_[l].install(detail::run_no_grad(stage, input), /*graph_holds_storage=*/false, stage.name);
        }
    }

    void run_loss() {
        if (!sgd_) {
            if (!output_gradient_.defined())
                throw ExecutionError("OffloadedChain: the loss op ran without the output's gradient (set_output_gradient)");
            g_.back() = std::move(output_gradient_);
            return;
        }
        const at::Tensor leaf = a_.back().tensor().detach().requires_grad_(true);
        const at::Tensor value = loss_(leaf);
        g_.back() = ::torch::autograd::grad({value}, {leaf})[0];
        if (value.is_cuda()) {  // copied without waiting, into pinned memory (outside the device's count)
            loss_on_host_ = at::empty({}, value.options().device(at::kCPU).pinned_memory(true));
            loss_on_host_.copy_(value.detach(), /*non_blocking=*/true);
        } else {
            loss_value_ = value.item<double>();
            loss_on_host_ = at::Tensor();
        }
    }

    // The graph keeps its saved state until the plan frees s<l>, as the problem counts it.
    void backward(std::size_t l) {
        std::vector<at::Tensor> grads;
        at::Tensor input_grad = detail::run_backward(s_[l], g_[l], l > 1, parameters_[l - 1], grads, /*keep_saved=*/true);
        gw_[l] = std::move(grads);
        g_[l - 1] = std::move(input_grad);
    }

    // torch::optim::SGD with momentum: buf = μ buf + g (buf = g at the first step, which the
    // zero buffer gives too); p -= lr buf. A parameter without a gradient is left alone. μ is
    // a wrapped number of the parameter's dtype made once: the Scalar that SGD passes becomes
    // that (so the arithmetic is the same), but allocated in every update.
    void update(std::size_t l) {
        if (!sgd_) {  // the caller's optimizer steps after the step
            handed_[l] = std::move(gw_[l]);
            gw_[l].clear();
            return;
        }
        const at::NoGradGuard no_grad;
        for (std::size_t k = 0; k < parameters_[l - 1].size(); ++k) {
            if (k >= gw_[l].size() || !gw_[l][k].defined()) continue;
            at::Tensor& buffer = momentum_[l][k];
            buffer.mul_(momentum_factor_[l][k]).add_(gw_[l][k]);
            parameters_[l - 1][k].add_(buffer, -sgd_->lr);
        }
    }

    StageList stages_;
    ChainLoss loss_;
    std::optional<SgdMomentum> sgd_;  // none: the caller's loss and optimizer
    c10::Device device_;
    at::Tensor input_;
    std::vector<std::vector<at::Tensor>> parameters_;  // by stage (0-based)
    std::vector<std::vector<at::Tensor>> momentum_;    // by stage (1-based)
    std::vector<detail::Activation> a_;
    std::vector<detail::StageGraph> s_;
    std::vector<at::Tensor> g_;
    std::vector<std::vector<at::Tensor>> gw_;
    std::vector<std::vector<at::Tensor>> handed_;  // by stage (1-based): gradients for the caller
    at::Tensor output_gradient_;
    bool gradient_from_autograd_ = false;
    detail::HeldOutside held_outside_;
    std::vector<std::optional<detail::RngState>> first_rng_;
    std::optional<detail::RngState> resume_rng_;  // where a recomputation leaves the generators
    std::optional<OpId> prepared_;                // the op prepare() was called for
    std::vector<std::vector<at::Tensor>> momentum_factor_;  // by stage (1-based)
    std::vector<detail::BufferSnapshot> recompute_buffers_;
    std::vector<std::pair<Role, std::size_t>> role_;      // by data, with its stage
    std::vector<std::pair<OpKind, std::size_t>> op_kind_;  // by op, with its stage
    bool step_started_ = false;
    detail::RngState step_rng_;
    std::vector<detail::offload::HostSnapshot> step_buffers_;
    mutable double loss_value_ = 0.0;
    mutable at::Tensor loss_on_host_;  // the loss on its way from a GPU, until loss() reads it
};

static_assert(StepCompute<OffloadedChain>);
static_assert(DeviceStore<OffloadedChain>);

}  // namespace remat::torch
