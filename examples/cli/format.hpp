// examples/cli/format.hpp — what the command-line tools share: exit codes and the number
// formats of their summaries.
#pragma once

#include <cstdio>
#include <string>

#include <remat/core/bytes.hpp>

namespace remat::cli {

inline constexpr int exit_ok = 0;
inline constexpr int exit_error = 1;
inline constexpr int exit_bad_input = 2;
inline constexpr int exit_infeasible = 3;
inline constexpr int exit_too_large = 4;

namespace detail {

inline std::string number(double value, const char* format = "%.6g") {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, value);
    return buffer;
}

inline std::string percent(double part, double whole) {
    if (whole == 0) return "n/a";
    return number(100.0 * part / whole, "%.1f") + " %";
}

inline std::string signed_percent(double part, double whole) {
    if (whole == 0) return "n/a";
    return number(100.0 * (part / whole - 1.0), "%+.1f") + " %";
}

inline std::string bytes_both(Bytes b) { return std::to_string(b) + " B (" + format_bytes(b) + ")"; }

inline std::string pad(std::string s, std::size_t width, bool right = true) {
    if (s.size() >= width) return s;
    return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

}  // namespace detail

}  // namespace remat::cli
