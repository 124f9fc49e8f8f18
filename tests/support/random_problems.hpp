// Seeded random problems for the MILP tests and the Checkmate benchmark: chains
// (docs/formats.md §5) and training-like DAGs — forward ops reading one or two earlier
// activations (diamonds, skips), some with two outputs, each with a no-grad and a
// with-grad alternative writer, a loss, and exactly-once backward ops that write one
// gradient contribution per input read. bench_dag() draws the DAG of one of
// bench_checkmate's rows. without_autograd_order() drops a problem's order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/core/chain.hpp>
#include <remat/core/problem.hpp>

namespace remat::testing {

inline Chain random_chain(std::mt19937& rng, std::size_t length, const std::string& name = "chain") {
    std::uniform_int_distribution<int> size(1, 8);
    std::uniform_int_distribution<int> time(1, 5);
    std::uniform_int_distribution<int> coin(0, 2);
    Chain c{name, size(rng) * 16, {}};
    for (std::size_t l = 0; l < length; ++l) {
        const Bytes out = size(rng) * 16;
        const Bytes saved = out + (size(rng) - 1) * 16;
        c.stages.push_back(Stage{std::to_string(l + 1), double(time(rng)), double(time(rng)), out, saved,
                                 coin(rng) == 0 ? 16 : 0, coin(rng) == 0 ? 32 : 0});
    }
    return c;
}

struct DagShape {
    std::size_t forward_ops = 5;
    double second_input = 0.4;    // chance that a forward op reads a second earlier activation
    double second_output = 0.25;  // chance that a forward op has two outputs
    double no_grad_variant = 0.8; // chance that a forward op has a no-grad alternative writer
};

// A training step over a random DAG of forward ops. Forward op i writes its outputs o<i>
// (sometimes also o<i>.b) and, in its with-grad variant F<i>+, its saved state s<i>; the
// no-grad variant F<i> writes only the outputs. Outputs no forward op reads feed the loss.
// Backward B<i> (exactly once) reads the gradient contributions of its outputs, s<i>, its
// inputs and outputs, and writes one contribution per input; those of x are final.
inline Problem random_dag(std::mt19937& rng, const DagShape& shape, const std::string& name = "dag") {
    std::uniform_int_distribution<int> size(1, 8);
    std::uniform_int_distribution<int> time(1, 5);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    struct Act {
        std::string name;
        Bytes bytes;
    };
    struct Fwd {
        std::vector<std::size_t> inputs, outputs;
        Bytes saved;
        double fwd_time, bwd_time;
        Bytes fwd_overhead, bwd_overhead;
        bool no_grad_variant;
    };
    std::vector<Act> acts{{"x", size(rng) * 16}};
    std::vector<Fwd> fwd;
    for (std::size_t i = 0; i < shape.forward_ops; ++i) {
        Fwd f;
        std::uniform_int_distribution<std::size_t> pick(0, acts.size() - 1);
        const std::size_t first = u(rng) < 0.7 ? acts.size() - 1 : pick(rng);
        f.inputs.push_back(first);
        if (acts.size() > 1 && u(rng) < shape.second_input) {
            std::size_t second = pick(rng);
            if (second == first) second = (first + acts.size() - 1) % acts.size();
            f.inputs.push_back(second);
        }
        const std::string id = std::to_string(i + 1);
        const std::size_t outs = u(rng) < shape.second_output ? 2 : 1;
        for (std::size_t o = 0; o < outs; ++o) {
            f.outputs.push_back(acts.size());
            acts.push_back({"o" + id + (o == 0 ? "" : ".b"), size(rng) * 16});
        }
        f.saved = (size(rng) - 1) * 16;
        f.fwd_time = time(rng);
        f.bwd_time = time(rng);
        f.fwd_overhead = u(rng) < 0.3 ? 16 : 0;
        f.bwd_overhead = u(rng) < 0.3 ? 32 : 0;
        f.no_grad_variant = u(rng) < shape.no_grad_variant;
        fwd.push_back(std::move(f));
    }
    std::vector<char> consumed(acts.size(), 0);
    for (const Fwd& f : fwd)
        for (const std::size_t in : f.inputs) consumed[in] = 1;
    std::vector<std::size_t> loss_inputs;
    for (std::size_t k = 1; k < acts.size(); ++k)
        if (!consumed[k]) loss_inputs.push_back(k);

    ProblemBuilder b(name);
    std::vector<DataId> act_id;
    for (const Act& a : acts) act_id.push_back(b.add_data(a.name, a.bytes));
    b.add_initial(act_id[0]);
    std::vector<DataId> saved_id;
    // prefix + number by appending (GCC 12 warns falsely, -Wrestrict, on "literal" + std::string&& once inlined).
    const auto named = [](const char* prefix, std::size_t number) { return std::string(prefix).append(std::to_string(number)); };
    for (std::size_t i = 0; i < fwd.size(); ++i) saved_id.push_back(b.add_data(named("s", i + 1), fwd[i].saved));
    // Gradient contributions: grad_in[c][j] for consumer c (forward index, or fwd.size() for
    // the loss) and its j-th input.
    std::vector<std::vector<DataId>> grad_in(fwd.size() + 1);
    std::vector<std::vector<DataId>> grads_of_act(acts.size());
    const auto add_grads = [&](std::size_t c, const std::vector<std::size_t>& inputs, const std::string& cname) {
        for (const std::size_t j : inputs) {
            const DataId g = b.add_data("g" + cname + "." + acts[j].name, acts[j].bytes);
            grad_in[c].push_back(g);
            grads_of_act[j].push_back(g);
            if (j == 0) b.add_final(g);
        }
    };
    for (std::size_t i = 0; i < fwd.size(); ++i) add_grads(i, fwd[i].inputs, std::to_string(i + 1));
    add_grads(fwd.size(), loss_inputs, "L");

    std::vector<OpId> order;
    const auto ids = [&](const std::vector<std::size_t>& list) {
        std::vector<DataId> out;
        for (const std::size_t k : list) out.push_back(act_id[k]);
        return out;
    };
    for (std::size_t i = 0; i < fwd.size(); ++i) {
        const Fwd& f = fwd[i];
        const std::string id = std::to_string(i + 1);
        if (f.no_grad_variant) b.add_op({"F" + id, f.fwd_time, f.fwd_overhead, ids(f.inputs), ids(f.outputs), false});
        std::vector<DataId> writes = ids(f.outputs);
        writes.push_back(saved_id[i]);
        order.push_back(b.add_op({"F" + id + "+", f.fwd_time, f.fwd_overhead, ids(f.inputs), writes, false}));
    }
    order.push_back(b.add_op({"loss", 0.0, 0, ids(loss_inputs), grad_in[fwd.size()], true}));
    b.set_loss(order.back());
    for (std::size_t i = fwd.size(); i-- > 0;) {
        const Fwd& f = fwd[i];
        std::vector<DataId> reads;
        for (const std::size_t o : f.outputs)
            for (const DataId g : grads_of_act[o]) reads.push_back(g);
        reads.push_back(saved_id[i]);
        for (const DataId d : ids(f.inputs)) reads.push_back(d);
        for (const DataId d : ids(f.outputs)) reads.push_back(d);
        order.push_back(b.add_op({named("B", i + 1), f.bwd_time, f.bwd_overhead, reads, grad_in[i], true}));
    }
    b.set_autograd_order(std::move(order));
    return b.build();
}

/// The DAG of bench_checkmate's row of `target_ops` ops for `seed`, which tests that reproduce
/// a row of the benchmark draw too. A DAG of f forward ops has f with-grad forwards, f
/// backwards, the loss and a no-grad variant for about 80 % of the forwards: DAGs are drawn
/// around f = (target - 1) / 2.8, and the first whose op count is the target is kept (else
/// the closest one drawn).
inline Problem bench_dag(std::size_t target_ops, std::uint64_t seed) {
    std::mt19937 rng(static_cast<std::mt19937::result_type>(seed * 7919 + target_ops * 2 + 1));
    const long centre = std::max(1L, std::lround((double(target_ops) - 1) / 2.8));
    const auto distance = [&](const Problem& q) {
        return std::abs(static_cast<long>(q.op_count()) - static_cast<long>(target_ops));
    };
    std::optional<Problem> best;
    for (int attempt = 0; attempt < 300; ++attempt) {
        DagShape shape;
        shape.forward_ops = static_cast<std::size_t>(std::max(1L, centre + attempt % 3 - 1));
        Problem p = random_dag(rng, shape, "dag-" + std::to_string(target_ops));
        if (!best || distance(p) < distance(*best)) best = std::move(p);
        if (distance(*best) == 0) break;
    }
    return *std::move(best);
}

/// The same problem (same ids) without its `autograd` order, so that store-all chooses one.
inline Problem without_autograd_order(const Problem& p) {
    ProblemBuilder b(p.name());
    for (const Data& d : p.all_data()) b.add_data(d.name, d.bytes);
    for (const Op& op : p.all_ops()) b.add_op({op.name, op.time, op.overhead, op.reads, op.writes, op.exactly_once});
    for (const DataId d : p.initial()) b.add_initial(d);
    for (const DataId d : p.final_data()) b.add_final(d);
    if (p.loss()) b.set_loss(*p.loss());
    return b.build();
}

}  // namespace remat::testing
