// remat.problem/2 and remat.schedule/2 (docs/formats.md §11): readers, writers and
// `remat-plan --offload`, run in-process.
#include <catch2/catch.hpp>

#include <remat/io/json.hpp>
#include <remat/io/offload_json.hpp>
#include <remat/io/offload_svg.hpp>
#include <remat/remat.hpp>

#include "../support/offload_problems.hpp"
#include "../support/random_problems.hpp"
#include "../support/remat_plan_in_process.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace {

namespace fs = std::filesystem;
using namespace remat;

const fs::path gpt = fs::path(REMAT_SOURCE_DIR) / "examples" / "problems" / "gpt-like-training.json";

Problem small_training() {
    std::mt19937 rng(9);
    return offload::training_problem(testing::random_chain(rng, 4), std::vector<Bytes>{64, 32, 0, 48},
                                     {2.0, 0.01, true, TransferSettings{4096, 16.0, 32.0}});
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

std::string read_error(const std::string& text) {
    try {
        (void)io::parse_problem(text, "p.json");
    } catch (const InvalidInput& e) {
        return e.what();
    }
    FAIL("accepted: " << text);
    return {};
}

}  // namespace

TEST_CASE("remat.problem/2 round-trips, and /1 problems are still written as /1", "[offload][json]") {
    const Problem p = small_training();
    const std::string text = io::to_json(p);
    CHECK_THAT(text, Catch::Contains("\"remat.problem/2\""));
    CHECK_THAT(text, Catch::Contains("\"offloadable\": true"));
    CHECK_THAT(text, Catch::Contains("\"updates\": [\"w1\", \"m1\"]"));
    CHECK_THAT(text, Catch::Contains("\"host_limit\": 4096"));
    CHECK(io::parse_problem(text) == p);
    std::mt19937 rng(2);
    const Problem plain = to_problem(testing::random_chain(rng, 3));
    CHECK_THAT(io::to_json(plain), Catch::Contains("\"remat.problem/1\""));
}

TEST_CASE("remat.problem/2 fields are rejected in /1 files, and checked in /2 files", "[offload][json][bad-input]") {
    const std::string text = io::to_json(small_training());
    CHECK_THAT(read_error(replaced(text, "remat.problem/2", "remat.problem/1")), Catch::Contains("unknown field"));
    CHECK_THAT(read_error(replaced(text, "\"offloadable\": true", "\"offloadable\": 1")),
               Catch::Contains("'offloadable' must be true or false"));
    CHECK_THAT(read_error(replaced(text, "\"updates\": [\"w1\", \"m1\"]", "\"updates\": [\"w1\", \"nope\"]")),
               Catch::Contains("updates unknown data 'nope'"));
    CHECK_THAT(read_error(replaced(text, "\"updates\": [\"w1\", \"m1\"]", "\"updates\": [\"a1\"]")),
               Catch::Contains("which is not initial"));
    CHECK_THAT(read_error(replaced(text, "\"to_host\": 16.0", "\"to_host\": 0")), Catch::Contains("must be positive"));
    CHECK_THAT(read_error(replaced(text, "\"to_host\": 16.0", "\"to_hots\": 16.0")), Catch::Contains("did you mean"));
}

TEST_CASE("remat.schedule/2 round-trips; a /1 schedule reads as one with no transfers", "[offload][json]") {
    const Problem p = small_training();
    const Bytes reference = store_all_reference(p).peak;
    const auto plan = offload::plan_with_offload(p, reference * 6 / 10, Rotor{});
    REQUIRE(plan);
    REQUIRE(plan->report.offloads > 0);
    const io::SavedOffloadSchedule saved{p.name(), plan->method, plan->budget,
                                         io::OffloadPrediction{plan->report.makespan, plan->report.device_peak,
                                                               plan->report.host_peak},
                                         plan->schedule};
    const std::string text = io::to_json(p, saved);
    CHECK_THAT(text, Catch::Contains("\"remat.schedule/2\""));
    CHECK(io::parse_offload_schedule(p, text) == saved);
    const Plan store_all = StoreAll{}.solve(p, reference);
    const auto plain = io::parse_offload_schedule(p, io::to_json(p, store_all));
    CHECK(plain.schedule == offload::with_no_transfers(store_all.schedule));
    CHECK_THROWS_WITH(io::parse_offload_schedule(p, replaced(text, "\"prefetch\"", "\"prefetched\"")),
                      Catch::Contains("unknown kind 'prefetched'"));
    const std::string svg = offload_timeline_svg(p, plan->schedule, plan->report, plan->budget);
    CHECK_THAT(svg, Catch::Contains("to device"));
    CHECK_THAT(svg, Catch::EndsWith("</svg>\n"));
}

TEST_CASE("remat-plan --offload plans the GPT-like training step within a total budget", "[offload][cli]") {
    const auto out = fs::temp_directory_path() / "remat-offload-test.json";
    const auto r = testing::remat_plan({gpt.string(), "--offload", "--budget", "35%", "--out", out.string(), "--quiet"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("remat+greedy*"));
    CHECK_THAT(r.out, Catch::Contains("transfers"));
    const Problem p = io::load_problem(gpt);
    const auto saved = io::load_offload_schedule(p, out);
    const offload::OffloadReport report = offload::simulate(p, saved.schedule);
    REQUIRE(report.valid);
    CHECK(report.device_peak <= percent_of(store_all_reference(p).peak, 35));
    REQUIRE(saved.predicted);
    CHECK(saved.predicted->peak == report.device_peak);
    // --check reads it back: valid, within the budget, predictions right; a tampered file is not.
    const auto checked = testing::remat_plan({gpt.string(), "--check", out.string(), "--json"});
    INFO(checked.err);
    CHECK(checked.code == 0);
    CHECK_THAT(checked.out, Catch::Contains("\"valid\":true") && Catch::Contains("\"host_peak\":"));
    CHECK(testing::remat_plan({gpt.string(), "--check", out.string(), "--budget", "10%"}).code == 1);
    {
        std::ifstream in(out);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        in.close();
        const auto at = text.find("{\"prefetch\"");
        REQUIRE(at != std::string::npos);
        text.erase(at, text.find('}', at) + 2 - at);  // drop the first prefetch: its data is then missing
        std::ofstream(out) << text;
    }
    const auto tampered = testing::remat_plan({gpt.string(), "--check", out.string()});
    CHECK(tampered.code == 1);
    CHECK_THAT(tampered.err, Catch::Contains("invalid"));
    fs::remove(out);
    // Without --offload: rematerialization alone, which cannot reach 35 %.
    const auto alone = testing::remat_plan({gpt.string(), "--budget", "35%", "--quiet"});
    CHECK(alone.code == 3);
    CHECK_THAT(alone.err, Catch::Contains("try --offload"));
    const auto fits = testing::remat_plan({gpt.string(), "--budget", "80%", "--json", "--quiet"});
    CHECK(fits.code == 0);
    CHECK_THAT(fits.out, Catch::Contains("\"method\":\"remat\""));
    // Below the proven bound, bad flags, and a problem with nothing to offload.
    const auto low = testing::remat_plan({gpt.string(), "--offload", "--budget", "1%", "--quiet"});
    CHECK(low.code == 3);
    CHECK_THAT(low.err, Catch::Contains("below a proven lower bound"));
    CHECK(testing::remat_plan({gpt.string(), "--bandwidth", "12GB/s", "--budget", "50%"}).code == 2);
    const auto bad_rate = testing::remat_plan({gpt.string(), "--offload", "--bandwidth", "fast", "--budget", "50%"});
    CHECK(bad_rate.code == 2);
    CHECK_THAT(bad_rate.err, Catch::Contains("expects a positive rate"));
    const auto nothing = testing::remat_plan(
        {(fs::path(REMAT_SOURCE_DIR) / "examples" / "problems" / "tiny-chain.chain.json").string(), "--offload", "--budget",
         "90%"});
    CHECK(nothing.code == 2);
    CHECK_THAT(nothing.err, Catch::Contains("nothing to offload"));
}

TEST_CASE("remat-plan --offload --solver hrockmate: seconds, not a minute", "[offload][cli][timing]") {
    // Its greedy component's portfolio ran until its 1.5 s were spent at each of the combined
    // planner's activation budgets: 48 s at 50 %, 73 s at 95 %; now about 3 s, same plans.
    for (const std::string percent : {"50%", "95%"}) {
        const auto start = std::chrono::steady_clock::now();
        const auto r = testing::remat_plan({gpt.string(), "--offload", "--budget", percent, "--solver", "hrockmate", "--json", "--quiet"});
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        INFO(percent << ": " << r.err);
        REQUIRE(r.code == 0);
        CHECK(seconds < 15.0);
    }
}

TEST_CASE("remat-plan --offload with auto or hrockmate on a graph: the activations analysed once, as the library "
          "plans them",
          "[offload][cli]") {
    // The command line analysed the activations anew at each of the combined planner's ~25
    // activation budgets, and ran auto with its exact search and H-Rockmate's greedy component
    // at each: 84 s with auto on a 283-op U-Net at 40 %. Now the planner gets remat::Auto and
    // remat::HRockmate themselves and runs them as for every library caller.
    const fs::path file = fs::temp_directory_path() / "remat-offload-unet.json";
    io::write_file(file, io::to_json(testing::small_unet_training(2, 2)));
    for (const std::string solver : {"auto", "hrockmate"}) {
        const auto r = testing::remat_plan({file.string(), "--offload", "--budget", "60%", "--solver", solver, "--verbose"});
        INFO(solver << ": " << r.err);
        REQUIRE(r.code == 0);
        CHECK_THAT(r.out, Catch::Contains("activations by " + solver));
        std::size_t analyses = 0;
        for (std::size_t at = r.err.find("hrockmate: analysed"); at != std::string::npos;
             at = r.err.find("hrockmate: analysed", at + 1))
            ++analyses;
        CHECK(analyses == 1);
        CHECK_THAT(r.err, !Catch::Contains("exact component") && !Catch::Contains("second opinion"));
    }
    fs::remove(file);
}

TEST_CASE("remat-plan --offload --time-limit covers the whole plan, not each of its activation budgets",
          "[offload][cli][timing]") {
    // Each activation budget's solve had the whole limit: --time-limit 3 took 9.9 s with auto
    // on a 283-op U-Net at 40 %, and 11.2 s with checkmate at --time-limit 5.
    const fs::path file = fs::temp_directory_path() / "remat-offload-unet-limit.json";
    io::write_file(file, io::to_json(testing::small_unet_training(3, 1)));
    for (const std::string solver : {"auto", "hrockmate"}) {
        const auto start = std::chrono::steady_clock::now();
        const auto r = testing::remat_plan(
            {file.string(), "--offload", "--budget", "60%", "--solver", solver, "--time-limit", "1.5", "--quiet"});
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        INFO(solver << ": " << r.err);
        REQUIRE(r.code == 0);
        CHECK(seconds < 6.0);  // 15 s without the limit
    }
    fs::remove(file);
}

TEST_CASE("Problem::with_overheads changes the op overheads and nothing else", "[offload]") {
    const Problem p = small_training();  // offloadable data, updates, transfer settings
    std::vector<Bytes> overheads;
    for (std::size_t k = 0; k < p.op_count(); ++k) overheads.push_back(static_cast<Bytes>(3 * k + 1));
    const Problem q = p.with_overheads(overheads);
    REQUIRE(q.op_count() == p.op_count());
    for (std::size_t k = 0; k < p.op_count(); ++k) {
        Op expected = p.op(OpId{k});
        expected.overhead = overheads[k];
        CHECK(q.op(OpId{k}) == expected);
    }
    std::vector<Bytes> same;
    for (const Op& op : p.all_ops()) same.push_back(op.overhead);
    CHECK(q.with_overheads(same) == p);  // data, lists, loss, order, updates, transfers all kept
    CHECK(q.uses_transfer_fields());
    overheads.pop_back();
    CHECK_THROWS_WITH(p.with_overheads(overheads), Catch::Contains(std::to_string(p.op_count()) + " ops") &&
                                                       Catch::Contains(std::to_string(p.op_count() - 1) + " overheads"));
    same[0] = -1;
    CHECK_THROWS_WITH(p.with_overheads(same), Catch::Contains("op '" + p.op(OpId{0}).name + "'") &&
                                                  Catch::Contains("negative overhead -1"));
}
