// remat/core/timing.hpp — wall-clock seconds for solver statistics and time limits.
//
// One definition of "seconds elapsed since a point of std::chrono::steady_clock" (a
// monotonic clock, so a time limit never runs backwards when the system clock is set), the
// point where a time limit ends, and Stopwatch, the same as a value that remembers its start.
// Standard library only; cites nothing beyond <chrono>.
#pragma once

#include <chrono>
#include <cmath>
#include <optional>

namespace remat {

/// Seconds from `start` to now, on the steady clock.
[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point start) noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The point `seconds` after `start`, where a time limit of that many seconds ends; none for
/// an infinite (or NaN) limit.
[[nodiscard]] inline std::optional<std::chrono::steady_clock::time_point> deadline_after(
    std::chrono::steady_clock::time_point start, double seconds) {
    if (!std::isfinite(seconds)) return std::nullopt;
    return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

/// A started clock: `seconds()` is the time since it was made.
class Stopwatch {
public:
    Stopwatch() noexcept : start_(std::chrono::steady_clock::now()) {}

    [[nodiscard]] double seconds() const noexcept { return seconds_since(start_); }
    [[nodiscard]] std::chrono::steady_clock::time_point start() const noexcept { return start_; }

private:
    std::chrono::steady_clock::time_point start_;
};

}  // namespace remat
