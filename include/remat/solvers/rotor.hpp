// remat/solvers/rotor.hpp — Rotor: the optimal persistent schedule of a chain.
//
// Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
// heterogeneous chains: how to train deep neural networks with limited memory" (2019).
// A dynamic program over sub-chains and discretised memory finds the fastest persistent
// schedule: at every level of the recursion the first stage of a sub-chain runs either with
// grad (F_all, keeping what its backward needs) or without grad keeping its input (F_ck),
// followed by no-grad forwards that free their input (F∅) up to the next checkpoint.
//
// The DP is written for K options per stage (Zhao et al., "Rockmate", ICML 2023): each
// stage has one cheap no-grad forward and K alternative (forward with grad, backward)
// pairs, and the F_all branch picks the best. A plain chain is the case K = 1. The core
// works on a RotorChain and returns an abstract RotorSequence of actions; the Rotor solver
// translates it into the docs/formats.md §5 (chains) expansion of a Chain.
//
// The memory model the DP adds up, the peak of each action under the simulator of
// docs/formats.md §3 (simulation semantics), is stated with RotorChain in rotor/chain.hpp.
//
// With slots, every size is rounded up to whole slots and the budget down, so a plan the
// DP accepts always fits under the simulator; with sizes that are multiples of the slot,
// the DP is exact. The DP is O(M·L³) (M slots); it stays fast by pruning F∅ runs whose
// forwards no longer fit, skipping the memory range where a candidate cannot beat the
// row, and keeping its table in single precision (times are compared as excess over a
// lower bound, so ties within ~1e-7 of the recomputation time are broken arbitrarily;
// every reported time is recomputed exactly).
//
// Long chains: the least-memory precomputation is O(K·L² + L³) in time and keeps L(L+1)/2
// entries (24 bytes each); the time table holds L(L+1)/2 rows of M+1 floats. Both sizes are
// checked against RotorOptions::max_table_mib before anything is allocated, and the time
// limit is checked column by column in both phases, which share it; either stops the solve
// with TooLarge (the CLI's exit code 4), whose message suggests fewer slots or a solver that
// scales to long chains (greedy, hrockmate, auto). Times enter the float table scaled when
// they are so large that a float could overflow, so any finite times plan.
//
// Where each phase lives (namespace detail::rotor, under solvers/rotor/):
//   chain.hpp         RotorChain and its memory model, the actions, RotorOptions, validate(),
//                     to_rotor_chain(); the chain in integer units and the slot size;
//   limits.hpp        the memory cap of the tables and the time limit, shared by both phases;
//   least_memory.hpp  the least memory of every sub-chain, with its schedule's branches;
//   table.hpp         the DP's time table and its kernels;
//   expansion.hpp     choices turned into actions: the table's, the least-memory fallback's,
//                     and the store-all sequence.
// This header holds rotor_evaluate() (the memory model as a checker), rotor_to_schedule(),
// rotor_smallest_budget(), rotor_plan() (the solve driver: slot size, least memory, table,
// expansion, the final check) and the solver, class Rotor.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"
#include "rotor/chain.hpp"
#include "rotor/expansion.hpp"
#include "rotor/least_memory.hpp"
#include "rotor/limits.hpp"
#include "rotor/table.hpp"

namespace remat {

/// What a RotorSequence costs under the memory model of rotor/chain.hpp (exact bytes): valid
/// or the first invalid action and why. For a plain chain this equals simulate() on the
/// translated schedule.
struct RotorEvaluation {
    bool valid = false;
    std::string error;
    double time = 0.0;
    Bytes peak = 0;
};

namespace detail::rotor {

// rotor_evaluate's walk through a sequence: what is live, and the time and peak so far. Each
// action is checked before it changes anything; a step returns why its action is invalid,
// or an empty string.
class RotorEvaluator {
public:
    explicit RotorEvaluator(const RotorChain& chain)
        : chain_(chain), L_(chain.length()), act_(L_ + 1, 0), grad_(L_ + 1, 0), backward_done_(L_ + 1, 0),
          saved_(L_ + 1), mem_(chain.activation_bytes(0)) {
        act_[0] = 1;
        ev_.peak = mem_;
    }

    [[nodiscard]] const RotorEvaluation& evaluation() const noexcept { return ev_; }

    [[nodiscard]] std::string run(const RotorAction& a) {
        using K = RotorAction::Kind;
        const std::size_t l = a.stage;
        if (a.kind != K::loss && (l > L_ || (l == 0 && a.kind != K::free_activation)))
            return "stage " + std::to_string(l) + " does not exist";
        Bytes during = mem_;
        std::string why;
        switch (a.kind) {
            case K::forward_nograd: why = forward_nograd(l, during); break;
            case K::forward: why = forward(l, a.option, during); break;
            case K::loss: why = loss(during); break;
            case K::backward: why = backward(l, a.option, during); break;
            case K::free_activation: why = free_activation(l); break;
        }
        if (why.empty()) ev_.peak = std::max({ev_.peak, during, mem_});
        return why;
    }

    // After the last action: what the sequence left undone.
    [[nodiscard]] std::string missing() const {
        if (!loss_done_) return "the loss never ran";
        for (std::size_t l = 1; l <= L_; ++l)
            if (!backward_done_[l]) return "backward of stage " + std::to_string(l) + " never ran";
        if (!grad_[0]) return "g0 is not live at the end";
        return {};
    }

private:
    [[nodiscard]] Bytes x(std::size_t l) const { return chain_.activation_bytes(l); }
    [[nodiscard]] Bytes y(std::size_t l) const { return chain_.gradient_bytes(l); }

    std::string forward_nograd(std::size_t l, Bytes& during) {
        const std::string sl = std::to_string(l);
        if (!act_[l - 1]) return "forward of stage " + sl + " without its input";
        if (act_[l]) return "forward of stage " + sl + " while its output is live";
        during = mem_ + x(l) + chain_.stages[l - 1].nograd_overhead;
        mem_ += x(l);
        act_[l] = 1;
        ev_.time += chain_.stages[l - 1].nograd_time;
        return {};
    }

    std::string forward(std::size_t l, std::size_t option, Bytes& during) {
        const std::string sl = std::to_string(l);
        if (option >= chain_.stages[l - 1].options.size()) return "stage " + sl + " has no such option";
        const RotorOption& o = chain_.stages[l - 1].options[option];
        if (!act_[l - 1]) return "forward of stage " + sl + " without its input";
        if (act_[l]) return "forward of stage " + sl + " while its output is live";
        during = mem_ + o.saved_bytes + o.fwd_overhead;
        mem_ += o.saved_bytes;
        act_[l] = 1;
        saved_[l] = option;
        ev_.time += o.fwd_time;
        return {};
    }

    std::string loss(Bytes& during) {
        if (loss_done_) return "the loss runs twice";
        if (!act_[L_]) return "loss without the chain output";
        during = mem_ + y(L_) + chain_.loss_overhead;
        mem_ += y(L_);
        grad_[L_] = 1;
        loss_done_ = true;
        ev_.time += chain_.loss_time;
        return {};
    }

    std::string backward(std::size_t l, std::size_t option, Bytes& during) {
        const std::string sl = std::to_string(l);
        if (backward_done_[l]) return "backward of stage " + sl + " runs twice";
        if (!saved_[l] || *saved_[l] != option)
            return "backward of stage " + sl + " without the saved data of option " + std::to_string(option);
        if (!grad_[l]) return "backward of stage " + sl + " without its output gradient";
        if (!act_[l - 1]) return "backward of stage " + sl + " without its input";
        const RotorOption& o = chain_.stages[l - 1].options[option];
        during = mem_ + y(l - 1) + o.bwd_overhead;
        mem_ += y(l - 1) - o.saved_bytes - y(l);
        grad_[l - 1] = 1;
        grad_[l] = 0;
        act_[l] = 0;
        saved_[l].reset();
        backward_done_[l] = 1;
        ev_.time += o.bwd_time;
        return {};
    }

    std::string free_activation(std::size_t l) {
        const std::string sl = std::to_string(l);
        if (l == 0) return "the chain input a0 belongs to the caller and is never freed";
        if (!act_[l]) return "free of a" + sl + ", which is not live";
        if (saved_[l]) return "free of a" + sl + " while the saved data of stage " + sl + " hold it";
        mem_ -= x(l);
        act_[l] = 0;
        return {};
    }

    const RotorChain& chain_;
    std::size_t L_;
    std::vector<char> act_, grad_, backward_done_;
    std::vector<std::optional<std::size_t>> saved_;
    bool loss_done_ = false;
    Bytes mem_;
    RotorEvaluation ev_;
};

}  // namespace detail::rotor

[[nodiscard]] inline RotorEvaluation rotor_evaluate(const RotorChain& chain, const std::vector<RotorAction>& actions) {
    detail::rotor::RotorEvaluator walk(chain);
    const auto fail = [&](std::size_t i, const std::string& why) {
        RotorEvaluation ev = walk.evaluation();
        ev.valid = false;
        ev.error = "action " + std::to_string(i) + ": " + why;
        return ev;
    };
    for (std::size_t i = 0; i < actions.size(); ++i)
        if (const std::string why = walk.run(actions[i]); !why.empty()) return fail(i, why);
    if (const std::string why = walk.missing(); !why.empty()) return fail(actions.size(), why);
    RotorEvaluation ev = walk.evaluation();
    ev.valid = true;
    return ev;
}

/// The plain-chain schedule (ids of chain_ids(L)) of an action sequence with K = 1.
[[nodiscard]] inline Schedule rotor_to_schedule(const std::vector<RotorAction>& actions, std::size_t length) {
    const ChainIds id = chain_ids(length);
    Schedule out;
    out.reserve(actions.size() * 2);
    for (const RotorAction& a : actions) {
        switch (a.kind) {
            case RotorAction::Kind::forward_nograd: out.push_back(Step::run(id.fwd.at(a.stage))); break;
            case RotorAction::Kind::forward: out.push_back(Step::run(id.fwd_grad.at(a.stage))); break;
            case RotorAction::Kind::loss: out.push_back(Step::run(id.loss)); break;
            case RotorAction::Kind::backward:
                out.push_back(Step::run(id.bwd.at(a.stage)));
                out.push_back(Step::free(id.g.at(a.stage)));
                out.push_back(Step::free(id.s.at(a.stage)));
                out.push_back(Step::free(id.a.at(a.stage)));
                break;
            case RotorAction::Kind::free_activation: out.push_back(Step::free(id.a.at(a.stage))); break;
        }
    }
    return out;
}

namespace detail::rotor {

// The options with RotorOptions::more_slots_for_short_chains applied: slots raised to what
// keeps L³ · slots within 100³ · 500 and the time table within 16 MiB.
[[nodiscard]] inline RotorOptions with_slots_for_length(const RotorChain& chain, RotorOptions options) {
    if (!options.more_slots_for_short_chains || options.slot_bytes) return options;
    const auto L = static_cast<double>(chain.length());
    const RotorMoves moves = moves_of(options.schedule_class, chain.length());
    const double rows = static_cast<double>(RotorTable::rows_per_pair(moves.release ? most_options(chain) : 0, moves)) *
                        L * (L + 1) / 2;
    const double by_work = 100.0 * 100.0 * 100.0 * 500.0 / (L * L * L);
    const double by_table = 16.0 * 1024 * 1024 / sizeof(float) / rows;
    const double slots = std::min(by_work, by_table);
    if (slots > static_cast<double>(options.slots)) options.slots = static_cast<std::size_t>(slots);
    return options;
}

}  // namespace detail::rotor

/// The least peak (bytes, exact) of any persistent schedule of `chain` under the memory
/// model of rotor/chain.hpp: the smallest budget for which Rotor with exact sizes has a plan. Computed
/// by a min-max recursion over the same branches as the DP (O(K·L² + L³)); the options'
/// time limit and memory cap apply (TooLarge).
[[nodiscard]] inline Bytes rotor_smallest_budget(const RotorChain& chain, const RotorOptions& options = {}) {
    validate(chain);
    const detail::rotor::RotorLimits limits(chain.length(), options);
    const detail::rotor::RotorUnits u = detail::rotor::make_units(chain, 1);
    const detail::rotor::RotorNeeds n =
        detail::rotor::compute_needs(u, limits, detail::rotor::moves_of(options.schedule_class, chain.length()));
    return n.need[n.at(1, chain.length())];
}

/// The fastest persistent schedule of `chain` within `budget` bytes (the DP of
/// Beaumont et al. 2019, with K options per stage). Throws Infeasible with the smallest
/// budget that works when `budget` is too small. With `slots` (no fixed slot size), when
/// slot rounding leaves the DP no plan although the exact least-memory schedule fits,
/// that schedule is returned (optimal = false). Throws TooLarge, before any O(L³) work, when
/// a table would exceed max_table_mib, and when the time limit runs out.
[[nodiscard]] inline RotorSequence rotor_plan(const RotorChain& chain, Bytes budget, const RotorOptions& options = {}) {
    validate(chain);
    const std::size_t L = chain.length();
    const detail::rotor::RotorLimits limits(L, options);
    const auto stats_line = [&](Bytes unit, std::size_t M) {
        return "rotor chain '" + printable(chain.name) + "': " + std::to_string(L) + " stages, slot " +
               std::to_string(unit) + " bytes, " + std::to_string(M) + " slots";
    };
    const Bytes unit = detail::rotor::rotor_slot(chain, budget, detail::rotor::with_slots_for_length(chain, options));
    const Bytes M = budget < 0 ? -1 : budget / unit;
    const detail::rotor::RotorMoves moves = detail::rotor::moves_of(options.schedule_class, L);
    if (M >= 0)
        detail::rotor::RotorTable::check_size(L, static_cast<std::size_t>(M) + 1, limits,
                                              moves.release ? detail::rotor::most_options(chain) : 0, moves);
    // The sub-chains' least memory in slots; in exact bytes too only when the slots leave no
    // plan (rounding up, a need in slots that fits proves the budget above the exact one).
    const bool release = moves.release;
    const detail::rotor::RotorUnits units = detail::rotor::make_units(chain, unit);
    const detail::rotor::RotorNeeds needs = detail::rotor::compute_needs(units, limits, moves);
    const Bytes need = needs.need[needs.at(1, L)];
    std::optional<detail::rotor::RotorUnits> exact_units;
    std::optional<detail::rotor::RotorNeeds> exact_needs;
    Bytes smallest = need * unit;
    if (M < need) {
        exact_units = unit == 1 ? units : detail::rotor::make_units(chain, 1);
        exact_needs = unit == 1 ? needs : detail::rotor::compute_needs(*exact_units, limits, moves);
        smallest = exact_needs->need[exact_needs->at(1, L)];
    }
    if (!options.slot_bytes && budget < smallest)
        throw Infeasible(std::string(release ? "rotor-release" : "rotor") + " needs at least " + std::to_string(smallest) +
                             " bytes for '" + printable(chain.name) + "' (the least peak of any " +
                             (release ? "schedule of its class, persistent or releasing checkpoints"
                                      : "persistent schedule") +
                             "), above the budget of " + std::to_string(budget) + " bytes",
                         budget, smallest);

    RotorSequence seq;
    seq.slot_bytes = unit;
    if (M < need) {
        seq.actions =
            detail::rotor::rotor_least_memory(chain, budget, unit, need, smallest, *exact_units, *exact_needs, options);
        seq.optimal = false;
        seq.slots = 0;
        report_progress(options.progress, stats_line(unit, 0) + ": slot rounding left no plan, least-memory schedule");
    } else {
        const auto width = static_cast<std::size_t>(M);
        report_progress(options.progress, stats_line(unit, width));
        const detail::rotor::RotorTable table(units, needs, width, options, limits);
        seq.actions = detail::rotor::expand_rotor(units, M, [&](const detail::rotor::RotorTask& t) {
            const auto m = static_cast<std::size_t>(t.m);
            return table.choose(t.shape, t.a, t.b, m);
        });
        seq.slots = width;
    }
    const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
    if (!ev.valid || ev.peak > budget)
        throw SolverError("rotor: internal plan for '" + printable(chain.name) + "' is " +
                          (ev.valid ? "over budget (peak " + std::to_string(ev.peak) + ")" : "invalid: " + ev.error) +
                          " (this is a bug in the solver; please report it with the chain)");
    seq.time = ev.time;
    seq.peak = ev.peak;
    // Rounding can hide that storing everything fits; when it does, nothing is faster.
    const std::vector<RotorAction> all = detail::rotor::store_all_actions(chain);
    const RotorEvaluation store_all = rotor_evaluate(chain, all);
    if (store_all.valid && store_all.peak <= budget && store_all.time < seq.time) {
        seq.actions = all;
        seq.time = store_all.time;
        seq.peak = store_all.peak;
        seq.optimal = true;
    }
    return seq;
}

namespace detail::rotor {

// " class=..." for a class wider than Rotor's, resolved by the chain's length.
[[nodiscard]] inline std::string class_label(RotorClass c, std::size_t stages) {
    if (c == RotorClass::persistent) return {};
    const RotorMoves moves = moves_of(c, stages);
    return " class=" + std::string(moves.early ? "release_early" : "release");
}

// What the chain solvers (Rotor, RotorRelease) share: the problem recognised as a chain, the
// DP with `options`, the schedule checked by the simulator, named `solver`.
[[nodiscard]] inline Plan solve_chain_problem(const Problem& problem, const Chain& chain, Bytes budget,
                                              const RotorOptions& options, std::string_view solver) {
    const auto start = std::chrono::steady_clock::now();
    const RotorSequence seq = rotor_plan(to_rotor_chain(chain), budget, options);
    SolverStats stats{std::string(solver), 0.0, seq.optimal ? SolveStatus::optimal : SolveStatus::feasible, std::nullopt,
                      "slot_bytes=" + std::to_string(seq.slot_bytes) + " slots=" + std::to_string(seq.slots) +
                          class_label(options.schedule_class, chain.length()) +
                          (seq.optimal ? "" : " (least-memory fallback)")};
    Schedule schedule = rotor_to_schedule(seq.actions, chain.length());
    stats.solve_seconds = seconds_since(start);
    return make_checked_plan(problem, std::move(schedule), budget, std::move(stats));
}

[[nodiscard]] inline Chain chain_of(const Problem& problem, std::string_view solver) {
    std::optional<Chain> chain = as_chain(problem);
    if (!chain)
        throw InvalidInput(std::string(solver) + ": problem '" + printable(problem.name()) +
                           "' is not a chain (the docs/formats.md §5 (chains) expansion); use the checkmate or rockmate "
                           "solver for general graphs");
    return std::move(*chain);
}

// Smallest budget the DP with these options accepts: exact without a fixed slot size, whole
// slots with one.
[[nodiscard]] inline Bytes chain_smallest_budget(const RotorChain& chain, const RotorOptions& options) {
    if (!options.slot_bytes) return rotor_smallest_budget(chain, options);
    if (*options.slot_bytes < 1) throw InvalidInput("rotor: slot_bytes must be at least 1");
    validate(chain);
    const RotorUnits u = make_units(chain, *options.slot_bytes);
    const RotorNeeds n = compute_needs(u, RotorLimits(chain.length(), options),
                                       moves_of(options.schedule_class, chain.length()));
    return n.need[n.at(1, chain.length())] * *options.slot_bytes;
}

}  // namespace detail::rotor

/// The Rotor solver on chains (docs/formats.md §5 (chains)): the optimal persistent schedule within the
/// budget, checked by the simulator. RotorRelease (solvers/rotor_release.hpp) is the same
/// solver over a wider class of schedules.
class Rotor {
public:
    explicit Rotor(RotorOptions options = {}) : options_(std::move(options)) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "rotor"; }
    [[nodiscard]] const RotorOptions& options() const noexcept { return options_; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        return detail::rotor::solve_chain_problem(problem, detail::rotor::chain_of(problem, solver_), budget, options_,
                                                  solver_);
    }

    [[nodiscard]] Plan solve(const Chain& chain, Bytes budget) const {
        return detail::rotor::solve_chain_problem(to_problem(chain), chain, budget, options_, solver_);
    }

    /// Smallest budget this solver (with these options) accepts for `chain`, exactly.
    [[nodiscard]] Bytes smallest_budget(const Chain& chain) const { return smallest_budget(to_rotor_chain(chain)); }

    /// The same for a multi-option chain: exact without a fixed slot size, whole slots with one.
    [[nodiscard]] Bytes smallest_budget(const RotorChain& chain) const {
        return detail::rotor::chain_smallest_budget(chain, options_);
    }

protected:
    // A solver of this family under its own name (the plans' and the messages').
    Rotor(RotorOptions options, std::string_view solver) : options_(std::move(options)), solver_(solver) {}

private:
    RotorOptions options_;
    std::string_view solver_ = name();
};

}  // namespace remat
