// remat/offload/schedule.hpp — a plan that also moves data between the device and host memory:
// the steps of `remat.schedule/2` (docs/formats.md §11, offloading).
//
// An OffloadSchedule adds three kinds of step to the run and free steps of a Schedule:
// `offload D` (device → host copy), `prefetch D` (host → device copy) and `free_host D`
// (drop the host copy); `free D` drops the device copy. It also names the data that begin
// the step on the host only (a weight kept in host memory between iterations, which the
// schedule must leave there again at its end). The offloading model follows the weight-
// offloading slides of Beaumont, Eyraud-Dubois, Shilova and Zhao ("Weight Offloading
// Strategies for Training Large DNN Models", 2022) and Offmate (topal-team/rockmate).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../core/problem.hpp"
#include "../core/schedule.hpp"

namespace remat::offload {

/// One step of an offloading schedule.
class TransferStep {
public:
    enum class Kind : unsigned char { run, free, offload, prefetch, free_host };

    [[nodiscard]] static constexpr TransferStep run(OpId op) noexcept { return {Kind::run, op.index}; }
    [[nodiscard]] static constexpr TransferStep free(DataId data) noexcept { return {Kind::free, data.index}; }
    [[nodiscard]] static constexpr TransferStep offload(DataId data) noexcept { return {Kind::offload, data.index}; }
    [[nodiscard]] static constexpr TransferStep prefetch(DataId data) noexcept { return {Kind::prefetch, data.index}; }
    [[nodiscard]] static constexpr TransferStep free_host(DataId data) noexcept { return {Kind::free_host, data.index}; }
    /// The same step as a run/free step of a plain Schedule.
    [[nodiscard]] static constexpr TransferStep from(const Step& step) noexcept {
        return step.is_run() ? run(step.op()) : free(step.data());
    }

    [[nodiscard]] constexpr Kind kind() const noexcept { return kind_; }
    [[nodiscard]] constexpr bool is_run() const noexcept { return kind_ == Kind::run; }
    [[nodiscard]] constexpr bool is_transfer() const noexcept {
        return kind_ == Kind::offload || kind_ == Kind::prefetch;
    }
    /// The op of a run step (precondition: is_run()).
    [[nodiscard]] constexpr OpId op() const noexcept { return OpId{index_}; }
    /// The data of every other step.
    [[nodiscard]] constexpr DataId data() const noexcept { return DataId{index_}; }

    friend constexpr bool operator==(const TransferStep&, const TransferStep&) = default;

private:
    constexpr TransferStep(Kind kind, std::size_t index) noexcept : kind_(kind), index_(index) {}
    Kind kind_;
    std::size_t index_;
};

[[nodiscard]] constexpr const char* keyword(TransferStep::Kind kind) noexcept {
    switch (kind) {
        case TransferStep::Kind::run: return "run";
        case TransferStep::Kind::free: return "free";
        case TransferStep::Kind::offload: return "offload";
        case TransferStep::Kind::prefetch: return "prefetch";
        case TransferStep::Kind::free_host: return "free_host";
    }
    return "?";
}

/// The steps of a training step with transfers, and the data that start it on the host only.
struct OffloadSchedule {
    std::vector<DataId> start_on_host;
    std::vector<TransferStep> steps;
    friend bool operator==(const OffloadSchedule&, const OffloadSchedule&) = default;
};

/// A plain schedule as an offloading one (no transfers, everything starts on the device).
[[nodiscard]] inline OffloadSchedule with_no_transfers(const Schedule& schedule) {
    OffloadSchedule out;
    out.steps.reserve(schedule.size());
    for (const Step& step : schedule) out.steps.push_back(TransferStep::from(step));
    return out;
}

/// "run F1+", "offload w3", for messages and logs.
[[nodiscard]] inline std::string describe(const Problem& problem, const TransferStep& step) {
    if (step.is_run()) return "run " + problem.op(step.op()).name;
    return std::string(keyword(step.kind())) + " " + problem.data(step.data()).name;
}

}  // namespace remat::offload
