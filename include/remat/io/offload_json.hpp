// remat/io/offload_json.hpp — reader and writer of `remat.schedule/2`, a schedule with
// transfers (docs/formats.md §11). The reader also takes a `remat.schedule/1` file: a plan of
// run and free steps is an offloading schedule with no transfers.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../offload/schedule.hpp"
#include "json.hpp"

namespace remat::io {

/// What the writer of a `remat.schedule/2` file says its schedule costs.
struct OffloadPrediction {
    double time = 0.0;  ///< the makespan
    Bytes peak = 0;     ///< the device peak
    Bytes host_peak = 0;
    friend bool operator==(const OffloadPrediction&, const OffloadPrediction&) = default;
};

/// A `remat.schedule/2` file.
struct SavedOffloadSchedule {
    std::string problem;
    std::string solver;
    std::optional<Bytes> budget;
    std::optional<OffloadPrediction> predicted;  ///< recompute it with offload::simulate()
    offload::OffloadSchedule schedule;
    friend bool operator==(const SavedOffloadSchedule&, const SavedOffloadSchedule&) = default;
};

namespace detail::json {

inline offload::TransferStep read_transfer_step(const Reader& r, const Problem& problem, const Node& node) {
    using offload::TransferStep;
    constexpr std::string_view shape = "{\"run\": OP} or {\"free\" | \"offload\" | \"prefetch\" | \"free_host\": DATA}";
    if (!node.value.is_object() || node.value.size() != 1)
        r.fail(node.path, node.what + " must be " + std::string(shape));
    const std::string key = node.value.begin().key();
    const Node value{node.value.begin().value(), Reader::child_path(node, key), node.what + " " + in_quotes(key)};
    if (key == "run") {
        const std::string name = r.name(value);
        const auto id = problem.find_op(name);
        if (!id) r.fail(value.path, node.what + " runs unknown op " + in_quotes(name));
        return TransferStep::run(*id);
    }
    const auto data = [&] {
        const std::string name = r.name(value);
        const auto id = problem.find_data(name);
        if (!id) r.fail(value.path, node.what + " names unknown data " + in_quotes(name));
        return *id;
    };
    if (key == "free") return TransferStep::free(data());
    if (key == "offload") return TransferStep::offload(data());
    if (key == "prefetch") return TransferStep::prefetch(data());
    if (key == "free_host") return TransferStep::free_host(data());
    r.fail(node.path, node.what + " has unknown kind " + in_quotes(key) + "; a step is " + std::string(shape));
}

inline SavedOffloadSchedule read_offload_schedule(const Problem& problem, const json& document, const std::string& source) {
    const Reader r(source);
    const Node root{document, "", "the schedule"};
    const std::string format = r.format(root, schedule_format_2);
    if (format == schedule_format) {
        SavedSchedule plain = read_schedule(problem, document, source);
        std::optional<OffloadPrediction> predicted;
        if (plain.predicted) predicted = OffloadPrediction{plain.predicted->time, plain.predicted->peak, 0};
        return {plain.problem, plain.solver, plain.budget, predicted, offload::with_no_transfers(plain.steps)};
    }
    r.require_format(root, schedule_format_2);
    r.expect_object(root, {"format", "problem", "steps"}, {"solver", "budget", "predicted", "start_on_host"});
    SavedOffloadSchedule saved;
    saved.problem = r.name(Reader::field(root, "problem"));
    if (saved.problem != problem.name())
        r.fail("/problem", "the schedule is for problem " + in_quotes(saved.problem) + " but the problem given is " +
                               in_quotes(problem.name()));
    if (document.contains("solver")) saved.solver = r.string(Reader::field(root, "solver"));
    if (document.contains("budget")) saved.budget = r.bytes(Node{document.at("budget"), "/budget", "the schedule's 'budget'"});
    if (document.contains("predicted")) {
        const Node node{document.at("predicted"), "/predicted", "the 'predicted' object"};
        r.expect_object(node, {"time", "peak", "host_peak"}, {});
        saved.predicted = OffloadPrediction{r.time(Reader::field(node, "time")), r.bytes(Reader::field(node, "peak")),
                                            r.bytes(Reader::field(node, "host_peak"))};
    }
    if (document.contains("start_on_host")) {
        const Node list{document.at("start_on_host"), "/start_on_host", "start_on_host"};
        saved.schedule.start_on_host = read_names<DataId>(
            r, list.value, [&] { return list; }, [] { return std::string("the schedule"); }, "names", "data",
            [&](const std::string& name) { return problem.find_data(name); });
    }
    const Node steps_node{document.at("steps"), "/steps", "the \"steps\" list"};
    const json& steps = r.array(steps_node);
    saved.schedule.steps.reserve(steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i)
        saved.schedule.steps.push_back(read_transfer_step(r, problem, Reader::element(steps_node, i, item("steps", i))));
    return saved;
}

}  // namespace detail::json

/// Reads a `remat.schedule/2` (or `/1`) document whose names refer to `problem`.
[[nodiscard]] inline SavedOffloadSchedule parse_offload_schedule(const Problem& problem, std::string_view text,
                                                                 std::string_view source = "<input>") {
    const std::string src(source);
    return detail::json::read_offload_schedule(problem, detail::json::parse_document(text, src), src);
}
[[nodiscard]] inline SavedOffloadSchedule load_offload_schedule(const Problem& problem, const std::filesystem::path& path) {
    return parse_offload_schedule(problem, detail::json::read_text_file(path), path.string());
}

/// A `remat.schedule/2` file.
[[nodiscard]] inline std::string to_json(const Problem& problem, const SavedOffloadSchedule& saved) {
    using detail::json::ordered_json;
    ordered_json doc;
    doc["format"] = schedule_format_2;
    doc["problem"] = saved.problem.empty() ? problem.name() : saved.problem;
    if (!saved.solver.empty()) doc["solver"] = saved.solver;
    if (saved.budget) doc["budget"] = *saved.budget;
    if (!saved.schedule.start_on_host.empty()) {
        ordered_json list = ordered_json::array();
        for (const DataId d : saved.schedule.start_on_host) list.push_back(problem.data(d).name);
        doc["start_on_host"] = std::move(list);
    }
    ordered_json steps = ordered_json::array();
    for (const offload::TransferStep& step : saved.schedule.steps)
        steps.push_back(ordered_json{{offload::keyword(step.kind()),
                                      step.is_run() ? problem.op(step.op()).name : problem.data(step.data()).name}});
    doc["steps"] = std::move(steps);
    if (saved.predicted)
        doc["predicted"] = ordered_json{
            {"time", saved.predicted->time}, {"peak", saved.predicted->peak}, {"host_peak", saved.predicted->host_peak}};
    return detail::json::write_document(doc);
}

}  // namespace remat::io
