// remat/io/budget.hpp — memory budgets as people write them, and byte counts as people read them.
//
// A budget is plain bytes (`25088`), a size with a unit (`512MiB`, `1.5 GiB`, `100KB`) or a
// percentage of the store-all peak P_ref (`40%` = floor(40 × P_ref / 100), FORMATS.md §4).
// Units, case-insensitive: B; KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB (powers
// of 1000, as disk makers and the SI use them). A fractional size with a unit is rounded
// down to whole bytes. Standard library only.
#pragma once

#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "../core/errors.hpp"
#include "../core/solver.hpp"

namespace remat {

/// A parsed budget: bytes, or a percentage still to be applied to P_ref.
struct BudgetSpec {
    enum class Kind { bytes, percent };
    Kind kind = Kind::bytes;
    Bytes bytes = 0;      ///< when kind == bytes
    double percent = 0;   ///< when kind == percent

    [[nodiscard]] bool is_percent() const noexcept { return kind == Kind::percent; }
    /// The budget in bytes, given the store-all peak P_ref (used only for a percentage).
    [[nodiscard]] Bytes resolve(Bytes reference_peak) const {
        return is_percent() ? percent_of(reference_peak, percent) : bytes;
    }
    friend bool operator==(const BudgetSpec&, const BudgetSpec&) = default;
};

namespace detail::budget_impl {

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

}  // namespace detail::budget_impl

/// Parses "25088", "512MiB", "1.5 GiB", "100KB" or "40%". Throws InvalidInput naming the text.
[[nodiscard]] inline BudgetSpec parse_budget_spec(std::string_view text) {
    const std::string_view t = detail::budget_impl::trim(text);
    if (t.empty()) detail::budget_impl::bad_budget(text, "it is empty");
    if (t.front() == '-') detail::budget_impl::bad_budget(text, "a budget cannot be negative");
    const detail::budget_impl::Number n = detail::budget_impl::parse_number(text, t);
    const std::string unit = detail::budget_impl::lower(detail::budget_impl::trim(n.rest));
    if (unit == "%") {
        double scale = 1;
        for (std::size_t i = 0; i < n.fraction_digits; ++i) scale *= 10;
        const double percent = static_cast<double>(n.whole) + static_cast<double>(n.fraction) / scale;
        return BudgetSpec{BudgetSpec::Kind::percent, 0, percent};
    }
    Bytes multiplier = 0;
    if (unit.empty()) multiplier = 1;
    for (const auto& u : detail::budget_impl::size_units)
        if (u.name == unit) multiplier = u.multiplier;
    if (multiplier == 0) detail::budget_impl::bad_budget(text, "unknown unit '" + std::string(detail::budget_impl::trim(n.rest)) +
                                                      "' (known: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, %)");
    if (multiplier == 1 && n.fraction != 0) detail::budget_impl::bad_budget(text, "a number of bytes must be whole");
    const auto max = static_cast<std::uint64_t>(std::numeric_limits<Bytes>::max());
    const auto m = static_cast<std::uint64_t>(multiplier);
    if (n.whole > max / m) detail::budget_impl::bad_budget(text, "the size is too large");
    std::uint64_t pow10 = 1;
    for (std::size_t i = 0; i < n.fraction_digits; ++i) pow10 *= 10;
    // fraction < 10^6 and m <= 2^40, so the product stays below 2^63.
    const std::uint64_t part = n.fraction * m / pow10;
    if (n.whole * m > max - part) detail::budget_impl::bad_budget(text, "the size is too large");
    return BudgetSpec{BudgetSpec::Kind::bytes, static_cast<Bytes>(n.whole * m + part), 0};
}

/// A budget in bytes; a percentage is taken of `reference_peak` (P_ref).
[[nodiscard]] inline Bytes parse_budget(std::string_view text, Bytes reference_peak) {
    return parse_budget_spec(text).resolve(reference_peak);
}

/// A size in bytes; a percentage is an error here.
[[nodiscard]] inline Bytes parse_bytes(std::string_view text) {
    const BudgetSpec spec = parse_budget_spec(text);
    if (spec.is_percent()) detail::budget_impl::bad_budget(text, "a percentage is not a size here");
    return spec.bytes;
}

/// "512 B", "24.5 KiB", "1.5 GiB", "8 MiB": three significant digits, binary units.
[[nodiscard]] inline std::string format_bytes(Bytes bytes) {
    constexpr std::array<const char*, 7> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    const bool negative = bytes < 0;
    // Magnitude as unsigned so that the most negative value formats too.
    const std::uint64_t magnitude =
        negative ? std::uint64_t{0} - static_cast<std::uint64_t>(bytes) : static_cast<std::uint64_t>(bytes);
    const std::string sign = negative ? "-" : "";
    if (magnitude < 1024) return sign + std::to_string(magnitude) + " B";
    std::size_t unit = 0;
    double value = static_cast<double>(magnitude);
    while (value >= 1024 && unit + 1 < units.size()) {
        value /= 1024;
        ++unit;
    }
    std::array<char, 32> buffer{};
    const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
    std::snprintf(buffer.data(), buffer.size(), "%.*f", decimals, value);
    std::string number(buffer.data());
    if (number.find('.') != std::string::npos) {
        while (number.back() == '0') number.pop_back();
        if (number.back() == '.') number.pop_back();
    }
    return sign + number + " " + units[unit];
}

}  // namespace remat
