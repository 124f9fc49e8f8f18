// remat/core/schedule.hpp — a plan: the ordered list of run/free steps of docs/formats.md §2 (schedules).
//
// A Schedule is a plain value. It means nothing without its Problem (ids index into it);
// simulate() (simulate.hpp) decides whether it is valid and what it costs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "problem.hpp"

namespace remat {

/// One step of a schedule: run an op, or free a data.
class Step {
public:
    enum class Kind : unsigned char { run, free };

    [[nodiscard]] static constexpr Step run(OpId op) noexcept { return Step{Kind::run, op.index}; }
    [[nodiscard]] static constexpr Step free(DataId data) noexcept { return Step{Kind::free, data.index}; }

    [[nodiscard]] constexpr Kind kind() const noexcept { return kind_; }
    [[nodiscard]] constexpr bool is_run() const noexcept { return kind_ == Kind::run; }
    [[nodiscard]] constexpr bool is_free() const noexcept { return kind_ == Kind::free; }
    /// The op of a run step (precondition: is_run()).
    [[nodiscard]] constexpr OpId op() const noexcept { return OpId{index_}; }
    /// The data of a free step (precondition: is_free()).
    [[nodiscard]] constexpr DataId data() const noexcept { return DataId{index_}; }

    friend constexpr bool operator==(const Step&, const Step&) = default;

private:
    constexpr Step(Kind kind, std::size_t index) noexcept : kind_(kind), index_(index) {}
    Kind kind_;
    std::size_t index_;
};

using Schedule = std::vector<Step>;

/// "run F1+" / "free a1", for messages and logs.
[[nodiscard]] inline std::string describe(const Problem& problem, const Step& step) {
    if (step.is_run()) return "run " + problem.op(step.op()).name;
    return "free " + problem.data(step.data()).name;
}

}  // namespace remat
