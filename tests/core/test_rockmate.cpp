// Block partitioning and Rockmate (Zhao et al., ICML 2023) with the exact search as block
// solver: separators and blocks on hand-built problems, malformed problems rejected, every
// plan valid and within budget under the simulator, never slower than Rotor on chains, close
// to the exact optimum on small op-level graphs, and the gradient sizes Rotor gained for it;
// the sequence solver across blocks as a real parameter (an exact search over Rotor's action
// sequences in Rotor's place) and the analysis reused across budgets (library and remat-plan).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include <nlohmann/json.hpp>
#include <sstream>

#include "../../examples/cli/remat_plan.hpp"

#include "../support/op_level_problems.hpp"

using namespace remat;

namespace {

std::vector<std::string> names(const Problem& p, const std::vector<OpId>& ops) {
    std::vector<std::string> out;
    for (const OpId k : ops) out.push_back(p.op(k).name);
    return out;
}
std::vector<std::string> names(const Problem& p, const std::vector<DataId>& data) {
    std::vector<std::string> out;
    for (const DataId d : data) out.push_back(p.data(d).name);
    return out;
}
using Names = std::vector<std::string>;

Problem example(const std::string& file) {
    return io::load_problem(std::filesystem::path(REMAT_SOURCE_DIR) / "examples" / "problems" / file);
}

Chain random_chain(std::mt19937& rng, std::size_t length) {
    std::uniform_int_distribution<int> size(1, 8), time(1, 5), coin(0, 2);
    Chain c{"chain", size(rng) * 16, {}};
    for (std::size_t l = 0; l < length; ++l) {
        const Bytes out = size(rng) * 16;
        c.stages.push_back(Stage{std::to_string(l + 1), double(time(rng)), double(time(rng)), out,
                                 out + (size(rng) - 1) * 16, coin(rng) == 0 ? 16 : 0, coin(rng) == 0 ? 32 : 0});
    }
    return c;
}

// Budgets from `least` to `top`, `count` of them, both ends included.
std::vector<Bytes> sweep(Bytes least, Bytes top, int count) {
    std::vector<Bytes> out;
    for (int i = 0; i < count; ++i) out.push_back(least + (top - least) * i / (count - 1));
    return out;
}

RockmateOptions quiet_options() {
    RockmateOptions o;
    o.peak_budgets = 3;
    o.saved_budgets = 3;
    return o;
}

// Attention-like blocks take the exact search ~0.1 s per solve: only some networks have them.
testing::OpLevelShape shape_for(int trial) {
    testing::OpLevelShape shape;
    if (trial % 4 != 0) shape.kinds = {testing::BlockKind::chain, testing::BlockKind::residual, testing::BlockKind::diamond,
                                       testing::BlockKind::mlp};
    return shape;
}

// A second SequenceSolver: an exact search over every action sequence of Rotor's model
// (rotor_evaluate's rules and SequenceSolver's, not only the persistent schedules Rotor's DP
// builds) by Dijkstra
// on states (live activations, the option each stage saved, live gradients, backwards done,
// loss). Only for tiny chains of blocks: it proves Rockmate's second parameter is used, and
// bounds Rotor from below.
class ExactActionSearch {
public:
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "exact-action-search"; }

    friend RotorSequence sequence_plan(const ExactActionSearch&, const RotorChain& chain, Bytes budget) {
        const auto found = search(chain, budget, false);
        if (!found)
            throw Infeasible("exact-action-search: no sequence within " + std::to_string(budget) + " bytes", budget,
                             smallest(chain));
        RotorSequence seq;
        seq.actions = found->second;
        const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
        seq.time = ev.time;
        seq.peak = ev.peak;
        return seq;
    }
    friend Bytes sequence_smallest_budget(const ExactActionSearch&, const RotorChain& chain) { return smallest(chain); }

private:
    struct State {
        std::uint32_t act = 1, grad = 0, done = 0;
        std::uint64_t saved = 0;  // 8 bits per stage: option + 1, 0 when none
        bool loss = false;
        Bytes mem = 0;
        [[nodiscard]] auto key() const { return std::tie(act, grad, done, saved, loss); }
        bool operator<(const State& o) const { return key() < o.key(); }
    };

    [[nodiscard]] static Bytes smallest(const RotorChain& chain) { return search(chain, -1, true).value().first; }

    // The fastest goal path within `budget` (minimise time), or the path of least peak
    // (minimise = true: cost is the peak so far, a bottleneck path). Returns (cost, actions).
    [[nodiscard]] static std::optional<std::pair<double, std::vector<RotorAction>>> search(const RotorChain& chain,
                                                                                         Bytes budget, bool least_peak) {
        using K = RotorAction::Kind;
        const std::size_t L = chain.length();
        if (L > 8) throw InvalidInput("exact-action-search: at most 8 stages");
        const auto x = [&](std::size_t l) { return chain.activation_bytes(l); };
        const auto y = [&](std::size_t l) { return chain.gradient_bytes(l); };
        const auto bit = [](std::size_t l) { return std::uint32_t{1} << l; };
        const auto saved_of = [](const State& s, std::size_t l) { return (s.saved >> (8 * l)) & 0xff; };
        std::map<State, std::pair<double, std::pair<State, RotorAction>>> best;  // cost, (parent, action)
        using Item = std::pair<double, State>;
        struct Later {
            bool operator()(const Item& a, const Item& b) const { return a.first > b.first; }
        };
        std::priority_queue<Item, std::vector<Item>, Later> open;
        State start;
        start.mem = x(0);
        best[start] = {least_peak ? double(start.mem) : 0.0, {start, RotorAction{}}};
        open.push({best[start].first, start});
        std::size_t expanded = 0;
        while (!open.empty()) {
            // Not a structured binding: the lambda below captures both, which clang 14 refuses.
            const double cost = open.top().first;
            const State s = open.top().second;
            open.pop();
            if (cost > best.at(s).first) continue;
            if (++expanded > 2'000'000) throw SolverError("exact-action-search: too many states");
            if (s.loss && s.done == (bit(L + 1) - 2) && (s.grad & 1)) {
                std::vector<RotorAction> actions;
                for (State at = s; !(at.key() == start.key());) {
                    const auto& [parent, action] = best.at(at).second;
                    actions.push_back(action);
                    at = parent;
                }
                std::reverse(actions.begin(), actions.end());
                return std::make_pair(cost, std::move(actions));
            }
            const auto push = [&](State t, Bytes during, double time, RotorAction a) {
                const Bytes peak = std::max(during, t.mem);
                if (!least_peak && peak > budget) return;
                const double c = least_peak ? std::max(cost, double(peak)) : cost + time;
                const auto it = best.find(t);
                if (it != best.end() && it->second.first <= c) return;
                best[t] = {c, {s, a}};
                open.push({c, t});
            };
            for (std::size_t l = 1; l <= L; ++l) {
                const RotorStage& st = chain.stages[l - 1];
                const bool act_in = (s.act & bit(l - 1)) != 0, act_out = (s.act & bit(l)) != 0;
                if (act_in && !act_out && !(s.done & bit(l))) {
                    State t = s;
                    t.act |= bit(l);
                    t.mem += x(l);
                    push(t, s.mem + x(l) + st.nograd_overhead, st.nograd_time, {K::forward_nograd, l, 0});
                    for (std::size_t k = 0; k < st.options.size(); ++k) {
                        const RotorOption& o = st.options[k];
                        State u = s;
                        u.act |= bit(l);
                        u.saved |= std::uint64_t(k + 1) << (8 * l);
                        u.mem += o.saved_bytes;
                        push(u, s.mem + o.saved_bytes + o.fwd_overhead, o.fwd_time, {K::forward, l, k});
                    }
                }
                // SequenceSolver's rule: no free of a stage's input while it holds saved data.
                if (act_out && !saved_of(s, l) && (l == L || !saved_of(s, l + 1))) {
                    State t = s;
                    t.act &= ~bit(l);
                    t.mem -= x(l);
                    push(t, t.mem, 0.0, {K::free_activation, l, 0});
                }
                if (saved_of(s, l) && (s.grad & bit(l)) && act_in) {
                    const std::size_t k = saved_of(s, l) - 1;
                    const RotorOption& o = st.options[k];
                    State t = s;
                    t.mem += y(l - 1) - o.saved_bytes - y(l);
                    t.grad = (t.grad | bit(l - 1)) & ~bit(l);
                    t.act &= ~bit(l);
                    t.saved &= ~(std::uint64_t{0xff} << (8 * l));
                    t.done |= bit(l);
                    push(t, s.mem + y(l - 1) + o.bwd_overhead, o.bwd_time, {K::backward, l, k});
                }
            }
            if (!s.loss && (s.act & bit(L))) {
                State t = s;
                t.loss = true;
                t.grad |= bit(L);
                t.mem += y(L);
                push(t, s.mem + y(L) + chain.loss_overhead, chain.loss_time, {K::loss, 0, 0});
            }
        }
        return std::nullopt;
    }
};

// Breaks SequenceSolver's rule on purpose: block 1 runs without grad, and its output (block
// 2's input) is freed while block 2 holds its saved data, then recomputed with grad.
struct FreesHeldInput {
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "frees-held-input"; }
    friend RotorSequence sequence_plan(const FreesHeldInput&, const RotorChain& chain, Bytes) {
        using K = RotorAction::Kind;
        const std::size_t L = chain.length();
        RotorSequence seq;
        seq.actions.push_back({K::forward_nograd, 1, 0});
        for (std::size_t l = 2; l <= L; ++l) seq.actions.push_back({K::forward, l, 0});
        seq.actions.push_back({K::loss, 0, 0});
        for (std::size_t l = L; l >= 3; --l) seq.actions.push_back({K::backward, l, 0});
        seq.actions.push_back({K::free_activation, 1, 0});
        seq.actions.push_back({K::forward, 1, 0});
        seq.actions.push_back({K::backward, 2, 0});
        seq.actions.push_back({K::backward, 1, 0});
        return seq;
    }
    // Read only by the SequenceSolver concept (unevaluated): clang would call it unneeded.
    [[maybe_unused]] friend Bytes sequence_smallest_budget(const FreesHeldInput&, const RotorChain&) { return 0; }
};

}  // namespace

static_assert(Solver<Rockmate<>>);
static_assert(SequenceSolver<Rotor> && SequenceSolver<ExactActionSearch>);
static_assert(Solver<Rockmate<Exhaustive, ExactActionSearch>> && SequenceSolver<FreesHeldInput>);

// ------------------------------------------------------------------------------ partition

TEST_CASE("partition of a chain: one block per stage and the loss block") {
    const Chain chain{"c3", 64, {Stage{"1", 1, 2, 32, 48, 0, 0}, Stage{"2", 1, 2, 16, 16, 0, 0}, Stage{"3", 1, 2, 64, 80, 0, 0}}};
    const Problem p = to_problem(chain);
    const BlockPartition part = partition_blocks(p);
    CHECK(names(p, part.separators) == Names{"a1", "a2", "a3"});
    REQUIRE(part.blocks.size() == 4);
    for (std::size_t l = 1; l <= 3; ++l) {
        const Block& b = part.blocks[l - 1];
        const std::string s = std::to_string(l), prev = std::to_string(l - 1);
        CHECK(names(p, b.forward_ops) == Names{"F" + s, "F" + s + "+"});
        CHECK(names(p, b.backward_ops) == Names{"B" + s});
        CHECK(names(p, b.output_grads) == Names{"g" + s});
        CHECK(names(p, b.input_grads) == Names{"g" + prev});
        CHECK(b.output.has_value());
        CHECK(b.input.has_value() == (l > 1));
        CHECK_FALSE(b.has_loss);
        CHECK(b.kept_final.empty());
    }
    const Block& last = part.blocks[3];
    CHECK(last.has_loss);
    CHECK(last.forward_ops.empty());
    CHECK(last.backward_ops.empty());
    CHECK(names(p, last.input_grads) == Names{"g3"});
    CHECK(names(p, part.blocks[0].initial_reads) == Names{"a0"});

    // The block problem of stage 2: a1 initial, g1 final, the boundary reads a2 and writes g2.
    const BlockProblem bp = block_problem(p, part, 1);
    const Problem& q = bp.problem;
    CHECK(names(q, std::vector<DataId>(q.initial().begin(), q.initial().end())) == Names{"a1"});
    CHECK(names(q, std::vector<DataId>(q.final_data().begin(), q.final_data().end())) == Names{"g1"});
    const Op& boundary = q.op(bp.boundary);
    CHECK(boundary.exactly_once);
    CHECK(boundary.time == 0.0);
    CHECK(names(q, boundary.reads) == Names{"a2"});
    CHECK(names(q, boundary.writes) == Names{"g2"});
    CHECK_FALSE(bp.global_op[bp.boundary.index].has_value());
    CHECK(q.loss() == bp.boundary);
    CHECK(block_problem(p, part, 1, 1000).problem.op(bp.boundary).overhead == 1000);
    // Every local id maps back to the whole problem's data of the same name and size.
    for (std::size_t d = 0; d < q.data_count(); ++d) {
        REQUIRE(bp.global_data[d].has_value());
        CHECK(p.data(*bp.global_data[d]) == q.data(DataId{d}));
    }
    // The last block: the loss is its boundary.
    const BlockProblem lb = block_problem(p, part, 3);
    CHECK(lb.problem.op(lb.boundary).name == "loss");
    CHECK(lb.global_op[lb.boundary.index] == p.loss());
}

TEST_CASE("partition of the diamond example: cut at a and d") {
    const Problem p = example("diamond.problem.json");
    const BlockPartition part = partition_blocks(p);
    CHECK(names(p, part.separators) == Names{"a", "d"});
    REQUIRE(part.blocks.size() == 3);
    CHECK(names(p, part.blocks[0].forward_ops) == Names{"Fa", "Fa+"});
    CHECK(names(p, part.blocks[0].backward_ops) == Names{"Ba"});
    CHECK(names(p, part.blocks[0].output_grads) == Names{"ga.b", "ga.c"});
    CHECK(names(p, part.blocks[0].input_grads) == Names{"gx.a"});
    CHECK(names(p, part.blocks[1].forward_ops) == Names{"Fb", "Fb+", "Fc", "Fc+", "Fd", "Fd+"});
    CHECK(names(p, part.blocks[1].backward_ops) == Names{"Bd", "Bb", "Bc"});
    CHECK(names(p, part.blocks[1].forward_data) == Names{"b", "pb", "c", "d", "pd"});
    CHECK(names(p, part.blocks[1].output_grads) == Names{"gd"});
    CHECK(part.blocks[2].has_loss);
    CHECK(part.blocks[2].forward_ops.empty());
}

TEST_CASE("partition of the residual-block example: alternative writers and a skip from the input") {
    const Problem p = example("residual-block.problem.json");
    const BlockPartition part = partition_blocks(p);
    // h1 is bypassed by the fused Fc1relu. y is a separator too, but cutting there would make
    // the skip gradient of x (written by Bout, after y) cross two boundaries to reach Bsum:
    // the blocks around y are merged.
    CHECK(names(p, part.separators) == Names{"r", "h2", "out"});
    REQUIRE(part.blocks.size() == 4);
    CHECK(names(p, part.blocks[0].forward_ops) == Names{"Fc1", "Frelu", "Fc1relu"});
    CHECK(names(p, part.blocks[1].forward_ops) == Names{"Fc2"});
    CHECK(names(p, part.blocks[2].forward_ops) == Names{"Fbn", "Fbn+", "Fout"});
    // The skip gradient of x comes from block 3 (Fout reads x) and is summed by Bsum, which
    // can sit at most one block below: x's gradient is written in block 2 and stays live.
    CHECK(names(p, part.blocks[2].backward_ops) == Names{"Bout", "Bbn"});
    CHECK(names(p, part.blocks[1].backward_ops) == Names{"Bc2", "Brelu", "Bc1", "Bsum"});
    CHECK(names(p, part.blocks[1].kept_final) == Names{"gx"});
    CHECK(part.blocks[0].backward_ops.empty());
    CHECK(names(p, part.blocks[2].initial_reads) == Names{"x"});
    // y is read by no backward op: not cut when such separators are kept inside blocks either.
    CHECK(names(p, partition_blocks(p, PartitionOptions{false}).separators) == Names{"r", "h2", "out"});
}

TEST_CASE("partition rejects problems without the forward/backward structure") {
    {
        ProblemBuilder b("no-loss");
        const DataId x = b.add_data("x", 4), y = b.add_data("y", 4);
        b.add_op({"F", 1, 0, {x}, {y}, false});
        b.add_initial(x);
        b.add_final(y);
        const Problem p = b.build();
        CHECK_THROWS_WITH(partition_blocks(p), Catch::Contains("names no loss"));
    }
    {
        ProblemBuilder b("grad-read");
        const DataId x = b.add_data("x", 4), y = b.add_data("y", 4), g = b.add_data("g", 4), z = b.add_data("z", 4),
                     gx = b.add_data("gx", 4);
        b.add_op({"F", 1, 0, {x}, {y}, false});
        b.set_loss(b.add_op({"loss", 0, 0, {y}, {g}, true}));
        b.add_op({"Fbad", 1, 0, {g}, {z}, false});
        b.add_op({"B", 1, 0, {g, x}, {gx}, true});
        b.add_initial(x);
        b.add_final(gx);
        const Problem p = b.build();
        CHECK_THROWS_WITH(partition_blocks(p), Catch::Contains("'Fbad'") && Catch::Contains("reads gradient 'g'"));
    }
    {
        ProblemBuilder b("final-activation");
        const DataId x = b.add_data("x", 4), y = b.add_data("y", 4), g = b.add_data("g", 4);
        b.add_op({"F", 1, 0, {x}, {y}, false});
        b.set_loss(b.add_op({"loss", 0, 0, {y}, {g}, true}));
        b.add_initial(x);
        b.add_final(y);
        const Problem p = b.build();
        CHECK_THROWS_WITH(partition_blocks(p), Catch::Contains("final data 'y' is an activation"));
    }
    {
        ProblemBuilder b("mixed");
        const DataId x = b.add_data("x", 4), y = b.add_data("y", 4), g = b.add_data("g", 4);
        b.add_op({"F", 1, 0, {x}, {y}, false});
        b.set_loss(b.add_op({"loss", 0, 0, {y}, {g}, true}));
        b.add_op({"B", 1, 0, {g}, {y}, true});
        b.add_initial(x);
        b.add_final(g);
        const Problem p = b.build();
        CHECK_THROWS_WITH(partition_blocks(p), Catch::Contains("'y' is written by forward op 'F' and by backward op 'B'"));
    }
}

TEST_CASE("partition merges blocks that a backward op reads across") {
    {
        // A backward op reading activations of two blocks apart.
        const Chain chain{"c3", 8, {Stage{"1", 1, 1, 8, 8, 0, 0}, Stage{"2", 1, 1, 8, 8, 0, 0}, Stage{"3", 1, 1, 8, 8, 0, 0}}};
        const Problem c = to_problem(chain);
        ProblemBuilder b("far-read");
        for (const Data& d : c.all_data()) b.add_data(d.name, d.bytes);
        for (const Op& op : c.all_ops()) {
            std::vector<DataId> reads = op.reads;
            if (op.name == "B3") reads.push_back(c.data_id("s1"));
            b.add_op({op.name, op.time, op.overhead, reads, op.writes, op.exactly_once});
        }
        b.add_initial(c.data_id("a0"));
        b.add_final(c.data_id("g0"));
        b.set_loss(c.op_id("loss"));
        const Problem p = b.build();
        const BlockPartition part = partition_blocks(p);
        CHECK(names(p, part.separators) == Names{"a3"});
        REQUIRE(part.blocks.size() == 2);
        CHECK(names(p, part.blocks[0].backward_ops) == Names{"B3", "B2", "B1"});
        const Plan plan = Rockmate<>().solve(p, store_all_reference(p).peak);
        CHECK(plan.time == Approx(store_all_reference(p).time));
    }
}

TEST_CASE("partition of generated networks: blocks cover every op once and the block problems build") {
    std::mt19937 rng(11);
    testing::OpLevelShape shape;
    for (int trial = 0; trial < 40; ++trial) {
        shape.blocks = 1 + trial % 5;
        shape.side_inputs = trial % 3 == 0;
        shape.input_gradient = trial % 4 != 0;
        const Problem p = testing::random_op_level_problem(rng, shape, testing::numbered("net", static_cast<std::size_t>(trial)));
        const BlockPartition part = partition_blocks(p);
        REQUIRE(part.blocks.size() == part.separators.size() + 1);
        std::vector<int> seen(p.op_count(), 0);
        for (std::size_t l = 0; l < part.blocks.size(); ++l) {
            const Block& b = part.blocks[l];
            for (const OpId k : b.forward_ops) ++seen[k.index];
            for (const OpId k : b.backward_ops) ++seen[k.index];
            if (l > 0) CHECK(b.input == part.blocks[l - 1].output);
            if (l > 0) CHECK(b.input_grads == part.blocks[l - 1].output_grads);
            const BlockProblem bp = block_problem(p, part, l);
            CHECK(bp.problem.op_count() == b.forward_ops.size() + b.backward_ops.size() + 1);
        }
        ++seen[p.loss()->index];
        CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        // Without cuts at separators no backward op reads, every separator is read by one.
        for (const DataId s : partition_blocks(p, PartitionOptions{false}).separators) {
            const auto readers = p.readers(s);
            CHECK(std::any_of(readers.begin(), readers.end(), [&](OpId r) { return p.op(r).exactly_once; }));
        }
    }
}

TEST_CASE("partition and rockmate when the loss reads several activations, and with no separator at all") {
    // x → b, x → c, loss(b, c): nothing separates (x is initial), one block ending at the loss.
    testing::OpLevelBuilder g("two-heads");
    const auto x = g.input("x", 64, true);
    const auto b = g.op1({"b", {x}, {{"b", 128}}, 64, 2.0, 3.0, 0, 16, true, false});
    const auto c = g.op1({"c", {x}, {{"c", 64}}, 32, 1.0, 2.0, 0, 0, true, true});
    const Problem p = g.finish(b, 0.0, {c});
    const BlockPartition part = partition_blocks(p);
    CHECK(part.separators.empty());
    REQUIRE(part.blocks.size() == 1);
    CHECK(part.blocks[0].has_loss);
    CHECK(names(p, part.blocks[0].input_grads) == Names{"g.x.b", "g.x.c"});
    // Behind a separator: a → (b, c) → loss(b, c); the last block holds b, c and the loss.
    testing::OpLevelBuilder h("two-heads-after-a");
    const auto x2 = h.input("x", 64, true);
    const auto a = h.op1({"a", {x2}, {{"a", 64}}, 0, 1.0, 1.0, 0, 0, true, false});
    const auto b2 = h.op1({"b", {a}, {{"b", 128}}, 64, 2.0, 3.0, 0, 16, true, false});
    const auto c2 = h.op1({"c", {a}, {{"c", 64}}, 32, 1.0, 2.0, 0, 0, true, true});
    const Problem q = h.finish(b2, 0.0, {c2});
    const BlockPartition qpart = partition_blocks(q);
    CHECK(names(q, qpart.separators) == Names{"a"});
    REQUIRE(qpart.blocks.size() == 2);
    CHECK(names(q, qpart.blocks[1].forward_ops) == Names{"Fb", "Fb+", "Fc", "Fc+"});
    for (const Problem* problem : {&p, &q}) {
        const Rockmate<> rockmate;
        const Reference ref = store_all_reference(*problem);
        const Bytes least = rockmate.smallest_budget(*problem);
        for (const Bytes budget : sweep(least, ref.peak, 4)) {
            const Plan plan = rockmate.solve(*problem, budget);
            CHECK(simulate(*problem, plan.schedule).fits(budget));
            CHECK(plan.time >= Exhaustive().solve(*problem, budget).time - 1e-9);
        }
        CHECK(rockmate.solve(*problem, ref.peak).time == Approx(ref.time));
    }
}

// ----------------------------------------------------------------- rotor gradient sizes

TEST_CASE("rotor with gradient sizes distinct from activation sizes: the DP's plans are what rotor_evaluate says") {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> units(1, 6), coin(0, 1), count(1, 3);
    for (int trial = 0; trial < 200; ++trial) {
        RotorChain chain{"y", 16 * units(rng), {}, 0.0, 0, 16 * (units(rng) - 1)};
        const std::size_t L = 1 + static_cast<std::size_t>(trial % 6);
        for (std::size_t l = 1; l <= L; ++l) {
            RotorStage s{16 * units(rng), double(units(rng)), coin(rng) ? 16 : 0, {}, 16 * units(rng)};
            const Bytes y_in = chain.gradient_bytes(l - 1);
            const int k = count(rng);
            for (int i = 0; i < k; ++i) {
                const Bytes saved = s.out_bytes + 16 * (units(rng) - 1);
                const Bytes least = -std::min(y_in, saved + *s.grad_bytes);
                s.options.push_back(RotorOption{double(units(rng)), double(units(rng)), saved, coin(rng) ? 16 : 0,
                                                coin(rng) ? least : 16 * units(rng)});
            }
            chain.stages.push_back(std::move(s));
        }
        const Bytes least = rotor_smallest_budget(chain);
        const RotorEvaluation all = rotor_evaluate(chain, detail::rotor::store_all_actions(chain));
        REQUIRE(all.valid);
        double previous = std::numeric_limits<double>::infinity();
        for (const Bytes budget : sweep(least, std::max(least, all.peak), 6)) {
            const RotorSequence seq = rotor_plan(chain, budget);
            const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
            REQUIRE(ev.valid);
            CHECK(ev.peak <= budget);
            CHECK(ev.time == Approx(seq.time));
            CHECK(seq.time <= previous + 1e-9);  // more memory never hurts
            previous = seq.time;
        }
        CHECK_THROWS_AS(rotor_plan(chain, least - 1), Infeasible);
    }
}

// ----------------------------------------------------------------------- rockmate plans

TEST_CASE("rockmate plans are valid and fit on generated op-level networks") {
    std::mt19937 rng(2024);
    const Rockmate<> rockmate(quiet_options());
    int plans = 0, store_all_fits = 0;
    for (int trial = 0; trial < 30; ++trial) {
        testing::OpLevelShape shape = shape_for(trial);
        shape.blocks = 2 + trial % 4;
        shape.side_inputs = trial % 3 == 1;
        shape.input_gradient = trial % 5 != 0;
        const Problem p = testing::random_op_level_problem(rng, shape, testing::numbered("net", static_cast<std::size_t>(trial)));
        const Reference ref = store_all_reference(p);
        const RockmateModel model = rockmate.analyse(p);
        const Bytes least = rockmate.smallest_budget(model);
        CHECK(least <= ref.peak);
        double previous = std::numeric_limits<double>::infinity();
        for (const Bytes budget : sweep(least, ref.peak, 7)) {
            const Plan plan = rockmate.solve(model, budget);
            const SimulationReport r = simulate(p, plan.schedule);
            REQUIRE(r.valid);
            CHECK(r.peak <= budget);
            CHECK(r.peak == plan.peak);
            CHECK(r.time == Approx(plan.time));
            CHECK(plan.time <= previous + 1e-9);
            CHECK(plan.time >= ref.time - 1e-9);  // every op runs at least once
            previous = plan.time;
            ++plans;
        }
        // Where its model says storing everything fits, Rockmate stores everything; that is at
        // most a few percent above P_ref (Rotor's model keeps a block input until the block
        // before runs its backward, also when the block after has freed it).
        const RotorChain chain = model.rotor_chain();
        const RotorEvaluation all = rotor_evaluate(chain, detail::rotor::store_all_actions(chain));
        REQUIRE(all.valid);
        CHECK(all.peak <= ref.peak + ref.peak / 20);
        CHECK(rockmate.solve(model, std::max(all.peak, least)).time == Approx(ref.time));
        store_all_fits += rockmate.solve(model, ref.peak).time == Approx(ref.time) ? 1 : 0;
        // Below its smallest budget: Infeasible, saying that budget.
        try {
            (void)rockmate.solve(model, least - 1);
            FAIL("no Infeasible below the smallest budget");
        } catch (const Infeasible& e) {
            CHECK(e.smallest_budget() == least);
        }
    }
    CHECK(plans == 30 * 7);
    WARN("rockmate stores everything within P_ref on " << store_all_fits << " of 30 networks");
}

TEST_CASE("rockmate on chains is never slower than rotor at the same budget") {
    std::mt19937 rng(99);
    RockmateOptions options = quiet_options();
    int compared = 0, faster = 0;
    for (int trial = 0; trial < 60; ++trial) {
        const Chain chain = random_chain(rng, 1 + static_cast<std::size_t>(trial % 12));
        const Problem p = to_problem(chain);
        const Rotor rotor;
        const Rockmate<> rockmate(options);
        const RockmateModel model = rockmate.analyse(p);
        const Bytes rotor_least = rotor.smallest_budget(chain);
        const Bytes least = rockmate.smallest_budget(model);
        CHECK(least <= rotor_least);
        const Reference ref = store_all_reference(p);
        for (const Bytes budget : sweep(rotor_least, ref.peak, 8)) {
            const double t_rotor = rotor.solve(p, budget).time;
            const double t_rockmate = rockmate.solve(model, budget).time;
            CHECK(t_rockmate <= t_rotor + 1e-9);
            faster += t_rockmate < t_rotor - 1e-9 ? 1 : 0;
            ++compared;
        }
    }
    CHECK(compared == 60 * 8);
    WARN("rockmate faster than rotor on " << faster << " of " << compared << " chain budgets");
}

TEST_CASE("rockmate on small op-level graphs stays close to the exact optimum") {
    std::mt19937 rng(7);
    testing::OpLevelShape shape;
    shape.blocks = 2;
    const Rockmate<> rockmate;
    ExhaustiveOptions limits;
    limits.time_limit_seconds = 10.0;
    const Exhaustive exact(limits);
    int cases = 0, equal = 0, within10 = 0;
    double worst = 0.0, total = 0.0;
    for (int trial = 0; cases < 60 && trial < 200; ++trial) {
        const Problem p = testing::random_op_level_problem(rng, shape, testing::numbered("small", static_cast<std::size_t>(trial)));
        if (p.data_count() > 24) continue;
        const Reference ref = store_all_reference(p);
        const RockmateModel model = rockmate.analyse(p);
        const Bytes least = rockmate.smallest_budget(model);
        CHECK(least >= exact.smallest_budget(p));
        for (const Bytes budget : sweep(least, ref.peak, 4)) {
            const double t = rockmate.solve(model, budget).time;
            const double opt = exact.solve(p, budget).time;
            REQUIRE(t >= opt - 1e-9);
            const double gap = t / opt - 1.0;
            worst = std::max(worst, gap);
            total += gap;
            equal += gap < 1e-9 ? 1 : 0;
            within10 += gap <= 0.10 + 1e-9 ? 1 : 0;
            ++cases;
        }
    }
    REQUIRE(cases >= 60);
    WARN("rockmate vs exact optimum on " << cases << " (graph, budget) cases: equal " << equal << ", within 10 % "
                                         << within10 << ", mean gap " << 100.0 * total / cases << " %, worst "
                                         << 100.0 * worst << " %");
    CHECK(total / cases <= 0.05);
    CHECK(within10 * 100 >= cases * 85);
}

TEST_CASE("rockmate's sequence solver is a parameter: an exact search over rotor's actions in its place") {
    // The same blocks and options, planned across by Rotor's DP and by the exact search over
    // every action sequence of Rotor's model: both plans valid under the simulator, the
    // search never slower and never needing more memory than the DP.
    std::mt19937 rng(41);
    RotorOptions exact_slots;
    exact_slots.slots = 1'000'000;  // every budget here in whole units of the sizes' gcd: Rotor's DP is exact
    const Rockmate<Exhaustive, Rotor> by_rotor(quiet_options(), Exhaustive(), Rotor(exact_slots));
    const Rockmate<Exhaustive, ExactActionSearch> by_search(quiet_options());
    int compared = 0, equal = 0;
    for (int trial = 0; trial < 12; ++trial) {
        Problem p = trial % 2 == 0 ? to_problem(random_chain(rng, 1 + static_cast<std::size_t>(trial % 4)))
                                   : testing::random_op_level_problem(rng, [] {
                                         testing::OpLevelShape shape;
                                         shape.blocks = 1;
                                         shape.kinds = {testing::BlockKind::chain, testing::BlockKind::residual,
                                                        testing::BlockKind::diamond};
                                         return shape;
                                     }(), testing::numbered("tiny", static_cast<std::size_t>(trial)));
        const RockmateModel model = by_rotor.analyse(p);
        if (model.blocks.size() > 6) continue;
        const Bytes least_rotor = by_rotor.smallest_budget(model);
        const Bytes least_search = by_search.smallest_budget(model);
        CHECK(least_search <= least_rotor);
        try {
            (void)by_search.solve(model, least_search - 1);
            FAIL("no Infeasible below the search's smallest budget");
        } catch (const Infeasible& e) {
            CHECK(e.smallest_budget() == least_search);
        }
        const Reference ref = store_all_reference(p);
        for (const Bytes budget : sweep(least_rotor, std::max(ref.peak, least_rotor), 5)) {
            const Plan a = by_rotor.solve(model, budget);
            const Plan b = by_search.solve(model, budget);
            CHECK(simulate(p, b.schedule).fits(budget));
            CHECK(b.stats.options.find("across=exact-action-search") != std::string::npos);
            CHECK(a.stats.options.find("across=rotor") != std::string::npos);
            CHECK(b.time <= a.time + 1e-9);
            equal += b.time >= a.time - 1e-9 ? 1 : 0;
            ++compared;
        }
    }
    // A sequence solver that breaks the rule is caught, whatever its plan would cost.
    const Problem chain3 = to_problem(random_chain(rng, 3));
    const RockmateModel m3 = by_rotor.analyse(chain3);
    const Rockmate<Exhaustive, FreesHeldInput> breaks_rule(quiet_options());
    const Bytes ample = store_all_reference(chain3).peak * 2;
    CHECK_THROWS_WITH(breaks_rule.solve(m3, ample), Catch::Contains("frees the input of block 2"));
    CHECK(compared >= 40);
    WARN("exact action search equals rotor's DP across blocks on " << equal << " of " << compared << " budgets");
}

TEST_CASE("rockmate's analysis is reusable: the same plans as fresh solves, in the library and in remat-plan --sweep") {
    std::mt19937 rng(53);
    const Rockmate<> rockmate(quiet_options());
    for (int trial = 0; trial < 4; ++trial) {
        testing::OpLevelShape shape = shape_for(trial + 1);
        shape.blocks = 3;
        const Problem p = testing::random_op_level_problem(rng, shape, testing::numbered("reuse", static_cast<std::size_t>(trial)));
        const RockmateModel model = rockmate.analyse(p);
        const Reference ref = store_all_reference(p);
        const Bytes least = rockmate.smallest_budget(model);
        CHECK(least == rockmate.smallest_budget(p));
        for (const Bytes budget : sweep(least, ref.peak, 5)) {
            const Plan reused = rockmate.solve(model, budget);
            const Plan fresh = rockmate.solve(p, budget);
            CHECK(reused.schedule == fresh.schedule);
            CHECK(reused.time == fresh.time);
            CHECK(reused.peak == fresh.peak);
        }
    }
    // remat-plan analyses once for all budgets of a sweep; every row is the fresh plan.
    const std::string file = (std::filesystem::path(REMAT_SOURCE_DIR) / "examples" / "problems" / "residual-block.problem.json").string();
    std::ostringstream out, err;
    REQUIRE(cli::run_remat_plan({file, "--solver", "rockmate", "--sweep", "5", "--json"}, out, err) == cli::exit_ok);
    const nlohmann::json line = nlohmann::json::parse(out.str());
    const Problem p = example("residual-block.problem.json");
    const Rockmate<> defaults;
    CHECK(line.at("smallest_budget") == defaults.smallest_budget(p));
    REQUIRE(line.at("sweep").size() == 5);
    for (const auto& row : line.at("sweep")) {
        REQUIRE(row.at("feasible") == true);
        const Plan fresh = defaults.solve(p, row.at("budget").get<Bytes>());
        CHECK(row.at("time").get<double>() == fresh.time);
        CHECK(row.at("peak").get<Bytes>() == fresh.peak);
    }
}

namespace {

// `layers` identical MLP blocks (a linear layer, then an in-place activation).
Problem identical_mlp_blocks(const std::string& name, int layers) {
    testing::OpLevelBuilder g(name);
    auto a = g.input("x", 64, true);
    for (int i = 0; i < layers; ++i) {
        const std::string p = testing::numbered("l", static_cast<std::size_t>(i), ".");
        testing::OpLevelBuilder::OpDesc fc{p + "fc", {a}, {{p + "fc", 128}}, 64, 2.0, 4.0, 0, 32, true, false};
        const auto h = g.op1(fc);
        testing::OpLevelBuilder::OpDesc act{p + "act", {h}, {{p + "act", 64}}, 0, 1.0, 1.0, 0, 0, false, true};
        a = g.op1(act);
    }
    return g.finish(a);
}

}  // namespace

TEST_CASE("rockmate solves structurally identical blocks once") {
    // Six identical MLP blocks: one solve, five re-timed copies; the same plan as solving all.
    const Problem p = identical_mlp_blocks("mlp6", 6);
    RockmateOptions shared = quiet_options();
    RockmateOptions separate = shared;
    separate.sharing = BlockSharing::none;
    const RockmateModel m1 = Rockmate<>(shared).analyse(p);
    const RockmateModel m2 = Rockmate<>(separate).analyse(p);
    REQUIRE(m1.blocks.size() == m2.blocks.size());
    std::size_t copies = 0;
    for (const RockmateBlock& b : m1.blocks) copies += b.same_as ? 1 : 0;
    CHECK(copies >= 5);
    for (const RockmateBlock& b : m2.blocks) CHECK_FALSE(b.same_as);
    const Reference ref = store_all_reference(p);
    const Bytes least = Rockmate<>(shared).smallest_budget(m1);
    CHECK(least == Rockmate<>(separate).smallest_budget(m2));
    for (const Bytes budget : sweep(least, ref.peak, 6))
        CHECK(Rockmate<>(shared).solve(m1, budget).time == Approx(Rockmate<>(separate).solve(m2, budget).time));
}

namespace {

// A block solver that searches until its time limit (2 s when none is tightened) and then
// gives up, recording every limit it was given.
struct SlowBlockSolver {
    double limit_seconds = 2.0;
    std::shared_ptr<std::vector<double>> limits_given = std::make_shared<std::vector<double>>();

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "slow"; }
    [[nodiscard]] SlowBlockSolver with_time_limit_at_most(double seconds) const {
        SlowBlockSolver copy = *this;
        copy.limit_seconds = std::min(limit_seconds, seconds);
        limits_given->push_back(copy.limit_seconds);
        return copy;
    }
    [[nodiscard]] Plan solve(const Problem& problem, Bytes) const {
        const remat::Stopwatch clock;
        while (clock.seconds() < limit_seconds) {
        }
        throw SolverError("slow: out of time on '" + problem.name() + "'");
    }
};

}  // namespace

TEST_CASE("rockmate's block solves stop when the block's time limit does (TimeBoundedSolver)") {
    STATIC_REQUIRE(TimeBoundedSolver<Exhaustive>);
    STATIC_REQUIRE(TimeBoundedSolver<SlowBlockSolver>);
    STATIC_REQUIRE_FALSE(TimeBoundedSolver<StoreAll>);
    CHECK(time_bounded(Exhaustive{}, 2.5).options().time_limit_seconds == 2.5);
    CHECK(time_bounded(Exhaustive{}, 1e9).options().time_limit_seconds == ExhaustiveOptions{}.time_limit_seconds);
    CHECK(time_bounded(Exhaustive{}, -1.0).options().time_limit_seconds > 0);  // out of time: stops at once
    (void)time_bounded(StoreAll{}, 1.0);  // no limit to tighten: the solver itself

    const Problem p = identical_mlp_blocks("mlp3", 3);
    RockmateOptions options = quiet_options();
    options.sharing = BlockSharing::none;
    options.block_time_limit_seconds = 0.05;
    const SlowBlockSolver slow;
    const remat::Stopwatch clock;
    const RockmateModel model = Rockmate<SlowBlockSolver>(options, slow).analyse(p);
    // Unbounded, the first block alone would spin 2 s; bounded, each block stops after 0.05 s.
    CHECK(clock.seconds() < 0.05 * static_cast<double>(model.blocks.size()) + 1.0);
    REQUIRE_FALSE(slow.limits_given->empty());
    for (const double limit : *slow.limits_given) CHECK(limit <= 0.05);
    // The store-all option of every block remains: the model still plans at P_ref.
    const Reference ref = store_all_reference(p);
    CHECK(Rockmate<SlowBlockSolver>(options, slow).solve(model, ref.peak).peak <= ref.peak);
}

TEST_CASE("rockmate's time limit for the whole analysis is shared by its blocks") {
    const Problem p = identical_mlp_blocks("mlp3", 3);
    RockmateOptions options = quiet_options();
    options.sharing = BlockSharing::none;
    options.block_time_limit_seconds = 20;
    options.time_limit_seconds = 0.3;
    const SlowBlockSolver slow;
    const remat::Stopwatch clock;
    const RockmateModel model = Rockmate<SlowBlockSolver>(options, slow).analyse(p);
    REQUIRE(model.blocks.size() >= 2);
    // Every block spins until its share runs out: the whole analysis keeps to 0.3 s (and
    // far from the 20 s a block may take), and no block gets more than an even share.
    CHECK(clock.seconds() < 0.3 + 1.0);
    REQUIRE_FALSE(slow.limits_given->empty());
    const double first_share = 0.3 / static_cast<double>(model.blocks.size());
    for (const double limit : *slow.limits_given) CHECK(limit <= first_share + 0.05);
    // The blocks got their shares, not nothing.
    CHECK(*std::max_element(slow.limits_given->begin(), slow.limits_given->end()) >= 0.5 * first_share);

    options.time_limit_seconds = -1;
    CHECK_THROWS_AS(Rockmate<>(options), InvalidInput);
}

TEST_CASE("rockmate with store-all options only is rotor over blocks, never faster than the full grid") {
    std::mt19937 rng(31);
    RockmateOptions only = quiet_options();
    only.store_all_only = true;
    const Rockmate<> full(quiet_options()), blocks(only);
    for (int trial = 0; trial < 10; ++trial) {
        testing::OpLevelShape shape = shape_for(trial);
        shape.blocks = 4;
        const Problem p = testing::random_op_level_problem(rng, shape, testing::numbered("net", static_cast<std::size_t>(trial)));
        const RockmateModel mf = full.analyse(p), mb = blocks.analyse(p);
        for (const RockmateBlock& b : mb.blocks) CHECK(b.options.size() == 1);
        const Bytes least = blocks.smallest_budget(mb);
        CHECK(full.smallest_budget(mf) <= least);
        const Reference ref = store_all_reference(p);
        for (const Bytes budget : sweep(least, ref.peak, 5))
            CHECK(full.solve(mf, budget).time <= blocks.solve(mb, budget).time + 1e-9);
    }
}

TEST_CASE("rockmate on the bundled op-level examples") {
    for (const char* file : {"diamond.problem.json", "residual-block.problem.json", "tiny-chain.problem.json"}) {
        const Problem p = example(file);
        const Rockmate<> rockmate;
        const RockmateModel model = rockmate.analyse(p);
        const Reference ref = store_all_reference(p);
        const Bytes least = rockmate.smallest_budget(model);
        CHECK(least >= Exhaustive().smallest_budget(p));
        for (const Bytes budget : sweep(least, ref.peak, 5)) {
            const Plan plan = rockmate.solve(p, budget);
            CHECK(simulate(p, plan.schedule).fits(budget));
            CHECK(plan.time >= Exhaustive().solve(p, budget).time - 1e-9);
        }
    }
}
