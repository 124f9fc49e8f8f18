// docs/formats.md is the project's statement of the formats and of the simulation semantics;
// these tests keep it honest: every worked example (marked `<!-- example: NAME problem -->`,
// `<!-- example: NAME schedule -->` and `<!-- example: NAME expect peak=BYTES time=SECONDS -->`)
// is read with remat's own readers and simulated, and must give the figures the page states;
// every other problem, chain and schedule block on the page must be read without error, and a
// schedule that states a `predicted` time and peak must have them.
#include <catch2/catch.hpp>

#include <remat/io/json.hpp>
#include <remat/io/offload_json.hpp>
#include <remat/remat.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path formats_md = fs::path(REMAT_SOURCE_DIR) / "docs" / "formats.md";

std::string read_text(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
    }
    return lines;
}

std::string trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return std::string(s);
}

struct Block {
    std::size_t line = 0;  // 1-based line of the opening fence
    std::string language;
    std::string text;
    std::string marker;    // the `<!-- example: ... -->` contents just before it, if any
};

struct Expectation {
    std::size_t line = 0;
    remat::Bytes peak = 0;
    double time = 0.0;
    std::optional<remat::Bytes> host_peak;  // §11's examples
};

struct Page {
    std::vector<Block> blocks;
    std::map<std::string, std::map<std::string, Block>> examples;  // name → kind → block
    std::map<std::string, Expectation> expectations;
};

// "<!-- example: NAME REST -->" → {NAME, REST}; nothing for other lines.
std::optional<std::pair<std::string, std::string>> example_marker(const std::string& line) {
    const std::string t = trim(line);
    constexpr std::string_view open = "<!-- example:";
    constexpr std::string_view close = "-->";
    if (t.rfind(open, 0) != 0 || t.size() < open.size() + close.size() ||
        t.compare(t.size() - close.size(), close.size(), close) != 0)
        return std::nullopt;
    const std::string inner = trim(std::string_view(t).substr(open.size(), t.size() - open.size() - close.size()));
    const auto space = inner.find(' ');
    if (space == std::string::npos) return std::pair{inner, std::string()};
    return std::pair{inner.substr(0, space), trim(std::string_view(inner).substr(space + 1))};
}

// "peak=96 time=7" → the two figures.
Expectation parse_expectation(const std::string& rest, std::size_t line) {
    Expectation e;
    e.line = line;
    std::istringstream in(rest);
    std::string word;
    REQUIRE((in >> word));
    REQUIRE(word == "expect");
    bool peak = false, time = false;
    while (in >> word) {
        const auto eq = word.find('=');
        REQUIRE(eq != std::string::npos);
        const std::string key = word.substr(0, eq);
        const std::string value = word.substr(eq + 1);
        if (key == "peak") {
            e.peak = std::stoll(value);
            peak = true;
        } else if (key == "time") {
            e.time = std::stod(value);
            time = true;
        } else if (key == "host_peak") {
            e.host_peak = std::stoll(value);
        } else {
            FAIL("unknown field '" << key << "' in the expectation on line " << line);
        }
    }
    REQUIRE(peak);
    REQUIRE(time);
    return e;
}

Page read_page(const fs::path& path) {
    const std::vector<std::string> lines = lines_of(read_text(path));
    Page page;
    std::optional<std::pair<std::string, std::string>> pending;  // marker waiting for its block
    std::size_t pending_line = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
        const std::string t = trim(lines[i]);
        if (const auto marker = example_marker(t)) {
            INFO("line " << i + 1 << ": " << t);
            REQUIRE_FALSE(marker->first.empty());
            if (marker->second.rfind("expect", 0) == 0) {
                REQUIRE(page.expectations.count(marker->first) == 0);
                page.expectations.emplace(marker->first, parse_expectation(marker->second, i + 1));
            } else {
                REQUIRE((marker->second == "problem" || marker->second == "schedule"));
                REQUIRE_FALSE(pending.has_value());
                pending = marker;
                pending_line = i + 1;
            }
            continue;
        }
        if (t.rfind("```", 0) == 0) {
            Block block;
            block.line = i + 1;
            block.language = t.substr(3);
            std::size_t j = i + 1;
            for (; j < lines.size() && trim(lines[j]) != "```"; ++j) block.text += lines[j] + "\n";
            INFO("the block opened on line " << block.line);
            REQUIRE(j < lines.size());  // closed
            if (pending) {
                INFO("the marker on line " << pending_line);
                REQUIRE(block.language == "json");
                auto& kinds = page.examples[pending->first];
                REQUIRE(kinds.count(pending->second) == 0);
                block.marker = pending->first + " " + pending->second;
                kinds.emplace(pending->second, block);
                pending.reset();
            }
            page.blocks.push_back(std::move(block));
            i = j;
            continue;
        }
        if (pending && !t.empty()) FAIL("the marker on line " << pending_line << " is not followed by a ```json block");
    }
    REQUIRE_FALSE(pending.has_value());
    return page;
}

}  // namespace

TEST_CASE("the worked examples of docs/formats.md give the peak and time the page states", "[docs]") {
    const Page page = read_page(formats_md);
    REQUIRE(page.expectations.size() >= 2);
    // Every example is complete: a problem, a schedule and the stated figures.
    for (const auto& [name, kinds] : page.examples) {
        INFO("example '" << name << "'");
        CHECK(kinds.count("problem") == 1);
        CHECK(kinds.count("schedule") == 1);
        CHECK(page.expectations.count(name) == 1);
    }
    for (const auto& [name, expected] : page.expectations) {
        INFO("example '" << name << "' (stated on line " << expected.line << ")");
        REQUIRE(page.examples.count(name) == 1);
        const auto& kinds = page.examples.at(name);
        REQUIRE(kinds.count("problem") == 1);
        REQUIRE(kinds.count("schedule") == 1);
        const remat::Problem problem = remat::io::parse_any(kinds.at("problem").text, "docs/formats.md " + name + " problem");
        if (kinds.at("schedule").text.find("remat.schedule/2") != std::string::npos) {
            const auto saved = remat::io::parse_offload_schedule(problem, kinds.at("schedule").text, name);
            const remat::offload::OffloadReport report = remat::offload::simulate(problem, saved.schedule);
            INFO(report.error);
            REQUIRE(report.valid);
            CHECK(report.device_peak == expected.peak);
            CHECK(report.makespan == Approx(expected.time));
            REQUIRE(expected.host_peak);
            CHECK(report.host_peak == *expected.host_peak);
            continue;
        }
        CHECK_FALSE(expected.host_peak);
        const remat::io::SavedSchedule saved =
            remat::io::parse_schedule(problem, kinds.at("schedule").text, "docs/formats.md " + name + " schedule");
        const remat::SimulationReport report = remat::simulate(problem, saved.steps);
        INFO(report.error);
        REQUIRE(report.valid);
        CHECK(report.peak == expected.peak);
        CHECK(report.time == Approx(expected.time));
        if (saved.predicted) {
            CHECK(saved.predicted->peak == report.peak);
            CHECK(saved.predicted->time == Approx(report.time));
        }
    }
}

TEST_CASE("every problem, chain and schedule on docs/formats.md is read, and stated predictions hold", "[docs]") {
    const Page page = read_page(formats_md);
    std::optional<remat::Problem> last;  // a schedule refers to the problem shown before it
    std::size_t problems = 0, schedules = 0;
    for (const Block& block : page.blocks) {
        if (block.language != "json" || !block.marker.empty()) continue;
        if (block.text.find("\"format\"") == std::string::npos) continue;  // not a remat file (a --json line)
        INFO("the ```json block on line " << block.line);
        const std::string source = "docs/formats.md:" + std::to_string(block.line);
        if (block.text.find("remat.schedule/1") != std::string::npos) {
            REQUIRE(last.has_value());
            const remat::io::SavedSchedule saved = remat::io::parse_schedule(*last, block.text, source);
            const remat::SimulationReport report = remat::simulate(*last, saved.steps);
            INFO(report.error);
            CHECK(report.valid);
            if (saved.predicted) {
                CHECK(saved.predicted->peak == report.peak);
                CHECK(saved.predicted->time == Approx(report.time));
            }
            if (saved.budget) CHECK(report.peak <= *saved.budget);
            ++schedules;
        } else {
            last = remat::io::parse_any(block.text, source);
            (void)remat::store_all_reference(*last);
            ++problems;
        }
    }
    CHECK(problems >= 2);
    CHECK(schedules >= 1);
}
