// The simulator of docs/formats.md §3, the problem builder's checks and the chain expansion of §5.
#include <catch2/catch.hpp>

#include <remat/remat.hpp>

using namespace remat;

namespace {

// The docs/formats.md §1 example, built by hand.
Problem tiny_chain_problem() { return to_problem(Chain{"tiny-chain", 4096, {{"l1", 1.0, 2.0, 4096, 12288, 0, 512}}}); }

Schedule steps(const Problem& p, std::initializer_list<std::pair<bool, const char*>> list) {
    Schedule s;
    for (const auto& [run, name] : list) s.push_back(run ? Step::run(p.op_id(name)) : Step::free(p.data_id(name)));
    return s;
}
constexpr bool R = true;
constexpr bool F = false;

}  // namespace

TEST_CASE("simulate: the docs/formats.md schedule example costs 3.0 and peaks at 25088 bytes") {
    const Problem p = tiny_chain_problem();
    const auto s = steps(p, {{R, "F1+"}, {R, "loss"}, {R, "B1"}, {F, "a1"}, {F, "s1"}, {F, "g1"}});
    const SimulationReport r = simulate(p, s);
    REQUIRE(r.valid);
    CHECK(r.time == 3.0);
    // During B1: a0 + a1 + s1 + g1 + g0 + 512 = 4096*4 + 8192 + 512.
    CHECK(r.peak == 25088);
    CHECK(r.initial == 4096);
    REQUIRE(r.timeline.size() == 6);
    CHECK(r.timeline[0].during == 4096 + 4096 + 8192);
    CHECK(r.timeline[2].during == 25088);
    CHECK(r.timeline[2].after == 24576);
    CHECK(r.timeline[5].after == 8192);  // a0 + g0 stay
    CHECK(r.fits(25088));
    CHECK_FALSE(r.fits(25087));
}

TEST_CASE("simulate: writing a data that is already live costs nothing more") {
    const Problem p = tiny_chain_problem();
    const auto s = steps(p, {{R, "F1"}, {R, "F1+"}, {R, "loss"}, {R, "B1"}});
    const SimulationReport r = simulate(p, s);
    REQUIRE(r.valid);
    CHECK(r.time == 4.0);
    CHECK(r.timeline[0].after == 8192);
    CHECK(r.timeline[1].during == 8192 + 8192);  // only s1 is new
}

TEST_CASE("simulate: hand-computed peak with overheads on a two-stage chain") {
    const Problem p = to_problem(Chain{"two", 100, {{"l1", 1, 2, 10, 30, 5, 7}, {"l2", 3, 4, 20, 50, 11, 13}}});
    // F1 (no grad), F2+, loss, B2, free g2 s2 a2, F1+, B1.
    const auto s = steps(p, {{R, "F1"}, {R, "F2+"}, {R, "loss"}, {R, "B2"}, {F, "g2"}, {F, "s2"}, {F, "a2"},
                             {R, "F1+"}, {R, "B1"}, {F, "g1"}, {F, "s1"}, {F, "a1"}});
    const SimulationReport r = simulate(p, s);
    REQUIRE(r.valid);
    CHECK(r.time == 1 + 3 + 0 + 4 + 1 + 2);
    // B2 runs with a0 a1 a2 s2 g2 live (100+10+20+30+20) and writes g1 (10), + 13.
    CHECK(r.timeline[3].during == 100 + 10 + 20 + 30 + 20 + 10 + 13);
    // F1+ with a0 a1 g1 live writes s1 (20) + 5; B1 with a0 a1 s1 g1 writes g0 (100) + 7.
    CHECK(r.timeline[7].during == 100 + 10 + 10 + 20 + 5);
    CHECK(r.timeline[8].during == 100 + 10 + 20 + 10 + 100 + 7);
    CHECK(r.peak == 247);
}

TEST_CASE("simulate: every kind of invalid step is reported with its index and reason") {
    const Problem p = tiny_chain_problem();
    SECTION("reading a data that is not live") {
        const auto r = simulate(p, steps(p, {{R, "loss"}}));
        CHECK_FALSE(r.valid);
        CHECK(r.error_step == 0);
        CHECK_THAT(r.error, Catch::Contains("step 0") && Catch::Contains("run loss") && Catch::Contains("'a1'") &&
                                Catch::Contains("not live"));
    }
    SECTION("an exactly-once op twice") {
        const auto r = simulate(p, steps(p, {{R, "F1+"}, {R, "loss"}, {R, "loss"}}));
        CHECK(r.error_step == 2);
        CHECK_THAT(r.error, Catch::Contains("exactly-once") && Catch::Contains("loss"));
    }
    SECTION("freeing a data that is not live") {
        const auto r = simulate(p, steps(p, {{F, "a1"}}));
        CHECK(r.error_step == 0);
        CHECK_THAT(r.error, Catch::Contains("free a1") && Catch::Contains("not live"));
    }
    SECTION("freeing an initial data") {
        const auto r = simulate(p, steps(p, {{F, "a0"}}));
        CHECK_THAT(r.error, Catch::Contains("initial"));
    }
    SECTION("an exactly-once op that never ran") {
        const auto r = simulate(p, steps(p, {{R, "F1+"}, {R, "loss"}}));
        CHECK(r.error_step == 2);
        CHECK_THAT(r.error, Catch::Contains("end of schedule") && Catch::Contains("'B1'") && Catch::Contains("never ran"));
    }
    SECTION("a final data freed before the end") {
        const auto r = simulate(p, steps(p, {{R, "F1+"}, {R, "loss"}, {R, "B1"}, {F, "g0"}}));
        CHECK(r.error_step == 4);
        CHECK_THAT(r.error, Catch::Contains("final data 'g0'"));
    }
    SECTION("an id that does not exist") {
        const auto r = simulate(p, Schedule{Step::run(OpId{99})});
        CHECK_THAT(r.error, Catch::Contains("op id 99"));
    }
}

TEST_CASE("chain expansion: names, sizes and the autograd order of docs/formats.md §5") {
    const Chain chain{"c", 64, {{"first", 1, 2, 16, 48, 3, 4}, {"second", 5, 6, 32, 32, 7, 8}, {"third", 1, 1, 8, 20, 0, 0}}};
    const Problem p = to_problem(chain);
    CHECK(p.data_count() == 3 * 3 + 2);
    CHECK(p.op_count() == 3 * 3 + 1);
    const ChainIds ids = chain_ids(3);
    for (std::size_t l = 1; l <= 3; ++l) {
        const std::string n = std::to_string(l);
        CHECK(p.data(ids.a[l]).name == "a" + n);
        CHECK(p.data(ids.s[l]).name == "s" + n);
        CHECK(p.data(ids.g[l]).name == "g" + n);
        CHECK(p.op(ids.fwd[l]).name == "F" + n);
        CHECK(p.op(ids.fwd_grad[l]).name == "F" + n + "+");
        CHECK(p.op(ids.bwd[l]).name == "B" + n);
        CHECK(p.data(ids.a[l]).bytes == chain.stages[l - 1].out_bytes);
        CHECK(p.data(ids.g[l]).bytes == chain.stages[l - 1].out_bytes);
        CHECK(p.data(ids.s[l]).bytes == chain.stages[l - 1].saved_bytes - chain.stages[l - 1].out_bytes);
        CHECK(p.op(ids.bwd[l]).exactly_once);
        CHECK_FALSE(p.op(ids.fwd_grad[l]).exactly_once);
        CHECK(p.op(ids.fwd[l]).overhead == chain.stages[l - 1].fwd_overhead);
        CHECK(p.op(ids.bwd[l]).overhead == chain.stages[l - 1].bwd_overhead);
    }
    CHECK(p.data(ids.a[0]).name == "a0");
    CHECK(p.data(ids.g[0]).name == "g0");
    CHECK(p.data(ids.g[0]).bytes == 64);
    CHECK(p.op(ids.loss).name == "loss");
    CHECK(p.loss() == ids.loss);
    CHECK(p.op(p.op_id("B2")).reads == std::vector<DataId>{ids.g[2], ids.s[2], ids.a[2], ids.a[1]});
    CHECK(p.op(p.op_id("F3+")).writes == std::vector<DataId>{ids.a[3], ids.s[3]});
    std::vector<std::string> order;
    for (const OpId op : p.autograd_order()) order.push_back(p.op(op).name);
    CHECK(order == std::vector<std::string>{"F1+", "F2+", "F3+", "loss", "B3", "B2", "B1"});
    CHECK(p.initial().size() == 1);
    CHECK(p.final_data().size() == 1);
}

TEST_CASE("as_chain recognises exactly the expansion of a chain") {
    const Chain chain{"c", 64, {{"1", 1, 2, 16, 48, 3, 4}, {"2", 5, 6, 32, 32, 7, 8}}};
    const auto back = as_chain(to_problem(chain));
    REQUIRE(back.has_value());
    CHECK(*back == chain);

    ProblemBuilder b("not-a-chain");
    const DataId x = b.add_data("a0", 8);
    const DataId y = b.add_data("y", 8);
    b.add_op({"f", 1, 0, {x}, {y}, true});
    b.add_initial(x);
    b.add_final(y);
    CHECK_FALSE(as_chain(b.build()).has_value());
}

TEST_CASE("a chain whose saved bytes are below its output is rejected, naming the stage") {
    const Chain chain{"bad", 8, {{"ok", 1, 1, 8, 8, 0, 0}, {"conv2", 1, 1, 16, 8, 0, 0}}};
    CHECK_THROWS_WITH(to_problem(chain), Catch::Contains("stage 2") && Catch::Contains("conv2") &&
                                             Catch::Contains("saved_bytes"));
}

TEST_CASE("problem builder: every malformed graph is rejected with a message naming the item") {
    ProblemBuilder b("p");
    const DataId x = b.add_data("x", 8);
    const DataId y = b.add_data("y", 8);
    CHECK_THROWS_WITH(b.add_data("x", 4), Catch::Contains("data 'x' is defined twice"));
    CHECK_THROWS_WITH(b.add_data("z", -1), Catch::Contains("'z'") && Catch::Contains("negative"));
    CHECK_THROWS_WITH(b.add_op({"f", -1.0, 0, {x}, {y}, false}), Catch::Contains("op 'f'") && Catch::Contains("time"));
    CHECK_THROWS_WITH(b.add_op({"f", std::nan(""), 0, {x}, {y}, false}), Catch::Contains("op 'f'"));
    CHECK_THROWS_WITH(b.add_op({"f", 1.0, -5, {x}, {y}, false}), Catch::Contains("overhead"));
    CHECK_THROWS_WITH(b.add_op({"f", 1.0, 0, {x}, {}, false}), Catch::Contains("op 'f' writes nothing"));
    CHECK_THROWS_WITH(b.add_op({"f", 1.0, 0, {x, x}, {y}, false}),
                      Catch::Contains("op 'f'") && Catch::Contains("'x' twice in reads"));
    CHECK_THROWS_WITH(b.add_op({"f", 1.0, 0, {DataId{7}}, {y}, false}), Catch::Contains("data id 7"));
    b.add_op({"f", 1.0, 0, {x}, {y}, false});
    CHECK_THROWS_WITH(b.add_op({"f", 1.0, 0, {x}, {y}, false}), Catch::Contains("op 'f' is defined twice"));
    b.add_initial(x);
    CHECK_THROWS_WITH(b.add_initial(x), Catch::Contains("'x' is listed twice in initial"));
    CHECK_THROWS_WITH(b.data_id("nope"), Catch::Contains("no data named 'nope'"));

    SECTION("a final data with no writer") {
        const DataId orphan = b.add_data("orphan", 1);
        b.add_final(orphan);
        CHECK_THROWS_WITH(b.build(), Catch::Contains("final data 'orphan' has no writer"));
    }
    SECTION("a final data that can never be computed") {
        const DataId missing = b.add_data("missing", 1);
        const DataId out = b.add_data("out", 1);
        b.add_op({"g", 1.0, 0, {missing}, {out}, false});
        b.add_final(out);
        CHECK_THROWS_WITH(b.build(), Catch::Contains("final data 'out' can never be computed"));
    }
    SECTION("an exactly-once op that can never run") {
        const DataId missing = b.add_data("missing", 1);
        const DataId out = b.add_data("out", 1);
        b.add_op({"side", 1.0, 0, {missing}, {out}, true});
        b.add_final(y);
        CHECK_THROWS_WITH(b.build(), Catch::Contains("exactly-once op 'side' can never run") && Catch::Contains("'missing'"));
    }
    SECTION("an autograd order that reads before writing") {
        const DataId z = b.add_data("z", 1);
        const OpId g = b.add_op({"g", 1.0, 0, {y}, {z}, false});
        b.add_final(z);
        b.set_autograd_order({g, b.op_id("f")});
        CHECK_THROWS_WITH(b.build(), Catch::Contains("autograd order") && Catch::Contains("'g'") && Catch::Contains("'y'"));
    }
}

TEST_CASE("budgets as a percentage are floor(p × P_ref / 100)") {
    CHECK(percent_of(25088, 40) == 10035);
    CHECK(percent_of(49283072, 100) == 49283072);
    CHECK(percent_of(101, 33.5) == 33);
    CHECK_THROWS_AS(percent_of(100, -1), InvalidInput);
}
