// remat/exec/plan.hpp — what the execution engine (executor.hpp) knows of a problem and of a
// plan before it runs one: the role of every op and data, and a simulator-checked plan with
// its landmarks.
//
// docs/design.md §6 (execution engine), docs/design.md. A problem's ops are forwards without autograd (F),
// forwards with autograd that also write saved state (F+), exactly-once backwards (B) and
// the loss; each belongs to a *unit* — a chain stage, a captured op group, a layer of the
// user's framework — which is what the backend runs. Data are activations, saved state,
// gradients or markers, each of a unit. The engine runs only what the simulator accepted
// (docs/formats.md §3 (simulation semantics)), which is what makes freeing memory behind a framework's back safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"

namespace remat {

enum class ExecOpRole : unsigned char { forward, forward_grad, backward, loss };
enum class ExecDataRole : unsigned char { activation, saved, gradient, marker };

/// The role and unit of every op and data of a problem.
struct ExecutionTable {
    std::vector<ExecOpRole> op_role;
    std::vector<std::size_t> op_unit;  ///< ignored for the loss
    std::vector<ExecDataRole> data_role;
    std::vector<std::size_t> data_unit;
    std::size_t units = 0;

    /// Throws InvalidInput when the table does not describe `problem`.
    void check(const Problem& problem) const {
        const std::string who = "execution table of '" + problem.name() + "'";
        if (op_role.size() != problem.op_count() || op_unit.size() != problem.op_count())
            throw InvalidInput(who + ": " + std::to_string(op_role.size()) + " op roles for " +
                               std::to_string(problem.op_count()) + " ops");
        if (data_role.size() != problem.data_count() || data_unit.size() != problem.data_count())
            throw InvalidInput(who + ": " + std::to_string(data_role.size()) + " data roles for " +
                               std::to_string(problem.data_count()) + " data");
        for (std::size_t k = 0; k < op_role.size(); ++k) {
            const bool is_loss = op_role[k] == ExecOpRole::loss;
            if (is_loss != (problem.loss() && problem.loss()->index == k))
                throw InvalidInput(who + ": op '" + problem.op(OpId{k}).name + "' is " +
                                   (is_loss ? "marked as the loss but is not the problem's loss"
                                            : "the problem's loss but not marked as such"));
            if (!is_loss && op_unit[k] >= units)
                throw InvalidInput(who + ": op '" + problem.op(OpId{k}).name + "' belongs to unit " +
                                   std::to_string(op_unit[k]) + " of " + std::to_string(units));
        }
        if (!problem.loss()) throw InvalidInput(who + ": the problem has no loss; a step runs up to it, then back");
    }
};

/// Where each unit's forwards come in a plan: what random-number replay needs to know.
struct ForwardLandmarks {
    /// Per unit: how many forwards the plan runs. A unit run more than once is recomputed,
    /// so its random numbers are kept at its first run.
    std::vector<std::size_t> forward_runs;
    /// The units in the order of their first forward run, and whether that run comes before
    /// the loss.
    std::vector<std::size_t> first_forward_order;
    std::vector<char> first_run_before_loss;
};

/// The landmarks of the ops a plan runs, in order (`run_ops`; loss included).
template <class Ops>
[[nodiscard]] ForwardLandmarks forward_landmarks(const ExecutionTable& table, const Ops& run_ops) {
    ForwardLandmarks out;
    out.forward_runs.assign(table.units, 0);
    bool after_loss = false;
    for (const OpId op : run_ops) {
        const ExecOpRole role = table.op_role.at(op.index);
        if (role == ExecOpRole::loss) {
            after_loss = true;
        } else if (role == ExecOpRole::forward || role == ExecOpRole::forward_grad) {
            const std::size_t unit = table.op_unit[op.index];
            if (out.forward_runs.at(unit)++ == 0) {
                out.first_forward_order.push_back(unit);
                out.first_run_before_loss.push_back(after_loss ? 0 : 1);
            }
        }
    }
    return out;
}

/// A plan checked against an executor's problem, with what its steps look up at run time
/// (its forward landmarks among them).
struct PreparedPlan : ForwardLandmarks {
    Plan plan;
    /// On the problem predictions use.
    SimulationReport simulation;
    /// The simulator's peak on the problem the solver planned with.
    Bytes planned_peak = 0;
    std::size_t loss_step = 0;
};

/// A prepared plan, shareable between steps and executors of the same problem.
class ExecutionPlan {
public:
    explicit ExecutionPlan(std::shared_ptr<const PreparedPlan> prepared) : prepared_(std::move(prepared)) {}

    [[nodiscard]] const Plan& plan() const noexcept { return prepared_->plan; }
    [[nodiscard]] const Schedule& schedule() const noexcept { return prepared_->plan.schedule; }
    /// The simulator's peak on the problem predictions use: what the executor should reach.
    [[nodiscard]] Bytes predicted_peak() const noexcept { return prepared_->simulation.peak; }
    [[nodiscard]] Bytes planned_peak() const noexcept { return prepared_->planned_peak; }
    [[nodiscard]] double predicted_time() const noexcept { return prepared_->simulation.time; }
    [[nodiscard]] const SimulationReport& simulation() const noexcept { return prepared_->simulation; }
    [[nodiscard]] const PreparedPlan& prepared() const noexcept { return *prepared_; }

private:
    std::shared_ptr<const PreparedPlan> prepared_;
};

/// Simulates `schedule` on `problem` and refuses a schedule the simulator rejects. `subject`
/// names the problem in the message.
[[nodiscard]] inline SimulationReport checked_simulation(const Problem& problem, const Schedule& schedule,
                                                         const std::string& subject) {
    SimulationReport report = simulate(problem, schedule);
    if (!report.valid) throw InvalidInput("the plan is not a valid schedule of " + subject + ": " + report.error);
    return report;
}

/// Checks `plan` on the problem the solver planned with (`planned`) and on the one
/// predictions use (`predicting`, the same ops and data, possibly other costs), and finds its
/// landmarks.
[[nodiscard]] inline ExecutionPlan prepare_execution(const Problem& planned, const Problem& predicting,
                                                     const ExecutionTable& table, Plan plan) {
    const std::string subject = "'" + predicting.name() + "'";
    const SimulationReport on_planned = checked_simulation(planned, plan.schedule, subject);
    auto prepared = std::make_shared<PreparedPlan>();
    prepared->simulation = &planned == &predicting ? on_planned : checked_simulation(predicting, plan.schedule, subject);
    prepared->planned_peak = on_planned.peak;
    bool found_loss = false;
    std::vector<OpId> run_ops;
    for (std::size_t i = 0; i < plan.schedule.size(); ++i) {
        const Step& step = plan.schedule[i];
        if (!step.is_run()) continue;
        run_ops.push_back(step.op());
        if (table.op_role.at(step.op().index) == ExecOpRole::loss) {
            prepared->loss_step = i;
            found_loss = true;
        }
    }
    static_cast<ForwardLandmarks&>(*prepared) = forward_landmarks(table, run_ops);
    if (!found_loss) throw InvalidInput("the plan never runs 'loss'");
    prepared->plan = std::move(plan);
    return ExecutionPlan(std::move(prepared));
}

/// A schedule written by hand, as a plan.
[[nodiscard]] inline Plan hand_written_plan(Schedule schedule) {
    Plan plan;
    plan.schedule = std::move(schedule);
    plan.stats.solver = "hand-written";
    return plan;
}

}  // namespace remat
