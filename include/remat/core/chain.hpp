// remat/core/chain.hpp — the sequential special case: Rotor's stage table (docs/formats.md §5 (chains)).
//
// Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
// heterogeneous chains: how to train deep neural networks with limited memory" (2019).
// A Chain is L stages, each with forward/backward times, output and saved sizes and
// overheads. to_problem() is its exact expansion into a Problem; as_chain() recognises
// such an expansion again, so chain solvers accept either form.
#pragma once

#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "problem.hpp"

namespace remat {

struct Stage {
    std::string name;
    double fwd_time = 0.0;
    double bwd_time = 0.0;
    Bytes out_bytes = 0;
    /// Everything a forward with autograd keeps for the backward, the output included and
    /// the input excluded: saved_bytes >= out_bytes.
    Bytes saved_bytes = 0;
    Bytes fwd_overhead = 0;
    Bytes bwd_overhead = 0;
    friend bool operator==(const Stage&, const Stage&) = default;
};

struct Chain {
    std::string name;
    Bytes input_bytes = 0;
    std::vector<Stage> stages;

    [[nodiscard]] std::size_t length() const noexcept { return stages.size(); }
    /// Size of a_l, the input of stage l+1 (l = 0 is the chain input).
    [[nodiscard]] Bytes activation_bytes(std::size_t l) const {
        return l == 0 ? input_bytes : stages.at(l - 1).out_bytes;
    }
    friend bool operator==(const Chain&, const Chain&) = default;
};

/// Throws InvalidInput naming the stage when a chain breaks the rules of docs/formats.md §5 (chains).
inline void validate(const Chain& chain) {
    if (chain.name.empty()) throw InvalidInput("a chain needs a non-empty name");
    if (chain.stages.empty()) throw InvalidInput("chain " + detail::quoted(chain.name) + " has no stages");
    if (chain.input_bytes < 0) throw InvalidInput("chain " + detail::quoted(chain.name) + ": input_bytes is negative");
    for (std::size_t i = 0; i < chain.stages.size(); ++i) {
        const Stage& s = chain.stages[i];
        const std::string who =
            "chain " + detail::quoted(chain.name) + " stage " + std::to_string(i + 1) + " (" + detail::quoted(s.name) + ")";
        if (!std::isfinite(s.fwd_time) || s.fwd_time < 0) throw InvalidInput(who + ": fwd_time must be finite and >= 0");
        if (!std::isfinite(s.bwd_time) || s.bwd_time < 0) throw InvalidInput(who + ": bwd_time must be finite and >= 0");
        if (s.out_bytes < 0) throw InvalidInput(who + ": out_bytes is negative");
        if (s.fwd_overhead < 0) throw InvalidInput(who + ": fwd_overhead is negative");
        if (s.bwd_overhead < 0) throw InvalidInput(who + ": bwd_overhead is negative");
        if (s.saved_bytes < s.out_bytes)
            throw InvalidInput(who + ": saved_bytes (" + std::to_string(s.saved_bytes) + ") is below out_bytes (" +
                               std::to_string(s.out_bytes) + "); saved_bytes includes the stage's own output");
    }
}

/// Ids of the data and ops of a chain's expansion, stage by stage (l = 1..L).
struct ChainIds {
    std::vector<DataId> a;  ///< a[0..L]
    std::vector<DataId> s;  ///< s[1..L] (s[0] unused)
    std::vector<DataId> g;  ///< g[0..L]
    std::vector<OpId> fwd;       ///< F_l, no grad (fwd[0] unused)
    std::vector<OpId> fwd_grad;  ///< F_l+, keeps s_l (fwd_grad[0] unused)
    std::vector<OpId> bwd;       ///< B_l (bwd[0] unused)
    OpId loss{};
};

/// The ids that to_problem(chain) gives, computed without building the problem.
[[nodiscard]] inline ChainIds chain_ids(std::size_t length) {
    ChainIds ids;
    const std::size_t L = length;
    ids.a.resize(L + 1);
    ids.s.resize(L + 1);
    ids.g.resize(L + 1);
    ids.fwd.resize(L + 1);
    ids.fwd_grad.resize(L + 1);
    ids.bwd.resize(L + 1);
    // Data: a0, then (a_l, s_l, g_l) for each stage, then g0.
    ids.a[0] = DataId{0};
    for (std::size_t l = 1; l <= L; ++l) {
        ids.a[l] = DataId{3 * l - 2};
        ids.s[l] = DataId{3 * l - 1};
        ids.g[l] = DataId{3 * l};
    }
    ids.g[0] = DataId{3 * L + 1};
    // Ops: (F_l, F_l+) for each stage, then loss, then B_L .. B_1.
    for (std::size_t l = 1; l <= L; ++l) {
        ids.fwd[l] = OpId{2 * l - 2};
        ids.fwd_grad[l] = OpId{2 * l - 1};
        ids.bwd[l] = OpId{2 * L + 1 + (L - l)};
    }
    ids.loss = OpId{2 * L};
    return ids;
}

namespace detail::chain {
// "F" + "3" + "+" built by appending: GCC 12 warns falsely (-Wrestrict) on
// `const char* + std::string` once inlined.
[[nodiscard]] inline std::string stage_name(std::string_view prefix, std::size_t stage, std::string_view suffix = {}) {
    std::string name(prefix);
    name.append(std::to_string(stage)).append(suffix);
    return name;
}
}  // namespace detail::chain

/// Display names of the chain's units for Plan::explain and the timeline (ExplainOptions::
/// labels): unit "3" (the ops F3, B3, ... of to_problem) shows as stage 3's name, prefixed
/// by the stage number when `numbered` ("3 layer2.conv1"); unnamed stages keep their number.
[[nodiscard]] inline std::map<std::string, std::string> stage_labels(const Chain& chain, bool numbered = false) {
    std::map<std::string, std::string> labels;
    for (std::size_t i = 0; i < chain.stages.size(); ++i) {
        const std::string& name = chain.stages[i].name;
        if (name.empty()) continue;
        const std::string unit = std::to_string(i + 1);
        labels[unit] = numbered ? unit + " " + name : name;
    }
    return labels;
}

/// The exact expansion of docs/formats.md §5 (chains).
[[nodiscard]] inline Problem to_problem(const Chain& chain) {
    validate(chain);
    const std::size_t L = chain.length();
    ProblemBuilder b(chain.name);
    std::vector<DataId> a(L + 1), s(L + 1), g(L + 1);
    a[0] = b.add_data("a0", chain.input_bytes);
    for (std::size_t l = 1; l <= L; ++l) {
        const Stage& st = chain.stages[l - 1];
        a[l] = b.add_data(detail::chain::stage_name("a", l), st.out_bytes);
        s[l] = b.add_data(detail::chain::stage_name("s", l), st.saved_bytes - st.out_bytes);
        g[l] = b.add_data(detail::chain::stage_name("g", l), st.out_bytes);
    }
    g[0] = b.add_data("g0", chain.input_bytes);
    std::vector<OpId> order;
    for (std::size_t l = 1; l <= L; ++l) {
        const Stage& st = chain.stages[l - 1];
        b.add_op({detail::chain::stage_name("F", l), st.fwd_time, st.fwd_overhead, {a[l - 1]}, {a[l]}, false});
        order.push_back(
            b.add_op({detail::chain::stage_name("F", l, "+"), st.fwd_time, st.fwd_overhead, {a[l - 1]}, {a[l], s[l]},
                      false}));
    }
    const OpId loss = b.add_op({"loss", 0.0, 0, {a[L]}, {g[L]}, true});
    order.push_back(loss);
    for (std::size_t l = L; l >= 1; --l) {
        const Stage& st = chain.stages[l - 1];
        order.push_back(
            b.add_op({detail::chain::stage_name("B", l), st.bwd_time, st.bwd_overhead, {g[l], s[l], a[l], a[l - 1]},
                      {g[l - 1]}, true}));
    }
    b.add_initial(a[0]);
    b.add_final(g[0]);
    b.set_loss(loss);
    b.set_autograd_order(std::move(order));
    return b.build();
}

/// Recognises a problem that is exactly the expansion of some chain (names, sizes, times,
/// reads, writes and flags all as to_problem makes them). Stage names, which the
/// expansion does not keep, become "1".."L".
[[nodiscard]] inline std::optional<Chain> as_chain(const Problem& problem) {
    const auto a0 = problem.find_data("a0");
    if (!a0 || problem.data_count() < 5 || (problem.data_count() - 2) % 3 != 0) return std::nullopt;
    const std::size_t L = (problem.data_count() - 2) / 3;
    if (problem.op_count() != 3 * L + 1) return std::nullopt;
    Chain chain{problem.name(), problem.data(*a0).bytes, {}};
    for (std::size_t l = 1; l <= L; ++l) {
        const auto fwd = problem.find_op(detail::chain::stage_name("F", l, "+"));
        const auto bwd = problem.find_op(detail::chain::stage_name("B", l));
        const auto a = problem.find_data(detail::chain::stage_name("a", l));
        const auto s = problem.find_data(detail::chain::stage_name("s", l));
        if (!fwd || !bwd || !a || !s) return std::nullopt;
        const Op& f = problem.op(*fwd);
        const Op& bw = problem.op(*bwd);
        const Bytes out = problem.data(*a).bytes;
        chain.stages.push_back(Stage{std::to_string(l), f.time, bw.time, out, out + problem.data(*s).bytes, f.overhead, bw.overhead});
    }
    try {
        if (to_problem(chain) == problem) return chain;
    } catch (const InvalidInput&) {
    }
    return std::nullopt;
}

}  // namespace remat
