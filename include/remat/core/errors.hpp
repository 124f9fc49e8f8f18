// remat/core/errors.hpp — the one small exception hierarchy of remat.
//
// Every error remat throws derives from remat::Error. The classes say what the caller
// can do about it: fix the input (InvalidInput), raise the budget (Infeasible), or look
// at the environment (SolverError for a MILP backend, ExecutionError for a tensor run).
// The command-line tools map them to exit codes: InvalidInput → 2, Infeasible → 3,
// TooLarge → 4.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

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

/// Why a budget is infeasible: a proof that no schedule at all fits it (below a proven lower
/// bound, or an exact search over every schedule found none), or only that the solver that
/// threw has no plan within it (another solver may have one).
enum class InfeasibleBecause { beyond_solver, no_schedule_fits };

/// The budget is below what any schedule (that this solver can produce) needs; `proven()`
/// says which. `smallest_budget()` is the smallest budget the solver knows to work, when it
/// knows one.
class Infeasible : public Error {
public:
    /// `store_all_peak`: P_ref, when the thrower knows it (front ends add it), so that the
    /// smallest budget can also be read as a percentage of it.
    Infeasible(std::string message, Bytes budget, std::optional<Bytes> smallest_budget,
               std::optional<Bytes> store_all_peak = std::nullopt,
               InfeasibleBecause because = InfeasibleBecause::beyond_solver)
        : Error(std::move(message)), budget_(budget), smallest_budget_(smallest_budget), store_all_peak_(store_all_peak),
          because_(because) {}
    /// The same, with the reason given and the store-all peak unknown.
    Infeasible(std::string message, Bytes budget, std::optional<Bytes> smallest_budget, InfeasibleBecause because)
        : Infeasible(std::move(message), budget, smallest_budget, std::nullopt, because) {}

    [[nodiscard]] Bytes budget() const noexcept { return budget_; }
    /// The smallest budget the solver knows to work, when it knows one.
    [[nodiscard]] std::optional<Bytes> smallest_budget() const noexcept { return smallest_budget_; }
    [[deprecated("use smallest_budget()")]] [[nodiscard]] std::optional<Bytes> smallest_feasible() const noexcept {
        return smallest_budget_;
    }
    [[nodiscard]] std::optional<Bytes> store_all_peak() const noexcept { return store_all_peak_; }
    /// No schedule at all fits the budget (a proof), not only none of this solver's.
    [[nodiscard]] bool proven() const noexcept { return because_ == InfeasibleBecause::no_schedule_fits; }
    [[nodiscard]] InfeasibleBecause because() const noexcept { return because_; }
    /// The smallest budget as a percentage of the store-all peak, when both are known.
    [[nodiscard]] std::optional<double> smallest_percent() const noexcept {
        if (!smallest_budget_ || !store_all_peak_ || *store_all_peak_ <= 0) return std::nullopt;
        return 100.0 * static_cast<double>(*smallest_budget_) / static_cast<double>(*store_all_peak_);
    }

private:
    Bytes budget_;
    std::optional<Bytes> smallest_budget_;
    std::optional<Bytes> store_all_peak_;
    InfeasibleBecause because_;
};

/// A solver back-end failed (a MILP library error, a time limit reached with no solution).
class SolverError : public Error {
public:
    using Error::Error;
};

/// The problem is beyond what this solver can handle: its tables would exceed the solver's
/// memory cap, or its time limit ran out before it had any plan. Not a bad input and not a
/// budget question: another solver (the message names one) or a larger limit may succeed.
/// A SolverError, so that callers falling back to another solver on one catch it too.
class TooLarge : public SolverError {
public:
    using SolverError::SolverError;
};

/// Running a plan on real tensors failed; the model's parameters and gradients are left
/// as they were before the step.
class ExecutionError : public Error {
public:
    using Error::Error;
};

/// `text` made safe to echo in a message: at most `max_chars` characters (then "…"), control
/// characters and bytes that are not valid UTF-8 written as \xNN escapes. Names and keys in
/// messages go through it, so that a 100k-character key or a binary name cannot flood or
/// corrupt a terminal.
[[nodiscard]] inline std::string printable(std::string_view text, std::size_t max_chars = 80) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(std::min<std::size_t>(text.size(), max_chars * 4) + 3);
    std::size_t chars = 0;
    for (std::size_t i = 0; i < text.size(); ++chars) {
        if (chars == max_chars) return out + "\xE2\x80\xA6";  // "…"
        const auto c = static_cast<unsigned char>(text[i]);
        // Length of a well-formed UTF-8 sequence starting here (0: not one).
        std::size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3
                      : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        for (std::size_t k = 1; k < n; ++k)
            if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) n = 0;
        if (n == 3) {  // no overlong forms, no surrogates
            const auto c1 = static_cast<unsigned char>(text[i + 1]);
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) n = 0;
        } else if (n == 4) {
            const auto c1 = static_cast<unsigned char>(text[i + 1]);
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) n = 0;
        }
        if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xF];
            ++i;
            continue;
        }
        out.append(text.substr(i, n));
        i += n;
    }
    return out;
}

}  // namespace remat
