// remat/exec/unit_runs.hpp — what running a plan's forwards and backwards through a framework's
// backend (backend.hpp) takes besides the framework itself: which forward really runs, and
// random-number replay. Written once for the execution engine (executor.hpp) and for the
// offloading engine's backend adapter (backend_compute.hpp). Standard library only.
//
// docs/design.md §6 (execution engine):
//   - a forward with grad whose saved state is already live rewrites its missing activations
//     without grad when that run's overhead is no larger than its own (the simulator counts
//     the forward with grad's), else it releases the saved state and runs with grad; a
//     forward whose activations are all live does nothing; live data are released before
//     they are rewritten (the simulator counts a rewritten data once);
//   - the generators' state is read at the first run of a unit the plan recomputes, and put
//     back around each recomputation; when a plan runs random units out of the model's order,
//     their states are drawn ahead in the model's order (DrawsLike) and every run replays them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "backend.hpp"
#include "plan.hpp"

namespace remat {

/// The liveness of a step's data and the random state of its units, for one step of one plan.
template <ExecutionBackend Backend>
class UnitRuns {
public:
    using RngState = typename Backend::RngState;

    UnitRuns(const Problem& predicting, const ExecutionTable& table, ForwardLandmarks landmarks)
        : problem_(&predicting), table_(&table), landmarks_(std::move(landmarks)) {
        live_.assign(predicting.data_count(), 0);
        for (const DataId d : predicting.initial()) live_[d.index] = 1;
        rng_.resize(table.units);
        ran_.assign(table.units, 0);
        no_grad_overhead_.assign(table.units, std::nullopt);
        for (std::size_t k = 0; k < predicting.op_count(); ++k)
            if (table.op_role[k] == ExecOpRole::forward) no_grad_overhead_[table.op_unit[k]] = predicting.op(OpId{k}).overhead;
    }

    /// Whether a data is live at this point of the step (the simulator's view).
    [[nodiscard]] bool live(DataId d) const { return live_.at(d.index) != 0; }
    /// Set when the random draws were chained (see chain_random_draws): where the model's
    /// forward leaves the generators, for the end of the forward phase.
    [[nodiscard]] const std::optional<RngState>& chain_end() const noexcept { return chain_end_; }

    // A plan that runs random units out of the model's order (Rockmate and H-Rockmate may
    // reorder independent ops) would hand them other numbers than plain autograd. Instead,
    // each random unit's state is found up front — the units draw in the model's order,
    // computing nothing (DrawsLike) — and every run of it, the first included, replays it.
    /// Before the step's first op. Throws when the backend cannot draw ahead.
    void chain_random_draws(Backend& backend) {
        if (random_units_in_model_order(backend)) return;
        if constexpr (DrawsLike<Backend>) {
            std::vector<std::size_t> units;
            for (std::size_t u = 0; u < table_->units; ++u)
                if (backend.random(u) && landmarks_.forward_runs[u] > 0) units.push_back(u);
            std::stable_sort(units.begin(), units.end(), [&](std::size_t a, std::size_t b) {
                return draw_rank(backend, a) < draw_rank(backend, b);
            });
            for (const std::size_t u : units) {
                rng_[u] = backend.capture_rng();
                backend.draw_like(u);
            }
            chain_end_ = backend.capture_rng();
        } else {
            throw ExecutionError("the plan runs units that draw random numbers in another order than the model "
                                 "(or after the loss), and this backend cannot draw them ahead (DrawsLike, "
                                 "exec/backend.hpp); the step would not be plain autograd's");
        }
    }

    // Whether a forward runs with grad, or nullopt when it has nothing to do (its activations
    // are live, and so is its saved state if it is a forward with grad). A forward with grad
    // whose saved state is live needs only its missing activations. The simulator counts the
    // op's own overhead for it, so the run without grad does that only when its overhead is no
    // larger (a group whose intermediates are saved with grad holds them as transients
    // without); otherwise the saved state is released and rewritten, as the simulator counts
    // it: once. Live data it rewrites are released now.
    /// Before the op's measured window.
    std::optional<bool> forward_to_run(Backend& backend, OpId k, bool with_grad) {
        const Op& op = problem_->op(k);
        bool saved_live = false, activations_live = true;
        for (const DataId d : op.writes) {
            if (is_saved(d))
                saved_live = saved_live || live_[d.index];
            else
                activations_live = activations_live && live_[d.index];
        }
        if (with_grad && saved_live) {
            if (activations_live) return std::nullopt;
            const std::optional<Bytes>& without_grad = no_grad_overhead_[table_->op_unit[k.index]];
            with_grad = !without_grad || *without_grad > op.overhead;
        }
        if (!with_grad && activations_live) return std::nullopt;
        for (const DataId d : op.writes)
            if (live_[d.index] && (with_grad || !is_saved(d))) release(backend, d);
        return with_grad;
    }

    // A unit's random state is needed at its first run when the plan runs it again (to
    // replay), and at a replay (to put the sequence back afterwards) — every run of a chained
    // unit is one. Reading it may allocate for a moment: before the op's measured window.
    [[nodiscard]] std::optional<RngState> rng_for(Backend& backend, std::size_t unit) const {
        if (!backend.random(unit)) return std::nullopt;
        if (rng_[unit] || (ran_[unit] == 0 && landmarks_.forward_runs[unit] > 1)) return backend.capture_rng();
        return std::nullopt;
    }

    void run_forward(Backend& backend, OpId k, std::size_t unit, bool with_grad, std::optional<RngState> rng_now) {
        const bool first = ran_[unit] == 0;
        ran_[unit] = 1;
        RestoreRng restore(backend);
        if (rng_[unit] && rng_now) {  // a recomputation, or any run of a chained unit
            restore.state = &*rng_now;
            backend.restore_rng(*rng_[unit]);
        } else if (first && rng_now) {
            rng_[unit] = std::move(rng_now);  // the numbers its later runs replay
        }
        if constexpr (KeepsStateForReruns<Backend>)
            if (first && landmarks_.forward_runs[unit] > 1) backend.keep_state_for_reruns(unit);
        backend.forward(unit, with_grad, first);
        for (const DataId d : problem_->op(k).writes)
            if (with_grad || !is_saved(d)) live_[d.index] = 1;
    }

    void run_backward(Backend& backend, OpId k, std::size_t unit) {
        backend.backward(unit);
        mark_written(k);
    }

    /// An op's writes are live (the loss's: the gradients the caller hands back).
    void mark_written(OpId k) {
        for (const DataId d : problem_->op(k).writes) live_[d.index] = 1;
    }

    void release(Backend& backend, DataId d) {
        backend.release(d);
        live_[d.index] = 0;
    }

private:
    [[nodiscard]] bool is_saved(DataId d) const { return table_->data_role[d.index] == ExecDataRole::saved; }

    [[nodiscard]] static std::size_t draw_rank(const Backend& backend, std::size_t unit) {
        if constexpr (DrawsLike<Backend>)
            return backend.draw_rank(unit);
        else
            return unit;
    }

    // Whether the plan's first runs of random units draw in the model's order, all before the
    // loss: then the generators' own sequence gives each unit plain autograd's numbers.
    [[nodiscard]] bool random_units_in_model_order(const Backend& backend) const {
        std::optional<std::size_t> last_rank;
        for (std::size_t i = 0; i < landmarks_.first_forward_order.size(); ++i) {
            const std::size_t unit = landmarks_.first_forward_order[i];
            if (!backend.random(unit)) continue;
            const std::size_t rank = draw_rank(backend, unit);
            if (!landmarks_.first_run_before_loss[i] || (last_rank && rank < *last_rank)) return false;
            last_rank = rank;
        }
        return true;
    }

    // Puts the generators back on exit (after a replayed recomputation), exceptions included.
    struct RestoreRng {
        Backend& backend;
        const RngState* state = nullptr;
        explicit RestoreRng(Backend& b) : backend(b) {}
        RestoreRng(const RestoreRng&) = delete;
        RestoreRng& operator=(const RestoreRng&) = delete;
        ~RestoreRng() {
            if (state != nullptr) backend.restore_rng(*state);
        }
    };

    const Problem* problem_;
    const ExecutionTable* table_;
    ForwardLandmarks landmarks_;
    std::vector<char> live_;
    std::vector<std::optional<RngState>> rng_;
    std::optional<RngState> chain_end_;
    std::vector<char> ran_;
    std::vector<std::optional<Bytes>> no_grad_overhead_;  // per unit: its forward without grad's, when it has one
};

}  // namespace remat
