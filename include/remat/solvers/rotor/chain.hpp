// remat/solvers/rotor/chain.hpp — the chain Rotor works on and its memory model: RotorChain
// (stages with a cheap no-grad forward and K (forward with grad, backward) options), the
// abstract actions of a schedule (RotorAction, RotorSequence), the solver's options
// (RotorOptions), validate() with the checks that sizes and times add up, to_rotor_chain();
// and, for the DP, the chain in integer units (bytes or memory slots) and the slot size.
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont, Eyraud-Dubois, Herrmann, Joly,
// Shilova, "Optimal checkpointing for heterogeneous chains: how to train deep neural
// networks with limited memory", 2019, with the K options per stage of Zhao et al.,
// "Rockmate", ICML 2023; docs/design.md §4.2). to_rotor_chain() reads the Chain of
// docs/formats.md §5 (chains).
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
// The DP works on the chain in integer units (RotorUnits): every term rounded up to whole
// slots (bytes when the slot is 1), with the peaks of the actions above precomputed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../core/chain.hpp"
#include "../../core/errors.hpp"
#include "../../core/progress.hpp"

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

/// Which schedules of a chain the DP ranges over (rotor/branches.hpp says how).
enum class RotorClass : unsigned char {
    /// Rotor (Beaumont et al. 2019): a checkpoint stays until everything above it is
    /// back-propagated.
    persistent,
    /// Also the release branch: a checkpoint freed right after the next stage's forward with
    /// grad, recomputed from an earlier one before that stage's backward. 4-7 times Rotor's
    /// solve time at 100-200 stages.
    release,
    /// Also sub-chains that free their input after its last use, handing a stage's backward
    /// (or the whole stage) back to the caller. Equal to the optimum over all schedules on
    /// every random chain of up to 4 stages tested; 15-20 times Rotor's solve time.
    release_early,
    /// release_early up to release_early_max_stages stages, release beyond: RotorRelease's default.
    release_by_length,
};

/// The most stages for which RotorClass::release_by_length takes release_early.
inline constexpr std::size_t release_early_max_stages = 64;

[[nodiscard]] constexpr std::string_view to_string(RotorClass c) noexcept {
    switch (c) {
        case RotorClass::persistent: return "persistent";
        case RotorClass::release: return "release";
        case RotorClass::release_early: return "release_early";
        case RotorClass::release_by_length: return "release_by_length";
    }
    return "unknown";
}

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
    /// When set (RotorRelease's default), `slots` is a minimum: a short chain gets as many
    /// slots as keep the DP's work (L³ per slot) within that of 500 slots at 100 stages and
    /// its time table within 16 MiB, so that rounding costs little where slots are cheap.
    bool more_slots_for_short_chains = false;
    /// The schedules the DP ranges over (rotor/branches.hpp): Rotor's persistent ones by
    /// default; RotorRelease's wider classes, where a checkpoint is freed before everything
    /// above it is back-propagated and recomputed when needed again.
    RotorClass schedule_class = RotorClass::persistent;
};

namespace detail::rotor {

// The branches and shapes a class adds (rotor/branches.hpp): release for the release branch
// (open ends with their first stage only, turn starts with closed or open ends), early for
// everything else.
struct RotorMoves {
    bool release = false;
    bool early = false;
};

[[nodiscard]] inline RotorMoves moves_of(RotorClass c, std::size_t stages) noexcept {
    if (c == RotorClass::release_by_length)
        c = stages <= release_early_max_stages ? RotorClass::release_early : RotorClass::release;
    return {c != RotorClass::persistent, c == RotorClass::release_early};
}

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

}  // namespace detail::rotor

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
    detail::rotor::check_rotor_totals(chain, who);
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

namespace detail::rotor {

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
        Bytes saved = 0;   // saved: everything the forward leaves live, a_l included
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
    Bytes loss_overhead = 0;

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
    u.loss_overhead = loss_ov;
    for (std::size_t l = 1; l <= L; ++l) {
        const RotorStage& s = chain.stages[l - 1];
        u.nograd[l] = u.x[l - 1] + u.x[l] + ceil_units(s.nograd_overhead, unit);
        u.nograd_time[l] = s.nograd_time;
        for (const RotorOption& o : s.options) {
            RotorUnits::Option opt;
            const Bytes saved = ceil_units(o.saved_bytes, unit);
            opt.fwd = u.x[l - 1] + saved + ceil_units(o.fwd_overhead, unit);
            opt.bwd = u.x[l - 1] + saved + u.y[l] + u.y[l - 1] + ceil_units(o.bwd_overhead, unit);
            // Rounded jointly with a_l: the two are live together (a_l is part of what the
            // stage saves), so ⌈saved⌉ − ⌈out⌉ beside a_l's ⌈out⌉ covers them exactly where
            // ⌈saved − out⌉ could waste a slot.
            opt.extra = saved - u.x[l];
            opt.saved = saved;
            opt.leaf = std::max(opt.fwd + u.upper(l), opt.bwd);
            if (l == L) opt.leaf = std::max(opt.leaf, u.x[l - 1] + saved + u.y[l] + loss_ov);
            opt.time = o.fwd_time + o.bwd_time;
            opt.leaf_time = l == L ? opt.time + chain.loss_time : opt.time;
            u.options[l].push_back(opt);
        }
    }
    return u;
}

// The most options of any stage (K).
[[nodiscard]] inline std::size_t most_options(const RotorChain& chain) noexcept {
    std::size_t k = 0;
    for (const RotorStage& s : chain.stages) k = std::max(k, s.options.size());
    return k;
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

}  // namespace detail::rotor

}  // namespace remat
