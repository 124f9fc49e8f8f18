// Graph utilities (remat/graph): Kahn's topological order with its ties and cycles, the
// op-level order Checkmate numbers ops by, production levels, and dominator / post-dominator
// trees checked against the definition (d dominates v iff removing d cuts v off the entry)
// on hand-built graphs and random ones.
#include <catch2/catch.hpp>

#include <cstddef>
#include <random>
#include <vector>

#include <remat/graph/dominators.hpp>
#include <remat/graph/production.hpp>
#include <remat/graph/topological.hpp>
#include <remat/remat.hpp>

using namespace remat;
using graph::Adjacency;
using Nodes = std::vector<std::size_t>;

namespace {

// Nodes reachable from `from` without passing through `removed` (graph::no_node: none removed).
std::vector<char> reachable_avoiding(const Adjacency& g, std::size_t from, std::size_t removed) {
    std::vector<char> seen(g.size(), 0);
    if (from == removed) return seen;
    std::vector<std::size_t> work{from};
    seen[from] = 1;
    while (!work.empty()) {
        const std::size_t v = work.back();
        work.pop_back();
        for (const std::size_t s : g[v])
            if (s != removed && !seen[s]) {
                seen[s] = 1;
                work.push_back(s);
            }
    }
    return seen;
}

// The definition: d dominates v iff v is reachable and every path from the entry to v
// passes through d (d == v, or v is unreachable once d is removed).
bool dominates_by_definition(const Adjacency& g, std::size_t entry, std::size_t d, std::size_t v) {
    if (!reachable_avoiding(g, entry, graph::no_node)[v]) return false;
    return d == v || !reachable_avoiding(g, entry, d)[v];
}

Adjacency random_graph(std::mt19937& rng, std::size_t n, double density, bool acyclic) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    Adjacency g(n);
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b) {
            if (a == b || (acyclic && b < a)) continue;
            if (u(rng) < density) g[a].push_back(b);
        }
    return g;
}

void check_against_definition(const Adjacency& g, std::size_t entry) {
    const graph::DominatorTree tree = graph::dominators(g, entry);
    const std::vector<char> reach = reachable_avoiding(g, entry, graph::no_node);
    for (std::size_t v = 0; v < g.size(); ++v) {
        REQUIRE(tree.reachable(v) == (reach[v] != 0));
        for (std::size_t d = 0; d < g.size(); ++d) REQUIRE(tree.dominates(d, v) == dominates_by_definition(g, entry, d, v));
        if (!reach[v] || v == entry) continue;
        // The immediate dominator: a strict dominator that every strict dominator dominates.
        const std::size_t i = tree.idom[v];
        REQUIRE(i != v);
        REQUIRE(dominates_by_definition(g, entry, i, v));
        for (std::size_t d = 0; d < g.size(); ++d)
            if (d != v && dominates_by_definition(g, entry, d, v)) REQUIRE(dominates_by_definition(g, entry, d, i));
    }
}

void check_post_dominators(const Adjacency& g, std::size_t exit) {
    const graph::DominatorTree tree = graph::post_dominators(g, exit);
    for (std::size_t v = 0; v < g.size(); ++v) {
        const bool reaches_exit = reachable_avoiding(g, v, graph::no_node)[exit] != 0;
        REQUIRE(tree.reachable(v) == reaches_exit);
        for (std::size_t d = 0; d < g.size(); ++d) {
            const bool expected = reaches_exit && (d == v || !reachable_avoiding(g, v, d)[exit]);
            REQUIRE(tree.dominates(d, v) == expected);
        }
    }
}

void check_nodes_between(const Adjacency& g, std::size_t from, std::size_t to) {
    const Nodes between = graph::nodes_between(g, from, to);
    Nodes expected;
    const std::vector<char> after = reachable_avoiding(g, from, graph::no_node);
    if (after[to])
        for (std::size_t v = 0; v < g.size(); ++v)
            if (after[v] && reachable_avoiding(g, v, graph::no_node)[to]) expected.push_back(v);
    REQUIRE(between == expected);
}

Problem two_writers_problem() {
    ProblemBuilder b("levels");
    const DataId x = b.add_data("x", 1);
    const DataId u = b.add_data("u", 1);
    const DataId y = b.add_data("y", 1);
    const DataId z = b.add_data("z", 1);
    b.add_op({"W1", 1, 0, {x, u}, {y}, false});
    b.add_op({"W2", 1, 0, {x}, {y}, false});
    b.add_op({"W3", 1, 0, {y}, {u}, false});
    b.add_op({"W4", 1, 0, {y, u}, {z}, true});
    b.add_initial(x);
    b.add_final(z);
    return b.build();
}

}  // namespace

TEST_CASE("topological order: smallest ready index first", "[graph]") {
    const Adjacency g{{}, {}, {}, {1}, {0}};  // 3 -> 1, 4 -> 0, 2 alone
    const auto order = graph::topological_order(g);
    REQUIRE(order);
    CHECK(*order == Nodes{2, 3, 1, 4, 0});
    // A chain numbered backwards: the graph decides, not the numbering.
    CHECK(graph::topological_order(Adjacency{{}, {0}, {1}, {2}}) == Nodes{3, 2, 1, 0});
    // An edge listed twice is satisfied once both copies are.
    CHECK(graph::topological_order(Adjacency{{1, 1}, {}}) == Nodes{0, 1});
    CHECK(graph::topological_order(Adjacency{})->empty());
}

TEST_CASE("topological sort reports the nodes on or behind a cycle", "[graph]") {
    const Adjacency g{{1}, {2}, {1, 4}, {}, {}};  // 1 <-> 2, 4 behind the cycle, 3 alone
    const graph::TopologicalSort sort = graph::topological_sort(g);
    CHECK_FALSE(sort.acyclic());
    CHECK(sort.order == Nodes{0, 3});
    CHECK(sort.left == Nodes{1, 2, 4});
    CHECK_FALSE(graph::topological_order(g));
    // Breaking cycles still orders every node, each once.
    const Nodes all = graph::order_breaking_cycles(g);
    CHECK(all == Nodes{0, 3, 1, 2, 4});
    CHECK(graph::order_breaking_cycles(Adjacency{{1}, {0}}) == Nodes{0, 1});
    CHECK_THROWS_AS(graph::topological_sort(Adjacency{{3}}), InvalidInput);
}

TEST_CASE("op order: writers before readers, alternatives included, cycles broken", "[graph]") {
    const Problem chain = to_problem(Chain{"c", 10, {{"1", 1, 2, 20, 50, 0, 0}, {"2", 1, 2, 30, 30, 0, 0}}});
    const Nodes order = graph::op_order(chain);
    REQUIRE(order.size() == chain.op_count());
    std::vector<std::size_t> pos(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) pos[order[i]] = i;
    for (std::size_t k = 0; k < chain.op_count(); ++k)
        for (const DataId d : chain.op(OpId{k}).reads)
            for (const OpId w : chain.writers(d)) CHECK(pos[w.index] < pos[k]);
    // W1 and W3 feed each other (y -> u -> y): the cycle is broken, every op still placed.
    const Problem cyclic = two_writers_problem();
    const graph::Adjacency deps = graph::op_dependencies(cyclic);
    CHECK_FALSE(graph::topological_order(deps));
    CHECK(graph::op_order(cyclic).size() == cyclic.op_count());
}

TEST_CASE("production levels: the round at which each data can first be produced", "[graph]") {
    const Problem p = two_writers_problem();
    const graph::ProductionLevels levels = graph::production_levels(p);
    const auto level = [&](const char* name) { return levels.data[p.data_id(name).index]; };
    CHECK(level("x") == 0);
    CHECK(level("y") == 1);  // by W2; W1 needs u, which needs y
    CHECK(level("u") == 2);
    CHECK(level("z") == 3);
    CHECK(levels.op[p.op_id("W1").index] == 3);
    CHECK(levels.first_writer(p.op_id("W2"), p.data_id("y")));
    CHECK_FALSE(levels.first_writer(p.op_id("W1"), p.data_id("y")));
    // Without W2 nothing but x can be produced.
    const graph::ProductionLevels without =
        graph::production_levels(p, [](const Op& op) { return op.name != "W2"; });
    CHECK_FALSE(without.producible(p.data_id("y")));
    CHECK_FALSE(without.runnable(p.op_id("W4")));
}

TEST_CASE("dominators of a diamond, a residual chain and U-Net-like skips", "[graph]") {
    SECTION("diamond") {
        const Adjacency g{{1, 2}, {3}, {3}, {}};
        const graph::DominatorTree t = graph::dominators(g, 0);
        CHECK(t.idom == Nodes{0, 0, 0, 0});
        CHECK(graph::region_to_idom(g, t, 3) == Nodes{0, 1, 2, 3});
        const graph::DominatorTree post = graph::post_dominators(g, 3);
        CHECK(post.idom == Nodes{3, 3, 3, 3});
        CHECK(graph::region_to_idom(g, post, 0) == Nodes{0, 1, 2, 3});
        check_against_definition(g, 0);
    }
    SECTION("residual chain: 0 -> 1 -> 2 -> 3 with a skip 0 -> 3, then 3 -> 4 -> 5") {
        const Adjacency g{{1, 3}, {2}, {3}, {4}, {5}, {}};
        const graph::DominatorTree t = graph::dominators(g, 0);
        CHECK(t.idom == Nodes{0, 0, 1, 0, 3, 4});
        CHECK(t.dominators_of(5) == Nodes{5, 4, 3, 0});
        CHECK(graph::region_to_idom(g, t, 3) == Nodes{0, 1, 2, 3});
        CHECK(graph::region_to_idom(g, t, 4) == Nodes{3, 4});
        CHECK(graph::region_to_idom(g, t, 0) == Nodes{0});
        check_against_definition(g, 0);
        check_post_dominators(g, 5);
    }
    SECTION("U-Net: e0 -> e1 -> e2 -> d2 -> d1 -> d0 with skips e0 -> d0 and e1 -> d1") {
        enum : std::size_t { e0, e1, e2, d2, d1, d0 };
        const Adjacency g{{e1, d0}, {e2, d1}, {d2}, {d1}, {d0}, {}};
        const graph::DominatorTree t = graph::dominators(g, e0);
        CHECK(t.idom[d1] == e1);
        CHECK(t.idom[d0] == e0);
        CHECK(t.dominators_of(d0) == Nodes{d0, e0});  // no 1-separator between input and output
        CHECK(graph::region_to_idom(g, t, d1) == Nodes{e1, e2, d2, d1});
        const graph::DominatorTree post = graph::post_dominators(g, d0);
        CHECK(post.idom[e0] == d0);
        CHECK(post.idom[e1] == d1);
        check_against_definition(g, e0);
        check_post_dominators(g, d0);
    }
    SECTION("two entries under a virtual root") {
        const Adjacency g{{2}, {2}, {3}, {}};
        const Adjacency rooted = graph::with_virtual_entry(g, {0, 1});
        REQUIRE(rooted.size() == 5);
        const graph::DominatorTree t = graph::dominators(rooted, 4);
        CHECK(t.idom == Nodes{4, 4, 4, 2, 4});
        check_against_definition(rooted, 4);
        CHECK_THROWS_AS(graph::with_virtual_entry(g, {7}), InvalidInput);
    }
    SECTION("unreachable nodes and bad input") {
        const Adjacency g{{1}, {}, {1}};
        const graph::DominatorTree t = graph::dominators(g, 0);
        CHECK_FALSE(t.reachable(2));
        CHECK(t.idom[2] == graph::no_node);
        CHECK_FALSE(t.dominates(2, 1));
        CHECK(t.dominators_of(2).empty());
        CHECK(graph::region_to_idom(g, t, 2).empty());
        CHECK(graph::nodes_between(g, 1, 0).empty());
        CHECK_THROWS_AS(graph::dominators(g, 3), InvalidInput);
        CHECK_THROWS_AS(graph::post_dominators(Adjacency{{5}}, 0), InvalidInput);
    }
}

TEST_CASE("dominators, post-dominators and regions match the definition on random graphs", "[graph][property]") {
    std::mt19937 rng(20240611);
    for (int trial = 0; trial < 300; ++trial) {
        const std::size_t n = 2 + static_cast<std::size_t>(trial % 11);
        const bool acyclic = trial % 3 != 0;  // CHK's iteration also handles loops
        const double density = trial % 2 == 0 ? 0.25 : 0.45;
        const Adjacency g = random_graph(rng, n, density, acyclic);
        check_against_definition(g, 0);
        check_post_dominators(g, n - 1);
        // Several entries: every node without predecessors hangs under a virtual root.
        const Adjacency preds = graph::reversed(g);
        Nodes roots;
        for (std::size_t v = 0; v < n; ++v)
            if (preds[v].empty()) roots.push_back(v);
        if (!roots.empty()) check_against_definition(graph::with_virtual_entry(g, roots), n);
        std::uniform_int_distribution<std::size_t> node(0, n - 1);
        check_nodes_between(g, node(rng), node(rng));
        const graph::DominatorTree t = graph::dominators(g, 0);
        const std::size_t v = node(rng);
        if (t.reachable(v) && v != 0) REQUIRE(graph::region_to_idom(g, t, v) == graph::nodes_between(g, t.idom[v], v));
    }
}

TEST_CASE("structure keys: equal up to renaming, different on any size or edge, and on times when asked", "[graph]") {
    const auto make = [](const std::string& prefix, Bytes y_bytes, double w2_time, bool w4_reads_u) {
        ProblemBuilder b(prefix + "problem");
        const DataId x = b.add_data(prefix + "x", 1);
        const DataId u = b.add_data(prefix + "u", 1);
        const DataId y = b.add_data(prefix + "y", y_bytes);
        const DataId z = b.add_data(prefix + "z", 1);
        b.add_op({prefix + "W1", 1, 0, {x, u}, {y}, false});
        b.add_op({prefix + "W2", w2_time, 0, {x}, {y}, false});
        b.add_op({prefix + "W3", 1, 0, {y}, {u}, false});
        b.add_op({prefix + "W4", 1, 0, w4_reads_u ? std::vector<DataId>{y, u} : std::vector<DataId>{y}, {z}, true});
        b.add_initial(x);
        b.add_final(z);
        return b.build();
    };
    const Problem base = make("a.", 1, 1.0, true);
    CHECK(graph::structure_key(base, true) == graph::structure_key(make("b.", 1, 1.0, true), true));
    CHECK(graph::structure_key(base, false) != graph::structure_key(make("a.", 2, 1.0, true), false));
    CHECK(graph::structure_key(base, false) != graph::structure_key(make("a.", 1, 1.0, false), false));
    // Times count only when asked.
    CHECK(graph::structure_key(base, false) == graph::structure_key(make("a.", 1, 3.0, true), false));
    CHECK(graph::structure_key(base, true) != graph::structure_key(make("a.", 1, 3.0, true), true));
    CHECK(graph::structure_key(base, true) == graph::structure_key(two_writers_problem(), true));  // other names
}
