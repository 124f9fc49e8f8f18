// Plans in words (core/explain.hpp) and in pictures (io/svg.hpp): units found from op names,
// a hand-checked listing for a hand-written schedule, and the SVG's time axis and
// recomputation labels.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include <remat/core/chain.hpp>
#include <remat/core/explain.hpp>
#include <remat/io/svg.hpp>
#include <remat/solvers/store_all.hpp>

using namespace remat;

TEST_CASE("explain: units and roles from op names", "[explain]") {
    CHECK(unit_of("F3").unit == "3");
    CHECK(unit_of("F3").role == UnitRole::forward);
    CHECK(unit_of("F12+").role == UnitRole::forward_grad);
    CHECK(unit_of("B12").unit == "12");
    CHECK(unit_of("B12").role == UnitRole::backward);
    CHECK(unit_of("F:linear.7").unit == "linear.7");
    CHECK(unit_of("F+:linear.7").role == UnitRole::forward_grad);
    CHECK(unit_of("B:linear.7").role == UnitRole::backward);
    CHECK(unit_of("loss").role == UnitRole::other);
    CHECK(unit_of("Fancy").unit == "Fancy");
    CHECK(unit_of("B3+").role == UnitRole::other);
}

namespace {

// Three stages; the schedule keeps a0 and recomputes stages 1 and 2 before their backwards.
struct Example {
    Chain chain{"three", 100, {{"embed", 1.0, 2.0, 100, 300, 0, 0}, {"mlp", 2.0, 4.0, 100, 300, 0, 0},
                               {"head", 3.0, 6.0, 100, 300, 0, 0}}};
    Problem problem = to_problem(chain);
    ChainIds ids = chain_ids(3);
    Schedule schedule() const {
        return {Step::run(ids.fwd[1]),      Step::run(ids.fwd[2]),      Step::free(ids.a[1]),
                Step::run(ids.fwd_grad[3]), Step::run(ids.loss),        Step::run(ids.bwd[3]),
                Step::free(ids.s[3]),       Step::free(ids.a[3]),       Step::free(ids.g[3]),
                Step::free(ids.a[2]),       Step::run(ids.fwd_grad[1]), Step::run(ids.fwd_grad[2]),
                Step::run(ids.bwd[2]),      Step::free(ids.s[2]),       Step::free(ids.a[2]),
                Step::free(ids.g[2]),       Step::run(ids.bwd[1]),      Step::free(ids.s[1]),
                Step::free(ids.a[1]),       Step::free(ids.g[1])};
    }
};

}  // namespace

TEST_CASE("explain: stage labels of a chain, plain or numbered", "[explain]") {
    const Chain chain{"named", 100, {{"embed", 1.0, 2.0, 100, 300, 0, 0}, {"", 2.0, 4.0, 100, 300, 0, 0},
                                     {"head", 3.0, 6.0, 100, 300, 0, 0}}};
    CHECK(stage_labels(chain) == std::map<std::string, std::string>{{"1", "embed"}, {"3", "head"}});
    CHECK(stage_labels(chain, true) == std::map<std::string, std::string>{{"1", "1 embed"}, {"3", "3 head"}});
}

TEST_CASE("explain: a hand-checked listing", "[explain]") {
    const Example e;
    const Schedule s = e.schedule();
    REQUIRE(simulate(e.problem, s).valid);
    ExplainOptions options;
    options.labels = {{"1", "embed"}, {"2", "mlp"}, {"3", "head"}};
    options.reference_time = store_all_reference(e.problem).time;  // 18
    const std::string text = explain(e.problem, s, options);
    // time: 1 + 2 + 3 + 6 + 1 + 2 + 4 + 2 = 21 = T_ref 18 + 3 (stages 1 and 2 again).
    CHECK(text ==
          "plan for 'three': 20 steps, time 21 (+16.7 % over store-all), peak 900 B\n"
          "2 of 3 layers recomputed, 3 s of recomputation in all\n"
          "layer                              forwards  recomputed (cost)     backward  what happens\n"
          "mlp                                       2     1 (+2 s)                 1  recomputed with grad before its backward\n"
          "embed                                     2     1 (+1 s)                 1  recomputed with grad before its backward\n");
    options.all_units = true;
    const std::string all = explain(e.problem, s, options);
    CHECK(all.find("head                                      1     0 (+0)                   1  kept for its backward") !=
          std::string::npos);
    const std::vector<UnitSummary> units = summarize_units(e.problem, s);
    REQUIRE(units.size() == 4);  // the three stages and the loss
    CHECK(units[0].recompute_time() == 1.0);
    CHECK(units[2].saved_across_loss);
    CHECK(!units[0].saved_across_loss);
}

TEST_CASE("svg: time on the x axis, steps as ticks, recomputations named", "[explain][svg]") {
    const Example e;
    Plan plan;
    plan.schedule = e.schedule();
    const SimulationReport r = simulate(e.problem, plan.schedule);
    plan.time = r.time;
    plan.peak = r.peak;
    plan.budget = 1200;
    plan.stats.solver = "hand-written";
    const std::string svg = timeline_svg(e.problem, plan, store_all_reference(e.problem).peak, {{"1", "embed"}, {"2", "mlp"}});
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
    CHECK_THAT(svg, Catch::Contains("predicted time (ticks: steps)"));
    CHECK_THAT(svg, Catch::Contains("class=\"step-ticks\""));
    CHECK_THAT(svg, Catch::Contains("<title>recomputes embed</title>"));
    CHECK_THAT(svg, Catch::Contains("<title>recomputes mlp</title>"));
    CHECK_THAT(svg, Catch::Contains(">embed</text>"));
    CHECK_THAT(svg, Catch::Contains("class=\"budget\""));
    CHECK_THAT(svg, Catch::Contains("class=\"peak\""));
    CHECK_THAT(svg, Catch::Contains("class=\"reference\""));
    // 20 steps: 21 step ticks.
    std::size_t ticks = 0;
    const std::size_t from = svg.find("class=\"step-ticks\"");
    const std::size_t to = svg.find("</g>", from);
    for (std::size_t at = svg.find("<line", from); at < to; at = svg.find("<line", at + 1)) ++ticks;
    CHECK(ticks == 21);
}
