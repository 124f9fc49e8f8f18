// remat/core/bytes.hpp — the one type of memory sizes in remat.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace remat {

/// Sizes in bytes. Signed so that differences and "not enough memory" stay representable.
using Bytes = std::int64_t;

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
