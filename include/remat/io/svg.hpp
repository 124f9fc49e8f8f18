// remat/io/svg.hpp — a picture of a plan: memory over the predicted time of its schedule, as
// SVG.
//
// It draws what the simulator of docs/formats.md §3 (simulation semantics) reports (SimulationReport::timeline): the
// memory while each step runs (shaded; it includes the op's new outputs and its transient
// overhead) and the memory between steps (a line), against the predicted time (each step as
// wide as its op takes, steps as ticks; step numbers when the problem has no times), with
// the budget, the peak and the store-all peak P_ref marked, the loss step that separates the
// forward phase from the backward phase, and each recomputation labelled with its layer's
// name (core/explain.hpp) — the figure the Rotor and Checkmate papers use to show where a
// schedule spends its memory and its time. Standard library only; a self-contained SVG.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/explain.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/simulate.hpp"
#include "../core/solver.hpp"
#include "budget.hpp"

namespace remat {

/// What to draw besides the timeline.
struct TimelineChart {
    std::string title;                     ///< first line, e.g. the problem and solver
    std::string subtitle;                  ///< second line, e.g. time and peak
    std::optional<Bytes> budget;           ///< drawn as a red dashed line
    std::optional<Bytes> reference_peak;   ///< P_ref, drawn as a grey dashed line
    std::optional<std::size_t> loss_step;  ///< index of the step that runs the loss op
    /// Per step, its predicted duration: the x axis is time when they sum to more than 0.
    std::vector<double> step_seconds;
    /// Per step, the layer it recomputes (empty when the step is no recomputation).
    std::vector<std::string> recompute_labels;
    int width = 960;
    int height = 480;
};

namespace detail::svg {

inline std::string xml_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default: out += c;
        }
    }
    return out;
}

inline std::string coord(double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.1f", v);
    return buffer;
}

// Tick spacing for bytes: a power of two, so that labels read "8 MiB", "16 MiB", ...
inline Bytes byte_tick(Bytes top) {
    const double raw = static_cast<double>(std::max<Bytes>(top, 1)) / 5.0;
    Bytes step = 1;
    while (static_cast<double>(step) < raw) step *= 2;
    return step;
}

// Tick spacing for step numbers: 1, 2 or 5 times a power of ten, at most about ten ticks.
inline std::size_t step_tick(std::size_t steps) {
    std::size_t base = 1;
    while (true) {
        for (const std::size_t m : {std::size_t{1}, std::size_t{2}, std::size_t{5}})
            if (steps / (base * m) <= 10) return base * m;
        base *= 10;
    }
}

// Tick spacing for times: 1, 2 or 5 times a power of ten, at most about ten ticks.
inline double time_tick(double span) {
    double base = std::pow(10.0, std::floor(std::log10(std::max(span, 1e-300))) - 1);
    while (true) {
        for (const double m : {1.0, 2.0, 5.0})
            if (span / (base * m) <= 10.0) return base * m;
        base *= 10.0;
    }
}

inline std::string format_number(double value, const char* format = "%.4g") {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, format, value);
    return buffer;
}

// Where things go: the plot area inside the margins, and the scales from steps (or
// predicted time) and bytes to coordinates.
struct Frame {
    std::size_t n = 0;  // steps
    double width = 0, height = 0;
    double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // the plot area
    Bytes tick = 1;   // between memory grid lines
    Bytes y_top = 1;  // memory at the top of the plot area
    std::vector<double> start;  // where each step starts on the x axis: its predicted start time, or its number
    bool by_time = false;
    double span = 0;  // the x axis's extent, in time or steps

    [[nodiscard]] double x_at(double v) const { return x0 + (x1 - x0) * v / span; }
    // Step index, fractional within the step.
    [[nodiscard]] double x(double step) const {
        const auto i = static_cast<std::size_t>(std::clamp(step, 0.0, static_cast<double>(n)));
        const double f = step - static_cast<double>(i);
        return x_at(i >= n ? start[n] : start[i] + f * (start[i + 1] - start[i]));
    }
    [[nodiscard]] double y(Bytes bytes) const {
        return y1 - (y1 - y0) * static_cast<double>(bytes) / static_cast<double>(y_top);
    }
};

inline Frame make_frame(const SimulationReport& report, const TimelineChart& chart) {
    Frame f;
    f.n = report.timeline.size();
    const std::size_t n = f.n;
    const double left = 92, right = 24, top = 64, bottom = 74;
    f.width = std::max(chart.width, 320);
    f.height = std::max(chart.height, 240);
    f.x0 = left;
    f.x1 = f.width - right;
    f.y0 = top;
    f.y1 = f.height - bottom;

    // The memory axis reaches a tenth above the highest line drawn, rounded up to a tick.
    Bytes highest = std::max<Bytes>(report.peak, 1);
    if (chart.budget) highest = std::max(highest, *chart.budget);
    if (chart.reference_peak) highest = std::max(highest, *chart.reference_peak);
    f.tick = byte_tick(highest + highest / 10);
    f.y_top = (highest + highest / 10 + f.tick - 1) / f.tick * f.tick;

    f.start.assign(n + 1, 0.0);
    double total = 0.0;
    for (std::size_t i = 0; i < n && i < chart.step_seconds.size(); ++i) total += std::max(0.0, chart.step_seconds[i]);
    f.by_time = chart.step_seconds.size() == n && total > 0.0;
    for (std::size_t i = 0; i < n; ++i)
        f.start[i + 1] = f.start[i] + (f.by_time ? std::max(0.0, chart.step_seconds[i]) : 1.0);
    f.span = std::max(f.start[n], 1e-300);
    return f;
}

// The SVG element, its title, a white background, and the chart's title and subtitle.
inline void draw_heading(std::string& svg, const Frame& f, const TimelineChart& chart) {
    svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + coord(f.width) + "\" height=\"" + coord(f.height) +
           "\" viewBox=\"0 0 " + coord(f.width) + " " + coord(f.height) +
           "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
    svg += "<title>" + xml_escape(chart.title) + "</title>\n";
    svg += "<rect x=\"0\" y=\"0\" width=\"" + coord(f.width) + "\" height=\"" + coord(f.height) + "\" fill=\"white\"/>\n";
    svg += "<text x=\"" + coord(f.x0) + "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" + xml_escape(chart.title) +
           "</text>\n";
    svg += "<text x=\"" + coord(f.x0) + "\" y=\"44\" fill=\"#444\">" + xml_escape(chart.subtitle) + "</text>\n";
}

// Memory grid and labels.
inline void draw_memory_axis(std::string& svg, const Frame& f) {
    svg += "<g class=\"y-axis\" fill=\"#444\" text-anchor=\"end\">\n";
    for (Bytes v = 0; v <= f.y_top; v += f.tick) {
        svg += "<line x1=\"" + coord(f.x0) + "\" y1=\"" + coord(f.y(v)) + "\" x2=\"" + coord(f.x1) + "\" y2=\"" +
               coord(f.y(v)) + "\" stroke=\"#e4e4e4\"/>\n";
        svg += "<text x=\"" + coord(f.x0 - 6) + "\" y=\"" + coord(f.y(v) + 4) + "\">" + format_bytes(v) + "</text>\n";
    }
    svg += "<text transform=\"translate(18 " + coord((f.y0 + f.y1) / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">memory</text>\n";
    svg += "</g>\n";
}

// Time (or step) axis, with a tick at every step.
inline void draw_step_axis(std::string& svg, const Frame& f) {
    svg += "<g class=\"x-axis\" fill=\"#444\" text-anchor=\"middle\">\n";
    if (f.by_time) {
        const double every = time_tick(f.span);
        for (double t = 0.0; t <= f.span * (1 + 1e-9); t += every)
            svg += "<text x=\"" + coord(f.x_at(t)) + "\" y=\"" + coord(f.y1 + 18) + "\">" + format_number(t) + "</text>\n";
        svg += "<text x=\"" + coord((f.x0 + f.x1) / 2) + "\" y=\"" + coord(f.y1 + 36) +
               "\">predicted time (ticks: steps)</text>\n";
    } else {
        const std::size_t every = step_tick(std::max<std::size_t>(f.n, 1));
        for (std::size_t s = 0; s <= f.n; s += every)
            svg += "<text x=\"" + coord(f.x(static_cast<double>(s))) + "\" y=\"" + coord(f.y1 + 18) + "\">" +
                   std::to_string(s) + "</text>\n";
        svg += "<text x=\"" + coord((f.x0 + f.x1) / 2) + "\" y=\"" + coord(f.y1 + 36) + "\">step</text>\n";
    }
    svg += "</g>\n";
    svg += "<g class=\"step-ticks\" stroke=\"#999\">\n";
    for (std::size_t i = 0; i <= f.n; ++i)
        svg += "<line x1=\"" + coord(f.x(static_cast<double>(i))) + "\" y1=\"" + coord(f.y1) + "\" x2=\"" +
               coord(f.x(static_cast<double>(i))) + "\" y2=\"" + coord(f.y1 + 4) + "\"/>\n";
    svg += "</g>\n";
}

// Memory while each step runs (a step-shaped area) and between steps (a line from the
// initial state, then after each step).
inline void draw_memory(std::string& svg, const Frame& f, const SimulationReport& report) {
    const auto& points = report.timeline;
    if (f.n > 0) {
        std::string area = "M" + coord(f.x(0)) + " " + coord(f.y(0));
        for (std::size_t i = 0; i < f.n; ++i) {
            const std::string top_y = coord(f.y(points[i].during));
            area += " L" + coord(f.x(static_cast<double>(i))) + " " + top_y + " L" +
                    coord(f.x(static_cast<double>(i + 1))) + " " + top_y;
        }
        area += " L" + coord(f.x(static_cast<double>(f.n))) + " " + coord(f.y(0)) + " Z";
        svg += "<path class=\"during\" d=\"" + area + "\" fill=\"#9ecae1\" stroke=\"none\"/>\n";
    }
    std::string line = coord(f.x(0)) + "," + coord(f.y(report.initial));
    for (std::size_t i = 0; i < f.n; ++i) {
        // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on `" " + coord(...)` here.
        line += ' ';
        line += coord(f.x(static_cast<double>(i + 1)));
        line += ',';
        line += coord(f.y(points[i].after));
    }
    svg += "<polyline class=\"after\" points=\"" + line + "\" fill=\"none\" stroke=\"#08519c\" stroke-width=\"1.5\"/>\n";
}

// Axes, drawn on top of the memory area.
inline void draw_axis_lines(std::string& svg, const Frame& f) {
    svg += "<line x1=\"" + coord(f.x0) + "\" y1=\"" + coord(f.y1) + "\" x2=\"" + coord(f.x1) + "\" y2=\"" +
           coord(f.y1) + "\" stroke=\"#222\"/>\n";
    svg += "<line x1=\"" + coord(f.x0) + "\" y1=\"" + coord(f.y0) + "\" x2=\"" + coord(f.x0) + "\" y2=\"" +
           coord(f.y1) + "\" stroke=\"#222\"/>\n";
}

// The loss step, which separates the forward phase from the backward phase.
inline void draw_loss_marker(std::string& svg, const Frame& f, std::size_t loss_step) {
    const std::string lx = coord(f.x(static_cast<double>(loss_step) + 0.5));
    svg += "<line class=\"loss\" x1=\"" + lx + "\" y1=\"" + coord(f.y0) + "\" x2=\"" + lx + "\" y2=\"" + coord(f.y1) +
           "\" stroke=\"#555\" stroke-dasharray=\"2 3\"/>\n";
    svg += "<text x=\"" + lx + "\" y=\"" + coord(f.y0 - 4) +
           "\" fill=\"#555\" text-anchor=\"middle\">loss: forward | backward</text>\n";
}

inline void draw_reference_line(std::string& svg, const Frame& f, Bytes reference_peak) {
    const std::string ry = coord(f.y(reference_peak));
    svg += "<line class=\"reference\" x1=\"" + coord(f.x0) + "\" y1=\"" + ry + "\" x2=\"" + coord(f.x1) + "\" y2=\"" + ry +
           "\" stroke=\"#888\" stroke-dasharray=\"4 4\"/>\n";
    svg += "<text x=\"" + coord(f.x0 + 4) + "\" y=\"" + coord(f.y(reference_peak) - 4) +
           "\" fill=\"#666\">store-all peak " + format_bytes(reference_peak) + "</text>\n";
}

inline void draw_budget_line(std::string& svg, const Frame& f, Bytes budget) {
    const std::string by = coord(f.y(budget));
    svg += "<line class=\"budget\" x1=\"" + coord(f.x0) + "\" y1=\"" + by + "\" x2=\"" + coord(f.x1) + "\" y2=\"" + by +
           "\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"8 4\"/>\n";
    svg += "<text x=\"" + coord(f.x1 - 4) + "\" y=\"" + coord(f.y(budget) - 4) +
           "\" fill=\"#d62728\" text-anchor=\"end\">budget " + format_bytes(budget) + "</text>\n";
}

// Where the peak happens: the first step with the most memory while it runs, when that is
// the report's peak.
inline void draw_peak_marker(std::string& svg, const Frame& f, const SimulationReport& report) {
    const auto& points = report.timeline;
    if (f.n == 0) return;
    std::size_t at = 0;
    for (std::size_t i = 1; i < f.n; ++i)
        if (points[i].during > points[at].during) at = i;
    if (points[at].during != report.peak) return;
    const double px = f.x(static_cast<double>(at) + 0.5);
    svg += "<circle class=\"peak\" cx=\"" + coord(px) + "\" cy=\"" + coord(f.y(report.peak)) +
           "\" r=\"3.5\" fill=\"#08519c\"/>\n";
    svg += "<text x=\"" + coord(px) + "\" y=\"" + coord(f.y(report.peak) - 8) +
           "\" text-anchor=\"middle\" fill=\"#08519c\">peak " + format_bytes(report.peak) + "</text>\n";
}

// Recomputations: an orange band under the area for each run of steps recomputing the
// same layer, and the layer's name where it fits.
inline void draw_recomputations(std::string& svg, const Frame& f, const std::vector<std::string>& labels) {
    svg += "<g class=\"recomputations\" fill=\"#e6550d\" font-size=\"10\">\n";
    for (std::size_t i = 0; i < f.n;) {
        if (labels[i].empty()) {
            ++i;
            continue;
        }
        std::size_t j = i;
        while (j < f.n && labels[j] == labels[i]) ++j;
        const double xa = f.x(static_cast<double>(i)), xb = f.x(static_cast<double>(j));
        svg += "<rect class=\"recompute\" x=\"" + coord(xa) + "\" y=\"" + coord(f.y1 - 4) + "\" width=\"" +
               coord(std::max(xb - xa, 0.5)) + "\" height=\"4\"><title>recomputes " + xml_escape(labels[i]) +
               "</title></rect>\n";
        if (xb - xa >= 9.0)
            svg += "<text class=\"recompute-label\" transform=\"translate(" + coord((xa + xb) / 2 + 3) + " " +
                   coord(f.y1 - 8) + ") rotate(-90)\">" + xml_escape(labels[i]) + "</text>\n";
        i = j;
    }
    svg += "</g>\n";
}

inline void draw_legend(std::string& svg, const Frame& f) {
    const double x0 = f.x0, ly = f.height - 16;
    svg += "<g class=\"legend\" fill=\"#333\">\n";
    svg += "<rect x=\"" + coord(x0) + "\" y=\"" + coord(ly - 9) + "\" width=\"14\" height=\"10\" fill=\"#9ecae1\"/>\n";
    svg += "<text x=\"" + coord(x0 + 20) + "\" y=\"" + coord(ly) + "\">memory while a step runs</text>\n";
    svg += "<line x1=\"" + coord(x0 + 200) + "\" y1=\"" + coord(ly - 4) + "\" x2=\"" + coord(x0 + 218) + "\" y2=\"" +
           coord(ly - 4) + "\" stroke=\"#08519c\" stroke-width=\"1.5\"/>\n";
    svg += "<text x=\"" + coord(x0 + 224) + "\" y=\"" + coord(ly) + "\">memory between steps</text>\n";
    svg += "<line x1=\"" + coord(x0 + 390) + "\" y1=\"" + coord(ly - 4) + "\" x2=\"" + coord(x0 + 408) + "\" y2=\"" +
           coord(ly - 4) + "\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"8 4\"/>\n";
    svg += "<text x=\"" + coord(x0 + 414) + "\" y=\"" + coord(ly) + "\">budget</text>\n";
    svg += "<rect x=\"" + coord(x0 + 480) + "\" y=\"" + coord(ly - 7) + "\" width=\"14\" height=\"4\" fill=\"#e6550d\"/>\n";
    svg += "<text x=\"" + coord(x0 + 500) + "\" y=\"" + coord(ly) + "\">recomputation</text>\n";
    svg += "</g>\n";
}

}  // namespace detail::svg

/// The SVG picture of a simulated schedule.
[[nodiscard]] inline std::string timeline_svg(const SimulationReport& report, const TimelineChart& chart) {
    using namespace detail::svg;
    const Frame f = make_frame(report, chart);
    std::string svg;
    draw_heading(svg, f, chart);
    draw_memory_axis(svg, f);
    draw_step_axis(svg, f);
    draw_memory(svg, f, report);
    draw_axis_lines(svg, f);
    if (chart.loss_step && *chart.loss_step < f.n) draw_loss_marker(svg, f, *chart.loss_step);
    if (chart.reference_peak) draw_reference_line(svg, f, *chart.reference_peak);
    if (chart.budget) draw_budget_line(svg, f, *chart.budget);
    draw_peak_marker(svg, f, report);
    if (chart.recompute_labels.size() == f.n) draw_recomputations(svg, f, chart.recompute_labels);
    draw_legend(svg, f);
    svg += "</svg>\n";
    return svg;
}

/// The picture of a plan: title "problem — solver", subtitle with time, peak and budget; time
/// on the x axis, recomputations labelled with their layer (`labels`: display names per unit,
/// as ExplainOptions::labels).
[[nodiscard]] inline std::string timeline_svg(const Problem& problem, const Plan& plan,
                                              std::optional<Bytes> reference_peak = std::nullopt,
                                              const std::map<std::string, std::string>& labels = {}) {
    const SimulationReport report = simulate(problem, plan.schedule);
    TimelineChart chart;
    std::map<std::string, std::size_t> forwards;
    for (const Step& step : plan.schedule) {
        chart.step_seconds.push_back(step.is_run() ? problem.op(step.op()).time : 0.0);
        std::string label;
        if (step.is_run()) {
            const UnitOf u = unit_of(problem.op(step.op()).name);
            if ((u.role == UnitRole::forward || u.role == UnitRole::forward_grad) && ++forwards[u.unit] > 1) {
                const auto found = labels.find(u.unit);
                label = found == labels.end() ? u.unit : found->second;
            }
        }
        chart.recompute_labels.push_back(std::move(label));
    }
    chart.title = problem.name() + " \u2014 " + plan.stats.solver + " (" + std::string(to_string(plan.stats.status)) +
                  (plan.stats.options.empty() ? "" : ", " + plan.stats.options) + ")";
    chart.subtitle = std::to_string(plan.schedule.size()) + " steps, time " +
                     detail::svg::format_number(report.time) + ", budget " + format_bytes(plan.budget) +
                     ", peak " + format_bytes(report.peak);
    if (reference_peak && *reference_peak > 0)
        chart.subtitle += " (" + detail::svg::format_number(100.0 * static_cast<double>(report.peak) /
                                                                     static_cast<double>(*reference_peak),
                                                                 "%.1f") +
                          " % of the store-all peak)";
    if (!report.valid) chart.subtitle += " \u2014 INVALID: " + report.error;
    chart.budget = plan.budget;
    chart.reference_peak = reference_peak;
    if (const auto loss = problem.loss())
        for (std::size_t i = 0; i < plan.schedule.size(); ++i)
            if (plan.schedule[i].is_run() && plan.schedule[i].op() == *loss) {
                chart.loss_step = i;
                break;
            }
    return timeline_svg(report, chart);
}

}  // namespace remat
