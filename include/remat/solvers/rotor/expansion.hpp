// remat/solvers/rotor/expansion.hpp — the last phase of a Rotor solve: the choices of the
// time table (rotor/table.hpp) or of the least-memory precomputation (rotor/least_memory.hpp)
// turned into the actions of a RotorSequence (expand_rotor()); the least-memory schedule
// used when slot rounding leaves the table no plan (rotor_least_memory()); and the store-all
// sequence, which nothing beats when it fits (store_all_actions()).
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains": a leaf runs forward, [loss], backward; F_all runs the forward
// with grad above its sub-chain and the backward after it; F_ck runs the no-grad forwards
// up to the checkpoint, the part above it, then the part below; the release branch of
// rotor/least_memory.hpp runs F∅ up to a_{j-1}, stage j with grad, frees a_{j-1}, runs the
// part above j, runs F∅ again and back-propagates stage j; docs/design.md §4.2). The actions
// follow the memory model of rotor/chain.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../core/errors.hpp"
#include "branches.hpp"
#include "chain.hpp"
#include "least_memory.hpp"

namespace remat::detail::rotor {

// A sub-chain to expand, in its shape (rotor/branches.hpp), at memory m.
struct RotorTask {
    std::size_t a = 0, b = 0;
    Bytes m = 0;
    RotorShape shape;
};

// One choice of a sub-chain as actions (`act`) and sub-chains (`task`), in order: the
// branches of rotor/branches.hpp.
template <class Act, class Task>
void expand_choice(const RotorUnits& u, const RotorTask& t, const RotorChoice c, Act&& act, Task&& task) {
    using K = RotorAction::Kind;
    const std::size_t a = t.a, b = t.b;
    const RotorShape& shape = t.shape;
    const Bytes xa = u.x[a - 1];
    using End = RotorShape::End;
    const RotorShape closed = shape.ending(End::closed);
    const RotorShape plain_end = shape.starting(false);
    // F∅ from a_{a-1} up to a_{j-1}, each forward freeing its input but a_{a-1}.
    const auto nograd_run = [&](std::size_t j) {
        act({K::forward_nograd, a, 0});
        for (std::size_t l = a + 1; l < j; ++l) {
            act({K::forward_nograd, l, 0});
            act({K::free_activation, l - 1, 0});
        }
    };
    switch (c.kind) {
        case RotorChoice::Kind::leaf:
        case RotorChoice::Kind::all: {
            const std::size_t k = c.index;
            const bool open = shape.end == End::open;
            act({K::forward, a, k});
            if (open) act({K::free_activation, a - 1, 0});
            const Bytes beside = (open ? 0 : xa) + u.options[a][k].extra;
            if (a < b) task({a + 1, b, t.m - beside, closed});
            else if (shape.turn) act({K::backward, b + 1, shape.pending});
            else if (b == u.L) act({K::loss, 0, 0});
            if (!open) act({K::backward, a, k});
            return;
        }
        case RotorChoice::Kind::first:
            if (a == b && !shape.turn) {  // a plain (a, a) with a partial end frees its input only
                act({K::free_activation, a - 1, 0});
                return;
            }
            act({K::forward_nograd, a, 0});
            act({K::free_activation, a - 1, 0});
            if (a < b) task({a + 1, b, t.m, closed});
            else act({K::backward, b + 1, shape.pending});
            act({K::free_activation, a, 0});  // only g_a stays
            return;
        case RotorChoice::Kind::ck: {
            const std::size_t j = c.index;
            nograd_run(j);
            if (j <= b) task({j, b, t.m - xa, closed});
            else act({K::backward, b + 1, shape.pending});  // a turn start's F∅ run up to a_b itself
            act({K::free_activation, j - 1, 0});
            task({a, j - 1, t.m, plain_end});
            return;
        }
        case RotorChoice::Kind::release: {
            const std::size_t j = c.index, k = c.option;
            nograd_run(j);
            task({j, b, t.m - xa, shape.ending(End::open, k)});
            task({a, j - 1, t.m, plain_end.starting(true, k)});
            return;
        }
        case RotorChoice::Kind::ck_partial: {
            const std::size_t j = c.index;
            nograd_run(j);
            task({j, b, t.m - xa, shape.ending(End::partial)});
            task({a, j, t.m, plain_end});
            return;
        }
        case RotorChoice::Kind::none: break;
    }
    throw SolverError("rotor: no branch realises sub-chain (" + std::to_string(a) + ", " + std::to_string(b) + ") at " +
                      std::to_string(t.m) + " slots (this is a bug in the solver; please report it)");
}

// Expands choices into actions. `next(task)` gives the choice of a sub-chain at its memory
// (ignored by the least-memory fallback). Iterative: chains can be long.
template <class Choose>
[[nodiscard]] std::vector<RotorAction> expand_rotor(const RotorUnits& u, Bytes M, Choose&& next) {
    struct Item {
        bool is_task = false;
        RotorTask task;
        RotorAction action;
    };
    std::vector<RotorAction> out;
    std::vector<Item> stack{{true, {1, u.L, M, RotorShape::plain()}, {}}};
    std::vector<Item> pending;  // items of one expansion, pushed in reverse
    while (!stack.empty()) {
        const Item item = stack.back();
        stack.pop_back();
        if (!item.is_task) {
            out.push_back(item.action);
            continue;
        }
        pending.clear();
        expand_choice(u, item.task, next(item.task), [&](RotorAction action) { pending.push_back({false, {}, action}); },
                      [&](RotorTask task) { pending.push_back({true, task, {}}); });
        for (auto it = pending.rbegin(); it != pending.rend(); ++it) stack.push_back(*it);
    }
    return out;
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
    return expand_rotor(u, 0, [&](const RotorTask& t) { return n.choice_of(t.shape, t.a, t.b); });
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

}  // namespace remat::detail::rotor
