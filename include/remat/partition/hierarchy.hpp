// remat/partition/hierarchy.hpp — an op-level training problem as a hierarchy of clusters,
// for graphs with or without a sequential block structure.
//
// H-Rockmate (ICLR 2024 submission; HiRemate, Zhao et al., ICML 2025; docs/design.md):
// the forward graph is clustered bottom-up into a tree of small sub-graphs, which the
// hierarchical solver (solvers/hierarchical.hpp) plans bottom-up.
//
// Units. The problem is read as blocks.hpp reads it: the loss is the problem's `loss` op,
// backward ops are the other exactly-once ops, forward ops the rest. Forward ops that write a
// common data are alternatives of one *atom* (a no-grad F and a with-grad F+ of one layer);
// each backward op joins the atom it differentiates, found by following the gradients it reads
// back to the forward ops that consume that atom's outputs, and a backward op attached to no
// atom stays at the top with the loss (see attach_backward for the rule when the backward reads no saved state).
// The graph of atoms has an edge A → B when B's forward reads what A writes.
//
// Clustering. Each round looks at the current graph (atoms and the clusters already made) and
// collects candidate groups:
//   - sequences: maximal paths of nodes whose only user is the next node (cut to the cap);
//   - flows: a node X, its immediate dominator Y (a virtual entry above the nodes that read
//     only initial data), and every node on a path between them — a single-entry region such
//     as a residual block, an attention block, or the span of a U-Net skip connection — with
//     and without Y and X.
// A group is scored by the bytes crossing its interface (fewer is better) per square root of
// the ops it holds — the reference multiplies instead, which merges pairs first and builds
// deep trees of two-child clusters; dividing lets a whole sequence or region with the same
// interface win — ties going to the group whose smallest node comes first. The best groups that do not overlap are merged,
// each into one cluster of at most `max_children` children; the round's clusters are one
// level. Rounds go on until the top has at most `max_children` nodes or no group can merge.
// Regions are convex (no path leaves one and comes back), so every merge keeps a DAG.
#pragma once

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <cstddef>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../graph/dominators.hpp"
#include "../graph/topological.hpp"

namespace remat {

struct HierarchyOptions {
    /// Most children of one cluster (atoms or clusters). The solver plans each cluster
    /// exactly, so this bounds the size of every search.
    std::size_t max_children = 4;
    /// Rounds of merging at most (each round is one level of the tree).
    std::size_t max_rounds = 64;
};

/// Forward ops that are alternatives of one computation, and the backward ops that
/// differentiate it. Ids in the whole problem, sorted.
struct Atom {
    std::vector<OpId> forward_ops;
    std::vector<OpId> backward_ops;
    /// Forward data its forward ops write.
    std::vector<DataId> writes;
};

/// A cluster: its children are node ids (an id below the atom count is an atom, any other
/// is cluster id − atom count).
struct Cluster {
    std::vector<std::size_t> children;
    std::size_t level = 1;  ///< 1 + the deepest child cluster's level
};

struct Hierarchy {
    std::vector<Atom> atoms;
    std::vector<Cluster> clusters;
    /// The top: nodes not inside any cluster, in forward order.
    std::vector<std::size_t> top;
    /// The loss and the backward ops attached to no atom: planned at the top.
    std::vector<OpId> top_ops;
    OpId loss{};

    [[nodiscard]] bool is_atom(std::size_t node) const noexcept { return node < atoms.size(); }
    [[nodiscard]] const Cluster& cluster(std::size_t node) const { return clusters.at(node - atoms.size()); }
    [[nodiscard]] std::size_t node_count() const noexcept { return atoms.size() + clusters.size(); }

    /// The atoms under a node, in increasing order.
    [[nodiscard]] std::vector<std::size_t> atoms_of(std::size_t node) const {
        std::vector<std::size_t> out;
        collect(node, out);
        std::sort(out.begin(), out.end());
        return out;
    }
    /// Every op under a node (forward and backward), sorted.
    [[nodiscard]] std::vector<OpId> ops_of(std::size_t node) const {
        std::vector<OpId> ops;
        for (const std::size_t a : atoms_of(node)) {
            ops.insert(ops.end(), atoms[a].forward_ops.begin(), atoms[a].forward_ops.end());
            ops.insert(ops.end(), atoms[a].backward_ops.begin(), atoms[a].backward_ops.end());
        }
        std::sort(ops.begin(), ops.end());
        return ops;
    }
    /// Depth of the tree: 0 with no cluster.
    [[nodiscard]] std::size_t depth() const {
        std::size_t d = 0;
        for (const Cluster& c : clusters) d = std::max(d, c.level);
        return d;
    }

private:
    void collect(std::size_t node, std::vector<std::size_t>& out) const {
        if (is_atom(node)) {
            out.push_back(node);
            return;
        }
        for (const std::size_t child : cluster(node).children) collect(child, out);
    }
};

namespace detail::hierarchy {

// ---------------------------------------------------------------- atoms

struct Atoms {
    std::vector<Atom> atoms;
    std::vector<std::size_t> atom_of_op;    // forward/backward op → atom, or none
    std::vector<std::size_t> atom_of_data;  // forward data → writing atom, or none
    std::vector<OpId> top_ops;
};

inline constexpr std::size_t none = graph::no_node;

class AtomFinder {
public:
    explicit AtomFinder(const Problem& p) : p_(p), who_("hierarchy of '" + p.name() + "'") {
        if (!p_.loss())
            throw InvalidInput(who_ + ": the problem names no loss op; the forward graph ends at the loss, so give \"loss\"");
        loss_ = *p_.loss();
    }

    [[nodiscard]] Atoms run() {
        find_forward();
        group_alternatives();
        order_atoms();
        attach_backward();
        return std::move(result_);
    }

private:
    // Forward ops that can run at all, and the data they write.
    void find_forward() {
        const std::size_t n = p_.op_count();
        forward_.assign(n, 0);
        std::vector<char> available(p_.data_count(), 0);
        for (const DataId d : p_.initial()) available[d.index] = 1;
        for (bool changed = true; changed;) {
            changed = false;
            for (std::size_t k = 0; k < n; ++k) {
                const Op& op = p_.op(OpId{k});
                if (forward_[k] || op.exactly_once) continue;
                if (!std::all_of(op.reads.begin(), op.reads.end(), [&](DataId d) { return available[d.index] != 0; }))
                    continue;
                forward_[k] = 1;
                changed = true;
                for (const DataId d : op.writes) available[d.index] = 1;
            }
        }
    }

    // Union-find over forward ops sharing a written data.
    void group_alternatives() {
        const std::size_t n = p_.op_count();
        std::vector<std::size_t> parent(n);
        std::iota(parent.begin(), parent.end(), std::size_t{0});
        const auto find = [&](std::size_t x) {
            while (parent[x] != x) x = parent[x] = parent[parent[x]];
            return x;
        };
        std::vector<std::size_t> writer(p_.data_count(), none);
        for (std::size_t k = 0; k < n; ++k) {
            if (!forward_[k]) continue;
            for (const DataId d : p_.op(OpId{k}).writes) {
                if (writer[d.index] == none)
                    writer[d.index] = k;
                else
                    parent[find(k)] = find(writer[d.index]);
            }
        }
        std::vector<std::size_t> atom_of_root(n, none);
        result_.atom_of_op.assign(n, none);
        result_.atom_of_data.assign(p_.data_count(), none);
        for (std::size_t k = 0; k < n; ++k) {
            if (!forward_[k]) continue;
            const std::size_t r = find(k);
            if (atom_of_root[r] == none) {
                atom_of_root[r] = result_.atoms.size();
                result_.atoms.emplace_back();
            }
            const std::size_t a = atom_of_root[r];
            result_.atom_of_op[k] = a;
            result_.atoms[a].forward_ops.push_back(OpId{k});
            for (const DataId d : p_.op(OpId{k}).writes) {
                result_.atom_of_data[d.index] = a;
                result_.atoms[a].writes.push_back(d);
            }
        }
        for (Atom& atom : result_.atoms) {
            std::sort(atom.writes.begin(), atom.writes.end());
            atom.writes.erase(std::unique(atom.writes.begin(), atom.writes.end()), atom.writes.end());
        }
    }

    // Atoms renumbered in a topological order of the forward graph (smallest op first).
    void order_atoms() {
        const std::size_t n = result_.atoms.size();
        graph::Adjacency successors(n);
        for (std::size_t a = 0; a < n; ++a) {
            std::set<std::size_t> from;
            for (const OpId k : result_.atoms[a].forward_ops)
                for (const DataId d : p_.op(k).reads)
                    if (const std::size_t w = result_.atom_of_data[d.index]; w != none && w != a) from.insert(w);
            for (const std::size_t w : from) successors[w].push_back(a);
        }
        const auto order = graph::topological_order(successors);
        // Not a bad input: a valid problem's forward ops may feed each other through alternative
        // writers (see partition/blocks.hpp); the hierarchy needs an order of them.
        if (!order)
            throw SolverError(who_ + ": its forward ops feed each other through alternative writers, so they have "
                                     "no order to cluster; plan it with greedy, exhaustive, checkmate or store-all, "
                                     "which take any valid problem");
        std::vector<std::size_t> rank(n);
        for (std::size_t r = 0; r < n; ++r) rank[(*order)[r]] = r;
        std::vector<Atom> sorted(n);
        for (std::size_t a = 0; a < n; ++a) sorted[rank[a]] = std::move(result_.atoms[a]);
        result_.atoms = std::move(sorted);
        for (auto& a : result_.atom_of_op)
            if (a != none) a = rank[a];
        for (auto& a : result_.atom_of_data)
            if (a != none) a = rank[a];
    }

    // A backward op belongs to the atom it differentiates: one whose outputs are read by the
    // forward ops of the atom owning the backward op that wrote a gradient it reads (the loss
    // stands for the atoms it reads), preferring an atom whose forward data it also reads
    // (its saved state), the latest in the forward order; without gradients to follow, the
    // latest atom whose forward data it reads. Resolved from the loss backwards.
    void attach_backward() {
        const std::size_t n_ops = p_.op_count();
        position_.assign(n_ops, none);
        const auto order = p_.autograd_order();
        for (std::size_t i = 0; i < order.size(); ++i)
            if (position_[order[i].index] == none) position_[order[i].index] = i;
        std::vector<std::size_t> writer_of_gradient(p_.data_count(), none);
        for (std::size_t k = 0; k < n_ops; ++k)
            if (p_.op(OpId{k}).exactly_once)
                for (const DataId d : p_.op(OpId{k}).writes) writer_of_gradient[d.index] = k;
        std::vector<std::size_t> owner(n_ops, none);  // backward op → atom; the loss: "top"
        std::vector<char> resolved(n_ops, 0);
        resolved[loss_.index] = 1;
        result_.top_ops.push_back(loss_);
        for (bool progress = true; progress;) {
            progress = false;
            for (std::size_t k = 0; k < n_ops; ++k) {
                const Op& op = p_.op(OpId{k});
                if (!op.exactly_once || resolved[k]) continue;
                if (!ready(op, writer_of_gradient, resolved)) continue;
                owner[k] = owner_of(OpId{k}, writer_of_gradient, owner);
                resolved[k] = 1;
                progress = true;
            }
        }
        for (std::size_t k = 0; k < n_ops; ++k) {
            if (!p_.op(OpId{k}).exactly_once || OpId{k} == loss_) continue;
            if (!resolved[k]) owner[k] = latest_read(p_.op(OpId{k}));
            if (owner[k] == none) {
                result_.top_ops.push_back(OpId{k});
                continue;
            }
            result_.atom_of_op[k] = owner[k];
            result_.atoms[owner[k]].backward_ops.push_back(OpId{k});
        }
    }

    // Every gradient it reads comes from the loss or a backward op already placed.
    [[nodiscard]] static bool ready(const Op& op, const std::vector<std::size_t>& writer_of_gradient,
                                    const std::vector<char>& resolved) {
        for (const DataId d : op.reads)
            if (const std::size_t w = writer_of_gradient[d.index]; w != none && !resolved[w]) return false;
        return true;
    }

    [[nodiscard]] std::size_t latest_read(const Op& op) const {
        std::size_t latest = none;
        for (const DataId d : op.reads)
            if (const std::size_t a = result_.atom_of_data[d.index]; a != none && (latest == none || a > latest)) latest = a;
        return latest;
    }

    // The atoms the consumers of every gradient the op reads have in common as inputs (each
    // gradient is that of an output of the atom differentiated); among them, one whose data
    // the op reads, then one with an output of the gradients' size, then the one whose forward
    // comes closest to the op's mirror position in the autograd order.
    [[nodiscard]] std::size_t owner_of(OpId k, const std::vector<std::size_t>& writer_of_gradient,
                                       const std::vector<std::size_t>& owner) const {
        const Op& op = p_.op(k);
        std::set<std::size_t> reads_from;  // atoms whose forward data it reads
        for (const DataId d : op.reads)
            if (const std::size_t a = result_.atom_of_data[d.index]; a != none) reads_from.insert(a);
        std::optional<std::set<std::size_t>> common;
        std::set<Bytes> gradient_sizes;
        for (const DataId d : op.reads) {
            const std::size_t w = writer_of_gradient[d.index];
            if (w == none) continue;
            gradient_sizes.insert(p_.data(d).bytes);
            const std::vector<OpId> consumers = w == loss_.index ? std::vector<OpId>{loss_} : forward_ops_of(owner[w]);
            std::set<std::size_t> feeding;
            for (const OpId c : consumers)
                for (const DataId x : p_.op(c).reads)
                    if (const std::size_t a = result_.atom_of_data[x.index]; a != none && a != owner[w]) feeding.insert(a);
            if (!common) {
                common = std::move(feeding);
            } else {
                std::set<std::size_t> both;
                std::set_intersection(common->begin(), common->end(), feeding.begin(), feeding.end(),
                                      std::inserter(both, both.begin()));
                if (!both.empty()) common = std::move(both);
            }
        }
        std::vector<std::size_t> candidates(common ? common->begin() : reads_from.begin(),
                                            common ? common->end() : reads_from.end());
        if (candidates.empty()) candidates.assign(reads_from.begin(), reads_from.end());
        const auto narrow = [&](auto keep) {
            std::vector<std::size_t> kept;
            for (const std::size_t a : candidates)
                if (keep(a)) kept.push_back(a);
            if (!kept.empty()) candidates = std::move(kept);
        };
        narrow([&](std::size_t a) { return reads_from.contains(a); });
        narrow([&](std::size_t a) {
            for (const DataId d : result_.atoms[a].writes)
                if (gradient_sizes.contains(p_.data(d).bytes)) return true;
            return false;
        });
        if (candidates.empty()) return none;
        return closest_to_mirror(k, candidates);
    }

    // The candidate whose first forward op is nearest to where the autograd order mirrors the
    // op around the loss (store-all runs the backward in reverse); the latest without an order.
    [[nodiscard]] std::size_t closest_to_mirror(OpId k, const std::vector<std::size_t>& candidates) const {
        if (candidates.size() == 1 || position_.empty() || position_[k.index] == none) return candidates.back();
        const auto mirror = static_cast<double>(2 * position_[loss_.index]) - static_cast<double>(position_[k.index]);
        std::size_t best = candidates.back();
        double best_distance = std::numeric_limits<double>::infinity();
        for (const std::size_t a : candidates) {
            double distance = std::numeric_limits<double>::infinity();
            for (const OpId f : result_.atoms[a].forward_ops)
                if (position_[f.index] != none)
                    distance = std::min(distance, std::abs(static_cast<double>(position_[f.index]) - mirror));
            if (distance < best_distance) {
                best_distance = distance;
                best = a;
            }
        }
        return best;
    }

    [[nodiscard]] std::vector<OpId> forward_ops_of(std::size_t atom) const {
        return atom == none ? std::vector<OpId>{} : result_.atoms[atom].forward_ops;
    }

    const Problem& p_;
    std::string who_;
    OpId loss_{};
    std::vector<char> forward_;
    std::vector<std::size_t> position_;  // op → first position in the autograd order, or none
    Atoms result_;
};

// ---------------------------------------------------------------- the evolving graph

// The current graph of a round: nodes (atoms and clusters), forward edges between them,
// and per node the data it writes and reads.
struct Level {
    std::vector<std::size_t> nodes;                 // node ids, in forward order
    std::vector<std::set<std::size_t>> successors;  // by position
    std::vector<std::set<std::size_t>> predecessors;
    std::vector<char> read_by_loss;                  // a node's data feeds the loss (or the top)
};

struct Candidate {
    std::vector<std::size_t> members;  // positions in the level, sorted
    double score = 0.0;
};

class Clusterer {
public:
    Clusterer(const Problem& p, Atoms atoms, const HierarchyOptions& options)
        : p_(p), atoms_(std::move(atoms)), options_(options) {
        if (options_.max_children < 2) throw InvalidInput("hierarchy: max_children must be at least 2");
        hierarchy_.atoms = atoms_.atoms;
        hierarchy_.top_ops = atoms_.top_ops;
        hierarchy_.loss = *p_.loss();
        for (std::size_t a = 0; a < atoms_.atoms.size(); ++a) {
            leaf_ops_.push_back(atoms_.atoms[a].forward_ops.size() + atoms_.atoms[a].backward_ops.size());
            atoms_under_.push_back({a});
        }
    }

    [[nodiscard]] Hierarchy run() {
        std::vector<std::size_t> current(atoms_.atoms.size());
        std::iota(current.begin(), current.end(), std::size_t{0});
        for (std::size_t round = 0; round < options_.max_rounds && current.size() > options_.max_children; ++round) {
            const Level level = make_level(current);
            std::vector<Candidate> candidates = sequences(level);
            const std::vector<Candidate> regions = flows(level);
            candidates.insert(candidates.end(), regions.begin(), regions.end());
            std::vector<std::size_t> next = merge(level, std::move(candidates));
            if (next.size() == current.size()) break;  // nothing merged
            current = std::move(next);
        }
        hierarchy_.top = current;
        return std::move(hierarchy_);
    }

private:
    // The atoms under a node (kept for every node made so far).
    [[nodiscard]] const std::vector<std::size_t>& atoms_under(std::size_t node) const { return atoms_under_.at(node); }

    // Which node each atom belongs to now, and the node's data.
    Level make_level(const std::vector<std::size_t>& nodes) {
        Level level;
        level.nodes = nodes;
        const std::size_t n = nodes.size();
        std::vector<std::size_t> position_of_atom(atoms_.atoms.size(), none);
        for (std::size_t i = 0; i < n; ++i)
            for (const std::size_t a : atoms_under(nodes[i])) position_of_atom[a] = i;
        level.successors.assign(n, {});
        level.predecessors.assign(n, {});
        level.read_by_loss.assign(n, 0);
        for (std::size_t i = 0; i < n; ++i)
            for (const std::size_t a : atoms_under(nodes[i]))
                for (const OpId k : atoms_.atoms[a].forward_ops)
                    for (const DataId d : p_.op(k).reads) {
                        const std::size_t w = atoms_.atom_of_data[d.index];
                        if (w == none || position_of_atom[w] == i) continue;
                        level.successors[position_of_atom[w]].insert(i);
                        level.predecessors[i].insert(position_of_atom[w]);
                    }
        for (const OpId k : atoms_.top_ops)
            for (const DataId d : p_.op(k).reads)
                if (const std::size_t w = atoms_.atom_of_data[d.index]; w != none) level.read_by_loss[position_of_atom[w]] = 1;
        position_of_atom_ = std::move(position_of_atom);
        return level;
    }

    // Bytes of the forward data crossing the boundary of a set of positions.
    [[nodiscard]] Bytes interface_bytes(const Level& level, const std::vector<std::size_t>& members) const {
        std::vector<char> inside(level.nodes.size(), 0);
        for (const std::size_t m : members) inside[m] = 1;
        std::set<std::size_t> crossing;
        for (const std::size_t m : members)
            for (const std::size_t a : atoms_under(level.nodes[m])) {
                for (const OpId k : atoms_.atoms[a].forward_ops)
                    for (const DataId d : p_.op(k).reads) {
                        const std::size_t w = atoms_.atom_of_data[d.index];
                        if (w != none && !inside[position_of_atom_[w]]) crossing.insert(d.index);
                    }
                for (const DataId d : atoms_.atoms[a].writes) {
                    bool outside = false;
                    for (const OpId r : p_.readers(d)) {
                        const std::size_t ra = atoms_.atom_of_op[r.index];
                        outside = outside || ra == none || !inside[position_of_atom_[ra]];
                    }
                    if (outside) crossing.insert(d.index);
                }
            }
        Bytes total = 0;
        for (const std::size_t d : crossing) total += p_.data(DataId{d}).bytes;
        return total;
    }

    [[nodiscard]] std::size_t leaf_ops(const Level& level, const std::vector<std::size_t>& members) const {
        std::size_t total = 0;
        for (const std::size_t m : members)
            for (const std::size_t a : atoms_under(level.nodes[m])) total += leaf_ops_[a];
        return total;
    }

    [[nodiscard]] Candidate candidate(const Level& level, std::vector<std::size_t> members) const {
        std::sort(members.begin(), members.end());
        members.erase(std::unique(members.begin(), members.end()), members.end());
        Candidate c;
        c.score = -static_cast<double>(interface_bytes(level, members)) /
                  std::sqrt(static_cast<double>(std::max<std::size_t>(1, leaf_ops(level, members))));
        c.members = std::move(members);
        return c;
    }

    // Maximal paths of single-user nodes, cut into pieces of at most max_children.
    [[nodiscard]] std::vector<Candidate> sequences(const Level& level) const {
        const std::size_t n = level.nodes.size();
        const auto link = [&](std::size_t u) -> std::size_t {  // u's only user, if it has one
            if (level.successors[u].size() != 1 || level.read_by_loss[u]) return none;
            return *level.successors[u].begin();
        };
        std::vector<char> has_link_in(n, 0);
        for (std::size_t u = 0; u < n; ++u)
            if (const std::size_t v = link(u); v != none) has_link_in[v] = 1;
        std::vector<Candidate> out;
        for (std::size_t start = 0; start < n; ++start) {
            if (has_link_in[start] || link(start) == none) continue;
            std::vector<std::size_t> path{start};
            for (std::size_t v = link(start); v != none; v = link(v)) path.push_back(v);
            const std::size_t pieces = (path.size() + options_.max_children - 1) / options_.max_children;
            const std::size_t size = (path.size() + pieces - 1) / pieces;
            for (std::size_t from = 0; from < path.size(); from += size) {
                std::vector<std::size_t> piece(path.begin() + static_cast<std::ptrdiff_t>(from),
                                               path.begin() + static_cast<std::ptrdiff_t>(std::min(path.size(), from + size)));
                if (piece.size() >= 2) out.push_back(candidate(level, std::move(piece)));
            }
        }
        return out;
    }

    // Single-entry regions: each node with its immediate dominator and what lies between.
    [[nodiscard]] std::vector<Candidate> flows(const Level& level) const {
        const std::size_t n = level.nodes.size();
        graph::Adjacency successors(n);
        std::vector<std::size_t> roots;
        for (std::size_t u = 0; u < n; ++u) {
            successors[u].assign(level.successors[u].begin(), level.successors[u].end());
            if (level.predecessors[u].empty()) roots.push_back(u);
        }
        const graph::Adjacency with_entry = graph::with_virtual_entry(successors, roots);
        const graph::DominatorTree tree = graph::dominators(with_entry, n);
        std::vector<Candidate> out;
        for (std::size_t x = 0; x < n; ++x) {
            if (!tree.reachable(x)) continue;
            const std::size_t y = tree.idom[x];
            std::vector<std::size_t> region = graph::region_to_idom(with_entry, tree, x);
            region.erase(std::remove(region.begin(), region.end(), n), region.end());  // the virtual entry
            if (region.size() < 2) continue;
            const bool has_y = y != n;
            for (const bool keep_y : {true, false}) {
                if (!keep_y && !has_y) continue;
                for (const bool keep_x : {true, false}) {
                    std::vector<std::size_t> members;
                    for (const std::size_t v : region)
                        if ((keep_y || v != y) && (keep_x || v != x)) members.push_back(v);
                    if (members.size() >= 2 && members.size() <= options_.max_children && convex(level, members))
                        out.push_back(candidate(level, std::move(members)));
                }
            }
        }
        return out;
    }

    // No path leaves the set and comes back into it.
    [[nodiscard]] static bool convex(const Level& level, const std::vector<std::size_t>& members) {
        std::vector<char> inside(level.nodes.size(), 0), seen(level.nodes.size(), 0);
        for (const std::size_t m : members) inside[m] = 1;
        std::vector<std::size_t> work;
        for (const std::size_t m : members)
            for (const std::size_t s : level.successors[m])
                if (!inside[s] && !seen[s]) {
                    seen[s] = 1;
                    work.push_back(s);
                }
        while (!work.empty()) {
            const std::size_t u = work.back();
            work.pop_back();
            for (const std::size_t s : level.successors[u]) {
                if (inside[s]) return false;
                if (!seen[s]) {
                    seen[s] = 1;
                    work.push_back(s);
                }
            }
        }
        return true;
    }

    // The best groups that do not overlap become clusters; returns the next level's nodes.
    std::vector<std::size_t> merge(const Level& level, std::vector<Candidate> candidates) {
        std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
            if (a.score != b.score) return a.score > b.score;
            if (a.members.front() != b.members.front()) return a.members.front() < b.members.front();
            return a.members.size() > b.members.size();
        });
        const std::size_t n = level.nodes.size();
        std::vector<std::size_t> cluster_at(n, none);
        std::size_t remaining = n;
        for (const Candidate& c : candidates) {
            if (c.members.size() > options_.max_children) continue;
            if (std::any_of(c.members.begin(), c.members.end(), [&](std::size_t m) { return cluster_at[m] != none; }))
                continue;
            Cluster cluster;
            for (const std::size_t m : c.members) {
                cluster.children.push_back(level.nodes[m]);
                if (!hierarchy_.is_atom(level.nodes[m]))
                    cluster.level = std::max(cluster.level, hierarchy_.cluster(level.nodes[m]).level + 1);
            }
            const std::size_t id = hierarchy_.node_count();
            std::vector<std::size_t> under;
            for (const std::size_t child : cluster.children) under.insert(under.end(), atoms_under(child).begin(), atoms_under(child).end());
            std::sort(under.begin(), under.end());
            atoms_under_.push_back(std::move(under));
            hierarchy_.clusters.push_back(std::move(cluster));
            for (const std::size_t m : c.members) cluster_at[m] = id;
            remaining -= c.members.size() - 1;
            if (remaining <= options_.max_children) break;
        }
        // The next level: a cluster takes the place of its first member (a deterministic order;
        // the next round rebuilds the edges).
        std::vector<std::size_t> next;
        std::set<std::size_t> placed;
        for (std::size_t i = 0; i < n; ++i) {
            if (cluster_at[i] == none)
                next.push_back(level.nodes[i]);
            else if (placed.insert(cluster_at[i]).second)
                next.push_back(cluster_at[i]);
        }
        return next;
    }

    const Problem& p_;
    Atoms atoms_;
    HierarchyOptions options_;
    Hierarchy hierarchy_;
    std::vector<std::size_t> leaf_ops_;
    std::vector<std::vector<std::size_t>> atoms_under_;  // by node id
    std::vector<std::size_t> position_of_atom_;
};

}  // namespace detail::hierarchy

/// The hierarchy of clusters of an op-level training problem (see the top of this header).
[[nodiscard]] inline Hierarchy partition_hierarchy(const Problem& problem, const HierarchyOptions& options = {}) {
    detail::hierarchy::Atoms atoms = detail::hierarchy::AtomFinder(problem).run();
    if (atoms.atoms.empty())
        throw InvalidInput("hierarchy of '" + problem.name() + "': the problem has no forward op that can run");
    return detail::hierarchy::Clusterer(problem, std::move(atoms), options).run();
}

}  // namespace remat
