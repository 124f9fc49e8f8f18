// Rotor (Beaumont et al. 2019): exact within its model against an independent enumeration
// of persistent schedules, never below the exact optimum over all schedules, and the
// properties of the issue on random chains of up to 60 stages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/remat.hpp>

using namespace remat;

namespace {

// ---------------------------------------------------------------- persistent enumeration
// Every persistent schedule of sub-chain (a, b) as concrete steps of the §5 expansion,
// written from the definition and independent of the DP: at every level the first stage
// runs with grad (F_all) and the rest is back-propagated above it, or runs without grad
// keeping its input (F_ck), followed by no-grad forwards freeing their inputs (F∅) up to a
// checkpoint a_{j-1}; the part above the checkpoint is done first, the checkpoint freed,
// then the part below. Data are freed when nothing reads them before they are rewritten.
std::vector<Schedule> persistent_schedules(const ChainIds& id, std::size_t L, std::size_t a, std::size_t b) {
    const auto backward = [&](std::size_t l, Schedule& s) {
        s.push_back(Step::run(id.bwd[l]));
        s.push_back(Step::free(id.g[l]));
        s.push_back(Step::free(id.s[l]));
        s.push_back(Step::free(id.a[l]));
    };
    std::vector<Schedule> all;
    if (a == b) {
        Schedule s{Step::run(id.fwd_grad[a])};
        if (a == L) s.push_back(Step::run(id.loss));
        backward(a, s);
        all.push_back(s);
        return all;
    }
    for (const Schedule& above : persistent_schedules(id, L, a + 1, b)) {
        Schedule s{Step::run(id.fwd_grad[a])};
        s.insert(s.end(), above.begin(), above.end());
        backward(a, s);
        all.push_back(std::move(s));
    }
    for (std::size_t j = a + 1; j <= b; ++j) {
        Schedule head{Step::run(id.fwd[a])};
        for (std::size_t l = a + 1; l < j; ++l) {
            head.push_back(Step::run(id.fwd[l]));
            head.push_back(Step::free(id.a[l - 1]));
        }
        const std::vector<Schedule> aboves = persistent_schedules(id, L, j, b);
        const std::vector<Schedule> belows = persistent_schedules(id, L, a, j - 1);
        for (const Schedule& above : aboves)
            for (const Schedule& below : belows) {
                Schedule s = head;
                s.insert(s.end(), above.begin(), above.end());
                s.push_back(Step::free(id.a[j - 1]));
                s.insert(s.end(), below.begin(), below.end());
                all.push_back(std::move(s));
            }
    }
    return all;
}

struct Enumerated {
    std::vector<SimulationReport> reports;
    Bytes least_peak = std::numeric_limits<Bytes>::max();
    /// Fastest persistent schedule within `budget`, if any.
    [[nodiscard]] std::optional<double> best(Bytes budget) const {
        std::optional<double> t;
        for (const SimulationReport& r : reports)
            if (r.fits(budget) && (!t || r.time < *t)) t = r.time;
        return t;
    }
};

Enumerated enumerate_persistent(const Chain& chain) {
    const Problem p = to_problem(chain);
    Enumerated e;
    for (const Schedule& s : persistent_schedules(chain_ids(chain.length()), chain.length(), 1, chain.length())) {
        SimulationReport r = simulate(p, s);
        REQUIRE(r.valid);
        e.least_peak = std::min(e.least_peak, r.peak);
        e.reports.push_back(std::move(r));
    }
    return e;
}

// Small integer sizes and times, so that slot_bytes = 1 is exact and sums of times are exact.
Chain tiny_chain(std::mt19937_64& rng, std::size_t length) {
    std::uniform_int_distribution<int> size(1, 6), extra(0, 6), overhead(0, 3), fwd(1, 4), bwd(1, 6), coin(0, 2);
    Chain c{"tiny", size(rng), {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const Bytes out = size(rng);
        c.stages.push_back(Stage{std::to_string(l), double(fwd(rng)), double(bwd(rng)), out, out + extra(rng),
                                 coin(rng) == 0 ? overhead(rng) : 0, coin(rng) == 0 ? overhead(rng) : 0});
    }
    return c;
}

Rotor exact_rotor() {
    RotorOptions options;
    options.slot_bytes = 1;
    return Rotor(options);
}

// Sizes in multiples of `unit`; times are arbitrary doubles.
Chain unit_chain(std::mt19937_64& rng, std::size_t length, Bytes unit) {
    std::uniform_int_distribution<int> size(1, 8), extra(0, 8), overhead(0, 2);
    std::uniform_real_distribution<double> time(0.1, 3.0);
    Chain c{"unit", size(rng) * unit, {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const Bytes out = size(rng) * unit;
        c.stages.push_back(Stage{std::to_string(l), time(rng), time(rng), out, out + extra(rng) * unit,
                                 overhead(rng) * unit, overhead(rng) * unit});
    }
    return c;
}

// Arbitrary byte sizes: slot rounding is never exact.
Chain byte_chain(std::mt19937_64& rng, std::size_t length) {
    std::uniform_int_distribution<Bytes> size(1000, 1'000'000), extra(0, 2'000'000), overhead(0, 300'000);
    std::uniform_real_distribution<double> time(0.1, 3.0);
    Chain c{"bytes", size(rng), {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const Bytes out = size(rng);
        c.stages.push_back(Stage{std::to_string(l), time(rng), time(rng), out, out + extra(rng), overhead(rng), overhead(rng)});
    }
    return c;
}

// The plan's figures are the simulator's, and it fits.
void check_plan(const Problem& p, const Plan& plan, Bytes budget) {
    const SimulationReport r = simulate(p, plan.schedule);
    REQUIRE(r.valid);
    CHECK(r.peak <= budget);
    CHECK(r.peak == plan.peak);
    CHECK(r.time == Approx(plan.time));
}

std::optional<Bytes> infeasible_smallest(const auto& solver, const Problem& p, Bytes budget) {
    try {
        (void)solver.solve(p, budget);
    } catch (const Infeasible& e) {
        CHECK(e.budget() == budget);
        return e.smallest_budget();
    }
    return std::nullopt;
}

}  // namespace

static_assert(Solver<Rotor> && Solver<Periodic>);

TEST_CASE("rotor on tiny-chain: smallest feasible budget 25088, optimum 3.0") {
    const Chain chain{"tiny-chain", 4096, {Stage{"l1", 1.0, 2.0, 4096, 12288, 0, 512}}};
    const Problem p = to_problem(chain);
    CHECK(rotor_smallest_budget(to_rotor_chain(chain)) == 25088);
    CHECK(exact_smallest_budget(p) == 25088);
    for (const Rotor& rotor : {Rotor{}, exact_rotor()}) {
        const Plan plan = rotor.solve(p, 25088);
        CHECK(plan.time == 3.0);
        CHECK(plan.peak == 25088);
        CHECK(plan.stats.solver == "rotor");
        CHECK(plan.stats.status == SolveStatus::optimal);
        const auto smallest = infeasible_smallest(rotor, p, 25087);
        REQUIRE(smallest);
        CHECK(*smallest == 25088);
    }
    CHECK_THROWS_WITH(Rotor{}.solve(p, 1000), Catch::Contains("25088"));
}

TEST_CASE("rotor is exact within its model and never below the optimum over all schedules") {
    std::mt19937_64 rng(2019);
    const Exhaustive exhaustive;
    int chains = 0, budgets = 0, both_feasible = 0, persistent_slower = 0, persistent_infeasible = 0, rotor_plans = 0;
    for (int trial = 0; trial < 240; ++trial) {
        const std::size_t length = 1 + static_cast<std::size_t>(trial) % 4;
        const Chain chain = tiny_chain(rng, length);
        const Problem p = to_problem(chain);
        const Enumerated persistent = enumerate_persistent(chain);
        const Bytes all_least = exact_smallest_budget(p);
        const Bytes p_ref = store_all_reference(p).peak;
        INFO("trial " << trial << ", L = " << length);
        ++chains;
        // The smallest budget of Rotor is the least peak of any persistent schedule.
        REQUIRE(rotor_smallest_budget(to_rotor_chain(chain)) == persistent.least_peak);
        REQUIRE(persistent.least_peak >= all_least);

        std::vector<Bytes> candidates{all_least - 1, all_least, persistent.least_peak - 1, persistent.least_peak,
                                      persistent.least_peak + 1, (persistent.least_peak + p_ref) / 2, p_ref - 1, p_ref};
        std::sort(candidates.begin(), candidates.end());
        candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
        for (const Bytes budget : candidates) {
            if (budget < 0) continue;
            INFO("budget " << budget);
            ++budgets;
            const std::optional<double> best_persistent = persistent.best(budget);
            std::optional<double> best_any;
            try {
                best_any = exhaustive.solve(p, budget).time;
            } catch (const Infeasible& e) {
                CHECK(e.smallest_budget() == all_least);
            }
            CHECK(best_any.has_value() == (budget >= all_least));
            for (const Rotor& rotor : {exact_rotor(), Rotor{}}) {
                if (best_persistent) {
                    const Plan plan = rotor.solve(p, budget);
                    ++rotor_plans;
                    check_plan(p, plan, budget);
                    CHECK(plan.time == *best_persistent);
                    REQUIRE(best_any);
                    CHECK(plan.time >= *best_any);
                } else {
                    const auto smallest = infeasible_smallest(rotor, p, budget);
                    REQUIRE(smallest);
                    CHECK(*smallest == persistent.least_peak);
                }
            }
            if (best_persistent) ++both_feasible;
            if (best_persistent && *best_persistent > *best_any) ++persistent_slower;
            if (!best_persistent && best_any) ++persistent_infeasible;
        }
    }
    WARN("rotor exactness: " << chains << " chains of 1-4 stages, " << budgets << " budgets, " << rotor_plans
                             << " rotor plans; the persistent optimum was slower than the optimum over all schedules at "
                             << persistent_slower << " of the " << both_feasible
                             << " budgets where both are feasible, and infeasible while some schedule fits at "
                             << persistent_infeasible << " budgets");
}

TEST_CASE("the multi-option DP is exact against an enumeration of options and branches") {
    // Persistent action sequences with a choice of option at every with-grad forward.
    using K = RotorAction::Kind;
    std::mt19937_64 rng(77);
    std::uniform_int_distribution<int> size(1, 5), extra(0, 5), overhead(0, 2), time(1, 5), options(1, 3);
    const auto enumerate = [](const RotorChain& chain) {
        const std::size_t L = chain.length();
        const auto rec = [&](const auto& self, std::size_t a, std::size_t b) -> std::vector<std::vector<RotorAction>> {
            std::vector<std::vector<RotorAction>> all;
            for (std::size_t k = 0; k < chain.stages[a - 1].options.size(); ++k) {
                if (a == b) {
                    std::vector<RotorAction> s{{K::forward, a, k}};
                    if (a == L) s.push_back({K::loss, 0, 0});
                    s.push_back({K::backward, a, k});
                    all.push_back(s);
                    continue;
                }
                for (const auto& above : self(self, a + 1, b)) {
                    std::vector<RotorAction> s{{K::forward, a, k}};
                    s.insert(s.end(), above.begin(), above.end());
                    s.push_back({K::backward, a, k});
                    all.push_back(std::move(s));
                }
            }
            for (std::size_t j = a + 1; j <= b; ++j) {
                std::vector<RotorAction> head{{K::forward_nograd, a, 0}};
                for (std::size_t l = a + 1; l < j; ++l) {
                    head.push_back({K::forward_nograd, l, 0});
                    head.push_back({K::free_activation, l - 1, 0});
                }
                for (const auto& above : self(self, j, b))
                    for (const auto& below : self(self, a, j - 1)) {
                        auto s = head;
                        s.insert(s.end(), above.begin(), above.end());
                        s.push_back({K::free_activation, j - 1, 0});
                        s.insert(s.end(), below.begin(), below.end());
                        all.push_back(std::move(s));
                    }
            }
            return all;
        };
        return rec(rec, 1, L);
    };
    int checked = 0;
    for (int trial = 0; trial < 120; ++trial) {
        RotorChain chain{"options", size(rng), {}, trial % 2 == 0 ? 0.0 : 1.0, trial % 3 == 0 ? 2 : 0, std::nullopt};
        const std::size_t length = 1 + static_cast<std::size_t>(trial) % 3;
        for (std::size_t l = 1; l <= length; ++l) {
            RotorStage stage{size(rng), double(time(rng)), overhead(rng), {}, std::nullopt};
            const Bytes in = chain.activation_bytes(l - 1);
            const int count = options(rng);
            for (int k = 0; k < count; ++k) {
                const Bytes saved = stage.out_bytes + extra(rng);
                // Backward overheads down to the least the rules allow (a block that frees
                // its output gradient before writing the input gradient).
                const Bytes least = -std::min(in, saved + stage.out_bytes);
                std::uniform_int_distribution<Bytes> bwd_overhead(least, 3);
                stage.options.push_back({double(time(rng)), double(time(rng)), saved, Bytes(overhead(rng)), bwd_overhead(rng)});
            }
            chain.stages.push_back(stage);
        }
        INFO("trial " << trial);
        const auto sequences = enumerate(chain);
        std::vector<RotorEvaluation> evals;
        Bytes least = std::numeric_limits<Bytes>::max(), most = 0;
        for (const auto& s : sequences) {
            evals.push_back(rotor_evaluate(chain, s));
            REQUIRE(evals.back().valid);
            least = std::min(least, evals.back().peak);
            most = std::max(most, evals.back().peak);
        }
        CHECK(rotor_smallest_budget(chain) == least);
        RotorOptions exact;
        exact.slot_bytes = 1;
        for (Bytes budget = least - 1; budget <= most; ++budget) {
            std::optional<double> best;
            for (const RotorEvaluation& e : evals)
                if (e.peak <= budget && (!best || e.time < *best)) best = e.time;
            if (!best) {
                CHECK_THROWS_AS(rotor_plan(chain, budget, exact), Infeasible);
                continue;
            }
            const RotorSequence seq = rotor_plan(chain, budget, exact);
            const RotorEvaluation ev = rotor_evaluate(chain, seq.actions);
            REQUIRE(ev.valid);
            CHECK(ev.peak <= budget);
            CHECK(seq.peak == ev.peak);
            CHECK(seq.time == *best);
            ++checked;
        }
    }
    CHECK(checked > 500);
}

TEST_CASE("rotor_evaluate names what is wrong with an action sequence") {
    using K = RotorAction::Kind;
    const RotorChain chain = to_rotor_chain(Chain{"c", 4, {Stage{"1", 1, 2, 4, 8, 0, 0}, Stage{"2", 1, 2, 4, 8, 0, 0}}});
    CHECK_THAT(rotor_evaluate(chain, {{K::backward, 1, 0}}).error, Catch::Contains("without the saved data"));
    CHECK_THAT(rotor_evaluate(chain, {{K::forward, 2, 0}}).error, Catch::Contains("without its input"));
    CHECK_THAT(rotor_evaluate(chain, {{K::forward, 1, 0}, {K::loss, 0, 0}}).error, Catch::Contains("loss without"));
    CHECK_THAT(rotor_evaluate(chain, {{K::forward, 1, 0}, {K::free_activation, 1, 0}}).error, Catch::Contains("hold it"));
    CHECK_THAT(rotor_evaluate(chain, {{K::free_activation, 0, 0}}).error, Catch::Contains("never freed"));
    CHECK_THAT(rotor_evaluate(chain, {{K::forward, 1, 0}, {K::forward, 2, 0}, {K::loss, 0, 0}, {K::backward, 2, 0}}).error,
               Catch::Contains("backward of stage 1 never ran"));
    CHECK(rotor_evaluate(chain, {{K::forward, 1, 0}, {K::forward, 2, 0}, {K::loss, 0, 0}, {K::backward, 2, 0}, {K::backward, 1, 0}})
              .valid);
}

TEST_CASE("rotor rejects bad input") {
    ProblemBuilder b("not-a-chain");
    const DataId x = b.add_data("x", 4);
    const DataId y = b.add_data("y", 4);
    b.add_op({"f", 1.0, 0, {x}, {y}, true});
    b.add_initial(x);
    b.add_final(y);
    CHECK_THROWS_WITH(Rotor{}.solve(b.build(), 100), Catch::Contains("not a chain") && Catch::Contains("rockmate"));
    const Chain chain{"c", 4, {Stage{"1", 1, 2, 4, 8, 0, 0}}};
    RotorOptions zero_slots;
    zero_slots.slots = 0;
    CHECK_THROWS_AS(Rotor(zero_slots).solve(chain, 100), InvalidInput);
    RotorOptions zero_slot_bytes;
    zero_slot_bytes.slot_bytes = 0;
    CHECK_THROWS_AS(Rotor(zero_slot_bytes).solve(chain, 100), InvalidInput);
    RotorChain no_options = to_rotor_chain(chain);
    no_options.stages[0].options.clear();
    CHECK_THROWS_WITH(rotor_plan(no_options, 100), Catch::Contains("stage 1 has no options"));
    RotorChain low_overhead = to_rotor_chain(chain);
    low_overhead.stages[0].options[0].bwd_overhead = -5;  // below −x_0 = −4
    CHECK_THROWS_WITH(rotor_plan(low_overhead, 100), Catch::Contains("bwd_overhead"));
    // The time limit is honoured.
    RotorOptions no_time;
    no_time.time_limit_seconds = 0.0;
    std::mt19937_64 rng(3);
    CHECK_THROWS_WITH(Rotor(no_time).solve(unit_chain(rng, 30, 1), 200), Catch::Contains("time limit"));
    // A slot so small that the table cannot be held.
    RotorOptions tiny_slots;
    tiny_slots.slot_bytes = 1;
    CHECK_THROWS_WITH(Rotor(tiny_slots).solve(chain, Bytes{1} << 40), Catch::Contains("larger slot_bytes"));
}

TEST_CASE("property: every solver's plans fit, rotor beats periodic and is monotone, exact smallest budgets", "[property]") {
    std::mt19937_64 rng(60);
    constexpr Bytes unit = 1024;
    int solved = 0;
    for (int trial = 0; trial < 12; ++trial) {
        const std::size_t length = trial == 0 ? 60 : 1 + static_cast<std::size_t>(trial * 23) % 60;
        const Chain chain = unit_chain(rng, length, unit);
        const Problem p = to_problem(chain);
        const Reference ref = store_all_reference(p);
        INFO("trial " << trial << ", L = " << length);

        RotorOptions fixed_options;
        fixed_options.slot_bytes = unit;  // every size is a multiple: exact
        const Rotor fixed(fixed_options);
        RotorOptions coarse_options;
        coarse_options.slot_bytes = unit * 3 / 2;  // never exact: rounding up everywhere
        const Rotor coarse(coarse_options);
        const Rotor by_slots;  // 500 slots

        // Smallest budgets: the one Infeasible reports is feasible, one byte less is not.
        const Bytes least = rotor_smallest_budget(to_rotor_chain(chain));
        CHECK(fixed.smallest_budget(chain) == least);
        for (const Rotor* rotor : {&fixed, &coarse, &by_slots}) {
            const auto smallest = infeasible_smallest(*rotor, p, 0);
            REQUIRE(smallest);
            CHECK(*smallest == rotor->smallest_budget(chain));
            CHECK(*smallest >= least);
            check_plan(p, rotor->solve(p, *smallest), *smallest);
            CHECK(infeasible_smallest(*rotor, p, *smallest - 1) == smallest);
        }

        const Bytes periodic_peak = simulate(p, Periodic{}.schedule(chain)).peak;
        std::vector<Bytes> budgets{least, periodic_peak, ref.peak};
        for (int i = 1; i < 6; ++i) budgets.push_back(least + (ref.peak - least) * i / 6);
        std::sort(budgets.begin(), budgets.end());
        double previous_fixed = std::numeric_limits<double>::infinity();
        double previous_coarse = std::numeric_limits<double>::infinity();
        for (const Bytes budget : budgets) {
            INFO("budget " << budget);
            if (budget >= ref.peak) check_plan(p, StoreAll{}.solve(p, budget), budget);
            std::optional<Plan> periodic;
            for (const std::optional<std::size_t> k : {std::optional<std::size_t>{}, std::optional<std::size_t>{2}}) {
                try {
                    Plan plan = Periodic(k).solve(p, budget);
                    check_plan(p, plan, budget);
                    if (!periodic || plan.time < periodic->time) periodic = std::move(plan);
                } catch (const Infeasible& e) {
                    CHECK(*e.smallest_budget() > budget);
                }
            }
            const Plan plan = fixed.solve(p, budget);
            check_plan(p, plan, budget);
            ++solved;
            // Single-precision comparisons in the DP: ties within ~1e-6 of the time.
            const double tolerance = 1e-6 * ref.time;
            CHECK(plan.time <= previous_fixed + tolerance);
            previous_fixed = plan.time;
            CHECK(plan.time >= ref.time - tolerance);
            if (periodic) CHECK(plan.time <= periodic->time + tolerance);
            // The DP's own accounting agrees with the simulator exactly.
            const RotorSequence seq = rotor_plan(to_rotor_chain(chain), budget, fixed_options);
            CHECK(seq.peak == plan.peak);
            CHECK(seq.time == Approx(plan.time));
            if (budget >= coarse.smallest_budget(chain)) {
                const Plan rounded = coarse.solve(p, budget);
                check_plan(p, rounded, budget);
                CHECK(rounded.time <= previous_coarse + tolerance);
                CHECK(rounded.time >= plan.time - tolerance);  // rounding only loses
                previous_coarse = rounded.time;
            }
            check_plan(p, by_slots.solve(p, budget), budget);
        }
    }
    CHECK(solved >= 80);
}

TEST_CASE("property: with arbitrary byte sizes, rounded slots still fit the budget", "[property]") {
    std::mt19937_64 rng(500);
    for (int trial = 0; trial < 12; ++trial) {
        const std::size_t length = 1 + static_cast<std::size_t>(trial * 5) % 40;
        const Chain chain = byte_chain(rng, length);
        const Problem p = to_problem(chain);
        const Reference ref = store_all_reference(p);
        const Bytes least = rotor_smallest_budget(to_rotor_chain(chain));
        INFO("trial " << trial << ", L = " << length);
        for (const std::size_t slots : {std::size_t{7}, std::size_t{60}, std::size_t{500}}) {
            RotorOptions options;
            options.slots = slots;
            const Rotor rotor(options);
            CHECK(infeasible_smallest(rotor, p, least - 1) == std::optional<Bytes>(least));
            for (int i = 0; i <= 6; ++i) {
                const Bytes budget = least + (ref.peak - least) * i / 6;
                const Plan plan = rotor.solve(p, budget);
                check_plan(p, plan, budget);
                CHECK(plan.time >= ref.time - 1e-9);
                const RotorSequence seq = rotor_plan(to_rotor_chain(chain), budget, options);
                CHECK(seq.peak == plan.peak);
                CHECK(seq.optimal == (plan.stats.status == SolveStatus::optimal));
            }
        }
    }
}

TEST_CASE("rotor slots: a stored stage is rounded jointly, ⌈saved⌉ slots beside its input, not ⌈out⌉ + ⌈saved − out⌉",
          "[rotor]") {
    // Output 15 bytes and saved state 20 bytes (the output included) at 10-byte slots: the
    // stored stage takes 2 slots, where rounding the output and the rest apart took 3.
    Chain chain{"joint", 10, {}};
    chain.stages.push_back({"s1", 1.0, 2.0, 15, 20, 0, 0});
    chain.stages.push_back({"s2", 1.0, 2.0, 10, 10, 0, 0});
    const auto units = remat::detail::rotor::make_units(to_rotor_chain(chain), 10);
    CHECK(units.x[1] == 2);
    CHECK(units.options[1][0].extra == 0);
    CHECK(units.x[1] + units.options[1][0].extra == 2);  // ⌈20 / 10⌉
    // Exact sizes are unchanged: saved − out.
    CHECK(remat::detail::rotor::make_units(to_rotor_chain(chain), 1).options[1][0].extra == 5);
}
