// Tests of remat/io/json.hpp: the shared example files, exact round trips, and one test per
// class of malformed input (the message must name the item and its JSON path or position).
#include <catch2/catch.hpp>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

namespace {

namespace fs = std::filesystem;
using remat::Bytes;
using remat::InvalidInput;

const fs::path shared_problems = fs::path(REMAT_SOURCE_DIR) / "examples" / "problems";

// The example of docs/formats.md §1.
const std::string tiny = R"({
  "format": "remat.problem/1",
  "name": "tiny-chain",
  "data": [
    {"name": "a0", "bytes": 4096},
    {"name": "a1", "bytes": 4096},
    {"name": "s1", "bytes": 8192},
    {"name": "g1", "bytes": 4096},
    {"name": "g0", "bytes": 4096}
  ],
  "ops": [
    {"name": "F1",   "time": 1.0, "overhead": 0,   "reads": ["a0"], "writes": ["a1"]},
    {"name": "F1+",  "time": 1.0, "overhead": 0,   "reads": ["a0"], "writes": ["a1", "s1"]},
    {"name": "loss", "time": 0.0, "overhead": 0,   "reads": ["a1"], "writes": ["g1"], "exactly_once": true},
    {"name": "B1",   "time": 2.0, "overhead": 512, "reads": ["g1", "s1", "a1", "a0"], "writes": ["g0"], "exactly_once": true}
  ],
  "initial": ["a0"],
  "final": ["g0"],
  "loss": "loss"
})";

// The example of docs/formats.md §5, with a second stage.
const std::string chain2 = R"({
  "format": "remat.chain/1",
  "name": "mlp-2",
  "input_bytes": 4096,
  "stages": [
    {"name": "l1", "fwd_time": 1.0, "bwd_time": 2.0, "out_bytes": 4096, "saved_bytes": 12288, "fwd_overhead": 0, "bwd_overhead": 512},
    {"name": "l2", "fwd_time": 0.5, "bwd_time": 1.5, "out_bytes": 2048, "saved_bytes": 2048}
  ]
})";

// The example of docs/formats.md §2.
const std::string tiny_schedule = R"({
  "format": "remat.schedule/1",
  "problem": "tiny-chain",
  "solver": "rotor",
  "budget": 25088,
  "steps": [
    {"run": "F1+"},
    {"run": "loss"},
    {"run": "B1"},
    {"free": "a1"}, {"free": "s1"}, {"free": "g1"}
  ],
  "predicted": {"time": 3.0, "peak": 25088}
})";

// `text` with the first occurrence of `from` replaced by `to`.
std::string with(const std::string& text, const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    std::string out = text;
    out.replace(at, from.size(), to);
    return out;
}

// The message of the InvalidInput that `action` throws (the test fails on anything else).
std::string error_of(const std::function<void()>& action) {
    try {
        action();
    } catch (const InvalidInput& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("expected remat::InvalidInput, got another exception: " << e.what());
    }
    FAIL("expected remat::InvalidInput, nothing was thrown");
    return {};
}

std::string problem_error(const std::string& text) {
    return error_of([&] { (void)remat::io::parse_problem(text, "p.json"); });
}
std::string chain_error(const std::string& text) {
    return error_of([&] { (void)remat::io::parse_chain(text, "c.json"); });
}

}  // namespace

TEST_CASE("the shared example problems load with the reference figures of their README", "[json]") {
    const auto tiny_chain = remat::io::load_problem(shared_problems / "tiny-chain.chain.json");
    const auto tiny_problem = remat::io::load_problem(shared_problems / "tiny-chain.problem.json");
    const auto diamond = remat::io::load_problem(shared_problems / "diamond.problem.json");
    for (const auto* p : {&tiny_chain, &tiny_problem}) {
        const auto ref = remat::store_all_reference(*p);
        CHECK(ref.time == 3.0);
        CHECK(ref.peak == 25088);
    }
    const auto ref = remat::store_all_reference(diamond);
    CHECK(ref.time == 19.5);
    CHECK(ref.peak == 49283072);
    CHECK(diamond.data_count() == 14);
    CHECK(diamond.op_count() == 13);
}

TEST_CASE("a chain file and its expanded problem file load to equal problems", "[json]") {
    const auto from_chain = remat::io::load_problem(shared_problems / "tiny-chain.chain.json");
    const auto from_problem = remat::io::load_problem(shared_problems / "tiny-chain.problem.json");
    CHECK(from_chain == from_problem);
    CHECK(remat::io::load_chain(shared_problems / "tiny-chain.chain.json").stages.at(0).name == "l1");
    // parse_any of a chain is exactly to_problem of parse_chain (docs/formats.md §5).
    CHECK(remat::io::parse_any(chain2) == remat::to_problem(remat::io::parse_chain(chain2)));
    // And the docs/formats.md §1 text is that same problem without an autograd order.
    const auto parsed = remat::io::parse_problem(tiny);
    CHECK(parsed.autograd_order().empty());
    CHECK(remat::store_all_reference(parsed).peak == 25088);
}

TEST_CASE("the schedule example of docs/formats.md §2 simulates to time 3.0 and peak 25088", "[json]") {
    const auto problem = remat::io::load_problem(shared_problems / "tiny-chain.chain.json");
    const auto saved = remat::io::parse_schedule(problem, tiny_schedule, "s.json");
    CHECK(saved.problem == "tiny-chain");
    CHECK(saved.solver == "rotor");
    CHECK(saved.budget == Bytes{25088});
    REQUIRE(saved.predicted);
    CHECK(saved.steps.size() == 6);
    const auto report = remat::simulate(problem, saved.steps);
    REQUIRE(report.valid);
    CHECK(report.time == 3.0);
    CHECK(report.peak == 25088);
    CHECK(report.time == saved.predicted->time);
    CHECK(report.peak == saved.predicted->peak);
}

TEST_CASE("problems, chains and schedules round-trip exactly", "[json]") {
    SECTION("problem with every optional field") {
        const auto diamond = remat::io::load_problem(shared_problems / "diamond.problem.json");
        const std::string text = remat::io::to_json(diamond);
        CHECK(remat::io::parse_problem(text) == diamond);
        CHECK(remat::io::to_json(remat::io::parse_problem(text)) == text);
    }
    SECTION("times that have no short decimal form") {
        remat::ProblemBuilder b("odd-times");
        const auto x = b.add_data("x", 1);
        const auto y = b.add_data("y", (Bytes{1} << 53) + 1);
        b.add_op({"f", 1.0 / 3.0, 7, {x}, {y}, false});
        b.add_op({"g", 1e-300, 0, {x}, {y}, true});
        b.add_op({"h", 0.1 + 0.2, 0, {}, {y}, false});
        b.add_initial(x);
        b.add_final(y);
        const auto p = b.build();
        const auto back = remat::io::parse_problem(remat::io::to_json(p));
        CHECK(back == p);
        CHECK(back.op(remat::OpId{0}).time == 1.0 / 3.0);
        CHECK(back.data(remat::DataId{1}).bytes == (Bytes{1} << 53) + 1);
    }
    SECTION("chain") {
        const auto chain = remat::io::parse_chain(chain2);
        CHECK(remat::io::parse_chain(remat::io::to_json(chain)) == chain);
        CHECK(chain.stages.at(1).bwd_overhead == 0);
    }
    SECTION("schedule from a plan") {
        const auto diamond = remat::io::load_problem(shared_problems / "diamond.problem.json");
        const auto plan = remat::StoreAll{}.solve(diamond, 60'000'000);
        const std::string text = remat::io::to_json(diamond, plan);
        const auto saved = remat::io::parse_schedule(diamond, text);
        CHECK(saved == remat::io::saved_schedule(diamond, plan));
        CHECK(saved.steps == plan.schedule);
        CHECK(saved.solver == "store-all");
        CHECK(saved.budget == Bytes{60'000'000});
        CHECK(saved.predicted == remat::io::Prediction{19.5, 49283072});
        CHECK(remat::io::to_json(diamond, saved) == text);
    }
    SECTION("schedule without the optional fields") {
        const auto problem = remat::io::parse_any(tiny);
        const auto saved = remat::io::parse_schedule(
            problem, R"({"format": "remat.schedule/1", "problem": "tiny-chain", "steps": [{"run": "F1+"}]})");
        CHECK(saved.solver.empty());
        CHECK_FALSE(saved.budget);
        CHECK_FALSE(saved.predicted);
        CHECK(remat::io::parse_schedule(problem, remat::io::to_json(problem, saved)) == saved);
    }
    SECTION("files") {
        const fs::path dir = fs::temp_directory_path() / "remat_test_json";
        fs::create_directories(dir);
        const auto chain = remat::io::parse_chain(chain2);
        remat::io::write_file(dir / "c.json", remat::io::to_json(chain));
        CHECK(remat::io::load_chain(dir / "c.json") == chain);
        CHECK(remat::io::load_problem(dir / "c.json") == remat::to_problem(chain));
        fs::remove_all(dir);
    }
}

TEST_CASE("integral floats are accepted as byte counts", "[json]") {
    const auto p = remat::io::parse_problem(with(tiny, "\"bytes\": 8192", "\"bytes\": 8.192e3"));
    CHECK(p.data(p.data_id("s1")).bytes == 8192);
}

// ------------------------------------------------------------------ malformed input, one class each

TEST_CASE("bad JSON gives file:line:column", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"initial\": [\"a0\"],", "\"initial\": [\"a0\"]"));
    CHECK_THAT(message, Catch::Contains("p.json:18:9: invalid JSON"));
    CHECK_THAT(problem_error(""), Catch::Contains("p.json:1:1: invalid JSON"));
    CHECK_THAT(problem_error("{\"format\": \"remat.problem/1\",\n \"name\": tru}"), Catch::Contains("p.json:2:"));
    CHECK_THAT(problem_error("{} trailing"), Catch::Contains("p.json:1:"));
    // NaN is not JSON at all.
    CHECK_THAT(problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": NaN")), Catch::Contains("p.json:7:"));
}

TEST_CASE("a field given twice in one object is rejected with its path", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": 8192, \"bytes\": 1"));
    CHECK_THAT(message, Catch::Contains("at /data/2/bytes"));
    CHECK_THAT(message, Catch::Contains("'bytes' appears twice"));
}

TEST_CASE("a missing required field is named with its item", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"time\": 2.0, ", ""));
    CHECK_THAT(message, Catch::Contains("at /ops/3"));
    CHECK_THAT(message, Catch::Contains("ops[3] 'B1' misses required field 'time'"));
    CHECK_THAT(problem_error(with(tiny, "\"final\": [\"g0\"],", "")), Catch::Contains("misses required field 'final'"));
    CHECK_THAT(chain_error(with(chain2, "\"saved_bytes\": 2048}", "\"fwd_overhead\": 1}")),
               Catch::Contains("stages[1] 'l2' misses required field 'saved_bytes'"));
}

TEST_CASE("an unknown field (a typo) is rejected with a suggestion", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"exactly_once\": true}", "\"exactly_onec\": true}"));
    CHECK_THAT(message, Catch::Contains("at /ops/2/exactly_onec"));
    CHECK_THAT(message, Catch::Contains("ops[2] 'loss' has unknown field 'exactly_onec'"));
    CHECK_THAT(message, Catch::Contains("did you mean 'exactly_once'"));
    CHECK_THAT(problem_error(with(tiny, "\"loss\": \"loss\"", "\"los\": \"loss\"")),
               Catch::Contains("at /los: the problem has unknown field 'los'"));
    CHECK_THAT(chain_error(with(chain2, "\"bwd_time\": 1.5", "\"bwd_time\": 1.5, \"bwd_tme\": 1")),
               Catch::Contains("at /stages/1/bwd_tme"));
}

TEST_CASE("an unknown name is named with its path", "[json][bad-input]") {
    std::string message = problem_error(with(tiny, "\"reads\": [\"g1\", \"s1\"", "\"reads\": [\"a7\", \"s1\""));
    CHECK_THAT(message, Catch::Contains("at /ops/3/reads/0"));
    CHECK_THAT(message, Catch::Contains("ops[3] 'B1' reads unknown data 'a7'"));
    message = problem_error(with(tiny, "\"writes\": [\"a1\", \"s1\"]", "\"writes\": [\"a1\", \"s9\"]"));
    CHECK_THAT(message, Catch::Contains("at /ops/1/writes/1"));
    CHECK_THAT(message, Catch::Contains("ops[1] 'F1+' writes unknown data 's9'"));
    CHECK_THAT(problem_error(with(tiny, "\"initial\": [\"a0\"]", "\"initial\": [\"x\"]")),
               Catch::Contains("at /initial/0: the problem names unknown data 'x'"));
    CHECK_THAT(problem_error(with(tiny, "\"final\": [\"g0\"]", "\"final\": [\"g0\", \"gg\"]")),
               Catch::Contains("at /final/1"));
    CHECK_THAT(problem_error(with(tiny, "\"loss\": \"loss\"", "\"loss\": \"los\"")),
               Catch::Contains("at /loss: the loss names unknown op 'los'"));
    CHECK_THAT(problem_error(with(tiny, "\"loss\": \"loss\"", "\"loss\": \"loss\", \"autograd\": [\"F1+\", \"F3\"]")),
               Catch::Contains("at /autograd/1: the autograd order names unknown op 'F3'"));
}

TEST_CASE("negative sizes and times are rejected", "[json][bad-input]") {
    std::string message = problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": -8192"));
    CHECK_THAT(message, Catch::Contains("at /data/2/bytes"));
    CHECK_THAT(message, Catch::Contains("data[2] 's1' 'bytes' is negative"));
    message = problem_error(with(tiny, "\"time\": 2.0", "\"time\": -2.0"));
    CHECK_THAT(message, Catch::Contains("at /ops/3/time"));
    CHECK_THAT(message, Catch::Contains("ops[3] 'B1' 'time' is negative"));
    CHECK_THAT(problem_error(with(tiny, "\"overhead\": 512", "\"overhead\": -1")), Catch::Contains("at /ops/3/overhead"));
    CHECK_THAT(chain_error(with(chain2, "\"input_bytes\": 4096", "\"input_bytes\": -1")),
               Catch::Contains("at /input_bytes"));
    CHECK_THAT(chain_error(with(chain2, "\"fwd_time\": 0.5", "\"fwd_time\": -0.5")),
               Catch::Contains("at /stages/1/fwd_time: stages[1] 'l2' 'fwd_time' is negative"));
}

TEST_CASE("non-numeric sizes and times are rejected", "[json][bad-input]") {
    std::string message = problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": \"8192\""));
    CHECK_THAT(message, Catch::Contains("at /data/2/bytes"));
    CHECK_THAT(message, Catch::Contains("must be a whole number of bytes, not a string"));
    message = problem_error(with(tiny, "\"time\": 2.0", "\"time\": null"));
    CHECK_THAT(message, Catch::Contains("at /ops/3/time: ops[3] 'B1' 'time' must be a number, not null"));
    CHECK_THAT(problem_error(with(tiny, "\"time\": 2.0", "\"time\": [2]")), Catch::Contains("not an array"));
}

TEST_CASE("booleans, infinities and huge numbers are not numbers here", "[json][bad-input]") {
    CHECK_THAT(problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": true")),
               Catch::Contains("at /data/2/bytes: data[2] 's1' 'bytes' must be a whole number of bytes, not a boolean"));
    CHECK_THAT(problem_error(with(tiny, "\"time\": 2.0", "\"time\": false")),
               Catch::Contains("'time' must be a number, not a boolean"));
    // 1e999 overflows to infinity when read: its line and column are named.
    CHECK_THAT(problem_error(with(tiny, "\"time\": 2.0", "\"time\": 1e999")),
               Catch::Contains("p.json:15:30: the number 1e999 is out of range: not a finite number"));
    CHECK_THAT(problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": -1e999")),
               Catch::Contains("p.json:7:29: the number -1e999 is out of range"));
    CHECK_THAT(problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": 18446744073709551615")),
               Catch::Contains("too large"));
    CHECK_THAT(problem_error(with(tiny, "\"exactly_once\": true}", "\"exactly_once\": 1}")),
               Catch::Contains("at /ops/2/exactly_once: ops[2] 'loss' 'exactly_once' must be true or false"));
}

TEST_CASE("a fractional byte count is rejected", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"bytes\": 8192", "\"bytes\": 8192.5"));
    CHECK_THAT(message, Catch::Contains("at /data/2/bytes"));
    CHECK_THAT(message, Catch::Contains("not a whole number of bytes (8192.5)"));
    CHECK_THAT(chain_error(with(chain2, "\"out_bytes\": 2048", "\"out_bytes\": 0.5")),
               Catch::Contains("at /stages/1/out_bytes"));
}

TEST_CASE("duplicate names are rejected, also within one list", "[json][bad-input]") {
    std::string message = problem_error(with(tiny, "{\"name\": \"g1\"", "{\"name\": \"a1\""));
    CHECK_THAT(message, Catch::Contains("at /data/3/name: data[3] 'a1' has the same name as data[1]"));
    message = problem_error(with(tiny, "{\"name\": \"F1+\"", "{\"name\": \"F1\""));
    CHECK_THAT(message, Catch::Contains("at /ops/1/name: ops[1] 'F1' has the same name as ops[0]"));
    message = problem_error(with(tiny, "\"reads\": [\"g1\", \"s1\", \"a1\"", "\"reads\": [\"g1\", \"s1\", \"g1\""));
    CHECK_THAT(message, Catch::Contains("at /ops/3/reads/2: ops[3] 'B1' lists data 'g1' twice in reads"));
    message = problem_error(with(tiny, "\"writes\": [\"a1\", \"s1\"]", "\"writes\": [\"a1\", \"a1\"]"));
    CHECK_THAT(message, Catch::Contains("at /ops/1/writes/1"));
    CHECK_THAT(problem_error(with(tiny, "\"initial\": [\"a0\"]", "\"initial\": [\"a0\", \"a0\"]")),
               Catch::Contains("at /initial/1: the problem lists data 'a0' twice in initial"));
    CHECK_THAT(chain_error(with(chain2, "\"name\": \"l2\"", "\"name\": \"l1\"")),
               Catch::Contains("at /stages/1/name: stages[1] 'l1' has the same name as stages[0]"));
}

TEST_CASE("an op that writes nothing is rejected", "[json][bad-input]") {
    const std::string message = problem_error(with(tiny, "\"writes\": [\"a1\"]", "\"writes\": []"));
    CHECK_THAT(message, Catch::Contains("at /ops/0/writes: ops[0] 'F1' writes nothing"));
}

TEST_CASE("a final data with no writer that is not initial is rejected", "[json][bad-input]") {
    // g0 loses its only writer: B1 now writes g1 (also written by the loss).
    const std::string message = problem_error(with(tiny, "\"writes\": [\"g0\"]", "\"writes\": [\"g1\"]"));
    CHECK_THAT(message, Catch::Contains("at /final/0: final data 'g0' has no writer and is not initial"));
}

TEST_CASE("graph errors found by the builder carry the source name", "[json][bad-input]") {
    // An exactly-once op that reads a data nothing can produce.
    const std::string more_data = with(tiny, "{\"name\": \"g0\", \"bytes\": 4096}",
                                       "{\"name\": \"g0\", \"bytes\": 4096}, {\"name\": \"z\", \"bytes\": 1}, "
                                       "{\"name\": \"w\", \"bytes\": 1}");
    std::string message = problem_error(with(more_data, "\"writes\": [\"g0\"], \"exactly_once\": true}",
                                             "\"writes\": [\"g0\"], \"exactly_once\": true},\n    {\"name\": \"extra\", "
                                             "\"time\": 1, \"reads\": [\"z\"], \"writes\": [\"w\"], \"exactly_once\": true}"));
    CHECK_THAT(message, Catch::StartsWith("p.json: "));
    CHECK_THAT(message, Catch::Contains("exactly-once op 'extra' can never run: it reads 'z'"));
    // A final data whose only writer needs such a data.
    message = problem_error(with(more_data, "\"reads\": [\"g1\", \"s1\", \"a1\", \"a0\"]",
                                 "\"reads\": [\"g1\", \"s1\", \"a1\", \"z\"]"));
    CHECK_THAT(message, Catch::Contains("p.json: final data 'g0' can never be computed"));
    // An autograd order that reads a data before it is written.
    message = problem_error(with(tiny, "\"loss\": \"loss\"", "\"loss\": \"loss\", \"autograd\": [\"loss\", \"F1+\", \"B1\"]"));
    CHECK_THAT(message, Catch::StartsWith("p.json: "));
    CHECK_THAT(message, Catch::Contains("autograd order: op 'loss'"));
    // A chain whose saved state is smaller than its output.
    CHECK_THAT(chain_error(with(chain2, "\"saved_bytes\": 12288", "\"saved_bytes\": 100")),
               Catch::Contains("at /stages/0/saved_bytes: stages[0] 'l1' has saved_bytes 100 below out_bytes 4096"));
}

TEST_CASE("a wrong format string says which formats are known", "[json][bad-input]") {
    std::string message = problem_error(with(tiny, "remat.problem/1", "remat.problem/9"));
    CHECK_THAT(message, Catch::Contains("at /format: unknown format 'remat.problem/9'"));
    CHECK_THAT(message, Catch::Contains(
                            "known formats: remat.problem/1, remat.problem/2, remat.chain/1, remat.schedule/1, remat.schedule/2"));
    CHECK_THAT(error_of([] { (void)remat::io::parse_any(R"({"format": "remat.chian/1"})", "x.json"); }),
               Catch::Contains("x.json: at /format: unknown format 'remat.chian/1'"));
    message = problem_error(chain2);
    CHECK_THAT(message, Catch::Contains("expected format \"remat.problem/1\" but the document is \"remat.chain/1\""));
    CHECK_THAT(message, Catch::Contains("parse_any"));
    CHECK_THAT(error_of([] { (void)remat::io::parse_any(tiny_schedule, "s.json"); }),
               Catch::Contains("this is a schedule"));
    CHECK_THAT(problem_error(with(tiny, "\"format\": \"remat.problem/1\",", "")),
               Catch::Contains("p.json: the document has no \"format\" field"));
    CHECK_THAT(problem_error("[1, 2]"), Catch::Contains("must be a JSON object"));
    CHECK_THAT(problem_error(with(tiny, "\"format\": \"remat.problem/1\"", "\"format\": 1")),
               Catch::Contains("must be a string, not a number"));
}

TEST_CASE("wrong types and empty names are rejected with their path", "[json][bad-input]") {
    CHECK_THAT(problem_error(with(tiny, "\"reads\": [\"a0\"], \"writes\": [\"a1\"]}",
                                 "\"reads\": \"a0\", \"writes\": [\"a1\"]}")),
               Catch::Contains("at /ops/0/reads: reads must be an array, not a string"));
    CHECK_THAT(problem_error(with(tiny, "{\"name\": \"a1\"", "{\"name\": \"\"")),
               Catch::Contains("at /data/1/name: data[1] field 'name' must be a non-empty name"));
    CHECK_THAT(problem_error(with(tiny, "\"name\": \"tiny-chain\"", "\"name\": \"\"")), Catch::Contains("at /name"));
    CHECK_THAT(problem_error(with(tiny, "{\"name\": \"a1\", \"bytes\": 4096}", "[\"a1\", 4096]")),
               Catch::Contains("at /data/1: data[1] must be a JSON object, not an array"));
    CHECK_THAT(chain_error(with(chain2, "\"stages\": [", "\"stages\": [], \"x\": [")), Catch::Contains("at /x"));
    CHECK_THAT(chain_error(R"({"format": "remat.chain/1", "name": "c", "input_bytes": 1, "stages": []})"),
               Catch::Contains("at /stages: a chain needs at least one stage"));
}

TEST_CASE("schedule files with unknown names or bad steps are rejected", "[json][bad-input]") {
    const auto problem = remat::io::parse_any(tiny);
    const auto schedule_error = [&](const std::string& text) {
        return error_of([&] { (void)remat::io::parse_schedule(problem, text, "s.json"); });
    };
    CHECK_THAT(schedule_error(with(tiny_schedule, "{\"run\": \"B1\"}", "{\"run\": \"B2\"}")),
               Catch::Contains("s.json: at /steps/2/run: steps[2] runs unknown op 'B2'"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "{\"free\": \"s1\"}", "{\"free\": \"s2\"}")),
               Catch::Contains("at /steps/4/free: steps[4] frees unknown data 's2'"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "{\"free\": \"s1\"}", "{\"free\": \"s1\", \"run\": \"F1\"}")),
               Catch::Contains("at /steps/4: steps[4] must be {\"run\": OP} or {\"free\": DATA}"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "{\"free\": \"s1\"}", "{\"fre\": \"s1\"}")),
               Catch::Contains("at /steps/4"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "\"problem\": \"tiny-chain\"", "\"problem\": \"other\"")),
               Catch::Contains("at /problem: the schedule is for problem 'other'"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "\"peak\": 25088", "\"peak\": 2.5")),
               Catch::Contains("at /predicted/peak"));
    CHECK_THAT(schedule_error(with(tiny_schedule, "\"budget\": 25088", "\"budgt\": 25088")),
               Catch::Contains("did you mean 'budget'"));
}

TEST_CASE("missing files are InvalidInput naming the path", "[json][bad-input]") {
    CHECK_THAT(error_of([] { (void)remat::io::load_problem("/nonexistent/x.json"); }),
               Catch::Contains("cannot read '/nonexistent/x.json'"));
    CHECK_THAT(error_of([] { (void)remat::io::load_chain(fs::temp_directory_path()); }), Catch::Contains("directory"));
}

TEST_CASE("every truncation or one-character corruption is either read or an InvalidInput", "[json][bad-input]") {
    // No crash, no other exception type, whatever the damage.
    std::size_t rejected = 0;
    const auto attempt = [&](const std::string& text) {
        try {
            (void)remat::io::parse_any(text, "fuzz.json");
        } catch (const InvalidInput&) {
            ++rejected;
        }
    };
    for (std::size_t n = 0; n < tiny.size(); n += 3) attempt(tiny.substr(0, n));
    const std::string replacements = "\"{}[],:-0e.x \\";
    for (std::size_t i = 0; i < tiny.size(); i += 5)
        for (const char c : replacements) {
            std::string text = tiny;
            text[i] = c;
            attempt(text);
        }
    CHECK(rejected > tiny.size() / 3);
}

TEST_CASE("deeply nested values are rejected without exhausting the stack", "[json][bad-input]") {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    CHECK_THAT(problem_error(with(tiny, "\"time\": 2.0", "\"time\": " + deep)),
               Catch::Contains("at /ops/3/time: ops[3] 'B1' 'time' must be a number, not an array"));
    const auto problem = remat::io::parse_any(tiny);
    CHECK_THAT(error_of([&] {
                   (void)remat::io::parse_schedule(problem, with(tiny_schedule, "{\"run\": \"B1\"}", deep));
               }),
               Catch::Contains("at /steps/2: steps[2] must be {\"run\": OP} or {\"free\": DATA}, not an array"));
}
