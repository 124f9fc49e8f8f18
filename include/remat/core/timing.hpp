// remat/core/timing.hpp — wall-clock seconds for solver statistics and time limits.
//
// One definition of "seconds elapsed since a point of std::chrono::steady_clock" (a
// monotonic clock, so a time limit never runs backwards when the system clock is set), and
// Stopwatch, the same as a value that remembers its start. Standard library only; cites
// nothing beyond <chrono>.
#pragma once

#include <chrono>

namespace remat {

/// Seconds from `start` to now, on the steady clock.
[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point start) noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
