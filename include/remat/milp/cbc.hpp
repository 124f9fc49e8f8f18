// remat/milp/cbc.hpp — the COIN-OR CBC backend of the MilpBackend concept.
//
// CBC (Forrest, Lougee-Heimer et al., COIN-OR Branch and Cut; EPL) through its C interface
// (coinor-libcbc-dev, pkg-config cbc). Its cutting planes and heuristics often close the
// gap of scheduling MILPs much faster than plain branch and bound, and it accepts a MIP
// start. Each solve owns its Cbc_Model through a RAII handle; log levels are 0; the time
// limit and gaps go through CBC's own parameters ("sec", "ratioGap", "allowableGap"), with
// threads left at one. Include this header only when linking CBC (CMake: remat::cbc).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <coin/Cbc_C_Interface.h>

#include "../core/timing.hpp"
#include "backend.hpp"
#include "model.hpp"

namespace remat::milp {

namespace detail {

struct CbcDeleter {
    void operator()(Cbc_Model* model) const noexcept {
        if (model != nullptr) Cbc_deleteModel(model);
    }
};
using CbcHandle = std::unique_ptr<Cbc_Model, CbcDeleter>;

// CBC's infinity (COIN_DBL_MAX, not exported by the C interface).
inline constexpr double cbc_infinity = std::numeric_limits<double>::max();

// CBC's C interface takes parameters as command-line strings.
inline std::string cbc_number(double x) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.17g", x);
    return buffer;
}

}  // namespace detail

class Cbc {
public:
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "cbc"; }

    [[nodiscard]] Result solve(const Model& model) const {
        const auto start = std::chrono::steady_clock::now();
        const Parameters& par = model.parameters();
        const auto& vars = model.variables();
        const auto& rows = model.rows();
        const std::size_t n = vars.size();
        const auto finish = [&](Result r) {
            r.seconds = seconds_since(start);
            return r;
        };

        // Column-major copy of the rows, as Cbc_loadProblem wants it.
        std::vector<CoinBigIndex> col_start(n + 1, 0);
        for (const Row& row : rows)
            for (const Term& t : row.terms) ++col_start[t.var.index + 1];
        for (std::size_t j = 0; j < n; ++j) col_start[j + 1] += col_start[j];
        std::vector<int> row_index(static_cast<std::size_t>(col_start[n]));
        std::vector<double> value(static_cast<std::size_t>(col_start[n]));
        std::vector<CoinBigIndex> fill(col_start.begin(), col_start.end() - 1);
        std::vector<double> row_lower(rows.size()), row_upper(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const Row& row = rows[i];
            for (const Term& t : row.terms) {
                const auto at = static_cast<std::size_t>(fill[t.var.index]++);
                row_index[at] = static_cast<int>(i);
                value[at] = t.coef;
            }
            row_lower[i] = row.sense == Sense::less_equal ? -detail::cbc_infinity : row.rhs;
            row_upper[i] = row.sense == Sense::greater_equal ? detail::cbc_infinity : row.rhs;
        }
        std::vector<double> col_lower(n), col_upper(n), objective(n);
        const auto clamp = [](double x) { return std::clamp(x, -detail::cbc_infinity, detail::cbc_infinity); };
        bool has_integers = false;
        for (std::size_t j = 0; j < n; ++j) {
            col_lower[j] = clamp(vars[j].lower);
            col_upper[j] = clamp(vars[j].upper);
            objective[j] = vars[j].objective;
            has_integers = has_integers || vars[j].type != VarType::continuous;
        }

        detail::CbcHandle cbc(Cbc_newModel());
        if (!cbc) throw SolverError("cbc: Cbc_newModel failed (out of memory?)");
        Cbc_setLogLevel(cbc.get(), 0);
        Cbc_setParameter(cbc.get(), "log", "0");
        Cbc_setParameter(cbc.get(), "slog", "0");
        Cbc_loadProblem(cbc.get(), static_cast<int>(n), static_cast<int>(rows.size()), col_start.data(),
                        row_index.data(), value.data(), col_lower.data(), col_upper.data(), objective.data(),
                        row_lower.data(), row_upper.data());
        for (std::size_t j = 0; j < n; ++j)
            if (vars[j].type != VarType::continuous) Cbc_setInteger(cbc.get(), static_cast<int>(j));
        Cbc_setObjSense(cbc.get(), 1.0);

        if (std::isfinite(par.time_limit_seconds)) {
            const double seconds = std::max(0.01, par.time_limit_seconds);
            Cbc_setMaximumSeconds(cbc.get(), seconds);
            Cbc_setParameter(cbc.get(), "timeMode", "elapsed");
            Cbc_setParameter(cbc.get(), "sec", detail::cbc_number(seconds).c_str());
        }
        Cbc_setAllowableFractionGap(cbc.get(), par.relative_gap);
        Cbc_setAllowableGap(cbc.get(), par.absolute_gap);
        Cbc_setParameter(cbc.get(), "ratioGap", detail::cbc_number(par.relative_gap).c_str());
        Cbc_setParameter(cbc.get(), "allowableGap", detail::cbc_number(par.absolute_gap).c_str());
        Cbc_setParameter(cbc.get(), "threads", "1");
        // CBC 2.10's preprocessing can shrink a model to under three rows, on which its
        // heuristics abort in OsiClpSolverInterface::crunch (coin-or/Cbc#684).
        Cbc_setParameter(cbc.get(), "preprocess", "off");

        const auto& given = model.start();
        const bool use_start = has_integers && given.has_value() && model.is_feasible(*given);
        double start_objective = infinity;
        if (use_start) {
            start_objective = model.objective_value(*given);
            std::vector<int> columns;
            std::vector<double> values;
            for (std::size_t j = 0; j < n; ++j)
                if (vars[j].type != VarType::continuous) {
                    columns.push_back(static_cast<int>(j));
                    values.push_back(std::round((*given)[j]));
                }
            Cbc_setMIPStartI(cbc.get(), static_cast<int>(columns.size()), columns.data(), values.data());
        }

        Cbc_solve(cbc.get());

        if (Cbc_isAbandoned(cbc.get()))
            throw SolverError("cbc: the solve was abandoned because of numerical difficulties");
        if (Cbc_isContinuousUnbounded(cbc.get()))
            throw SolverError("cbc: the model is unbounded (a variable without a bound has a negative cost)");
        const double offset = model.objective_offset();
        const bool limit_hit = Cbc_isSecondsLimitReached(cbc.get()) || Cbc_status(cbc.get()) == 1;
        const double* best = has_integers ? Cbc_bestSolution(cbc.get()) : nullptr;
        const bool proven_optimal = Cbc_isProvenOptimal(cbc.get()) != 0;
        const bool solution = has_integers ? best != nullptr : proven_optimal;
        double bound = Cbc_getBestPossibleObjValue(cbc.get()) + offset;
        if (!std::isfinite(bound) || std::abs(bound) >= 1e50) bound = -infinity;

        if (solution) {
            const double* x = has_integers ? best : Cbc_getColSolution(cbc.get());
            std::vector<double> values(x, x + n);
            const double objective_value = Cbc_getObjValue(cbc.get()) + offset;
            if (use_start && objective_value > start_objective + 1e-9 * std::max(1.0, std::abs(start_objective))) {
                Result r{limit_hit ? Status::feasible : Status::optimal, *given, start_objective, bound, 0.0};
                if (!limit_hit) r.best_bound = start_objective;
                return finish(std::move(r));
            }
            const bool optimal = proven_optimal || !limit_hit;
            return finish(Result{optimal ? Status::optimal : Status::feasible, std::move(values), objective_value,
                                 optimal ? objective_value : std::min(bound, objective_value), 0.0});
        }
        if (use_start)
            return finish(Result{limit_hit ? Status::feasible : Status::optimal, *given, start_objective,
                                 limit_hit ? std::min(bound, start_objective) : start_objective, 0.0});
        if (limit_hit) return finish(Result{Status::time_limit_no_solution, {}, infinity, bound, 0.0});
        if (Cbc_isProvenInfeasible(cbc.get()) || !has_integers)
            return finish(Result{Status::infeasible, {}, infinity, infinity, 0.0});
        throw SolverError("cbc: the solve ended with status " + std::to_string(Cbc_status(cbc.get())) + "/" +
                          std::to_string(Cbc_secondaryStatus(cbc.get())) + " and no solution");
    }
};

static_assert(MilpBackend<Cbc>);

}  // namespace remat::milp
