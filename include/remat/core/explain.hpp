// remat/core/explain.hpp — a plan in words: per layer (a chain stage, a captured op, any
// unit of the problem), how often its forward runs, what is recomputed and at what cost,
// what is kept for its backward and what is freed. What `remat-plan --explain` and
// Plan::explain print (docs/guide.md, "Reading a plan").
//
// Units come from op names (docs/formats.md §1 (problems), §5): `F3`, `F3+`, `B3` are stage 3 of a chain;
// `F:linear.7`, `F+:linear.7`, `B:linear.7` are the captured op `linear.7`; any other op is a
// unit of its own. Labels (stage names, a node's source line) are the caller's to give.
// Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bytes.hpp"
#include "problem.hpp"
#include "schedule.hpp"
#include "simulate.hpp"

namespace remat {

/// What an op is to its unit.
enum class UnitRole : unsigned char { forward, forward_grad, backward, other };

struct UnitOf {
    std::string unit;  ///< "3", "linear.7", or the op's own name
    UnitRole role = UnitRole::other;
};

/// The unit and role an op's name gives (see the top of this header).
[[nodiscard]] inline UnitOf unit_of(std::string_view name) {
    for (const auto& [prefix, role] : {std::pair<std::string_view, UnitRole>{"F+:", UnitRole::forward_grad},
                                       {"F:", UnitRole::forward}, {"B:", UnitRole::backward}})
        if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix)
            return {std::string(name.substr(prefix.size())), role};
    if (name.size() >= 2 && (name[0] == 'F' || name[0] == 'B')) {
        std::string_view rest = name.substr(1);
        const bool plus = !rest.empty() && rest.back() == '+';
        if (plus) rest.remove_suffix(1);
        const bool digits = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits && !(name[0] == 'B' && plus))
            return {std::string(rest), name[0] == 'B' ? UnitRole::backward : plus ? UnitRole::forward_grad : UnitRole::forward};
    }
    return {std::string(name), UnitRole::other};
}

/// How explain() names units and what it prints.
struct ExplainOptions {
    /// Display names per unit ("3" → "conv3 (stage 3)"); units without one show their key.
    std::map<std::string, std::string> labels;
    /// The store-all time T_ref, for the overhead in the header line.
    std::optional<double> reference_time;
    /// Show every unit, not only those with something to say (recomputed or freed early).
    bool all_units = false;
};

/// What a plan does with one unit.
struct UnitSummary {
    std::string unit;
    std::size_t forwards = 0;      ///< runs of its forward ops (with and without grad)
    std::size_t backwards = 0;
    double forward_time = 0.0;     ///< all its forward runs
    double least_forward = 0.0;    ///< its cheapest forward: what running it once costs
    bool saved_across_loss = false;///< its saved state is kept from the forward phase to its backward
    bool grad_forward_after_loss = false;  ///< its forward with grad runs again in the backward phase
    std::size_t frees = 0;         ///< frees of its data

    [[nodiscard]] std::size_t recomputations() const noexcept { return forwards > 1 ? forwards - 1 : 0; }
    [[nodiscard]] double recompute_time() const noexcept { return forwards > 1 ? forward_time - least_forward : 0.0; }
};

/// Per unit, in the order units first appear in the problem's ops.
[[nodiscard]] inline std::vector<UnitSummary> summarize_units(const Problem& problem, const Schedule& schedule) {
    std::vector<UnitSummary> units;
    std::map<std::string, std::size_t> index;
    std::vector<std::size_t> op_unit(problem.op_count());
    const auto unit_index = [&](const std::string& key) {
        const auto [it, inserted] = index.emplace(key, units.size());
        if (inserted) units.push_back(UnitSummary{key});
        return it->second;
    };
    for (std::size_t k = 0; k < problem.op_count(); ++k) op_unit[k] = unit_index(unit_of(problem.op(OpId{k}).name).unit);
    std::vector<std::size_t> data_unit(problem.data_count(), static_cast<std::size_t>(-1));
    for (std::size_t k = 0; k < problem.op_count(); ++k)
        if (unit_of(problem.op(OpId{k}).name).role != UnitRole::backward)
            for (const DataId d : problem.op(OpId{k}).writes) data_unit[d.index] = op_unit[k];
    for (UnitSummary& u : units) u.least_forward = -1.0;
    const std::optional<OpId> loss = problem.loss();
    bool after_loss = false;
    for (const Step& step : schedule) {
        if (step.is_free()) {
            if (const std::size_t u = data_unit.at(step.data().index); u != static_cast<std::size_t>(-1)) ++units[u].frees;
            continue;
        }
        if (loss && step.op() == *loss) after_loss = true;
        const Op& op = problem.op(step.op());
        UnitSummary& u = units[op_unit[step.op().index]];
        const UnitRole role = unit_of(op.name).role;
        if (role == UnitRole::backward) {
            ++u.backwards;
        } else if (role == UnitRole::forward || role == UnitRole::forward_grad) {
            ++u.forwards;
            u.forward_time += op.time;
            u.least_forward = u.least_forward < 0 ? op.time : std::min(u.least_forward, op.time);
            if (role == UnitRole::forward_grad) {
                if (after_loss) u.grad_forward_after_loss = true;
                else u.saved_across_loss = true;
            }
        }
    }
    for (UnitSummary& u : units) {
        if (u.least_forward < 0) u.least_forward = 0.0;
        if (u.grad_forward_after_loss) u.saved_across_loss = false;
    }
    return units;
}

namespace detail::explain {

inline std::string seconds(double s) {
    char text[32];
    if (s == 0.0)
        std::snprintf(text, sizeof text, "0");
    else if (s < 1e-3)
        std::snprintf(text, sizeof text, "%.3g us", s * 1e6);
    else if (s < 1.0)
        std::snprintf(text, sizeof text, "%.3g ms", s * 1e3);
    else
        std::snprintf(text, sizeof text, "%.3g s", s);
    return text;
}

inline std::string what_happens(const UnitSummary& u) {
    std::string text;
    if (u.backwards == 0) text = u.forwards > 1 ? "forward only, run " + std::to_string(u.forwards) + " times" : "forward only";
    else if (u.saved_across_loss && u.recomputations() == 0) text = "kept for its backward";
    else if (u.saved_across_loss) text = "kept for its backward; its output recomputed";
    else if (u.grad_forward_after_loss && u.forwards == 1) text = "run once, in the backward phase";
    else if (u.grad_forward_after_loss) text = "recomputed with grad before its backward";
    else text = "no saved state";
    return text;
}

}  // namespace detail::explain

/// The plan in words: a header line, then one line per unit (recomputed or freed early ones
/// unless `all_units`), most expensive recomputation first.
[[nodiscard]] inline std::string explain(const Problem& problem, const Schedule& schedule, const ExplainOptions& options = {}) {
    const SimulationReport sim = simulate(problem, schedule);
    std::vector<UnitSummary> units = summarize_units(problem, schedule);
    std::ostringstream out;
    double recompute = 0.0;
    std::size_t recomputed = 0, with_forward = 0;
    for (const UnitSummary& u : units) {
        recompute += u.recompute_time();
        recomputed += u.recomputations() > 0 ? 1 : 0;
        with_forward += u.forwards > 0 ? 1 : 0;
    }
    out << "plan for '" << problem.name() << "': " << schedule.size() << " steps, time " << sim.time;
    if (options.reference_time && *options.reference_time > 0) {
        char overhead[32];
        std::snprintf(overhead, sizeof overhead, "%+.1f", 100.0 * (sim.time / *options.reference_time - 1.0));
        out << " (" << overhead << " % over store-all)";
    }
    out << ", peak " << format_bytes(sim.peak) << (sim.valid ? "" : " (INVALID: " + sim.error + ")") << "\n";
    out << recomputed << " of " << with_forward << " layers recomputed, " << detail::explain::seconds(recompute)
        << " of recomputation in all\n";
    std::stable_sort(units.begin(), units.end(),
                     [](const UnitSummary& a, const UnitSummary& b) { return a.recompute_time() > b.recompute_time(); });
    out << "layer                              forwards  recomputed (cost)     backward  what happens\n";
    for (const UnitSummary& u : units) {
        if (u.forwards == 0 && u.backwards == 0) continue;
        if (!options.all_units && u.recomputations() == 0) continue;
        const auto label = options.labels.find(u.unit);
        std::string name = label == options.labels.end() ? u.unit : label->second;
        if (name.size() > 34) name = name.substr(0, 31) + "...";
        char line[256];
        const std::string cost = "(+" + detail::explain::seconds(u.recompute_time()) + ")";
        std::snprintf(line, sizeof line, "%-34s %8zu  %4zu %-14s  %8zu  ", name.c_str(), u.forwards, u.recomputations(),
                      cost.c_str(), u.backwards);
        out << line << detail::explain::what_happens(u) << "\n";
    }
    if (!options.all_units && recomputed == 0) out << "(nothing is recomputed: every layer runs once)\n";
    return out.str();
}

}  // namespace remat
