// remat/milp/lp_solve.hpp — the lp_solve 5.5 backend of the MilpBackend concept.
//
// lp_solve (Berkelaar, Eikland, Notebaert; LGPL) is a small, widely packaged MILP solver
// (liblpsolve55-dev). Each solve builds its own lprec, owned by a RAII handle, silenced
// (no output file, neutral verbosity) and stopped at the model's time limit by an abort
// callback whose state lives on the stack of the solve. lp_solve has no MIP-start API: a
// starting solution becomes the objective cutoff (set_obj_bound), and is returned itself
// when the search finds nothing better. lp_solve does not report the global bound of an
// interrupted branch and bound, so the bound of a stopped search is the root LP
// relaxation. Include this header only when linking liblpsolve55 (CMake: remat::lpsolve).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <lpsolve/lp_lib.h>

#include "../core/timing.hpp"
#include "backend.hpp"
#include "model.hpp"

namespace remat::milp {

namespace detail::lp_solve {

struct LpDeleter {
    void operator()(lprec* lp) const noexcept {
        if (lp != nullptr) delete_lp(lp);
    }
};
using LpHandle = std::unique_ptr<lprec, LpDeleter>;

struct LpDeadline {
    std::chrono::steady_clock::time_point end;
    bool limited = false;
    bool hit = false;
};

inline int __WINAPI lp_solve_abort(lprec* /*lp*/, void* handle) {
    auto* deadline = static_cast<LpDeadline*>(handle);
    if (deadline->limited && std::chrono::steady_clock::now() >= deadline->end) {
        deadline->hit = true;
        return 1;
    }
    return 0;
}

}  // namespace detail::lp_solve

class LpSolve {
public:
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "lpsolve"; }

    [[nodiscard]] Result solve(const Model& model) const {
        const auto start = std::chrono::steady_clock::now();
        const auto finish = [&](Result r) {
            r.seconds = seconds_since(start);
            return r;
        };
        if (model.variables().empty()) return finish(empty_model_result(model));

        const Parameters& par = model.parameters();
        // The abort callback reads the deadline, which must outlive ::solve.
        detail::lp_solve::LpDeadline deadline;
        if (const auto end = deadline_after(start, par.time_limit_seconds)) {  // a negative one has passed
            deadline.limited = true;
            deadline.end = *end;
        }
        const bool use_start = model.start().has_value() && model.is_feasible(*model.start());
        const detail::lp_solve::LpHandle lp = load(model, deadline);
        if (!lp) return finish(out_of_time_loading(model, use_start));
        set_mip_gap(lp.get(), TRUE, std::max(par.absolute_gap, 1e-11));
        set_mip_gap(lp.get(), FALSE, std::max(par.relative_gap, 1e-11));
        if (deadline.limited) set_timeout(lp.get(), static_cast<long>(std::ceil(std::max(1.0, par.time_limit_seconds))) + 1);
        put_abortfunc(lp.get(), &detail::lp_solve::lp_solve_abort, &deadline);
        if (use_start) set_cutoff(lp.get(), model);

        const int ret = ::solve(lp.get());
        return finish(outcome(lp.get(), ret, model, use_start));
    }

private:
    // lp_solve needs a column; an empty model is trivially optimal unless a row is violated.
    [[nodiscard]] static Result empty_model_result(const Model& model) {
        for (const Row& row : model.rows()) {
            const bool ok = (row.sense == Sense::less_equal && 0.0 <= row.rhs) ||
                            (row.sense == Sense::greater_equal && 0.0 >= row.rhs) ||
                            (row.sense == Sense::equal && row.rhs == 0.0);
            if (!ok) return Result{Status::infeasible, {}, infinity, -infinity, 0.0};
        }
        return Result{Status::optimal, {}, model.objective_offset(), model.objective_offset(), 0.0};
    }

    // The time limit ran out while lp_solve was given the model: the start, if any, unproven.
    [[nodiscard]] static Result out_of_time_loading(const Model& model, bool use_start) {
        if (use_start)
            return Result{Status::feasible, *model.start(), model.objective_value(*model.start()), -infinity, 0.0};
        return Result{Status::time_limit_no_solution, {}, infinity, -infinity, 0.0};
    }

    // A silenced lprec holding the model: its columns (bounds, integrality, objective, to
    // be minimised) and its rows; null when the deadline passes first. Giving lp_solve a model
    // of millions of nonzeros takes minutes (its row matrix grows by copying), so the time
    // limit must hold here too: a 125-million-nonzero Checkmate model took 148 s against 6.
    [[nodiscard]] static detail::lp_solve::LpHandle load(const Model& model, const detail::lp_solve::LpDeadline& deadline) {
        const int n = static_cast<int>(model.variables().size());
        detail::lp_solve::LpHandle lp(make_lp(0, n));
        if (!lp) throw SolverError("lp_solve: make_lp failed for a model of " + std::to_string(n) + " variables (out of memory?)");
        char no_output[] = "";
        set_outputfile(lp.get(), no_output);
        set_verbose(lp.get(), NEUTRAL);
        load_columns(lp.get(), model);
        if (!load_rows(lp.get(), model, deadline)) return nullptr;
        return lp;
    }

    static void load_columns(lprec* lp, const Model& model) {
        const auto& vars = model.variables();
        const int n = static_cast<int>(vars.size());
        const double inf = get_infinite(lp);
        const auto clamp = [inf](double x) { return x >= inf ? inf : (x <= -inf ? -inf : x); };
        std::vector<double> row_values;
        std::vector<int> row_columns;
        row_values.reserve(static_cast<std::size_t>(n));
        row_columns.reserve(static_cast<std::size_t>(n));
        for (int j = 0; j < n; ++j) {
            const Variable& v = vars[static_cast<std::size_t>(j)];
            if (!set_bounds(lp, j + 1, clamp(v.lower), clamp(v.upper)))
                throw SolverError("lp_solve: set_bounds failed for variable '" + v.name + "'");
            if (v.type != VarType::continuous) set_int(lp, j + 1, TRUE);
            if (v.objective != 0.0) {
                row_values.push_back(v.objective);
                row_columns.push_back(j + 1);
            }
        }
        if (!set_obj_fnex(lp, static_cast<int>(row_values.size()), row_values.data(), row_columns.data()))
            throw SolverError("lp_solve: set_obj_fnex failed");
        set_minim(lp);
    }

    // Whether every row was added before the deadline (checked every 256 rows).
    [[nodiscard]] static bool load_rows(lprec* lp, const Model& model, const detail::lp_solve::LpDeadline& deadline) {
        std::vector<double> row_values;
        std::vector<int> row_columns;
        row_values.reserve(model.variables().size());
        row_columns.reserve(model.variables().size());
        set_add_rowmode(lp, TRUE);
        std::size_t added = 0;
        for (const Row& row : model.rows()) {
            if (deadline.limited && ++added % 256 == 0 && std::chrono::steady_clock::now() >= deadline.end) return false;
            row_values.clear();
            row_columns.clear();
            for (const Term& t : row.terms) {
                row_values.push_back(t.coef);
                row_columns.push_back(static_cast<int>(t.var.index) + 1);
            }
            const int type = row.sense == Sense::less_equal ? LE : (row.sense == Sense::greater_equal ? GE : EQ);
            if (!add_constraintex(lp, static_cast<int>(row_values.size()), row_values.data(), row_columns.data(), type,
                                  row.rhs))
                throw SolverError("lp_solve: add_constraintex failed for row '" + row.name + "'");
        }
        set_add_rowmode(lp, FALSE);
        return true;
    }

    // lp_solve has no MIP start: a starting solution is a cutoff, so that only strictly
    // better solutions are searched for.
    static void set_cutoff(lprec* lp, const Model& model) {
        const double linear = model.objective_value(*model.start()) - model.objective_offset();
        set_obj_bound(lp, linear + std::max(1e-9, 1e-9 * std::abs(linear)));
    }

    // The Result of a finished ::solve that returned `ret` (seconds left at 0).
    [[nodiscard]] static Result outcome(lprec* lp, int ret, const Model& model, bool use_start) {
        const double inf = get_infinite(lp);
        const double root_bound = lp->real_solution;
        const double start_objective = use_start ? model.objective_value(*model.start()) : infinity;
        // The start itself, when nothing better was found: bounded by the root LP unless proven.
        const auto from_start = [&](Status status) {
            Result r{status, *model.start(), start_objective, status == Status::optimal ? start_objective : -infinity,
                     0.0};
            if (status != Status::optimal && std::isfinite(root_bound) && std::abs(root_bound) < inf)
                r.best_bound = std::min(start_objective, root_bound + model.objective_offset());
            return r;
        };
        switch (ret) {
            case OPTIMAL:
            case PRESOLVED:
            case SUBOPTIMAL: {
                Result r = solution(lp, ret, model, root_bound);
                if (use_start && r.objective > start_objective)
                    return from_start(ret == SUBOPTIMAL ? Status::feasible : Status::optimal);
                return r;
            }
            case INFEASIBLE:
                // With a cutoff, "infeasible" means nothing beats the start: the start is optimal.
                if (use_start) return from_start(Status::optimal);
                return Result{Status::infeasible, {}, infinity, infinity, 0.0};
            case TIMEOUT:
            case USERABORT:
                if (use_start) return from_start(Status::feasible);
                {
                    Result r{Status::time_limit_no_solution, {}, infinity, -infinity, 0.0};
                    if (std::abs(root_bound) < inf) r.best_bound = root_bound + model.objective_offset();
                    return r;
                }
            case UNBOUNDED:
                throw SolverError("lp_solve: the model is unbounded (a variable without a bound has a negative cost)");
            default:
                throw SolverError("lp_solve: solve failed with code " + std::to_string(ret) +
                                  " (numerical failure or out of memory)");
        }
    }

    // The solution lp_solve found; a suboptimal one (search stopped) is bounded by the root LP.
    [[nodiscard]] static Result solution(lprec* lp, int ret, const Model& model, double root_bound) {
        std::vector<double> values(model.variables().size());
        if (!get_variables(lp, values.data())) throw SolverError("lp_solve: get_variables failed");
        const double objective = get_objective(lp) + model.objective_offset();
        Result r{ret == SUBOPTIMAL ? Status::feasible : Status::optimal, std::move(values), objective, objective, 0.0};
        if (ret == SUBOPTIMAL) {
            r.best_bound = -infinity;
            if (std::abs(root_bound) < get_infinite(lp)) r.best_bound = std::min(objective, root_bound + model.objective_offset());
        }
        return r;
    }
};

static_assert(MilpBackend<LpSolve>);

}  // namespace remat::milp
