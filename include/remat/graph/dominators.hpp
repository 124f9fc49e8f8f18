// remat/graph/dominators.hpp — dominator and post-dominator trees of directed graphs.
//
// Node d dominates node v (from an entry) when every path from the entry to v passes
// through d; the immediate dominator of v is its closest strict dominator. Computed with the
// iterative algorithm of Cooper, Harvey and Kennedy, "A simple, fast dominance algorithm"
// (Software Practice & Experience, 2001): intersect the dominator-tree paths of a node's
// predecessors, visiting nodes in reverse postorder until nothing changes (one pass, plus
// one that confirms it, on a DAG). Post-dominators are the dominators of the reversed graph
// from an exit. A graph with several entries gets a virtual one (with_virtual_entry).
// nodes_between() gives the nodes on the paths between a node and its immediate dominator:
// the region a 1-separator closes (Rockmate's blocks, Zhao et al., ICML 2023).
// Standard library only.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../core/errors.hpp"
#include "topological.hpp"

namespace remat::graph {

/// "No node": the immediate dominator of a node the entry does not reach.
inline constexpr std::size_t no_node = std::numeric_limits<std::size_t>::max();

/// A dominator tree: idom[root] == root; idom[v] == no_node when v is not reachable.
struct DominatorTree {
    std::size_t root = 0;
    std::vector<std::size_t> idom;
    /// Built on the reversed graph from an exit: "dominates" then means "post-dominates".
    bool post = false;

    [[nodiscard]] bool reachable(std::size_t v) const { return idom.at(v) != no_node; }

    /// Whether d (post-)dominates v; every reachable node dominates itself.
    [[nodiscard]] bool dominates(std::size_t d, std::size_t v) const {
        if (!reachable(v) || !reachable(d)) return false;
        for (std::size_t u = v;; u = idom[u]) {
            if (u == d) return true;
            if (u == root) return false;
        }
    }

    /// v, idom(v), idom(idom(v)), ..., root; empty when v is not reachable.
    [[nodiscard]] std::vector<std::size_t> dominators_of(std::size_t v) const {
        std::vector<std::size_t> chain;
        if (!reachable(v)) return chain;
        for (std::size_t u = v;; u = idom[u]) {
            chain.push_back(u);
            if (u == root) break;
        }
        return chain;
    }
};

namespace detail::dominators {

inline void check_node(const Adjacency& successors, std::size_t v, const char* what) {
    if (v >= successors.size())
        throw InvalidInput(std::string("dominators: the ") + what + " " + std::to_string(v) + " is not a node (the graph has " +
                           std::to_string(successors.size()) + " nodes)");
}

// Nodes reachable from `entry` in reverse postorder of a depth-first search that visits
// successors in the order listed.
[[nodiscard]] inline std::vector<std::size_t> reverse_postorder(const Adjacency& successors, std::size_t entry) {
    std::vector<char> seen(successors.size(), 0);
    std::vector<std::size_t> postorder;
    std::vector<std::pair<std::size_t, std::size_t>> stack{{entry, 0}};  // (node, next successor)
    seen[entry] = 1;
    while (!stack.empty()) {
        auto& [v, next] = stack.back();
        if (next < successors[v].size()) {
            const std::size_t s = successors[v][next++];
            if (!seen[s]) {
                seen[s] = 1;
                stack.emplace_back(s, 0);
            }
            continue;
        }
        postorder.push_back(v);
        stack.pop_back();
    }
    return {postorder.rbegin(), postorder.rend()};
}

// The closest common dominator of a and b in the tree built so far (rank: reverse postorder).
[[nodiscard]] inline std::size_t intersect(std::size_t a, std::size_t b, const std::vector<std::size_t>& idom,
                                           const std::vector<std::size_t>& rank) {
    while (a != b) {
        while (rank[a] > rank[b]) a = idom[a];
        while (rank[b] > rank[a]) b = idom[b];
    }
    return a;
}

// Cooper–Harvey–Kennedy on the graph given by both its edge lists.
[[nodiscard]] inline DominatorTree iterate(const Adjacency& successors, const Adjacency& predecessors, std::size_t entry) {
    const std::vector<std::size_t> rpo = reverse_postorder(successors, entry);
    std::vector<std::size_t> rank(successors.size(), no_node);
    for (std::size_t i = 0; i < rpo.size(); ++i) rank[rpo[i]] = i;
    DominatorTree tree{entry, std::vector<std::size_t>(successors.size(), no_node), false};
    std::vector<std::size_t>& idom = tree.idom;
    idom[entry] = entry;
    for (bool changed = true; changed;) {
        changed = false;
        for (const std::size_t v : rpo) {
            if (v == entry) continue;
            std::size_t candidate = no_node;
            for (const std::size_t u : predecessors[v]) {
                if (idom[u] == no_node) continue;  // unreachable, or not processed yet
                candidate = candidate == no_node ? u : intersect(u, candidate, idom, rank);
            }
            if (candidate != idom[v]) {
                idom[v] = candidate;
                changed = true;
            }
        }
    }
    return tree;
}

}  // namespace detail::dominators

/// The dominator tree of the nodes `entry` reaches. Throws InvalidInput when `entry` or an
/// edge names a node that does not exist.
[[nodiscard]] inline DominatorTree dominators(const Adjacency& successors, std::size_t entry) {
    detail::dominators::check_node(successors, entry, "entry");
    return detail::dominators::iterate(successors, reversed(successors), entry);
}

/// The post-dominator tree towards `exit`: d post-dominates v when every path from v to the
/// exit passes through d. Nodes from which the exit cannot be reached get no_node.
[[nodiscard]] inline DominatorTree post_dominators(const Adjacency& successors, std::size_t exit) {
    detail::dominators::check_node(successors, exit, "exit");
    const Adjacency predecessors = reversed(successors);
    DominatorTree tree = detail::dominators::iterate(predecessors, successors, exit);
    tree.post = true;
    return tree;
}

/// A copy of the graph with one more node, numbered successors.size(), with an edge to each of
/// `roots`: a single entry for a graph with several.
[[nodiscard]] inline Adjacency with_virtual_entry(Adjacency successors, const std::vector<std::size_t>& roots) {
    for (const std::size_t r : roots) detail::dominators::check_node(successors, r, "root");
    successors.push_back(roots);
    return successors;
}

/// The nodes on some path from `from` to `to` (both included), in increasing order; empty
/// when `to` cannot be reached from `from`.
[[nodiscard]] inline std::vector<std::size_t> nodes_between(const Adjacency& successors, std::size_t from, std::size_t to) {
    detail::dominators::check_node(successors, from, "first node");
    detail::dominators::check_node(successors, to, "last node");
    const auto reach = [](const Adjacency& edges, std::size_t start) {
        std::vector<char> seen(edges.size(), 0);
        std::vector<std::size_t> work{start};
        seen[start] = 1;
        while (!work.empty()) {
            const std::size_t v = work.back();
            work.pop_back();
            for (const std::size_t s : edges[v])
                if (!seen[s]) {
                    seen[s] = 1;
                    work.push_back(s);
                }
        }
        return seen;
    };
    const std::vector<char> after = reach(successors, from);
    const std::vector<char> before = reach(reversed(successors), to);
    std::vector<std::size_t> between;
    if (!after[to]) return between;
    for (std::size_t v = 0; v < successors.size(); ++v)
        if (after[v] && before[v]) between.push_back(v);
    return between;
}

/// The nodes on the paths between v and its immediate dominator (both included) — from the
/// dominator to v, or from v to its immediate post-dominator for a post-dominator tree —
/// `successors` being the graph the tree was built from. Just {v} for the root; empty when
/// v is not reachable.
[[nodiscard]] inline std::vector<std::size_t> region_to_idom(const Adjacency& successors, const DominatorTree& tree,
                                                             std::size_t v) {
    if (!tree.reachable(v)) return {};
    if (v == tree.root) return {v};
    const std::size_t d = tree.idom[v];
    return tree.post ? nodes_between(successors, v, d) : nodes_between(successors, d, v);
}

}  // namespace remat::graph
