// remat/partition/blocks.hpp — an op-level training problem as a sequence of blocks, cut at
// its 1-separators.
//
// Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, "Rockmate: an efficient, fast, automatic
// and generic tool for re-materialization in PyTorch", ICML 2023: the forward graph is cut at
// every 1-separator (a data through which every path from the inputs to the loss passes) into
// a sequence of blocks; each block with the backward ops that differentiate it is a small
// problem of its own, which block_problem() builds.
//
// Recognition rules (the shape capture produces, docs/formats.md §1 (problems)):
//  - the loss is the problem's `loss` op (required);
//  - backward ops are the other exactly-once ops; forward ops are the ops that are not
//    exactly once (alternative writers of one activation: a no-grad F, a with-grad F+ that
//    also writes saved state, fused variants);
//  - forward data are written by forward ops, backward data by the loss and backward ops; no
//    data is both and initial data have no writer; forward ops and the loss read only
//    initial and forward data; final data are backward data (or initial).
// Forward ops that can never run (they need data nothing produces) are left out.
//
// Separators. Initial data are live throughout and never freed, so paths through them do
// not tie blocks together: paths start at the forward ops that read no non-initial data. A
// forward data s is a separator when every path from those ops to the loss passes through
// s, i.e. s dominates the loss; the separators are totally ordered, and n − 1 cuts make n
// blocks. By default every separator is cut (Rockmate lets the block after a separator that
// no backward op reads free it early); PartitionOptions can keep such separators inside a
// larger block instead, where the block solver frees them as early as it likes.
// Block l holds the forward ops reached from s_{l-1} (from the path starts for l = 1)
// without going past s_l, and what they write; the last block ends at the loss.
//
// Backward ops are placed by what they read: one that reads forward data inside block l
// belongs to block l; one that reads s_l, to block l or l + 1. A gradient crosses at most one
// boundary: a backward op belongs to the block of each op whose output gradient it reads, or
// to the block before. These are difference constraints, so among the placements they allow
// there is one that puts every backward op as late in the network as possible — as early in
// the backward pass, which sums gradient contributions before they cross a boundary — and
// that is the one taken, except that the writers of final data go to the first block when
// the constraints allow it (a final gradient written earlier in the backward pass would stay
// live through all of the rest). When no placement satisfies the rules (a backward op
// reading activations of distant blocks, a skip connection whose gradient would cross two
// boundaries), the blocks concerned are merged by dropping separators until one does. The
// gradients that cross from block l + 1 to block l are block l's `output_grads`: in block l's
// problem, the op standing for the rest of the network writes them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../graph/dominators.hpp"
#include "../graph/topological.hpp"

namespace remat {

/// One block: the forward ops between two consecutive separators and the backward ops that
/// differentiate them. Ids are those of the whole problem; lists are in increasing id order.
struct Block {
    /// s_{l-1}, the separator the block starts from; none for the first block, which
    /// starts from the initial data.
    std::optional<DataId> input;
    /// s_l, the separator it ends at; none for the last block, which ends at the loss.
    std::optional<DataId> output;
    std::vector<OpId> forward_ops;
    /// Exactly-once ops of the block, the loss excluded.
    std::vector<OpId> backward_ops;
    /// The last block holds the loss.
    bool has_loss = false;
    /// Written by the block's forward ops (its output included).
    std::vector<DataId> forward_data;
    /// Written by the block's backward ops (and the loss, in the last block).
    std::vector<DataId> backward_data;
    /// Initial data the block's ops read.
    std::vector<DataId> initial_reads;
    /// Gradients written after the block (by the next block's backward ops, or the loss) that
    /// this block's backward ops read: what "the rest of the network" hands back.
    std::vector<DataId> output_grads;
    /// What this block's backward leaves for the block before (that block's output_grads);
    /// for the first block, the final data it writes.
    std::vector<DataId> input_grads;
    /// Other final data the block's backward writes (a skip connection from an initial
    /// input into a later block): they stay live to the end.
    std::vector<DataId> kept_final;
};

struct PartitionOptions {
    /// Cut also at separators that no backward op (nor the loss) reads.
    bool cut_unread_separators = true;
};

struct BlockPartition {
    std::vector<Block> blocks;
    /// s_1 .. s_{n-1}, in forward order.
    std::vector<DataId> separators;
    OpId loss{};
};

namespace detail::blocks {

enum class Kind : unsigned char { none, initial, forward, backward };

[[nodiscard]] inline std::string quoted(const Problem& p, DataId d) { return remat::detail::quoted(p.data(d).name); }
[[nodiscard]] inline std::string quoted(const Problem& p, OpId k) { return remat::detail::quoted(p.op(k).name); }

template <class Id>
void sort_unique(std::vector<Id>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
}

// The steps of partition_blocks(), in the order run() takes them; each member function is one
// step and the data members are what the steps hand on.
class Partitioner {
public:
    Partitioner(const Problem& problem, const PartitionOptions& options)
        : p_(problem), options_(options), who_("block partition of '" + problem.name() + "'"),
          nd_(problem.data_count()), no_(problem.op_count()) {
        if (!p_.loss())
            throw InvalidInput(who_ + ": the problem names no loss op; blocks are cut on the way to the loss, so give "
                                      "\"loss\"");
        loss_ = *p_.loss();
        if (!p_.op(loss_).exactly_once)
            throw InvalidInput(who_ + ": the loss op " + quoted(p_, loss_) + " must be exactly once");
    }

    [[nodiscard]] BlockPartition run() {
        classify();
        check_reads();
        find_runnable_forward_ops();
        find_path_to_loss();
        find_separators();
        place_all();
        return assemble();
    }

private:
    [[nodiscard]] bool forward_data(DataId d) const { return kind_[d.index] == Kind::forward; }

    // Ops by kind (forward, backward; the loss is neither), data by the kind of their writers.
    void classify() {
        is_fwd_.assign(no_, 0);
        is_bwd_.assign(no_, 0);
        for (std::size_t k = 0; k < no_; ++k) {
            if (OpId{k} == loss_) continue;
            (p_.op(OpId{k}).exactly_once ? is_bwd_ : is_fwd_)[k] = 1;
        }
        kind_.assign(nd_, Kind::none);
        a_writer_.assign(nd_, OpId{});
        for (std::size_t d = 0; d < nd_; ++d) {
            const DataId id{d};
            if (p_.is_initial(id)) {
                kind_[d] = Kind::initial;
                if (!p_.writers(id).empty())
                    throw InvalidInput(who_ + ": initial data " + quoted(p_, id) + " is written by op " +
                                       quoted(p_, p_.writers(id).front()) + "; initial data belong to the caller");
                continue;
            }
            for (const OpId w : p_.writers(id)) {
                const Kind k = is_fwd_[w.index] ? Kind::forward : Kind::backward;
                if (kind_[d] != Kind::none && kind_[d] != k)
                    throw InvalidInput(who_ + ": data " + quoted(p_, id) + " is written by forward op " +
                                       quoted(p_, k == Kind::forward ? w : a_writer_[d]) + " and by backward op " +
                                       quoted(p_, k == Kind::forward ? a_writer_[d] : w) +
                                       "; activations and gradients must be distinct data");
                kind_[d] = k;
                a_writer_[d] = w;
            }
        }
    }

    // The loss and the forward ops read only activations and initial data; final data are not
    // activations.
    void check_reads() const {
        for (const DataId d : p_.op(loss_).reads)
            if (kind_[d.index] == Kind::backward)
                throw InvalidInput(who_ + ": the loss " + quoted(p_, loss_) + " reads gradient " + quoted(p_, d) +
                                   "; it must read only activations and initial data");
        for (const DataId d : p_.final_data())
            if (kind_[d.index] == Kind::forward)
                throw InvalidInput(who_ + ": final data " + quoted(p_, d) + " is an activation (written by forward op " +
                                   quoted(p_, a_writer_[d.index]) + "); final data must be gradients or initial data");
        for (std::size_t k = 0; k < no_; ++k) {
            if (!is_fwd_[k]) continue;
            for (const DataId d : p_.op(OpId{k}).reads)
                if (kind_[d.index] == Kind::backward)
                    throw InvalidInput(who_ + ": forward op " + quoted(p_, OpId{k}) + " reads gradient " + quoted(p_, d) +
                                       " (written by " + quoted(p_, a_writer_[d.index]) +
                                       "); forward ops read only activations and initial data");
        }
    }

    // Forward ops that can run at all: a fixpoint from the initial data.
    void find_runnable_forward_ops() {
        alive_.assign(no_, 0);
        std::vector<char> available(nd_, 0);
        for (std::size_t d = 0; d < nd_; ++d) available[d] = kind_[d] == Kind::initial;
        for (bool changed = true; changed;) {
            changed = false;
            for (std::size_t k = 0; k < no_; ++k) {
                if (!is_fwd_[k] || alive_[k]) continue;
                const Op& op = p_.op(OpId{k});
                if (!std::all_of(op.reads.begin(), op.reads.end(), [&](DataId d) { return available[d.index] != 0; }))
                    continue;
                alive_[k] = 1;
                changed = true;
                for (const DataId d : op.writes) available[d.index] = 1;
            }
        }
    }

    // Forward ops and data on a path to the loss.
    void find_path_to_loss() {
        main_op_.assign(no_, 0);
        on_path_.assign(nd_, 0);
        std::vector<DataId> work;
        const auto reach = [&](DataId d) {
            if (forward_data(d) && !on_path_[d.index]) {
                on_path_[d.index] = 1;
                work.push_back(d);
            }
        };
        for (const DataId d : p_.op(loss_).reads) reach(d);
        while (!work.empty()) {
            const DataId d = work.back();
            work.pop_back();
            for (const OpId w : p_.writers(d)) {
                if (!alive_[w.index] || main_op_[w.index]) continue;
                main_op_[w.index] = 1;
                for (const DataId r : p_.op(w).reads) reach(r);
            }
        }
    }

    // The graph whose dominators are the separators: nodes are data (their ids), ops
    // (nd + op id) and a source (nd + no) with an edge to every path start; op → data it
    // writes on a path; data → ops on a path that read it (and the loss).
    [[nodiscard]] graph::Adjacency dominance_graph() const {
        graph::Adjacency succs(nd_ + no_ + 1);
        const std::size_t source = nd_ + no_;
        for (std::size_t k = 0; k < no_; ++k) {
            const bool is_loss = OpId{k} == loss_;
            if (!main_op_[k] && !is_loss) continue;
            bool starts = true;
            for (const DataId d : p_.op(OpId{k}).reads)
                if (on_path_[d.index]) {
                    succs[d.index].push_back(nd_ + k);
                    starts = false;
                }
            if (starts) succs[source].push_back(nd_ + k);
            if (is_loss) continue;
            for (const DataId d : p_.op(OpId{k}).writes)
                if (on_path_[d.index]) succs[nd_ + k].push_back(d.index);
        }
        return succs;
    }

    // The data that dominate the loss, in forward order (cut unless options say otherwise).
    void find_separators() {
        const graph::Adjacency succs = dominance_graph();
        const graph::TopologicalSort sort = graph::topological_sort(succs);
        // A valid problem (ProblemBuilder checked that an order exists) can still have forward
        // ops that feed each other through alternative writers (W1 reads u, W3 makes u from y,
        // which W1 and W2 both write): not a bad input, only beyond a sequence of blocks.
        if (!sort.acyclic())
            throw SolverError(who_ + ": the forward ops feed each other through alternative writers" +
                              (sort.left.front() < nd_ ? " (around data " + quoted(p_, DataId{sort.left.front()}) + ")"
                                                       : std::string()) +
                              ", so the graph is no sequence of blocks; plan it with greedy, exhaustive, checkmate or "
                              "store-all, which take any valid problem");
        const std::size_t source = nd_ + no_;
        const graph::DominatorTree tree = graph::dominators(succs, source);
        part_.loss = loss_;
        for (std::size_t v = tree.idom[nd_ + loss_.index]; v != source; v = tree.idom[v]) {
            if (v >= nd_) continue;
            const auto readers = p_.readers(DataId{v});
            if (options_.cut_unread_separators ||
                std::any_of(readers.begin(), readers.end(), [&](OpId r) { return p_.op(r).exactly_once; }))
                part_.separators.push_back(DataId{v});
        }
        std::reverse(part_.separators.begin(), part_.separators.end());
    }

    // Cut, place the backward ops, and when a backward op cannot be placed (it reads
    // activations of blocks too far apart, or a gradient would cross more than one boundary,
    // e.g. from a skip connection out of an initial input), merge the blocks concerned by
    // dropping a separator, and try again.
    void place_all() {
        for (;;) {
            n_ = part_.separators.size() + 1;
            separator_of_.assign(nd_, 0);  // l for s_l, 0 otherwise
            for (std::size_t l = 1; l < n_; ++l) separator_of_[part_.separators[l - 1].index] = l;
            assign_forward_blocks();
            check_forward_blocks();
            std::optional<std::size_t> merge_at = backward_bounds();
            if (!merge_at)
                if (const auto stuck = place(hi_)) merge_at = lo_[*stuck];
            if (!merge_at) break;
            part_.separators.erase(part_.separators.begin() + static_cast<std::ptrdiff_t>(*merge_at - 2));
        }
        cap_final_writers();
    }

    // Forward ops and data by block: phase l spreads from s_{l-1} and stops at s_l.
    void assign_forward_blocks() {
        blk_op_.assign(no_, 0);
        blk_data_.assign(nd_, 0);
        for (std::size_t l = 1; l <= n_; ++l) {
            std::vector<OpId> work;
            const auto reach_readers = [&](DataId d) {
                for (const OpId r : p_.readers(d))
                    if (alive_[r.index] && blk_op_[r.index] == 0) work.push_back(r);
            };
            if (l == 1) {
                for (std::size_t k = 0; k < no_; ++k) {
                    const auto& reads = p_.op(OpId{k}).reads;
                    if (alive_[k] && std::none_of(reads.begin(), reads.end(), [&](DataId d) { return forward_data(d); }))
                        work.push_back(OpId{k});
                }
            } else {
                reach_readers(part_.separators[l - 2]);
            }
            while (!work.empty()) {
                const OpId k = work.back();
                work.pop_back();
                if (blk_op_[k.index] != 0) continue;
                blk_op_[k.index] = l;
                for (const DataId d : p_.op(k).writes) {
                    if (blk_data_[d.index] != 0) continue;
                    blk_data_[d.index] = l;
                    if (separator_of_[d.index] != l) reach_readers(d);
                }
            }
        }
    }

    // Every runnable forward op is in one block, with its writes, reading only its block's
    // data, its input separator and initial data.
    void check_forward_blocks() const {
        for (std::size_t k = 0; k < no_; ++k) {
            if (!alive_[k]) continue;
            const OpId id{k};
            const std::size_t l = blk_op_[k];
            if (l == 0) throw InvalidInput(who_ + ": forward op " + quoted(p_, id) + " is in no block");
            for (const DataId d : p_.op(id).writes)
                if (blk_data_[d.index] != l)
                    throw InvalidInput(who_ + ": data " + quoted(p_, d) + " is written by forward ops of blocks " +
                                       std::to_string(blk_data_[d.index]) + " and " + std::to_string(l) + " (op " +
                                       quoted(p_, id) + ")");
            for (const DataId d : p_.op(id).reads) {
                if (!forward_data(d) || blk_data_[d.index] == l ||
                    (separator_of_[d.index] != 0 && separator_of_[d.index] + 1 == l))
                    continue;
                throw InvalidInput(who_ + ": forward op " + quoted(p_, id) + " of block " + std::to_string(l) + " reads " +
                                   quoted(p_, d) + " of block " + std::to_string(blk_data_[d.index]) +
                                   "; a block may read only its own data, its input separator and initial data");
            }
        }
    }

    // Backward ops: the blocks [lo, hi] their activation reads allow. Returns the block to
    // merge with the one before (s_{merge_at - 1} is dropped) when some op has no block.
    [[nodiscard]] std::optional<std::size_t> backward_bounds() {
        lo_.assign(no_, 1);
        hi_.assign(no_, n_);
        for (std::size_t k = 0; k < no_; ++k) {
            if (!is_bwd_[k]) continue;
            for (const DataId d : p_.op(OpId{k}).reads) {
                if (!forward_data(d)) continue;
                const std::size_t m = blk_data_[d.index];
                if (m == 0)
                    throw InvalidInput(who_ + ": backward op " + quoted(p_, OpId{k}) + " reads " + quoted(p_, d) +
                                       ", which no forward op that can run writes");
                const std::size_t top = separator_of_[d.index] != 0 ? m + 1 : m;
                if (std::max(lo_[k], m) > std::min(hi_[k], top)) return std::max(lo_[k], m);
                lo_[k] = std::max(lo_[k], m);
                hi_[k] = std::min(hi_[k], top);
            }
        }
        lo_[loss_.index] = hi_[loss_.index] = n_;
        return std::nullopt;
    }

    // The greatest placement of the backward ops below `upper` in which a gradient crosses at
    // most one boundary (into `at_`); the op that falls below its lowest block, if any.
    [[nodiscard]] std::optional<std::size_t> place(const std::vector<std::size_t>& upper) {
        at_ = upper;
        for (std::size_t k = 0; k < no_; ++k)
            if (is_bwd_[k] && at_[k] < lo_[k]) return k;
        for (bool changed = true; changed;) {
            changed = false;
            for (std::size_t k = 0; k < no_; ++k) {
                if (!is_bwd_[k]) continue;
                for (const DataId g : p_.op(OpId{k}).reads) {
                    if (kind_[g.index] != Kind::backward) continue;
                    for (const OpId w : p_.writers(g)) {
                        if (at_[w.index] < at_[k]) {
                            at_[k] = at_[w.index];
                            changed = true;
                            if (at_[k] < lo_[k]) return k;
                        }
                        if (at_[k] + 1 < at_[w.index]) {
                            at_[w.index] = at_[k] + 1;
                            changed = true;
                            if (at_[w.index] < lo_[w.index]) return w.index;
                        }
                    }
                }
            }
        }
        return std::nullopt;
    }

    // Final gradients are best written by the earliest block their reads allow (the first,
    // unless they read activations of a later one): written later they stay live through the
    // rest of the backward pass beside everything Rotor accounts for.
    void cap_final_writers() {
        std::vector<std::size_t> capped = hi_;
        for (const DataId d : p_.final_data()) {
            if (kind_[d.index] != Kind::backward) continue;
            for (const OpId w : p_.writers(d)) {
                const std::size_t earliest = lo_[w.index];
                if (capped[w.index] <= earliest) continue;
                const std::size_t before = capped[w.index];
                capped[w.index] = earliest;
                if (place(capped)) capped[w.index] = before;
            }
        }
        (void)place(capped);  // feasible: every cap kept was
    }

    [[nodiscard]] BlockPartition assemble() {
        part_.blocks.resize(n_);
        for (std::size_t l = 1; l <= n_; ++l) {
            Block& b = part_.blocks[l - 1];
            if (l > 1) b.input = part_.separators[l - 2];
            if (l < n_) b.output = part_.separators[l - 1];
            b.has_loss = l == n_;
        }
        assemble_ops();
        assemble_data();
        for (Block& b : part_.blocks) sort_unique(b.initial_reads);
        return std::move(part_);
    }

    void assemble_ops() {
        const auto add_initial_reads = [&](Block& b, OpId k) {
            for (const DataId d : p_.op(k).reads)
                if (kind_[d.index] == Kind::initial) b.initial_reads.push_back(d);
        };
        for (std::size_t k = 0; k < no_; ++k) {
            const OpId id{k};
            if (alive_[k]) {
                Block& b = part_.blocks[blk_op_[k] - 1];
                b.forward_ops.push_back(id);
                add_initial_reads(b, id);
            } else if (is_bwd_[k] || id == loss_) {
                Block& b = part_.blocks[at_[k] - 1];
                if (is_bwd_[k]) b.backward_ops.push_back(id);
                add_initial_reads(b, id);
            }
        }
    }

    // Forward data to their block; gradients to the block of their writers, crossing to the
    // block before when read there, or kept to the end when final.
    void assemble_data() {
        for (std::size_t d = 0; d < nd_; ++d) {
            const DataId id{d};
            if (kind_[d] == Kind::forward && blk_data_[d] != 0) part_.blocks[blk_data_[d] - 1].forward_data.push_back(id);
            if (kind_[d] != Kind::backward) continue;
            const std::size_t l = at_[p_.writers(id).front().index];
            for (const OpId w : p_.writers(id))
                if (at_[w.index] != l)
                    throw InvalidInput(who_ + ": gradient " + quoted(p_, id) + " is written in blocks " + std::to_string(l) +
                                       " and " + std::to_string(at_[w.index]) + " (ops " +
                                       quoted(p_, p_.writers(id).front()) + " and " + quoted(p_, w) + ")");
            part_.blocks[l - 1].backward_data.push_back(id);
            const bool crosses = std::any_of(p_.readers(id).begin(), p_.readers(id).end(),
                                             [&](OpId r) { return at_[r.index] + 1 == l; });
            if (crosses) {
                part_.blocks[l - 2].output_grads.push_back(id);
                part_.blocks[l - 1].input_grads.push_back(id);
            } else if (p_.is_final(id)) {
                (l == 1 ? part_.blocks[0].input_grads : part_.blocks[l - 1].kept_final).push_back(id);
            }
        }
    }

    const Problem& p_;
    const PartitionOptions& options_;
    std::string who_;
    std::size_t nd_, no_;
    OpId loss_{};
    std::vector<char> is_fwd_, is_bwd_;  // per op
    std::vector<Kind> kind_;             // per data
    std::vector<OpId> a_writer_;         // per data: a writer, for messages
    std::vector<char> alive_;            // forward ops that can run
    std::vector<char> main_op_, on_path_;  // forward ops / data on a path to the loss
    BlockPartition part_;
    std::size_t n_ = 0;  // blocks
    std::vector<std::size_t> separator_of_, blk_op_, blk_data_, lo_, hi_, at_;
};

}  // namespace detail::blocks

/// Cuts `problem` into its sequence of blocks. Throws InvalidInput, naming the op or data,
/// when the problem does not have the structure described above.
[[nodiscard]] inline BlockPartition partition_blocks(const Problem& problem, const PartitionOptions& options = {}) {
    return detail::blocks::Partitioner(problem, options).run();
}

/// A block as a problem of its own: its input separator and the initial data it reads are
/// initial; its forward ops, then the boundary op, then its backward ops; what it leaves for
/// the block before (and final data it writes) is final. For every block but the last, the
/// boundary is a new exactly-once op of time 0 standing for the rest of the network: it reads
/// the output separator and writes the output gradients (or, when no gradient comes back, a
/// data of 0 bytes). For the last block, the boundary is the loss. `boundary_overhead` is
/// added to the boundary's overhead: while the boundary runs, memory = everything live + its
/// writes + overhead, so a budget B with overhead B − σ limits what the block keeps for its
/// backward (plus the output gradients) to σ.
struct BlockProblem {
    Problem problem;
    /// Id in the whole problem of each local data; none for the 0-byte data a synthetic
    /// boundary writes when no gradient comes back.
    std::vector<std::optional<DataId>> global_data;
    /// Id in the whole problem of each local op; none for a synthetic boundary.
    std::vector<std::optional<OpId>> global_op;
    /// Local id of the boundary op.
    OpId boundary{};
};

[[nodiscard]] inline BlockProblem block_problem(const Problem& problem, const BlockPartition& partition,
                                                std::size_t index, Bytes boundary_overhead = 0) {
    if (index >= partition.blocks.size())
        throw InvalidInput(std::string("block ") + std::to_string(index) + " of '" + problem.name() + "' does not exist (" +
                           std::to_string(partition.blocks.size()) + " blocks)");
    if (boundary_overhead < 0) throw InvalidInput("a block's boundary overhead must be >= 0");
    const Block& b = partition.blocks[index];
    const auto build = [&](bool with_autograd) {
        std::vector<std::optional<DataId>> global_data;
        std::vector<std::optional<OpId>> global_op;
        OpId boundary{};
        ProblemBuilder builder(problem.name() + "/block" + std::to_string(index + 1));
        std::vector<std::optional<DataId>> local(problem.data_count());
        const auto map = [&](DataId d) {
            if (!local[d.index]) {
                local[d.index] = builder.add_data(problem.data(d).name, problem.data(d).bytes);
                global_data.push_back(d);
            }
            return *local[d.index];
        };
        const auto map_all = [&](const std::vector<DataId>& v) {
            std::vector<DataId> r;
            r.reserve(v.size());
            for (const DataId d : v) r.push_back(map(d));
            return r;
        };
        std::vector<std::optional<OpId>> local_op(problem.op_count());
        const auto add = [&](OpId k, Bytes extra) {
            const Op& op = problem.op(k);
            local_op[k.index] = builder.add_op({op.name, op.time, op.overhead + extra, map_all(op.reads),
                                                map_all(op.writes), op.exactly_once});
            global_op.push_back(k);
            return *local_op[k.index];
        };
        if (b.input) map(*b.input);
        for (const DataId d : b.initial_reads) map(d);
        for (const OpId k : b.forward_ops) add(k, 0);
        if (b.has_loss) {
            boundary = add(partition.loss, boundary_overhead);
        } else {
            const std::string& out_name = problem.data(*b.output).name;
            std::string name = "(rest after " + out_name + ")";
            while (problem.find_op(name)) name += "'";
            std::vector<DataId> writes = map_all(b.output_grads);
            if (writes.empty()) {
                std::string token = "(gradient of " + out_name + ")";
                while (problem.find_data(token)) token += "'";
                writes.push_back(builder.add_data(token, 0));
                global_data.push_back(std::nullopt);
            }
            boundary = builder.add_op({name, 0.0, boundary_overhead, {map(*b.output)}, std::move(writes), true});
            global_op.push_back(std::nullopt);
        }
        for (const OpId k : b.backward_ops) add(k, 0);
        if (b.input) builder.add_initial(map(*b.input));
        for (const DataId d : b.initial_reads) builder.add_initial(map(d));
        std::vector<DataId> finals = b.input_grads;
        finals.insert(finals.end(), b.kept_final.begin(), b.kept_final.end());
        for (const DataId d : b.output_grads)
            if (problem.is_final(d)) finals.push_back(d);
        detail::blocks::sort_unique(finals);
        for (const DataId d : finals) builder.add_final(map(d));
        builder.set_loss(boundary);
        if (with_autograd) {
            std::vector<OpId> fwd, bwd;
            for (const OpId k : problem.autograd_order()) {
                if (!local_op[k.index] || *local_op[k.index] == boundary) continue;
                (problem.op(k).exactly_once ? bwd : fwd).push_back(*local_op[k.index]);
            }
            fwd.push_back(boundary);
            fwd.insert(fwd.end(), bwd.begin(), bwd.end());
            builder.set_autograd_order(std::move(fwd));
        }
        return BlockProblem{builder.build(), std::move(global_data), std::move(global_op), boundary};
    };
    if (!problem.autograd_order().empty()) {
        try {
            return build(true);
        } catch (const InvalidInput&) {
            // The whole problem's order restricted to the block is not runnable on its own
            // (it relied on an op outside the block); store-all then chooses its own order.
        }
    }
    try {
        return build(false);
    } catch (const InvalidInput& e) {
        throw InvalidInput(std::string("block ") + std::to_string(index + 1) + " of '" + problem.name() +
                           "' is not a problem of its own: " + e.what());
    }
}

}  // namespace remat
