// remat/io/offload_svg.hpp — a picture of an offloading plan (docs/formats.md §11): device and
// host memory over the makespan, and one lane per channel below it (compute, device → host,
// host → device) with a bar for each op and each transfer, where it runs in the simulation
// of offload/simulate.hpp. Stalls show as gaps in the compute lane. Standard library only; a
// self-contained SVG.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "../core/problem.hpp"
#include "../offload/schedule.hpp"
#include "../offload/simulate.hpp"
#include "svg.hpp"

namespace remat {

namespace detail::offload_svg {

struct Lanes {
    double x0 = 70, x1 = 940, memory_top = 60, memory_bottom = 300, lane_top = 330, lane_height = 34;
    double span = 1;
    Bytes y_top = 1;
    [[nodiscard]] double x(double t) const { return x0 + (x1 - x0) * t / span; }
    [[nodiscard]] double y(Bytes b) const {
        return memory_bottom - (memory_bottom - memory_top) * static_cast<double>(b) / static_cast<double>(y_top);
    }
};

// Device and host memory, step by step at the time each step is issued: an op or a free
// when the compute channel reaches it, a transfer at the point of the compute stream where it
// is issued (memory is order-based: a prefetch counts from its issue, docs/formats.md §11).
inline void draw_memory(std::string& svg, const Lanes& f, const offload::OffloadSchedule& s, const offload::OffloadReport& r) {
    using svg::coord;
    std::string device = "M" + coord(f.x(0)) + "," + coord(f.y(r.device_initial));
    std::string host = "M" + coord(f.x(0)) + "," + coord(f.y(r.host_initial));
    double issued = 0.0;
    for (std::size_t i = 0; i < s.steps.size() && i < r.timeline.size(); ++i) {
        const auto& p = r.timeline[i];
        const bool compute = s.steps[i].is_run() || s.steps[i].kind() == offload::TransferStep::Kind::free;
        if (compute) issued = std::max(issued, p.start);
        const double x = f.x(issued);
        device += " L" + coord(x) + "," + coord(f.y(p.device_during));
        if (s.steps[i].is_run()) {
            issued = std::max(issued, p.end);
            device += " L" + coord(f.x(issued)) + "," + coord(f.y(p.device_during));
        }
        device += " L" + coord(f.x(issued)) + "," + coord(f.y(p.device_after));
        host += " L" + coord(x) + "," + coord(f.y(p.host_after));
    }
    device += " L" + coord(f.x(f.span)) + "," + coord(f.y(r.timeline.empty() ? r.device_initial : r.timeline.back().device_after));
    host += " L" + coord(f.x(f.span)) + "," + coord(f.y(r.timeline.empty() ? r.host_initial : r.timeline.back().host_after));
    svg += "<path d=\"" + device + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
    svg += "<path d=\"" + host + "\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>\n";
}

inline void draw_lanes(std::string& svg, const Lanes& f, const Problem& problem, const offload::OffloadSchedule& s,
                       const offload::OffloadReport& r) {
    using svg::coord;
    const char* names[] = {"compute", "to host", "to device"};
    const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c"};
    for (int lane = 0; lane < 3; ++lane) {
        const double y = f.lane_top + lane * f.lane_height;
        svg += "<text x=\"" + coord(f.x0 - 6) + "\" y=\"" + coord(y + f.lane_height * 0.6) +
               "\" text-anchor=\"end\" font-size=\"11\">" + names[lane] + "</text>\n";
        svg += "<line x1=\"" + coord(f.x0) + "\" x2=\"" + coord(f.x1) + "\" y1=\"" + coord(y + f.lane_height) + "\" y2=\"" +
               coord(y + f.lane_height) + "\" stroke=\"#ddd\"/>\n";
    }
    for (std::size_t i = 0; i < s.steps.size() && i < r.timeline.size(); ++i) {
        const offload::TransferStep& step = s.steps[i];
        const int lane = step.is_run() ? 0 : step.kind() == offload::TransferStep::Kind::offload ? 1
                                         : step.kind() == offload::TransferStep::Kind::prefetch  ? 2
                                                                                                 : -1;
        if (lane < 0) continue;
        const auto& p = r.timeline[i];
        const double x = f.x(p.start), w = std::max(0.5, f.x(p.end) - x);
        const double y = f.lane_top + lane * f.lane_height + 4;
        const std::string label = svg::xml_escape(offload::describe(problem, step));
        svg += "<rect x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" width=\"" + coord(w) + "\" height=\"" +
               coord(f.lane_height - 8) + "\" fill=\"" + colors[lane] + "\" fill-opacity=\"0.6\" stroke=\"white\" "
               "stroke-width=\"0.5\"><title>" + label + "</title></rect>\n";
        if (w > 7.0 * static_cast<double>(label.size()))
            svg += "<text x=\"" + coord(x + 2) + "\" y=\"" + coord(y + f.lane_height * 0.5) + "\" font-size=\"9\">" + label +
                   "</text>\n";
    }
}

}  // namespace detail::offload_svg

/// The SVG of an offloading plan: memory over time, the budget, and a lane per channel.
[[nodiscard]] inline std::string offload_timeline_svg(const Problem& problem, const offload::OffloadSchedule& schedule,
                                                      const offload::OffloadReport& report, Bytes budget) {
    using detail::svg::coord;
    detail::offload_svg::Lanes f;
    f.span = std::max(report.makespan, 1e-300);
    f.y_top = std::max({report.device_peak, report.host_peak, budget, Bytes{1}});
    f.y_top += f.y_top / 20;
    std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"460\" font-family=\"sans-serif\">\n";
    svg += "<rect width=\"960\" height=\"460\" fill=\"white\"/>\n";
    svg += "<text x=\"70\" y=\"22\" font-size=\"14\">" + detail::svg::xml_escape(problem.name()) +
           ": device and host memory, and the three channels</text>\n";
    svg += "<text x=\"70\" y=\"40\" font-size=\"11\">makespan " + detail::svg::format_number(report.makespan) +
           " (compute " + detail::svg::format_number(report.compute_time) + "), device peak " +
           format_bytes(report.device_peak) + ", host peak " + format_bytes(report.host_peak) + ", budget " +
           format_bytes(budget) + "</text>\n";
    const Bytes tick = detail::svg::byte_tick(f.y_top);
    for (Bytes b = 0; b <= f.y_top; b += tick)
        svg += "<line x1=\"" + coord(f.x0) + "\" x2=\"" + coord(f.x1) + "\" y1=\"" + coord(f.y(b)) + "\" y2=\"" +
               coord(f.y(b)) + "\" stroke=\"#eee\"/><text x=\"" + coord(f.x0 - 6) + "\" y=\"" + coord(f.y(b) + 4) +
               "\" text-anchor=\"end\" font-size=\"10\">" + format_bytes(b) + "</text>\n";
    svg += "<line x1=\"" + coord(f.x0) + "\" x2=\"" + coord(f.x1) + "\" y1=\"" + coord(f.y(budget)) + "\" y2=\"" +
           coord(f.y(budget)) + "\" stroke=\"#d62728\" stroke-dasharray=\"6 3\"/>\n";
    detail::offload_svg::draw_memory(svg, f, schedule, report);
    detail::offload_svg::draw_lanes(svg, f, problem, schedule, report);
    svg += "<text x=\"760\" y=\"22\" font-size=\"11\" fill=\"#1f77b4\">device</text>"
           "<text x=\"810\" y=\"22\" font-size=\"11\" fill=\"#2ca02c\">host</text>"
           "<text x=\"850\" y=\"22\" font-size=\"11\" fill=\"#d62728\">budget</text>\n";
    svg += "</svg>\n";
    return svg;
}

}  // namespace remat
