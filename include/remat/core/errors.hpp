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
/// `smallest_budget()` is the smallest budget the solver knows to work, when it knows one.
class Infeasible : public Error {
public:
    /// `store_all_peak`: P_ref, when the thrower knows it (front ends add it), so that the
    /// smallest budget can also be read as a percentage of it.
    Infeasible(std::string message, Bytes budget, std::optional<Bytes> smallest_budget,
               std::optional<Bytes> store_all_peak = std::nullopt)
        : Error(std::move(message)), budget_(budget), smallest_budget_(smallest_budget), store_all_peak_(store_all_peak) {}

    [[nodiscard]] Bytes budget() const noexcept { return budget_; }
    /// The smallest budget the solver knows to work, when it knows one.
    [[nodiscard]] std::optional<Bytes> smallest_budget() const noexcept { return smallest_budget_; }
    [[deprecated("use smallest_budget()")]] [[nodiscard]] std::optional<Bytes> smallest_feasible() const noexcept {
        return smallest_budget_;
    }
    [[nodiscard]] std::optional<Bytes> store_all_peak() const noexcept { return store_all_peak_; }
    /// The smallest budget as a percentage of the store-all peak, when both are known.
    [[nodiscard]] std::optional<double> smallest_percent() const noexcept {
        if (!smallest_budget_ || !store_all_peak_ || *store_all_peak_ <= 0) return std::nullopt;
        return 100.0 * static_cast<double>(*smallest_budget_) / static_cast<double>(*store_all_peak_);
    }

private:
    Bytes budget_;
    std::optional<Bytes> smallest_budget_;
    std::optional<Bytes> store_all_peak_;
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
