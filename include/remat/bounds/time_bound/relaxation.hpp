// remat/bounds/time_bound/relaxation.hpp — the relaxation that bounds/time_lower_bound.hpp
// solves: what the graph fixes (the phases, the order of the exactly-once ops after the loss),
// the instants where memory is checked (the cuts after the loss, the forward cuts before it),
// its variables (live data at each cut, runs in each span) and its rows, including the span
// rows that check memory inside a span. bounds/time_lower_bound.hpp says what the rows mean
// and why each holds for every schedule; bounds/loss_state_bound.hpp builds its master
// problem from the same rows. After Checkmate's MILP (Jain et al., MLSys 2020), reduced to
// one stage per cut. Standard library only, plus the MILP model.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/bounds.hpp"
#include "../../core/problem.hpp"
#include "../../milp/model.hpp"
#include "../../solvers/checkmate/analysis.hpp"

namespace remat {

namespace detail::time_bound {

inline constexpr std::size_t none = detail::checkmate::none;

// Which ops can only run after the loss started (every way of running them goes through the
// loss), which of them are exactly-once, and which exactly-once ops must precede which.
struct Phases {
    detail::checkmate::Analysis order;  // eo_index, eo_ops, eo_pred: the forced order
    std::vector<char> can_run;          // op: some derivation of it exists
    std::vector<char> after_loss_op;    // op: every run of it follows the loss
    std::vector<char> after_loss_data;  // data: only ops after the loss write it
};

[[nodiscard]] inline Phases phases(const Problem& p, OpId loss) {
    Phases ph;
    ph.order.n = p.op_count();
    ph.order.m = p.data_count();
    detail::checkmate::number_ops(p, ph.order);
    const auto requirements = detail::checkmate::exactly_once_requirements(p, ph.order);
    detail::checkmate::order_exactly_once(ph.order, requirements);
    const std::size_t loss_eo = ph.order.eo_index[loss.index];
    ph.can_run.assign(p.op_count(), 0);
    ph.after_loss_op.assign(p.op_count(), 0);
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        ph.can_run[k] = requirements[k].has_value();
        ph.after_loss_op[k] = requirements[k] && requirements[k]->test(loss_eo);
    }
    ph.after_loss_data.assign(p.data_count(), 0);
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const auto writers = p.writers(DataId{d});
        ph.after_loss_data[d] = !writers.empty() && std::all_of(writers.begin(), writers.end(), [&](OpId w) {
            return ph.after_loss_op[w.index] != 0;
        });
    }
    return ph;
}

// Whether exactly-once op `before` must run before exactly-once op `after`.
[[nodiscard]] inline bool must_precede(const Phases& ph, OpId before, OpId after) {
    const std::size_t b = ph.order.eo_index[before.index], a = ph.order.eo_index[after.index];
    return b != none && a != none && ph.order.eo_pred[a].test(b);
}

// The longest chain of exactly-once ops after the loss in which each must precede the next:
// the candidates for cuts, in the order every schedule runs them.
[[nodiscard]] inline std::vector<OpId> longest_chain_after_loss(const Phases& ph, OpId loss) {
    const auto& a = ph.order;
    std::vector<std::size_t> chain_ops;  // exactly-once indices after the loss
    for (std::size_t e = 0; e < a.eo_ops.size(); ++e)
        if (ph.after_loss_op[a.eo_ops[e]] && a.eo_ops[e] != loss.index) chain_ops.push_back(e);
    // Fewer forced predecessors first: a topological order of "must precede".
    std::stable_sort(chain_ops.begin(), chain_ops.end(),
                     [&](std::size_t x, std::size_t y) { return a.n_pred[x] < a.n_pred[y]; });
    std::vector<std::size_t> length(chain_ops.size(), 1), previous(chain_ops.size(), none);
    std::size_t end = none;
    for (std::size_t j = 0; j < chain_ops.size(); ++j) {
        for (std::size_t i = 0; i < j; ++i)
            if (a.eo_pred[chain_ops[j]].test(chain_ops[i]) && length[i] + 1 > length[j]) {
                length[j] = length[i] + 1;
                previous[j] = i;
            }
        if (end == none || length[j] > length[end]) end = j;
    }
    std::vector<OpId> chain;
    for (std::size_t j = end; j != none; j = previous[j]) chain.push_back(OpId{a.eo_ops[chain_ops[j]]});
    std::reverse(chain.begin(), chain.end());
    return chain;
}

// The loss, then up to `count` ops of the chain spread evenly along it.
[[nodiscard]] inline std::vector<OpId> spread_cuts(const std::vector<OpId>& chain, OpId loss, std::size_t count) {
    std::vector<OpId> cuts{loss};
    const std::size_t taken = std::min(count, chain.size());
    for (std::size_t j = 1; j <= taken; ++j) {
        const OpId at = chain[j * chain.size() / taken - 1];
        if (cuts.back() != at) cuts.push_back(at);
    }
    return cuts;
}

// Forward cuts: instants before the loss that every schedule passes in one order, the start of
// the first write of a data d_j. If every writer of e reads d (not initial), e is first written
// after d was; along a chain of such data, so is each later one. At the first write of d_j,
// the data "unborn" then (d_j, and each data whose every writer is late) are not live, and the
// "late" ops (d_j's writers, and each op that reads an unborn data) have not run yet. A layer
// captured as two ops (the forward without and with grad, both writing its output) is one
// step of the chain, which a chain of ops could not follow.
struct ForwardCuts {
    std::vector<DataId> data;                // d_1 … d_m, the last nearest the loss
    std::vector<std::vector<char>> late;     // [j][op]: every run of op starts at or after cut j
    std::vector<std::vector<char>> unborn;   // [j][data]: not live when cut j starts
};

// The unborn data and late ops of the first write of `first`: a fixed point, as a writer may
// read a data whose writers come later in no fixed order.
inline void mark_after_first_write(const Problem& p, DataId first, std::vector<char>& late, std::vector<char>& unborn) {
    late.assign(p.op_count(), 0);
    unborn.assign(p.data_count(), 0);
    for (const OpId w : p.writers(first)) late[w.index] = 1;
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t d = 0; d < p.data_count(); ++d) {
            const auto writers = p.writers(DataId{d});
            if (unborn[d] || p.is_initial(DataId{d}) || writers.empty() ||
                !std::all_of(writers.begin(), writers.end(), [&](OpId w) { return late[w.index] != 0; }))
                continue;
            unborn[d] = 1;
            changed = true;
            for (const OpId r : p.readers(DataId{d})) late[r.index] = 1;
        }
    }
}

[[nodiscard]] inline ForwardCuts choose_forward_cuts(const Problem& p, const Phases& ph, OpId loss,
                                                     std::size_t count) {
    ForwardCuts out;
    if (count == 0) return out;
    const auto& pos = ph.order.pos;
    // A data written before the loss (by ops that can run): its writers' span in Checkmate's
    // topological order. An edge d → e needs every writer of e to read d and to come after
    // every writer of d (a cycle is left out: fewer edges claim less, so the cuts stay true).
    std::vector<std::size_t> first(p.data_count(), none), last(p.data_count(), 0);
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const auto writers = p.writers(DataId{d});
        if (p.is_initial(DataId{d}) || writers.empty()) continue;
        const bool before_loss = std::all_of(writers.begin(), writers.end(), [&](OpId w) {
            return ph.can_run[w.index] && !ph.after_loss_op[w.index];
        });
        if (!before_loss) continue;
        for (const OpId w : writers) {
            first[d] = std::min(first[d], pos[w.index]);
            last[d] = std::max(last[d], pos[w.index]);
        }
    }
    std::vector<std::size_t> by_first;
    for (std::size_t d = 0; d < p.data_count(); ++d)
        if (first[d] != none) by_first.push_back(d);
    std::sort(by_first.begin(), by_first.end(), [&](std::size_t x, std::size_t y) { return first[x] < first[y]; });
    // The longest chain of such edges into a data the loss reads.
    std::vector<std::size_t> length(p.data_count(), 0), previous(p.data_count(), none);
    for (const std::size_t e : by_first) {
        length[e] = 1;
        for (const DataId d : detail::bounds::common_reads(p, DataId{e})) {
            if (first[d.index] == none || last[d.index] >= first[e] || length[d.index] + 1 <= length[e]) continue;
            length[e] = length[d.index] + 1;
            previous[e] = d.index;
        }
    }
    std::size_t end = none;
    for (const DataId d : p.op(loss).reads)
        if (first[d.index] != none && (end == none || length[d.index] > length[end])) end = d.index;
    std::vector<DataId> chain;
    for (std::size_t d = end; d != none; d = previous[d]) chain.push_back(DataId{d});
    std::reverse(chain.begin(), chain.end());
    const std::size_t taken = std::min(count, chain.size());
    for (std::size_t j = 1; j <= taken; ++j) {
        const DataId at = chain[j * chain.size() / taken - 1];
        if (out.data.empty() || out.data.back() != at) out.data.push_back(at);
    }
    out.late.resize(out.data.size());
    out.unborn.resize(out.data.size());
    for (std::size_t j = 0; j < out.data.size(); ++j) mark_after_first_write(p, out.data[j], out.late[j], out.unborn[j]);
    return out;
}

// The time of the exactly-once ops, each run once.
[[nodiscard]] inline double exactly_once_time(const Problem& p) {
    double total = 0.0;
    for (const Op& op : p.all_ops())
        if (op.exactly_once) total += op.time;
    return total;
}

// What every schedule runs anyway: each exactly-once op once, and before the loss a writer of
// each data the loss needs (the loss's reads, and what all writers of such a data read), the
// writer's time shared among the needed data it writes. Data with an exactly-once writer are
// left out: that op is already counted.
[[nodiscard]] inline double time_run_anyway(const Problem& p, const std::optional<OpId>& loss) {
    double total = exactly_once_time(p);
    std::vector<char> needed(p.data_count(), 0);
    std::vector<std::size_t> stack;
    const auto need = [&](DataId d) {
        if (p.is_initial(d) || needed[d.index]) return;
        needed[d.index] = 1;
        stack.push_back(d.index);
    };
    if (loss) {
        for (const DataId d : p.op(*loss).reads) need(d);
    } else {
        for (const Op& op : p.all_ops())
            if (op.exactly_once)
                for (const DataId d : op.reads) need(d);
        for (const DataId d : p.final_data()) need(d);
    }
    while (!stack.empty()) {
        const DataId d{stack.back()};
        stack.pop_back();
        if (!p.writers(d).empty())
            for (const DataId r : detail::bounds::common_reads(p, d)) need(r);
    }
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const auto writers = p.writers(DataId{d});
        if (!needed[d] || writers.empty()) continue;
        double least = std::numeric_limits<double>::infinity();
        for (const OpId w : writers) {
            const Op& op = p.op(w);
            if (op.exactly_once) {
                least = 0.0;
                break;
            }
            const auto shared = std::count_if(op.writes.begin(), op.writes.end(), [&](DataId x) { return needed[x.index]; });
            least = std::min(least, op.time / static_cast<double>(shared));
        }
        total += least;
    }
    return total;
}

// The relaxation's variables: k[cut][data] and r[cut][op] where they exist, the cuts being the
// forward cuts (the first `forward` of them), the loss and the cuts after it; with forward
// cuts, also r[op] before the first of them (`start`).
struct Variables {
    std::vector<std::vector<std::optional<milp::Var>>> live, runs;
    std::vector<std::optional<milp::Var>> start;
    std::size_t forward = 0;
};

// What can still matter from the start of `cut` on: the data read by an exactly-once op that
// may run then or later (the cut itself included; not one that must run before it) or final,
// and, transitively, the ops before the loss that write such a data and the data they read.
// Every other k and r of that cut is left out (fixed to 0): mapping a schedule onto the
// relaxation with those set to 0 breaks no row (a data useful at a later cut is useful at this
// one, as "must run before" only grows along the cuts; the writers and reads of a useful data
// are useful), so the bound stays a bound, and the later cuts, deep in the backward, get far
// fewer variables. `through_writers_after_loss` also follows the writers that run only after
// the loss (not variables of the relaxation), and the data they read: everything a
// continuation from the cut may read (bounds/loss_state_bound.hpp checks that the relaxation
// tracks all of it at the loss).
struct Useful {
    std::vector<char> data, ops;
};

[[nodiscard]] inline Useful useful_from(const Problem& p, const Phases& ph, OpId cut,
                                        bool through_writers_after_loss = false) {
    Useful u{std::vector<char>(p.data_count(), 0), std::vector<char>(p.op_count(), 0)};
    std::vector<std::size_t> stack;
    const auto use = [&](DataId d) {
        if (u.data[d.index]) return;
        u.data[d.index] = 1;
        stack.push_back(d.index);
    };
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        const Op& op = p.op(OpId{k});
        if (!op.exactly_once || !ph.can_run[k]) continue;
        if (OpId{k} != cut && must_precede(ph, OpId{k}, cut)) continue;  // it has run by then
        for (const DataId d : op.reads) use(d);
    }
    for (const DataId d : p.final_data()) use(d);
    while (!stack.empty()) {
        const DataId d{stack.back()};
        stack.pop_back();
        for (const OpId w : p.writers(d)) {
            if (u.ops[w.index] || !ph.can_run[w.index] || (ph.after_loss_op[w.index] && !through_writers_after_loss))
                continue;
            u.ops[w.index] = 1;
            for (const DataId r : p.op(w).reads) use(r);
        }
    }
    return u;
}

[[nodiscard]] inline Variables add_variables(milp::Model& model, const Problem& p, const Phases& ph,
                                             const std::vector<OpId>& cuts, const ForwardCuts& forward) {
    Variables v;
    v.forward = forward.data.size();
    const std::size_t n = v.forward + cuts.size();
    v.live.assign(n, std::vector<std::optional<milp::Var>>(p.data_count()));
    v.runs.assign(n, std::vector<std::optional<milp::Var>>(p.op_count()));
    // An exactly-once op before the loss is counted once already; a run after costs nothing more here.
    const auto add_run = [&](std::size_t k) { return model.add_binary(p.op(OpId{k}).exactly_once ? 0.0 : p.op(OpId{k}).time); };
    // At forward cut j, its unborn data do not exist yet, and its late ops run after it.
    const auto runs_before = [&](std::size_t j, std::size_t k) { return j >= v.forward || !forward.late[j][k]; };
    // Before the loss, what can still matter is what matters from the loss on: the forward
    // cuts share the loss's.
    const Useful from_loss = useful_from(p, ph, cuts.front());
    for (std::size_t i = 0; i < n; ++i) {
        const Useful useful = i <= v.forward ? from_loss : useful_from(p, ph, cuts[i - v.forward]);
        for (std::size_t d = 0; d < p.data_count(); ++d)
            if (useful.data[d] && !ph.after_loss_data[d] && !p.is_initial(DataId{d}) &&
                (i >= v.forward || !forward.unborn[i][d]))
                v.live[i][d] = model.add_binary();
        for (std::size_t k = 0; k < p.op_count(); ++k)
            if (useful.ops[k] && ph.can_run[k] && !ph.after_loss_op[k] && runs_before(i + 1, k)) v.runs[i][k] = add_run(k);
        if (i == 0 && v.forward > 0) {
            v.start.resize(p.op_count());
            for (std::size_t k = 0; k < p.op_count(); ++k)
                if (useful.ops[k] && ph.can_run[k] && !ph.after_loss_op[k] && runs_before(0, k)) v.start[k] = add_run(k);
        }
    }
    return v;
}

// Terms of "d is written between cut `first` and cut `last` (inclusive)", by a writer other than `self`.
[[nodiscard]] inline std::vector<milp::Term> written(const Problem& p, const Variables& v, DataId d, std::size_t first,
                                                     std::size_t last, std::size_t self = none) {
    std::vector<milp::Term> terms;
    for (std::size_t i = first; i <= last; ++i)
        for (const OpId w : p.writers(d))
            if (v.runs[i][w.index] && w.index != self) terms.push_back({*v.runs[i][w.index], 1.0});
    return terms;
}

// Terms of "d is written before the first forward cut", by a writer other than `self`.
[[nodiscard]] inline std::vector<milp::Term> written_at_start(const Problem& p, const Variables& v, DataId d,
                                                              std::size_t self = none) {
    std::vector<milp::Term> terms;
    for (const OpId w : p.writers(d))
        if (v.start[w.index] && w.index != self) terms.push_back({*v.start[w.index], 1.0});
    return terms;
}

// "live ≤ written": a data live at a cut that did not exist at the one before (or at the start)
// was written in between; an op that runs reads what was live or was written before it.
inline void add_written_row(milp::Model& model, std::vector<milp::Term> terms, milp::Var needs) {
    terms.push_back({needs, -1.0});
    model.add_row(std::move(terms), milp::Sense::greater_equal, 0.0);
}

// The rows of the forward cuts that the other cuts do not have: before the first, nothing but
// the initial data is live; at each, a writer of its data runs (the first write).
inline void add_start_rows(milp::Model& model, const Problem& p, const Variables& v, const ForwardCuts& forward) {
    if (v.forward == 0) return;
    for (std::size_t d = 0; d < p.data_count(); ++d)
        if (v.live[0][d]) add_written_row(model, written_at_start(p, v, DataId{d}), *v.live[0][d]);
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        if (!v.start[k]) continue;
        for (const DataId d : p.op(OpId{k}).reads)
            if (!p.is_initial(d)) add_written_row(model, written_at_start(p, v, d, k), *v.start[k]);
    }
    for (std::size_t j = 0; j < v.forward; ++j) {
        auto terms = written(p, v, forward.data[j], j, j);
        // Without a writer to run there (a graph no schedule can run), claim nothing.
        if (!terms.empty()) model.add_row(std::move(terms), milp::Sense::greater_equal, 1.0);
    }
}

// Bytes that must be live when `cut` starts beyond the variables: the initial data, the
// after-loss data the cut reads or that an exactly-once op already run wrote for a later op
// or the end, and the cut's own new writes and overhead.
[[nodiscard]] inline Bytes forced_bytes(const Problem& p, const Phases& ph, OpId cut) {
    const Op& op = p.op(cut);
    Bytes total = p.initial_bytes() + op.overhead;
    std::vector<char> counted(p.data_count(), 0);
    const auto count = [&](DataId d) {
        if (p.is_initial(d) || counted[d.index]) return;
        counted[d.index] = 1;
        total += p.data(d).bytes;
    };
    for (const DataId d : op.reads)
        if (ph.after_loss_data[d.index]) count(d);
    for (const DataId d : op.writes) {
        const auto writers = p.writers(d);
        if (writers.size() == 1 && std::find(op.reads.begin(), op.reads.end(), d) == op.reads.end()) count(d);
    }
    for (std::size_t d = 0; d < p.data_count(); ++d) {
        const DataId id{d};
        if (!ph.after_loss_data[d] || counted[d]) continue;
        const auto writers = p.writers(id);
        const bool written_for_good = std::all_of(writers.begin(), writers.end(), [&](OpId w) {
            return p.op(w).exactly_once && must_precede(ph, w, cut);
        });
        if (!written_for_good) continue;
        bool read_later = p.is_final(id);
        for (const OpId r : p.readers(id))
            read_later = read_later || (p.op(r).exactly_once && r != cut && must_precede(ph, cut, r));
        if (read_later) count(id);
    }
    return total;
}

// The bytes an exactly-once op after the loss holds while it runs whatever the schedule: what
// the relaxation forces at it as a cut (forced_bytes) and the data it reads.
[[nodiscard]] inline Bytes footprint(const Problem& p, const Phases& ph, OpId cut) {
    Bytes total = forced_bytes(p, ph, cut);
    std::vector<DataId> reads = p.op(cut).reads;
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (const DataId d : reads)
        if (!p.is_initial(d) && !ph.after_loss_data[d.index]) total += p.data(d).bytes;  // the others are in forced
    return total;
}

// The loss, then the `count` ops of the chain with the largest footprints, in chain order
// (ties: the earlier ones). Where little room is left beside an op, little else can stay live,
// so these are the instants that force recomputation: on a U-Net, the backward of the top
// decoder convolution holds its input, the gradient and its output at once, and the evenly
// spread cuts may all miss it (a 94-op U-Net at 40 % of P_ref: +3.6 % spread, +22.4 % here,
// the plan +26.1 %).
[[nodiscard]] inline std::vector<OpId> tightest_cuts(const Problem& p, const Phases& ph, const std::vector<OpId>& chain,
                                                     OpId loss, std::size_t count) {
    std::vector<Bytes> held(chain.size());
    for (std::size_t j = 0; j < chain.size(); ++j) held[j] = footprint(p, ph, chain[j]);
    std::vector<std::size_t> by_size(chain.size());
    for (std::size_t j = 0; j < chain.size(); ++j) by_size[j] = j;
    std::stable_sort(by_size.begin(), by_size.end(), [&](std::size_t x, std::size_t y) { return held[x] > held[y]; });
    by_size.resize(std::min(count, chain.size()));
    std::sort(by_size.begin(), by_size.end());
    std::vector<OpId> cuts{loss};
    for (const std::size_t j : by_size) cuts.push_back(chain[j]);
    return cuts;
}

// What each cut holds beyond the live variables: the bytes it forces (the initial data, its
// own new writes and overhead, …) and the data it reads, which must be live.
struct CutMemory {
    Bytes forced = 0;
    std::vector<DataId> reads;
};

[[nodiscard]] inline CutMemory op_cut_memory(const Problem& p, const Phases& ph, OpId cut) {
    return {forced_bytes(p, ph, cut), p.op(cut).reads};
}

// At the first write of a forward cut's data, one of its writers runs: the least any of them
// allocates (its unborn writes, none of which is live yet) and overhead, and the data all of
// them read.
[[nodiscard]] inline CutMemory forward_cut_memory(const Problem& p, const ForwardCuts& forward, std::size_t j) {
    const auto writers = p.writers(forward.data[j]);
    CutMemory out;
    Bytes least = std::numeric_limits<Bytes>::max();
    for (const OpId w : writers) {
        const Op& op = p.op(w);
        Bytes bytes = op.overhead;
        for (const DataId d : op.writes)
            if (forward.unborn[j][d.index]) bytes += p.data(d).bytes;
        least = std::min(least, bytes);
    }
    out.forced = p.initial_bytes() + least;
    for (const DataId d : detail::bounds::common_reads(p, forward.data[j]))
        if (!p.is_initial(d)) out.reads.push_back(d);
    return out;
}

// The last cut that must run before exactly-once op q (the loss always does), or q itself.
[[nodiscard]] inline std::size_t last_cut_before(const Phases& ph, const std::vector<OpId>& cuts, OpId q) {
    std::size_t last = 0;
    for (std::size_t i = 0; i < cuts.size(); ++i)
        if (cuts[i] == q || must_precede(ph, cuts[i], q)) last = i;
    return last;
}

// The rows listed in the header comment. False when a cut's forced bytes alone exceed the budget.
[[nodiscard]] inline bool add_rows(milp::Model& model, const Problem& p, const Phases& ph, const std::vector<OpId>& cuts,
                                   const ForwardCuts& forward, const Variables& v, Bytes budget, double unit) {
    const std::size_t n = v.live.size();
    for (std::size_t i = 0; i < n; ++i) {
        const CutMemory at = i < v.forward ? forward_cut_memory(p, forward, i) : op_cut_memory(p, ph, cuts[i - v.forward]);
        if (at.forced > budget) return false;
        std::vector<milp::Term> memory;
        for (std::size_t d = 0; d < p.data_count(); ++d)
            if (v.live[i][d]) memory.push_back({*v.live[i][d], static_cast<double>(p.data(DataId{d}).bytes) / unit});
        model.add_row(std::move(memory), milp::Sense::less_equal, static_cast<double>(budget - at.forced) / unit);
        for (const DataId d : at.reads)
            if (v.live[i][d.index]) model.add_row({{*v.live[i][d.index], 1.0}}, milp::Sense::equal, 1.0);
        // Before a forward cut, a data without a variable does not exist yet (it is initial, or
        // of no use, at the other cuts).
        const bool forward = i < v.forward;
        for (std::size_t d = 0; d < p.data_count() && i + 1 < n; ++d) {
            if (!v.live[i + 1][d]) continue;  // of no use after cut i + 1
            auto terms = written(p, v, DataId{d}, i, i);
            if (v.live[i][d]) terms.push_back({*v.live[i][d], 1.0});
            else if (!forward) continue;
            add_written_row(model, std::move(terms), *v.live[i + 1][d]);
        }
        for (std::size_t k = 0; k < p.op_count(); ++k) {
            if (!v.runs[i][k]) continue;
            for (const DataId d : p.op(OpId{k}).reads) {
                auto terms = written(p, v, d, i, i, k);
                if (v.live[i][d.index]) terms.push_back({*v.live[i][d.index], 1.0});
                else if (!forward || p.is_initial(d)) continue;
                add_written_row(model, std::move(terms), *v.runs[i][k]);
            }
        }
    }
    // Exactly-once ops after the loss (cuts included: their reads are also pinned above) and the
    // end: the data they read are live at the last cut before them or are written after it,
    // and before the first cut that must follow them: a run in a later span cannot serve them
    // (without that limit, one recomputation late in the backward counted for every op before
    // it that needs the data). One row per cut and data, with the earliest such limit.
    std::vector<std::vector<std::size_t>> until(n, std::vector<std::size_t>(p.data_count(), none));
    const auto need = [&](std::size_t i, DataId d, std::size_t last) {
        std::size_t& at = until[i][d.index];
        at = at == none ? last : std::min(at, last);
    };
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        const Op& op = p.op(OpId{k});
        if (!op.exactly_once || !ph.after_loss_op[k]) continue;
        const std::size_t before = last_cut_before(ph, cuts, OpId{k});
        std::size_t last = n - 1;
        for (std::size_t c = before + 1; c < cuts.size(); ++c)
            if (must_precede(ph, OpId{k}, cuts[c])) {
                last = v.forward + c - 1;
                break;
            }
        for (const DataId d : op.reads) need(v.forward + before, d, last);
    }
    for (const DataId d : p.final_data()) need(n - 1, d, n - 1);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t d = 0; d < p.data_count(); ++d) {
            if (until[i][d] == none || !v.live[i][d]) continue;
            auto terms = written(p, v, DataId{d}, i, until[i][d]);
            terms.push_back({*v.live[i][d], 1.0});
            model.add_row(std::move(terms), milp::Sense::greater_equal, 1.0);
        }
    return true;
}

// Memory inside the spans between cuts after the loss (TimeLowerBoundOptions::span_rows).
// Without these rows nothing limits memory between two cuts: a relaxation with few cuts keeps
// a layer's activations from one cut until their backward late in the span, while the
// backward of the layers before them recomputes its own, as no schedule has room for both.
// A data d live when cut i starts, none of whose writers runs in span i, stays live until the
// last op of the span that reads it. So while an exactly-once op e inside the span runs, d is
// live if an exactly-once op that must follow e within the span (or the next cut) reads it:
// kept[d,i] >= k[d,i] - (the writers' runs in span i), and at e, the data so held, with what e
// holds anyway (footprint), fit the budget. Each span gets rows at the `per_span` ops whose
// footprint and held data together exceed the budget the most. Where a writer of d can run
// without a run variable of the span, d gets no such variable (it may be rewritten unseen).
struct Kept {
    std::size_t span;  // the live variables' cut, from whose start the span runs
    DataId data;
    milp::Var var;
};

// The exactly-once ops after the loss that must run inside span c (after cut c, before cut c+1;
// the last span to the end), with the data some exactly-once op after each within the span
// (or the next cut) reads, that have live variables at the span's cut.
struct InsideOp {
    OpId op;
    Bytes footprint = 0;  // what the op holds whatever the schedule (footprint())
    Bytes held = 0;       // footprint plus the bytes of `reads_later`
    std::vector<DataId> reads_later;
};

[[nodiscard]] inline std::vector<InsideOp> ops_inside_span(const Problem& p, const Phases& ph,
                                                           const std::vector<OpId>& cuts, const Variables& v,
                                                           std::size_t c) {
    const std::size_t i = v.forward + c;
    const bool last = c + 1 == cuts.size();
    const auto within = [&](OpId e) {
        return p.op(e).exactly_once && ph.after_loss_op[e.index] && e != cuts[c] && must_precede(ph, cuts[c], e) &&
               (last || e == cuts[c + 1] || must_precede(ph, e, cuts[c + 1]));
    };
    std::vector<OpId> members;
    for (std::size_t k = 0; k < p.op_count(); ++k)
        if (within(OpId{k})) members.push_back(OpId{k});
    std::vector<InsideOp> out;
    for (const OpId e : members) {
        if (!last && e == cuts[c + 1]) continue;  // the next cut has its own row
        const Bytes holds = footprint(p, ph, e);
        InsideOp inside{e, holds, holds, {}};
        std::vector<char> seen(p.data_count(), 0);
        const Op& op = p.op(e);
        for (const DataId d : op.reads) seen[d.index] = 1;  // in its footprint
        for (const DataId d : op.writes) seen[d.index] = 1;  // allocated by it
        for (const OpId later : members) {
            if (!must_precede(ph, e, later)) continue;
            for (const DataId d : p.op(later).reads) {
                if (seen[d.index] || !v.live[i][d.index]) continue;
                seen[d.index] = 1;
                inside.reads_later.push_back(d);
                inside.held += p.data(d).bytes;
            }
        }
        out.push_back(std::move(inside));
    }
    return out;
}

[[nodiscard]] inline std::vector<Kept> add_span_rows(milp::Model& model, const Problem& p, const Phases& ph,
                                                     const std::vector<OpId>& cuts, const Variables& v, Bytes budget,
                                                     double unit, std::size_t per_span) {
    std::vector<Kept> out;
    if (per_span == 0) return out;
    for (std::size_t c = 0; c < cuts.size(); ++c) {
        const std::size_t i = v.forward + c;
        std::vector<InsideOp> inside = ops_inside_span(p, ph, cuts, v, c);
        std::erase_if(inside, [&](const InsideOp& e) { return e.held <= budget || e.footprint > budget; });
        std::stable_sort(inside.begin(), inside.end(), [](const InsideOp& a, const InsideOp& b) { return a.held > b.held; });
        if (inside.size() > per_span) inside.resize(per_span);
        std::vector<std::optional<milp::Var>> kept(p.data_count());
        for (const InsideOp& e : inside) {
            std::vector<milp::Term> memory;
            for (const DataId d : e.reads_later) {
                if (!kept[d.index]) {
                    const auto writers = p.writers(d);
                    if (std::any_of(writers.begin(), writers.end(),
                                    [&](OpId w) { return ph.can_run[w.index] && !v.runs[i][w.index]; }))
                        continue;
                    // A binary: with continuous ones, CBC's LP (Clp) aborted on an assertion
                    // on a 118-op encoder-decoder's loss-only relaxation.
                    kept[d.index] = model.add_binary();
                    auto terms = written(p, v, d, i, i);
                    terms.push_back({*kept[d.index], 1.0});
                    terms.push_back({*v.live[i][d.index], -1.0});
                    model.add_row(std::move(terms), milp::Sense::greater_equal, 0.0);
                    out.push_back({i, d, *kept[d.index]});
                }
                memory.push_back({*kept[d.index], static_cast<double>(p.data(d).bytes) / unit});
            }
            if (!memory.empty())
                model.add_row(std::move(memory), milp::Sense::less_equal, static_cast<double>(budget - e.footprint) / unit);
        }
    }
    return out;
}

}  // namespace detail::time_bound

}  // namespace remat
