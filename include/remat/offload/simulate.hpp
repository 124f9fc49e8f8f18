// remat/offload/simulate.hpp — the simulator of docs/formats.md §11 (offloading): device peak,
// host peak and makespan of a schedule with transfers, and the first invalid step and why.
//
// Memory is order-based, as in Offmate and POFO (Beaumont et al., NeurIPS 2021): a prefetch
// reserves its device bytes when it is issued, an offload reserves its host bytes when it is
// issued, and a device copy stays counted until an explicit free, which waits for the offload
// reading it. So the peaks do not depend on bandwidth. Time is the makespan of three channels
// (compute, device → host, host → device): a transfer starts when its channel is free, its
// source is complete and every op before it in the schedule has finished; an op starts when
// the previous op has finished and its inputs are on the device. For a schedule of run and
// free steps only, the figures equal simulate()'s (core/simulate.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "../core/problem.hpp"
#include "../core/simulate.hpp"
#include "schedule.hpp"

namespace remat::offload {

/// Memory and time around one step.
struct TransferTimelinePoint {
    Bytes device_during = 0;
    Bytes device_after = 0;
    Bytes host_after = 0;
    double start = 0.0;  ///< when the step starts on its channel (a free: when it releases memory)
    double end = 0.0;    ///< when it ends
};

struct OffloadReport {
    bool valid = false;
    std::optional<std::size_t> error_step;  ///< as SimulationReport::error_step
    std::string error;
    Bytes device_peak = 0;
    Bytes host_peak = 0;
    Bytes device_initial = 0;
    Bytes host_initial = 0;
    double makespan = 0.0;      ///< when the last op or transfer ends
    double compute_time = 0.0;  ///< the sum of the op times run (simulate()'s `time`)
    Bytes bytes_to_host = 0;
    Bytes bytes_to_device = 0;
    std::size_t offloads = 0;
    std::size_t prefetches = 0;
    std::vector<TransferTimelinePoint> timeline;

    /// Valid, within the device budget and within the problem's host limit.
    [[nodiscard]] bool fits(Bytes device_budget, std::optional<Bytes> host_limit) const noexcept {
        return valid && device_peak <= device_budget && (!host_limit || host_peak <= *host_limit);
    }
    /// Time waiting for transfers: the makespan beyond the compute time.
    [[nodiscard]] double stall_time() const noexcept { return std::max(0.0, makespan - compute_time); }
};

namespace detail {

// The simulator's state; one method per kind of step (docs/formats.md §11).
class TransferSimulator {
public:
    TransferSimulator(const Problem& problem, TransferSettings transfers)
        : p_(problem),
          transfers_(transfers),
          on_device_(problem.data_count(), 0),
          on_host_(problem.data_count(), 0),
          host_current_(problem.data_count(), 0),
          updated_(problem.data_count(), 0),
          start_on_host_(problem.data_count(), 0),
          ran_(problem.op_count(), 0),
          device_ready_(problem.data_count(), 0.0),
          host_ready_(problem.data_count(), 0.0),
          host_busy_(problem.data_count(), 0.0) {}

    // Places the initial data; an error message when start_on_host is wrong.
    std::optional<std::string> start(const std::vector<DataId>& start_on_host) {
        for (const DataId d : start_on_host) {
            if (d.index >= p_.data_count()) return "start_on_host: data id " + std::to_string(d.index) + " does not exist";
            const std::string& name = p_.data(d).name;
            if (!p_.is_initial(d)) return "start_on_host: '" + name + "' is not initial";
            if (!p_.data(d).offloadable) return "start_on_host: '" + name + "' is not offloadable";
            if (start_on_host_[d.index]) return "start_on_host: '" + name + "' is listed twice";
            start_on_host_[d.index] = 1;
            on_host_[d.index] = host_current_[d.index] = 1;
            host_ += p_.data(d).bytes;
        }
        for (const DataId d : p_.initial())
            if (!start_on_host_[d.index]) {
                on_device_[d.index] = 1;
                device_ += p_.data(d).bytes;
            }
        report_.device_initial = report_.device_peak = device_;
        report_.host_initial = report_.host_peak = host_;
        return std::nullopt;
    }

    std::optional<std::string> step(const TransferStep& s) {
        using K = TransferStep::Kind;
        if (s.is_run() ? s.op().index >= p_.op_count() : s.data().index >= p_.data_count())
            return std::string(s.is_run() ? "op" : "data") + " id " + std::to_string(s.data().index) + " does not exist";
        switch (s.kind()) {
            case K::run: return run(s.op());
            case K::free: return free(s.data());
            case K::offload: return offload(s.data());
            case K::prefetch: return prefetch(s.data());
            case K::free_host: return free_host(s.data());
        }
        return "unknown step kind";
    }

    std::optional<std::string> finish() {
        for (std::size_t k = 0; k < p_.op_count(); ++k)
            if (p_.op(OpId{k}).exactly_once && !ran_[k])
                return "exactly-once op '" + p_.op(OpId{k}).name + "' never ran";
        for (const DataId d : p_.final_data())
            if (!on_device_[d.index]) return "final data '" + p_.data(d).name + "' is not live on the device";
        for (std::size_t k = 0; k < p_.data_count(); ++k) {
            const std::string& name = p_.data(DataId{k}).name;
            if (start_on_host_[k] && (on_device_[k] || !host_current_[k]))
                return "'" + name + "' started on the host only and must end there, with a current host copy and no "
                       "device copy (the next step starts as this one did)";
            if (!start_on_host_[k] && p_.is_initial(DataId{k}) && !on_device_[k])
                return "initial data '" + name + "' started on the device and must end there";
            if (!start_on_host_[k] && on_host_[k])
                return "'" + name + "' still has a host copy; free_host it (only the data that started on the host end "
                       "there)";
        }
        report_.makespan = std::max({compute_clock_, to_host_clock_, to_device_clock_});
        if (!std::isfinite(report_.makespan)) return "the makespan overflows to infinity";
        report_.valid = true;
        return std::nullopt;
    }

    OffloadReport& report() noexcept { return report_; }

private:
    [[nodiscard]] const std::string& name(DataId d) const { return p_.data(d).name; }
    [[nodiscard]] static double duration(Bytes bytes, double bandwidth) {
        return bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0.0;
    }
    void record(Bytes during, double start, double end) {
        report_.device_peak = std::max(report_.device_peak, during);
        report_.host_peak = std::max(report_.host_peak, host_);
        report_.timeline.push_back({during, device_, host_, start, end});
    }

    std::optional<std::string> run(OpId id) {
        const Op& op = p_.op(id);
        for (const DataId d : op.reads)
            if (!on_device_[d.index])
                return "reads '" + name(d) + "', which is not live on the device" +
                       (on_host_[d.index] ? " (it has a host copy: prefetch it first)" : "");
        if (op.exactly_once && ran_[id.index]) return std::string("exactly-once op runs a second time");
        if (auto reason = remat::detail::use_after_update(p_, op, on_device_, updated_)) return reason;
        double start = compute_clock_;
        for (const std::vector<DataId>* list : {&op.reads, &op.updates})
            for (const DataId d : *list) start = std::max(start, device_ready_[d.index]);
        // Changing a weight in place waits for the offload still reading its old value.
        for (const DataId d : op.updates) start = std::max(start, host_busy_[d.index]);
        const double end = start + op.time;
        Bytes written = 0;
        for (const DataId d : op.writes)
            if (!on_device_[d.index]) {
                written += p_.data(d).bytes;
                on_device_[d.index] = 1;
                device_ready_[d.index] = end;
            }
        for (const DataId d : op.updates) {
            device_ready_[d.index] = end;
            host_current_[d.index] = 0;  // a host copy now holds the old value
        }
        const Bytes during = device_ + written + op.overhead;
        device_ += written;
        ran_[id.index] = 1;
        report_.compute_time += op.time;
        compute_clock_ = end;
        record(during, start, end);
        return std::nullopt;
    }

    std::optional<std::string> free(DataId d) {
        if (!on_device_[d.index])
            return "data is not live on the device" + std::string(on_host_[d.index] ? " (only its host copy is)" : "");
        if (p_.is_initial(d) && !host_current_[d.index])
            return "initial data may leave the device only while the host holds a current copy (offload it first): "
                   "this would free its only copy";
        // The memory is reused after the free: wait for the transfers that use this copy.
        compute_clock_ = std::max({compute_clock_, device_ready_[d.index], host_busy_[d.index]});
        on_device_[d.index] = 0;
        device_ -= p_.data(d).bytes;
        record(device_, compute_clock_, compute_clock_);
        return std::nullopt;
    }

    std::optional<std::string> offload(DataId d) {
        if (!p_.data(d).offloadable) return "'" + name(d) + "' is not offloadable";
        if (!on_device_[d.index]) return "'" + name(d) + "' is not live on the device; nothing to copy";
        if (host_current_[d.index]) return "'" + name(d) + "' already has a current host copy";
        if (!on_host_[d.index]) host_ += p_.data(d).bytes;  // a stale copy is overwritten in place
        const Bytes bytes = p_.data(d).bytes;
        const double start = std::max({to_host_clock_, compute_clock_, device_ready_[d.index], host_busy_[d.index]});
        const double end = start + duration(bytes, transfers_.bandwidth_to_host);
        to_host_clock_ = end;
        host_ready_[d.index] = host_busy_[d.index] = end;
        on_host_[d.index] = host_current_[d.index] = 1;
        report_.bytes_to_host += bytes;
        ++report_.offloads;
        record(device_, start, end);
        return std::nullopt;
    }

    std::optional<std::string> prefetch(DataId d) {
        if (!p_.data(d).offloadable) return "'" + name(d) + "' is not offloadable";
        if (on_device_[d.index]) return "'" + name(d) + "' is already live on the device";
        if (!on_host_[d.index]) return "'" + name(d) + "' has no host copy to prefetch from";
        if (!host_current_[d.index])
            return "the host copy of '" + name(d) + "' is stale: op '" + p_.op(*p_.updater(d)).name +
                   "' updated the data after it was offloaded";
        const Bytes bytes = p_.data(d).bytes;
        const double start = std::max({to_device_clock_, compute_clock_, host_ready_[d.index]});
        const double end = start + duration(bytes, transfers_.bandwidth_to_device);
        to_device_clock_ = end;
        device_ready_[d.index] = end;
        host_busy_[d.index] = std::max(host_busy_[d.index], end);
        on_device_[d.index] = 1;
        device_ += bytes;
        report_.bytes_to_device += bytes;
        ++report_.prefetches;
        record(device_, start, end);
        return std::nullopt;
    }

    std::optional<std::string> free_host(DataId d) {
        if (!on_host_[d.index]) return "'" + name(d) + "' has no host copy";
        if (!on_device_[d.index] && host_current_[d.index] && p_.is_initial(d))
            return "this is the only copy of initial data '" + name(d) + "' (prefetch it first)";
        // The next offload may reuse this host memory: it waits for the transfers using it.
        to_host_clock_ = std::max(to_host_clock_, host_busy_[d.index]);
        on_host_[d.index] = host_current_[d.index] = 0;
        host_ -= p_.data(d).bytes;
        record(device_, to_host_clock_, to_host_clock_);
        return std::nullopt;
    }

    const Problem& p_;
    TransferSettings transfers_;
    std::vector<char> on_device_, on_host_, host_current_, updated_, start_on_host_, ran_;
    std::vector<double> device_ready_;  // when the device copy is complete
    std::vector<double> host_ready_;    // when the host copy is complete
    std::vector<double> host_busy_;     // when the last transfer using the host copy ends
    double compute_clock_ = 0.0, to_host_clock_ = 0.0, to_device_clock_ = 0.0;
    Bytes device_ = 0, host_ = 0;
    OffloadReport report_;
};

}  // namespace detail

/// Simulates `schedule` on `problem` exactly as docs/formats.md §11 says, with the problem's
/// bandwidths, or `transfers` when given (a bandwidth of 0 makes that direction instantaneous).
[[nodiscard]] inline OffloadReport simulate(const Problem& problem, const OffloadSchedule& schedule,
                                            std::optional<TransferSettings> transfers = std::nullopt) {
    detail::TransferSimulator sim(problem, transfers.value_or(problem.transfers()));
    const auto fail = [&](std::size_t step, std::string reason) {
        OffloadReport report = std::move(sim.report());
        report.valid = false;
        report.error_step = step;
        report.error = std::move(reason);
        return report;
    };
    if (auto reason = sim.start(schedule.start_on_host)) return fail(0, *reason);
    sim.report().timeline.reserve(schedule.steps.size());
    for (std::size_t i = 0; i < schedule.steps.size(); ++i)
        if (auto reason = sim.step(schedule.steps[i])) {
            const TransferStep& s = schedule.steps[i];
            const bool exists = s.is_run() ? s.op().index < problem.op_count() : s.data().index < problem.data_count();
            return fail(i, "step " + std::to_string(i) + (exists ? " (" + describe(problem, s) + ")" : "") + ": " + *reason);
        }
    if (auto reason = sim.finish()) return fail(schedule.steps.size(), "end of schedule: " + *reason);
    return std::move(sim.report());
}

}  // namespace remat::offload
