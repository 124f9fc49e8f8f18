// remat/exec/report.hpp — what one executed step cost, measured, next to what its plan
// predicted (exec/executor.hpp fills it; every framework's executor reports the same way).
#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

#include "../core/bytes.hpp"
#include "../core/errors.hpp"

namespace remat {

/// What one step cost, measured, next to what the plan predicted.
///
/// Measured bytes come from the memory probe, op by op: the peak while an op ran, minus the
/// parameter gradients the step has collected so far (they are handed to the parameters at
/// the end; parameters and their gradients are not activations) and minus outputs the plan
/// freed but the caller still holds, relative to the memory at the start of the step plus the
/// inputs' bytes (the simulator's initial state). When the caller computes the loss between
/// the two phases, the backward phase is measured from its own start, taken to be the
/// simulator's state after `loss`; `caller_bytes` says how much more the caller really held.
struct StepReport {
    /// The simulator's peak for the plan on the problem predictions use.
    Bytes predicted_peak = 0;
    /// The simulator's peak on the problem the solver planned with (>= predicted_peak when
    /// the two differ, as for a profiled chain).
    Bytes planned_peak = 0;
    double predicted_time = 0.0;  ///< in the problem's unit: seconds for profiled problems
    Bytes measured_peak = 0;
    Bytes forward_peak = 0;
    Bytes backward_peak = 0;
    Bytes caller_bytes = 0;
    double forward_seconds = 0.0;
    double backward_seconds = 0.0;
    /// Forwards run (one per unit when nothing is recomputed).
    std::size_t forward_runs = 0;
    /// Per schedule step, the measured memory while it ran (run steps) or after it (free
    /// steps), on the same scale as SimulationReport::timeline; -1 for `loss`, which the
    /// caller runs. For comparing a plan's timeline with reality step by step.
    std::vector<Bytes> measured_timeline;
    bool completed = false;
};


/// "predicted peak 12.3 MiB, measured 12.3 MiB (+0.00 %); 41 forwards; forward 0.12 s, backward 0.25 s".
inline std::ostream& operator<<(std::ostream& out, const StepReport& r) {
    const std::ios::fmtflags flags = out.flags();
    const std::streamsize precision = out.precision();
    out.setf(std::ios::fixed);
    out.precision(2);
    out << "predicted peak " << format_bytes(r.predicted_peak) << ", measured " << format_bytes(r.measured_peak);
    if (r.predicted_peak > 0)
        out << " (" << (r.measured_peak >= r.predicted_peak ? "+" : "")
            << 100.0 * (static_cast<double>(r.measured_peak) / static_cast<double>(r.predicted_peak) - 1.0) << " %)";
    out << "; " << r.forward_runs << " forwards; forward " << r.forward_seconds << " s, backward " << r.backward_seconds
        << " s" << (r.completed ? "" : " (not completed)");
    out.flags(flags);
    out.precision(precision);
    return out;
}

}  // namespace remat
