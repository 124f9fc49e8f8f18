// remat/offload/greedy.hpp — weight offloading as a pass on any plan: the greedy selection and
// greedy schedule of the weight-offloading slides ("Memory saving for neural network
// training", X. Zhao, Inria; Beaumont, Eyraud-Dubois, Shilova, Zhao, "Weight Offloading
// Strategies for Training Large DNN Models", 2022): Greedy and Greedy*.
//
// Selection. A weight (any initial, offloadable data: a weight or its optimizer state) may be
// absent from the device in the gaps between the steps that use it, and in the cyclic gap
// from its last use (its update) to its first use of the next iteration. With infinite
// bandwidth, an absence lowers the memory of every step inside its gap by the weight's size.
// Repeatedly, the absence that covers the most overflow above the budget per byte it
// transfers is chosen, until nothing overflows. Transfers are counted exactly: a gap needs
// a prefetch, and an offload only when the host holds no current copy (the cyclic gap gives
// one for free to the gaps before the update; so both gaps of a weight cost three transfers,
// one gap two, the difference the slides weigh with a coefficient).
//   - Greedy: each weight is absent in at most one gap.
//   - Greedy*: in any number of its gaps.
// Schedule. Transfers are placed at the given bandwidths: prefetches by earliest need, each
// as late as still arrives in time (by the plan's op times) and as early as memory allows
// when it cannot; offloads by earliest production, right after the step that makes the
// device copy current; each device copy is freed once its offload is (estimated) done, or
// as soon as memory requires. The result is checked by the simulator (offload/simulate.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "schedule.hpp"
#include "simulate.hpp"

namespace remat::offload {

enum class GreedyVariant {
    once,      ///< Greedy: a weight leaves the device at most once per iteration
    repeated,  ///< Greedy*: as often as it helps
};

[[nodiscard]] constexpr std::string_view to_string(GreedyVariant v) noexcept {
    return v == GreedyVariant::once ? "greedy" : "greedy*";
}

struct WeightOffloadOptions {
    GreedyVariant variant = GreedyVariant::repeated;
    /// Host limit and bandwidths; the problem's when not given.
    std::optional<TransferSettings> transfers;
    /// Whether offloadable data that are not initial (activations, POFO) may move too.
    bool activations = true;
    /// Whether a weight may spend the time between steps on the host (begin and end the step
    /// there: the cyclic gap, `start_on_host`). Off for a drop-in module, whose caller's
    /// optimizer updates the weights on the device after the step.
    bool between_steps = true;
};

namespace detail::greedy {

// The memory profile of a plan: index 0 is the initial state, 2i + 1 the memory while plan
// step i runs and 2i + 2 the memory after it. A transfer or free placed at slot p (before
// plan step p) is counted at index 2p: a free there keeps the data counted up to 2p, and a
// prefetch there counts it from 2p on (the memory just after the prefetch is the state
// after step p - 1 plus the data).
// A gap of one data: it is absent over `ranges` (profile indices, inclusive) when freed right
// after the use before the gap and prefetched right before the use after it. A cyclic gap
// has two ranges: the start of the step and its end.
struct Gap {
    std::size_t data = 0;
    bool cyclic = false;
    std::size_t after_use = 0;  // plan step of the use before the gap (inner gaps; cyclic: the last use)
    std::size_t next_use = 0;   // plan step of the use after it (cyclic: the first use; the plan's size if none)
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    bool chosen = false;
};

struct WeightUses {
    std::vector<std::size_t> steps;     // plan steps that read, update or write the data
    std::vector<char> updates;          // whether that use updates it
    std::vector<char> writes;           // whether that use writes it (an activation's producer)
    std::vector<std::size_t> frees;     // plan steps that free it
    std::vector<std::size_t> gaps;      // its gaps (indices into the gap list), cyclic first when it exists
};

struct Selection {
    std::vector<Gap> gaps;
    std::vector<WeightUses> uses;  // by data
    std::vector<Bytes> excess;     // by profile index, after the chosen absences
};

// An activation (POFO: Beaumont, Eyraud-Dubois, Shilova, NeurIPS 2021) may be away between
// two uses while the plan keeps it live: from its write, or a read, to a later read, with no
// free of the plan in between. Its first absence needs an offload right after the write.
inline void add_activation_gaps(Selection& s, std::size_t k) {
    WeightUses& u = s.uses[k];
    std::size_t next_free = 0;
    for (std::size_t j = 0; j + 1 < u.steps.size(); ++j) {
        const std::size_t a = u.steps[j], b = u.steps[j + 1];
        while (next_free < u.frees.size() && u.frees[next_free] < a) ++next_free;
        const bool freed_between = next_free < u.frees.size() && u.frees[next_free] < b;
        if (u.writes[j + 1] || freed_between || b <= a + 1) continue;
        u.gaps.push_back(s.gaps.size());
        s.gaps.push_back(Gap{k, false, a, b, {{2 * a + 3, 2 * b - 1}}, false});
    }
}

inline Selection find_gaps(const Problem& p, const Schedule& plan, const SimulationReport& base, Bytes budget,
                           bool activations = true, bool between_steps = true) {
    Selection s;
    s.uses.resize(p.data_count());
    s.excess.push_back(base.initial - budget);
    for (const TimelinePoint& t : base.timeline) {
        s.excess.push_back(t.during - budget);
        s.excess.push_back(t.after - budget);
    }
    const auto use = [&](DataId d, std::size_t i, bool update, bool write) {  // one use per step
        WeightUses& u = s.uses[d.index];
        if (u.steps.empty() || u.steps.back() != i) {
            u.steps.push_back(i);
            u.updates.push_back(0);
            u.writes.push_back(0);
        }
        u.updates.back() = static_cast<char>(u.updates.back() | update);
        u.writes.back() = static_cast<char>(u.writes.back() | write);
    };
    for (std::size_t i = 0; i < plan.size(); ++i) {
        if (!plan[i].is_run()) {
            s.uses[plan[i].data().index].frees.push_back(i);
            continue;
        }
        const Op& op = p.op(plan[i].op());
        for (const DataId d : op.reads) use(d, i, false, false);
        for (const DataId d : op.updates) use(d, i, true, false);
        for (const DataId d : op.writes) use(d, i, false, true);
    }
    const std::size_t n = plan.size();
    for (std::size_t k = 0; k < p.data_count(); ++k) {
        const Data& data = p.data(DataId{k});
        if (!data.offloadable || data.bytes == 0 || p.is_final(DataId{k})) continue;
        if (!p.is_initial(DataId{k})) {
            if (activations) add_activation_gaps(s, k);
            continue;
        }
        if (!between_steps && s.uses[k].steps.empty()) continue;
        WeightUses& u = s.uses[k];
        const auto add = [&](Gap g) {
            u.gaps.push_back(s.gaps.size());
            s.gaps.push_back(std::move(g));
        };
        if (u.steps.empty()) {
            add(Gap{k, true, n, n, {{0, 2 * n}}, false});
            continue;
        }
        if (between_steps) {
            Gap cyclic{k, true, u.steps.back(), u.steps.front(), {}, false};
            if (u.steps.front() > 0) cyclic.ranges.emplace_back(0, 2 * u.steps.front() - 1);
            if (u.steps.back() + 1 < n) cyclic.ranges.emplace_back(2 * u.steps.back() + 3, 2 * n);
            add(std::move(cyclic));
        }
        for (std::size_t j = 0; j + 1 < u.steps.size(); ++j)
            if (u.steps[j + 1] > u.steps[j] + 1)
                add(Gap{k, false, u.steps[j], u.steps[j + 1], {{2 * u.steps[j] + 3, 2 * u.steps[j + 1] - 1}}, false});
    }
    return s;
}

// Bytes a data transfers per iteration with its chosen gaps (and `extra`, when given).
inline Bytes transferred(const Problem& p, const Selection& s, std::size_t data, std::optional<std::size_t> extra) {
    const WeightUses& u = s.uses[data];
    const Bytes size = p.data(DataId{data}).bytes;
    const auto chosen = [&](std::size_t g) { return s.gaps[g].chosen || extra == g; };
    const bool cyclic = !u.gaps.empty() && s.gaps[u.gaps.front()].cyclic && chosen(u.gaps.front());
    Bytes bytes = cyclic ? size : 0;  // the prefetch before the first use
    bool host_current = cyclic;
    for (std::size_t j = 0; j < u.steps.size(); ++j) {
        if (u.updates[j]) host_current = false;
        for (const std::size_t g : u.gaps)
            if (!s.gaps[g].cyclic && s.gaps[g].after_use == u.steps[j] && chosen(g)) {
                bytes += host_current ? size : 2 * size;
                host_current = true;
            }
    }
    if (cyclic && !host_current) bytes += size;  // the offload after the update
    return bytes;
}

inline Bytes coverage(const Selection& s, const Gap& g, Bytes size) {
    Bytes covered = 0;
    for (const auto& [first, last] : g.ranges)
        for (std::size_t i = first; i <= last && i < s.excess.size(); ++i) covered += std::clamp<Bytes>(s.excess[i], 0, size);
    return covered;
}

// The greedy selection; false when some overflow no absence can cover.
inline bool select(const Problem& p, Selection& s, GreedyVariant variant, std::optional<Bytes> host_limit) {
    std::vector<char> on_host(p.data_count(), 0);
    Bytes host = 0;
    const auto overflowing = [&] { return std::any_of(s.excess.begin(), s.excess.end(), [](Bytes e) { return e > 0; }); };
    while (overflowing()) {
        std::optional<std::size_t> best;
        double best_score = 0.0;
        for (std::size_t g = 0; g < s.gaps.size(); ++g) {
            const Gap& gap = s.gaps[g];
            if (gap.chosen) continue;
            const Bytes size = p.data(DataId{gap.data}).bytes;
            const bool used = std::any_of(s.uses[gap.data].gaps.begin(), s.uses[gap.data].gaps.end(),
                                          [&](std::size_t h) { return s.gaps[h].chosen; });
            if (variant == GreedyVariant::once && used) continue;
            if (!on_host[gap.data] && host_limit && host + size > *host_limit) continue;
            const Bytes covered = coverage(s, gap, size);
            if (covered <= 0) continue;
            const Bytes cost = transferred(p, s, gap.data, g) - transferred(p, s, gap.data, std::nullopt);
            const double score = static_cast<double>(covered) / static_cast<double>(std::max<Bytes>(cost, 1));
            if (!best || score > best_score) best = g, best_score = score;
        }
        if (!best) return false;
        Gap& gap = s.gaps[*best];
        gap.chosen = true;
        if (!on_host[gap.data]) host += p.data(DataId{gap.data}).bytes, on_host[gap.data] = 1;
        for (const auto& [first, last] : gap.ranges)
            for (std::size_t i = first; i <= last && i < s.excess.size(); ++i) s.excess[i] -= p.data(DataId{gap.data}).bytes;
    }
    return true;
}

// The transfers of the chosen absences, placed at the given bandwidths (see the header).
class Placement {
public:
    Placement(const Problem& p, const Schedule& plan, Selection& selection, const TransferSettings& transfers)
        : p_(p), plan_(plan), s_(selection), transfers_(transfers), start_(plan.size() + 1, 0.0), slots_(plan.size() + 1) {
        for (std::size_t i = 0; i < plan.size(); ++i)
            start_[i + 1] = start_[i] + (plan[i].is_run() ? p.op(plan[i].op()).time : 0.0);
        for (std::size_t k = 0; k < p.data_count(); ++k) request(k);
    }

    [[nodiscard]] OffloadSchedule build() {
        std::sort(prefetches_.begin(), prefetches_.end(), [](const Prefetch& a, const Prefetch& b) {
            return std::pair(a.need, a.data) < std::pair(b.need, b.data);
        });
        double channel = 0.0;
        for (const Prefetch& r : prefetches_) place(r, channel);
        channel = 0.0;
        for (Free& f : frees_) place(f, channel);
        OffloadSchedule out;
        out.start_on_host = start_on_host_;
        for (std::size_t slot = 0; slot <= plan_.size(); ++slot) {
            for (const auto kind : {TransferStep::Kind::offload, TransferStep::Kind::free, TransferStep::Kind::prefetch})
                for (const TransferStep& step : slots_[slot])
                    if (step.kind() == kind) out.steps.push_back(step);
            if (slot < plan_.size()) out.steps.push_back(TransferStep::from(plan_[slot]));
        }
        for (const DataId d : free_host_at_end_) out.steps.push_back(TransferStep::free_host(d));
        return out;
    }

private:
    struct Prefetch {
        std::size_t data, lowest_slot, need;
    };
    struct Free {
        std::size_t data, lowest_slot, highest_slot;
        std::optional<std::size_t> offload_slot;  // the offload this free waits for
    };

    [[nodiscard]] Bytes size(std::size_t data) const { return p_.data(DataId{data}).bytes; }
    [[nodiscard]] double seconds(std::size_t data, double bandwidth) const {
        return bandwidth > 0 ? static_cast<double>(size(data)) / bandwidth : 0.0;
    }
    [[nodiscard]] bool fits(std::size_t first, std::size_t last, Bytes bytes) const {
        for (std::size_t i = first; i <= last && i < s_.excess.size(); ++i)
            if (s_.excess[i] + bytes > 0) return false;
        return true;
    }
    void occupy(std::size_t first, std::size_t last, Bytes bytes) {
        for (std::size_t i = first; i <= last && i < s_.excess.size(); ++i) s_.excess[i] += bytes;
    }

    // The transfers one data needs for its chosen gaps, walking its uses in order.
    void request(std::size_t k) {
        const WeightUses& u = s_.uses[k];
        const auto chosen = [&](std::size_t g) { return s_.gaps[g].chosen; };
        if (std::none_of(u.gaps.begin(), u.gaps.end(), chosen)) return;
        const std::size_t n = plan_.size();
        const bool cyclic = s_.gaps[u.gaps.front()].cyclic && chosen(u.gaps.front());
        bool host_current = cyclic, offloaded = false;
        std::size_t current_since = 0;  // the slot from which the device copy is current
        if (cyclic) {
            start_on_host_.push_back(DataId{k});
            if (u.steps.empty()) return;
            prefetches_.push_back({k, 0, u.steps.front()});
        }
        const auto leave = [&](std::size_t after_use, std::size_t highest) {
            std::optional<std::size_t> offload;
            if (!host_current) {
                slots_[current_since].push_back(TransferStep::offload(DataId{k}));
                offload = current_since;
                host_current = offloaded = true;
            }
            frees_.push_back({k, after_use + 1, highest, offload});
        };
        for (std::size_t j = 0; j < u.steps.size(); ++j) {
            if (u.updates[j]) host_current = false, current_since = u.steps[j] + 1;
            if (u.writes[j] && !host_current) current_since = u.steps[j] + 1;
            for (const std::size_t g : u.gaps)
                if (!s_.gaps[g].cyclic && chosen(g) && s_.gaps[g].after_use == u.steps[j]) {
                    leave(u.steps[j], s_.gaps[g].next_use);
                    prefetches_.push_back({k, u.steps[j] + 1, s_.gaps[g].next_use});
                }
        }
        if (cyclic) leave(u.steps.back(), n);
        if (!cyclic && offloaded) free_host_at_end_.push_back(DataId{k});
    }

    // Before its need: as late as arrives in time, or as early as memory allows.
    void place(const Prefetch& r, double& channel) {
        const Bytes bytes = size(r.data);
        std::size_t earliest = r.need;
        while (earliest > r.lowest_slot && fits(2 * earliest - 2, 2 * earliest - 1, bytes)) --earliest;
        const double transfer = seconds(r.data, transfers_.bandwidth_to_device);
        std::size_t slot = earliest;
        for (std::size_t q = r.need + 1; q-- > earliest;)
            if (std::max(start_[q], channel) + transfer <= start_[r.need]) {
                slot = q;
                break;
            }
        channel = std::max(start_[slot], channel) + transfer;
        if (slot < r.need) occupy(2 * slot, 2 * r.need - 1, bytes);
        slots_[slot].push_back(TransferStep::prefetch(DataId{r.data}));
        // The gap's free may not come after this slot.
        for (Free& f : frees_)
            if (f.data == r.data && f.lowest_slot <= slot && f.highest_slot >= slot && f.highest_slot == r.need)
                f.highest_slot = slot;
    }

    // After the last use: once its offload is (estimated) done, or as late as memory allows.
    void place(Free& f, double& channel) {
        const Bytes bytes = size(f.data);
        std::optional<double> ready;
        if (f.offload_slot) {
            channel = std::max(start_[*f.offload_slot], channel) + seconds(f.data, transfers_.bandwidth_to_host);
            ready = channel;
        }
        std::size_t latest = f.lowest_slot;
        while (latest < f.highest_slot && fits(2 * latest + 1, 2 * latest + 2, bytes)) ++latest;
        std::size_t slot = latest;
        if (!ready) slot = f.lowest_slot;
        else
            for (std::size_t q = f.lowest_slot; q <= latest; ++q)
                if (start_[q] >= *ready) {
                    slot = q;
                    break;
                }
        occupy(2 * f.lowest_slot + 1, 2 * slot, bytes);
        slots_[slot].push_back(TransferStep::free(DataId{f.data}));
    }

    const Problem& p_;
    const Schedule& plan_;
    Selection& s_;
    TransferSettings transfers_;
    std::vector<double> start_;                     // by slot: when plan step `slot` starts (ops only)
    std::vector<std::vector<TransferStep>> slots_;  // by slot: the transfers and frees before plan step `slot`
    std::vector<Prefetch> prefetches_;
    std::vector<Free> frees_;
    std::vector<DataId> start_on_host_;
    std::vector<DataId> free_host_at_end_;
};

// The plan's frees of data that never move go before the transfers placed in front of them
// (up to the op before): memory only comes back sooner, and no transfer waits for such a
// free. A backward's saved state, freed by the plan right after the backward, is so counted
// gone where autograd has freed it already, and no prefetch's reservation is counted on top.
inline void free_unmoved_data_first(const Problem& problem, OffloadSchedule& schedule) {
    auto& steps = schedule.steps;
    for (std::size_t i = 1; i < steps.size(); ++i) {
        if (steps[i].kind() != TransferStep::Kind::free || problem.data(steps[i].data()).offloadable) continue;
        std::size_t j = i;
        while (j > 0 && !steps[j - 1].is_run() &&
               !(steps[j - 1].kind() == TransferStep::Kind::free && !problem.data(steps[j - 1].data()).offloadable)) {
            std::swap(steps[j - 1], steps[j]);
            --j;
        }
    }
}

}  // namespace detail::greedy

/// Greedy (or Greedy*) weight offloading on `plan`, a valid schedule of `problem` (with its
/// updates, offload/training_state.hpp), so that the device peak fits `budget`. nullopt when
/// some overflow cannot be covered by absent weights (or the host limit forbids it).
[[nodiscard]] inline std::optional<OffloadSchedule> offload_weights(const Problem& problem, const Schedule& plan,
                                                                    Bytes budget, const WeightOffloadOptions& options = {}) {
    const SimulationReport base = remat::simulate(problem, plan);
    if (!base.valid) throw InvalidInput("offload_weights: the plan of '" + problem.name() + "' is invalid: " + base.error);
    const TransferSettings transfers = options.transfers.value_or(problem.transfers());
    detail::greedy::Selection selection = detail::greedy::find_gaps(problem, plan, base, budget, options.activations,
                                                                               options.between_steps);
    if (!detail::greedy::select(problem, selection, options.variant, transfers.host_limit)) return std::nullopt;
    OffloadSchedule schedule = detail::greedy::Placement(problem, plan, selection, transfers).build();
    detail::greedy::free_unmoved_data_first(problem, schedule);
    const OffloadReport report = simulate(problem, schedule, transfers);
    if (!report.valid || report.device_peak > budget)
        throw SolverError("offload_weights: the transfers placed for '" + problem.name() + "' give " +
                          (report.valid ? "a device peak of " + std::to_string(report.device_peak) + " bytes over the budget " +
                                              std::to_string(budget)
                                        : "an invalid schedule: " + report.error) +
                          " (this is a bug in remat; please report it with the problem file)");
    if (transfers.host_limit && report.host_peak > *transfers.host_limit) return std::nullopt;
    return schedule;
}

}  // namespace remat::offload
