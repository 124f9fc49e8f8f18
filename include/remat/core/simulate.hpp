// remat/core/simulate.hpp — the simulator of docs/formats.md §3 (simulation semantics), the single source of truth
// for the memory and time of a schedule.
//
// Every solver's schedule is checked against it; every predicted peak the library prints
// comes from it. It reports the first invalid step and why, the peak, the time and the
// memory timeline (for plots).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "problem.hpp"
#include "schedule.hpp"

namespace remat {

/// Memory around one step: while it runs (equal to `after` for a free) and after it.
struct TimelinePoint {
    Bytes during = 0;
    Bytes after = 0;
};

struct SimulationReport {
    bool valid = false;
    /// Index of the first invalid step; equal to the schedule size when the schedule ends
    /// in an invalid state (an exactly-once op that never ran, a final data not live).
    std::optional<std::size_t> error_step;
    /// Why the schedule is invalid, naming the step, op or data; empty when valid.
    std::string error;
    Bytes peak = 0;
    double time = 0.0;
    /// Memory of the initial state.
    Bytes initial = 0;
    /// One point per step simulated (all of them when valid).
    std::vector<TimelinePoint> timeline;

    /// Valid and within the budget.
    [[nodiscard]] bool fits(Bytes budget) const noexcept { return valid && peak <= budget; }
};

namespace detail {
// docs/formats.md §11: the data an op updates must be live, and no op reads or updates a data
// after its update (it would see the new weights). Marks the op's updates when it may run.
inline std::optional<std::string> use_after_update(const Problem& problem, const Op& op, const std::vector<char>& live,
                                                   std::vector<char>& updated) {
    if (updated.empty()) return std::nullopt;
    for (const std::vector<DataId>* list : {&op.reads, &op.updates})
        for (const DataId d : *list)
            if (updated[d.index])
                return "uses '" + problem.data(d).name + "' after op '" +
                       problem.op(*problem.updater(d)).name + "' updated it in place";
    for (const DataId d : op.updates)
        if (!live[d.index]) return "updates '" + problem.data(d).name + "', which is not live";
    for (const DataId d : op.updates) updated[d.index] = 1;
    return std::nullopt;
}
}  // namespace detail

/// Simulates `schedule` on `problem` exactly as docs/formats.md §3 (simulation semantics) says. Stops at the first
/// invalid step (the report then covers the steps before it).
[[nodiscard]] inline SimulationReport simulate(const Problem& problem, const Schedule& schedule) {
    SimulationReport report;
    std::vector<char> live(problem.data_count(), 0);
    std::vector<char> ran(problem.op_count(), 0);
    std::vector<char> updated(problem.has_updates() ? problem.data_count() : 0, 0);
    Bytes memory = 0;
    for (const DataId d : problem.initial()) {
        live[d.index] = 1;
        memory += problem.data(d).bytes;
    }
    report.initial = memory;
    report.peak = memory;
    report.timeline.reserve(schedule.size());

    const auto fail = [&](std::size_t step, std::string reason) {
        report.valid = false;
        report.error_step = step;
        report.error = std::move(reason);
        return report;
    };

    for (std::size_t i = 0; i < schedule.size(); ++i) {
        const Step& step = schedule[i];
        const std::string where = "step " + std::to_string(i);
        if (step.is_run()) {
            if (step.op().index >= problem.op_count())
                return fail(i, where + ": op id " + std::to_string(step.op().index) + " does not exist");
            const Op& op = problem.op(step.op());
            for (const DataId d : op.reads)
                if (!live[d.index])
                    return fail(i, where + " (run " + op.name + "): reads '" + problem.data(d).name +
                                       "', which is not live");
            if (op.exactly_once && ran[step.op().index])
                return fail(i, where + " (run " + op.name + "): exactly-once op runs a second time");
            if (const auto reason = detail::use_after_update(problem, op, live, updated))
                return fail(i, where + " (run " + op.name + "): " + *reason);
            Bytes written = 0;
            for (const DataId d : op.writes)
                if (!live[d.index]) written += problem.data(d).bytes;
            const Bytes during = memory + written + op.overhead;
            for (const DataId d : op.writes) live[d.index] = 1;
            memory += written;
            ran[step.op().index] = 1;
            report.time += op.time;
            report.peak = std::max(report.peak, during);
            report.timeline.push_back({during, memory});
        } else {
            if (step.data().index >= problem.data_count())
                return fail(i, where + ": data id " + std::to_string(step.data().index) + " does not exist");
            const Data& data = problem.data(step.data());
            if (!live[step.data().index])
                return fail(i, where + " (free " + data.name + "): data is not live");
            if (problem.is_initial(step.data()))
                return fail(i, where + " (free " + data.name + "): initial data belong to the caller and may not be freed");
            live[step.data().index] = 0;
            memory -= data.bytes;
            report.timeline.push_back({memory, memory});
        }
    }
    for (std::size_t k = 0; k < problem.op_count(); ++k)
        if (problem.op(OpId{k}).exactly_once && !ran[k])
            return fail(schedule.size(), "end of schedule: exactly-once op '" + problem.op(OpId{k}).name + "' never ran");
    for (const DataId d : problem.final_data())
        if (!live[d.index])
            return fail(schedule.size(), "end of schedule: final data '" + problem.data(d).name + "' is not live");
    // Finite op times can still add up to infinity in a schedule that recomputes enough;
    // such a time is no figure anyone can use (nor write into a schedule file).
    if (!std::isfinite(report.time))
        return fail(schedule.size(), "end of schedule: the total time overflows to infinity");
    report.valid = true;
    return report;
}

}  // namespace remat
