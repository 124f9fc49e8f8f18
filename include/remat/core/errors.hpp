// remat/core/errors.hpp — the one small exception hierarchy of remat.
//
// Every error remat throws derives from remat::Error. The classes say what the caller
// can do about it: fix the input (InvalidInput), raise the budget (Infeasible), or look
// at the environment (SolverError for a MILP backend, ExecutionError for a tensor run).
// The command-line tools map them to exit codes: InvalidInput → 2, Infeasible → 3.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "bytes.hpp"

namespace remat {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A problem, chain, schedule, file or option that is malformed. The message names the
/// offending item (and, for files, the JSON path or position).
class InvalidInput : public Error {
public:
    using Error::Error;
};

/// The budget is below what any schedule (that this solver can produce) needs.
/// `smallest_feasible()` is the smallest budget the solver knows to work, when it knows one.
class Infeasible : public Error {
public:
    Infeasible(std::string message, Bytes budget, std::optional<Bytes> smallest_feasible)
        : Error(std::move(message)), budget_(budget), smallest_feasible_(smallest_feasible) {}

    [[nodiscard]] Bytes budget() const noexcept { return budget_; }
    [[nodiscard]] std::optional<Bytes> smallest_feasible() const noexcept { return smallest_feasible_; }

private:
    Bytes budget_;
    std::optional<Bytes> smallest_feasible_;
};

/// A solver back-end failed (a MILP library error, a time limit reached with no solution).
class SolverError : public Error {
public:
    using Error::Error;
};

/// Running a plan on real tensors failed; the model's parameters and gradients are left
/// as they were before the step.
class ExecutionError : public Error {
public:
    using Error::Error;
};

}  // namespace remat
