// remat/io/budget.hpp — memory budgets as people write them, and byte counts as people read them.
//
// A budget is plain bytes (`25088`), a size with a unit (`512MiB`, `1.5 GiB`, `100KB`) or a
// percentage of the store-all peak P_ref (`40%` = floor(40 × P_ref / 100), docs/formats.md §4 (store-all reference)).
// Units, case-insensitive: B; KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB (powers
// of 1000, as disk makers and the SI use them). A fractional size with a unit is rounded
// down to whole bytes. Standard library only.
#pragma once

#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "../core/errors.hpp"
#include "../core/progress.hpp"
#include "../core/solver.hpp"

namespace remat {

/// A budget as a user states it: bytes, a percentage of the store-all peak P_ref, or a margin
/// above the smallest budget the solver reaches — and what to do when the solver cannot plan
/// within it.
struct BudgetSpec {
    enum class Kind { bytes, percent, above_smallest };
    /// What the budget counts.
    ///  - activations: what the plan holds (activations, their gradients, workspaces): the
    ///    store-all peak P_ref is 100 %. The default, and what solvers see.
    ///  - total: everything the step holds on the device: also the parameters, their gradients
    ///    and the optimizer's state (`resident`, which the front end fills in: LibTorch's
    ///    checkpoint() counts them). The plan gets what is left after the resident bytes.
    enum class Counts { activations, total };
    Kind kind = Kind::bytes;
    Bytes bytes = 0;      ///< when kind == bytes
    double percent = 0;   ///< kind percent: of P_ref (+ resident for total); above_smallest: the margin, in %
    /// When no plan fits: plan at the smallest budget the solver reaches (with a warning)
    /// instead of throwing Infeasible.
    bool fall_back_to_smallest = false;
    Counts counts = Counts::activations;
    /// With Counts::total: the bytes the step holds besides the plan's (parameters, gradients,
    /// optimizer state).
    Bytes resident = 0;

    [[nodiscard]] bool is_percent() const noexcept { return kind == Kind::percent; }
    /// The budget the plan gets, in bytes, given the store-all peak P_ref and (for
    /// above_smallest) the smallest budget of the solver. A total budget that the resident
    /// bytes alone exceed throws Infeasible saying by how much.
    [[nodiscard]] Bytes resolve(Bytes reference_peak, Bytes smallest = 0) const {
        Bytes plan_budget = bytes;
        switch (kind) {
            case Kind::percent:
                plan_budget = counts == Counts::total ? percent_of(reference_peak + resident, percent) - resident
                                                      : percent_of(reference_peak, percent);
                break;
            case Kind::above_smallest: {
                const Bytes margin = percent_of(smallest, percent);
                if (margin > std::numeric_limits<Bytes>::max() - smallest)
                    throw InvalidInput("a budget " + std::to_string(percent) + " % above the smallest budget of " +
                                       std::to_string(smallest) + " bytes is beyond 2^63 - 1 bytes");
                return smallest + margin;
            }
            case Kind::bytes:
                if (counts == Counts::total) plan_budget = bytes - resident;
                break;
        }
        if (plan_budget < 0)
            throw Infeasible("a total budget of " + format_bytes(plan_budget + resident) + " is below the " +
                                 format_bytes(resident) +
                                 " that parameters, gradients and optimizer state take alone; raise it above that",
                             plan_budget + resident, std::nullopt, InfeasibleBecause::no_schedule_fits);
        return plan_budget;
    }
    /// The same budget, counting everything the step holds (see Counts::total).
    [[nodiscard]] BudgetSpec counting_everything() const {
        BudgetSpec copy = *this;
        copy.counts = Counts::total;
        return copy;
    }
    /// The same budget with the resident bytes the front end measured.
    [[nodiscard]] BudgetSpec with_resident(Bytes resident_bytes) const {
        BudgetSpec copy = *this;
        copy.resident = resident_bytes;
        return copy;
    }
    /// The same budget, falling back to the smallest one when it cannot be met.
    [[nodiscard]] BudgetSpec or_smallest() const {
        BudgetSpec copy = *this;
        copy.fall_back_to_smallest = true;
        return copy;
    }
    friend bool operator==(const BudgetSpec&, const BudgetSpec&) = default;
};

/// A budget in bytes of what the plan counts (by default activations; see docs/guide.md).
[[nodiscard]] inline BudgetSpec budget_bytes(Bytes bytes) {
    if (bytes < 0) throw InvalidInput("a budget must be non-negative, not " + std::to_string(bytes) + " bytes");
    return BudgetSpec{BudgetSpec::Kind::bytes, bytes, 0.0, false, BudgetSpec::Counts::activations, 0};
}
/// A budget in bytes of everything the training step holds on the device: parameters, their
/// gradients, the optimizer's state and the plan's activations (BudgetSpec::Counts::total).
[[nodiscard]] inline BudgetSpec budget_total(Bytes bytes) { return budget_bytes(bytes).counting_everything(); }
/// A budget as a percentage of the store-all peak (docs/formats.md §4 (store-all reference)).
[[nodiscard]] inline BudgetSpec budget_percent(double percent) {
    (void)percent_of(0, percent);  // validates
    return BudgetSpec{BudgetSpec::Kind::percent, 0, percent, false, BudgetSpec::Counts::activations, 0};
}
/// The smallest budget the solver reaches, plus `percent` % of it: a plan that always exists.
[[nodiscard]] inline BudgetSpec budget_above_smallest(double percent = 0.0) {
    (void)percent_of(0, percent);  // validates
    return BudgetSpec{BudgetSpec::Kind::above_smallest, 0, percent, false, BudgetSpec::Counts::activations, 0};
}

namespace detail::budget {

struct SizeUnit {
    std::string_view name;
    Bytes multiplier;
};

inline constexpr std::array<SizeUnit, 9> size_units{{
    {"b", 1},
    {"kib", Bytes{1} << 10},
    {"mib", Bytes{1} << 20},
    {"gib", Bytes{1} << 30},
    {"tib", Bytes{1} << 40},
    {"kb", 1'000},
    {"mb", 1'000'000},
    {"gb", 1'000'000'000},
    {"tb", 1'000'000'000'000},
}};

inline constexpr std::size_t max_fraction_digits = 6;

[[noreturn]] inline void bad_budget(std::string_view text, const std::string& why) {
    throw InvalidInput("budget '" + std::string(text) + "': " + why +
                       "; write bytes (25088), a size (512MiB, 1.5GiB, 100KB) or a percentage of the store-all "
                       "peak (40%)");
}

// "123.45" → integer part and up to six fraction digits, exactly; the rest of the text after it.
struct Number {
    std::uint64_t whole = 0;
    std::uint64_t fraction = 0;  // fraction digits as an integer
    std::size_t fraction_digits = 0;
    std::string_view rest;
};

inline Number parse_number(std::string_view original, std::string_view text) {
    Number n;
    std::size_t i = 0;
    std::size_t digits = 0;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
        const auto d = static_cast<std::uint64_t>(text[i] - '0');
        if (n.whole > (std::numeric_limits<std::uint64_t>::max() - d) / 10) bad_budget(original, "the number is too large");
        n.whole = n.whole * 10 + d;
    }
    if (i < text.size() && text[i] == '.') {
        ++i;
        for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++digits) {
            if (++n.fraction_digits > max_fraction_digits)
                bad_budget(original, "at most " + std::to_string(max_fraction_digits) + " decimals");
            n.fraction = n.fraction * 10 + static_cast<std::uint64_t>(text[i] - '0');
        }
    }
    if (digits == 0) bad_budget(original, "it does not start with a number");
    n.rest = text.substr(i);
    return n;
}

inline std::string lower(std::string_view text) {
    std::string out(text);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

inline std::string_view trim(std::string_view text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
    return text;
}

}  // namespace detail::budget

/// Parses "25088", "512MiB", "1.5 GiB", "100KB" or "40%". Throws InvalidInput naming the text.
[[nodiscard]] inline BudgetSpec parse_budget_spec(std::string_view text) {
    const std::string_view t = detail::budget::trim(text);
    if (t.empty()) detail::budget::bad_budget(text, "it is empty");
    if (t.front() == '-') detail::budget::bad_budget(text, "a budget cannot be negative");
    const detail::budget::Number n = detail::budget::parse_number(text, t);
    const std::string unit = detail::budget::lower(detail::budget::trim(n.rest));
    if (unit == "%") {
        double scale = 1;
        for (std::size_t i = 0; i < n.fraction_digits; ++i) scale *= 10;
        const double percent = static_cast<double>(n.whole) + static_cast<double>(n.fraction) / scale;
        return BudgetSpec{BudgetSpec::Kind::percent, 0, percent, false, BudgetSpec::Counts::activations, 0};
    }
    Bytes multiplier = 0;
    if (unit.empty()) multiplier = 1;
    for (const auto& u : detail::budget::size_units)
        if (u.name == unit) multiplier = u.multiplier;
    if (multiplier == 0) detail::budget::bad_budget(text, "unknown unit '" + std::string(detail::budget::trim(n.rest)) +
                                                      "' (known: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, %)");
    if (multiplier == 1 && n.fraction != 0) detail::budget::bad_budget(text, "a number of bytes must be whole");
    const auto max = static_cast<std::uint64_t>(std::numeric_limits<Bytes>::max());
    const auto m = static_cast<std::uint64_t>(multiplier);
    if (n.whole > max / m) detail::budget::bad_budget(text, "the size is too large");
    std::uint64_t pow10 = 1;
    for (std::size_t i = 0; i < n.fraction_digits; ++i) pow10 *= 10;
    // fraction < 10^6 and m <= 2^40, so the product stays below 2^63.
    const std::uint64_t part = n.fraction * m / pow10;
    if (n.whole * m > max - part) detail::budget::bad_budget(text, "the size is too large");
    return BudgetSpec{BudgetSpec::Kind::bytes, static_cast<Bytes>(n.whole * m + part), 0, false, BudgetSpec::Counts::activations, 0};
}

/// A budget in bytes; a percentage is taken of `reference_peak` (P_ref).
[[nodiscard]] inline Bytes parse_budget(std::string_view text, Bytes reference_peak) {
    return parse_budget_spec(text).resolve(reference_peak);
}

/// A size in bytes; a percentage is an error here.
[[nodiscard]] inline Bytes parse_bytes(std::string_view text) {
    const BudgetSpec spec = parse_budget_spec(text);
    if (spec.is_percent()) detail::budget::bad_budget(text, "a percentage is not a size here");
    return spec.bytes;
}


/// A plan made under a BudgetSpec: the budget it was resolved to, and whether it fell back to
/// the solver's smallest budget (and the warning that says so).
struct BudgetedPlan {
    Plan plan;
    Bytes budget = 0;
    bool fell_back = false;
    std::string warning;
};

/// Plans `problem` with `solver` under `spec`, P_ref being `store_all_peak`. An infeasible
/// budget throws Infeasible naming the smallest budget in bytes and in % of P_ref, or, when
/// the spec asks for it, plans at that smallest budget and says so through `warn`.
template <Solver S>
[[nodiscard]] BudgetedPlan plan_within(const S& solver, const Problem& problem, const BudgetSpec& spec, Bytes store_all_peak,
                                       const ProgressCallback& warn = {}) {
    std::optional<Bytes> smallest;
    if (spec.kind == BudgetSpec::Kind::above_smallest) {
        smallest = smallest_budget_of(solver, problem);
        if (!smallest)
            throw InvalidInput("solver '" + std::string(solver.name()) + "' cannot tell its smallest budget for '" +
                               problem.name() + "'; give the budget in bytes or as a percentage");
    }
    const Bytes budget = spec.resolve(store_all_peak, smallest.value_or(0));
    try {
        return BudgetedPlan{solver.solve(problem, budget), budget, false, {}};
    } catch (const Infeasible& e) {
        const std::optional<Bytes> least = e.smallest_budget() ? e.smallest_budget() : smallest_budget_of(solver, problem);
        const auto percent_text = [&](Bytes b) {
            char percent[32];
            std::snprintf(percent, sizeof percent, "%.1f",
                          100.0 * static_cast<double>(b) / static_cast<double>(std::max<Bytes>(1, store_all_peak)));
            return format_bytes(b) + " = " + percent + " % of the store-all peak " + format_bytes(store_all_peak);
        };
        if (!spec.fall_back_to_smallest || !least) {
            std::string message = e.what();
            if (least) message += " (smallest budget " + percent_text(*least) + ")";
            if (!spec.fall_back_to_smallest && least)
                message += "; ask for budget_above_smallest() or .or_smallest() to plan at the smallest budget instead";
            throw Infeasible(message, budget, least, store_all_peak, e.because());
        }
        BudgetedPlan out{solver.solve(problem, *least), *least, true, {}};
        out.warning = "remat: the budget " + percent_text(budget) + " is below what " + std::string(solver.name()) +
                      " reaches; planned at its smallest budget, " + percent_text(*least);
        report_progress(warn, out.warning);
        return out;
    }
}

}  // namespace remat
