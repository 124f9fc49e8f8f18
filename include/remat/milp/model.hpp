// remat/milp/model.hpp — a small backend-neutral mixed-integer linear program.
//
// The integer programs of Checkmate (Jain et al., "Checkmate: breaking the memory wall with
// optimal tensor rematerialization", MLSys 2020) and Rockmate (Zhao et al., ICML 2023) are
// written once against this builder and solved by any type that models milp::MilpBackend
// (backend.hpp): lp_solve (lp_solve.hpp) or CBC (cbc.hpp). A Model is a plain value:
// bounded binary / integer / continuous variables, sparse rows, a linear objective to
// minimise, solve parameters (time limit, MIP gap) and an optional starting solution.
// A Result says how the solve ended, with the best solution, its objective and the best
// proven bound.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/errors.hpp"

namespace remat::milp {

inline constexpr double infinity = std::numeric_limits<double>::infinity();

enum class VarType : unsigned char { continuous, integer, binary };

/// Dense index of a variable in its Model.
struct Var {
    std::size_t index = 0;
    friend bool operator==(const Var&, const Var&) = default;
};

struct Term {
    Var var;
    double coef = 0.0;
};

enum class Sense : unsigned char { less_equal, greater_equal, equal };

struct Variable {
    VarType type = VarType::continuous;
    double lower = 0.0;
    double upper = infinity;
    double objective = 0.0;
    std::string name;
};

struct Row {
    std::vector<Term> terms;
    Sense sense = Sense::less_equal;
    double rhs = 0.0;
    std::string name;
};

/// How long and how precisely to solve.
struct Parameters {
    /// Wall-clock seconds for the whole solve; infinity for none.
    double time_limit_seconds = infinity;
    /// Stop when (objective − bound) ≤ relative_gap × |objective| ...
    double relative_gap = 1e-9;
    /// ... or when (objective − bound) ≤ absolute_gap.
    double absolute_gap = 1e-9;
};

class Model {
public:
    Var add_var(VarType type, double lower, double upper, double objective = 0.0, std::string name = {}) {
        if (type == VarType::binary) {
            lower = std::max(lower, 0.0);
            upper = std::min(upper, 1.0);
        }
        if (std::isnan(lower) || std::isnan(upper) || lower > upper || lower == infinity || upper == -infinity)
            throw InvalidInput("milp: variable '" + name + "' has empty bounds [" + std::to_string(lower) + ", " +
                               std::to_string(upper) + "]");
        if (!std::isfinite(objective))
            throw InvalidInput("milp: variable '" + name + "' has a non-finite objective coefficient");
        variables_.push_back(Variable{type, lower, upper, objective, std::move(name)});
        return Var{variables_.size() - 1};
    }
    Var add_binary(double objective = 0.0, std::string name = {}) {
        return add_var(VarType::binary, 0.0, 1.0, objective, std::move(name));
    }
    Var add_integer(double lower, double upper, double objective = 0.0, std::string name = {}) {
        return add_var(VarType::integer, lower, upper, objective, std::move(name));
    }
    Var add_continuous(double lower, double upper, double objective = 0.0, std::string name = {}) {
        return add_var(VarType::continuous, lower, upper, objective, std::move(name));
    }

    /// Adds Σ terms (sense) rhs. Terms on the same variable are merged; zero terms dropped.
    void add_row(std::vector<Term> terms, Sense sense, double rhs, std::string name = {}) {
        if (!std::isfinite(rhs)) throw InvalidInput("milp: row '" + name + "' has a non-finite right-hand side");
        for (const Term& t : terms) {
            if (t.var.index >= variables_.size())
                throw InvalidInput("milp: row '" + name + "' uses variable #" + std::to_string(t.var.index) +
                                   ", which does not exist");
            if (!std::isfinite(t.coef)) throw InvalidInput("milp: row '" + name + "' has a non-finite coefficient");
        }
        std::sort(terms.begin(), terms.end(), [](const Term& a, const Term& b) { return a.var.index < b.var.index; });
        std::vector<Term> merged;
        merged.reserve(terms.size());
        for (const Term& t : terms) {
            if (!merged.empty() && merged.back().var == t.var)
                merged.back().coef += t.coef;
            else
                merged.push_back(t);
        }
        std::erase_if(merged, [](const Term& t) { return t.coef == 0.0; });
        rows_.push_back(Row{std::move(merged), sense, rhs, std::move(name)});
    }

    void set_objective(Var var, double coef) { variables_.at(var.index).objective = coef; }
    /// A constant added to the objective (backends see only the linear part).
    void set_objective_offset(double offset) { objective_offset_ = offset; }

    void set_parameters(Parameters parameters) { parameters_ = parameters; }
    void set_time_limit(double seconds) { parameters_.time_limit_seconds = seconds; }
    void set_relative_gap(double gap) { parameters_.relative_gap = gap; }

    /// A known feasible assignment of every variable. Backends that accept one start from
    /// it; the others use its objective as a cutoff and return it when they find nothing
    /// better, so a solve with a start never ends without a solution.
    void set_start(std::vector<double> values) {
        if (values.size() != variables_.size())
            throw InvalidInput("milp: a starting solution needs " + std::to_string(variables_.size()) +
                               " values, got " + std::to_string(values.size()));
        start_ = std::move(values);
    }
    void clear_start() { start_.reset(); }

    [[nodiscard]] const std::vector<Variable>& variables() const noexcept { return variables_; }
    [[nodiscard]] const std::vector<Row>& rows() const noexcept { return rows_; }
    [[nodiscard]] const Variable& variable(Var v) const { return variables_.at(v.index); }
    [[nodiscard]] double objective_offset() const noexcept { return objective_offset_; }
    [[nodiscard]] const Parameters& parameters() const noexcept { return parameters_; }
    [[nodiscard]] const std::optional<std::vector<double>>& start() const noexcept { return start_; }

    [[nodiscard]] std::size_t variable_count() const noexcept { return variables_.size(); }
    [[nodiscard]] std::size_t row_count() const noexcept { return rows_.size(); }
    [[nodiscard]] std::size_t integer_count() const noexcept {
        return static_cast<std::size_t>(std::count_if(variables_.begin(), variables_.end(),
                                                      [](const Variable& v) { return v.type != VarType::continuous; }));
    }
    [[nodiscard]] std::size_t nonzero_count() const noexcept {
        std::size_t n = 0;
        for (const Row& r : rows_) n += r.terms.size();
        return n;
    }

    /// The same model with every variable continuous: its optimum is the LP bound.
    [[nodiscard]] Model relaxation() const {
        Model copy = *this;
        for (Variable& v : copy.variables_) v.type = VarType::continuous;
        return copy;
    }

    /// Objective of an assignment (offset included).
    [[nodiscard]] double objective_value(const std::vector<double>& values) const {
        double total = objective_offset_;
        for (std::size_t i = 0; i < variables_.size() && i < values.size(); ++i)
            total += variables_[i].objective * values[i];
        return total;
    }

    /// Whether an assignment satisfies bounds, integrality and rows within `tolerance`
    /// (scaled by each row's magnitude).
    [[nodiscard]] bool is_feasible(const std::vector<double>& values, double tolerance = 1e-6) const {
        if (values.size() != variables_.size()) return false;
        for (std::size_t i = 0; i < variables_.size(); ++i) {
            const Variable& v = variables_[i];
            const double x = values[i];
            if (!std::isfinite(x) || x < v.lower - tolerance || x > v.upper + tolerance) return false;
            if (v.type != VarType::continuous && std::abs(x - std::round(x)) > tolerance) return false;
        }
        for (const Row& r : rows_) {
            double activity = 0.0;
            double scale = std::max(1.0, std::abs(r.rhs));
            for (const Term& t : r.terms) {
                activity += t.coef * values[t.var.index];
                scale = std::max(scale, std::abs(t.coef * values[t.var.index]));
            }
            const double slack = tolerance * scale;
            if (r.sense == Sense::less_equal && activity > r.rhs + slack) return false;
            if (r.sense == Sense::greater_equal && activity < r.rhs - slack) return false;
            if (r.sense == Sense::equal && std::abs(activity - r.rhs) > slack) return false;
        }
        return true;
    }

private:
    std::vector<Variable> variables_;
    std::vector<Row> rows_;
    double objective_offset_ = 0.0;
    Parameters parameters_;
    std::optional<std::vector<double>> start_;
};

/// How a solve ended.
enum class Status : unsigned char {
    optimal,                 ///< proven optimal (within the gap parameters)
    feasible,                ///< a solution, optimality not proven when the time limit hit
    infeasible,              ///< proven to have no solution
    time_limit_no_solution,  ///< the time limit hit before any solution was found
};

[[nodiscard]] constexpr std::string_view to_string(Status status) noexcept {
    switch (status) {
        case Status::optimal: return "optimal";
        case Status::feasible: return "feasible";
        case Status::infeasible: return "infeasible";
        case Status::time_limit_no_solution: return "time-limit-no-solution";
    }
    return "unknown";
}

struct Result {
    Status status = Status::time_limit_no_solution;
    /// One value per variable when has_solution().
    std::vector<double> values;
    /// Objective of `values` (offset included); +infinity without a solution.
    double objective = infinity;
    /// Best proven lower bound on the optimum (offset included); −infinity when unknown.
    double best_bound = -infinity;
    double seconds = 0.0;

    [[nodiscard]] bool has_solution() const noexcept {
        return status == Status::optimal || status == Status::feasible;
    }
    /// (objective − bound) / |objective|: 0 when optimal, +infinity when no bound or no solution.
    [[nodiscard]] double gap() const noexcept {
        if (status == Status::optimal) return 0.0;
        if (!has_solution() || !std::isfinite(best_bound)) return infinity;
        const double diff = std::max(0.0, objective - best_bound);
        if (diff == 0.0) return 0.0;
        return diff / std::max(std::abs(objective), 1e-12);
    }
    [[nodiscard]] double value(Var v) const { return values.at(v.index); }
};

}  // namespace remat::milp
