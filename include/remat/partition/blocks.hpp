// remat/partition/blocks.hpp — an op-level training problem as a sequence of blocks, cut at
// its 1-separators.
//
// Zhao, Le Hellard, Eyraud-Dubois, Gusak, Beaumont, "Rockmate: an efficient, fast, automatic
// and generic tool for re-materialization in PyTorch", ICML 2023: the forward graph is cut at
// every 1-separator (a data through which every path from the inputs to the loss passes) into
// a sequence of blocks; each block with the backward ops that differentiate it is a small
// problem of its own, which block_problem() builds.
//
// Recognition rules (the shape capture produces, FORMATS.md §1):
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

[[nodiscard]] inline std::string quoted(const Problem& p, DataId d) { return "'" + p.data(d).name + "'"; }
[[nodiscard]] inline std::string quoted(const Problem& p, OpId k) { return "'" + p.op(k).name + "'"; }

template <class Id>
void sort_unique(std::vector<Id>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace detail::blocks

/// Cuts `problem` into its sequence of blocks. Throws InvalidInput, naming the op or data,
/// when the problem does not have the structure described above.
[[nodiscard]] inline BlockPartition partition_blocks(const Problem& problem, const PartitionOptions& options = {}) {
    using detail::blocks::Kind;
    using detail::blocks::quoted;
    const Problem& p = problem;
    const std::string who = "block partition of '" + p.name() + "'";
    if (!p.loss())
        throw InvalidInput(who + ": the problem names no loss op; blocks are cut on the way to the loss, so give "
                                 "\"loss\"");
    const OpId loss = *p.loss();
    if (!p.op(loss).exactly_once)
        throw InvalidInput(who + ": the loss op " + quoted(p, loss) + " must be exactly once");
    const std::size_t nd = p.data_count(), no = p.op_count();

    // Ops and data by kind.
    std::vector<char> is_fwd(no, 0), is_bwd(no, 0);
    for (std::size_t k = 0; k < no; ++k) {
        if (OpId{k} == loss) continue;
        (p.op(OpId{k}).exactly_once ? is_bwd : is_fwd)[k] = 1;
    }
    std::vector<Kind> kind(nd, Kind::none);
    std::vector<OpId> a_writer(nd);
    for (std::size_t d = 0; d < nd; ++d) {
        const DataId id{d};
        if (p.is_initial(id)) {
            kind[d] = Kind::initial;
            if (!p.writers(id).empty())
                throw InvalidInput(who + ": initial data " + quoted(p, id) + " is written by op " +
                                   quoted(p, p.writers(id).front()) + "; initial data belong to the caller");
            continue;
        }
        for (const OpId w : p.writers(id)) {
            const Kind k = is_fwd[w.index] ? Kind::forward : Kind::backward;
            if (kind[d] != Kind::none && kind[d] != k)
                throw InvalidInput(who + ": data " + quoted(p, id) + " is written by forward op " +
                                   quoted(p, k == Kind::forward ? w : a_writer[d]) + " and by backward op " +
                                   quoted(p, k == Kind::forward ? a_writer[d] : w) +
                                   "; activations and gradients must be distinct data");
            kind[d] = k;
            a_writer[d] = w;
        }
    }
    for (const DataId d : p.op(loss).reads)
        if (kind[d.index] == Kind::backward)
            throw InvalidInput(who + ": the loss " + quoted(p, loss) + " reads gradient " + quoted(p, d) +
                               "; it must read only activations and initial data");
    for (const DataId d : p.final_data())
        if (kind[d.index] == Kind::forward)
            throw InvalidInput(who + ": final data " + quoted(p, d) + " is an activation (written by forward op " +
                               quoted(p, a_writer[d.index]) + "); final data must be gradients or initial data");

    // Forward ops that can run at all: a fixpoint from the initial data.
    std::vector<char> alive(no, 0), available(nd, 0);
    for (std::size_t d = 0; d < nd; ++d) available[d] = kind[d] == Kind::initial;
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t k = 0; k < no; ++k) {
            if (!is_fwd[k] || alive[k]) continue;
            const Op& op = p.op(OpId{k});
            for (const DataId d : op.reads)
                if (kind[d.index] == Kind::backward)
                    throw InvalidInput(who + ": forward op " + quoted(p, OpId{k}) + " reads gradient " + quoted(p, d) +
                                       " (written by " + quoted(p, a_writer[d.index]) +
                                       "); forward ops read only activations and initial data");
            if (!std::all_of(op.reads.begin(), op.reads.end(), [&](DataId d) { return available[d.index] != 0; }))
                continue;
            alive[k] = 1;
            changed = true;
            for (const DataId d : op.writes) available[d.index] = 1;
        }
    }
    const auto forward_data = [&](DataId d) { return kind[d.index] == Kind::forward; };

    // Forward ops and data on a path to the loss.
    std::vector<char> main_op(no, 0), on_path(nd, 0);
    {
        std::vector<DataId> work;
        for (const DataId d : p.op(loss).reads)
            if (forward_data(d) && !on_path[d.index]) {
                on_path[d.index] = 1;
                work.push_back(d);
            }
        while (!work.empty()) {
            const DataId d = work.back();
            work.pop_back();
            for (const OpId w : p.writers(d)) {
                if (!alive[w.index] || main_op[w.index]) continue;
                main_op[w.index] = 1;
                for (const DataId r : p.op(w).reads)
                    if (forward_data(r) && !on_path[r.index]) {
                        on_path[r.index] = 1;
                        work.push_back(r);
                    }
            }
        }
    }

    // Dominators of the loss on the graph source → path starts, op → data it writes on a
    // path, data → ops on a path that read it (and the loss); Cooper–Harvey–Kennedy's
    // intersection over a topological order, which a DAG needs only once.
    const std::size_t source = nd + no;
    const std::size_t n_nodes = nd + no + 1;
    const auto op_node = [&](OpId k) { return nd + k.index; };
    std::vector<std::vector<std::size_t>> preds(n_nodes), succs(n_nodes);
    std::vector<char> in_graph(n_nodes, 0);
    const auto edge = [&](std::size_t from, std::size_t to) {
        preds[to].push_back(from);
        succs[from].push_back(to);
    };
    in_graph[source] = 1;
    in_graph[op_node(loss)] = 1;
    for (std::size_t d = 0; d < nd; ++d) in_graph[d] = on_path[d];
    for (std::size_t k = 0; k < no; ++k) {
        const bool is_loss = OpId{k} == loss;
        if (!main_op[k] && !is_loss) continue;
        in_graph[nd + k] = 1;
        bool starts = true;
        for (const DataId d : p.op(OpId{k}).reads)
            if (on_path[d.index]) {
                edge(d.index, nd + k);
                starts = false;
            }
        if (starts) edge(source, nd + k);
        if (is_loss) continue;
        for (const DataId d : p.op(OpId{k}).writes)
            if (on_path[d.index]) edge(nd + k, d.index);
    }
    std::vector<std::size_t> order;  // topological
    {
        std::vector<std::size_t> missing(n_nodes, 0);
        for (std::size_t v = 0; v < n_nodes; ++v) missing[v] = preds[v].size();
        std::vector<std::size_t> ready{source};
        while (!ready.empty()) {
            const std::size_t v = ready.back();
            ready.pop_back();
            order.push_back(v);
            for (const std::size_t s : succs[v])
                if (--missing[s] == 0) ready.push_back(s);
        }
        const auto in_graph_count = static_cast<std::size_t>(std::count(in_graph.begin(), in_graph.end(), char{1}));
        if (order.size() != in_graph_count) {
            for (std::size_t d = 0; d < nd; ++d)
                if (in_graph[d] && missing[d] != 0)
                    throw InvalidInput(who + ": the forward ops form a cycle through " + quoted(p, DataId{d}));
            throw InvalidInput(who + ": the forward ops form a cycle");
        }
    }
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::vector<std::size_t> rank(n_nodes, none), idom(n_nodes, none);
    for (std::size_t i = 0; i < order.size(); ++i) rank[order[i]] = i;
    idom[source] = source;
    for (const std::size_t v : order) {
        if (v == source) continue;
        std::size_t dom = none;
        for (std::size_t u : preds[v]) {
            if (dom == none) {
                dom = u;
                continue;
            }
            std::size_t a = dom;
            while (a != u) {
                while (rank[a] > rank[u]) a = idom[a];
                while (rank[u] > rank[a]) u = idom[u];
            }
            dom = a;
        }
        idom[v] = dom;
    }
    BlockPartition part;
    part.loss = loss;
    for (std::size_t v = idom[op_node(loss)]; v != source; v = idom[v]) {
        if (v >= nd) continue;
        const auto readers = p.readers(DataId{v});
        if (options.cut_unread_separators ||
            std::any_of(readers.begin(), readers.end(), [&](OpId r) { return p.op(r).exactly_once; }))
            part.separators.push_back(DataId{v});
    }
    std::reverse(part.separators.begin(), part.separators.end());
    // Cut, place the backward ops, and when a backward op cannot be placed (it reads
    // activations of blocks too far apart, or a gradient would cross more than one boundary,
    // e.g. from a skip connection out of an initial input), merge the blocks concerned by
    // dropping a separator, and try again.
    std::size_t n = 0;
    std::vector<std::size_t> separator_of, blk_op, blk_data, lo, hi, at;
    for (;;) {
        n = part.separators.size() + 1;
        separator_of.assign(nd, 0);  // l for s_l, 0 otherwise
        for (std::size_t l = 1; l < n; ++l) separator_of[part.separators[l - 1].index] = l;

        // Forward ops and data by block: phase l spreads from s_{l-1} and stops at s_l.
        blk_op.assign(no, 0);
        blk_data.assign(nd, 0);
        for (std::size_t l = 1; l <= n; ++l) {
            std::vector<OpId> work;
            const auto reach_readers = [&](DataId d) {
                for (const OpId r : p.readers(d))
                    if (alive[r.index] && blk_op[r.index] == 0) work.push_back(r);
            };
            if (l == 1) {
                for (std::size_t k = 0; k < no; ++k)
                    if (alive[k] && std::none_of(p.op(OpId{k}).reads.begin(), p.op(OpId{k}).reads.end(), forward_data))
                        work.push_back(OpId{k});
            } else {
                reach_readers(part.separators[l - 2]);
            }
            while (!work.empty()) {
                const OpId k = work.back();
                work.pop_back();
                if (blk_op[k.index] != 0) continue;
                blk_op[k.index] = l;
                for (const DataId d : p.op(k).writes) {
                    if (blk_data[d.index] != 0) continue;
                    blk_data[d.index] = l;
                    if (separator_of[d.index] != l) reach_readers(d);
                }
            }
        }
        for (std::size_t k = 0; k < no; ++k) {
            if (!alive[k]) continue;
            const OpId id{k};
            const std::size_t l = blk_op[k];
            if (l == 0) throw InvalidInput(who + ": forward op " + quoted(p, id) + " is in no block");
            for (const DataId d : p.op(id).writes)
                if (blk_data[d.index] != l)
                    throw InvalidInput(who + ": data " + quoted(p, d) + " is written by forward ops of blocks " +
                                       std::to_string(blk_data[d.index]) + " and " + std::to_string(l) + " (op " +
                                       quoted(p, id) + ")");
            for (const DataId d : p.op(id).reads) {
                if (!forward_data(d) || blk_data[d.index] == l ||
                    (separator_of[d.index] != 0 && separator_of[d.index] + 1 == l))
                    continue;
                throw InvalidInput(who + ": forward op " + quoted(p, id) + " of block " + std::to_string(l) + " reads " +
                                   quoted(p, d) + " of block " + std::to_string(blk_data[d.index]) +
                                   "; a block may read only its own data, its input separator and initial data");
            }
        }

        // Backward ops: the blocks their activation reads allow.
        std::optional<std::size_t> merge_at;  // drop s_{merge_at - 1}, merging blocks merge_at - 1 and merge_at
        lo.assign(no, 1);
        hi.assign(no, n);
        for (std::size_t k = 0; k < no && !merge_at; ++k) {
            if (!is_bwd[k]) continue;
            for (const DataId d : p.op(OpId{k}).reads) {
                if (!forward_data(d)) continue;
                const std::size_t m = blk_data[d.index];
                if (m == 0)
                    throw InvalidInput(who + ": backward op " + quoted(p, OpId{k}) + " reads " + quoted(p, d) +
                                       ", which no forward op that can run writes");
                const std::size_t top = separator_of[d.index] != 0 ? m + 1 : m;
                if (std::max(lo[k], m) > std::min(hi[k], top)) {
                    merge_at = std::max(lo[k], m);
                    break;
                }
                lo[k] = std::max(lo[k], m);
                hi[k] = std::min(hi[k], top);
            }
        }
        lo[loss.index] = hi[loss.index] = n;
        // The greatest placement below `upper` (the op that cannot be placed, if any).
        const auto place = [&](const std::vector<std::size_t>& upper) -> std::optional<std::size_t> {
            at = upper;
            for (bool changed = true; changed;) {
                changed = false;
                for (std::size_t k = 0; k < no; ++k) {
                    if (!is_bwd[k]) continue;
                    for (const DataId g : p.op(OpId{k}).reads) {
                        if (kind[g.index] != Kind::backward) continue;
                        for (const OpId w : p.writers(g)) {
                            if (at[w.index] < at[k]) {
                                at[k] = at[w.index];
                                changed = true;
                                if (at[k] < lo[k]) return k;
                            }
                            if (at[k] + 1 < at[w.index]) {
                                at[w.index] = at[k] + 1;
                                changed = true;
                                if (at[w.index] < lo[w.index]) return w.index;
                            }
                        }
                    }
                }
            }
            return std::nullopt;
        };
        if (!merge_at)
            if (const auto stuck = place(hi)) merge_at = lo[*stuck];
        if (merge_at) {
            part.separators.erase(part.separators.begin() + static_cast<std::ptrdiff_t>(*merge_at - 2));
            continue;
        }
        // Final gradients are best written by the first block: written later they stay live
        // through the rest of the backward pass beside everything Rotor accounts for.
        std::vector<std::size_t> capped = hi;
        for (const DataId d : p.final_data()) {
            if (kind[d.index] != Kind::backward) continue;
            for (const OpId w : p.writers(d)) {
                if (capped[w.index] == 1) continue;
                const std::size_t before = capped[w.index];
                capped[w.index] = 1;
                if (place(capped)) capped[w.index] = before;
            }
        }
        (void)place(capped);  // feasible: every cap kept was
        break;
    }

    // Assemble the blocks.
    part.blocks.resize(n);
    for (std::size_t l = 1; l <= n; ++l) {
        Block& b = part.blocks[l - 1];
        if (l > 1) b.input = part.separators[l - 2];
        if (l < n) b.output = part.separators[l - 1];
        b.has_loss = l == n;
    }
    const auto add_initial_reads = [&](Block& b, OpId k) {
        for (const DataId d : p.op(k).reads)
            if (kind[d.index] == Kind::initial) b.initial_reads.push_back(d);
    };
    for (std::size_t k = 0; k < no; ++k) {
        const OpId id{k};
        if (alive[k]) {
            Block& b = part.blocks[blk_op[k] - 1];
            b.forward_ops.push_back(id);
            add_initial_reads(b, id);
        } else if (is_bwd[k] || id == loss) {
            Block& b = part.blocks[at[k] - 1];
            if (is_bwd[k]) b.backward_ops.push_back(id);
            add_initial_reads(b, id);
        }
    }
    for (std::size_t d = 0; d < nd; ++d) {
        const DataId id{d};
        if (kind[d] == Kind::forward && blk_data[d] != 0) part.blocks[blk_data[d] - 1].forward_data.push_back(id);
        if (kind[d] != Kind::backward) continue;
        const std::size_t l = at[p.writers(id).front().index];
        for (const OpId w : p.writers(id))
            if (at[w.index] != l)
                throw InvalidInput(who + ": gradient " + quoted(p, id) + " is written in blocks " + std::to_string(l) +
                                   " and " + std::to_string(at[w.index]) + " (ops " + quoted(p, p.writers(id).front()) +
                                   " and " + quoted(p, w) + ")");
        part.blocks[l - 1].backward_data.push_back(id);
        const bool crosses = std::any_of(p.readers(id).begin(), p.readers(id).end(),
                                         [&](OpId r) { return at[r.index] + 1 == l; });
        if (crosses) {
            part.blocks[l - 2].output_grads.push_back(id);
            part.blocks[l - 1].input_grads.push_back(id);
        } else if (p.is_final(id)) {
            (l == 1 ? part.blocks[0].input_grads : part.blocks[l - 1].kept_final).push_back(id);
        }
    }
    for (Block& b : part.blocks) detail::blocks::sort_unique(b.initial_reads);
    return part;
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
