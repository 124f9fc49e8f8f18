// remat/solvers/checkmate/formulation.hpp — Checkmate's integer program for one layout of
// passes: its variables, its rows, and the way back from a solution to a schedule (and from
// a schedule to a starting solution).
//
// Part of the Checkmate solver (solvers/checkmate.hpp, whose opening comment states the
// formulation and why it is exact; Jain et al., MLSys 2020). Variables: R[t,k], op k runs in
// pass t, at the points checkmate/layout.hpp allows; Y[d,j], data d is live in its j-th
// segment. Rows, built in this order: each exactly-once op once and one per main pass,
// the order the graph forces on them, production cuts, one representation per schedule,
// then point by point in time order the reads, the memory and the liveness transitions.
// The model itself is milp/model.hpp's, solved by any MILP backend.
//
// Movable initial data (offload/checkmate.hpp): an initial data may be given a device
// residency that the model decides, point by point: then it is not counted as always live,
// and every memory row counts it through a variable Z[d,i] in [0,1] (the bytes it holds on
// the device at point i) that the caller constrains.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/errors.hpp"
#include "../../core/problem.hpp"
#include "../../core/schedule.hpp"
#include "../../milp/model.hpp"
#include "analysis.hpp"
#include "layout.hpp"

namespace remat {

/// Size of the integer program Checkmate builds for a problem and budget.
struct CheckmateModelSize {
    std::size_t passes = 0;
    std::size_t variables = 0;
    std::size_t integers = 0;
    std::size_t rows = 0;
    std::size_t nonzeros = 0;
};

namespace detail::checkmate {

// A segment's liveness: a constant or a variable.
struct Lit {
    enum class Kind : unsigned char { zero, one, var } kind = Kind::zero;
    milp::Var var{};
};

// The MILP of one layout, with its variables, ready to be solved or to give a schedule.
class Formulation {
public:
    // `budget`: memory rows against it; nullopt: minimise the peak instead (variable P).
    // `movable`: initial data whose device memory is the variable Z[d,i] at each point.
    // `pinned_cuts`: add the pinned-liveness rows (valid inequalities, off only to measure them).
    // `deadline`: building stops with TooLarge once it has passed. A model of a thousand ops
    // has hundreds of millions of nonzeros and takes seconds to build: the caller's time limit
    // must hold while it is built, not only while it is solved.
    Formulation(const Problem& pr, const Analysis& a, Layout layout, std::optional<Bytes> budget,
                const std::vector<DataId>& movable = {}, bool pinned_cuts = true,
                std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt)
        : pr_(pr), a_(a), L_(std::move(layout)), fixed_initial_bytes_(a.initial_bytes), deadline_(deadline) {
        infeasible_ = L_.infeasible;
        reason_ = L_.infeasible_reason;
        add_run_variables();
        add_held_variables(movable);
        add_segments();
        const double cap = set_memory_objective(budget);
        add_exactly_once_rows();
        add_precedence_rows();
        if (!L_.infeasible) {
            add_production_cuts();
            add_final_cuts();
            add_one_representation_rows();
            if (pinned_cuts) add_pinned_liveness_cuts();
        }
        add_point_rows(budget, cap);
    }

    [[nodiscard]] milp::Model& model() noexcept { return model_; }
    [[nodiscard]] const milp::Model& model() const noexcept { return model_; }
    [[nodiscard]] bool infeasible() const noexcept { return infeasible_; }
    [[nodiscard]] const std::string& infeasible_reason() const noexcept { return reason_; }
    [[nodiscard]] const Layout& layout() const noexcept { return L_; }
    [[nodiscard]] std::optional<milp::Var> peak_var() const noexcept { return peak_; }

    [[nodiscard]] const Analysis& analysis() const noexcept { return a_; }
    // The op at a position of the model's order.
    [[nodiscard]] std::size_t analysis_op(std::size_t position) const { return a_.order.at(position); }
    // The model's (pass, position) points in time order: the points where an op may run.
    [[nodiscard]] const std::vector<std::pair<std::size_t, std::size_t>>& points() const noexcept { return points_; }
    // The run variable of a point.
    [[nodiscard]] milp::Var run_var(std::size_t point) const {
        const auto& [t, p] = points_.at(point);
        return milp::Var{rvar_[t * a_.n + p]};
    }
    // The index of the point (t, p), or none when the model has no such point.
    [[nodiscard]] std::size_t point_of(std::size_t t, std::size_t p) const { return point_index_.at(t * a_.n + p); }
    // Z[movable[k], point]: the device bytes (as a share of its size) the k-th movable data
    // holds at that point, counted by the memory rows.
    [[nodiscard]] milp::Var held_var(std::size_t k, std::size_t point) const { return held_.at(k).at(point); }
    // The initial bytes every memory row counts as live: those of the data that are not movable.
    [[nodiscard]] Bytes fixed_initial_bytes() const noexcept { return fixed_initial_bytes_; }

    // A proven lower bound on the time of every schedule within the budget (bounds/
    // time_lower_bound.hpp) as a row: Σ time·R >= bound. A valid inequality that lifts the LP
    // relaxation above the fractional schedules faster than the bound. Budget models only.
    void add_time_at_least(double bound) {
        std::vector<milp::Term> row;
        for (const std::size_t v : rvar_)
            if (v != none && model_.variable(milp::Var{v}).objective != 0.0)
                row.push_back({milp::Var{v}, model_.variable(milp::Var{v}).objective});
        if (!row.empty()) model_.add_row(std::move(row), milp::Sense::greater_equal, bound, "time_bound");
    }

    [[nodiscard]] CheckmateModelSize size() const {
        return {L_.T, model_.variable_count(), model_.integer_count(), model_.row_count(), model_.nonzero_count()};
    }

    // The runs of a solution, as (pass, position) points in time order.
    [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> runs(const std::vector<double>& values) const {
        std::vector<std::pair<std::size_t, std::size_t>> out;
        const std::size_t n = a_.n;
        for (std::size_t t = 0; t < L_.T; ++t)
            for (std::size_t p = 0; p < n; ++p)
                if (const std::size_t v = rvar_[t * n + p]; v != none && values[v] > 0.5) out.emplace_back(t, p);
        return out;
    }

    // The schedule of a set of runs: each data is kept from the run that writes it to its
    // last read before it is written again (to the end when final), and freed right then.
    [[nodiscard]] Schedule schedule(const std::vector<std::pair<std::size_t, std::size_t>>& runs) const {
        const std::size_t m = a_.m;
        // For each data, the run indices that read / write it.
        std::vector<std::vector<std::size_t>> free_after(runs.size());
        std::vector<std::size_t> last_write(m, none), last_read(m, none);
        const auto close = [&](std::size_t d, bool final_keep) {
            // The interval opened by last_write[d] ends: free after its last read (or the write).
            if (last_write[d] == none) return;
            if (final_keep) return;
            const std::size_t at = last_read[d] != none && last_read[d] > last_write[d] ? last_read[d] : last_write[d];
            free_after[at].push_back(d);
        };
        for (std::size_t i = 0; i < runs.size(); ++i) {
            const Op& op = pr_.op(OpId{a_.order[runs[i].second]});
            for (const DataId d : op.reads)
                if (!pr_.is_initial(d)) last_read[d.index] = i;
            for (const DataId d : op.writes) {
                if (pr_.is_initial(d)) continue;
                const bool read_here = std::find(op.reads.begin(), op.reads.end(), d) != op.reads.end();
                // Rewritten while it must be live (read by this very op): the interval goes on.
                if (!(read_here && last_write[d.index] != none)) close(d.index, false);
                if (!read_here || last_write[d.index] == none) last_write[d.index] = i;
            }
        }
        for (std::size_t d = 0; d < m; ++d)
            if (!pr_.is_initial(DataId{d})) close(d, pr_.is_final(DataId{d}));
        Schedule s;
        s.reserve(runs.size() * 2);
        for (std::size_t i = 0; i < runs.size(); ++i) {
            s.push_back(Step::run(OpId{a_.order[runs[i].second]}));
            auto& frees = free_after[i];
            std::sort(frees.begin(), frees.end());
            frees.erase(std::unique(frees.begin(), frees.end()), frees.end());
            for (const std::size_t d : frees) s.push_back(Step::free(DataId{d}));
        }
        return s;
    }

    // A full assignment of the model's variables for a set of runs (a warm start), or
    // nullopt when a run falls on a point the model does not have.
    [[nodiscard]] std::optional<std::vector<double>> assignment(
        const std::vector<std::pair<std::size_t, std::size_t>>& runs) const {
        const std::size_t n = a_.n, m = a_.m;
        std::vector<double> x(model_.variable_count(), 0.0);
        std::vector<char> run_at(L_.T * n, 0);
        for (const auto& [t, p] : runs) {
            if (t >= L_.T || rvar_[t * n + p] == none) return std::nullopt;
            x[rvar_[t * n + p]] = 1.0;
            run_at[t * n + p] = 1;
        }
        // Least liveness: live from a writing run to the last reading run before the next
        // writing run (or to the end for final data).
        for (std::size_t d = 0; d < m; ++d) {
            if (pr_.is_initial(DataId{d})) continue;
            const auto& ev = L_.events[d];
            const auto& seg = seg_[d];
            std::vector<char> live(ev.size() + 1, 0);
            // Mark segments before each reading run back to the writing run that feeds it.
            for (std::size_t j = 0; j < ev.size(); ++j) {
                if (!ev[j].reads || !run_at[ev[j].t * n + ev[j].p]) continue;
                for (std::size_t i = j; i-- > 0;) {
                    live[i + 1] = 1;
                    if (ev[i].writes && run_at[ev[i].t * n + ev[i].p]) break;
                    if (i == 0) return std::nullopt;  // read with no write before
                }
                if (j == 0) return std::nullopt;
            }
            if (pr_.is_final(DataId{d})) {
                for (std::size_t i = ev.size(); i-- > 0;) {
                    live[i + 1] = 1;
                    if (ev[i].writes && run_at[ev[i].t * n + ev[i].p]) break;
                }
            }
            for (std::size_t j = 0; j < seg.size(); ++j) {
                if (seg[j].kind == Lit::Kind::var) x[seg[j].var.index] = live[j];
                else if ((seg[j].kind == Lit::Kind::one) != (live[j] != 0)) return std::nullopt;
            }
        }
        for (const auto& [p, cumulative] : ran_by_)
            for (std::size_t k = 0, done = 0; k < cumulative.size(); ++k) {
                done += run_at[cumulative[k].first * n + p];
                x[cumulative[k].second.index] = static_cast<double>(done);
            }
        if (peak_) {
            // The least P the memory rows allow.
            double p = model_.variable(*peak_).lower;
            for (const milp::Row& row : model_.rows()) {
                double coef = 0.0, activity = 0.0;
                for (const milp::Term& term : row.terms) {
                    if (term.var == *peak_) coef = term.coef;
                    else activity += term.coef * x[term.var.index];
                }
                if (coef < 0) p = std::max(p, (activity - row.rhs) / -coef);
            }
            x[peak_->index] = std::ceil(p - 1e-9);
        }
        return x;
    }

    // Fractional liveness of data d just after the point (t, p) in a solution of the relaxation.
    [[nodiscard]] double liveness_after(const std::vector<double>& values, std::size_t d, std::size_t t,
                                        std::size_t p) const {
        if (pr_.is_initial(DataId{d})) return 1.0;
        const auto& ev = L_.events[d];
        const Event key{t, p, false, false};
        const auto j = static_cast<std::size_t>(std::upper_bound(ev.begin(), ev.end(), key) - ev.begin());
        const Lit& y = seg_[d][j];
        if (y.kind == Lit::Kind::one) return 1.0;
        if (y.kind == Lit::Kind::zero) return 0.0;
        return values[y.var.index];
    }
    [[nodiscard]] double run_value(const std::vector<double>& values, std::size_t t, std::size_t p) const {
        const std::size_t v = rvar_[t * a_.n + p];
        return v == none ? 0.0 : values[v];
    }


private:
    // Variables: R for every allowed point.
    void add_run_variables() {
        const std::size_t n = a_.n, T = L_.T;
        rvar_.assign(T * n, none);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t p = 0; p < n; ++p)
                if (L_.at(n, t, p)) {
                    const Op& op = pr_.op(OpId{a_.order[p]});
                    rvar_[t * n + p] = model_.add_binary(op.time, "R_" + std::to_string(t) + "_" + op.name).index;
                }
    }

    // Points in time order, and the variables Z of the movable data at each of them; those
    // data leave the constant initial bytes.
    void add_held_variables(const std::vector<DataId>& movable) {
        const std::size_t n = a_.n;
        point_index_.assign(L_.T * n, none);
        for (std::size_t t = 0; t < L_.T; ++t)
            for (std::size_t p = 0; p < n; ++p)
                if (rvar_[t * n + p] != none) {
                    point_index_[t * n + p] = points_.size();
                    points_.emplace_back(t, p);
                }
        movable_of_.assign(a_.m, none);
        for (const DataId d : movable) {
            movable_of_[d.index] = held_.size();
            fixed_initial_bytes_ -= pr_.data(d).bytes;
            auto& vars = held_.emplace_back();
            for (std::size_t i = 0; i < points_.size(); ++i)
                vars.push_back(model_.add_continuous(0.0, 1.0, 0.0, "Z_" + pr_.data(d).name + "_" + std::to_string(i)));
        }
    }

    // Segments: fixed where the data cannot be live or is of no use, variables elsewhere.
    void add_segments() {
        seg_.assign(a_.m, {});
        for (std::size_t d = 0; d < a_.m; ++d) {
            if (pr_.is_initial(DataId{d})) continue;
            const auto& ev = L_.events[d];
            const std::size_t S = ev.size() + 1;
            std::vector<char> live_possible(S, 0), read_after(S, 0);
            for (std::size_t j = 0; j + 1 < S; ++j) live_possible[j + 1] = live_possible[j] || ev[j].writes;
            for (std::size_t j = S - 1; j-- > 0;) read_after[j] = read_after[j + 1] || ev[j].reads;
            const bool fin = pr_.is_final(DataId{d});
            auto& seg = seg_[d];
            seg.resize(S);
            for (std::size_t j = 0; j < S; ++j) {
                if (j == S - 1 && fin) {
                    seg[j].kind = Lit::Kind::one;
                    if (!live_possible[j]) fail("final data '" + pr_.data(DataId{d}).name + "' can never be computed");
                } else if (!live_possible[j] || (!read_after[j] && !fin)) {
                    seg[j].kind = Lit::Kind::zero;
                } else {
                    seg[j].kind = Lit::Kind::var;
                    seg[j].var = model_.add_continuous(0.0, 1.0, 0.0, "Y_" + pr_.data(DataId{d}).name + "_" + std::to_string(j));
                }
            }
        }
    }

    // Against a budget: the memory rows' capacity in units (the budget less the initial
    // data), which is returned. Without one: the peak P becomes the objective (0 returned).
    double set_memory_objective(std::optional<Bytes> budget) {
        const double unit = static_cast<double>(a_.scale);
        if (budget) return std::floor(static_cast<double>(*budget - fixed_initial_bytes_) / unit);
        peak_ = model_.add_continuous(std::ceil(static_cast<double>(a_.lower_bound) / unit), milp::infinity, 1.0, "P");
        // The peak is the objective; time only breaks ties, weighted so that all runs
        // together are worth less than half a unit of peak (P is integral in units).
        double total = 0.0;
        for (const std::size_t v : rvar_)
            if (v != none) total += model_.variable(milp::Var{v}).objective;
        const double weight = total > 0 ? 0.25 / total : 0.0;
        for (const std::size_t v : rvar_)
            if (v != none) model_.set_objective(milp::Var{v}, model_.variable(milp::Var{v}).objective * weight);
        return 0.0;
    }

    // Exactly-once ops: once each, and exactly one in each pass that holds one.
    void add_exactly_once_rows() {
        const std::size_t n = a_.n, T = L_.T, E = a_.eo_ops.size();
        for (std::size_t e = 0; e < E; ++e) {
            std::vector<milp::Term> terms;
            const std::size_t p = a_.pos[a_.eo_ops[e]];
            for (std::size_t t = 0; t < T; ++t)
                if (const std::size_t v = rvar_[t * n + p]; v != none) terms.push_back({milp::Var{v}, 1.0});
            if (terms.empty()) fail("exactly-once op '" + pr_.op(OpId{a_.eo_ops[e]}).name + "' cannot run in any pass");
            else model_.add_row(std::move(terms), milp::Sense::equal, 1.0, "once_" + pr_.op(OpId{a_.eo_ops[e]}).name);
        }
        for (std::size_t t = 0; t < T; ++t) {
            std::vector<milp::Term> terms;
            for (const std::size_t k : a_.eo_ops)
                if (const std::size_t v = rvar_[t * n + a_.pos[k]]; v != none) terms.push_back({milp::Var{v}, 1.0});
            // Each exactly-once slot holds exactly one (there are as many slots as ops).
            if (L_.holds_eo(t) && !terms.empty())
                model_.add_row(std::move(terms), milp::Sense::equal, 1.0, "slot_" + std::to_string(t));
        }
    }

    // Exactly-once ops in the order the graph forces (its direct precedences suffice).
    void add_precedence_rows() {
        if (L_.infeasible) return;
        const std::size_t n = a_.n;
        for (const auto& [e1, e2] : a_.direct_prec) {
            const std::size_t p1 = a_.pos[a_.eo_ops[e1]], p2 = a_.pos[a_.eo_ops[e2]];
            // By slot s, e2 has run only if e1 ran in an earlier slot (redundant once e1 is surely done).
            for (std::size_t s = L_.lo[e2]; s <= L_.hi[e2] && s <= L_.hi[e1]; ++s) {
                std::vector<milp::Term> terms;
                for (std::size_t u = 0; u <= s; ++u)
                    if (const std::size_t v = rvar_[L_.main_of(u) * n + p2]; v != none) terms.push_back({milp::Var{v}, 1.0});
                for (std::size_t u = 0; u < s; ++u)
                    if (const std::size_t v = rvar_[L_.main_of(u) * n + p1]; v != none) terms.push_back({milp::Var{v}, -1.0});
                if (!terms.empty()) model_.add_row(std::move(terms), milp::Sense::less_equal, 0.0, "prec");
            }
        }
    }

    // Production cuts: by the time an exactly-once op has run, every data it reads has
    // been written at least once. The rows follow from the others for integral R, but the
    // LP relaxation otherwise spreads an exactly-once op over several passes and
    // "half-computes" what it reads.
    void add_production_cuts() {
        const std::size_t n = a_.n, E = a_.eo_ops.size();
        for (std::size_t e = 0; e < E; ++e) {
            check_deadline("production cuts");
            const std::size_t k = a_.eo_ops[e];
            const std::size_t pe = a_.pos[k];
            for (const DataId d : pr_.op(OpId{k}).reads) {
                if (pr_.is_initial(d)) continue;
                std::vector<milp::Term> writes;  // writer points in time order
                std::vector<Event> at;
                for (const Event& ev : L_.events[d.index])
                    if (ev.writes) {
                        writes.push_back({milp::Var{rvar_[ev.t * n + ev.p]}, 1.0});
                        at.push_back(ev);
                    }
                std::vector<milp::Term> runs;
                std::size_t w = 0;
                for (std::size_t slot = L_.lo[e]; slot <= L_.hi[e]; ++slot) {
                    const std::size_t t = L_.main_of(slot);
                    const std::size_t v = rvar_[t * n + pe];
                    if (v == none) continue;
                    runs.push_back({milp::Var{v}, -1.0});
                    while (w < at.size() && (at[w].t < t || (at[w].t == t && at[w].p < pe))) ++w;
                    std::vector<milp::Term> row(writes.begin(), writes.begin() + static_cast<std::ptrdiff_t>(w));
                    row.insert(row.end(), runs.begin(), runs.end());
                    model_.add_row(std::move(row), milp::Sense::greater_equal, 0.0, "produced");
                }
            }
        }
    }

    // The same cut for the end: every final data has been written at least once.
    void add_final_cuts() {
        const std::size_t n = a_.n;
        for (const DataId d : pr_.final_data()) {
            if (pr_.is_initial(d)) continue;
            std::vector<milp::Term> writes;
            for (const Event& ev : L_.events[d.index])
                if (ev.writes) writes.push_back({milp::Var{rvar_[ev.t * n + ev.p]}, 1.0});
            if (!writes.empty()) model_.add_row(std::move(writes), milp::Sense::greater_equal, 1.0, "final");
        }
    }

    // One representation per schedule: two consecutive passes that could be one (the
    // second starts after the last op of the first, and not both hold an exactly-once
    // op) are not allowed. When the first pass is one without exactly-once op, "if it
    // ends at q, the next one runs an op at or before q" (so a used pass of that kind is
    // followed by a used pass); when it holds one, "if the next starts at q, this one
    // runs an op at or after q" (an empty next pass is fine).
    void add_one_representation_rows() {
        const std::size_t n = a_.n, T = L_.T;
        for (std::size_t t = 0; t + 1 < T; ++t) {
            check_deadline("one-representation rows");
            if (L_.holds_eo(t) && L_.holds_eo(t + 1)) continue;
            const bool first_free = !L_.holds_eo(t);
            const std::size_t witness_pass = first_free ? t : t + 1;
            for (std::size_t q = 0; q < n; ++q) {
                const std::size_t w = rvar_[witness_pass * n + q];
                if (w == none) continue;
                std::vector<milp::Term> row{{milp::Var{w}, -1.0}};
                for (std::size_t p = 0; p < n; ++p) {
                    const bool in_first = first_free ? p > q : p >= q;
                    const bool in_second = first_free ? p <= q : p < q;
                    if (const std::size_t v = rvar_[t * n + p]; v != none && in_first && v != w) row.push_back({milp::Var{v}, 1.0});
                    if (const std::size_t v = rvar_[(t + 1) * n + p]; v != none && in_second && v != w) row.push_back({milp::Var{v}, 1.0});
                }
                model_.add_row(std::move(row), milp::Sense::greater_equal, 0.0, "one_representation");
            }
        }
    }

    // Pinned liveness: a data whose only writer is an exactly-once op can never be written
    // again, so from that run until an exactly-once reader of it has run (until the end, for
    // final data) it must be live: Y[d,j] >= ran(w, before j) - ran(r, before j), where ran(o,
    // before j) is the share of op o's run that lies at or before the event that opens segment
    // j. The rows follow from the others for integral R, but they cut the relaxation's
    // "half-schedules": an exactly-once op spread over two passes lets its inputs be half
    // live (half the memory) between them. Within the segments between two events of w or r
    // the liveness cannot grow (nothing writes d there), so one row at the last segment of
    // each such stretch covers the stretch.
    void add_pinned_liveness_cuts() {
        for (std::size_t d = 0; d < a_.m; ++d) {
            check_deadline("pinned-liveness rows");
            const DataId id{d};
            if (pr_.is_initial(id)) continue;
            const auto writers = pr_.writers(id);
            if (writers.size() != 1 || !pr_.op(writers[0]).exactly_once) continue;
            const OpId w = writers[0];
            const auto& w_reads = pr_.op(w).reads;
            if (std::find(w_reads.begin(), w_reads.end(), id) != w_reads.end()) continue;
            for (const OpId r : pr_.readers(id))
                if (pr_.op(r).exactly_once && r != w) add_pinned_rows(d, a_.pos[w.index], a_.pos[r.index]);
            if (pr_.is_final(id)) add_pinned_rows(d, a_.pos[w.index], none);
        }
    }

    // The rows of one data between the writer at position pw and the reader at position pr
    // (none: the end of the step).
    void add_pinned_rows(std::size_t d, std::size_t pw, std::size_t pr) {
        const auto& ev = L_.events[d];
        const auto& seg = seg_[d];
        std::optional<milp::Var> written, read;  // ran(w) and ran(r) up to the current event
        for (std::size_t j = 1; j < seg.size(); ++j) {
            const Event& opened_by = ev[j - 1];
            if (opened_by.p == pw && opened_by.writes) written = ran_by(pw, opened_by.t);
            if (opened_by.p == pr && opened_by.reads) read = ran_by(pr, opened_by.t);
            if (!written) continue;
            const bool stretch_ends = j + 1 == seg.size() || ev[j].p == pw || ev[j].p == pr;
            if (!stretch_ends || seg[j].kind == Lit::Kind::one) continue;
            std::vector<milp::Term> row{{*written, -1.0}};
            if (read) row.push_back({*read, 1.0});
            if (seg[j].kind == Lit::Kind::var) row.push_back({seg[j].var, 1.0});
            model_.add_row(std::move(row), milp::Sense::greater_equal, 0.0, "pinned");
        }
    }

    // ran(op at position p, up to pass t): the sum of its runs in passes 0..t, one continuous
    // variable per pass where it may run, made on first use (an exactly-once op, so in [0, 1]).
    milp::Var ran_by(std::size_t p, std::size_t t) {
        auto [it, made] = ran_by_.try_emplace(p);
        auto& cumulative = it->second;
        if (made) {
            const std::size_t n = a_.n;
            std::optional<milp::Var> before;
            for (std::size_t u = 0; u < L_.T; ++u) {
                const std::size_t v = rvar_[u * n + p];
                if (v == none) continue;
                const milp::Var now = model_.add_continuous(0.0, 1.0, 0.0, "ran_" + std::to_string(u) + "_" +
                                                                               pr_.op(OpId{a_.order[p]}).name);
                std::vector<milp::Term> row{{now, 1.0}, {milp::Var{v}, -1.0}};
                if (before) row.push_back({*before, -1.0});
                model_.add_row(std::move(row), milp::Sense::equal, 0.0, "ran");
                cumulative.emplace_back(u, now);
                before = now;
            }
        }
        const auto at = std::find_if(cumulative.begin(), cumulative.end(), [&](const auto& c) { return c.first == t; });
        return at->second;
    }

    // Reads, memory and liveness transitions, point by point in time order; `seen` counts
    // the events of each data passed so far, i.e. its current segment.
    void add_point_rows(std::optional<Bytes> budget, double cap) {
        const std::size_t n = a_.n, T = L_.T;
        std::vector<std::size_t> seen(a_.m, 0);
        std::vector<milp::Term> terms;  // scratch of the memory rows
        for (std::size_t t = 0; t < T; ++t) {
            check_deadline("memory rows");
            for (std::size_t p = 0; p < n; ++p) {
                const std::size_t rv = rvar_[t * n + p];
                if (rv == none) continue;
                const Op& op = pr_.op(OpId{a_.order[p]});
                const milp::Var R{rv};
                add_read_rows(op, R, seen);
                add_memory_row(op, R, point_index_[t * n + p], seen, budget, cap, terms);
                add_transition_rows(op, R, seen);
                advance_segments(op, seen);
            }
        }
    }

    // An op reads only data live just before it.
    void add_read_rows(const Op& op, milp::Var R, const std::vector<std::size_t>& seen) {
        for (const DataId d : op.reads) {
            if (pr_.is_initial(d)) continue;
            const Lit& y = seg_[d.index][seen[d.index]];
            if (y.kind == Lit::Kind::var)
                model_.add_row({{R, 1.0}, {y.var, -1.0}}, milp::Sense::less_equal, 0.0, "read");
            else if (y.kind == Lit::Kind::zero)
                model_.add_row({{R, 1.0}}, milp::Sense::less_equal, 0.0, "read");
        }
    }

    // Memory while the op runs: the live data, its writes and its overhead, against the
    // capacity or P; a row that can never bind is left out.
    void add_memory_row(const Op& op, milp::Var R, std::size_t point, const std::vector<std::size_t>& seen,
                        std::optional<Bytes> budget, double cap, std::vector<milp::Term>& terms) {
        Bytes written = 0;
        for (const DataId d : op.writes)
            if (!pr_.is_initial(d)) written += pr_.data(d).bytes;
        terms.clear();
        double rhs = budget ? cap : -static_cast<double>(fixed_initial_bytes_ / a_.scale);
        double most = 0.0;
        const double own = static_cast<double>((written + op.overhead) / a_.scale);
        if (own > 0) terms.push_back({R, own});
        most += own;
        for (std::size_t d = 0; d < a_.m; ++d) {
            if (pr_.data(DataId{d}).bytes == 0) continue;
            if (movable_of_[d] != none) {
                const double b = static_cast<double>(pr_.data(DataId{d}).bytes / a_.scale);
                terms.push_back({held_[movable_of_[d]][point], b});
                most += b;
                continue;
            }
            if (pr_.is_initial(DataId{d})) continue;
            // The op's writes count through R; where transfers may stand before a point whose
            // op does not run (movable data), a write that is live from an earlier run counts
            // as well (twice if the op also runs: conservative).
            if (std::find(op.writes.begin(), op.writes.end(), DataId{d}) != op.writes.end() && held_.empty()) continue;
            const Lit& y = seg_[d][seen[d]];
            const double b = static_cast<double>(pr_.data(DataId{d}).bytes / a_.scale);
            if (y.kind == Lit::Kind::one) {
                rhs -= b;
            } else if (y.kind == Lit::Kind::var) {
                terms.push_back({y.var, b});
                most += b;
            }
        }
        if (peak_) {
            terms.push_back({*peak_, -1.0});
            model_.add_row(terms, milp::Sense::less_equal, rhs, "mem");
        } else if (most > rhs) {
            if (rhs < 0 && own == 0 && terms.empty()) fail("the data that must stay live exceed the budget");
            model_.add_row(terms, milp::Sense::less_equal, rhs, "mem");
        }
    }

    // Liveness transitions of the data the op touches (each once, reads first).
    void add_transition_rows(const Op& op, milp::Var R, const std::vector<std::size_t>& seen) {
        for (const DataId d : op.reads)
            if (!pr_.is_initial(d)) {
                const bool writes = std::find(op.writes.begin(), op.writes.end(), d) != op.writes.end();
                add_transition(d.index, writes, R, seen);
            }
        for (const DataId d : op.writes)
            if (!pr_.is_initial(d) && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end())
                add_transition(d.index, true, R, seen);
    }

    // Data d can be live after the point only if it was before or the point (run R) writes it.
    void add_transition(std::size_t d, bool writes, milp::Var R, const std::vector<std::size_t>& seen) {
        const Lit& before = seg_[d][seen[d]];
        const Lit& after = seg_[d][seen[d] + 1];
        std::vector<milp::Term> row;
        double constant = 0.0;  // row: after − before − R·writes + constant ≤ 0
        if (after.kind == Lit::Kind::zero) return;
        if (after.kind == Lit::Kind::one) constant += 1.0;
        else row.push_back({after.var, 1.0});
        if (before.kind == Lit::Kind::one) return;
        if (before.kind == Lit::Kind::var) row.push_back({before.var, -1.0});
        if (writes) row.push_back({R, -1.0});
        if (row.empty()) {
            if (constant > 0) fail("data '" + pr_.data(DataId{d}).name + "' must be live but cannot be");
            return;
        }
        model_.add_row(std::move(row), milp::Sense::less_equal, -constant, "live");
    }

    // Past the point: every data it touches enters its next segment.
    void advance_segments(const Op& op, std::vector<std::size_t>& seen) const {
        for (const DataId d : op.reads)
            if (!pr_.is_initial(d)) ++seen[d.index];
        for (const DataId d : op.writes)
            if (!pr_.is_initial(d) && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end())
                ++seen[d.index];
    }

    // Between rows of a phase (a pass, an op or a data at a time: milliseconds each).
    void check_deadline(const char* phase) const {
        if (deadline_ && std::chrono::steady_clock::now() > *deadline_)
            throw TooLarge("checkmate: the time limit ran out while building the integer program of '" + pr_.name() +
                           "' (" + std::to_string(L_.T) + " passes, at its " + phase + ")");
    }

    void fail(std::string why) {
        if (!infeasible_) reason_ = std::move(why);
        infeasible_ = true;
    }

    const Problem& pr_;
    const Analysis& a_;
    Layout L_;
    milp::Model model_;
    std::vector<std::size_t> rvar_;
    std::vector<std::vector<Lit>> seg_;
    std::optional<milp::Var> peak_;
    Bytes fixed_initial_bytes_;
    std::vector<std::pair<std::size_t, std::size_t>> points_;
    std::vector<std::size_t> point_index_;            // [t * n + p] → point, or none
    std::vector<std::size_t> movable_of_;             // data → index in held_, or none
    std::vector<std::vector<milp::Var>> held_;        // [movable][point] → Z
    // Exactly-once op position → (pass, ran_by variable) for each pass where it may run.
    std::map<std::size_t, std::vector<std::pair<std::size_t, milp::Var>>> ran_by_;
    std::optional<std::chrono::steady_clock::time_point> deadline_;
    bool infeasible_ = false;
    std::string reason_;
};

}  // namespace detail::checkmate
}  // namespace remat
