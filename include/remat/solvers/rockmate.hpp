// remat/solvers/rockmate.hpp — Rockmate: exact schedules inside blocks, Rotor across them.
//
// Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, "Rockmate: an efficient, fast, automatic
// and generic tool for re-materialization in PyTorch", ICML 2023. The problem is cut into
// its sequence of blocks at the 1-separators (partition/blocks.hpp). Each block is solved
// by an exact block solver (Exhaustive by default; Checkmate for large blocks, see
// rockmate_milp.hpp) at a grid of peak budgets × saved budgets, and every distinct solution
// becomes an *option* of the block: its forward sub-schedule (the steps before the boundary
// op that stands for the rest of the network), its backward sub-schedule (the steps after),
// their times, what the forward leaves live and the overheads (rotor.hpp's memory model).
// The saved budget σ is imposed through the boundary's overhead (budget − σ): memory while
// the boundary runs is everything live + its writes + its overhead. A sequence solver
// (sequence_solver.hpp; the multi-option Rotor DP by default) then picks, over the chain of
// blocks, which blocks run with which option, which run without grad and where to
// checkpoint; the chosen options' sub-schedules, renamed into the whole problem, make one
// schedule, which the simulator checks. analyse() does everything that does not depend on
// the budget once (RockmateModel); solve(model, budget) then runs only the sequence solver.
//
// The mapping onto Rotor's model never underestimates: a block's data are touched only by
// its own sub-schedules (and its output separator by the next block), the gradients that
// cross a boundary are the next block's final data and this block's boundary writes, and
// Rotor's model adds up the peaks the simulator sees. Final data that a block after the
// first writes (they stay live to the end) travel down with the gradients: they are added to
// every gradient size below that block, and each backward overhead is lowered by what it
// would otherwise count twice. When the block before never reads a block's input separator
// in its backward, every option of the block frees that separator right after its own last
// read (RotorOption allows a forward to free its input); Rotor's model then still counts the
// separator from the end of the block's backward until the block before runs its backward —
// the one place where it overestimates, so that storing everything can need slightly more
// than the store-all peak. Blocks with the same structure and sizes are solved once; the
// others' options are the same sub-schedules with their own times (BlockSharing).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/progress.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "../core/time_bounded.hpp"
#include "../core/timing.hpp"
#include "../graph/structure_key.hpp"
#include "../partition/blocks.hpp"
#include "exhaustive.hpp"
#include "fast_forward.hpp"
#include "greedy.hpp"
#include "rotor.hpp"
#include "sequence_solver.hpp"
#include "store_all.hpp"

namespace remat {

/// Which blocks share one solve.
enum class BlockSharing {
    none,        ///< every block is solved
    same_costs,  ///< blocks equal up to renaming, times included
    same_sizes,  ///< blocks equal up to renaming except for times: solved once, options re-timed
};

struct RockmateOptions {
    /// Peak budgets per block, evenly from the block's least peak to its store-all peak.
    /// 8 × 8 is the default because on the 12-layer GPT-2-like problem of bench_rockmate it
    /// cuts the overhead at 30-45 % of the store-all peak by 1.5-3 points against 5 × 5 for
    /// ~10 % more analysis time (points inside a solved option's range are skipped).
    std::size_t peak_budgets = 8;
    /// Saved budgets per peak budget, evenly from the least the boundary needs to what the
    /// block's store-all keeps.
    std::size_t saved_budgets = 8;
    /// Wall-clock limit for the grid of one block; the options found by then are kept
    /// (the store-all option always is). One block solve is bounded by the block solver's own limit.
    double block_time_limit_seconds = 20.0;
    /// Wall-clock limit for the whole analysis, if any. Each block gets an even share of
    /// what is left when its turn comes (at most block_time_limit_seconds), so the time a
    /// quick or shared block leaves passes to the blocks after it.
    std::optional<double> time_limit_seconds;
    /// Each block gets only its store-all option: Rotor over blocks, each block one stage.
    bool store_all_only = false;
    BlockSharing sharing = BlockSharing::same_sizes;
    /// Where blocks are cut (partition_blocks).
    PartitionOptions partition{};
    /// Receives one line per analysed block (and time limits hit); empty means silence.
    ProgressCallback progress;
};

/// One way to run a block: a forward and a backward sub-schedule in the block problem's ids.
struct RockmateBlockOption {
    RotorOption cost;
    Schedule forward;
    Schedule backward;
};

/// A block with what Rockmate knows about it.
struct RockmateBlock {
    BlockProblem problem;  ///< boundary overhead 0
    /// Computes the output separator without grad and frees the rest (not for the last block).
    Schedule nograd;
    double nograd_time = 0.0;
    Bytes nograd_overhead = 0;
    std::vector<RockmateBlockOption> options;
    /// The block whose solve these options come from, when it is another one.
    std::optional<std::size_t> same_as;
    std::size_t solves = 0;         ///< block-solver calls that returned a schedule
    std::size_t failed_solves = 0;  ///< infeasible grid points and solver failures
    /// The first block-solver failure other than an infeasible budget, if any.
    std::string failure;
    double seconds = 0.0;
};

/// Everything Rockmate derives from a problem before the budget comes in: reusable at any
/// budget (Rockmate::solve(model, budget)).
struct RockmateModel {
    Problem problem;
    BlockPartition partition;
    std::vector<RockmateBlock> blocks;
    double seconds = 0.0;

    /// The chain Rotor plans: one stage per block; the last stage (the block that ends at
    /// the loss) has an output of 0 bytes, and Rotor's loss action is empty (the loss is in
    /// that block's backward sub-schedule).
    [[nodiscard]] RotorChain rotor_chain() const {
        const std::size_t n = blocks.size();
        // kept[l]: final data block l leaves live besides what it hands to the block before;
        // above[l]: those of the blocks after l, live whenever g_l is.
        std::vector<Bytes> kept(n, 0), above(n + 1, 0);
        for (std::size_t l = 0; l < n; ++l) {
            const BlockProblem& bp = blocks[l].problem;
            const auto& in = partition.blocks[l].input_grads;
            for (const DataId d : bp.problem.final_data()) {
                const auto global = bp.global_data[d.index];
                if (!global || std::find(in.begin(), in.end(), *global) == in.end()) kept[l] += bp.problem.data(d).bytes;
            }
        }
        for (std::size_t l = n; l-- > 0;) above[l] = above[l + 1] + (l + 1 < n ? kept[l + 1] : 0);
        RotorChain chain{problem.name(), problem.initial_bytes(), {}, 0.0, 0, std::nullopt};
        chain.input_grad_bytes = total(partition.blocks.front().input_grads) + above[0] + kept[0];
        for (std::size_t l = 0; l < n; ++l) {
            const Block& b = partition.blocks[l];
            const RockmateBlock& rb = blocks[l];
            RotorStage stage{b.output ? problem.data(*b.output).bytes : 0, rb.nograd_time, rb.nograd_overhead, {},
                             b.output ? total(b.output_grads) + above[l] : 0};
            const Bytes y_in = l == 0 ? *chain.input_grad_bytes : chain.stages[l - 1].grad_bytes.value_or(0);
            for (const RockmateBlockOption& o : rb.options) {
                RotorOption c = o.cost;
                c.bwd_overhead = std::max({c.bwd_overhead - kept[l] - above[l], -y_in, -(c.saved_bytes + *stage.grad_bytes)});
                stage.options.push_back(c);
            }
            chain.stages.push_back(std::move(stage));
        }
        return chain;
    }

    /// The whole problem's schedule of a Rotor action sequence over rotor_chain().
    [[nodiscard]] Schedule to_schedule(const std::vector<RotorAction>& actions) const {
        Schedule out;
        // A block input that the next block's forward freed early is not freed again.
        std::vector<char> live(problem.data_count(), 0);
        for (const DataId d : problem.initial()) live[d.index] = 1;
        const auto free = [&](DataId d) {
            if (!live[d.index]) return;
            live[d.index] = 0;
            out.push_back(Step::free(d));
        };
        const auto append = [&](const RockmateBlock& rb, const Schedule& part) {
            for (const Step& s : part) {
                if (s.is_run()) {
                    const auto op = rb.problem.global_op.at(s.op().index);
                    if (!op)
                        throw SolverError("rockmate: a sub-schedule of '" + rb.problem.problem.name() +
                                          "' runs the boundary op (this is a bug in the solver; please report it)");
                    out.push_back(Step::run(*op));
                    for (const DataId d : problem.op(*op).writes) live[d.index] = 1;
                } else if (const auto d = rb.problem.global_data.at(s.data().index)) {
                    free(*d);
                }
            }
        };
        for (const RotorAction& a : actions) {
            using K = RotorAction::Kind;
            switch (a.kind) {
                case K::forward_nograd: append(blocks.at(a.stage - 1), blocks[a.stage - 1].nograd); break;
                case K::forward: append(blocks.at(a.stage - 1), blocks[a.stage - 1].options.at(a.option).forward); break;
                case K::backward: append(blocks.at(a.stage - 1), blocks[a.stage - 1].options.at(a.option).backward); break;
                case K::loss: break;
                case K::free_activation:
                    // The last block has no output (0 bytes in the chain): nothing to free.
                    if (const auto& out = partition.blocks.at(a.stage - 1).output) free(*out);
                    break;
            }
        }
        return out;
    }

private:
    [[nodiscard]] Bytes total(const std::vector<DataId>& data) const {
        Bytes sum = 0;
        for (const DataId d : data) sum += problem.data(d).bytes;
        return sum;
    }
};

namespace detail::rockmate {

[[nodiscard]] inline Bytes bytes_of(const Problem& q, const std::vector<DataId>& data) {
    Bytes sum = 0;
    for (const DataId d : data) sum += q.data(d).bytes;
    return sum;
}

// The option a complete schedule of a block problem gives: split at the boundary, tidy
// at the end, costs in the memory model of rotor.hpp (see RotorOption). `freeable_input` is
// the block's input separator (local id) when nothing outside the block reads it once the
// block's forward has run: the option then frees it right after its last read (in the
// forward or in the backward part), and accounts for that.
[[nodiscard]] inline RockmateBlockOption option_from(const BlockProblem& bp, const Block& block, const Schedule& schedule,
                                                     std::optional<DataId> freeable_input) {
    const Problem& q = bp.problem;
    const SimulationReport r = simulate(q, schedule);
    if (!r.valid)
        throw SolverError("rockmate: the block solver returned an invalid schedule for '" + q.name() + "': " + r.error);
    std::size_t k = 0;
    while (k < schedule.size() && !(schedule[k].is_run() && schedule[k].op() == bp.boundary)) ++k;
    // The synthetic boundary stands for the rest of the network: neither part runs it; the
    // loss is real and starts the backward part.
    const bool loss_boundary = block.has_loss;
    const std::size_t bwd_begin = loss_boundary ? k : k + 1;
    // The input goes right after step `last_read` (before the first step when none reads it).
    const bool free_input = freeable_input.has_value();
    std::optional<std::size_t> last_read;
    if (free_input)
        for (std::size_t i = 0; i < schedule.size(); ++i) {
            if (!schedule[i].is_run()) continue;
            const auto& rd = q.op(schedule[i].op()).reads;
            if (std::find(rd.begin(), rd.end(), *freeable_input) != rd.end()) last_read = i;
        }
    const Bytes x_in = free_input ? q.data(*freeable_input).bytes : 0;
    const auto gone_before = [&](std::size_t i) { return free_input && (!last_read || *last_read < i) ? x_in : Bytes{0}; };
    const auto gone_after = [&](std::size_t i) { return free_input && (!last_read || *last_read <= i) ? x_in : Bytes{0}; };

    RockmateBlockOption o;
    if (free_input && !last_read) o.forward.push_back(Step::free(*freeable_input));
    for (std::size_t i = 0; i < schedule.size(); ++i) {
        if (i == k && !loss_boundary) continue;
        Schedule& part = i < k ? o.forward : o.backward;
        part.push_back(schedule[i]);
        if (free_input && last_read == i) part.push_back(Step::free(*freeable_input));
    }
    // Tidy: the backward ends with only the initial and final data live.
    {
        std::vector<char> live(q.data_count(), 0);
        for (const DataId d : q.initial()) live[d.index] = 1;
        for (const Step& s : schedule) {
            if (s.is_run())
                for (const DataId d : q.op(s.op()).writes) live[d.index] = 1;
            else
                live[s.data().index] = 0;
        }
        for (std::size_t d = 0; d < q.data_count(); ++d)
            if (live[d] && !q.is_initial(DataId{d}) && !q.is_final(DataId{d})) o.backward.push_back(Step::free(DataId{d}));
    }
    const Bytes start = r.initial;
    const Bytes at_boundary = k == 0 ? start - (free_input && !last_read ? x_in : 0) : r.timeline[k - 1].after - gone_after(k - 1);
    Bytes fwd_peak = start;
    double fwd_time = 0.0, bwd_time = 0.0;
    for (std::size_t i = 0; i < k; ++i) {
        fwd_peak = std::max({fwd_peak, r.timeline[i].during - gone_before(i), r.timeline[i].after - gone_after(i)});
        if (schedule[i].is_run()) fwd_time += q.op(schedule[i].op()).time;
    }
    const Bytes grad_out = loss_boundary ? 0 : bytes_of(q, q.op(bp.boundary).writes);
    Bytes bwd_peak = at_boundary + grad_out;
    for (std::size_t i = bwd_begin; i < schedule.size(); ++i) {
        bwd_peak = std::max({bwd_peak, r.timeline[i].during - gone_before(i), r.timeline[i].after - gone_after(i)});
        if (schedule[i].is_run()) bwd_time += q.op(schedule[i].op()).time;
    }
    Bytes grad_in = 0;
    for (std::size_t d = 0; d < q.data_count(); ++d) {
        const auto global = bp.global_data[d];
        if (global && std::find(block.input_grads.begin(), block.input_grads.end(), *global) != block.input_grads.end())
            grad_in += q.data(DataId{d}).bytes;
    }
    // Rotor's model ends the backward with the input live again (it is freed for it by the
    // block before, or by a free_activation): a freed input makes that state an overestimate,
    // and the backward's peak is counted no lower than it.
    bwd_peak = std::max(bwd_peak, start + grad_in);
    o.cost.fwd_time = fwd_time;
    o.cost.bwd_time = bwd_time;
    o.cost.saved_bytes = at_boundary - start;
    o.cost.fwd_overhead = fwd_peak - at_boundary;
    o.cost.bwd_overhead = bwd_peak - (at_boundary + grad_out) - grad_in;
    return o;
}

// The block's input separator (local id) when the block before never reads it in its
// backward: then only this block needs it once its forward has run.
[[nodiscard]] inline std::optional<DataId> freeable_input(const BlockPartition& part, std::size_t l, const BlockProblem& bp,
                                                          const Problem& problem) {
    const Block& block = part.blocks[l];
    if (!block.input || l == 0) return std::nullopt;
    for (const OpId k : part.blocks[l - 1].backward_ops) {
        const auto& rd = problem.op(k).reads;
        if (std::find(rd.begin(), rd.end(), *block.input) != rd.end()) return std::nullopt;
    }
    for (std::size_t d = 0; d < bp.global_data.size(); ++d)
        if (bp.global_data[d] == block.input) return DataId{d};
    return std::nullopt;
}

// Duplicates and options that another option beats on time and on every memory term of the DP.
inline void prune(std::vector<RockmateBlockOption>& options) {
    const auto fwd = [](const RotorOption& c) { return c.saved_bytes + c.fwd_overhead; };
    const auto bwd = [](const RotorOption& c) { return c.saved_bytes + c.bwd_overhead; };
    const auto time = [](const RotorOption& c) { return c.fwd_time + c.bwd_time; };
    const auto no_worse = [&](const RotorOption& a, const RotorOption& b) {
        return time(a) <= time(b) && a.saved_bytes <= b.saved_bytes && fwd(a) <= fwd(b) && bwd(a) <= bwd(b);
    };
    std::vector<RockmateBlockOption> kept;
    for (std::size_t i = 0; i < options.size(); ++i) {
        bool beaten = false;
        for (std::size_t j = 0; j < options.size() && !beaten; ++j) {
            if (i == j || !no_worse(options[j].cost, options[i].cost)) continue;
            // Equal options: the first one stays.
            beaten = !no_worse(options[i].cost, options[j].cost) || j < i;
        }
        if (!beaten) kept.push_back(std::move(options[i]));
    }
    std::sort(kept.begin(), kept.end(), [&](const RockmateBlockOption& a, const RockmateBlockOption& b) {
        return time(a.cost) < time(b.cost) || (time(a.cost) == time(b.cost) && a.cost.saved_bytes < b.cost.saved_bytes);
    });
    options = std::move(kept);
}

// The block's output computed without grad (fast_forward.hpp): the schedule (block ids),
// its time and its overhead in Rotor's sense.
struct NogradForward {
    Schedule schedule;
    double time = 0.0;
    Bytes overhead = 0;
};

[[nodiscard]] inline NogradForward nograd_forward(const BlockProblem& bp, const Block& block) {
    NogradForward out;
    if (!block.output) return out;
    const Problem& q = bp.problem;
    std::optional<DataId> target;
    for (std::size_t d = 0; d < q.data_count(); ++d)
        if (bp.global_data[d] == block.output) target = DataId{d};
    const DataId targets[] = {target.value()};
    out.schedule = remat::detail::fast_forward(q, targets, "rockmate");
    bool written = q.is_initial(*target);
    for (const Step& step : out.schedule) {
        if (!step.is_run()) continue;
        const Op& op = q.op(step.op());
        out.time += op.time;
        written = written || std::find(op.writes.begin(), op.writes.end(), *target) != op.writes.end();
    }
    // Memory along the way: the simulator on the partial schedule (it reports the
    // exactly-once ops that never ran only after the last step).
    const SimulationReport r = simulate(q, out.schedule);
    if (r.timeline.size() != out.schedule.size() || !written)
        throw SolverError("rockmate: the no-grad forward of '" + q.name() + "' is not runnable: " + r.error +
                          " (this is a bug in the solver; please report it)");
    Bytes peak = r.initial;
    for (const TimelinePoint& t : r.timeline) peak = std::max({peak, t.during, t.after});
    out.overhead = peak - (r.initial + q.data(*target).bytes);
    return out;
}

// The least peak of a block problem, from the block solver when it can tell.
template <class S>
[[nodiscard]] std::optional<Bytes> least_peak(const S& solver, const Problem& q) {
    try {
        if constexpr (requires { { solver.smallest_budget(q) } -> std::convertible_to<Bytes>; }) {
            return solver.smallest_budget(q);
        } else {
            (void)solver.solve(q, q.initial_bytes() - 1);
        }
    } catch (const Infeasible& e) {
        return e.smallest_budget();
    } catch (const Error&) {
    }
    return std::nullopt;
}

}  // namespace detail::rockmate

/// The Rockmate solver. `BlockSolver` is any remat::Solver used on the blocks; it should be
/// exact (its options are Rockmate's building blocks) and fast on problems of a few dozen data.
/// `Across` plans the chain of blocks (SequenceSolver): Rotor's multi-option DP by default,
/// configured by the Rotor object passed in (its RotorOptions: slots, time limit).
/// The block solver defaults to the exact search because this header needs only the standard
/// library; the paper's Checkmate blocks (integer programming) are RockmateMilp in
/// rockmate_milp.hpp, which needs a MILP backend.
template <Solver BlockSolver = Exhaustive, SequenceSolver Across = Rotor>
class Rockmate {
public:
    explicit Rockmate(RockmateOptions options = {}, BlockSolver block_solver = BlockSolver(),
                      Across sequence_solver = Across())
        : options_(std::move(options)),
          block_solver_(std::move(block_solver)),
          sequence_solver_(std::move(sequence_solver)) {
        if (options_.peak_budgets == 0 || options_.saved_budgets == 0)
            throw InvalidInput("rockmate: peak_budgets and saved_budgets must be at least 1");
        if (!(options_.block_time_limit_seconds >= 0))
            throw InvalidInput("rockmate: block_time_limit_seconds must be >= 0");
        if (options_.time_limit_seconds && !(*options_.time_limit_seconds >= 0))
            throw InvalidInput("rockmate: time_limit_seconds must be >= 0");
    }

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "rockmate"; }
    [[nodiscard]] const RockmateOptions& options() const noexcept { return options_; }
    [[nodiscard]] const BlockSolver& block_solver() const noexcept { return block_solver_; }
    [[nodiscard]] const Across& sequence_solver() const noexcept { return sequence_solver_; }

    /// Blocks and their options: everything that does not depend on the budget.
    [[nodiscard]] RockmateModel analyse(const Problem& problem) const {
        const auto start = std::chrono::steady_clock::now();
        BlockPartition partition = partition_blocks(problem, options_.partition);
        RockmateModel model{problem, std::move(partition), {}, 0.0};
        const BlockPartition& part = model.partition;
        const std::size_t n = part.blocks.size();
        std::vector<std::vector<std::int64_t>> keys;
        for (std::size_t l = 0; l < n; ++l) {
            const auto block_start = std::chrono::steady_clock::now();
            const Block& block = part.blocks[l];
            BlockProblem bp = block_problem(problem, part, l);
            const std::optional<DataId> freeable = detail::rockmate::freeable_input(part, l, bp, problem);
            std::vector<std::int64_t> key;
            std::optional<std::size_t> same_as;
            if (options_.sharing != BlockSharing::none) {
                key = graph::structure_key(bp.problem, options_.sharing == BlockSharing::same_costs);
                key.push_back(freeable ? static_cast<std::int64_t>(freeable->index) : -1);
                for (std::size_t r = 0; r < l && !same_as; ++r)
                    if (keys[r] == key && !model.blocks[r].same_as) same_as = r;
            }
            keys.push_back(std::move(key));
            const detail::rockmate::NogradForward nograd = detail::rockmate::nograd_forward(bp, block);
            RockmateBlock rb{std::move(bp), nograd.schedule, nograd.time, nograd.overhead, {}, same_as, 0, 0, {}, 0.0};
            if (same_as) {
                rb.options = retimed(model.blocks[*same_as].options, rb.problem.problem);
            } else {
                solve_block(problem, part, l, rb, freeable, block_time_limit(seconds_since(start), n - l));
            }
            rb.seconds = seconds_since(block_start);
            if (options_.progress)
                options_.progress("rockmate: block " + std::to_string(l + 1) + "/" + std::to_string(n) + " (" +
                                  std::to_string(block.forward_ops.size()) + " forward, " +
                                  std::to_string(block.backward_ops.size()) + " backward ops): " +
                                  std::to_string(rb.options.size()) + " options" +
                                  (same_as ? " (as block " + std::to_string(*same_as + 1) + ")"
                                           : " from " + std::to_string(rb.solves) + " solves") +
                                  " in " + std::to_string(rb.seconds) + " s");
            model.blocks.push_back(std::move(rb));
        }
        model.seconds = seconds_since(start);
        return model;
    }

    /// The smallest budget Rockmate can plan for (with these options).
    [[nodiscard]] Bytes smallest_budget(const RockmateModel& model) const {
        return sequence_smallest_budget(sequence_solver_, model.rotor_chain());
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const { return smallest_budget(analyse(problem)); }

    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const RockmateModel model = analyse(problem);
        Plan plan = solve(model, budget);
        plan.stats.solve_seconds = seconds_since(start);
        return plan;
    }

    /// Plans at `budget` with a model from analyse() (solve time: the sequence solver only).
    [[nodiscard]] Plan solve(const RockmateModel& model, Bytes budget) const {
        const auto start = std::chrono::steady_clock::now();
        const RotorChain chain = model.rotor_chain();
        const std::string across(sequence_solver_.name());
        RotorSequence seq;
        try {
            seq = sequence_plan(sequence_solver_, chain, budget);
        } catch (const Infeasible& e) {
            const std::optional<Bytes> least =
                e.smallest_budget() ? std::optional<Bytes>(*e.smallest_budget()) : std::nullopt;
            throw Infeasible("rockmate needs at least " + (least ? std::to_string(*least) : std::string("more")) +
                                 " bytes for '" + model.problem.name() + "' (" + std::to_string(model.blocks.size()) +
                                 " blocks), above the budget of " + std::to_string(budget) + " bytes",
                             budget, least);
        } catch (const Error& e) {
            // The sequence solver stopped at one of its caps (Rotor's table memory, its time
            // limit): the best plan known is the greedy's.
            return stopped(model.problem, budget, e.what(), start);
        }
        // The sequence solver is a plug-in: its answer is checked in its own model before
        // its actions index the blocks' options.
        const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
        if (!ev.valid || ev.peak > budget)
            throw SolverError("rockmate: the sequence solver '" + across + "' returned " +
                              (ev.valid ? "a plan of peak " + std::to_string(ev.peak) + " bytes above the budget of " +
                                              std::to_string(budget)
                                        : "an invalid plan (" + ev.error + ")") +
                              " for the blocks of '" + model.problem.name() + "'; fix that solver");
        // An option may free its block's input itself, which Rotor's model counts through a
        // negative saved size while the input stays "live" there: freeing that input again
        // while the block holds its saved data would be counted twice. Rotor's DP never does
        // (it frees a checkpoint only once the part above it is back-propagated).
        std::vector<char> holds(chain.length() + 2, 0);
        for (const RotorAction& a : seq.actions) {
            if (a.kind == RotorAction::Kind::forward) holds[a.stage] = 1;
            if (a.kind == RotorAction::Kind::backward) holds[a.stage] = 0;
            if (a.kind == RotorAction::Kind::free_activation && holds[a.stage + 1])
                throw SolverError("rockmate: the sequence solver '" + across + "' frees the input of block " +
                                  std::to_string(a.stage + 1) + " of '" + model.problem.name() +
                                  "' while that block holds its saved data; Rockmate's blocks need the sequences "
                                  "of sequence_solver.hpp (fix that solver)");
        }
        std::size_t total_options = 0;
        for (const RockmateBlock& b : model.blocks) total_options += b.options.size();
        SolverStats stats{std::string(name()), 0.0, SolveStatus::feasible, std::nullopt,
                          std::string("blocks=") + std::to_string(model.blocks.size()) + " options=" + std::to_string(total_options) +
                              " grid=" + std::to_string(options_.peak_budgets) + "x" +
                              std::to_string(options_.saved_budgets) + (options_.store_all_only ? " store-all-only" : "") +
                              " across=" + across + " slot_bytes=" + std::to_string(seq.slot_bytes)};
        Schedule schedule = model.to_schedule(seq.actions);
        stats.solve_seconds = seconds_since(start);
        return make_checked_plan(model.problem, std::move(schedule), budget, std::move(stats));
    }

private:
    // The greedy's plan when the sequence solver stopped at a cap, saying so; a clear error
    // when the greedy has no plan either.
    [[nodiscard]] Plan stopped(const Problem& problem, Bytes budget, const std::string& why,
                               std::chrono::steady_clock::time_point start) const {
        try {
            Plan plan = Greedy{}.solve(problem, budget);
            plan.stats.solver = std::string(name());
            plan.stats.status = SolveStatus::heuristic;
            plan.stats.options = "the sequence solver stopped (" + why + "); returned the greedy's plan";
            plan.stats.solve_seconds = seconds_since(start);
            return plan;
        } catch (const Infeasible&) {
            throw SolverError("rockmate on '" + problem.name() + "': the sequence solver stopped (" + why +
                              ") and the greedy has no plan within " + std::to_string(budget) + " bytes either");
        }
    }

    // The same sub-schedules with the times of another block of the same structure and sizes.
    [[nodiscard]] static std::vector<RockmateBlockOption> retimed(const std::vector<RockmateBlockOption>& options,
                                                                  const Problem& q) {
        std::vector<RockmateBlockOption> out = options;
        const auto time = [&](const Schedule& s) {
            double t = 0.0;
            for (const Step& step : s)
                if (step.is_run()) t += q.op(step.op()).time;
            return t;
        };
        for (RockmateBlockOption& o : out) {
            o.cost.fwd_time = time(o.forward);
            o.cost.bwd_time = time(o.backward);
        }
        detail::rockmate::prune(out);
        return out;
    }

    // The time limit of the next block when the analysis has run `elapsed` seconds and
    // `blocks_left` blocks (this one included) remain.
    [[nodiscard]] double block_time_limit(double elapsed, std::size_t blocks_left) const {
        if (!options_.time_limit_seconds) return options_.block_time_limit_seconds;
        const double share = std::max(0.0, *options_.time_limit_seconds - elapsed) /
                             static_cast<double>(std::max<std::size_t>(blocks_left, 1));
        return std::min(options_.block_time_limit_seconds, share);
    }

    void solve_block(const Problem& problem, const BlockPartition& part, std::size_t l, RockmateBlock& rb,
                     std::optional<DataId> freeable, double time_limit_seconds) const {
        const auto start = std::chrono::steady_clock::now();
        const Block& block = part.blocks[l];
        const Problem& q = rb.problem.problem;
        const OpId boundary = rb.problem.boundary;
        const Reference ref = store_all_reference(q);
        rb.options.push_back(detail::rockmate::option_from(rb.problem, block, ref.schedule, freeable));
        if (!options_.store_all_only) {
            // Memory while the boundary runs in store-all: the most any option keeps.
            const SimulationReport sim = simulate(q, ref.schedule);
            Bytes saved_hi = 0;
            for (std::size_t i = 0; i < ref.schedule.size(); ++i)
                if (ref.schedule[i].is_run() && ref.schedule[i].op() == boundary) saved_hi = sim.timeline[i].during;
            const Op& b = q.op(boundary);
            Bytes saved_lo = q.initial_bytes() + b.overhead;
            for (const DataId d : b.reads)
                if (!q.is_initial(d)) saved_lo += q.data(d).bytes;
            saved_lo += detail::rockmate::bytes_of(q, b.writes);
            const Bytes peak_hi = ref.peak;
            // Every solve of the block stops when the block's time does (time_bounded).
            const auto left = [&] { return time_limit_seconds - seconds_since(start); };
            const Bytes peak_lo =
                std::min(peak_hi, detail::rockmate::least_peak(time_bounded(block_solver_, left()), q).value_or(saved_lo));
            const auto step = [](Bytes lo, Bytes hi, std::size_t i, std::size_t count) {
                return count <= 1 ? hi : lo + (hi - lo) * static_cast<Bytes>(i) / static_cast<Bytes>(count - 1);
            };
            // From the largest budgets down. The feasible schedules shrink with both budgets,
            // so a schedule optimal at (P, σ) whose own peak and boundary memory are (p, s) is
            // optimal at every (P', σ') in [p, P] × [s, σ], and a point without a schedule has
            // none below it either: such points are skipped.
            struct Box {
                Bytes peak_lo, peak_hi, saved_lo, saved_hi;
            };
            std::vector<Box> solved;
            std::vector<std::pair<Bytes, Bytes>> infeasible;
            std::set<std::pair<Bytes, Bytes>> tried;
            bool out_of_time = false;
            for (std::size_t i = options_.peak_budgets; i-- > 0 && !out_of_time;) {
                const Bytes peak = step(peak_lo, peak_hi, i, options_.peak_budgets);
                const Bytes top = std::min(peak, saved_hi);
                if (top < saved_lo) continue;
                for (std::size_t j = options_.saved_budgets; j-- > 0;) {
                    const Bytes saved = step(saved_lo, top, j, options_.saved_budgets);
                    if (!tried.insert({peak, saved}).second) continue;
                    if (std::any_of(solved.begin(), solved.end(), [&](const Box& b) {
                            return b.peak_lo <= peak && peak <= b.peak_hi && b.saved_lo <= saved && saved <= b.saved_hi;
                        }))
                        continue;
                    if (std::any_of(infeasible.begin(), infeasible.end(),
                                    [&](const auto& f) { return peak <= f.first && saved <= f.second; }))
                        continue;
                    if (seconds_since(start) > time_limit_seconds) {
                        out_of_time = true;
                        report_progress(options_.progress, "rockmate: block " + std::to_string(l + 1) +
                                                               ": time limit of " +
                                                               std::to_string(time_limit_seconds) +
                                                               " s reached, " + std::to_string(tried.size() - 1) +
                                                               " grid points tried");
                        break;
                    }
                    const BlockProblem constrained = block_problem(problem, part, l, peak - saved);
                    try {
                        const Plan plan = time_bounded(block_solver_, left()).solve(constrained.problem, peak);
                        rb.options.push_back(detail::rockmate::option_from(rb.problem, block, plan.schedule, freeable));
                        ++rb.solves;
                        const SimulationReport sim = simulate(q, plan.schedule);
                        Box box{0, peak, 0, saved};
                        for (std::size_t t = 0; t < plan.schedule.size(); ++t) {
                            const bool at_boundary = plan.schedule[t].is_run() && plan.schedule[t].op() == boundary;
                            if (at_boundary) box.saved_lo = sim.timeline[t].during;
                            box.peak_lo = std::max({box.peak_lo, sim.timeline[t].after, at_boundary ? 0 : sim.timeline[t].during});
                        }
                        box.peak_lo = std::max(box.peak_lo, sim.initial);
                        solved.push_back(box);
                    } catch (const Infeasible&) {
                        ++rb.failed_solves;
                        infeasible.emplace_back(peak, saved);
                    } catch (const Error& e) {
                        // The block solver cannot handle this block (too large, out of time):
                        // the options found so far stay.
                        ++rb.failed_solves;
                        if (rb.failure.empty()) {
                            rb.failure = e.what();
                            report_progress(options_.progress, "rockmate: block " + std::to_string(l + 1) + ": " + e.what());
                        }
                    }
                }
            }
        }
        detail::rockmate::prune(rb.options);
    }

    RockmateOptions options_;
    BlockSolver block_solver_;
    Across sequence_solver_;
};

}  // namespace remat
