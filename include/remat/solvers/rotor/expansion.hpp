// remat/solvers/rotor/expansion.hpp — the last phase of a Rotor solve: the choices of the
// time table (rotor/table.hpp) or of the least-memory precomputation (rotor/least_memory.hpp)
// turned into the actions of a RotorSequence (expand_rotor()); the least-memory schedule
// used when slot rounding leaves the table no plan (rotor_least_memory()); and the store-all
// sequence, which nothing beats when it fits (store_all_actions()).
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains": a leaf runs forward, [loss], backward; F_all runs the forward
// with grad above its sub-chain and the backward after it; F_ck runs the no-grad forwards
// up to the checkpoint, the part above it, then the part below; docs/design.md §4.2). The
// actions follow the memory model of rotor/chain.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../core/errors.hpp"
#include "chain.hpp"
#include "least_memory.hpp"

namespace remat::detail::rotor {

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
