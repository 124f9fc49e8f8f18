// remat/offload/checkmate.hpp — rematerialization and weight offloading chosen together by one
// integer program: Checkmate's MILP with offload variables (solvers/checkmate.hpp), and the
// combined planner that starts it from the iteration's plan (offload/combined.hpp).
//
// Checkmate (Jain et al., MLSys 2020) decides which op runs at each (pass, op) point of its
// model. POET (Patil et al., ICML 2022) adds paging variables to it, and Offmate
// (topal-team/rockmate) fractions of each weight on the device or in transfer. This header
// adds, for every offloadable *initial* data w (weights, optimizer state) and every point i
// of the model, in time order:
//   D[w,i]  w has a device copy during point i;       H[w,i]  w has a current host copy;
//   P[w,j]  a prefetch of w is issued before point j;  O[w,j]  an offload of w is;
//   X[w]    w begins and ends the step on the host only (`start_on_host`).
// A prefetch holds device memory from where it is issued. An offload's host copy is current
// λo points later (offload_lag), and the device copy stays until then. Rows: a device copy
// exists only if it did at the point before or is prefetched there; a current host copy only
// if it did or an offload completes, and never after the update of w; every point keeps a
// copy; ops read and update device copies only, and nothing reads w after its update; the
// step ends as it began. Each memory row of Checkmate counts w by Z[w,i] >= D[w,i]
// (formulation.hpp's movable data); the host rows count current copies and offloads in
// flight against the host limit.
//
// Time follows docs/formats.md §11 with upper bounds: I[i] when the steps before point i are
// issued, A[i] when its op starts, the end of each batch of each transfer channel (in order),
// and per data the end of its last prefetch and of its last offload. An op waits for the
// copies it reads, a free for the transfers of the copy it drops, a prefetch for the offload
// that made its host copy; the conditional waits use a big-M, the makespan of the plan the
// search starts from when there is one. Every time of the simulation is at most the model's
// (by induction over the steps), so the simulated makespan, which the plan reports, is never
// above the MILP's objective T. It can be below: the model makes all the prefetches issued
// at one point end together. Activations marked offloadable are kept or recomputed here
// (offload/greedy.hpp offloads them on chains).
//
// The schedule read back: before each point, free_host of host copies no longer needed, the
// offloads, the frees of device copies, the prefetches; then the point's run and Checkmate's
// frees of its activations. Copies made and never used are dropped.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "../milp/backend.hpp"
#include "../milp/model.hpp"
#include "../solvers/checkmate/analysis.hpp"
#include "../solvers/checkmate/formulation.hpp"
#include "../solvers/checkmate/layout.hpp"
#include "../solvers/checkmate/warm_start.hpp"
#include "combined.hpp"
#include "schedule.hpp"
#include "simulate.hpp"

namespace remat::offload {

struct OffloadCheckmateOptions {
    /// Wall-clock limit of the MILP solve.
    double time_limit_seconds = 60.0;
    /// Relative MIP gap at which the search may stop.
    double relative_gap = 1e-6;
    /// Points an offload runs beside before its device copy may be freed (λo, at least 1).
    std::size_t offload_lag = 1;
    /// Passes without exactly-once op before each one (Checkmate's extra_passes).
    std::size_t extra_passes = 0;
    /// Bandwidths and host limit; unset: the problem's.
    std::optional<TransferSettings> transfers;
    /// A model with more binary variables than this is not built (SolverError).
    std::size_t max_binary_variables = 200'000;
    /// Receives the model size and the MILP's outcome; empty means silence.
    ProgressCallback progress;
};

/// What the MILP gave: a plan when it found one, with the model's own figures.
struct OffloadMilpResult {
    std::optional<OffloadPlan> plan;
    milp::Status status = milp::Status::time_limit_no_solution;
    /// The model's makespan for the plan (an upper bound of the simulated one), and the best
    /// bound the search proved on the model's optimum.
    double model_makespan = std::numeric_limits<double>::infinity();
    double model_bound = -std::numeric_limits<double>::infinity();
    double seconds = 0.0;
    std::size_t binaries = 0;
    std::size_t rows = 0;
    /// Whether the search started from the given plan.
    bool started = false;
};

namespace detail::offload_milp {

using remat::detail::checkmate::Analysis;
using remat::detail::checkmate::Formulation;
using remat::detail::checkmate::none;

OffloadSchedule without_unused_copies(const Problem& problem, OffloadSchedule schedule);

// The offload variables and rows added to one Checkmate formulation.
class Model {
public:
    // `horizon`: an upper bound of the makespan of the plans worth finding (a known plan's), or
    // nullopt for one that holds every plan; it is the big-M of the conditional time rows.
    Model(const Problem& full, Formulation& f, std::vector<DataId> movable, const TransferSettings& transfers,
          std::size_t offload_lag, Bytes budget, std::optional<double> horizon)
        : lower_bound_(makespan_lower_bound(full, budget, transfers)),
          pr_(full),
          f_(f),
          m_(f.model()),
          movable_(std::move(movable)),
          transfers_(transfers),
          offload_lag_(offload_lag),
          N_(f.points().size()) {
        add_variables();
        add_copy_rows();
        add_use_rows();
        add_memory_rows(budget);
        add_time_rows(horizon);
    }

    [[nodiscard]] std::size_t binaries() const noexcept { return m_.integer_count(); }

    // The schedule of a solution.
    [[nodiscard]] OffloadSchedule schedule(const std::vector<double>& x) const;

    // A solution that holds a known plan (a warm start), or nullopt when the model cannot:
    // its runs do not fit the passes, or an offload's lag does not fit between its runs.
    [[nodiscard]] std::optional<std::vector<double>> assignment(const OffloadSchedule& plan) const;

    // The model's makespan of a solution.
    [[nodiscard]] double makespan(const std::vector<double>& x) const { return x[T_.index]; }

private:
    struct Event {
        std::size_t at;
        TransferStep::Kind kind;
    };
    [[nodiscard]] std::optional<std::vector<std::vector<Event>>> transfer_events(
        const OffloadSchedule& plan, const std::vector<std::size_t>& run_point) const;
    void set_copies(std::vector<double>& x, const OffloadSchedule& plan, const std::vector<std::vector<Event>>& events) const;
    void set_times(std::vector<double>& x) const;

    [[nodiscard]] static bool on(const std::vector<double>& x, milp::Var v) { return x[v.index] > 0.5; }
    // Prefetches are issued before points 0 .. N-1; offloads before points 0 .. N-λo.
    [[nodiscard]] bool can_prefetch(std::size_t j) const noexcept { return j < N_; }
    [[nodiscard]] bool can_offload(std::size_t j) const noexcept { return j + offload_lag_ <= N_; }
    [[nodiscard]] bool timed_prefetches() const noexcept { return transfers_.bandwidth_to_device > 0 && !movable_.empty(); }
    [[nodiscard]] bool timed_offloads() const noexcept { return transfers_.bandwidth_to_host > 0 && !movable_.empty(); }
    // The offloads of movable k in flight during point i (issued at i-λo+1 .. i).
    [[nodiscard]] std::vector<milp::Term> offloading(std::size_t k, std::size_t i, double coef) const {
        std::vector<milp::Term> out;
        for (std::size_t j = i + 1 > offload_lag_ ? i + 1 - offload_lag_ : 0; j <= i && can_offload(j); ++j)
            out.push_back({O_[k][j], coef});
        return out;
    }
    // The run variable of the update of movable k at point i, if that point runs it.
    [[nodiscard]] std::optional<milp::Var> update_at(std::size_t k, std::size_t i) const {
        const auto u = pr_.updater(movable_[k]);
        if (!u || op_at(i) != u->index) return std::nullopt;
        return f_.run_var(i);
    }
    [[nodiscard]] std::size_t op_at(std::size_t i) const { return f_.analysis_op(f_.points()[i].second); }
    // Whether an offload of movable k issued before an earlier point is still in flight at i.
    [[nodiscard]] bool offload_in_flight(const std::vector<double>& x, std::size_t k, std::size_t i) const {
        for (std::size_t j = i + 1 > offload_lag_ ? i + 1 - offload_lag_ : 0; j < i && can_offload(j); ++j)
            if (on(x, O_[k][j])) return true;
        return false;
    }
    [[nodiscard]] double seconds(std::size_t k, double bandwidth) const {
        return static_cast<double>(pr_.data(movable_[k]).bytes) / bandwidth;
    }

    void add_variables() {
        const std::size_t K = movable_.size();
        D_.resize(K);
        H_.resize(K);
        P_.resize(K);
        O_.resize(K);
        for (std::size_t k = 0; k < K; ++k) {
            const std::string& name = pr_.data(movable_[k]).name;
            X_.push_back(m_.add_binary(0.0, "X_" + name));
            for (std::size_t i = 0; i <= N_; ++i) {
                D_[k].push_back(m_.add_binary(0.0, "D_" + name + "_" + std::to_string(i)));
                H_[k].push_back(m_.add_binary(0.0, "H_" + name + "_" + std::to_string(i)));
            }
            for (std::size_t j = 0; can_prefetch(j); ++j) P_[k].push_back(m_.add_binary(0.0, "P_" + name + "_" + std::to_string(j)));
            for (std::size_t j = 0; can_offload(j); ++j) O_[k].push_back(m_.add_binary(0.0, "O_" + name + "_" + std::to_string(j)));
        }
    }

    // Where copies come from, that one always exists, and how the step ends.
    void add_copy_rows() {
        using milp::Sense;
        for (std::size_t k = 0; k < movable_.size(); ++k) {
            const auto& D = D_[k];
            const auto& H = H_[k];
            for (std::size_t i = 0; i <= N_; ++i) {
                // D[i] <= D[i-1] + P[i] (D[-1] = 1 - X); H[i] <= H[i-1] + O[i-λo] (H[-1] = X).
                std::vector<milp::Term> d{{D[i], 1.0}}, h{{H[i], 1.0}};
                double d_rhs = 0.0;
                if (i > 0) {
                    d.push_back({D[i - 1], -1.0});
                    h.push_back({H[i - 1], -1.0});
                } else {
                    d.push_back({X_[k], 1.0});
                    d_rhs = 1.0;
                    h.push_back({X_[k], -1.0});
                }
                if (can_prefetch(i)) {
                    d.push_back({P_[k][i], -1.0});
                    m_.add_row({{D[i], 1.0}, {P_[k][i], -1.0}}, Sense::greater_equal, 0.0, "prefetched");
                }
                if (i >= offload_lag_ && can_offload(i - offload_lag_)) h.push_back({O_[k][i - offload_lag_], -1.0});
                m_.add_row(std::move(d), Sense::less_equal, d_rhs, "device_copy");
                m_.add_row(std::move(h), Sense::less_equal, 0.0, "host_copy");
                if (i > 0)
                    if (const auto r = update_at(k, i - 1)) m_.add_row({{H[i], 1.0}, {*r, 1.0}}, Sense::less_equal, 1.0, "stale");
                m_.add_row({{D[i], 1.0}, {H[i], 1.0}}, Sense::greater_equal, 1.0, "one_copy");
                if (i < N_) add_transfer_rows(k, i);
            }
            // The step ends as it began: on the host only, or on the device only.
            m_.add_row({{D[N_], 1.0}, {X_[k], 1.0}}, Sense::equal, 1.0, "device_end");
            m_.add_row({{H[N_], 1.0}, {X_[k], -1.0}}, Sense::equal, 0.0, "host_end");
        }
    }

    // What a transfer of movable k issued before point i needs: a prefetch, no device copy
    // before it and a current host copy; an offload, a device copy that stays while it runs
    // and no current host copy (nor another in flight); an update, no offload in flight.
    void add_transfer_rows(std::size_t k, std::size_t i) {
        using milp::Sense;
        const auto& D = D_[k];
        const auto& H = H_[k];
        m_.add_row({{P_[k][i], 1.0}, {H[i], -1.0}}, Sense::less_equal, 0.0, "prefetch_source");
        if (i > 0) m_.add_row({{P_[k][i], 1.0}, {D[i - 1], 1.0}}, Sense::less_equal, 1.0, "prefetch_absent");
        else m_.add_row({{P_[k][i], 1.0}, {X_[k], -1.0}}, Sense::less_equal, 0.0, "prefetch_absent");
        std::vector<milp::Term> pending = offloading(k, i, 1.0);
        pending.push_back({H[i], 1.0});
        m_.add_row(std::move(pending), Sense::less_equal, 1.0, "offload_stale");
        if (can_offload(i))
            for (std::size_t u = i; u < i + offload_lag_; ++u)
                m_.add_row({{O_[k][i], 1.0}, {D[u], -1.0}}, Sense::less_equal, 0.0, "offload_source");
        if (const auto r = update_at(k, i))
            for (const milp::Term& t : offloading(k, i, 1.0)) m_.add_row({t, {*r, 1.0}}, Sense::less_equal, 1.0, "update_after_offload");
    }

    // Ops read and update device copies only, and nothing reads a data after its update.
    void add_use_rows() {
        using milp::Sense;
        index_.assign(pr_.data_count(), none);
        for (std::size_t k = 0; k < movable_.size(); ++k) index_[movable_[k].index] = k;
        std::vector<std::vector<milp::Term>> updated_before(movable_.size());
        for (std::size_t i = 0; i < N_; ++i) {
            const Op& op = pr_.op(OpId{op_at(i)});
            const milp::Var R = f_.run_var(i);
            const auto use = [&](DataId d, bool updates) {
                const std::size_t k = index_[d.index];
                if (k == none) return;
                m_.add_row({{R, 1.0}, {D_[k][i], -1.0}}, Sense::less_equal, 0.0, "use_on_device");
                if (updates || updated_before[k].empty()) return;
                std::vector<milp::Term> row = updated_before[k];
                row.push_back({R, 1.0});
                m_.add_row(std::move(row), Sense::less_equal, 1.0, "read_before_update");
            };
            for (const DataId d : op.reads) use(d, false);
            for (const DataId d : op.updates) use(d, true);
            for (const DataId d : op.updates)
                if (index_[d.index] != none) updated_before[index_[d.index]].push_back({R, 1.0});
        }
    }

    // Device: Z >= D, and the start fits; host: current copies and offloads in flight within
    // the limit.
    void add_memory_rows(Bytes budget) {
        using milp::Sense;
        const double unit = static_cast<double>(f_.analysis().scale);
        std::vector<milp::Term> start;
        double fixed = static_cast<double>(f_.fixed_initial_bytes()) / unit;
        for (std::size_t k = 0; k < movable_.size(); ++k) {
            const double b = static_cast<double>(pr_.data(movable_[k]).bytes) / unit;
            start.push_back({X_[k], -b});
            fixed += b;
            for (std::size_t i = 0; i < N_; ++i)
                m_.add_row({{f_.held_var(k, i), 1.0}, {D_[k][i], -1.0}}, Sense::greater_equal, 0.0, "held");
        }
        m_.add_row(std::move(start), Sense::less_equal, std::floor(static_cast<double>(budget) / unit) - fixed, "device_start");
        if (!transfers_.host_limit) return;
        for (std::size_t i = 0; i <= N_; ++i) {
            std::vector<milp::Term> row;
            for (std::size_t k = 0; k < movable_.size(); ++k) {
                const double b = static_cast<double>(pr_.data(movable_[k]).bytes) / unit;
                row.push_back({H_[k][i], b});
                if (i < N_)
                    for (const milp::Term& t : offloading(k, i, b)) row.push_back(t);
            }
            m_.add_row(std::move(row), Sense::less_equal, std::floor(static_cast<double>(*transfers_.host_limit) / unit),
                       "host");
        }
    }

    // Times, each an upper bound of the simulation's (docs/formats.md §11):
    //   I[i]       the steps before point i are issued (after the frees, which wait for the
    //              transfers of the copies they drop);
    //   A[i]       its op starts (after the copies it reads or updates are complete, and the
    //              offloads of what it updates have ended);
    //   q[j], o[j] the prefetches, the offloads issued before point j have ended (each
    //              channel runs in order);
    //   rdy[k,i]   the last prefetch of movable k issued by point i has ended;
    //   off[k,i]   the last offload of movable k issued by point i has ended;
    //   T          everything has ended: the objective (Checkmate's objective on R is dropped).
    // The rows conditional on a binary use the big-M `horizon`.
    void add_time_rows(std::optional<double> horizon) {
        using milp::Sense;
        const double M = horizon.value_or(crude_horizon());
        for (std::size_t i = 0; i < N_; ++i) m_.set_objective(f_.run_var(i), 0.0);
        const auto var = [&](const std::string& name, double objective = 0.0) {
            return m_.add_continuous(0.0, milp::infinity, objective, name);
        };
        for (std::size_t i = 0; i <= N_; ++i) I_.push_back(var("I_" + std::to_string(i)));
        for (std::size_t i = 0; i < N_; ++i) A_.push_back(var("A_" + std::to_string(i)));
        T_ = var("T", 1.0);
        const std::size_t K = movable_.size();
        if (timed_prefetches()) {
            rdy_.resize(K);
            for (std::size_t j = 0; can_prefetch(j); ++j) {
                prefetch_end_.push_back(var("q_" + std::to_string(j)));
                for (std::size_t k = 0; k < K; ++k) rdy_[k].push_back(var("rdy_" + pr_.data(movable_[k]).name + "_" + std::to_string(j)));
            }
        }
        if (timed_offloads()) {
            off_.resize(K);
            for (std::size_t j = 0; can_offload(j); ++j) {
                offload_end_.push_back(var("o_" + std::to_string(j)));
                for (std::size_t k = 0; k < K; ++k) off_[k].push_back(var("off_" + pr_.data(movable_[k]).name + "_" + std::to_string(j)));
            }
        }
        m_.add_row({{T_, 1.0}, {I_[N_], -1.0}}, Sense::greater_equal, 0.0, "makespan");
        for (const std::vector<milp::Var>* ends : {&prefetch_end_, &offload_end_})
            if (!ends->empty()) m_.add_row({{T_, 1.0}, {ends->back(), -1.0}}, Sense::greater_equal, 0.0, "makespan");
        if (horizon) m_.add_row({{T_, 1.0}}, Sense::less_equal, M, "horizon");
        m_.add_row({{T_, 1.0}}, Sense::greater_equal, lower_bound_, "proven_lower_bound");
        for (std::size_t i = 0; i < N_; ++i) {
            const double time = pr_.op(OpId{op_at(i)}).time;
            const milp::Var R = f_.run_var(i);
            m_.add_row({{A_[i], 1.0}, {I_[i], -1.0}}, Sense::greater_equal, 0.0, "issued_first");
            // Implied by the next row for integral R, but without M: it keeps the relaxation's
            // bound at least the compute time.
            m_.add_row({{I_[i + 1], 1.0}, {I_[i], -1.0}, {R, -time}}, Sense::greater_equal, 0.0, "in_order");
            m_.add_row({{I_[i + 1], 1.0}, {A_[i], -1.0}, {R, -(time + M)}}, Sense::greater_equal, -M, "compute");
        }
        add_channel(prefetch_end_, P_, rdy_, transfers_.bandwidth_to_device, off_, M, "prefetch");
        add_channel(offload_end_, O_, off_, transfers_.bandwidth_to_host, rdy_, M, "offload");
        add_waits(M);
    }

    [[nodiscard]] double crude_horizon() const {
        double total = 0.0;
        for (std::size_t i = 0; i < N_; ++i) total += pr_.op(OpId{op_at(i)}).time;
        for (std::size_t k = 0; k < movable_.size(); ++k) {
            if (timed_prefetches()) total += static_cast<double>(N_) * seconds(k, transfers_.bandwidth_to_device);
            if (timed_offloads()) total += static_cast<double>(N_) * seconds(k, transfers_.bandwidth_to_host);
        }
        return total + 1.0;
    }

    // One channel: end[j] >= max(end[j-1], I[j], what each transfer waits for) + the seconds
    // of the transfers issued at j; last[k][j] follows the end of the last transfer of k. A
    // transfer waits for the other direction's last transfer of its data (a prefetch for the
    // offload that made its host copy, an offload for the prefetch that made its device copy).
    void add_channel(const std::vector<milp::Var>& ends, const std::vector<std::vector<milp::Var>>& issued,
                     const std::vector<std::vector<milp::Var>>& last, double bandwidth,
                     const std::vector<std::vector<milp::Var>>& other_last, double M, const std::string& name) {
        using milp::Sense;
        for (std::size_t j = 0; j < ends.size(); ++j) {
            std::vector<milp::Term> work{{ends[j], 1.0}};
            for (std::size_t k = 0; k < movable_.size(); ++k) work.push_back({issued[k][j], -seconds(k, bandwidth)});
            const auto after = [&](std::vector<milp::Term> extra, double rhs, const std::string& why) {
                std::vector<milp::Term> row = work;
                row.insert(row.end(), extra.begin(), extra.end());
                m_.add_row(std::move(row), Sense::greater_equal, rhs, name + why);
            };
            after({{I_[j], -1.0}}, 0.0, "_issued");
            if (j > 0) after({{ends[j - 1], -1.0}}, 0.0, "_in_order");
            for (std::size_t k = 0; k < movable_.size(); ++k) {
                if (!other_last.empty() && !other_last[k].empty())
                    after({{other_last[k][std::min(j, other_last[k].size() - 1)], -1.0}, {issued[k][j], -M}}, -M,
                          "_after_other_direction");
                if (j > 0) m_.add_row({{last[k][j], 1.0}, {last[k][j - 1], -1.0}}, Sense::greater_equal, 0.0, name + "_kept");
                m_.add_row({{last[k][j], 1.0}, {ends[j], -1.0}, {issued[k][j], -M}}, Sense::greater_equal, -M, name + "_last");
            }
        }
    }

    // What waits for transfers: an op for the prefetches of what it reads or updates and the
    // offloads of what it updates; a free of a device copy (D[i-1] - D[i] = 1) for both
    // transfers of it; the offload channel, for the prefetch of a host copy it drops
    // (H[i-1] - H[i] = 1).
    void add_waits(double M) {
        using milp::Sense;
        const auto latest = [](const std::vector<milp::Var>& vars, std::size_t i) -> std::optional<milp::Var> {
            if (vars.empty()) return std::nullopt;
            return vars[std::min(i, vars.size() - 1)];
        };
        for (std::size_t i = 0; i < N_; ++i) {
            const Op& op = pr_.op(OpId{op_at(i)});
            const auto wait = [&](DataId d, bool updates) {
                const std::size_t k = index_[d.index];
                if (k == none) return;
                if (!rdy_.empty()) m_.add_row({{A_[i], 1.0}, {rdy_[k][i], -1.0}}, Sense::greater_equal, 0.0, "waits_for_copy");
                if (updates && !off_.empty())
                    if (const auto v = latest(off_[k], i)) m_.add_row({{A_[i], 1.0}, {*v, -1.0}}, Sense::greater_equal, 0.0, "waits_for_offload");
            };
            for (const DataId d : op.reads) wait(d, false);
            for (const DataId d : op.updates) wait(d, true);
        }
        for (std::size_t k = 0; k < movable_.size(); ++k)
            for (std::size_t i = 1; i <= N_; ++i) {
                const std::vector<milp::Term> dropped{{D_[k][i - 1], -M}, {D_[k][i], M}};
                for (const std::vector<std::vector<milp::Var>>* last : {&rdy_, &off_})
                    if (!last->empty())
                        if (const auto v = latest((*last)[k], i - 1)) {
                            std::vector<milp::Term> row{{I_[i], 1.0}, {*v, -1.0}};
                            row.insert(row.end(), dropped.begin(), dropped.end());
                            m_.add_row(std::move(row), Sense::greater_equal, -M, "free_waits");
                        }
                if (!rdy_.empty() && i < offload_end_.size()) {
                    std::vector<milp::Term> row{{offload_end_[i], 1.0}, {rdy_[k][i - 1], -1.0}, {H_[k][i - 1], -M}, {H_[k][i], M}};
                    for (std::size_t k2 = 0; k2 < movable_.size(); ++k2)  // then the offloads issued there
                        row.push_back({O_[k2][i], -seconds(k2, transfers_.bandwidth_to_host)});
                    m_.add_row(std::move(row), Sense::greater_equal, -M, "host_free_waits");
                }
            }
    }

    double lower_bound_;  // offload/combined.hpp's, proven for every plan
    const Problem& pr_;
    Formulation& f_;
    milp::Model& m_;
    std::vector<DataId> movable_;
    TransferSettings transfers_;
    std::size_t offload_lag_;
    std::size_t N_;
    std::vector<std::size_t> index_;  // data → movable index, or none
    std::vector<milp::Var> X_;
    std::vector<std::vector<milp::Var>> D_, H_, P_, O_, rdy_, off_;
    std::vector<milp::Var> I_, A_, prefetch_end_, offload_end_;
    milp::Var T_{};
};

inline OffloadSchedule Model::schedule(const std::vector<double>& x) const {
    // Checkmate's run/free schedule, cut after each run: the frees that follow belong to it.
    const auto runs = f_.runs(x);
    const Schedule plain = f_.schedule(runs);
    std::vector<std::vector<Step>> after_run(N_);
    std::size_t r = 0;
    for (const Step& s : plain) {
        if (s.is_run()) ++r;
        after_run[f_.point_of(runs[r - 1].first, runs[r - 1].second)].push_back(s);
    }
    OffloadSchedule out;
    const std::size_t K = movable_.size();
    std::vector<char> device(K), host(K);
    for (std::size_t k = 0; k < K; ++k) {
        const bool starts_on_host = on(x, X_[k]);
        if (starts_on_host) out.start_on_host.push_back(movable_[k]);
        device[k] = !starts_on_host;
        host[k] = starts_on_host;
    }
    const auto boundary = [&](std::size_t i) {
        for (std::size_t k = 0; k < K; ++k)  // host copies neither current nor being written
            if (host[k] && !on(x, H_[k][i]) && !offload_in_flight(x, k, i)) {
                out.steps.push_back(TransferStep::free_host(movable_[k]));
                host[k] = 0;
            }
        for (std::size_t k = 0; k < K; ++k)
            if (can_offload(i) && on(x, O_[k][i])) {
                out.steps.push_back(TransferStep::offload(movable_[k]));
                host[k] = 1;
            }
        for (std::size_t k = 0; k < K; ++k)
            if (device[k] && !on(x, D_[k][i])) {
                out.steps.push_back(TransferStep::free(movable_[k]));
                device[k] = 0;
            }
        for (std::size_t k = 0; k < K; ++k)
            if (can_prefetch(i) && on(x, P_[k][i])) {
                out.steps.push_back(TransferStep::prefetch(movable_[k]));
                device[k] = 1;
            }
    };
    for (std::size_t i = 0; i < N_; ++i) {
        boundary(i);
        for (const Step& s : after_run[i]) out.steps.push_back(TransferStep::from(s));
    }
    boundary(N_);
    return without_unused_copies(pr_, std::move(out));
}

// Drops the copies a schedule makes and never uses (the model lets them cost no time): an
// offload whose host copy is dropped before any free or prefetch of its data, and a prefetch
// whose device copy is freed before any op reads or updates it. Neither can raise a peak or
// delay a step.
inline OffloadSchedule without_unused_copies(const Problem& problem, OffloadSchedule schedule) {
    using Kind = TransferStep::Kind;
    auto& steps = schedule.steps;
    std::vector<char> drop(steps.size(), 0);
    std::vector<std::size_t> offload_at(problem.data_count(), none), prefetch_at(problem.data_count(), none);
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const TransferStep& step = steps[i];
        if (step.is_run()) {
            const Op& op = problem.op(step.op());
            for (const std::vector<DataId>* list : {&op.reads, &op.updates})
                for (const DataId d : *list) prefetch_at[d.index] = none;
            continue;
        }
        const std::size_t d = step.data().index;
        switch (step.kind()) {
            case Kind::offload: offload_at[d] = i; break;
            case Kind::prefetch:
                offload_at[d] = none;
                prefetch_at[d] = i;
                break;
            case Kind::free_host:
                if (offload_at[d] != none) drop[offload_at[d]] = drop[i] = 1;
                offload_at[d] = none;
                break;
            case Kind::free:
                offload_at[d] = none;
                if (prefetch_at[d] != none) drop[prefetch_at[d]] = drop[i] = 1;
                prefetch_at[d] = none;
                break;
            case Kind::run: break;
        }
    }
    std::vector<TransferStep> kept;
    for (std::size_t i = 0; i < steps.size(); ++i)
        if (!drop[i]) kept.push_back(steps[i]);
    steps = std::move(kept);
    return schedule;
}

inline std::optional<std::vector<double>> Model::assignment(const OffloadSchedule& plan) const {
    // The runs, placed in the passes; Checkmate's own variables from them.
    Schedule runs_only;
    for (const TransferStep& step : plan.steps)
        if (step.is_run()) runs_only.push_back(Step::run(step.op()));
    const auto runs = remat::detail::checkmate::place_runs(f_.analysis(), pr_, f_.layout(), runs_only);
    if (!runs) return std::nullopt;
    auto x = f_.assignment(*runs);
    if (!x) return std::nullopt;
    std::vector<std::size_t> run_point;
    for (const auto& [t, p] : *runs) run_point.push_back(f_.point_of(t, p));
    const auto events = transfer_events(plan, run_point);
    if (!events) return std::nullopt;
    set_copies(*x, plan, *events);
    set_times(*x);
    if (!m_.is_feasible(*x)) return std::nullopt;
    return x;
}

// Each transfer and free of a movable data goes before the point of the next run (the end
// after the last), except an offload, which goes right after the previous run's point; the
// device copy it frees stays λo points at least. Per movable data, by point, in the order
// schedule() issues them.
inline std::optional<std::vector<std::vector<Model::Event>>> Model::transfer_events(
    const OffloadSchedule& plan, const std::vector<std::size_t>& run_point) const {
    std::vector<std::vector<Event>> events(movable_.size());
    std::vector<std::size_t> offloaded_at(movable_.size(), none);
    std::size_t r = 0;
    for (const TransferStep& step : plan.steps) {
        if (step.is_run()) {
            ++r;
            continue;
        }
        const std::size_t k = index_[step.data().index];
        if (k == none) continue;
        std::size_t at = r < run_point.size() ? run_point[r] : N_;
        if (step.kind() == TransferStep::Kind::offload) {
            at = r > 0 ? run_point[r - 1] + 1 : 0;
            if (!can_offload(at)) return std::nullopt;
            offloaded_at[k] = at;
        } else if (step.kind() == TransferStep::Kind::free && offloaded_at[k] != none) {
            at = std::max(at, offloaded_at[k] + offload_lag_);
        } else if (step.kind() == TransferStep::Kind::prefetch && !can_prefetch(at)) {
            return std::nullopt;
        }
        if (at > N_) return std::nullopt;
        events[k].push_back({at, step.kind()});
    }
    const auto rank = [](TransferStep::Kind kind) {
        switch (kind) {
            case TransferStep::Kind::free_host: return 0;
            case TransferStep::Kind::offload: return 1;
            case TransferStep::Kind::free: return 2;
            default: return 3;
        }
    };
    for (auto& list : events)
        std::stable_sort(list.begin(), list.end(), [&](const Event& a, const Event& b) {
            return a.at != b.at ? a.at < b.at : rank(a.kind) < rank(b.kind);
        });
    return events;
}

// X, D, H, P, O and Z of the copies, point by point.
inline void Model::set_copies(std::vector<double>& x, const OffloadSchedule& plan,
                              const std::vector<std::vector<Event>>& events) const {
    std::vector<char> starts_on_host(movable_.size(), 0);
    for (const DataId d : plan.start_on_host)
        if (index_[d.index] != none) starts_on_host[index_[d.index]] = 1;
    for (std::size_t k = 0; k < movable_.size(); ++k) {
        x[X_[k].index] = starts_on_host[k];
        bool device = !starts_on_host[k], host = starts_on_host[k];
        std::size_t current_from = starts_on_host[k] ? 0 : none, e = 0;
        for (std::size_t i = 0; i <= N_; ++i) {
            if (i > 0 && update_at(k, i - 1) && on(x, f_.run_var(i - 1))) current_from = none;  // now stale
            for (; e < events[k].size() && events[k][e].at == i; ++e) {
                switch (events[k][e].kind) {
                    case TransferStep::Kind::free_host: host = false, current_from = none; break;
                    case TransferStep::Kind::offload:
                        x[O_[k][i].index] = 1;
                        host = true, current_from = i + offload_lag_;
                        break;
                    case TransferStep::Kind::free: device = false; break;
                    case TransferStep::Kind::prefetch:
                        x[P_[k][i].index] = 1;
                        device = true;
                        break;
                    case TransferStep::Kind::run: break;
                }
            }
            x[D_[k][i].index] = device;
            x[H_[k][i].index] = host && current_from != none && current_from <= i;
            if (i < N_) x[f_.held_var(k, i).index] = device;
        }
    }
}

// The times, forward, each the least its rows allow.
inline void Model::set_times(std::vector<double>& x) const {
    const std::size_t K = movable_.size();
    const auto at = [&](milp::Var v) -> double& { return x[v.index]; };
    const auto work = [&](const std::vector<std::vector<milp::Var>>& issued, std::size_t j, double bandwidth) {
        double total = 0.0;
        for (std::size_t k = 0; k < K; ++k)
            if (on(x, issued[k][j])) total += seconds(k, bandwidth);
        return total;
    };
    std::vector<double> ready(K, 0.0), offloaded(K, 0.0);  // as rdy and off, so far
    for (std::size_t i = 0; i <= N_; ++i) {
        double issue = i > 0 ? at(I_[i]) : 0.0;
        for (std::size_t k = 0; k < K && i > 0; ++k)  // frees wait for the transfers of what they drop
            if (on(x, D_[k][i - 1]) && !on(x, D_[k][i])) issue = std::max({issue, ready[k], offloaded[k]});
        at(I_[i]) = issue;
        const std::vector<double> ready_before = ready;
        if (i < prefetch_end_.size()) {
            double begin = std::max(issue, i > 0 ? at(prefetch_end_[i - 1]) : 0.0);
            for (std::size_t k = 0; k < K; ++k)
                if (on(x, P_[k][i])) begin = std::max(begin, offloaded[k]);
            const double end = begin + work(P_, i, transfers_.bandwidth_to_device);
            at(prefetch_end_[i]) = end;
            for (std::size_t k = 0; k < K; ++k) {
                if (on(x, P_[k][i])) ready[k] = end;
                at(rdy_[k][i]) = ready[k];
            }
        }
        if (i < offload_end_.size()) {
            double begin = std::max(issue, i > 0 ? at(offload_end_[i - 1]) : 0.0);
            for (std::size_t k = 0; k < K; ++k) {
                if (on(x, O_[k][i])) begin = std::max(begin, ready[k]);
                if (i > 0 && on(x, H_[k][i - 1]) && !on(x, H_[k][i])) begin = std::max(begin, ready_before[k]);
            }
            const double end = begin + work(O_, i, transfers_.bandwidth_to_host);
            at(offload_end_[i]) = end;
            for (std::size_t k = 0; k < K; ++k) {
                if (on(x, O_[k][i])) offloaded[k] = end;
                at(off_[k][i]) = offloaded[k];
            }
        }
        if (i == N_) break;
        double start = issue;
        const Op& op = pr_.op(OpId{op_at(i)});
        for (const DataId d : op.reads)
            if (const std::size_t k = index_[d.index]; k != none) start = std::max(start, ready[k]);
        for (const DataId d : op.updates)
            if (const std::size_t k = index_[d.index]; k != none) start = std::max({start, ready[k], offloaded[k]});
        at(A_[i]) = start;
        at(I_[i + 1]) = on(x, f_.run_var(i)) ? start + op.time : issue;
    }
    double makespan = at(I_[N_]);
    for (const std::vector<milp::Var>* ends : {&prefetch_end_, &offload_end_})
        if (!ends->empty()) makespan = std::max(makespan, at(ends->back()));
    at(T_) = std::max(makespan, lower_bound_);
}

}  // namespace detail::offload_milp

/// Checkmate's MILP with offload variables, over a MILP backend (milp::Cbc, milp::LpSolve).
template <milp::MilpBackend Backend>
class OffloadCheckmate {
public:
    explicit OffloadCheckmate(OffloadCheckmateOptions options = {}, Backend backend = {})
        : options_(std::move(options)), backend_(std::move(backend)) {
        if (!(options_.time_limit_seconds > 0))
            throw InvalidInput("offload checkmate: the time limit must be positive (infinity for none)");
        if (options_.offload_lag == 0)
            throw InvalidInput("offload checkmate: offload_lag must be at least 1 (a device copy is freed after its offload)");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "checkmate+offload"; }
    [[nodiscard]] const OffloadCheckmateOptions& options() const noexcept { return options_; }
    /// A copy whose time limit is at most `seconds` (models TimeBoundedSolver's rule).
    [[nodiscard]] OffloadCheckmate with_time_limit_at_most(double seconds) const {
        OffloadCheckmateOptions o = options_;
        o.time_limit_seconds = tightened_time_limit(o.time_limit_seconds, seconds);
        return OffloadCheckmate(std::move(o), backend_);
    }

    /// The fastest plan of the model within a total device `budget`: OffloadMilpResult::plan is
    /// empty when the model has none (its status says whether that is proven for the model,
    /// which fixes the passes and λo, or the time limit ran out).
    /// `start`: a known plan (the iteration's) to start the search from, where the model
    /// can hold it (OffloadMilpResult::started says whether it could).
    [[nodiscard]] OffloadMilpResult solve(const Problem& full, Bytes budget,
                                          const std::optional<OffloadSchedule>& start = std::nullopt) const {
        const auto began = std::chrono::steady_clock::now();
        const TransferSettings transfers = options_.transfers.value_or(full.transfers());
        const remat::detail::checkmate::Analysis a = remat::detail::checkmate::analyse(full);
        const std::vector<DataId> movable = movable_data(full);
        OffloadMilpResult result;
        // The start's makespan in the model bounds every plan worth finding (the big-M of the
        // time rows); the model is built again with it.
        std::optional<std::vector<double>> start_values;
        std::optional<double> horizon;
        // Building stops at the time limit (TooLarge): then no plan, with the time limit's status.
        const auto out_of_time = [&](const TooLarge& e) -> OffloadMilpResult& {
            say(e.what());
            result.status = milp::Status::time_limit_no_solution;
            result.seconds = seconds_since(began);
            return result;
        };
        if (start) {
            try {
                const Built first = build(full, a, movable, transfers, budget, std::nullopt, began);
                if (first.formulation->infeasible()) return infeasible(result, first);
                if (auto x = first.model->assignment(*start)) horizon = first.model->makespan(*x) * (1 + 1e-9) + 1e-12;
            } catch (const TooLarge& e) {
                return out_of_time(e);
            }
        }
        std::optional<Built> made;
        try {
            made.emplace(build(full, a, movable, transfers, budget, horizon, began));
        } catch (const TooLarge& e) {
            return out_of_time(e);
        }
        Built& built = *made;
        if (built.formulation->infeasible()) return infeasible(result, built);
        milp::Model& m = built.formulation->model();
        result.binaries = built.model->binaries();
        result.rows = m.row_count();
        say("checkmate+offload: ", built.formulation->points().size(), " points, ", movable.size(), " movable data, ",
            result.binaries, " binaries, ", result.rows, " rows, offload lag ", options_.offload_lag, ", backend ",
            backend_.name());
        if (horizon) {
            if (auto x = built.model->assignment(*start)) {
                m.set_start(std::move(*x));
                result.started = true;
            }
        }
        if (start) say("checkmate+offload: ", result.started ? "starts from" : "cannot hold", " the given plan");
        m.set_relative_gap(options_.relative_gap);
        m.set_time_limit(std::max(0.01, options_.time_limit_seconds - seconds_since(began)));
        const milp::Result r = backend_.solve(m);
        result.status = r.status;
        result.model_bound = r.best_bound;
        say("checkmate+offload: ", milp::to_string(r.status), " in ", r.seconds, " s, model makespan ", r.objective,
            ", bound ", r.best_bound);
        if (r.has_solution()) {
            result.model_makespan = r.objective;
            OffloadSchedule schedule = built.model->schedule(r.values);
            OffloadReport report = simulate(full, schedule, transfers);
            if (!report.fits(budget, transfers.host_limit))
                throw SolverError("checkmate+offload: the schedule read back from the MILP of '" + full.name() +
                                  "' does not fit (" +
                                  (report.valid ? "device peak " + std::to_string(report.device_peak) : report.error) +
                                  "); this is a bug, please report it with the problem");
            result.plan = OffloadPlan{std::move(schedule), std::move(report), budget, 0, std::string(name())};
        }
        result.seconds = seconds_since(began);
        return result;
    }

private:
    template <class... Parts>
    void say(const Parts&... parts) const {
        if (!options_.progress) return;
        std::ostringstream out;
        (out << ... << parts);
        report_progress(options_.progress, out.str());
    }

    // A formulation with its offload part (the part refers to the formulation: both on the heap).
    struct Built {
        std::unique_ptr<remat::detail::checkmate::Formulation> formulation;
        std::unique_ptr<detail::offload_milp::Model> model;
    };
    [[nodiscard]] Built build(const Problem& full, const remat::detail::checkmate::Analysis& a,
                              const std::vector<DataId>& movable, const TransferSettings& transfers, Bytes budget,
                              std::optional<double> horizon, std::chrono::steady_clock::time_point began) const {
        using namespace remat::detail::checkmate;
        Built built;
        Layout layout = make_layout(full, a, options_.extra_passes);
        // Checked before the rows are built: the cap is there to keep them from being built.
        if (const std::size_t binaries = estimated_binaries(layout, movable.size()); binaries > options_.max_binary_variables)
            throw SolverError("checkmate+offload: the MILP of '" + full.name() + "' would have about " +
                              std::to_string(binaries) + " binary variables, above max_binary_variables = " +
                              std::to_string(options_.max_binary_variables) +
                              "; use offload::plan_with_offload (the iteration) on graphs this large");
        built.formulation = std::make_unique<Formulation>(full, a, std::move(layout), budget, movable, true,
                                                          deadline_after(began, options_.time_limit_seconds));
        if (built.formulation->infeasible()) return built;
        built.model = std::make_unique<detail::offload_milp::Model>(full, *built.formulation, movable, transfers,
                                                                    options_.offload_lag, budget, horizon);
        return built;
    }
    OffloadMilpResult& infeasible(OffloadMilpResult& result, const Built& built) const {
        result.status = milp::Status::infeasible;
        say("checkmate+offload: no plan in the model: ", built.formulation->infeasible_reason());
        return result;
    }

    OffloadCheckmateOptions options_;
    Backend backend_;

public:
    /// About how many binary variables the MILP of `full` has (max_binary_variables caps it).
    [[nodiscard]] std::size_t binaries(const Problem& full) const {
        const auto a = remat::detail::checkmate::analyse(full);
        return estimated_binaries(remat::detail::checkmate::make_layout(full, a, options_.extra_passes), movable_data(full).size());
    }

private:
    // The run variables (one per point of the layout), and per movable data its copies, its
    // transfers and where it starts.
    [[nodiscard]] static std::size_t estimated_binaries(const remat::detail::checkmate::Layout& layout, std::size_t movable) {
        const auto points = static_cast<std::size_t>(std::count(layout.allowed.begin(), layout.allowed.end(), char{1}));
        return points + movable * (4 * points + 3);
    }
    // The data the model moves: the offloadable initial ones.
    [[nodiscard]] static std::vector<DataId> movable_data(const Problem& full) {
        std::vector<DataId> movable;
        for (const DataId d : full.initial())
            if (full.data(d).offloadable) movable.push_back(d);
        return movable;
    }
};

/// The combined planner with the MILP on top: the iteration's plan (plan_with_offload), then
/// Checkmate's MILP with offload variables started from it, within what is left of the MILP's
/// time limit; the faster of the two under the simulator. The MILP only ever improves the
/// result; on graphs past the MILP's size cap (max_binary_variables) the iteration's plan is
/// returned. Both must use the same transfer settings.
template <Solver S, milp::MilpBackend Backend>
[[nodiscard]] std::optional<OffloadPlan> plan_with_offload(const Problem& full, Bytes budget, const S& solver,
                                                           const OffloadCheckmate<Backend>& milp,
                                                           const CombinedOptions& options = {}) {
    const TransferSettings transfers = options.transfers.value_or(full.transfers());
    if (milp.options().transfers.value_or(full.transfers()) != transfers)
        throw InvalidInput("plan_with_offload: the MILP's transfer settings differ from the iteration's; give both the same");
    const Stopwatch clock;
    std::optional<OffloadPlan> best = plan_with_offload(full, budget, solver, options);
    if (best && milp.binaries(full) > milp.options().max_binary_variables) return best;
    // A plan at the proven makespan bound (the compute of every op, or the transfers the
    // budget forces) is optimal: the MILP could only spend its time limit proving it.
    if (best && meets_time_bound(best->report.makespan, makespan_lower_bound(full, budget, transfers))) return best;
    const double left = std::max(0.01, milp.options().time_limit_seconds - clock.seconds());
    OffloadMilpResult result =
        milp.with_time_limit_at_most(left).solve(full, budget, best ? std::optional(best->schedule) : std::nullopt);
    if (result.plan && (!best || result.plan->report.makespan < best->report.makespan)) best = std::move(result.plan);
    return best;
}

}  // namespace remat::offload
