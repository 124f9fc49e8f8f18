// remat/graph/topological.hpp — topological orders of directed graphs given as successor lists.
//
// Kahn, "Topological sorting of large networks", CACM 1962: repeatedly place a node all of
// whose predecessors are placed. Ties are broken deterministically, smallest node index
// first (a priority queue), so an order follows the numbering wherever the graph leaves a
// choice (files list ops in their natural order). On a graph with a cycle, the nodes that can
// never be placed (those on a cycle or behind one) are reported; a variant breaks cycles
// instead, for callers that need some order of every node.
//
// Also the op-level graph of a Problem (docs/formats.md §1 (problems)) that Checkmate (Jain et al., MLSys
// 2020) orders its ops by: an edge from every writer of a data to every other op reading it.
// Standard library only.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"

namespace remat::graph {

/// A directed graph on nodes 0..n-1: `successors[v]` lists the heads of the edges leaving v.
/// An edge listed twice counts twice (it must then be satisfied twice, which changes nothing).
using Adjacency = std::vector<std::vector<std::size_t>>;

/// The result of a topological sort.
struct TopologicalSort {
    /// The nodes placed, in order.
    std::vector<std::size_t> order;
    /// The nodes never placed, in increasing index order: those on a cycle and those reached
    /// only through one. Empty exactly when the graph is acyclic.
    std::vector<std::size_t> left;

    [[nodiscard]] bool acyclic() const noexcept { return left.empty(); }
};

/// Predecessor lists of `successors` (the reversed graph); edges are kept with multiplicity.
/// Throws InvalidInput when an edge names a node that does not exist.
[[nodiscard]] inline Adjacency reversed(const Adjacency& successors) {
    const std::size_t n = successors.size();
    Adjacency predecessors(n);
    for (std::size_t v = 0; v < n; ++v)
        for (const std::size_t s : successors[v]) {
            if (s >= n)
                throw InvalidInput("graph edge " + std::to_string(v) + " -> " + std::to_string(s) + " names node " +
                                   std::to_string(s) + ", but the graph has " + std::to_string(n) + " nodes");
            predecessors[s].push_back(v);
        }
    return predecessors;
}

namespace detail::topological {

inline constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

using MinQueue = std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>>;

// In-degrees with multiplicity; checks every edge's head.
[[nodiscard]] inline std::vector<std::size_t> in_degrees(const Adjacency& successors) {
    std::vector<std::size_t> degree(successors.size(), 0);
    for (const std::vector<std::size_t>& heads : successors)
        for (const std::size_t s : heads) {
            if (s >= successors.size())
                throw InvalidInput("graph edge to node " + std::to_string(s) + ", but the graph has " +
                                   std::to_string(successors.size()) + " nodes");
            ++degree[s];
        }
    return degree;
}

// The unplaced node of least remaining in-degree, smallest index among equals.
[[nodiscard]] inline std::size_t least_blocked(const std::vector<std::size_t>& degree, const std::vector<char>& placed) {
    std::size_t pick = none;
    for (std::size_t v = 0; v < degree.size(); ++v)
        if (!placed[v] && (pick == none || degree[v] < degree[pick])) pick = v;
    return pick;
}

// Kahn's algorithm, smallest ready index first. When nothing is ready and `break_cycles`
// is set, the unplaced node of least remaining in-degree is made ready (its remaining
// in-edges are ignored); otherwise the sort stops there.
[[nodiscard]] inline TopologicalSort kahn(const Adjacency& successors, bool break_cycles) {
    const std::size_t n = successors.size();
    std::vector<std::size_t> degree = in_degrees(successors);
    std::vector<char> placed(n, 0);
    MinQueue ready;
    for (std::size_t v = 0; v < n; ++v)
        if (degree[v] == 0) ready.push(v);
    TopologicalSort result;
    result.order.reserve(n);
    while (result.order.size() < n) {
        if (ready.empty()) {
            if (!break_cycles) break;
            const std::size_t pick = least_blocked(degree, placed);
            degree[pick] = 0;
            ready.push(pick);
        }
        const std::size_t v = ready.top();
        ready.pop();
        if (placed[v]) continue;
        placed[v] = 1;
        result.order.push_back(v);
        for (const std::size_t s : successors[v])
            if (!placed[s] && degree[s] > 0 && --degree[s] == 0) ready.push(s);
    }
    for (std::size_t v = 0; v < n; ++v)
        if (!placed[v]) result.left.push_back(v);
    return result;
}

}  // namespace detail::topological

/// Kahn's topological sort, smallest ready index first; on a cyclic graph `order` holds the
/// nodes that could be placed and `left` the others.
[[nodiscard]] inline TopologicalSort topological_sort(const Adjacency& successors) {
    return detail::topological::kahn(successors, false);
}

/// The topological order of an acyclic graph, or nullopt when it has a cycle.
[[nodiscard]] inline std::optional<std::vector<std::size_t>> topological_order(const Adjacency& successors) {
    TopologicalSort sort = topological_sort(successors);
    if (!sort.acyclic()) return std::nullopt;
    return std::move(sort.order);
}

/// An order of every node that is topological when the graph is acyclic. When the sort is
/// stuck on a cycle, the unplaced node with the fewest unplaced predecessors (smallest
/// index among equals) is placed next as if those were placed, and the sort goes on.
[[nodiscard]] inline std::vector<std::size_t> order_breaking_cycles(const Adjacency& successors) {
    return detail::topological::kahn(successors, true).order;
}

/// The op-level graph of a problem: an edge from each writer of a data to each other op that
/// reads it, listed once per pair of ops. Alternative writers of one data all get the edge.
[[nodiscard]] inline Adjacency op_dependencies(const Problem& problem) {
    const std::size_t n = problem.op_count();
    Adjacency successors(n);
    std::vector<std::size_t> last_reader(n, detail::topological::none);
    for (std::size_t k = 0; k < n; ++k)
        for (const DataId d : problem.op(OpId{k}).reads)
            for (const OpId w : problem.writers(d))
                if (w.index != k && last_reader[w.index] != k) {
                    last_reader[w.index] = k;
                    successors[w.index].push_back(k);
                }
    return successors;
}

/// Ops in a topological order of "writes what the other reads", smallest op index first where
/// the graph leaves a choice; a cycle (an op that can also be produced from its own result)
/// is broken as order_breaking_cycles() says. This is the order Checkmate numbers its ops by.
[[nodiscard]] inline std::vector<std::size_t> op_order(const Problem& problem) {
    return order_breaking_cycles(op_dependencies(problem));
}

}  // namespace remat::graph
