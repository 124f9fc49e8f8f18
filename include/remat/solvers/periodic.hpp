// remat/solvers/periodic.hpp — periodic checkpointing of a chain: keep every k-th stage
// input and recompute the rest, segment by segment.
//
// Chen, Xu, Zhang, Guestrin, "Training deep nets with sublinear memory cost" (2016): with
// k = ⌈√L⌉ the memory grows as O(√L) for one extra forward. The schedule is what
// torch.utils.checkpoint_sequential does: every segment but the last runs without grad,
// keeping only its input; the last runs with grad; then, from the last segment to the
// first, each segment is recomputed with grad from its kept input and back-propagated.
// Every data is freed as soon as nothing reads it before it is written again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/timing.hpp"

namespace remat {

class Periodic {
public:
    /// `segment`: stages per checkpointed segment; by default ⌈√L⌉ for a chain of L stages.
    // (Built from the value, not copied: g++ 13 warns that copying an empty optional reads
    // its uninitialised payload.)
    explicit Periodic(std::optional<std::size_t> segment = std::nullopt)
        : segment_(segment ? std::optional<std::size_t>(*segment) : std::nullopt) {
        if (segment_ && *segment_ == 0) throw InvalidInput("periodic: the segment length k must be at least 1");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "periodic"; }

    /// The segment length used for a chain of `length` stages.
    [[nodiscard]] std::size_t segment_for(std::size_t length) const noexcept {
        if (segment_) return *segment_;
        auto k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(length))));
        while (k * k < length) ++k;  // guard against sqrt rounding down
        while (k > 1 && (k - 1) * (k - 1) >= length) --k;
        return k == 0 ? 1 : k;
    }

    /// The periodic schedule of a chain's expansion (ids as chain_ids gives them).
    [[nodiscard]] Schedule schedule(const Chain& chain) const {
        validate(chain);
        const std::size_t L = chain.length();
        const std::size_t k = segment_for(L);
        const ChainIds id = chain_ids(L);
        Schedule out;
        out.reserve(8 * L);
        // Segments [first, last] of k stages, the last one possibly shorter.
        const std::size_t segments = (L + k - 1) / k;
        const auto first_of = [&](std::size_t s) { return s * k + 1; };
        const auto last_of = [&](std::size_t s) { return std::min(L, (s + 1) * k); };

        // Forward phase: no-grad through every segment but the last, keeping segment inputs.
        for (std::size_t s = 0; s + 1 < segments; ++s) {
            for (std::size_t l = first_of(s); l <= last_of(s); ++l) {
                out.push_back(Step::run(id.fwd[l]));
                if (l != first_of(s)) out.push_back(Step::free(id.a[l - 1]));
            }
        }
        // Backward phase, last segment first; the last segment's forward is its own
        // with-grad run, the others are recomputed from their kept input.
        for (std::size_t s = segments; s-- > 0;) {
            for (std::size_t l = first_of(s); l <= last_of(s); ++l) out.push_back(Step::run(id.fwd_grad[l]));
            if (s + 1 == segments) out.push_back(Step::run(id.loss));
            for (std::size_t l = last_of(s); l >= first_of(s); --l) {
                out.push_back(Step::run(id.bwd[l]));
                out.push_back(Step::free(id.g[l]));
                out.push_back(Step::free(id.s[l]));
                out.push_back(Step::free(id.a[l]));
            }
            // The segment input is read again only after the previous segment rewrites it.
            if (first_of(s) > 1) out.push_back(Step::free(id.a[first_of(s) - 1]));
        }
        return out;
    }

    [[nodiscard]] Plan solve(const Chain& chain, Bytes budget) const { return solve(to_problem(chain), chain, budget); }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const std::optional<Chain> chain = as_chain(problem);
        if (!chain)
            throw InvalidInput("periodic: problem '" + problem.name() +
                               "' is not a chain (the docs/formats.md §5 (chains) expansion); use the checkmate or rockmate "
                               "solver for general graphs");
        return solve(problem, *chain, budget);
    }

private:
    [[nodiscard]] Plan solve(const Problem& problem, const Chain& chain, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const std::size_t k = segment_for(chain.length());
        Schedule plan = schedule(chain);
        const SimulationReport report = simulate(problem, plan);
        if (!report.valid)
            throw SolverError("periodic produced an invalid schedule for '" + problem.name() + "': " + report.error +
                              " (this is a bug in the solver; please report it with the problem file)");
        if (report.peak > budget)
            throw Infeasible("periodic (k=" + std::to_string(k) + ") needs " + std::to_string(report.peak) +
                                 " bytes for '" + problem.name() + "', above the budget of " + std::to_string(budget) +
                                 " bytes; raise the budget or use the rotor solver",
                             budget, report.peak);
        SolverStats stats{std::string(name()), 0.0, SolveStatus::heuristic, std::nullopt, "k=" + std::to_string(k)};
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(problem, std::move(plan), budget, std::move(stats));
    }

    std::optional<std::size_t> segment_;
};

}  // namespace remat
