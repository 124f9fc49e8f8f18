// remat/offload/training_state.hpp — what a training step holds besides activations, and how
// rematerialization solvers plan the rest (docs/formats.md §11).
//
// A `remat.problem/2` problem may model the weights, their gradients and the optimizer state:
// weights and state are initial data that ops *update* in place (the optimizer step of each
// layer), and the weights' gradients are data that backward ops write and only updates read.
// Rotor, Rockmate, H-Rockmate and Checkmate know nothing of updates, so they plan the
// problem's activations alone:
//   - split_training_state() takes the updates and the data only they use (the "training
//     state") out of a problem, leaving a `remat.problem/1` problem of activations: for a
//     chain with weights, exactly the chain's expansion (§5), so Rotor applies;
//   - with_training_state() puts them back into an activation plan: each update right after
//     the last op that needs what it changes (the optimizer step runs inside the backward,
//     "optimizer in backward"), and each gradient freed right after its update.
// training_problem() builds such a problem from a chain and its stages' parameter sizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"

namespace remat::offload {

/// A problem's activations, planned by any remat solver, and the way back to the problem.
struct TrainingSplit {
    Problem activations;
    std::vector<std::size_t> op_in_full;    ///< by activation op: its index in the full problem
    std::vector<std::size_t> data_in_full;  ///< by activation data: its index in the full problem
    std::vector<char> is_state;             ///< by full data: part of the training state
};

namespace detail {

// Updated data, data that only updates read, and data that only updates write.
inline std::vector<char> training_state_data(const Problem& p) {
    std::vector<char> state(p.data_count(), 0);
    const auto is_updater = [&](OpId op) { return !p.op(op).updates.empty(); };
    for (std::size_t k = 0; k < p.data_count(); ++k) {
        const DataId d{k};
        const auto readers = p.readers(d);
        const auto writers = p.writers(d);
        state[k] = p.updater(d) || (!readers.empty() && std::all_of(readers.begin(), readers.end(), is_updater)) ||
                   (!writers.empty() && std::all_of(writers.begin(), writers.end(), is_updater));
    }
    return state;
}

}  // namespace detail

/// The activation problem of `problem` (the problem itself, renamed nothing, when it has no
/// updates). Throws InvalidInput when an op would be left writing nothing but state.
[[nodiscard]] inline TrainingSplit split_training_state(const Problem& problem) {
    TrainingSplit split{ProblemBuilder(problem.name()).build(), {}, {}, detail::training_state_data(problem)};
    ProblemBuilder b(problem.name());
    std::vector<std::size_t> data_map(problem.data_count(), static_cast<std::size_t>(-1));
    for (std::size_t k = 0; k < problem.data_count(); ++k) {
        if (split.is_state[k]) continue;
        data_map[k] = b.add_data(problem.data(DataId{k}).name, problem.data(DataId{k}).bytes).index;
        split.data_in_full.push_back(k);
    }
    const auto kept = [&](const std::vector<DataId>& list) {
        std::vector<DataId> out;
        for (const DataId d : list)
            if (!split.is_state[d.index]) out.push_back(DataId{data_map[d.index]});
        return out;
    };
    std::vector<std::size_t> op_map(problem.op_count(), static_cast<std::size_t>(-1));
    for (std::size_t k = 0; k < problem.op_count(); ++k) {
        const Op& op = problem.op(OpId{k});
        if (!op.updates.empty()) continue;
        std::vector<DataId> writes = kept(op.writes);
        if (writes.empty())
            throw InvalidInput("op '" + op.name + "' writes only training state (data that only updates use); give it "
                               "an activation output, or a zero-byte marker that a later op or the final list needs");
        op_map[k] = b.add_op({op.name, op.time, op.overhead, kept(op.reads), std::move(writes), op.exactly_once}).index;
        split.op_in_full.push_back(k);
    }
    for (const DataId d : problem.initial())
        if (!split.is_state[d.index]) b.add_initial(DataId{data_map[d.index]});
    for (const DataId d : problem.final_data())
        if (!split.is_state[d.index]) b.add_final(DataId{data_map[d.index]});
    if (const auto loss = problem.loss(); loss && op_map[loss->index] != static_cast<std::size_t>(-1))
        b.set_loss(OpId{op_map[loss->index]});
    std::vector<OpId> order;
    for (const OpId op : problem.autograd_order())
        if (op_map[op.index] != static_cast<std::size_t>(-1)) order.push_back(OpId{op_map[op.index]});
    b.set_autograd_order(std::move(order));
    split.activations = b.build();
    return split;
}

namespace detail {

// Where each update goes: after the last step that reads or updates what it changes, or
// writes what it reads, and after the frees that follow that step (`steps` are in the full
// problem's ids). The frees come first because a backward's own saved state is gone when it
// returns (autograd frees it as it goes): an update placed before the plan's free of it
// would have the simulator count that state a while longer than any framework holds it.
inline std::vector<std::vector<OpId>> update_positions(const Problem& full, const Schedule& steps) {
    std::vector<std::vector<OpId>> after(steps.size() + 1);  // after[i + 1]: right after step i; after[0]: first
    for (std::size_t u = 0; u < full.op_count(); ++u) {
        const Op& update = full.op(OpId{u});
        if (update.updates.empty()) continue;
        std::size_t position = 0;
        for (std::size_t i = 0; i < steps.size(); ++i) {
            if (!steps[i].is_run()) continue;
            const Op& op = full.op(steps[i].op());
            const auto touches = [](const std::vector<DataId>& a, const std::vector<DataId>& b) {
                return std::any_of(a.begin(), a.end(), [&](DataId d) { return std::find(b.begin(), b.end(), d) != b.end(); });
            };
            if (touches(op.reads, update.updates) || touches(op.updates, update.updates) || touches(op.writes, update.reads))
                position = i + 1;
        }
        while (position > 0 && position < steps.size() && steps[position].is_free()) ++position;
        after[position].push_back(OpId{u});
    }
    return after;
}

// An update that reads an activation the plan has freed by then keeps it live: the plan's
// last free of it before the update is dropped (its step becomes a free of the marker id
// below, skipped) and the activation is freed right after the update instead. Returns, by
// position, the frees to add after the updates there.
inline constexpr std::size_t dropped_free_marker = static_cast<std::size_t>(-1);
inline std::vector<std::vector<DataId>> keep_update_reads_live(const Problem& full, const TrainingSplit& split,
                                                               Schedule& mapped,
                                                               const std::vector<std::vector<OpId>>& after) {
    std::vector<std::vector<DataId>> frees(after.size());
    std::vector<char> live(full.data_count(), 0);
    std::vector<std::size_t> freed_at(full.data_count(), dropped_free_marker);
    for (const DataId d : full.initial()) live[d.index] = 1;
    for (std::size_t i = 0; i < after.size(); ++i) {
        for (const OpId u : after[i])
            for (const DataId r : full.op(u).reads) {
                if (split.is_state[r.index] || live[r.index] || freed_at[r.index] == dropped_free_marker) continue;
                mapped[freed_at[r.index]] = Step::free(DataId{dropped_free_marker});
                live[r.index] = 1;
                frees[i].push_back(r);
            }
        for (const DataId d : frees[i]) live[d.index] = 0;
        if (i == mapped.size()) break;
        const Step& s = mapped[i];
        if (s.is_run()) {
            for (const DataId d : full.op(s.op()).writes) live[d.index] = 1, freed_at[d.index] = dropped_free_marker;
        } else if (s.data().index != dropped_free_marker) {
            live[s.data().index] = 0;
            freed_at[s.data().index] = i;
        }
    }
    return frees;
}

}  // namespace detail

/// Puts the training state back into a plan of `split.activations`: the result is a schedule
/// of `full`. Throws SolverError when the result is invalid (an update whose inputs the plan
/// freed before it, which split_training_state's problems never cause).
[[nodiscard]] inline Schedule with_training_state(const Problem& full, const TrainingSplit& split,
                                                  const Schedule& activation_plan) {
    Schedule mapped;
    mapped.reserve(activation_plan.size());
    for (const Step& s : activation_plan)
        mapped.push_back(s.is_run() ? Step::run(OpId{split.op_in_full.at(s.op().index)})
                                    : Step::free(DataId{split.data_in_full.at(s.data().index)}));
    const std::vector<std::vector<OpId>> after = detail::update_positions(full, mapped);
    const std::vector<std::vector<DataId>> kept = detail::keep_update_reads_live(full, split, mapped, after);
    // The last step to read each state data that is neither initial nor final (a gradient), to free it there.
    std::vector<std::size_t> last_use(full.data_count(), 0);
    Schedule out;
    out.reserve(mapped.size() + 3 * after.size());
    const auto emit = [&](const Step& s) {
        out.push_back(s);
        if (s.is_run()) {
            const Op& op = full.op(s.op());
            for (const std::vector<DataId>* list : {&op.reads, &op.writes})
                for (const DataId d : *list) last_use[d.index] = out.size();
        }
    };
    for (std::size_t i = 0; i <= mapped.size(); ++i) {
        for (const OpId u : after[i]) emit(Step::run(u));
        for (const DataId d : kept[i]) out.push_back(Step::free(d));
        if (i < mapped.size() && !(mapped[i].is_free() && mapped[i].data().index == detail::dropped_free_marker)) emit(mapped[i]);
    }
    // Gradients and markers leave right after their last use, in data order.
    std::vector<std::vector<DataId>> frees(out.size() + 1);
    for (std::size_t k = 0; k < full.data_count(); ++k)
        if (split.is_state[k] && !full.is_initial(DataId{k}) && !full.is_final(DataId{k}) && last_use[k] > 0)
            frees[last_use[k]].push_back(DataId{k});
    Schedule result;
    result.reserve(out.size() + full.data_count());
    for (std::size_t i = 0; i < out.size(); ++i) {
        result.push_back(out[i]);
        for (const DataId d : frees[i + 1]) result.push_back(Step::free(d));
    }
    const SimulationReport check = simulate(full, result);
    if (!check.valid)
        throw InvalidInput("the updates of '" + full.name() + "' do not fit back into its activation plan: " + check.error +
                           "; an update may read only what the plan has produced by then (the weights' gradients, "
                           "activations it keeps)");
    return result;
}

/// How training_problem() models the training state of each stage.
struct TrainingStateOptions {
    /// Optimizer state per byte of parameter: 0 for plain SGD, 1 with momentum, 2 for Adam.
    double optimizer_state_per_parameter = 2.0;
    /// Time of a stage's optimizer step per byte of its parameters.
    double update_time_per_parameter_byte = 0.0;
    /// Whether weights and optimizer state may be offloaded.
    bool offloadable = true;
    /// The problem's host limit and bandwidths.
    TransferSettings transfers{};
    /// The chain's backward overheads include the weight gradients (remat's own profiles
    /// measure them so): they are subtracted, as the gradients become data.
    bool backward_overhead_includes_gradients = false;
    /// Whether the stages' outputs a<l> and saved states s<l> may be offloaded too, instead of
    /// kept or recomputed (POFO, Beaumont et al., NeurIPS 2021).
    bool offloadable_activations = false;
    /// The caller's optimizer steps after the step (a drop-in module: loss.backward(), then
    /// optimizer.step()): each gradient gw<l> is final (handed over when the step ends), each
    /// update U<l> stands for that later optimizer step (it takes no time of the step, and the
    /// weights must be on the device from it on, their host copies stale), and the caller's
    /// optimizer state is not in the problem (optimizer_state_per_parameter is ignored).
    bool gradients_to_caller = false;
    /// Whether the backward computes the gradient g0 of the chain's input; when it does not
    /// (an input that does not require grad), g0 takes no memory.
    bool input_gradient = true;
};

/// A weight of a problem's ops, for training_problem(): the ops that read it (forwards,
/// forwards with grad, backwards) and the backward that writes its gradient.
struct WeightUse {
    std::string name;
    Bytes bytes = 0;
    std::vector<OpId> readers;
    OpId gradient_writer{};
};

namespace detail {

// What a copied base data becomes: its bytes and whether it may be offloaded.
struct CopiedData {
    Bytes bytes = 0;
    bool offloadable = false;
};

// `base` with, for each weight, its data `w<suffix>`, gradient `gw<suffix>`, optimizer state
// `m<suffix>`, marker `u<suffix>` and update `U<suffix>` (suffix: the stage number of a chain,
// ":name" otherwise); `copy(d)` says what base data d becomes.
template <class CopyData>
[[nodiscard]] Problem with_weights(const Problem& base, std::span<const WeightUse> weights,
                                   const std::vector<std::string>& suffixes, const TrainingStateOptions& options,
                                   const CopyData& copy) {
    ProblemBuilder b(base.name());
    for (std::size_t k = 0; k < base.data_count(); ++k) {
        const CopiedData data = copy(DataId{k});
        b.add_data(base.data(DataId{k}).name, data.bytes, data.offloadable);
    }
    struct Ids {
        DataId w, gw, u;
        std::optional<DataId> m;  // none when the optimizer keeps no state
    };
    std::vector<Ids> ids;
    for (std::size_t i = 0; i < weights.size(); ++i) {
        const WeightUse& weight = weights[i];
        if (weight.bytes <= 0)
            throw InvalidInput("training_problem: weight '" + weight.name + "' of '" + base.name() + "' has " +
                               std::to_string(weight.bytes) + " bytes; leave out weights without bytes");
        const auto state = options.gradients_to_caller
                               ? Bytes{0}
                               : static_cast<Bytes>(options.optimizer_state_per_parameter * static_cast<double>(weight.bytes));
        Ids id{b.add_data("w" + suffixes[i], weight.bytes, options.offloadable), b.add_data("gw" + suffixes[i], weight.bytes),
               DataId{}, std::nullopt};
        if (state > 0) id.m = b.add_data("m" + suffixes[i], state, options.offloadable);
        id.u = b.add_data("u" + suffixes[i], 0);
        ids.push_back(id);
    }
    for (std::size_t k = 0; k < base.op_count(); ++k) {
        const Op& op = base.op(OpId{k});
        OpSpec spec{op.name, op.time, op.overhead, op.reads, op.writes, op.exactly_once};
        for (std::size_t i = 0; i < weights.size(); ++i) {
            const WeightUse& weight = weights[i];
            if (std::find(weight.readers.begin(), weight.readers.end(), OpId{k}) != weight.readers.end())
                spec.reads.push_back(ids[i].w);
            if (weight.gradient_writer != OpId{k}) continue;
            spec.writes.push_back(ids[i].gw);
            // A profile that measured the backward with its weight gradients counted them in its
            // overhead; they are a data now.
            if (options.backward_overhead_includes_gradients) spec.overhead = std::max<Bytes>(0, spec.overhead - weight.bytes);
        }
        b.add_op(std::move(spec));
    }
    std::vector<OpId> order(base.autograd_order().begin(), base.autograd_order().end());
    for (std::size_t i = 0; i < weights.size(); ++i) {
        const double time = options.gradients_to_caller
                                ? 0.0
                                : options.update_time_per_parameter_byte * static_cast<double>(weights[i].bytes);
        OpSpec update{"U" + suffixes[i], time, 0, {ids[i].gw}, {ids[i].u}, true};
        update.updates.push_back(ids[i].w);
        if (ids[i].m) update.updates.push_back(*ids[i].m);
        order.push_back(b.add_op(std::move(update)));
        b.add_initial(ids[i].w);
        if (ids[i].m) b.add_initial(*ids[i].m);
        b.add_final(ids[i].u);
        if (options.gradients_to_caller) b.add_final(ids[i].gw);
    }
    for (const DataId d : base.initial()) b.add_initial(d);
    for (const DataId d : base.final_data()) b.add_final(d);
    if (const auto loss = base.loss()) b.set_loss(*loss);
    b.set_autograd_order(std::move(order));
    b.set_transfers(options.transfers);
    return b.build();
}

}  // namespace detail

/// The `remat.problem/2` problem of training any problem's weights: `activations` is kept
/// (its data and ops keep their ids), and for each weight come `w:<name>` (read by its
/// readers), its gradient `gw:<name>` (written by its gradient writer), its optimizer state
/// `m:<name>`, and the update `U:<name>` (reads gw, updates w and m, writes the zero-byte
/// final marker `u:<name>`), after the backward in the autograd order. With
/// TrainingStateOptions::gradients_to_caller, the gradients are final and each update is the
/// caller's optimizer step after the step (no time, no state). Throws InvalidInput for a weight
/// that names an op the problem does not have, or that has no bytes.
[[nodiscard]] inline Problem training_problem(const Problem& activations, std::span<const WeightUse> weights,
                                              const TrainingStateOptions& options = {}) {
    std::vector<std::string> suffixes;
    for (const WeightUse& weight : weights) {
        const auto check = [&](OpId op) {
            if (op.index >= activations.op_count())
                throw InvalidInput("training_problem: weight '" + weight.name + "' names op #" + std::to_string(op.index) +
                                   " but '" + activations.name() + "' has " + std::to_string(activations.op_count()));
        };
        for (const OpId op : weight.readers) check(op);
        check(weight.gradient_writer);
        suffixes.push_back(":" + weight.name);
    }
    return detail::with_weights(activations, weights, suffixes, options, [&](DataId d) {
        return detail::CopiedData{activations.data(d).bytes, activations.data(d).offloadable};
    });
}

/// The `remat.problem/2` problem of training a chain with `parameter_bytes[l - 1]` bytes of
/// weights in stage l. `chain_expansion` is the chain's expansion (§5: `to_problem(chain)`, or
/// a profile's exact problem with the same data and ops): it is kept, and for each stage with
/// weights come `w<l>` (read by F<l>, F<l>+ and B<l>), its gradient `gw<l>` (written by B<l>),
/// its optimizer state `m<l>`, and the update `U<l>` (reads gw<l>, updates w<l> and m<l>,
/// writes the zero-byte final marker `u<l>`). The autograd order runs U1..UL after the
/// backward, as an optimizer step after loss.backward() does. With
/// TrainingStateOptions::gradients_to_caller, the gw<l> are final and U<l> is the caller's
/// optimizer step after the step (no time, no state).
[[nodiscard]] inline Problem training_problem(const Problem& chain_expansion, std::span<const Bytes> parameter_bytes,
                                              const TrainingStateOptions& options = {}) {
    const Problem& base = chain_expansion;
    const std::size_t L = parameter_bytes.size();
    if (base.data_count() != 3 * L + 2 || base.op_count() != 3 * L + 1 || !base.find_op("B" + std::to_string(L)))
        throw InvalidInput("training_problem: '" + base.name() + "' is not the expansion of a chain of " +
                           std::to_string(L) + " stages (one parameter size per stage)");
    const ChainIds ids = chain_ids(L);
    std::vector<char> activation(base.data_count(), 0);
    for (std::size_t l = 1; l <= L; ++l) activation[ids.a[l].index] = activation[ids.s[l].index] = 1;
    std::vector<WeightUse> weights;
    std::vector<std::string> suffixes;
    for (std::size_t l = 1; l <= L; ++l) {
        if (parameter_bytes[l - 1] <= 0) continue;
        weights.push_back({std::to_string(l), parameter_bytes[l - 1], {ids.fwd[l], ids.fwd_grad[l], ids.bwd[l]}, ids.bwd[l]});
        suffixes.push_back(std::to_string(l));
    }
    return detail::with_weights(base, weights, suffixes, options, [&](DataId d) {
        const bool no_input_gradient = !options.input_gradient && d == ids.g[0];
        return detail::CopiedData{no_input_gradient ? 0 : base.data(d).bytes,
                                  options.offloadable_activations && activation[d.index] != 0};
    });
}

/// The same, from a chain (§5).
[[nodiscard]] inline Problem training_problem(const Chain& chain, std::span<const Bytes> parameter_bytes,
                                              const TrainingStateOptions& options = {}) {
    if (parameter_bytes.size() != chain.length())
        throw InvalidInput("training_problem: " + std::to_string(parameter_bytes.size()) + " parameter sizes for the " +
                           std::to_string(chain.length()) + " stages of chain '" + chain.name + "'");
    return training_problem(to_problem(chain), parameter_bytes, options);
}

}  // namespace remat::offload
