// Regression tests of issue 13 ("Hardening"): valid problems that crashed or were refused,
// sums of sizes and times that overflowed, Rotor on long chains, linear JSON reading, the
// output files and --check of remat-plan, and the nits (messages, variants, NaN limits).
#include <catch2/catch.hpp>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/partition/blocks.hpp>
#include <remat/partition/hierarchy.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/exhaustive.hpp>
#include <remat/solvers/greedy.hpp>
#include <remat/solvers/improve.hpp>
#include <remat/solvers/rotor.hpp>

#include "../support/remat_plan_in_process.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace remat;
using remat::testing::CliResult;

constexpr Bytes max_bytes = std::numeric_limits<Bytes>::max();
const fs::path problems = fs::path(REMAT_SOURCE_DIR) / "examples" / "problems";

CliResult run_cli(const std::vector<std::string>& args) { return remat::testing::remat_plan(args); }

fs::path scratch(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / "remat_test_hardening";
    fs::create_directories(dir);
    return dir / name;
}

void write(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

double elapsed_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The issue's case: x initial; W1 reads x and u, W2 reads x, both write y; W3 makes u from y.
// A valid order exists (W2, then W3 if u is wanted), although W1 and W3 feed each other.
std::string alternative_writers_json(bool with_loss) {
    std::string ops = R"({"name": "W1", "time": 1.0, "reads": ["x", "u"], "writes": ["y"]},
        {"name": "W2", "time": 2.0, "reads": ["x"], "writes": ["y"]},
        {"name": "W3", "time": 1.0, "reads": ["y"], "writes": ["u"]})";
    std::string data = R"({"name": "x", "bytes": 10}, {"name": "u", "bytes": 20}, {"name": "y", "bytes": 30})";
    std::string tail = R"("initial": ["x"], "final": ["y"]})";
    if (with_loss) {
        ops += R"(, {"name": "loss", "time": 0.0, "reads": ["y"], "writes": ["gy"], "exactly_once": true},
        {"name": "B", "time": 1.0, "reads": ["gy", "x"], "writes": ["gx"], "exactly_once": true})";
        data += R"(, {"name": "gy", "bytes": 30}, {"name": "gx", "bytes": 10})";
        tail = R"("initial": ["x"], "final": ["gx"], "loss": "loss"})";
    }
    return R"({"format": "remat.problem/1", "name": "alternative-writers", "data": [)" + data + R"(], "ops": [)" + ops +
           "], " + tail;
}

Chain uniform_chain(std::size_t length, double time, Bytes bytes, const std::string& name = "uniform") {
    Chain chain{name, bytes, {}};
    for (std::size_t l = 1; l <= length; ++l)
        chain.stages.push_back(Stage{std::to_string(l), time, 2 * time, bytes, 2 * bytes, 0, 0});
    return chain;
}

}  // namespace

// ------------------------------------------------------------------ 1. valid problems

TEST_CASE("hardening: a problem whose ops feed each other through alternative writers plans", "[hardening][cli]") {
    for (const bool with_loss : {false, true}) {
        INFO("with loss: " << with_loss);
        const fs::path file = scratch(with_loss ? "alt-loss.problem.json" : "alt.problem.json");
        write(file, alternative_writers_json(with_loss));
        const Problem p = io::load_problem(file);
        CHECK(store_all_reference(p).time == (with_loss ? 3.0 : 2.0));
        for (const std::string solver : {"store-all", "greedy", "exhaustive", "auto"}) {
            const CliResult r = run_cli({file.string(), "--budget", "100%", "--solver", solver, "--quiet"});
            INFO(solver << ": " << r.err);
            CHECK(r.code == 0);
            CHECK(r.err.find("cycle") == std::string::npos);
        }
        if (!with_loss) continue;
        // The block and hierarchy solvers cannot order these forwards: a solver's limit, not bad input.
        CHECK_THROWS_AS(partition_blocks(p), SolverError);
        CHECK_THROWS_AS(partition_hierarchy(p), SolverError);
        for (const std::string solver : {"rockmate", "hrockmate"}) {
            const CliResult r = run_cli({file.string(), "--budget", "100%", "--solver", solver, "--quiet"});
            INFO(solver << ": " << r.err);
            CHECK(r.code == 1);
            CHECK(r.err.find("alternative writers") != std::string::npos);
            CHECK(r.err.find("greedy") != std::string::npos);
        }
    }
}

// ------------------------------------------------------------------ 2. sizes

TEST_CASE("hardening: sizes whose sum overflows 64 bits are rejected, sums up to 2^63 - 1 work", "[hardening]") {
    const auto two_initial = [](Bytes a, Bytes b, Bytes overhead = 0) {
        ProblemBuilder builder("huge");
        const DataId x = builder.add_data("x", a);
        const DataId y = builder.add_data("y", b);
        const DataId z = builder.add_data("z", 0);
        builder.add_op({"f", 1.0, overhead, {x, y}, {z}, true});
        builder.add_initial(x);
        builder.add_initial(y);
        builder.add_final(z);
        return builder.build();
    };
    SECTION("the issue's case: two initial data of 2^63 - 1") {
        try {
            (void)two_initial(max_bytes, max_bytes);
            FAIL("accepted");
        } catch (const InvalidInput& e) {
            const std::string m = e.what();
            CHECK(m.find("'huge'") != std::string::npos);
            CHECK(m.find("2^63 - 1") != std::string::npos);
            CHECK(m.find("'y'") != std::string::npos);
        }
    }
    SECTION("2^62 + 2^62 overflows; 2^62 + (2^62 - 1) is exactly the largest sum") {
        const Bytes half = Bytes{1} << 62;
        CHECK_THROWS_AS(two_initial(half, half), InvalidInput);
        CHECK_THROWS_AS(two_initial(half, half - 1, 1), InvalidInput);  // the overhead counts too
        const Problem p = two_initial(half, half - 1);
        const Reference ref = store_all_reference(p);
        CHECK(ref.peak == max_bytes);
        CHECK(StoreAll{}.solve(p, max_bytes).peak == max_bytes);
        CHECK_THROWS_AS(StoreAll{}.solve(p, max_bytes - 1), Infeasible);
    }
    SECTION("the readers apply the same rule") {
        const std::string text = R"({"format": "remat.problem/1", "name": "big", "data": [
            {"name": "a", "bytes": 9223372036854775807}, {"name": "b", "bytes": 1}],
            "ops": [{"name": "f", "time": 1, "reads": ["a"], "writes": ["b"]}], "initial": ["a"], "final": ["b"]})";
        CHECK_THROWS_WITH(io::parse_problem(text, "big.json"), Catch::Contains("big.json") && Catch::Contains("2^63 - 1"));
    }
}

TEST_CASE("hardening: budgets near 2^63 never overflow, percentages beyond it are rejected", "[hardening][budget]") {
    const Chain chain = uniform_chain(6, 1.0, Bytes{1} << 58);  // sums stay below 2^63
    const Problem p = to_problem(chain);
    const Reference ref = store_all_reference(p);
    SECTION("Rotor at the largest budget: budget + slots - 1 no longer wraps") {
        const Plan plan = Rotor{}.solve(p, max_bytes);
        CHECK(plan.peak == ref.peak);
        CHECK(plan.time == ref.time);
        RotorOptions fixed;
        fixed.slots = 7;
        CHECK(Rotor(fixed).solve(p, max_bytes - 3).peak == ref.peak);
        CHECK(Greedy{}.solve(p, max_bytes).peak == ref.peak);
    }
    SECTION("percentages") {
        CHECK_THROWS_WITH(percent_of(Bytes{1} << 62, 3000000000000.0), Catch::Contains("2^63 - 1"));
        CHECK_THROWS_AS(percent_of(max_bytes, 101.0), InvalidInput);
        CHECK(percent_of(max_bytes, 100.0) == max_bytes);
        CHECK(percent_of(Bytes{1} << 62, 150.0) == (Bytes{3} << 61));
        CHECK_THROWS_AS(budget_above_smallest(200.0).resolve(0, Bytes{1} << 62), InvalidInput);
    }
    SECTION("the command line: exit 2, never a negative budget") {
        const fs::path file = scratch("huge.chain.json");
        write(file, io::to_json(chain));
        const CliResult r = run_cli({file.string(), "--budget", "3000000000000%", "--quiet"});
        INFO(r.err);
        CHECK(r.code == 2);
        CHECK(r.err.find("2^63 - 1") != std::string::npos);
        const CliResult top = run_cli({file.string(), "--budget", "9223372036854775807", "--solver", "rotor", "--json"});
        INFO(top.err);
        CHECK(top.code == 0);
        CHECK(top.out.find("\"budget\":9223372036854775807") != std::string::npos);
    }
}

// ------------------------------------------------------------------ 3. times

TEST_CASE("hardening: times that add up to infinity are rejected; huge finite times plan", "[hardening]") {
    SECTION("op times whose sum (times the op count) overflows") {
        ProblemBuilder b("slow");
        const DataId x = b.add_data("x", 1);
        const DataId y = b.add_data("y", 1);
        const DataId z = b.add_data("z", 1);
        b.add_op({"f", 1e308, 0, {x}, {y}, false});
        b.add_op({"g", 1e308, 0, {y}, {z}, false});
        b.add_initial(x);
        b.add_final(z);
        CHECK_THROWS_WITH(b.build(), Catch::Contains("'slow'") && Catch::Contains("times add up"));
        CHECK_THROWS_AS(validate(to_rotor_chain(uniform_chain(3, 1e308, 8))), InvalidInput);
    }
    SECTION("Rotor with times beyond a float's range: the same plan as with small times") {
        const Chain small = uniform_chain(8, 3.5, 1024);
        Chain huge = small;
        for (Stage& s : huge.stages) {
            s.fwd_time *= 1e38;
            s.bwd_time *= 1e38;
        }
        const Problem ps = to_problem(small), ph = to_problem(huge);
        const Bytes budget = store_all_reference(ps).peak / 2;
        const Plan a = Rotor{}.solve(ps, budget);
        const Plan b = Rotor{}.solve(ph, budget);
        CHECK(std::isfinite(b.time));  // ties may break otherwise in floats: compare the times
        CHECK(b.time == Approx(a.time * 1e38));
    }
    SECTION("no \"null\" where a number belongs") {
        const fs::path file = scratch("slow.chain.json");
        write(file, io::to_json(uniform_chain(4, 1e300, 1024)));
        const CliResult r = run_cli({file.string(), "--budget", "60%", "--solver", "rotor", "--json"});
        INFO(r.err);
        CHECK(r.code == 0);
        for (const std::string field : {"time", "peak", "T_ref", "P_ref"})
            CHECK(r.out.find("\"" + field + "\":null") == std::string::npos);
        CHECK_THROWS_AS(io::parse_problem(R"({"format": "remat.problem/1", "name": "inf", "data": [{"name": "x", "bytes": 1},
            {"name": "y", "bytes": 1}], "ops": [{"name": "f", "time": 1e999, "reads": ["x"], "writes": ["y"]}],
            "initial": ["x"], "final": ["y"]})"),
                        InvalidInput);
    }
}

// ------------------------------------------------------------------ 4. Rotor on long chains

TEST_CASE("hardening: Rotor refuses long chains at once with TooLarge, before any cubic work", "[hardening][rotor]") {
    const Chain chain = uniform_chain(3000, 1.0, 4096, "long");
    const Problem p = to_problem(chain);
    const Bytes budget = store_all_reference(p).peak / 3;
    SECTION("a time table above the memory cap") {
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_AS(Rotor{}.solve(p, budget), TooLarge);
        try {
            (void)Rotor{}.solve(p, budget);
        } catch (const TooLarge& e) {
            const std::string m = e.what();
            CHECK(m.find("max_table_mib") != std::string::npos);
            CHECK(m.find("greedy") != std::string::npos);
        }
        CHECK(elapsed_since(start) < 2.0);
    }
    SECTION("a time limit the precomputation cannot meet") {
        RotorOptions options;
        options.slots = 1;
        options.time_limit_seconds = 0.05;
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_WITH(Rotor(options).solve(p, budget), Catch::Contains("time limit"));
        CHECK_THROWS_AS(rotor_smallest_budget(to_rotor_chain(chain), options), TooLarge);
        CHECK(elapsed_since(start) < 2.0);
    }
    SECTION("TooLarge is a SolverError, so fallbacks that catch one catch it") {
        CHECK_THROWS_AS(Rotor{}.solve(p, budget), SolverError);
    }
}

TEST_CASE("hardening: remat-plan gives too-large its own exit code 4 and answers within the limit",
          "[hardening][cli][rotor][slow]") {
    const fs::path file = scratch("long-10000.chain.json");
    write(file, io::to_json(uniform_chain(10000, 1.0, 4096, "long")));
    for (const std::string solver : {"rotor", "rotor:5"}) {
        const auto start = std::chrono::steady_clock::now();
        const CliResult r = run_cli({file.string(), "--budget", "40%", "--solver", solver, "--time-limit", "5", "--quiet"});
        INFO(solver << ": " << r.err);
        CHECK(r.code == 4);
        CHECK(r.err.find("greedy") != std::string::npos);
        CHECK(elapsed_since(start) < 5.0);
    }
    CHECK(run_cli({"--help"}).out.find("4 the problem is") != std::string::npos);
}

// ------------------------------------------------------------------ 5. JSON reading

TEST_CASE("hardening: JSON reading is linear and still rejects duplicate keys", "[hardening][json][slow]") {
    const std::size_t n = 100000;
    std::string text = R"({"format": "remat.problem/1", "name": "big", "data": [{"name": "a0", "bytes": 8})";
    for (std::size_t i = 1; i <= n; ++i) text += R"(, {"name": "a)" + std::to_string(i) + R"(", "bytes": 8})";
    text += R"(], "ops": [)";
    for (std::size_t i = 1; i <= n; ++i)
        text += std::string(i > 1 ? ", " : "") + R"({"name": "F)" + std::to_string(i) + R"(", "time": 1, "reads": ["a)" +
                std::to_string(i - 1) + R"("], "writes": ["a)" + std::to_string(i) + R"("]})";
    text += R"(], "initial": ["a0"], "final": ["a)" + std::to_string(n) + R"("]})";
    const auto start = std::chrono::steady_clock::now();
    const Problem p = io::parse_problem(text, "big.json");
    CHECK(p.op_count() == n);
    CHECK(elapsed_since(start) < 5.0);  // 9.8 s before (a rescan of the parent array per object)
    // A duplicate key deep inside is still found, with its path.
    const std::string needle = R"({"name": "F77777", "time": 1,)";
    const std::size_t at = text.find(needle);
    REQUIRE(at != std::string::npos);
    std::string doubled = text;
    doubled.insert(at + needle.size(), R"( "time": 2,)");
    CHECK_THROWS_WITH(io::parse_problem(doubled, "big.json"),
                      Catch::Contains("/ops/77776/time") && Catch::Contains("appears twice"));
}

TEST_CASE("hardening: duplicate keys are rejected at any depth, with their path", "[hardening][json]") {
    CHECK_THROWS_WITH(io::parse_problem(R"({"format": "remat.problem/1", "format": "remat.problem/1"})", "f"),
                      Catch::Contains("at /format") && Catch::Contains("appears twice"));
    CHECK_THROWS_WITH(io::parse_problem(R"({"a": [1, {"b": [{}, {"c": 1, "c": 2}]}]})", "f"),
                      Catch::Contains("at /a/1/b/1/c"));
    CHECK_THROWS_WITH(io::parse_problem(R"({"a": 1e999})", "f"), Catch::Contains("f:1:") && Catch::Contains("out of range"));
    CHECK_THROWS_WITH(io::parse_problem("{\"a\": [1,\n 2,]}", "f"), Catch::Contains("f:2:") && Catch::Contains("invalid JSON"));
}

// ------------------------------------------------------------------ 6. output files

TEST_CASE("hardening: remat-plan's output files", "[hardening][cli]") {
    const std::string chain = (problems / "tiny-chain.chain.json").string();
    const fs::path input = scratch("input.chain.json");
    write(input, read(chain));
    const std::string original = read(input);
    SECTION("--out or --svg equal to the input is refused, and the input is untouched") {
        for (const std::string flag : {"--out", "--svg"}) {
            const CliResult r = run_cli({input.string(), "--budget", "25088", flag, input.string()});
            CHECK(r.code == 2);
            CHECK(r.err.find("the problem file itself") != std::string::npos);
            CHECK(read(input) == original);
        }
        const fs::path dotted = input.parent_path() / "." / input.filename();
        CHECK(run_cli({input.string(), "--budget", "25088", "--out", dotted.string()}).code == 2);
        CHECK(read(input) == original);
    }
    SECTION("--out X --svg X is refused") {
        const fs::path x = scratch("x.out");
        const CliResult r = run_cli({input.string(), "--budget", "25088", "--out", x.string(), "--svg", x.string()});
        CHECK(r.code == 2);
        CHECK(r.err.find("same file") != std::string::npos);
    }
    SECTION("a run without a plan removes a stale --out; a successful one leaves no temporary file") {
        const fs::path dir = scratch("atomic");
        fs::remove_all(dir);
        fs::create_directories(dir);
        const fs::path out = dir / "schedule.json";
        REQUIRE(run_cli({input.string(), "--budget", "25088", "--out", out.string()}).code == 0);
        REQUIRE(fs::exists(out));
        CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
        CHECK(io::load_schedule(io::load_problem(input), out).steps.size() == 6);
        const CliResult r = run_cli({input.string(), "--budget", "100", "--out", out.string()});
        CHECK(r.code == 3);
        CHECK_FALSE(fs::exists(out));
        CHECK(r.err.find("removed") != std::string::npos);
    }
    SECTION("an unwritable --out is bad input and leaves nothing behind") {
        const fs::path out = scratch("no-such-folder") / "deeper" / "schedule.json";
        fs::remove_all(scratch("no-such-folder"));
        const CliResult r = run_cli({input.string(), "--budget", "25088", "--out", out.string()});
        CHECK(r.code == 2);
        CHECK_FALSE(fs::exists(out.parent_path()));
    }
}

// ------------------------------------------------------------------ 7. --check

TEST_CASE("hardening: remat-plan --check simulates a schedule file", "[hardening][cli]") {
    const std::string chain = (problems / "tiny-chain.chain.json").string();
    const fs::path good = scratch("good.schedule.json");
    REQUIRE(run_cli({chain, "--budget", "25088", "--out", good.string()}).code == 0);
    SECTION("valid: exit 0 with the time and peak") {
        const CliResult r = run_cli({chain, "--check", good.string()});
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(r.out.find("time      3") != std::string::npos);
        CHECK(r.out.find("25088 B") != std::string::npos);
        const CliResult j = run_cli({chain, "--check", good.string(), "--json"});
        CHECK(j.out.find("\"valid\":true") != std::string::npos);
        CHECK(j.out.find("\"peak\":25088") != std::string::npos);
    }
    SECTION("over the budget, an invalid step, a wrong prediction: exit 1") {
        const CliResult over = run_cli({chain, "--check", good.string(), "--budget", "25087"});
        CHECK(over.code == 1);
        CHECK(over.err.find("above the budget") != std::string::npos);
        std::string text = read(good);
        const fs::path bad = scratch("bad.schedule.json");
        std::string invalid = text;
        invalid.replace(invalid.find("{\"run\": \"F1+\"}"), 14, "{\"run\": \"B1\"}");
        write(bad, invalid);
        const CliResult r = run_cli({chain, "--check", bad.string()});
        CHECK(r.code == 1);
        CHECK(r.err.find("step 0") != std::string::npos);
        std::string wrong = text;
        wrong.replace(wrong.find("\"peak\": 25088"), 13, "\"peak\": 25000");
        write(bad, wrong);
        const CliResult w = run_cli({chain, "--check", bad.string()});
        CHECK(w.code == 1);
        CHECK(w.err.find("predicts") != std::string::npos);
    }
    SECTION("a schedule of another problem is bad input; --check takes no solver") {
        CHECK(run_cli({(problems / "diamond.problem.json").string(), "--check", good.string()}).code == 2);
        CHECK(run_cli({chain, "--check", good.string(), "--solver", "rotor"}).code == 2);
    }
}

// ------------------------------------------------------------------ 8. nits

TEST_CASE("hardening: empty solver variants and solvers that do not apply", "[hardening][cli]") {
    const std::string chain = (problems / "tiny-chain.chain.json").string();
    for (const std::string spec : {"rotor:", "periodic:", "greedy:", "hrockmate:"}) {
        const CliResult r = run_cli({chain, "--budget", "25088", "--solver", spec});
        INFO(spec << ": " << r.err);
        CHECK(r.code == 2);
        CHECK(r.err.find("empty variant") != std::string::npos);
    }
    const CliResult r = run_cli({(problems / "diamond.problem.json").string(), "--budget", "90%", "--solver", "rotor"});
    CHECK(r.code == 2);
    for (const std::string name : {"rockmate", "hrockmate", "greedy", "auto", "exhaustive", "store-all"})
        CHECK(r.err.find(name) != std::string::npos);
}

TEST_CASE("hardening: messages shorten long names and escape control and invalid UTF-8 bytes", "[hardening]") {
    CHECK(printable("plain") == "plain");
    CHECK(printable("caf\xC3\xA9 \xE2\x88\x91") == "caf\xC3\xA9 \xE2\x88\x91");  // valid UTF-8 is kept
    CHECK(printable("a\x01" "b\n") == "a\\x01b\\x0a");
    CHECK(printable("\xFF\xC3") == "\\xff\\xc3");
    CHECK(printable("\xED\xA0\x80") == "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
    CHECK(printable(std::string(100, 'k')) == std::string(80, 'k') + "\xE2\x80\xA6");
    const std::string long_key(100000, 'k');
    try {
        (void)io::parse_problem(R"({"format": "remat.problem/1", ")" + long_key + R"(": 1})", "f");
        FAIL("accepted");
    } catch (const InvalidInput& e) {
        CHECK(std::string(e.what()).size() < 2000);
    }
    ProblemBuilder b("names");
    (void)b.add_data("bad\xFF\x1B[31m", 1);
    CHECK_THROWS_WITH(b.add_data("bad\xFF\x1B[31m", 1), Catch::Contains("bad\\xff\\x1b[31m"));
}

TEST_CASE("hardening: NaN time limits are InvalidInput like 0", "[hardening]") {
    const Problem p = to_problem(uniform_chain(3, 1.0, 8));
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const double limit : {nan, 0.0, -1.0}) {
        INFO(limit);
        RotorOptions r;
        r.time_limit_seconds = limit;
        CHECK_THROWS_AS(Rotor(r).solve(p, 1000), InvalidInput);
        ExhaustiveOptions e;
        e.time_limit_seconds = limit;
        CHECK_THROWS_AS(Exhaustive(e).solve(p, 1000), InvalidInput);
    }
    ImproveOptions i;
    i.time_limit_seconds = nan;
    CHECK_THROWS_AS(improve_schedule(p, store_all_reference(p).schedule, 1000, i), InvalidInput);
}
