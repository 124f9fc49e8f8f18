// remat/solvers/rotor/limits.hpp — the limits of one Rotor solve (RotorLimits): the memory
// cap of each of the DP's tables (RotorOptions::max_table_mib) and the time limit, which the
// least-memory precomputation (rotor/least_memory.hpp) and the time table (rotor/table.hpp)
// share, checked column by column. Either stops the solve with TooLarge, whose message
// suggests fewer slots or a solver that scales to long chains.
//
// Part of the Rotor solver (solvers/rotor.hpp; Beaumont et al. 2019, "Optimal checkpointing
// for heterogeneous chains"; docs/design.md §4.2): its work grows as L³ times the memory
// slots and its tables as L², which is what these limits bound. TooLarge is exit code 4 of
// the command-line tools (docs/formats.md §9 (exit codes)).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>

#include "../../core/errors.hpp"
#include "../../core/timing.hpp"
#include "chain.hpp"

namespace remat::detail::rotor {

// The limits of one solve: the memory cap of each table and the time limit, which all phases
// share (checked column by column). Both stop the solve with TooLarge.
struct RotorLimits {
    std::size_t stages = 0;
    std::size_t max_table_mib = 2048;
    std::optional<double> time_limit;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

    RotorLimits(std::size_t L, const RotorOptions& options)
        : stages(L), max_table_mib(options.max_table_mib), time_limit(options.time_limit_seconds) {
        if (time_limit && !(*time_limit > 0))  // NaN too
            throw InvalidInput("rotor: the time limit must be a positive number of seconds, not " +
                               std::to_string(*time_limit));
    }

    [[nodiscard]] static std::string hint(std::size_t L) {
        return "Rotor's work grows as L^3 (times the memory slots) and its tables as L^2: for a chain of " +
               std::to_string(L) + " stages use greedy, hrockmate or auto (they scale to long chains)";
    }
    // A table of `count` entries of `entry_bytes` each, named `what`.
    void check_memory(std::size_t count, std::size_t entry_bytes, const std::string& what,
                      const std::string& remedy) const {
        const std::size_t cap = max_table_mib * (std::size_t{1} << 20);
        if (entry_bytes == 0 || count <= cap / entry_bytes) return;
        const double mib = static_cast<double>(count) * static_cast<double>(entry_bytes) / double(1 << 20);
        char size[32];
        std::snprintf(size, sizeof size, "%.0f", mib);
        throw TooLarge("rotor: " + std::to_string(stages) + " stages need " + what + " of " + size +
                       " MiB, above max_table_mib = " + std::to_string(max_table_mib) + "; " + remedy + "; " +
                       hint(stages));
    }
    // Before `steps` elementary steps of `phase`: refuses at once when even a fast machine
    // (0.25 ns a step) could not finish them within the time limit.
    void check_work(double steps, const char* phase) const {
        if (!time_limit || steps * 0.25e-9 <= *time_limit - seconds_since(start)) return;
        char numbers[80];
        std::snprintf(numbers, sizeof numbers, "%.3g steps (at least %.0f s)", steps, steps * 0.25e-9);
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", *time_limit);
        throw TooLarge("rotor: " + std::string(phase) + " of " + std::to_string(stages) + " stages takes " + numbers +
                       ", beyond the time limit of " + limit + " s; " + hint(stages));
    }
    void check_time(const char* phase, std::size_t done, std::size_t total) const {
        if (!time_limit || seconds_since(start) <= *time_limit) return;
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", *time_limit);
        throw TooLarge("rotor: time limit of " + std::string(limit) + " s reached while " + phase + " (" +
                       std::to_string(done) + " of " + std::to_string(total) + " columns done); raise the limit, " +
                       "or use fewer slots; " + hint(stages));
    }
};

}  // namespace remat::detail::rotor
