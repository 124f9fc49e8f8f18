// remat/io/sweep.hpp — the budget-versus-overhead curve: plans at a range of budgets, as a
// table (CSV) and as a chart (SVG). It is the curve a user reads to choose a budget: how much
// time each byte saved costs, and where the overhead starts to climb (the Rotor and Checkmate
// papers plot the same trade-off). remat-plan --sweep N --sweep-csv FILE --sweep-svg FILE
// writes both. Standard library only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../core/errors.hpp"
#include "../core/solver.hpp"
#include "../solvers/store_all.hpp"
#include "budget.hpp"
#include "svg.hpp"

namespace remat {

/// One budget of a sweep: the plan made for it, or what the solver said it needs instead.
struct SweepPoint {
    Bytes budget = 0;
    std::optional<Plan> plan;
    std::optional<Bytes> needs;  ///< when infeasible: the smallest budget the solver knows
};

/// `count` budgets evenly from `lowest` to `highest` (both included; one budget: `lowest`).
[[nodiscard]] inline std::vector<Bytes> sweep_budgets(Bytes lowest, Bytes highest, std::size_t count) {
    if (count == 0) return {};
    highest = std::max(highest, lowest);
    std::vector<Bytes> budgets;
    for (std::size_t i = 0; i < count; ++i) {
        const double f = count == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(count - 1);
        budgets.push_back(lowest + static_cast<Bytes>(static_cast<double>(highest - lowest) * f));
    }
    return budgets;
}

/// Plans at each budget with `plan_at` (a solver bound to one problem); Infeasible answers
/// become points without a plan.
[[nodiscard]] inline std::vector<SweepPoint> sweep(const std::vector<Bytes>& budgets,
                                                   const std::function<Plan(Bytes)>& plan_at) {
    std::vector<SweepPoint> points;
    for (const Bytes b : budgets) {
        SweepPoint point{b, std::nullopt, std::nullopt};
        try {
            point.plan = plan_at(b);
        } catch (const Infeasible& e) {
            point.needs = e.smallest_budget();
        }
        points.push_back(std::move(point));
    }
    return points;
}

/// The sweep as CSV: budget_bytes, budget_percent (of P_ref), feasible, time, overhead_percent
/// (over T_ref), peak_bytes, solve_seconds; empty fields where a budget has no plan.
[[nodiscard]] inline std::string sweep_csv(const std::vector<SweepPoint>& points, const Reference& reference) {
    std::string csv = "budget_bytes,budget_percent,feasible,time,overhead_percent,peak_bytes,solve_seconds\n";
    char number[64];
    const auto add = [&](const char* format, double v) {
        std::snprintf(number, sizeof number, format, v);
        csv += number;
    };
    for (const SweepPoint& p : points) {
        csv += std::to_string(p.budget);
        csv += ',';
        add("%.4f", 100.0 * static_cast<double>(p.budget) / static_cast<double>(std::max<Bytes>(reference.peak, 1)));
        if (!p.plan) {
            csv += ",false,,,,\n";
            continue;
        }
        csv += ",true,";
        add("%.9g", p.plan->time);
        csv += ",";
        add("%.4f", reference.time > 0 ? 100.0 * (p.plan->time / reference.time - 1.0) : 0.0);
        csv += ',';
        csv += std::to_string(p.plan->peak);
        csv += ',';
        add("%.6g", p.plan->stats.solve_seconds);
        csv += "\n";
    }
    return csv;
}

/// The sweep as a chart: overhead over T_ref (y) against the budget in % of P_ref (x), a point
/// per plan, infeasible budgets marked on the axis.
[[nodiscard]] inline std::string sweep_svg(const std::vector<SweepPoint>& points, const Reference& reference,
                                           const std::string& title) {
    using detail::svg::coord;
    const double width = 720, height = 420, x0 = 80, x1 = width - 24, y0 = 64, y1 = height - 64;
    const auto percent_of_ref = [&](Bytes b) {
        return 100.0 * static_cast<double>(b) / static_cast<double>(std::max<Bytes>(reference.peak, 1));
    };
    const auto overhead = [&](const Plan& p) { return reference.time > 0 ? 100.0 * (p.time / reference.time - 1.0) : 0.0; };
    double x_low = 100.0, x_high = 100.0, y_high = 1.0;
    for (const SweepPoint& p : points) {
        x_low = std::min(x_low, percent_of_ref(p.budget));
        x_high = std::max(x_high, percent_of_ref(p.budget));
        if (p.plan) y_high = std::max(y_high, overhead(*p.plan));
    }
    x_low = std::max(0.0, std::floor(x_low / 10.0) * 10.0);
    x_high = std::ceil(x_high / 10.0) * 10.0;
    if (x_high <= x_low) x_high = x_low + 10.0;
    const double y_tick = detail::svg::time_tick(y_high * 1.1);
    const double y_top = std::ceil(y_high * 1.1 / y_tick) * y_tick;
    const auto x = [&](double percent) { return x0 + (x1 - x0) * (percent - x_low) / (x_high - x_low); };
    const auto y = [&](double over) { return y1 - (y1 - y0) * over / y_top; };

    std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + coord(width) + "\" height=\"" +
                      coord(height) + "\" viewBox=\"0 0 " + coord(width) + " " + coord(height) +
                      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
    svg += "<title>" + detail::svg::xml_escape(title) + "</title>\n";
    svg += "<rect x=\"0\" y=\"0\" width=\"" + coord(width) + "\" height=\"" + coord(height) + "\" fill=\"white\"/>\n";
    svg += "<text x=\"" + coord(x0) + "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" +
           detail::svg::xml_escape(title) + "</text>\n";
    svg += "<text x=\"" + coord(x0) + "\" y=\"44\" fill=\"#444\">overhead over store-all time against the budget</text>\n";
    svg += "<g class=\"y-axis\" fill=\"#444\" text-anchor=\"end\">\n";
    for (double v = 0.0; v <= y_top * (1 + 1e-9); v += y_tick) {
        svg += "<line x1=\"" + coord(x0) + "\" y1=\"" + coord(y(v)) + "\" x2=\"" + coord(x1) + "\" y2=\"" + coord(y(v)) +
               "\" stroke=\"#e4e4e4\"/>\n";
        svg += "<text x=\"" + coord(x0 - 6) + "\" y=\"" + coord(y(v) + 4) + "\">+" + detail::svg::format_number(v) +
               " %</text>\n";
    }
    svg += "<text transform=\"translate(18 " + coord((y0 + y1) / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">overhead (% of store-all time)</text>\n</g>\n";
    svg += "<g class=\"x-axis\" fill=\"#444\" text-anchor=\"middle\">\n";
    for (double v = x_low; v <= x_high + 1e-9; v += 10.0)
        svg += "<text x=\"" + coord(x(v)) + "\" y=\"" + coord(y1 + 18) + "\">" + detail::svg::format_number(v) +
               " %</text>\n";
    svg += "<text x=\"" + coord((x0 + x1) / 2) + "\" y=\"" + coord(y1 + 38) +
           "\">budget (% of the store-all peak)</text>\n</g>\n";
    svg += "<line x1=\"" + coord(x0) + "\" y1=\"" + coord(y1) + "\" x2=\"" + coord(x1) + "\" y2=\"" + coord(y1) +
           "\" stroke=\"#444\"/>\n";
    std::string path;
    svg += "<g class=\"plans\" fill=\"#1f77b4\">\n";
    for (const SweepPoint& p : points) {
        if (!p.plan) continue;
        const std::string px = coord(x(percent_of_ref(p.budget))), py = coord(y(overhead(*p.plan)));
        path += (path.empty() ? "M" : " L") + px + " " + py;
        svg += "<circle cx=\"" + px + "\" cy=\"" + py + "\" r=\"3.5\"><title>budget " + format_bytes(p.budget) +
               ": overhead +" + detail::svg::format_number(overhead(*p.plan)) + " %, peak " +
               format_bytes(p.plan->peak) + "</title></circle>\n";
    }
    svg += "</g>\n";
    if (!path.empty()) svg += "<path class=\"curve\" d=\"" + path + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
    svg += "<g class=\"infeasible\" fill=\"#d62728\">\n";
    for (const SweepPoint& p : points)
        if (!p.plan)
            svg += "<text x=\"" + coord(x(percent_of_ref(p.budget))) + "\" y=\"" + coord(y1 - 4) +
                   "\" text-anchor=\"middle\">&#215;<title>budget " + format_bytes(p.budget) +
                   ": no plan</title></text>\n";
    svg += "</g>\n</svg>\n";
    return svg;
}

}  // namespace remat
