// remat/exec/backend.hpp — what a framework implements to run remat's plans: the
// ExecutionBackend and MemoryReader concepts of the execution engine (executor.hpp).
//
// docs/design.md §1, principle 4 (policies at compile time) and §4.6. LibTorch's backends are in
// torch/ (chain stages, captured op groups); examples/embedding/ plugs in a framework that
// is not LibTorch.
//
// What the backend must guarantee:
//   - forward(unit, with_grad, first_run) makes the unit's activations live (and, with
//     grad, its saved state); a recomputation (first_run false) gives the same values as the
//     first run when the engine has put the random state back, and does not change anything
//     that must change once per step (running statistics, counters) — restore those itself;
//   - backward(unit) reads the unit's saved state and the gradients of its outputs, writes
//     the gradients of its inputs, and *collects* its parameter gradients without handing
//     them to the parameters; pending_gradient_bytes() says how many bytes those hold;
//   - release(data) gives the data's memory back at once (the engine calls it exactly where
//     the plan frees, and before a rewrite);
//   - commit() hands the collected parameter gradients over (end of a successful step);
//     rollback(generators_too) puts back what begin_step() saved, so that a failed step
//     leaves no trace; clear() drops everything the step holds (both noexcept);
//   - capture_rng()/restore_rng() read and write every random generator the units draw from;
//     a backend that also models DrawsLike lets plans run random units out of the model's order.
// Memory is measured by a MemoryReader: current and peak bytes of the memory activations live
// in, with the peak resettable.
#pragma once

#include <concepts>
#include <cstddef>
#include <exception>
#include <string>

#include "../core/errors.hpp"

namespace remat {

/// A memory probe: bytes in use now, the peak since the last reset_peak().
template <class P>
concept MemoryReader = requires(P& probe, const P& const_probe) {
    { const_probe.current() } -> std::convertible_to<Bytes>;
    { const_probe.peak() } -> std::convertible_to<Bytes>;
    probe.reset_peak();
};

/// One step's framework state: see the top of this header for what each call must do.
template <class B>
concept ExecutionBackend = requires(B& backend, const B& const_backend, std::size_t unit, DataId data, bool flag,
                                    const typename B::RngState& state) {
    typename B::RngState;
    { backend.capture_rng() } -> std::same_as<typename B::RngState>;
    backend.restore_rng(state);
    /// Whether a unit may draw random numbers (replayed when it is recomputed); may say true
    /// for every unit.
    { const_backend.random(unit) } -> std::convertible_to<bool>;
    backend.forward(unit, flag, flag);
    backend.backward(unit);
    backend.release(data);
    { const_backend.pending_gradient_bytes() } -> std::convertible_to<Bytes>;
    /// Bytes of data the plan freed that the caller still holds (outputs it kept).
    { const_backend.caller_bytes() } -> std::convertible_to<Bytes>;
    backend.begin_step();
    backend.commit();
    { backend.rollback(flag) } noexcept;
    { backend.clear() } noexcept;
    /// Waits for queued device work (no-op on synchronous frameworks). The engine calls it at
    /// the end of each phase only (around each op with time_each_op), so the memory reader must
    /// count when an op is queued, as allocators do on the host, not when the device runs it.
    backend.synchronize();
    /// How messages name a unit: " (stage 3 'fc')".
    { const_backend.describe(unit) } -> std::convertible_to<std::string>;
};

/// A backend that can advance its generators exactly as a unit's forward would, without
/// making anything live (`draw_like(unit)`), and says in which order the units draw in the
/// framework's own forward (`draw_rank(unit)`, increasing along it; the unit index when a
/// backend does not say). With it, the engine gives every unit the random numbers of plain
/// autograd even when a plan runs random units in another order than the model does.
template <class B>
concept DrawsLike = requires(B& backend, const B& const_backend, std::size_t unit) {
    backend.draw_like(unit);
    { const_backend.draw_rank(unit) } -> std::convertible_to<std::size_t>;
};

/// A backend whose recomputations must start from state the unit's first run changes (the
/// buffers it updates and then reads): the engine calls keep_state_for_reruns(unit) just
/// before the first of several forward runs the plan gives a unit in a step, and only then,
/// so that a step without recomputations copies nothing.
template <class B>
concept KeepsStateForReruns = requires(B& backend, std::size_t unit) { backend.keep_state_for_reruns(unit); };

/// A backend that words exceptions itself (e.g. without a framework's backtrace).
template <class B>
concept WordsErrors = requires(const B& backend, const std::exception& e) {
    { backend.error_text(e) } -> std::convertible_to<std::string>;
};

/// A backend with its own clock for per-step op times (thread CPU time, device events...).
template <class B>
concept HasClock = requires(const B& backend) {
    { backend.now() } -> std::convertible_to<double>;
};

}  // namespace remat
