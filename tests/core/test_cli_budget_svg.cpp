// Tests of remat/io/budget.hpp, remat/io/svg.hpp, the remat-plan command line (run
// in-process) and the bundled example problems with their README figures.
#include <catch2/catch.hpp>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/io/svg.hpp>
#include <remat/remat.hpp>

#include "../support/op_level_problems.hpp"
#include "../support/random_problems.hpp"
#include "../support/remat_plan_in_process.hpp"

#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using remat::Bytes;
using remat::InvalidInput;

const fs::path problems = fs::path(REMAT_SOURCE_DIR) / "examples" / "problems";

std::string budget_error(const std::string& text) {
    try {
        (void)remat::parse_budget(text, 25088);
    } catch (const InvalidInput& e) {
        return e.what();
    }
    FAIL("budget '" << text << "' was accepted");
    return {};
}

// Tags open and close in order (self-closing ones count as both), and nothing follows the root.
bool balanced_markup(const std::string& text) {
    std::vector<std::string> open;
    std::size_t pos = 0;
    while ((pos = text.find('<', pos)) != std::string::npos) {
        const std::size_t end = text.find('>', pos);
        if (end == std::string::npos) return false;
        const std::string tag = text.substr(pos + 1, end - pos - 1);
        pos = end + 1;
        if (tag.empty()) return false;
        if (tag.back() == '/') continue;
        const std::size_t name_end = tag.find_first_of(" \n\t");
        if (tag.front() == '/') {
            if (open.empty() || open.back() != tag.substr(1)) return false;
            open.pop_back();
            if (open.empty() && text.find('<', pos) != std::string::npos) return false;
        } else {
            open.push_back(tag.substr(0, name_end));
        }
    }
    return open.empty();
}

remat::testing::CliResult cli(const std::vector<std::string>& args) { return remat::testing::remat_plan(args); }

std::string tiny_chain() { return (problems / "tiny-chain.chain.json").string(); }
std::string diamond() { return (problems / "diamond.problem.json").string(); }

fs::path scratch_dir() {
    const fs::path dir = fs::temp_directory_path() / "remat_test_cli";
    fs::create_directories(dir);
    return dir;
}

}  // namespace

// ------------------------------------------------------------------ budgets

TEST_CASE("budgets parse as bytes, sizes with units and percentages of P_ref", "[budget]") {
    CHECK(remat::parse_budget("25088", 1) == 25088);
    CHECK(remat::parse_budget("25088B", 1) == 25088);
    CHECK(remat::parse_budget(" 7 b ", 1) == 7);
    CHECK(remat::parse_budget("512MiB", 1) == Bytes{512} << 20);
    CHECK(remat::parse_budget("2GiB", 1) == Bytes{2} << 30);
    CHECK(remat::parse_budget("1.5 GiB", 1) == Bytes{3} << 29);
    CHECK(remat::parse_budget("24.5KiB", 1) == 25088);
    CHECK(remat::parse_budget("1tib", 1) == Bytes{1} << 40);
    CHECK(remat::parse_budget("100KB", 1) == 100'000);
    CHECK(remat::parse_budget("1.5MB", 1) == 1'500'000);
    CHECK(remat::parse_budget("3GB", 1) == 3'000'000'000);
    CHECK(remat::parse_budget("2TB", 1) == 2'000'000'000'000);
    CHECK(remat::parse_budget("0.000001KiB", 1) == 0);  // rounded down to whole bytes
    CHECK(remat::parse_budget("40%", 25088) == 10035);    // floor(40 × 25088 / 100)
    CHECK(remat::parse_budget("12.5%", 25088) == 3136);
    CHECK(remat::parse_budget("100 %", 49283072) == 49283072);
    CHECK(remat::parse_budget("150%", 100) == 150);
    const remat::BudgetSpec spec = remat::parse_budget_spec("40%");
    CHECK(spec.is_percent());
    CHECK(spec.percent == 40.0);
    CHECK(spec.resolve(1000) == 400);
    CHECK_FALSE(remat::parse_budget_spec("4KiB").is_percent());
    CHECK(remat::parse_bytes("4KiB") == 4096);
}

TEST_CASE("malformed budgets are InvalidInput naming the text", "[budget]") {
    CHECK_THAT(budget_error(""), Catch::Contains("budget '': it is empty"));
    CHECK_THAT(budget_error("abc"), Catch::Contains("budget 'abc': it does not start with a number"));
    CHECK_THAT(budget_error("-5"), Catch::Contains("cannot be negative"));
    CHECK_THAT(budget_error("5.5"), Catch::Contains("a number of bytes must be whole"));
    CHECK_THAT(budget_error("5 XB"), Catch::Contains("unknown unit 'XB'"));
    CHECK_THAT(budget_error("40%%"), Catch::Contains("unknown unit '%%'"));
    CHECK_THAT(budget_error("1e3"), Catch::Contains("unknown unit 'e3'"));
    CHECK_THAT(budget_error("99999999999999999999"), Catch::Contains("too large"));
    CHECK_THAT(budget_error("9000000TiB"), Catch::Contains("too large"));
    CHECK_THAT(budget_error("1.1234567GiB"), Catch::Contains("at most 6 decimals"));
    CHECK_THAT(budget_error("."), Catch::Contains("does not start with a number"));
    CHECK_THROWS_AS(remat::parse_bytes("40%"), InvalidInput);
}

TEST_CASE("byte counts format with binary units and three significant digits", "[budget]") {
    CHECK(remat::format_bytes(0) == "0 B");
    CHECK(remat::format_bytes(1023) == "1023 B");
    CHECK(remat::format_bytes(1024) == "1 KiB");
    CHECK(remat::format_bytes(25088) == "24.5 KiB");
    CHECK(remat::format_bytes(Bytes{512} << 20) == "512 MiB");
    CHECK(remat::format_bytes(Bytes{3} << 29) == "1.5 GiB");
    CHECK(remat::format_bytes(1'000'000) == "977 KiB");
    CHECK(remat::format_bytes(-2048) == "-2 KiB");
    CHECK(remat::format_bytes(std::numeric_limits<Bytes>::max()) == "8 EiB");
    CHECK(remat::format_bytes(std::numeric_limits<Bytes>::min()) == "-8 EiB");
    // What it prints, it parses back to within the rounding.
    CHECK(remat::parse_budget(remat::format_bytes(Bytes{512} << 20), 1) == Bytes{512} << 20);
}

// ------------------------------------------------------------------ SVG

TEST_CASE("the memory timeline is well-formed SVG with the budget line", "[svg]") {
    const auto problem = remat::io::load_problem(problems / "diamond.problem.json");
    const auto ref = remat::store_all_reference(problem);
    const auto plan = remat::StoreAll{}.solve(problem, 50'000'000);
    const std::string svg = remat::timeline_svg(problem, plan, ref.peak);
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(svg.size() > 7);
    CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
    CHECK(balanced_markup(svg));
    CHECK_THAT(svg, Catch::Contains("class=\"budget\""));
    CHECK_THAT(svg, Catch::Contains("budget 47.7 MiB"));
    CHECK_THAT(svg, Catch::Contains("class=\"during\""));
    CHECK_THAT(svg, Catch::Contains("class=\"after\""));
    CHECK_THAT(svg, Catch::Contains("class=\"loss\""));
    CHECK_THAT(svg, Catch::Contains("store-all peak 47 MiB"));
    CHECK_THAT(svg, Catch::Contains("diamond"));
    CHECK_THAT(svg, Catch::Contains("store-all"));
    CHECK_THAT(svg, Catch::Contains("time 19.5"));
    CHECK_THAT(svg, Catch::Contains("peak 47 MiB"));
    // The memory axis has readable byte labels.
    CHECK_THAT(svg, Catch::Contains(">16 MiB</text>"));
    // One point per state: the initial one and one after each step.
    const auto polyline = svg.find("<polyline class=\"after\" points=\"");
    REQUIRE(polyline != std::string::npos);
    const auto points_end = svg.find('"', polyline + 33);
    const std::string points = svg.substr(polyline + 33, points_end - polyline - 33);
    CHECK(static_cast<std::size_t>(std::count(points.begin(), points.end(), ',')) == plan.schedule.size() + 1);
}

TEST_CASE("the timeline escapes text and draws empty or invalid schedules", "[svg]") {
    remat::SimulationReport empty;
    empty.valid = true;
    remat::TimelineChart chart;
    chart.title = "a<b & \"c\"";
    chart.budget = 1000;
    const std::string svg = remat::timeline_svg(empty, chart);
    CHECK_THAT(svg, Catch::Contains("a&lt;b &amp; &quot;c&quot;"));
    CHECK(balanced_markup(svg));
    CHECK_THAT(svg, Catch::Contains("class=\"budget\""));

    const auto problem = remat::io::load_problem(problems / "tiny-chain.chain.json");
    remat::Plan bad;
    bad.schedule = {remat::Step::run(problem.op_id("B1"))};
    bad.budget = 25088;
    bad.stats.solver = "hand";
    const std::string invalid = remat::timeline_svg(problem, bad);
    CHECK(balanced_markup(invalid));
    CHECK_THAT(invalid, Catch::Contains("INVALID"));
}

// ------------------------------------------------------------------ remat-plan

TEST_CASE("remat-plan prints a summary of the plan", "[cli]") {
    const auto r = cli({tiny_chain(), "--budget", "100%"});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    CHECK_THAT(r.out, Catch::Contains("tiny-chain: chain of 1 stage, 5 data, 4 ops; T_ref 3, P_ref 25088 B (24.5 KiB)"));
    CHECK_THAT(r.out, Catch::Contains("solver    auto: optimal, chose rotor-release"));
    CHECK_THAT(r.out, Catch::Contains("time      3, overhead +0.0 % vs T_ref"));
    CHECK_THAT(r.out, Catch::Contains("peak      25088 B (24.5 KiB), 100.0 % of budget"));
    CHECK_THAT(r.out, Catch::Contains("schedule  6 steps (3 runs, 3 frees)"));
    // Other problems get auto's choice too.
    CHECK_THAT(cli({diamond(), "--budget", "47MiB"}).out, Catch::Contains("solver    auto: ") && Catch::Contains("chose "));
}

TEST_CASE("remat-plan --json prints exactly one line with the agreed fields", "[cli]") {
    const auto r = cli({tiny_chain(), "--budget=25088", "--json", "--solver", "periodic"});
    CHECK(r.code == 0);
    REQUIRE(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    const auto line = nlohmann::json::parse(r.out);
    CHECK(line.at("solver") == "periodic");
    CHECK(line.at("budget") == 25088);
    CHECK(line.at("feasible") == true);
    CHECK(line.at("time") == 3.0);
    CHECK(line.at("peak") == 25088);
    CHECK(line.at("T_ref") == 3.0);
    CHECK(line.at("P_ref") == 25088);
    CHECK(line.at("solve_seconds").is_number());
    CHECK(line.at("status") == "heuristic");
    CHECK(line.at("gap").is_null());
    const auto ordered = nlohmann::ordered_json::parse(r.out);
    std::vector<std::string> keys;
    for (const auto& [key, value] : ordered.items()) keys.push_back(key);
    CHECK(keys == std::vector<std::string>{"solver", "budget", "feasible", "time", "peak", "T_ref", "P_ref",
                                           "solve_seconds", "status", "gap"});
}

TEST_CASE("remat-plan exits 3 on an infeasible budget and names the smallest feasible one", "[cli]") {
    auto r = cli({tiny_chain(), "--budget", "24KiB", "--json"});
    CHECK(r.code == 3);
    const auto line = nlohmann::json::parse(r.out);
    CHECK(line.at("feasible") == false);
    CHECK(line.at("time").is_null());
    CHECK(line.at("smallest_budget") == 25088);
    CHECK_THAT(r.err, Catch::Contains("the smallest feasible budget for auto is 25088 B"));
    r = cli({diamond(), "--budget", "40MiB", "--solver", "exhaustive"});
    CHECK(r.code == 0);
    r = cli({diamond(), "--budget", "30MiB", "--solver", "exhaustive"});
    CHECK(r.code == 3);
    CHECK_THAT(r.err, Catch::Contains("38797312"));
}

TEST_CASE("remat-plan --solver greedy plans any graph and names the smallest budget it fits", "[cli]") {
    const auto problem = remat::io::load_problem(problems / "diamond.problem.json");
    const remat::Reference ref = remat::store_all_reference(problem);
    auto r = cli({diamond(), "--budget", "100%", "--json", "--solver", "greedy"});
    CHECK(r.code == 0);
    auto line = nlohmann::json::parse(r.out);
    CHECK(line.at("solver") == "greedy");
    CHECK(line.at("status") == "heuristic");
    CHECK(line.at("time") == ref.time);
    remat::GreedyOptions dtr;
    dtr.eviction = remat::GreedyEviction::dtr;
    const Bytes smallest = remat::Greedy(dtr).smallest_budget(problem);
    r = cli({diamond(), "--budget", std::to_string(smallest - 1), "--json", "--solver", "greedy:dtr"});
    CHECK(r.code == 3);
    line = nlohmann::json::parse(r.out);
    CHECK(line.at("solver") == "greedy:dtr");
    CHECK(line.at("smallest_budget") == smallest);
    r = cli({diamond(), "--budget", "1", "--solver", "greedy:clairvoyant"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("greedy:dtr or greedy:belady"));
    CHECK_THAT(cli({"--help"}).out, Catch::Contains("greedy") && Catch::Contains("greedy:dtr or greedy:belady"));
}

TEST_CASE("remat-plan exits 2 on bad arguments and bad files", "[cli]") {
    const auto bad = [](const std::vector<std::string>& args, const std::string& message) {
        const auto r = cli(args);
        CHECK(r.code == 2);
        CHECK_THAT(r.err, Catch::Contains(message));
    };
    bad({tiny_chain()}, "--budget is required");
    bad({"--budget", "1"}, "no problem file given");
    bad({tiny_chain(), "--budget", "1", "--frobnicate"}, "unknown option '--frobnicate'");
    bad({tiny_chain(), "--budget"}, "--budget needs a value");
    bad({tiny_chain(), "--budget", "1", "--budget", "2"}, "--budget is given twice");
    bad({tiny_chain(), "--budget", "1", "--sweep", "0"}, "--sweep expects a whole number");
    bad({tiny_chain(), "--budget", "1", "--time-limit", "soon"}, "--time-limit expects a positive number");
    bad({tiny_chain(), tiny_chain(), "--budget", "1"}, "one problem file only");
    bad({tiny_chain(), "--budget", "lots"}, "budget 'lots'");
    bad({tiny_chain(), "--budget", "1", "--solver", "magic"}, "unknown solver 'magic'; known solvers: rotor, rotor-release, periodic");
    bad({tiny_chain(), "--budget", "1", "--solver", "store-all:x"}, "takes no ':VARIANT'");
    bad({tiny_chain(), "--budget", "1", "--solver", "rotor:many"}, "rotor:SLOTS");
    bad({diamond(), "--budget", "1", "--solver", "rotor"}, "does not apply to problem 'diamond' (");
    bad({diamond(), "--budget", "1", "--solver", "rotor"}, "ops): it needs a chain (docs/formats.md");
    bad({"/nonexistent.json", "--budget", "1"}, "cannot read '/nonexistent.json'");
    bad({tiny_chain(), "--sweep", "3", "--out", "x.json"}, "--out and --svg need --budget");
    CHECK_THAT(cli({tiny_chain()}).err, Catch::Contains("usage: remat-plan FILE.json --budget B"));

    const fs::path broken = scratch_dir() / "broken.json";
    remat::io::write_file(broken, R"({"format": "remat.chain/1", "name": "x", "input_bytes": 1, "stages": [
      {"name": "l1", "fwd_time": 1, "bwd_time": 1, "out_bytes": -4, "saved_bytes": 4}]})");
    bad({broken.string(), "--budget", "1"}, broken.string() + ": at /stages/0/out_bytes: stages[0] 'l1' 'out_bytes' is negative");

    const auto help = cli({"--help"});
    CHECK(help.code == 0);
    CHECK_THAT(help.out, Catch::Contains("--sweep N"));
    CHECK_THAT(help.out, Catch::Contains("Exit codes: 0 ok, 2 bad input, 3 infeasible budget"));
}

TEST_CASE("remat-plan writes the schedule and the timeline", "[cli]") {
    const fs::path dir = scratch_dir();
    const fs::path schedule = dir / "plan.json";
    const fs::path picture = dir / "plan.svg";
    const auto r = cli({tiny_chain(), "--budget", "25088", "--out", schedule.string(), "--svg", picture.string()});
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("wrote     " + schedule.string()));
    const auto problem = remat::io::load_problem(tiny_chain());
    const auto saved = remat::io::load_schedule(problem, schedule);
    CHECK(saved.solver == "rotor-release");
    CHECK(saved.budget == Bytes{25088});
    const auto report = remat::simulate(problem, saved.steps);
    REQUIRE(report.valid);
    REQUIRE(saved.predicted);
    CHECK(report.time == saved.predicted->time);
    CHECK(report.peak == saved.predicted->peak);
    CHECK(report.peak <= 25088);
    std::ifstream in(picture);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK_THAT(svg, Catch::Contains("class=\"budget\""));
    fs::remove_all(dir);
}

TEST_CASE("remat-plan --sweep plans budgets from the smallest feasible one to P_ref", "[cli]") {
    auto r = cli({diamond(), "--sweep", "4", "--solver", "exhaustive"});
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("4 budgets from the smallest feasible 38797312 B (37 MiB) to P_ref"));
    CHECK_THAT(r.out, Catch::Contains("38797312 B (37 MiB)"));
    CHECK_THAT(r.out, Catch::Contains("+20.5 %"));  // 23.5 / 19.5 - 1 at the smallest budget
    CHECK_THAT(r.out, Catch::Contains("49283072 B (47 MiB)"));

    r = cli({diamond(), "--sweep", "3", "--solver", "exhaustive", "--json"});
    CHECK(r.code == 0);
    REQUIRE(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    const auto line = nlohmann::json::parse(r.out);
    CHECK(line.at("smallest_budget") == 38797312);
    REQUIRE(line.at("sweep").size() == 3);
    CHECK(line.at("sweep")[0].at("budget") == 38797312);
    CHECK(line.at("sweep")[0].at("time") == 23.5);
    CHECK(line.at("sweep")[2].at("budget") == 49283072);
    CHECK(line.at("sweep")[2].at("time") == 19.5);

    // A solver that does not say its smallest budget is bisected: store-all's is P_ref.
    r = cli({diamond(), "--sweep", "2", "--budget", "100%", "--json", "--solver", "store-all"});
    CHECK(r.code == 0);
    CHECK(nlohmann::json::parse(r.out).at("smallest_budget") == 49283072);
}

TEST_CASE("remat-plan --solver hrockmate plans any graph, with options", "[cli][hierarchical][slow]") {
    const auto problem = remat::io::load_problem(problems / "residual-block.problem.json");
    const remat::Reference ref = remat::store_all_reference(problem);
    const std::string file = (problems / "residual-block.problem.json").string();
    auto r = cli({file, "--budget", "100%", "--json", "--solver", "hrockmate"});
    CHECK(r.code == 0);
    auto line = nlohmann::json::parse(r.out);
    CHECK(line.at("solver") == "hrockmate");
    CHECK(line.at("time") == Approx(ref.time));
    r = cli({file, "--budget", "80%", "--solver", "hrockmate:children=3,grid=2,options=3", "--quiet"});
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("component="));
    CHECK(r.err.empty());
    r = cli({file, "--budget", "80%", "--solver", "hrockmate:frobnicate"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("unknown option 'frobnicate'") && Catch::Contains("children=N"));
    r = cli({file, "--budget", "80%", "--solver", "hrockmate:grid=0"});
    CHECK(r.code == 2);
    r = cli({file, "--sweep", "3", "--solver", "hrockmate", "--json"});
    CHECK(r.code == 0);
    CHECK(nlohmann::json::parse(r.out).at("sweep").size() == 3);
}

TEST_CASE("remat-plan --solver exhaustive takes what the exact search handles, and says what it needs", "[cli]") {
    // It once stopped at 64 data (the search's masks have held 128 since), refusing a 60-op
    // DAG of 81 data without saying why.
    std::mt19937 rng(5);
    const remat::Problem large = remat::to_problem(remat::testing::random_chain(rng, 60, "long"));  // 182 data
    const remat::Problem medium = remat::testing::bench_dag(60, 1);  // bench_checkmate's 60-op DAG
    REQUIRE(medium.data_count() > 64);
    REQUIRE(remat::Exhaustive::handles(medium));
    REQUIRE_FALSE(remat::Exhaustive::handles(large));
    const fs::path dir = scratch_dir();
    std::ofstream(dir / "medium.json") << remat::io::to_json(medium);
    std::ofstream(dir / "large.json") << remat::io::to_json(large);
    // Taken, and out of time: exit 4 (too large), not 2 (does not apply).
    auto r = cli({(dir / "medium.json").string(), "--budget", "60%", "--solver", "exhaustive", "--time-limit", "0.2", "--quiet"});
    INFO(r.err);
    CHECK((r.code == 0 || r.code == 4));
    r = cli({(dir / "large.json").string(), "--budget", "60%", "--solver", "exhaustive"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("does not apply to problem '" + large.name() + "' (" +
                                      std::to_string(large.data_count()) + " data, " + std::to_string(large.op_count()) +
                                      " ops): it needs at most 128 data and 64 exactly-once ops") &&
                          Catch::Contains("solvers that apply: rotor, rotor-release"));
    CHECK_THAT(cli({"--help"}).out, Catch::Contains("[needs at most 128 data and 64 exactly-once ops]") &&
                                        Catch::Contains("[needs a chain"));
}

TEST_CASE("remat-plan --solver auto: rotor-release for chains, a block or hierarchy solver otherwise",
          "[cli][hierarchical]") {
    CHECK_THAT(cli({tiny_chain(), "--budget", "100%", "--solver", "auto"}).out, Catch::Contains("chose rotor-release"));
    CHECK(remat::cli::auto_choice(remat::io::load_problem(tiny_chain())) == "rotor-release");
    remat::testing::UNetShape u;
    u.levels = 3;
    u.convs = 2;
    CHECK(remat::cli::auto_choice(remat::testing::unet_like(u)) == "hrockmate");
    remat::testing::TransformerShape t;
    t.layers = 3;
    t.tokens = 16;
    t.width = 32;
    CHECK(remat::cli::auto_choice(remat::testing::transformer_like(t)) == "rockmate");
    const auto r = cli({diamond(), "--budget", "80%"});
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("solver    auto: ") && Catch::Contains("chose "));
    CHECK_THAT(cli({"--help"}).out, Catch::Contains("hrockmate:OPTIONS") && Catch::Contains("auto") &&
                                        Catch::Contains("--quiet") && Catch::Contains("default: auto"));
}

TEST_CASE("remat-plan says whether an infeasible budget is below a proven bound or beyond reach", "[cli][hierarchical]") {
    const auto problem = remat::io::load_problem(problems / "diamond.problem.json");
    const remat::MemoryLowerBound bound = remat::memory_lower_bound(problem);
    // Below the bound: no solver can.
    auto r = cli({diamond(), "--budget", std::to_string(bound.bytes - 1)});
    CHECK(r.code == 3);
    CHECK_THAT(r.err, Catch::Contains("below a proven lower bound") && Catch::Contains(bound.reason));
    // Above it, but below what the plain DTR rule reaches: only beyond that solver's reach where
    // the exact least peak is lower; here DTR reaches the least peak, so below it no schedule fits.
    remat::GreedyOptions dtr;
    dtr.eviction = remat::GreedyEviction::dtr;
    const Bytes smallest = remat::Greedy(dtr).smallest_budget(problem);
    const Bytes least_peak = remat::Exhaustive{}.smallest_budget(problem);
    REQUIRE(smallest - 1 >= bound.bytes);
    r = cli({diamond(), "--budget", std::to_string(smallest - 1), "--solver", "greedy:dtr"});
    CHECK(r.code == 3);
    if (smallest - 1 >= least_peak)
        CHECK_THAT(r.err, Catch::Contains("above the proven lower bound") &&
                              Catch::Contains("only beyond the reach of greedy:dtr"));
    else
        CHECK_THAT(r.err, Catch::Contains("no schedule at all fits it, as the exact search proves") &&
                              !Catch::Contains("beyond the reach"));
    // auto's own message names what it tried.
    r = cli({diamond(), "--budget", std::to_string(bound.bytes - 1), "--solver", "auto", "--quiet"});
    CHECK_THAT(r.err, Catch::Contains("auto: no plan of 'diamond'") && Catch::Contains("below a proven lower bound"));
}

TEST_CASE("remat-plan: a budget that an exact search proves too small is not called beyond reach", "[cli][hierarchical]") {
    // Between the memory lower bound (33 MiB) and the least peak of any schedule (37 MiB): the
    // exact search (exhaustive's, auto's) proves that no schedule fits, which the memory bound
    // alone does not; remat-plan once added "only beyond the reach of" the solver that proved it.
    const auto problem = remat::io::load_problem(problems / "diamond.problem.json");
    const Bytes least_peak = remat::Exhaustive{}.smallest_budget(problem);
    const Bytes budget = least_peak - 1;
    REQUIRE(budget >= remat::memory_lower_bound(problem).bytes);
    for (const std::string solver : {"exhaustive", "auto"}) {
        const auto r = cli({diamond(), "--budget", std::to_string(budget), "--solver", solver});
        CHECK(r.code == 3);
        CHECK_THAT(r.err, Catch::Contains("no schedule at all fits it, as " + solver + " proves") &&
                              !Catch::Contains("beyond the reach") && !Catch::Contains("above the proven lower bound"));
        CHECK_THAT(r.err, Catch::Contains("try --budget " + std::to_string(least_peak)));
        const auto j = nlohmann::json::parse(cli({diamond(), "--budget", std::to_string(budget), "--solver", solver, "--json"}).out);
        CHECK(j.at("no_schedule_fits") == true);
        CHECK(j.at("smallest_budget") == least_peak);
    }
    // The greedy and Rockmate prove nothing themselves: remat-plan asks the exact least peak,
    // which says that no schedule fits (once "only beyond the reach of greedy").
    for (const std::string solver : {"greedy", "rockmate"}) {
        INFO(solver);
        const auto r = cli({diamond(), "--budget", std::to_string(budget), "--solver", solver});
        CHECK(r.code == 3);
        CHECK_THAT(r.err, Catch::Contains("no schedule at all fits it, as the exact search proves: the least peak of any "
                                          "schedule is " + std::to_string(least_peak)) &&
                              !Catch::Contains("beyond the reach") && !Catch::Contains("above the proven lower bound"));
        const auto j = nlohmann::json::parse(cli({diamond(), "--budget", std::to_string(budget), "--solver", solver, "--json"}).out);
        CHECK(j.at("no_schedule_fits") == true);
        CHECK(j.at("least_peak") == least_peak);
    }
    // The same, from the library: what each solver's Infeasible says.
    const auto proven = [&](const auto& solver) {
        try {
            (void)solver.solve(problem, budget);
        } catch (const remat::Infeasible& e) {
            CHECK(e.budget() == budget);
            return std::optional<bool>(e.proven());
        }
        return std::optional<bool>();
    };
    CHECK(proven(remat::Exhaustive{}) == true);
    CHECK(proven(remat::HRockmate{}) == true);  // the diamond is not partitioned: its top is the exact search
    CHECK(proven(remat::Auto{}) == true);
    CHECK(proven(remat::Greedy{}) == false);
    // Once a component has proved it, auto spends nothing on its last resorts (their portfolios
    // would try for their whole time limit: 2 s here, against milliseconds).
    std::vector<std::string> lines;
    remat::AutoOptions watched;
    watched.progress = [&](const std::string& line) { lines.push_back(line); };
    CHECK(proven(remat::Auto(watched)) == true);
    for (const std::string& line : lines) CHECK_THAT(line, !Catch::Contains("no heuristic plan") && !Catch::Contains("greedy done"));
    const Bytes below_bound = remat::memory_lower_bound(problem).bytes - 1;
    try {
        (void)remat::Greedy{}.solve(problem, below_bound);
        FAIL("the greedy planned below the memory lower bound");
    } catch (const remat::Infeasible& e) {
        CHECK(e.proven());
        CHECK(e.because() == remat::InfeasibleBecause::no_schedule_fits);
    }
}

TEST_CASE("remat-plan: a budget beyond one solver that schedules fit is called so, with the least peak", "[cli]") {
    // Rockmate's block options need 48 MiB on the residual block; schedules fit from 40.3 MiB.
    const std::string file = (problems / "residual-block.problem.json").string();
    const auto problem = remat::io::load_problem(file);
    const Bytes least_peak = remat::Exhaustive{}.smallest_budget(problem);
    const Bytes rockmate = remat::Rockmate{}.smallest_budget(problem);
    REQUIRE(least_peak < rockmate);
    const Bytes budget = (least_peak + rockmate) / 2;
    const auto r = cli({file, "--budget", std::to_string(budget), "--solver", "rockmate"});
    CHECK(r.code == 3);
    CHECK_THAT(r.err, Catch::Contains("it is only beyond the reach of rockmate") &&
                          Catch::Contains("schedules fit from " + std::to_string(least_peak) + " B") &&
                          !Catch::Contains("no schedule at all fits"));
    const auto j = nlohmann::json::parse(cli({file, "--budget", std::to_string(budget), "--solver", "rockmate", "--json"}).out);
    CHECK(j.at("no_schedule_fits") == false);
    CHECK(j.at("least_peak") == least_peak);
    CHECK(j.at("smallest_budget") == rockmate);
    // A plan, or a proof by the solver or the memory bound, asks nothing more.
    CHECK_FALSE(nlohmann::json::parse(cli({file, "--budget", std::to_string(rockmate), "--solver", "rockmate", "--json"}).out)
                    .contains("least_peak"));
    CHECK_FALSE(nlohmann::json::parse(cli({file, "--budget", "1", "--solver", "rockmate", "--json"}).out).contains("least_peak"));
}

TEST_CASE("remat-plan progress lines carry the elapsed time", "[cli][hierarchical]") {
    std::ostringstream err;
    const auto print = remat::cli::detail::progress_printer(err, 0.0);
    print("hrockmate: cluster 3 planned");
    CHECK_THAT(err.str(), Catch::Contains("remat-plan: [") && Catch::Contains(" s] hrockmate: cluster 3 planned"));
    std::ostringstream quiet;
    const auto rare = remat::cli::detail::progress_printer(quiet, 3600.0);
    rare("not yet");
    CHECK(quiet.str().empty());
}

// ------------------------------------------------------------------ the bundled examples

TEST_CASE("every bundled example problem loads and matches the figures of its README", "[examples]") {
    std::ifstream readme(problems / "README.md");
    REQUIRE(readme);
    const std::regex row(R"(^\| `([^`]+)` \|[^|]*\| ([0-9.e+-]+) \| ([0-9]+) \|)");
    std::size_t checked = 0;
    for (std::string line; std::getline(readme, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, row)) continue;
        INFO(m[1].str());
        const auto problem = remat::io::load_problem(problems / m[1].str());
        const auto ref = remat::store_all_reference(problem);
        CHECK(ref.time == Approx(std::stod(m[2].str())).epsilon(1e-9));
        CHECK(ref.peak == std::stoll(m[3].str()));
        ++checked;
    }
    std::size_t files = 0;
    for (const auto& entry : fs::directory_iterator(problems)) files += entry.path().extension() == ".json" ? 1 : 0;
    CHECK(checked == files);
    CHECK(files >= 7);
}

TEST_CASE("remat-plan --version prints the library's version", "[cli]") {
    const auto r = cli({"--version"});
    CHECK(r.code == 0);
    CHECK(r.out == std::string("remat-plan ") + REMAT_VERSION_STRING + "\n");
    CHECK(std::string(remat::version_string) == REMAT_VERSION_STRING);
    CHECK(REMAT_VERSION == REMAT_VERSION_MAJOR * 10000 + REMAT_VERSION_MINOR * 100 + REMAT_VERSION_PATCH);
    CHECK(cli({"--version", "x"}).code == 0);  // a file given alongside is not read
}

TEST_CASE("total budgets leave the plan what parameters, gradients and optimizer state do not take", "[budget]") {
    CHECK(remat::budget_total(1000).with_resident(300).resolve(5000) == 700);
    CHECK(remat::budget_total(1000).resolve(5000) == 1000);  // nothing resident measured: all for the plan
    // A percentage of a total budget is of the total store-all memory, P_ref + resident.
    CHECK(remat::budget_percent(50).counting_everything().with_resident(100).resolve(900) == 400);
    CHECK(remat::budget_percent(50).with_resident(100).resolve(900) == 450);  // activations only: resident ignored
    CHECK(remat::budget_total(1000).counts == remat::BudgetSpec::Counts::total);
    try {
        (void)remat::budget_total(1000).with_resident(1200).resolve(5000);
        FAIL("a total budget below the resident bytes was accepted");
    } catch (const remat::Infeasible& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("parameters, gradients and optimizer state take alone"));
        CHECK(e.budget() == 1000);
    }
}

TEST_CASE("a sweep is a CSV table and an SVG curve of overhead against budget", "[svg][sweep]") {
    remat::Chain chain{"sweep", 1 << 20, {}};
    for (int l = 0; l < 8; ++l) chain.stages.push_back({"l" + std::to_string(l), 1.0, 2.0, 1 << 20, 1 << 21, 0, 0});
    const remat::Problem p = remat::to_problem(chain);
    const remat::Reference ref = remat::store_all_reference(p);
    const std::vector<remat::Bytes> budgets = remat::sweep_budgets(ref.peak / 5, ref.peak, 6);
    REQUIRE(budgets.size() == 6);
    CHECK(budgets.front() == ref.peak / 5);
    CHECK(budgets.back() == ref.peak);
    const auto points = remat::sweep(budgets, [&](remat::Bytes b) { return remat::Rotor{}.solve(p, b); });
    const std::string csv = remat::sweep_csv(points, ref);
    // 20 % of P_ref is below what a chain of 8 needs; 100 % is store-all's time.
    CHECK_THAT(csv, Catch::StartsWith("budget_bytes,budget_percent,feasible,time,overhead_percent,peak_bytes,solve_seconds\n"));
    CHECK_THAT(csv, Catch::Contains(std::to_string(ref.peak / 5) + ",20.0000,false,,,,\n"));
    CHECK_THAT(csv, Catch::Contains(std::to_string(ref.peak) + ",100.0000,true,24,0.0000," + std::to_string(ref.peak) + ","));
    CHECK(std::count(csv.begin(), csv.end(), '\n') == 7);
    const std::string svg = remat::sweep_svg(points, ref, "sweep <8>");
    CHECK_THAT(svg, Catch::StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\"") && Catch::EndsWith("</svg>\n"));
    CHECK_THAT(svg, Catch::Contains("sweep &lt;8&gt;") && Catch::Contains("class=\"curve\"") &&
                        Catch::Contains("class=\"infeasible\"") && Catch::Contains("budget (% of the store-all peak)"));
    std::size_t circles = 0;
    for (std::size_t at = svg.find("<circle "); at != std::string::npos; at = svg.find("<circle ", at + 1)) ++circles;
    CHECK(circles == 5);
}

TEST_CASE("remat-plan --explain lists the recomputed layers by their stage names", "[cli][explain]") {
    const auto r = cli({(problems / "mlp-12.chain.json").string(), "--budget", "75%", "--solver", "rotor", "--explain"});
    REQUIRE(r.code == 0);
    // Checked by hand: the five recomputations add 0.9 + 0.15 + 0.12 + 0.12 + 0.1 = 1.39 ms to
    // T_ref = 24.53 ms, which is the plan's 25.92 ms (+5.7 %).
    CHECK_THAT(r.out, Catch::EndsWith(
                          "plan for 'mlp-12': 71 steps, time 0.02592 (+5.7 % over store-all), peak 208 MiB\n"
                          "5 of 12 layers recomputed, 1.39 ms of recomputation in all\n"
                          "layer                              forwards  recomputed (cost)     backward  what happens\n"
                          "1 fc1                                     2     1 (+900 us)              1  recomputed with grad before its backward\n"
                          "5 layernorm                               2     1 (+150 us)              1  recomputed with grad before its backward\n"
                          "2 gelu1                                   2     1 (+120 us)              1  recomputed with grad before its backward\n"
                          "6 gelu2                                   2     1 (+120 us)              1  recomputed with grad before its backward\n"
                          "3 dropout1                                2     1 (+100 us)              1  recomputed with grad before its backward\n"));
    CHECK(cli({(problems / "mlp-12.chain.json").string(), "--sweep", "3", "--explain"}).code == 2);  // needs --budget
}

TEST_CASE("remat-plan --sweep-csv and --sweep-svg write the budget-overhead curve", "[cli][sweep]") {
    const fs::path dir = scratch_dir();
    const fs::path csv = dir / "sweep.csv", svg = dir / "sweep.svg";
    const auto r = cli({diamond(), "--sweep", "4", "--solver", "exhaustive", "--sweep-csv", csv.string(), "--sweep-svg",
                        svg.string()});
    REQUIRE(r.code == 0);
    std::ifstream csv_in(csv), svg_in(svg);
    const std::string table((std::istreambuf_iterator<char>(csv_in)), std::istreambuf_iterator<char>());
    const std::string picture((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
    CHECK(std::count(table.begin(), table.end(), '\n') == 5);  // header and 4 budgets
    CHECK_THAT(table, Catch::Contains("\n38797312,") && Catch::Contains(",true,23.5,20.5128,"));
    CHECK_THAT(picture, Catch::StartsWith("<svg") && Catch::Contains("class=\"curve\""));
    CHECK(cli({diamond(), "--budget", "80%", "--sweep-csv", csv.string()}).code == 2);  // needs --sweep
    fs::remove_all(dir);
}

TEST_CASE("remat-plan --certify: the exact search proves auto's plan optimal or finds a faster one", "[cli][auto]") {
    const auto r = cli({diamond(), "--budget", "90%", "--certify", "10"});
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("gap 0.00 %"));
    CHECK_THAT(r.out, Catch::Contains("certified optimal by the exact search") ||
                          Catch::Contains("chose exhaustive (certification, faster than"));
    const auto j = cli({diamond(), "--budget", "90%", "--certify", "10", "--json"});
    REQUIRE(j.code == 0);
    CHECK(nlohmann::json::parse(j.out).at("gap") == 0.0);
    const auto bad = [&](std::vector<std::string> args, const std::string& message) {
        const auto e = cli(args);
        CHECK(e.code == 2);
        CHECK_THAT(e.err, Catch::Contains(message));
    };
    bad({diamond(), "--budget", "90%", "--certify", "soon"}, "--certify expects a positive number");
    bad({diamond(), "--budget", "90%", "--solver", "greedy", "--certify", "1"}, "--certify needs --solver auto");
}

TEST_CASE("remat-plan --bound and --no-bound contradict each other", "[cli]") {
    // (auto's default bound needs a MILP backend: tests/milp/test_cli_checkmate.cpp.)
    const auto e = cli({tiny_chain(), "--budget", "100%", "--bound", "--no-bound"});
    CHECK(e.code == 2);
    CHECK_THAT(e.err, Catch::Contains("--bound and --no-bound contradict each other"));
}
