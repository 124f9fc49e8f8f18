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
// Memory model (the docs/formats.md §3 (simulation semantics) simulator, stage l has input a_{l-1} of x_{l-1} bytes,
// output a_l of x_l bytes and gradients g_l, g_{l-1} of y_l, y_{l-1} bytes; "S" is whatever
// else is live):
//   forward_nograd(l)  S+{a_{l-1}}           → S+{a_{l-1},a_l}       peak S + x_{l-1} + x_l + nograd_overhead
//   forward(l,k)       S+{a_{l-1}}           → S+{a_{l-1}}+Saved_k   peak S + x_{l-1} + saved_bytes + fwd_overhead
//   loss               S+{a_L}               → S+{a_L,g_L}           peak S + y_L + loss_overhead (S includes a_L)
//   backward(l,k)      S+{a_{l-1}}+Saved_k+{g_l} → S+{a_{l-1},g_{l-1}}
//                                             peak S + x_{l-1} + saved_bytes + y_l + y_{l-1} + bwd_overhead
//   free_activation(l) frees a_l.
// On a plain chain y_l = x_l. They differ on Rockmate's blocks, where the gradient of a
// separator read by several ops of the next block arrives as several contributions.
// Saved_k always contains a_l (saved_bytes ≥ out_bytes, unless the forward frees its input:
// see RotorOption); backward frees Saved_k and g_l.
// A block of Rockmate with option k = (forward sub-schedule F, backward sub-schedule B)
// maps onto it as: fwd_time = time(F); saved_bytes = what F leaves live beside the block
// input; fwd_overhead = peak(F) − (live before F) − saved_bytes; bwd_time = time(B);
// bwd_overhead = peak(B) − (live before B) − y_{l-1}; F and B must keep a_{l-1} live.
// In a sub-chain (a, b) the F∅/F_ck forwards run while g_b is live (for b < L), the input
// a_{a-1} stays live throughout, and a checkpoint a_{j-1} is freed right after the part
// above it is back-propagated; these are exactly the peaks the DP adds up.
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

namespace remat {

/// One (forward with grad, backward) alternative of a stage. Sizes in bytes, relative to
/// the state the action starts from (see the memory model above):
struct RotorOption {
    double fwd_time = 0.0;
    double bwd_time = 0.0;
    /// Everything the forward leaves live for the backward, the stage output a_l included
    /// and its input a_{l-1} excluded (for a plain chain: Stage::saved_bytes = a_l + s_l).
    /// A forward that frees its input (a Rockmate block whose input neither its backward nor
    /// the block before reads) counts it negatively: saved_bytes ≥ x_l − x_{l-1}. The model
    /// then keeps a_{l-1} until backward(l-1) or free_activation(l-1) frees it, which
    /// overestimates the memory after backward(l) by x_{l-1}, never underestimates it.
    Bytes saved_bytes = 0;
    /// Forward peak = (live before) + saved_bytes + fwd_overhead. Must be ≥ 0.
    Bytes fwd_overhead = 0;
    /// Backward peak = (live before, i.e. a_{l-1} + Saved + g_l + the rest) + y_{l-1} + bwd_overhead,
    /// where y_{l-1} accounts for g_{l-1}. May be negative (a block that frees g_l or saved
    /// data before it writes g_{l-1}), but the peak may not be below the start or end state:
    /// bwd_overhead ≥ −y_{l-1} and bwd_overhead ≥ −(saved_bytes + y_l).
    Bytes bwd_overhead = 0;
    friend bool operator==(const RotorOption&, const RotorOption&) = default;
};

struct RotorStage {
    /// x_l: size of the stage output a_l (and of its gradient g_l unless grad_bytes says otherwise).
    Bytes out_bytes = 0;
    /// The cheap forward without grad: writes only a_l.
    double nograd_time = 0.0;
    /// Its peak = (live before, a_{l-1} included) + x_l + nograd_overhead. Must be ≥ 0.
    Bytes nograd_overhead = 0;
    /// K ≥ 1 alternatives.
    std::vector<RotorOption> options;
    /// y_l: size of the gradient g_l when it differs from out_bytes.
    std::optional<Bytes> grad_bytes;
    friend bool operator==(const RotorStage&, const RotorStage&) = default;
};

struct RotorChain {
    std::string name;
    /// x_0: size of the chain input a_0 (live throughout, never freed) and of g_0 unless
    /// input_grad_bytes says otherwise.
    Bytes input_bytes = 0;
    std::vector<RotorStage> stages;
    /// The loss reads a_L and writes g_L; its peak = (live before) + y_L + loss_overhead.
    double loss_time = 0.0;
    Bytes loss_overhead = 0;
    /// y_0: size of the gradient g_0 when it differs from input_bytes.
    std::optional<Bytes> input_grad_bytes;

    [[nodiscard]] std::size_t length() const noexcept { return stages.size(); }
    /// x_l for l = 0..L.
    [[nodiscard]] Bytes activation_bytes(std::size_t l) const {
        return l == 0 ? input_bytes : stages.at(l - 1).out_bytes;
    }
    /// y_l for l = 0..L.
    [[nodiscard]] Bytes gradient_bytes(std::size_t l) const {
        return l == 0 ? input_grad_bytes.value_or(input_bytes) : stages.at(l - 1).grad_bytes.value_or(stages.at(l - 1).out_bytes);
    }
    friend bool operator==(const RotorChain&, const RotorChain&) = default;
};

/// One step of an abstract Rotor schedule. `stage` is 1-based (unused for the loss; a_0 is
/// never freed); `option` indexes RotorStage::options (unused for no-grad forwards).
struct RotorAction {
    enum class Kind : unsigned char { forward_nograd, forward, loss, backward, free_activation };
    Kind kind = Kind::forward_nograd;
    std::size_t stage = 0;
    std::size_t option = 0;
    friend bool operator==(const RotorAction&, const RotorAction&) = default;
};

struct RotorSequence {
    std::vector<RotorAction> actions;
    double time = 0.0;  ///< total time of the actions
    Bytes peak = 0;     ///< exact peak in bytes under the memory model above
    /// True when the plan is optimal among persistent schedules within the slot model (or
    /// stores everything, which nothing beats); false for the least-memory fallback used
    /// when slot rounding left the DP no plan.
    bool optimal = true;
    Bytes slot_bytes = 1;
    std::size_t slots = 0;  ///< memory slots of the DP (floor(budget / slot_bytes))
};

struct RotorOptions {
    /// Number of memory slots the budget is cut into (when slot_bytes is not given).
    /// When every size is a multiple of a common unit g and budget/g ≤ slots, the slot is
    /// g and the DP is exact; otherwise the slot is ⌈budget/slots⌉ rounded up to a multiple of g.
    std::size_t slots = 500;
    /// A fixed slot size in bytes; overrides `slots`. With it the solver is monotone in
    /// the budget and Infeasible reports the smallest budget that works at this slot size.
    std::optional<Bytes> slot_bytes;
    /// Give up (TooLarge, a SolverError) when the solve runs longer than this, checked in the
    /// precomputation and in the table; must be positive when given.
    std::optional<double> time_limit_seconds;
    /// Receives progress lines (the table's size, columns filled); empty means silence.
    ProgressCallback progress;
    /// Memory cap of each of the DP's tables (the time table: L(L+1)/2 rows of slots + 1
    /// floats; the least-memory table: L(L+1)/2 entries of 24 bytes): beyond it the solve
    /// stops with TooLarge saying how large the table would be, instead of allocating it.
    std::size_t max_table_mib = 2048;
};

namespace detail {

[[nodiscard]] inline Bytes magnitude(Bytes v) noexcept { return v < 0 ? -v : v; }

// Every memory figure of the model is a sum of distinct terms of the chain: its sizes must add
// up within Bytes (problem.hpp's policy, for the model's own terms), and its times, times the
// number of stages (a stage recomputed once per stage), must stay finite.
inline void check_rotor_totals(const RotorChain& chain, const std::string& who) {
    constexpr Bytes max = std::numeric_limits<Bytes>::max();
    Bytes total = 0;
    bool overflow = false;
    const auto add = [&](Bytes v) {
        v = magnitude(v);
        overflow = overflow || v > max - total;
        if (!overflow) total += v;
    };
    double time = chain.loss_time;
    add(chain.input_bytes);
    add(chain.gradient_bytes(0));
    add(chain.loss_overhead);
    for (std::size_t l = 1; l <= chain.length(); ++l) {
        const RotorStage& s = chain.stages[l - 1];
        add(s.out_bytes);
        add(chain.gradient_bytes(l));
        add(s.nograd_overhead);
        Bytes option_bytes = 0;
        double option_time = 0.0;
        for (const RotorOption& o : s.options) {
            const Bytes parts[] = {magnitude(o.saved_bytes), o.fwd_overhead, magnitude(o.bwd_overhead)};
            for (const Bytes part : parts) {
                overflow = overflow || part > max - option_bytes;
                if (!overflow) option_bytes += part;
            }
            option_time = std::max(option_time, o.fwd_time + o.bwd_time);
        }
        add(option_bytes);
        time += s.nograd_time + option_time;
    }
    if (overflow)
        throw InvalidInput(who + ": its sizes add up to more than 2^63 - 1 bytes; remat counts memory in signed 64-bit "
                                 "bytes: give the sizes in a coarser unit");
    if (!std::isfinite(time * static_cast<double>(chain.length() + 1)))
        throw InvalidInput(who + ": its times add up to " + std::to_string(time) +
                           ", too large for sums of recomputations to stay finite; give the times in a coarser unit");
}

}  // namespace detail

/// Throws InvalidInput naming the stage and option when a RotorChain breaks the rules above.
inline void validate(const RotorChain& chain) {
    const std::string who = "rotor chain '" + printable(chain.name) + "'";
    if (chain.stages.empty()) throw InvalidInput(who + " has no stages");
    if (chain.input_bytes < 0) throw InvalidInput(who + ": input_bytes is negative");
    if (chain.input_grad_bytes && *chain.input_grad_bytes < 0) throw InvalidInput(who + ": input_grad_bytes is negative");
    if (chain.loss_overhead < 0) throw InvalidInput(who + ": loss_overhead is negative");
    if (!std::isfinite(chain.loss_time) || chain.loss_time < 0) throw InvalidInput(who + ": loss_time must be finite and >= 0");
    for (std::size_t l = 1; l <= chain.length(); ++l) {
        const RotorStage& s = chain.stages[l - 1];
        const std::string st = who + " stage " + std::to_string(l);
        if (s.out_bytes < 0) throw InvalidInput(st + ": out_bytes is negative");
        if (s.grad_bytes && *s.grad_bytes < 0) throw InvalidInput(st + ": grad_bytes is negative");
        if (!std::isfinite(s.nograd_time) || s.nograd_time < 0) throw InvalidInput(st + ": nograd_time must be finite and >= 0");
        if (s.nograd_overhead < 0) throw InvalidInput(st + ": nograd_overhead is negative");
        if (s.options.empty()) throw InvalidInput(st + " has no options; give at least one (forward, backward) option");
        const Bytes in = chain.gradient_bytes(l - 1);
        const Bytes out = chain.gradient_bytes(l);
        if (s.options.size() > std::numeric_limits<std::uint32_t>::max())
            throw InvalidInput(st + " has more than 2^32 - 1 options");
        for (std::size_t k = 0; k < s.options.size(); ++k) {
            const RotorOption& o = s.options[k];
            const std::string op = st + " option " + std::to_string(k);
            if (!std::isfinite(o.fwd_time) || o.fwd_time < 0) throw InvalidInput(op + ": fwd_time must be finite and >= 0");
            if (!std::isfinite(o.bwd_time) || o.bwd_time < 0) throw InvalidInput(op + ": bwd_time must be finite and >= 0");
            if (o.saved_bytes < s.out_bytes - chain.activation_bytes(l - 1))
                throw InvalidInput(op + ": saved_bytes (" + std::to_string(o.saved_bytes) + ") is below out_bytes (" +
                                   std::to_string(s.out_bytes) + ") minus the input (" +
                                   std::to_string(chain.activation_bytes(l - 1)) +
                                   "); the saved data include the stage output");
            if (o.fwd_overhead < 0) throw InvalidInput(op + ": fwd_overhead is negative");
            if (o.bwd_overhead < -in || o.bwd_overhead < -(o.saved_bytes + out))
                throw InvalidInput(op + ": bwd_overhead " + std::to_string(o.bwd_overhead) +
                                   " puts the backward peak below its start or end state");
        }
    }
    detail::check_rotor_totals(chain, who);
}

/// A plain chain as a RotorChain with one option per stage (K = 1).
[[nodiscard]] inline RotorChain to_rotor_chain(const Chain& chain) {
    validate(chain);
    RotorChain out{chain.name, chain.input_bytes, {}, 0.0, 0, std::nullopt};
    out.stages.reserve(chain.length());
    for (const Stage& s : chain.stages)
        out.stages.push_back(RotorStage{s.out_bytes, s.fwd_time, s.fwd_overhead,
                                        {RotorOption{s.fwd_time, s.bwd_time, s.saved_bytes, s.fwd_overhead, s.bwd_overhead}},
                                        std::nullopt});
    return out;
}

/// What a RotorSequence costs under the memory model above (exact bytes): valid or the
/// first invalid action and why. For a plain chain this equals simulate() on the
/// translated schedule.
struct RotorEvaluation {
    bool valid = false;
    std::string error;
    double time = 0.0;
    Bytes peak = 0;
};

[[nodiscard]] inline RotorEvaluation rotor_evaluate(const RotorChain& chain, const std::vector<RotorAction>& actions) {
    RotorEvaluation ev;
    const std::size_t L = chain.length();
    const auto x = [&](std::size_t l) { return chain.activation_bytes(l); };
    const auto y = [&](std::size_t l) { return chain.gradient_bytes(l); };
    std::vector<char> act(L + 1, 0), grad(L + 1, 0), backward_done(L + 1, 0);
    std::vector<std::optional<std::size_t>> saved(L + 1);
    bool loss_done = false;
    act[0] = 1;
    Bytes mem = x(0);
    ev.peak = mem;
    const auto fail = [&](std::size_t i, const std::string& why) {
        ev.valid = false;
        ev.error = "action " + std::to_string(i) + ": " + why;
        return ev;
    };
    for (std::size_t i = 0; i < actions.size(); ++i) {
        const RotorAction& a = actions[i];
        const std::size_t l = a.stage;
        const std::string sl = std::to_string(l);
        if (a.kind != RotorAction::Kind::loss && (l > L || (l == 0 && a.kind != RotorAction::Kind::free_activation)))
            return fail(i, "stage " + sl + " does not exist");
        Bytes during = mem;
        switch (a.kind) {
            case RotorAction::Kind::forward_nograd: {
                if (!act[l - 1]) return fail(i, "forward of stage " + sl + " without its input");
                if (act[l]) return fail(i, "forward of stage " + sl + " while its output is live");
                during = mem + x(l) + chain.stages[l - 1].nograd_overhead;
                mem += x(l);
                act[l] = 1;
                ev.time += chain.stages[l - 1].nograd_time;
                break;
            }
            case RotorAction::Kind::forward: {
                if (a.option >= chain.stages[l - 1].options.size()) return fail(i, "stage " + sl + " has no such option");
                const RotorOption& o = chain.stages[l - 1].options[a.option];
                if (!act[l - 1]) return fail(i, "forward of stage " + sl + " without its input");
                if (act[l]) return fail(i, "forward of stage " + sl + " while its output is live");
                during = mem + o.saved_bytes + o.fwd_overhead;
                mem += o.saved_bytes;
                act[l] = 1;
                saved[l] = a.option;
                ev.time += o.fwd_time;
                break;
            }
            case RotorAction::Kind::loss: {
                if (loss_done) return fail(i, "the loss runs twice");
                if (!act[L]) return fail(i, "loss without the chain output");
                during = mem + y(L) + chain.loss_overhead;
                mem += y(L);
                grad[L] = 1;
                loss_done = true;
                ev.time += chain.loss_time;
                break;
            }
            case RotorAction::Kind::backward: {
                if (backward_done[l]) return fail(i, "backward of stage " + sl + " runs twice");
                if (!saved[l] || *saved[l] != a.option)
                    return fail(i, "backward of stage " + sl + " without the saved data of option " + std::to_string(a.option));
                if (!grad[l]) return fail(i, "backward of stage " + sl + " without its output gradient");
                if (!act[l - 1]) return fail(i, "backward of stage " + sl + " without its input");
                const RotorOption& o = chain.stages[l - 1].options[a.option];
                during = mem + y(l - 1) + o.bwd_overhead;
                mem += y(l - 1) - o.saved_bytes - y(l);
                grad[l - 1] = 1;
                grad[l] = 0;
                act[l] = 0;
                saved[l].reset();
                backward_done[l] = 1;
                ev.time += o.bwd_time;
                break;
            }
            case RotorAction::Kind::free_activation: {
                if (l == 0) return fail(i, "the chain input a0 belongs to the caller and is never freed");
                if (!act[l]) return fail(i, "free of a" + sl + ", which is not live");
                if (saved[l]) return fail(i, "free of a" + sl + " while the saved data of stage " + sl + " hold it");
                mem -= x(l);
                act[l] = 0;
                break;
            }
        }
        ev.peak = std::max({ev.peak, during, mem});
    }
    if (!loss_done) return fail(actions.size(), "the loss never ran");
    for (std::size_t l = 1; l <= L; ++l)
        if (!backward_done[l]) return fail(actions.size(), "backward of stage " + std::to_string(l) + " never ran");
    if (!grad[0]) return fail(actions.size(), "g0 is not live at the end");
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

namespace detail {

// Rounds up for any sign (unit > 0): the conservative direction for memory.
[[nodiscard]] constexpr Bytes ceil_units(Bytes v, Bytes unit) noexcept {
    return v >= 0 ? (v / unit) + (v % unit != 0 ? 1 : 0) : -((-v) / unit);
}

// The chain in integer units (bytes when unit = 1, slots otherwise), every term rounded up,
// with the per-option peaks of the memory model precomputed. Indices are 1-based stages.
struct RotorUnits {
    struct Option {
        Bytes fwd = 0;     // x_{l-1} + saved + fwd_overhead (the upper gradient comes on top)
        Bytes bwd = 0;     // x_{l-1} + saved + y_l + y_{l-1} + bwd_overhead
        Bytes extra = 0;   // saved − x_l: what stays live beside a_l for the backward
        Bytes leaf = 0;    // least memory of the leaf (forward, [loss], backward)
        double time = 0.0;       // fwd + bwd
        double leaf_time = 0.0;  // fwd + bwd (+ loss for the last stage)
    };
    std::size_t L = 0;
    std::vector<Bytes> x;            // [0..L] activations
    std::vector<Bytes> y;            // [0..L] gradients
    std::vector<Bytes> nograd;       // [1..L]: x_{l-1} + x_l + nograd_overhead
    std::vector<double> nograd_time; // [1..L]
    std::vector<std::vector<Option>> options;  // [1..L]

    // Size of the gradient that is live while sub-chain (a, b) runs forwards.
    [[nodiscard]] Bytes upper(std::size_t b) const noexcept { return b < L ? y[b] : 0; }
};

[[nodiscard]] inline RotorUnits make_units(const RotorChain& chain, Bytes unit) {
    RotorUnits u;
    const std::size_t L = chain.length();
    u.L = L;
    u.x.resize(L + 1);
    u.y.resize(L + 1);
    for (std::size_t l = 0; l <= L; ++l) {
        u.x[l] = ceil_units(chain.activation_bytes(l), unit);
        u.y[l] = ceil_units(chain.gradient_bytes(l), unit);
    }
    u.nograd.assign(L + 1, 0);
    u.nograd_time.assign(L + 1, 0.0);
    u.options.resize(L + 1);
    const Bytes loss_ov = ceil_units(chain.loss_overhead, unit);
    for (std::size_t l = 1; l <= L; ++l) {
        const RotorStage& s = chain.stages[l - 1];
        u.nograd[l] = u.x[l - 1] + u.x[l] + ceil_units(s.nograd_overhead, unit);
        u.nograd_time[l] = s.nograd_time;
        for (const RotorOption& o : s.options) {
            RotorUnits::Option opt;
            const Bytes saved = ceil_units(o.saved_bytes, unit);
            opt.fwd = u.x[l - 1] + saved + ceil_units(o.fwd_overhead, unit);
            opt.bwd = u.x[l - 1] + saved + u.y[l] + u.y[l - 1] + ceil_units(o.bwd_overhead, unit);
            opt.extra = ceil_units(o.saved_bytes - s.out_bytes, unit);
            opt.leaf = std::max(opt.fwd + u.upper(l), opt.bwd);
            if (l == L) opt.leaf = std::max(opt.leaf, u.x[l - 1] + saved + u.y[l] + loss_ov);
            opt.time = o.fwd_time + o.bwd_time;
            opt.leaf_time = l == L ? opt.time + chain.loss_time : opt.time;
            u.options[l].push_back(opt);
        }
    }
    return u;
}

// Branch of the recursion for sub-chain (a, b): the leaf with option k (a == b), F_all
// with option k, or F_ck at a followed by F∅ up to the checkpoint a_{j-1}.
struct RotorChoice {
    enum class Kind : unsigned char { none, leaf, all, ck };
    Kind kind = Kind::none;
    std::uint32_t index = 0;  // option k, or j (validate() and the size caps keep both below 2^32)

    RotorChoice() = default;
    RotorChoice(Kind k, std::size_t i) : kind(k), index(static_cast<std::uint32_t>(i)) {}
};

// The limits of one solve: the memory cap of each table and the time limit, which all phases
// share (checked column by column). Both stop the solve with TooLarge.
struct RotorLimits {
    std::size_t stages = 0;
    std::size_t max_table_mib = 2048;
    std::optional<double> time_limit;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

    RotorLimits(std::size_t L, const RotorOptions& options)
        : stages(L), max_table_mib(options.max_table_mib), time_limit(options.time_limit_seconds) {
        if (time_limit && !(*time_limit > 0))  // NaN too
            throw InvalidInput("rotor: the time limit must be a positive number of seconds, not " +
                               std::to_string(*time_limit));
    }

    [[nodiscard]] static std::string hint(std::size_t L) {
        return "Rotor's work grows as L^3 (times the memory slots) and its tables as L^2: for a chain of " +
               std::to_string(L) + " stages use greedy, hrockmate or auto (they scale to long chains)";
    }
    // A table of `count` entries of `entry_bytes` each, named `what`.
    void check_memory(std::size_t count, std::size_t entry_bytes, const std::string& what,
                      const std::string& remedy) const {
        const std::size_t cap = max_table_mib * (std::size_t{1} << 20);
        if (entry_bytes == 0 || count <= cap / entry_bytes) return;
        const double mib = static_cast<double>(count) * static_cast<double>(entry_bytes) / double(1 << 20);
        char size[32];
        std::snprintf(size, sizeof size, "%.0f", mib);
        throw TooLarge("rotor: " + std::to_string(stages) + " stages need " + what + " of " + size +
                       " MiB, above max_table_mib = " + std::to_string(max_table_mib) + "; " + remedy + "; " +
                       hint(stages));
    }
    // Before `steps` elementary steps of `phase`: refuses at once when even a fast machine
    // (0.25 ns a step) could not finish them within the time limit.
    void check_work(double steps, const char* phase) const {
        if (!time_limit || steps * 0.25e-9 <= *time_limit - seconds_since(start)) return;
        char numbers[80];
        std::snprintf(numbers, sizeof numbers, "%.3g steps (at least %.0f s)", steps, steps * 0.25e-9);
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", *time_limit);
        throw TooLarge("rotor: " + std::string(phase) + " of " + std::to_string(stages) + " stages takes " + numbers +
                       ", beyond the time limit of " + limit + " s; " + hint(stages));
    }
    void check_time(const char* phase, std::size_t done, std::size_t total) const {
        if (!time_limit || seconds_since(start) <= *time_limit) return;
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", *time_limit);
        throw TooLarge("rotor: time limit of " + std::string(limit) + " s reached while " + phase + " (" +
                       std::to_string(done) + " of " + std::to_string(total) + " columns done); raise the limit, " +
                       "or use fewer slots; " + hint(stages));
    }
};

// Least memory (in units) with which sub-chain (a, b) can be back-propagated by a
// persistent schedule, for every (a, b); with the fastest such schedule's choice as a
// tie-break. Exact in the model: Opt(a, b, m) < ∞ ⇔ m ≥ need(a, b), because every branch's
// constraints are thresholds on m and the sub-chains' needs compose by max. Stored as a
// triangle, row by row (row a holds b = a..L), so that a row is contiguous.
struct RotorNeeds {
    std::size_t L = 0;
    std::vector<Bytes> need;
    std::vector<double> time;     // time of the chosen least-memory schedule
    std::vector<RotorChoice> choice;
    [[nodiscard]] std::size_t at(std::size_t a, std::size_t b) const noexcept {
        return (a - 1) * L - (a - 1) * (a - 2) / 2 + (b - a);
    }
};

struct RotorNeed {
    Bytes need = std::numeric_limits<Bytes>::max();
    double time = std::numeric_limits<double>::infinity();
    RotorChoice choice;
    void consider(Bytes n, double t, RotorChoice c) noexcept {
        if (n < need || (n == need && t < time)) {
            need = n;
            time = t;
            choice = c;
        }
    }
};

// need(a, b) for a < b from the sub-chains already known: row a of `n` (b' < b) and column b
// (`col_need[j]`, `col_time[j]` for j in (a, b]), both read contiguously.
[[nodiscard]] inline RotorNeed rotor_need_of(const RotorUnits& u, const RotorNeeds& n, std::size_t a, std::size_t b,
                                             const std::vector<Bytes>& col_need, const std::vector<double>& col_time) {
    RotorNeed best;
    const auto& opts = u.options[a];
    const Bytes up = u.upper(b);
    const Bytes xa = u.x[a - 1];
    for (std::size_t k = 0; k < opts.size(); ++k)
        best.consider(std::max({opts[k].fwd + up, opts[k].bwd, col_need[a + 1] + xa + opts[k].extra}),
                      opts[k].time + col_time[a + 1], {RotorChoice::Kind::all, k});
    const Bytes* row_need = n.need.data() + n.at(a, a);  // row_need[c - a] = need(a, c)
    const double* row_time = n.time.data() + n.at(a, a);
    Bytes fwd = 0;
    double pre = 0.0;
    for (std::size_t j = a + 1; j <= b; ++j) {
        const std::size_t l = j - 1;
        fwd = std::max(fwd, u.nograd[l] + (l > a ? xa : 0));
        pre += u.nograd_time[l];
        best.consider(std::max({fwd + up, col_need[j] + xa, row_need[j - 1 - a]}),
                      pre + col_time[j] + row_time[j - 1 - a], {RotorChoice::Kind::ck, j});
    }
    return best;
}

[[nodiscard]] inline RotorNeeds compute_needs(const RotorUnits& u, const RotorLimits& limits) {
    const std::size_t L = u.L;
    const std::size_t pairs = L * (L + 1) / 2;
    limits.check_memory(pairs, sizeof(Bytes) + sizeof(double) + sizeof(RotorChoice), "a least-memory table",
                        "raise max_table_mib");
    limits.check_work(static_cast<double>(L) * static_cast<double>(L) * static_cast<double>(L) / 6.0,
                      "the least-memory precomputation");
    RotorNeeds n;
    n.L = L;
    n.need.assign(pairs, std::numeric_limits<Bytes>::max());
    n.time.assign(pairs, std::numeric_limits<double>::infinity());
    n.choice.assign(pairs, {});
    std::vector<Bytes> col_need(L + 2, 0);  // column b being computed: (j, b) for j > a
    std::vector<double> col_time(L + 2, 0.0);
    for (std::size_t b = 1; b <= L; ++b) {
        limits.check_time("computing the least memory of sub-chains", b - 1, L);
        for (std::size_t a = b; a >= 1; --a) {
            RotorNeed best;
            if (a == b) {
                const auto& opts = u.options[a];
                for (std::size_t k = 0; k < opts.size(); ++k)
                    best.consider(opts[k].leaf, opts[k].leaf_time, {RotorChoice::Kind::leaf, k});
            } else {
                best = rotor_need_of(u, n, a, b, col_need, col_time);
            }
            const std::size_t i = n.at(a, b);
            n.need[i] = col_need[a] = best.need;
            n.time[i] = col_time[a] = best.time;
            n.choice[i] = best.choice;
        }
    }
    return n;
}

// The DP's hot loops. Rows hold, for every memory m, the least time of a sub-chain minus
// its lower bound (below), in single precision: half the memory traffic of doubles, which
// is what bounds this DP; times are compared to ~1e-7 of the recomputation time and every
// reported time is recomputed exactly.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define REMAT_ROTOR_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define REMAT_ROTOR_KERNEL
#endif

// row[m] = min(row[m], c + src[m]) for m in [lo, hi] (src already shifted).
REMAT_ROTOR_KERNEL inline void rotor_relax1(float* row, const float* src, float c, std::size_t lo,
                                            std::size_t hi) noexcept {
    for (std::size_t m = lo; m <= hi; ++m) {
        const float v = c + src[m];
        row[m] = v < row[m] ? v : row[m];
    }
}

// row[m] = min(row[m], c + s1[m] + s2[m]) for m in [lo, hi] (s1 already shifted).
REMAT_ROTOR_KERNEL inline void rotor_relax2(float* row, const float* s1, const float* s2, float c, std::size_t lo,
                                            std::size_t hi) noexcept {
    for (std::size_t m = lo; m <= hi; ++m) {
        const float v = c + s1[m] + s2[m];
        row[m] = v < row[m] ? v : row[m];
    }
}

#undef REMAT_ROTOR_KERNEL

// The time table of the DP: for every sub-chain (a, b) and memory m = 0..M, the least
// time of a persistent schedule, stored as its excess over the lower bound
// T(a, b) = Σ_{l=a..b} min_k (fwd + bwd) (+ the loss when b = L), which every schedule
// pays. The recursion is additive in T, so excesses follow the same recursion with
// constants pre_j (F∅ run) and time_k − t_a (option k). One row of M+1 floats per
// sub-chain, column by column (all a for b = 1, then b = 2, ...).
class RotorTable {
public:
    RotorTable(const RotorUnits& u, const RotorNeeds& needs, std::size_t M, const RotorOptions& options,
               const RotorLimits& limits)
        : u_(u), needs_(needs), L_(u.L), M_(M), width_(M + 1) {
        check_size(L_, width_, limits);
        least_.assign(L_ + 1, 0.0);
        double total = 0.0;  // every schedule's time is at most L + 1 times this
        for (std::size_t l = 1; l <= L_; ++l) {
            double t = std::numeric_limits<double>::infinity(), slowest = 0.0;
            for (const auto& o : u_.options[l]) {
                t = std::min(t, o.leaf_time);
                slowest = std::max(slowest, o.leaf_time);
            }
            least_[l] = t;  // leaf_time = fwd + bwd, plus the loss for the last stage
            total += slowest + u_.nograd_time[l];
        }
        // Excesses reach (L + 1) · total at most; scaled down when a float could overflow.
        if (total * static_cast<double>(L_ + 1) > 1e30) scale_ = 1.0 / total;
        table_.assign(L_ * (L_ + 1) / 2 * width_, std::numeric_limits<float>::infinity());
        fill(options, limits);
    }

    /// Throws TooLarge when the table of L stages and `width` memory values exceeds the cap.
    static void check_size(std::size_t L, std::size_t width, const RotorLimits& limits) {
        const std::size_t pairs = L * (L + 1) / 2;
        const std::size_t cells = limits.max_table_mib * (std::size_t{1} << 20) / sizeof(float);
        const std::size_t fitting = cells / pairs;  // widths that fit
        limits.check_memory(pairs * width, sizeof(float),
                            "a time table of " + std::to_string(width) + " memory values per sub-chain",
                            fitting >= 2 ? "use at most " + std::to_string(fitting - 1) +
                                               " slots (rotor:SLOTS), a larger slot_bytes, or raise max_table_mib"
                                         : std::string("use a larger slot_bytes or raise max_table_mib"));
    }

    [[nodiscard]] const float* row(std::size_t a, std::size_t b) const noexcept {
        return table_.data() + (b * (b - 1) / 2 + (a - 1)) * width_;
    }
    /// Least time of sub-chain (a, b) at memory m minus its lower bound (∞ when none fits).
    [[nodiscard]] float excess(std::size_t a, std::size_t b, std::size_t m) const noexcept { return row(a, b)[m]; }

    // The branch that realises the table entry (a, b, m): the candidates in the DP's
    // arithmetic, first strict minimum (the table holds the minimum, whatever the order).
    [[nodiscard]] RotorChoice choose(std::size_t a, std::size_t b, std::size_t m) const {
        RotorChoice choice;
        float best = std::numeric_limits<float>::infinity();
        const auto& opts = u_.options[a];
        const auto mm = static_cast<Bytes>(m);
        if (a == b) {
            for (std::size_t k = 0; k < opts.size(); ++k) {
                const float v = leaf_constant(a, k);
                if (opts[k].leaf <= mm && v < best) {
                    best = v;
                    choice = {RotorChoice::Kind::leaf, k};
                }
            }
            return choice;
        }
        const Bytes sub_need = needs_.need[needs_.at(a + 1, b)];
        for (std::size_t k = 0; k < opts.size(); ++k) {
            const Bytes off = u_.x[a - 1] + opts[k].extra;
            if (std::max({opts[k].fwd + u_.upper(b), opts[k].bwd, sub_need + off}) > mm) continue;
            const float v = all_constant(a, k) + row(a + 1, b)[m - static_cast<std::size_t>(off)];
            if (v < best) {
                best = v;
                choice = {RotorChoice::Kind::all, k};
            }
        }
        Bytes fwd = 0;
        double pre = 0.0;
        const Bytes off = u_.x[a - 1];
        for (std::size_t j = a + 1; j <= b; ++j) {
            const std::size_t l = j - 1;
            fwd = std::max(fwd, u_.nograd[l] + (l > a ? u_.x[a - 1] : 0));
            pre += u_.nograd_time[l];
            if (fwd + u_.upper(b) > mm) break;
            if (std::max(needs_.need[needs_.at(j, b)] + off, needs_.need[needs_.at(a, j - 1)]) > mm) continue;
            const float v = static_cast<float>(pre * scale_) + row(j, b)[m - static_cast<std::size_t>(off)] + row(a, j - 1)[m];
            if (v < best) {
                best = v;
                choice = {RotorChoice::Kind::ck, j};
            }
        }
        return choice;
    }

private:
    [[nodiscard]] float* mutable_row(std::size_t a, std::size_t b) noexcept {
        return table_.data() + (b * (b - 1) / 2 + (a - 1)) * width_;
    }
    [[nodiscard]] float leaf_constant(std::size_t a, std::size_t k) const noexcept {
        return static_cast<float>((u_.options[a][k].leaf_time - least_[a]) * scale_);
    }
    [[nodiscard]] float all_constant(std::size_t a, std::size_t k) const noexcept {
        return static_cast<float>((u_.options[a][k].time - least_[a]) * scale_);
    }

    void fill(const RotorOptions& options, const RotorLimits& limits) {
        const auto M = static_cast<Bytes>(M_);
        const auto elapsed = [&] { return seconds_since(limits.start); };
        // Columns in blocks: row (a, c) is read by every (a, b) with b > c, so a block of
        // columns reuses it from cache; within a block, a descends and b ascends, which
        // keeps every dependency ((a+1, b), (j, b) for j > a, (a, c) for c < b) computed first.
        constexpr std::size_t block = 8;
        for (std::size_t b0 = 1; b0 <= L_; b0 += block) {
            limits.check_time("filling the time table", b0 - 1, L_);
            report_progress(options.progress, "rotor: columns " + std::to_string(b0) + ".." + std::to_string(L_) + " after " +
                                                   std::to_string(elapsed()) + " s");
            const std::size_t b1 = std::min(L_, b0 + block - 1);
            for (std::size_t a = b1; a >= 1; --a)
                for (std::size_t b = std::max(a, b0); b <= b1; ++b) fill_row(a, b, M);
        }
    }

    void fill_row(std::size_t a, std::size_t b, Bytes M) {
        if (needs_.need[needs_.at(a, b)] > M) return;  // no m works: the row stays infinite
        float* out = mutable_row(a, b);
        const auto& opts = u_.options[a];
        const auto hi = static_cast<std::size_t>(M);
        if (a == b) {
            for (std::size_t k = 0; k < opts.size(); ++k) {
                if (opts[k].leaf > M) continue;
                const float v = leaf_constant(a, k);
                for (auto m = static_cast<std::size_t>(std::max<Bytes>(opts[k].leaf, 0)); m <= hi; ++m)
                    out[m] = v < out[m] ? v : out[m];
            }
            return;
        }
        const Bytes sub_need = needs_.need[needs_.at(a + 1, b)];
        for (std::size_t k = 0; k < opts.size(); ++k) {
            const Bytes off = u_.x[a - 1] + opts[k].extra;
            const Bytes lo = std::max({opts[k].fwd + u_.upper(b), opts[k].bwd, sub_need + off, Bytes{0}});
            if (lo > M) continue;
            rotor_relax1(out, row(a + 1, b) - off, all_constant(a, k), static_cast<std::size_t>(lo), hi);
        }
        Bytes fwd = 0;
        double pre = 0.0;
        const Bytes off = u_.x[a - 1];
        for (std::size_t j = a + 1; j <= b; ++j) {
            const std::size_t l = j - 1;
            fwd = std::max(fwd, u_.nograd[l] + (l > a ? u_.x[a - 1] : 0));
            pre += u_.nograd_time[l];
            if (fwd + u_.upper(b) > M) break;  // longer F∅ runs only need more memory
            const Bytes lo_bytes = std::max({fwd + u_.upper(b), needs_.need[needs_.at(j, b)] + off,
                                             needs_.need[needs_.at(a, j - 1)], Bytes{0}});
            if (lo_bytes > M) continue;
            const auto lo = static_cast<std::size_t>(lo_bytes);
            const float c = static_cast<float>(pre * scale_);
            const float* s1 = row(j, b) - off;
            const float* s2 = row(a, j - 1);
            // Both rows fall as m grows, so the candidate never drops below its value at
            // the top; it can only improve the part of `out` still above that (a prefix,
            // since `out` falls too). Rounding is monotone, so this holds in floats.
            const float floor = c + s1[hi] + s2[hi];
            std::size_t first = lo, last = hi + 1;
            while (first < last) {
                const std::size_t mid = first + (last - first) / 2;
                if (out[mid] <= floor) last = mid;
                else first = mid + 1;
            }
            if (first > lo) rotor_relax2(out, s1, s2, c, lo, first - 1);
        }
    }

    const RotorUnits& u_;
    const RotorNeeds& needs_;
    std::size_t L_;
    std::size_t M_;
    std::size_t width_;
    std::vector<double> least_;  // t_l = min_k leaf_time: T(a, b) = Σ t_l
    double scale_ = 1.0;         // times enter the floats multiplied by this
    std::vector<float> table_;
};

// Expands choices into actions. `next(a, b, m)` gives the choice of sub-chain (a, b) at
// memory m (m is ignored by the least-memory fallback). Iterative: chains can be long.
template <class Choose>
[[nodiscard]] std::vector<RotorAction> expand_rotor(const RotorUnits& u, Bytes M, Choose&& next) {
    struct Item {
        bool is_task = false;
        std::size_t a = 0, b = 0;
        Bytes m = 0;
        RotorAction action;
    };
    using K = RotorAction::Kind;
    std::vector<RotorAction> out;
    std::vector<Item> stack{{true, 1, u.L, M, {}}};
    std::vector<Item> pending;  // items of one expansion, pushed in reverse
    while (!stack.empty()) {
        const Item item = stack.back();
        stack.pop_back();
        if (!item.is_task) {
            out.push_back(item.action);
            continue;
        }
        const std::size_t a = item.a, b = item.b;
        const RotorChoice c = next(a, b, item.m);
        pending.clear();
        const auto act = [&](K kind, std::size_t stage, std::size_t option = 0) {
            pending.push_back({false, 0, 0, 0, RotorAction{kind, stage, option}});
        };
        switch (c.kind) {
            case RotorChoice::Kind::leaf:
                act(K::forward, a, c.index);
                if (a == u.L) act(K::loss, 0);
                act(K::backward, a, c.index);
                break;
            case RotorChoice::Kind::all:
                act(K::forward, a, c.index);
                pending.push_back({true, a + 1, b, item.m - u.x[a - 1] - u.options[a][c.index].extra, {}});
                act(K::backward, a, c.index);
                break;
            case RotorChoice::Kind::ck: {
                const std::size_t j = c.index;
                act(K::forward_nograd, a);
                for (std::size_t l = a + 1; l < j; ++l) {
                    act(K::forward_nograd, l);
                    act(K::free_activation, l - 1);
                }
                pending.push_back({true, j, b, item.m - u.x[a - 1], {}});
                act(K::free_activation, j - 1);
                pending.push_back({true, a, j - 1, item.m, {}});
                break;
            }
            case RotorChoice::Kind::none:
                throw SolverError("rotor: no branch realises sub-chain (" + std::to_string(a) + ", " + std::to_string(b) +
                                  ") at " + std::to_string(item.m) + " slots (this is a bug in the solver; please report it)");
        }
        for (auto it = pending.rbegin(); it != pending.rend(); ++it) stack.push_back(*it);
    }
    return out;
}

// Every stage with grad, fastest option, no recomputation.
[[nodiscard]] inline std::vector<RotorAction> store_all_actions(const RotorChain& chain) {
    using K = RotorAction::Kind;
    const std::size_t L = chain.length();
    std::vector<std::size_t> best(L + 1, 0);
    for (std::size_t l = 1; l <= L; ++l) {
        const auto& opts = chain.stages[l - 1].options;
        for (std::size_t k = 1; k < opts.size(); ++k)
            if (opts[k].fwd_time + opts[k].bwd_time < opts[best[l]].fwd_time + opts[best[l]].bwd_time) best[l] = k;
    }
    std::vector<RotorAction> actions;
    actions.reserve(2 * L + 1);
    for (std::size_t l = 1; l <= L; ++l) actions.push_back({K::forward, l, best[l]});
    actions.push_back({K::loss, 0, 0});
    for (std::size_t l = L; l >= 1; --l) actions.push_back({K::backward, l, best[l]});
    return actions;
}

[[nodiscard]] inline Bytes rotor_gcd(const RotorChain& chain) {
    Bytes g = 0;
    const auto add = [&](Bytes v) { g = std::gcd(g, v < 0 ? -v : v); };
    add(chain.input_bytes);
    add(chain.gradient_bytes(0));
    add(chain.loss_overhead);
    for (const RotorStage& s : chain.stages) {
        add(s.out_bytes);
        add(s.grad_bytes.value_or(0));
        add(s.nograd_overhead);
        for (const RotorOption& o : s.options) {
            add(o.saved_bytes);
            add(o.fwd_overhead);
            add(o.bwd_overhead);
        }
    }
    return g;
}

}  // namespace detail

/// The least peak (bytes, exact) of any persistent schedule of `chain` under the memory
/// model above: the smallest budget for which Rotor with exact sizes has a plan. Computed
/// by a min-max recursion over the same branches as the DP (O(K·L² + L³)); the options'
/// time limit and memory cap apply (TooLarge).
[[nodiscard]] inline Bytes rotor_smallest_budget(const RotorChain& chain, const RotorOptions& options = {}) {
    validate(chain);
    const detail::RotorLimits limits(chain.length(), options);
    const detail::RotorUnits u = detail::make_units(chain, 1);
    const detail::RotorNeeds n = detail::compute_needs(u, limits);
    return n.need[n.at(1, chain.length())];
}

namespace detail {

// The slot size: a fixed one, or ⌈budget/slots⌉ rounded up to a multiple of the sizes' gcd
// (computed without overflow for any budget up to 2^63 - 1).
[[nodiscard]] inline Bytes rotor_slot(const RotorChain& chain, Bytes budget, const RotorOptions& options) {
    if (options.slot_bytes) {
        if (*options.slot_bytes < 1) throw InvalidInput("rotor: slot_bytes must be at least 1");
        return *options.slot_bytes;
    }
    if (options.slots == 0) throw InvalidInput("rotor: slots must be at least 1");
    const Bytes g = std::max<Bytes>(1, rotor_gcd(chain));
    const auto slots = static_cast<Bytes>(std::min<std::size_t>(options.slots, std::numeric_limits<Bytes>::max()));
    const Bytes b = std::max<Bytes>(budget, 0);
    const Bytes base = b / slots + (b % slots != 0 ? 1 : 0);
    return g * std::max<Bytes>(1, base / g + (base % g != 0 ? 1 : 0));  // ≤ max(g, base + g - 1)
}

// Rounding left no plan: the exact least-memory schedule when the budget allows it.
[[nodiscard]] inline std::vector<RotorAction> rotor_least_memory(const RotorChain& chain, Bytes budget, Bytes unit,
                                                                 Bytes need, Bytes smallest, const RotorUnits& u,
                                                                 const RotorNeeds& n, const RotorOptions& options) {
    if (options.slot_bytes) {
        const Bytes least = need * unit;
        throw Infeasible("rotor with slots of " + std::to_string(unit) + " bytes needs at least " + std::to_string(least) +
                             " bytes for '" + printable(chain.name) + "', above the budget of " + std::to_string(budget) +
                             " bytes" +
                             (least > smallest ? " (exact sizes would need " + std::to_string(smallest) +
                                                     "; use a smaller slot_bytes)"
                                               : ""),
                         budget, least);
    }
    return expand_rotor(u, 0, [&](std::size_t a, std::size_t b, Bytes) { return n.choice[n.at(a, b)]; });
}

}  // namespace detail

/// The fastest persistent schedule of `chain` within `budget` bytes (the DP of
/// Beaumont et al. 2019, with K options per stage). Throws Infeasible with the smallest
/// budget that works when `budget` is too small. With `slots` (no fixed slot size), when
/// slot rounding leaves the DP no plan although the exact least-memory schedule fits,
/// that schedule is returned (optimal = false). Throws TooLarge, before any O(L³) work, when
/// a table would exceed max_table_mib, and when the time limit runs out.
[[nodiscard]] inline RotorSequence rotor_plan(const RotorChain& chain, Bytes budget, const RotorOptions& options = {}) {
    validate(chain);
    const std::size_t L = chain.length();
    const detail::RotorLimits limits(L, options);
    const auto stats_line = [&](Bytes unit, std::size_t M) {
        return "rotor chain '" + printable(chain.name) + "': " + std::to_string(L) + " stages, slot " +
               std::to_string(unit) + " bytes, " + std::to_string(M) + " slots";
    };
    const Bytes unit = detail::rotor_slot(chain, budget, options);
    const Bytes M = budget < 0 ? -1 : budget / unit;
    if (M >= 0) detail::RotorTable::check_size(L, static_cast<std::size_t>(M) + 1, limits);
    const detail::RotorUnits exact_units = detail::make_units(chain, 1);
    const detail::RotorNeeds exact_needs = detail::compute_needs(exact_units, limits);
    const Bytes smallest = exact_needs.need[exact_needs.at(1, L)];
    if (!options.slot_bytes && budget < smallest)
        throw Infeasible("rotor needs at least " + std::to_string(smallest) + " bytes for '" + printable(chain.name) +
                             "' (the least peak of any persistent schedule), above the budget of " +
                             std::to_string(budget) + " bytes",
                         budget, smallest);
    const detail::RotorUnits units = unit == 1 ? exact_units : detail::make_units(chain, unit);
    const detail::RotorNeeds needs = unit == 1 ? exact_needs : detail::compute_needs(units, limits);
    const Bytes need = needs.need[needs.at(1, L)];

    RotorSequence seq;
    seq.slot_bytes = unit;
    if (M < need) {
        seq.actions = detail::rotor_least_memory(chain, budget, unit, need, smallest, exact_units, exact_needs, options);
        seq.optimal = false;
        seq.slots = 0;
        report_progress(options.progress, stats_line(unit, 0) + ": slot rounding left no plan, least-memory schedule");
    } else {
        const auto width = static_cast<std::size_t>(M);
        report_progress(options.progress, stats_line(unit, width));
        const detail::RotorTable table(units, needs, width, options, limits);
        seq.actions = detail::expand_rotor(units, M, [&](std::size_t a, std::size_t b, Bytes m) {
            return table.choose(a, b, static_cast<std::size_t>(m));
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
    const std::vector<RotorAction> all = detail::store_all_actions(chain);
    const RotorEvaluation store_all = rotor_evaluate(chain, all);
    if (store_all.valid && store_all.peak <= budget && store_all.time < seq.time) {
        seq.actions = all;
        seq.time = store_all.time;
        seq.peak = store_all.peak;
        seq.optimal = true;
    }
    return seq;
}

/// The Rotor solver on chains (docs/formats.md §5 (chains)): the optimal persistent schedule within the
/// budget, checked by the simulator.
class Rotor {
public:
    explicit Rotor(RotorOptions options = {}) : options_(std::move(options)) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "rotor"; }
    [[nodiscard]] const RotorOptions& options() const noexcept { return options_; }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const std::optional<Chain> chain = as_chain(problem);
        if (!chain)
            throw InvalidInput("rotor: problem '" + printable(problem.name()) +
                               "' is not a chain (the docs/formats.md §5 (chains) expansion); use the checkmate or rockmate "
                               "solver for general graphs");
        return solve(problem, *chain, budget);
    }

    [[nodiscard]] Plan solve(const Chain& chain, Bytes budget) const { return solve(to_problem(chain), chain, budget); }

    /// Smallest budget this solver (with these options) accepts for `chain`, exactly.
    [[nodiscard]] Bytes smallest_budget(const Chain& chain) const { return smallest_budget(to_rotor_chain(chain)); }

    /// The same for a multi-option chain: exact without a fixed slot size, whole slots with one.
    [[nodiscard]] Bytes smallest_budget(const RotorChain& chain) const {
        if (!options_.slot_bytes) return rotor_smallest_budget(chain, options_);
        if (*options_.slot_bytes < 1) throw InvalidInput("rotor: slot_bytes must be at least 1");
        validate(chain);
        const detail::RotorUnits u = detail::make_units(chain, *options_.slot_bytes);
        const detail::RotorNeeds n = detail::compute_needs(u, detail::RotorLimits(chain.length(), options_));
        return n.need[n.at(1, chain.length())] * *options_.slot_bytes;
    }

private:
    [[nodiscard]] Plan solve(const Problem& problem, const Chain& chain, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const RotorSequence seq = rotor_plan(to_rotor_chain(chain), budget, options_);
        SolverStats stats{std::string(name()), 0.0, seq.optimal ? SolveStatus::optimal : SolveStatus::feasible,
                          std::nullopt,
                          "slot_bytes=" + std::to_string(seq.slot_bytes) + " slots=" + std::to_string(seq.slots) +
                              (seq.optimal ? "" : " (least-memory fallback)")};
        Schedule schedule = rotor_to_schedule(seq.actions, chain.length());
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(schedule), budget, std::move(stats));
    }

    RotorOptions options_;
};

}  // namespace remat
