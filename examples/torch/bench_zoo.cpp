// bench_zoo — real models as users export them from Python, captured, planned and trained.
//
// scripts/zoo exports torchvision and torch.nn models in train mode, traced and scripted, and
// with torch.export (.pt2, mode "exported") where its Python has it (scripts/lib/zoo_export.py),
// and runs this program on its manifest. For each model:
//   - capture (remat/torch/script.hpp): ops, blocks between 1-separators, capture time;
//   - the store-all peak P_ref, a proven lower bound on any plan's peak (core/bounds.hpp, with
//     what forces it: when it is close to P_ref, the model — what capture counts, such as
//     convolution workspaces that scale with the weights — not the planner sets the floor),
//     and the smallest budget remat::Auto (solvers/auto.hpp: Rockmate or H-Rockmate here, by
//     the graph's shape) and the greedy alone reach;
//   - a plan at each budget (default 50 % and 30 % of P_ref) with Auto;
//   - `--steps` SGD steps through the plan against the same steps of plain autograd (the
//     module run eagerly, graph-executor optimizations off) from the same parameters,
//     buffers and seed: whether every gradient, buffer and parameter is equal bit for bit
//     (else the largest difference), and the predicted against the measured peak; and step by
//     step, how many ops measured more than the simulator predicted for them, by how much at
//     most (`--trace` lists every op whose measured memory differs from its prediction).
//
//   bench_zoo --manifest FILE [--only NAME[,NAME...]] [--budgets 50,30] [--steps 2] [--repeats 1] [--time-limit 20]
//             [--trace]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <remat/core/bounds.hpp>
#include <remat/io/budget.hpp>
#include <remat/partition/blocks.hpp>
#include <remat/solvers/auto.hpp>
#include <remat/solvers/greedy.hpp>
#include <remat/solvers/store_all.hpp>
#include <remat/torch/graph_executor.hpp>
#include <remat/torch/exported.hpp>
#include <remat/torch/script.hpp>

namespace {

using remat::Bytes;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Options {
    std::string manifest;
    std::vector<std::string> only;
    std::vector<double> budgets{50, 30};
    int steps = 2;
    std::size_t repeats = 1;
    double time_limit = 20.0;  // of Auto's analysis of one model
    bool trace = false;
};

struct Entry {
    std::string model, mode, file;
    nlohmann::json inputs;
};

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, ',');)
        if (!part.empty()) parts.push_back(part);
    return parts;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw remat::InvalidInput(a + " needs a value");
            return argv[++i];
        };
        if (a == "--manifest") {
            o.manifest = next();
        } else if (a == "--only") {
            o.only = split(next());
        } else if (a == "--budgets") {
            o.budgets.clear();
            for (const std::string& b : split(next())) o.budgets.push_back(std::stod(b));
        } else if (a == "--steps") {
            o.steps = std::stoi(next());
        } else if (a == "--trace") {
            o.trace = true;
        } else if (a == "--repeats") {
            o.repeats = static_cast<std::size_t>(std::stoul(next()));
        } else if (a == "--time-limit") {
            o.time_limit = std::stod(next());
        } else {
            throw remat::InvalidInput("unknown option '" + a +
                                      "'\nusage: bench_zoo --manifest FILE [--only NAMES] [--budgets 50,30] [--steps N] "
                                      "[--repeats N] [--time-limit S] [--trace]");
        }
    }
    if (o.manifest.empty()) throw remat::InvalidInput("--manifest FILE is required (scripts/zoo writes it)");
    return o;
}

std::vector<Entry> read_manifest(const Options& o) {
    std::ifstream in(o.manifest);
    if (!in) throw remat::InvalidInput("cannot read " + o.manifest + "; run scripts/zoo to export the models");
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<Entry> entries;
    for (const auto& e : j) {
        Entry entry{e.at("model"), e.at("mode"), e.at("file"), e.at("inputs")};
        if (o.only.empty() || std::find(o.only.begin(), o.only.end(), entry.model) != o.only.end())
            entries.push_back(std::move(entry));
    }
    return entries;
}

std::vector<at::Tensor> make_inputs(const nlohmann::json& specs) {
    at::manual_seed(1);
    std::vector<at::Tensor> inputs;
    for (const auto& s : specs) {
        const std::vector<std::int64_t> shape = s.at("shape");
        if (s.at("dtype") == "long")
            inputs.push_back(at::randint(0, s.value("high", 2), shape, at::kLong));
        else
            inputs.push_back(at::randn(shape));
    }
    return inputs;
}

// Σ mean(out²) over the floating outputs: a loss every model's outputs give.
at::Tensor loss_of(const std::vector<at::Tensor>& outputs) {
    at::Tensor total = at::zeros({});
    for (const at::Tensor& o : outputs)
        if (o.is_floating_point()) total = total + (o * o).mean();
    return total;
}

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
    std::vector<at::Tensor> out;
    remat::torch::detail::capture::tensors_in(v, out);
    return out;
}

// ---------------------------------------------------------------- training and comparing

struct State {
    std::vector<at::Tensor> parameters, buffers;
};

State snapshot(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& buffers) {
    State s;
    for (const at::Tensor& p : parameters) s.parameters.push_back(p.detach().clone());
    for (const at::Tensor& b : buffers) s.buffers.push_back(b.detach().clone());
    return s;
}

void restore(const State& s, const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& buffers) {
    const at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].detach().copy_(s.parameters[i]);
    for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].detach().copy_(s.buffers[i]);
}

// After each step: every gradient, then the parameters and buffers after the update.
using Trajectory = std::vector<std::vector<at::Tensor>>;

void sgd_and_record(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& buffers, Trajectory& t) {
    std::vector<at::Tensor> record;
    const at::NoGradGuard no_grad;
    for (const at::Tensor& p : parameters) record.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    for (const at::Tensor& p : parameters) {
        if (p.grad().defined()) p.detach().sub_(p.grad(), 0.01);
        p.mutable_grad() = at::Tensor();
    }
    for (const at::Tensor& p : parameters) record.push_back(p.detach().clone());
    for (const at::Tensor& b : buffers) record.push_back(b.detach().clone());
    t.push_back(std::move(record));
}

Trajectory train_plain(torch::jit::Module& m, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& parameters,
                       const std::vector<at::Tensor>& buffers, int steps) {
    const torch::jit::GraphOptimizerEnabledGuard eager(false);
    Trajectory t;
    for (int s = 0; s < steps; ++s) {
        at::manual_seed(100 + s);
        loss_of(tensors_of(m.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())))).backward();
        sgd_and_record(parameters, buffers, t);
    }
    return t;
}

struct Planned {
    Trajectory trajectory;
    Bytes predicted_peak = 0, measured_peak = 0;
    std::size_t ops_above_prediction = 0;  // over all steps
    Bytes most_above_prediction = 0;
};

// Each op's measured memory against the simulator's, into `p`; with `trace`, every op that
// differs, on stderr.
void compare_steps(const remat::Problem& problem, const remat::ExecutionPlan& prepared,
                   const remat::StepReport& report, bool trace, Planned& p) {
    const remat::Schedule& schedule = prepared.schedule();
    for (std::size_t i = 0; i < schedule.size(); ++i) {
        const Bytes measured = report.measured_timeline[i];
        if (measured < 0 || !schedule[i].is_run()) continue;
        const Bytes predicted = prepared.simulation().timeline[i].during;
        if (measured > predicted) {
            ++p.ops_above_prediction;
            p.most_above_prediction = std::max(p.most_above_prediction, measured - predicted);
        }
        if (trace && measured != predicted)
            std::fprintf(stderr, "      step %4zu %-28s predicted %9lld measured %9lld (%+lld B)\n", i,
                         remat::describe(problem, schedule[i]).c_str(), static_cast<long long>(predicted),
                         static_cast<long long>(measured), static_cast<long long>(measured - predicted));
    }
}

Planned train_planned(const remat::torch::ScriptExecutor<>& ex, const remat::Plan& plan, const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& buffers, int steps, bool trace) {
    const auto prepared = ex.prepare(plan);
    Planned p;
    p.predicted_peak = prepared.predicted_peak();
    for (int s = 0; s < steps; ++s) {
        at::manual_seed(100 + s);
        const auto result = ex.step(prepared, inputs, loss_of);
        p.measured_peak = std::max(p.measured_peak, result.report.measured_peak);
        compare_steps(ex.problem(), prepared, result.report, trace, p);
        sgd_and_record(ex.parameters(), buffers, p.trajectory);
    }
    return p;
}

// "bitwise", or the largest absolute difference.
std::string compare(const Trajectory& a, const Trajectory& b) {
    double worst = 0.0;
    bool defined_alike = a.size() == b.size();
    for (std::size_t s = 0; s < a.size() && defined_alike; ++s)
        for (std::size_t i = 0; i < a[s].size(); ++i) {
            if (a[s][i].defined() != b[s][i].defined()) {
                defined_alike = false;
                break;
            }
            if (!a[s][i].defined() || a[s][i].numel() == 0) continue;
            worst = std::max(worst, (a[s][i].to(at::kDouble) - b[s][i].to(at::kDouble)).abs().max().item<double>());
        }
    if (!defined_alike) return "MISSING GRADIENT";
    if (worst == 0.0) return "bitwise";
    char text[32];
    std::snprintf(text, sizeof text, "max |diff| %.1e", worst);
    return text;
}

// ---------------------------------------------------------------- planning

struct Planner {
    remat::Auto solver;
    remat::AutoModel model;
    Bytes auto_smallest = 0;
    Bytes greedy_smallest = 0;
};

Planner analyse(const remat::Problem& problem, double time_limit) {
    remat::AutoOptions options;
    options.time_limit_seconds = time_limit;
    const remat::Auto solver(options);
    Planner p{solver, solver.analyse(problem), 0, 0};
    p.auto_smallest = p.solver.smallest_budget(p.model);
    p.greedy_smallest = remat::Greedy{}.smallest_budget(problem);
    return p;
}

std::optional<remat::Plan> plan_at(const Planner& planner, Bytes budget) {
    try {
        return planner.solver.solve(planner.model, budget);
    } catch (const remat::Infeasible&) {
        return std::nullopt;
    }
}

std::string percent(Bytes part, Bytes whole) {
    char text[32];
    std::snprintf(text, sizeof text, "%.0f%%", 100.0 * double(part) / double(whole));
    return text;
}

void run_entry(const Entry& e, const Options& o) {
    const std::string title = e.model + " (" + e.mode + ")";
    torch::jit::Module m = e.mode == "exported" ? remat::torch::load_exported(e.file) : torch::jit::load(e.file);
    if (!remat::torch::exported_training_mode(m)) m.train();
    const std::vector<at::Tensor> inputs = make_inputs(e.inputs);
    remat::torch::CaptureOptions capture_options;
    capture_options.name = e.model + "." + e.mode;
    capture_options.repeats = o.repeats;
    capture_options.warmup = 0;
    remat::torch::ScriptCapture cap = [&] {
        try {
            return remat::torch::capture_script(m, inputs, capture_options);
        } catch (const remat::InvalidInput& error) {
            std::printf("%-34s  REFUSED: %s\n", title.c_str(), error.what());
            throw;
        }
    }();
    const remat::Problem& problem = cap.problem();
    const auto reference = remat::store_all_reference(problem);
    const auto t0 = Clock::now();
    const Planner planner = analyse(problem, o.time_limit);
    const double analysis = seconds_since(t0);
    const remat::MemoryLowerBound bound = remat::memory_lower_bound(problem);
    std::printf("%-34s  %5zu ops %4zu blocks  capture %6.1f s  P_ref %9s  smallest: auto (%s) %4s greedy %4s, "
                "lower bound %4s (%s) (analysis %.1f s)\n",
                title.c_str(), problem.op_count(), remat::partition_blocks(problem).blocks.size(), cap.seconds(),
                remat::format_bytes(reference.peak).c_str(), std::string(remat::to_string(planner.model.choice)).c_str(),
                percent(planner.auto_smallest, reference.peak).c_str(),
                percent(planner.greedy_smallest, reference.peak).c_str(), percent(bound.bytes, reference.peak).c_str(),
                bound.reason.c_str(), analysis);
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& b : m.buffers()) buffers.push_back(b);
    const State start = snapshot(cap.parameters(), buffers);
    const Trajectory plain = train_plain(m, inputs, cap.parameters(), buffers, o.steps);
    remat::torch::ScriptExecutor<> ex(cap);
    for (const double b : o.budgets) {
        const Bytes budget = remat::percent_of(reference.peak, b);
        const auto plan = plan_at(planner, budget);
        if (!plan) {
            if (budget < bound.bytes)
                std::printf("    budget %3.0f%%: infeasible, below the proven lower bound (no schedule exists)\n", b);
            else
                std::printf("    budget %3.0f%%: infeasible, above the lower bound but below what auto and the greedy "
                            "reach\n", b);
            continue;
        }
        restore(start, cap.parameters(), buffers);
        const Planned planned = train_planned(ex, *plan, inputs, buffers, o.steps, o.trace);
        std::printf("    budget %3.0f%%: %-9s overhead %+6.1f%%  peak predicted %9s measured %9s (%+.2f%%)  %s\n", b,
                    plan->stats.solver.c_str(), 100.0 * (plan->time / reference.time - 1.0),
                    remat::format_bytes(planned.predicted_peak).c_str(),
                    remat::format_bytes(planned.measured_peak).c_str(),
                    100.0 * (double(planned.measured_peak) / double(planned.predicted_peak) - 1.0),
                    compare(plain, planned.trajectory).c_str());
        if (planned.ops_above_prediction > 0)
            std::printf("                 %zu op runs measured above their prediction, by up to %s\n",
                        planned.ops_above_prediction, remat::format_bytes(planned.most_above_prediction).c_str());
    }
    restore(start, cap.parameters(), buffers);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse(argc, argv);
        at::set_num_threads(1);
        int refused = 0;
        for (const Entry& e : read_manifest(o)) {
            try {
                run_entry(e, o);
            } catch (const remat::InvalidInput&) {
                ++refused;
            }
            std::fflush(stdout);
        }
        return refused == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::cerr << "bench_zoo: " << e.what() << "\n";
        return 2;
    }
}
