// RotorRelease: Rotor's DP beyond persistent schedules (solvers/rotor_release.hpp,
// solvers/rotor/branches.hpp). Against the exact search over all schedules (Exhaustive) on
// thousands of random chains of 1-6 stages: equal on every chain of up to 4 stages, the rest
// reported; never worse than Rotor, on plain and multi-option chains, with exact sizes and
// with slots; the class said in the plan.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/remat.hpp>

#include "../support/random_problems.hpp"

using namespace remat;

namespace {

Chain tiny_random_chain(std::mt19937_64& rng, std::size_t length) {
    std::uniform_int_distribution<int> size(1, 6), extra(0, 6), overhead(0, 3), fwd(1, 4), bwd(1, 6), coin(0, 2);
    Chain c{"tiny", size(rng), {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const Bytes out = size(rng);
        c.stages.push_back(Stage{std::to_string(l), double(fwd(rng)), double(bwd(rng)), out, out + extra(rng),
                                 coin(rng) == 0 ? overhead(rng) : 0, coin(rng) == 0 ? overhead(rng) : 0});
    }
    return c;
}

RotorOptions exact_sizes(RotorClass schedule_class = RotorClass::persistent) {
    RotorOptions o;
    o.slot_bytes = 1;
    o.schedule_class = schedule_class;
    return o;
}

std::optional<double> time_or_none(const auto& solver, const Problem& p, Bytes budget) {
    try {
        return solver.solve(p, budget).time;
    } catch (const Infeasible&) {
        return std::nullopt;
    }
}

}  // namespace

static_assert(Solver<RotorRelease>);

TEST_CASE("rotor-release frees a checkpoint after the next stage's forward and recomputes it: 3 stages by hand") {
    // At 38 bytes, the optimum runs F1 without grad, F2 with grad, frees a1 (6 bytes) while
    // stage 3 runs, then recomputes a1 with grad for B2 and B1: 17. A persistent schedule
    // must keep a1 and pays 21.
    const Chain chain{"release-3",
                      6,
                      {Stage{"1", 1.0, 5.0, 6, 8, 1, 0}, Stage{"2", 4.0, 1.0, 5, 9, 1, 0}, Stage{"3", 2.0, 3.0, 6, 12, 0, 0}}};
    const Problem p = to_problem(chain);
    CHECK(Exhaustive{}.solve(p, 38).time == 17.0);
    CHECK(Rotor(exact_sizes()).solve(p, 38).time == 21.0);
    const Plan plan = RotorRelease(exact_sizes()).solve(p, 38);
    CHECK(plan.time == 17.0);
    CHECK(plan.peak <= 38);
    CHECK(plan.stats.solver == "rotor-release");
    CHECK(plan.stats.status == SolveStatus::optimal);
    CHECK_THAT(plan.stats.options, Catch::Contains("class=release_early"));
    const ChainIds id = chain_ids(3);
    const auto at = [&](const Step& s) { return std::find(plan.schedule.begin(), plan.schedule.end(), s); };
    // a1 is freed before stage 3's forward and computed again (with grad) after its backward.
    CHECK(at(Step::free(id.a[1])) < at(Step::run(id.fwd_grad[3])));
    CHECK(at(Step::run(id.bwd[3])) < at(Step::run(id.fwd_grad[1])));
}

namespace {

// Random chains of 1..max_length stages in turn, `trials` in all, at six budgets each from
// below the least peak to P_ref: rotor-release against the exact search and Rotor; equality
// required up to 4 stages, the rest reported.
void compare_with_exact_search(int trials, std::size_t max_length, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Exhaustive exhaustive;
    const RotorRelease release(exact_sizes());
    const Rotor rotor(exact_sizes());
    struct Tally {
        int budgets = 0, equal = 0, rotor_equal = 0;
        double worst = 0.0;
    };
    std::vector<Tally> by_length(7);
    for (int trial = 0; trial < trials; ++trial) {
        const std::size_t length = 1 + static_cast<std::size_t>(trial) % max_length;
        const Chain chain = tiny_random_chain(rng, length);
        const Problem p = to_problem(chain);
        const Bytes least = exact_smallest_budget(p);
        const Bytes p_ref = store_all_reference(p).peak;
        INFO("trial " << trial << ", L = " << length);
        const Bytes release_least = release.smallest_budget(chain);
        CHECK(release_least <= rotor.smallest_budget(chain));
        if (length <= 4) CHECK(release_least == least);
        std::vector<Bytes> budgets{least - 1, least, least + 1, least + (p_ref - least) / 3, least + 2 * (p_ref - least) / 3,
                                   p_ref};
        for (const Bytes budget : budgets) {
            INFO("budget " << budget);
            const std::optional<double> best = time_or_none(exhaustive, p, budget);
            const std::optional<double> ours = time_or_none(release, p, budget);
            const std::optional<double> persistent = time_or_none(rotor, p, budget);
            if (!best) {
                CHECK_FALSE(ours);
                continue;
            }
            Tally& t = by_length[length];
            ++t.budgets;
            if (length <= 4) REQUIRE(ours);
            if (!ours) {
                t.worst = std::max(t.worst, 1.0);  // no plan where one exists
                continue;
            }
            CHECK(*ours >= *best);
            if (persistent) CHECK(*ours <= *persistent);
            if (length <= 4) CHECK(*ours == *best);
            if (*ours == *best) ++t.equal;
            if (persistent && *persistent == *best) ++t.rotor_equal;
            t.worst = std::max(t.worst, *ours / *best - 1.0);
        }
    }
    for (std::size_t length = 1; length <= max_length; ++length) {
        const Tally& t = by_length[length];
        WARN("L = " << length << ": rotor-release equals the exact optimum at " << t.equal << " of " << t.budgets
                    << " feasible budgets (worst gap " << 100.0 * t.worst << " %); Rotor at " << t.rotor_equal);
    }
}

}  // namespace

TEST_CASE("rotor-release equals the exact optimum on random chains of up to 4 stages", "[property]") {
    compare_with_exact_search(400, 4, 7);
}

// The comparison: 2,400 chains of 1-6 stages (about 20 s; too slow under the sanitizers).
TEST_CASE("rotor-release against the exact search on 2,400 random chains of 1-6 stages", "[slow]") {
    compare_with_exact_search(2400, 6, 2026);
}

TEST_CASE("rotor-release with slots: never worse than Rotor, within budget, the class said", "[property]") {
    std::mt19937 rng(11);
    for (const std::size_t length : {std::size_t{10}, std::size_t{40}, std::size_t{70}}) {
        const Chain chain = remat::testing::random_chain(rng, length);
        const Problem p = to_problem(chain);
        const Reference ref = store_all_reference(p);
        const Bytes least = RotorRelease{}.smallest_budget(chain);
        CHECK(least <= Rotor{}.smallest_budget(chain));
        for (const double fraction : {0.0, 0.1, 0.3, 0.6, 1.0}) {
            const Bytes budget = least + static_cast<Bytes>(fraction * static_cast<double>(ref.peak - least));
            INFO("L = " << length << ", budget " << budget);
            const Plan plan = RotorRelease{}.solve(p, budget);
            CHECK(plan.peak <= budget);
            CHECK(simulate(p, plan.schedule).valid);
            CHECK_THAT(plan.stats.options,
                       Catch::Contains(length <= release_early_max_stages ? "class=release_early" : "class=release"));
            if (const auto rotor = time_or_none(Rotor{}, p, budget)) CHECK(plan.time <= *rotor * (1 + 1e-9));
            // The narrower class is never better than the wider one.
            RotorOptions narrow;
            narrow.schedule_class = RotorClass::release;
            if (const auto r = time_or_none(RotorRelease(narrow), p, budget)) CHECK(plan.time <= *r * (1 + 1e-9));
        }
    }
}

TEST_CASE("rotor-release on multi-option chains: valid sequences never slower than Rotor's", "[property]") {
    std::mt19937_64 rng(77);
    std::uniform_int_distribution<int> size(1, 5), extra(0, 5), overhead(0, 2), time(1, 5), options(1, 3);
    int faster = 0;
    for (int trial = 0; trial < 300; ++trial) {
        RotorChain chain{"multi", size(rng), {}, 1.0, 0, std::nullopt};
        const std::size_t length = 1 + static_cast<std::size_t>(trial) % 5;
        for (std::size_t l = 0; l < length; ++l) {
            RotorStage st{size(rng), double(time(rng)), overhead(rng), {}, std::nullopt};
            const int k = options(rng);
            for (int o = 0; o < k; ++o)
                st.options.push_back(RotorOption{double(time(rng)), double(time(rng)), st.out_bytes + extra(rng),
                                                 overhead(rng), overhead(rng)});
            chain.stages.push_back(st);
        }
        const Bytes least = rotor_smallest_budget(chain, exact_sizes(RotorClass::release_early));
        CHECK(least <= rotor_smallest_budget(chain, exact_sizes()));
        for (const Bytes extra_budget : {Bytes{0}, Bytes{3}, Bytes{8}}) {
            const Bytes budget = least + extra_budget;
            INFO("trial " << trial << ", budget " << budget);
            const RotorSequence seq = rotor_plan(chain, budget, exact_sizes(RotorClass::release_early));
            const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
            REQUIRE(ev.valid);
            CHECK(ev.peak <= budget);
            CHECK(ev.time == seq.time);
            try {
                const RotorSequence persistent = rotor_plan(chain, budget, exact_sizes());
                CHECK(seq.time <= persistent.time + 1e-9);
                if (seq.time < persistent.time - 1e-9) ++faster;
            } catch (const Infeasible&) {
            }
        }
    }
    CHECK(faster > 0);
}

TEST_CASE("rotor-release refuses what Rotor refuses, by its own name") {
    const Chain chain{"two", 4, {Stage{"1", 1, 1, 4, 6, 0, 0}, Stage{"2", 1, 1, 4, 6, 0, 0}}};
    const Bytes least = RotorRelease{}.smallest_budget(chain);
    CHECK_THROWS_WITH(RotorRelease{}.solve(chain, least - 1),
                      Catch::Contains("rotor-release needs at least " + std::to_string(least)));
    ProblemBuilder b("not-a-chain");
    const DataId x = b.add_data("x", 1);
    const DataId y = b.add_data("y", 1);
    b.add_op({"f", 1.0, 0, {x}, {y}, false});
    b.add_initial(x);
    b.add_final(y);
    CHECK_THROWS_WITH(RotorRelease{}.solve(b.build(), 10), Catch::Contains("rotor-release: problem 'not-a-chain' is not a chain"));
    RotorOptions limited;
    limited.time_limit_seconds = -1.0;
    CHECK_THROWS_AS(RotorRelease(limited).solve(chain, 100), InvalidInput);
}
