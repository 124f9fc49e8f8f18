// Memory probe, profiler and chain executor on real tensors (CPU).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/periodic.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/torch/executor.hpp>
#include <remat/torch/memory.hpp>
#include <remat/torch/offload.hpp>
#include <remat/torch/offload_module.hpp>
#include <remat/torch/profile.hpp>
#include <remat/torch/sequential.hpp>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/torch/models.hpp"
#include "../support/faulty_compute.hpp"
#include "models.hpp"
#include "step_threads.hpp"

namespace rt = remat::torch;
using remat_test::same;

namespace {

rt::ProfileOptions quick_profile() {
    rt::ProfileOptions options;
    options.repeats = 1;
    options.warmup = 0;
    return options;
}

remat::Bytes tolerance(remat::Bytes predicted) { return std::max<remat::Bytes>(predicted / 20, 64 * 1024); }

at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
}

}  // namespace

TEST_CASE("cpu probe sees every tensor allocation and its release", "[torch][memory]") {
    at::set_num_threads(1);
    rt::CpuMemoryProbe probe;
    static_assert(rt::MemoryProbe<rt::CpuMemoryProbe>);
    const remat::Bytes before = probe.current();
    {
        const at::Tensor t = at::empty({1000}, at::kFloat);
        CHECK(probe.current() - before == 4000);
        probe.reset_peak();
        CHECK(probe.peak() == probe.current());
        {
            const at::Tensor u = at::empty({250}, at::kDouble);
            CHECK(probe.current() - before == 6000);
        }
        CHECK(probe.current() - before == 4000);
        CHECK(probe.peak() - before == 6000);
    }
    CHECK(probe.current() == before);

    // The raw interface (oneDNN frees through it) needs context == data.
    c10::Allocator* allocator = c10::GetCPUAllocator();
    void* raw = allocator->raw_allocate(512);
    CHECK(probe.current() - before == 512);
    allocator->raw_deallocate(raw);
    CHECK(probe.current() == before);

    // A convolution (oneDNN on this build) forward and backward runs through the probe.
    auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
    const at::Tensor x = torch::randn({2, 3, 8, 8}, torch::requires_grad());
    conv->forward(x).sum().backward();
    CHECK(x.grad().defined());
}

TEST_CASE("profiler measures sizes with the executor's primitives and leaves the model untouched", "[torch][profile]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(16, 32, 3, 4, 0.25);
    model->train();
    const rt::StageList stages = remat_test::blocks_of(model);
    REQUIRE(stages.size() == 5);
    const at::Tensor sample = torch::randn({8, 16});

    std::vector<at::Tensor> buffers_before;
    for (const auto& b : model->buffers()) buffers_before.push_back(b.clone());
    const at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();

    std::vector<std::string> lines, phases;
    rt::ProfileOptions options = quick_profile();
    options.name = "mlp";
    options.stage_progress = [&](const std::string& line) { lines.push_back(line); };
    options.progress = [&](const std::string& line) { phases.push_back(line); };
    const rt::ChainProfile profile = rt::profile_chain(stages, sample, options);

    CHECK(lines.size() == stages.size());
    REQUIRE(phases.size() == 2);  // one line when profiling starts, one when it ends
    CHECK(phases[0].find("profiling 'mlp'") != std::string::npos);
    CHECK(phases[1].find("profiled 'mlp'") != std::string::npos);
    const remat::Chain& chain = profile.chain;
    CHECK(chain.name == "mlp");
    CHECK(chain.input_bytes == 8 * 16 * 4);
    REQUIRE(chain.length() == 5);
    for (std::size_t l = 0; l < 4; ++l) CHECK(chain.stages[l].out_bytes == 8 * 32 * 4);
    CHECK(chain.stages[4].out_bytes == 8 * 4 * 4);
    // Linear + ReLU keeps the linear output (ReLU saves its own output, which is a_1).
    CHECK(chain.stages[0].saved_bytes == 8 * 32 * 4);
    // Linear, BatchNorm, ReLU, Dropout keep more than their output: linear out, BN out,
    // relu out, the dropout mask and BN's batch statistics.
    for (std::size_t l = 1; l < 4; ++l) CHECK(chain.stages[l].saved_bytes > 3 * chain.stages[l].out_bytes);
    for (const remat::Stage& s : chain.stages) {
        CHECK(s.fwd_time > 0);
        CHECK(s.bwd_time > 0);
    }
    CHECK(profile.random == std::vector<char>{0, 1, 1, 1, 0});
    for (const remat::Bytes b : profile.unreleased_bytes) CHECK(b == 0);

    // Both forward overheads are kept; the chain has the larger, and the measured problem
    // is the chain's problem with each forward's own.
    REQUIRE(profile.no_grad_overhead.size() == 5);
    const remat::Problem chain_problem = remat::to_problem(chain);
    const remat::Problem measured = rt::measured_problem(profile);
    REQUIRE(measured.op_count() == chain_problem.op_count());
    REQUIRE(measured.data_count() == chain_problem.data_count());
    const remat::ChainIds ids = remat::chain_ids(5);
    for (std::size_t l = 1; l <= 5; ++l) {
        const remat::Stage& st = chain.stages[l - 1];
        CHECK(st.fwd_overhead == std::max(profile.no_grad_overhead[l - 1], profile.grad_overhead[l - 1]));
        CHECK(measured.op(ids.fwd[l]).overhead == profile.no_grad_overhead[l - 1]);
        CHECK(measured.op(ids.fwd_grad[l]).overhead == profile.grad_overhead[l - 1]);
        CHECK(measured.op(ids.fwd_grad[l]).name == chain_problem.op(ids.fwd_grad[l]).name);
        CHECK(measured.op(ids.bwd[l]) == chain_problem.op(ids.bwd[l]));
    }
    // Dropout's mask and the ReLU output are transient without autograd, kept with it.
    CHECK(profile.no_grad_overhead[1] > profile.grad_overhead[1]);

    // The chain goes to remat-plan as remat.chain/1.
    CHECK(remat::io::parse_chain(remat::io::to_json(chain)) == chain);

    const auto buffers_after = model->buffers();
    for (std::size_t i = 0; i < buffers_before.size(); ++i) CHECK(same(buffers_before[i], buffers_after[i]));
    CHECK(same(rng_before, at::detail::getDefaultCPUGenerator().get_state()));
    for (const auto& p : model->parameters()) CHECK(!p.grad().defined());
}

TEST_CASE("profiler honours its time limit", "[torch][profile]") {
    auto model = remat_test::make_mlp(8, 16, 2, 3, 0.0);
    rt::ProfileOptions options;
    options.repeats = 50;
    options.time_limit_seconds = 0.0;
    std::vector<std::string> lines;
    options.stage_progress = [&](const std::string& line) { lines.push_back(line); };
    const rt::ChainProfile profile = rt::profile_chain(remat_test::blocks_of(model), torch::randn({4, 8}), options);
    REQUIRE(lines.size() == 4);
    for (const std::string& line : lines) CHECK_THAT(line, Catch::Contains("timed once"));
    CHECK(profile.chain.length() == 4);
}

TEST_CASE("stages that return views of their input are fused", "[torch][profile]") {
    auto model = remat_test::make_convnet(4, 1, 3, 0.0);
    const at::Tensor sample = torch::randn({2, 3, 6, 6});
    const rt::StageList stages = rt::group_stages_at(rt::stages_of(model), {3, 7, 8, 9});
    REQUIRE(stages.size() == 5);
    // Flatten returns a view: profiling it alone is refused, with advice.
    CHECK_THROWS_WITH(rt::profile_chain(stages, sample, quick_profile()),
                      Catch::Contains("view") && Catch::Contains("fuse_aliasing_stages"));
    const rt::StageList fused = rt::fuse_aliasing_stages(stages, sample);
    REQUIRE(fused.size() == 4);
    CHECK(fused[2].name == "7:AdaptiveAvgPool2d+8:Flatten");
    const rt::ChainProfile profile = rt::profile_chain(fused, sample, quick_profile());
    CHECK(profile.chain.length() == 4);
}

TEST_CASE("executor runs hand-written and solver schedules with plain autograd's results", "[torch][executor]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(12, 24, 4, 5, 0.3, 3);
    auto reference = remat_test::copy_of(model);
    model->train();
    reference->train();
    const at::Tensor x = torch::randn({6, 12});
    const at::Tensor y = torch::randint(0, 5, {6}, torch::kLong);
    const rt::StageList stages = remat_test::blocks_of(model);
    rt::ChainExecutor<> executor(stages, rt::profile_chain(stages, x, quick_profile()));
    const remat::Problem& problem = executor.problem();
    const std::size_t L = stages.size();

    // Hand-written: keep only a0 and a3, recompute everything else, some stages twice
    // without grad before their with-grad run; a schedule no solver here makes.
    const remat::ChainIds id = remat::chain_ids(L);
    remat::Schedule schedule;
    for (std::size_t l = 1; l <= L; ++l) {
        schedule.push_back(remat::Step::run(id.fwd[l]));
        if (l - 1 != 0 && l - 1 != 3) schedule.push_back(remat::Step::free(id.a[l - 1]));
    }
    schedule.push_back(remat::Step::run(id.loss));
    for (std::size_t l = L; l >= 1; --l) {
        const std::size_t from = l > 3 ? 3 : 0;
        for (std::size_t k = from + 1; k < l; ++k) {
            schedule.push_back(remat::Step::run(id.fwd[k]));
            if (k - 1 != from) schedule.push_back(remat::Step::free(id.a[k - 1]));
        }
        schedule.push_back(remat::Step::run(id.fwd_grad[l]));
        if (l - 1 != from) schedule.push_back(remat::Step::free(id.a[l - 1]));
        // Recompute a_{l-1} without grad (B_l reads it), keeping the graph s_l intact.
        if (l - 1 != from) {
            for (std::size_t k = from + 1; k < l; ++k) {
                schedule.push_back(remat::Step::run(id.fwd[k]));
                if (k - 1 != from) schedule.push_back(remat::Step::free(id.a[k - 1]));
            }
        }
        schedule.push_back(remat::Step::run(id.bwd[l]));
        schedule.push_back(remat::Step::free(id.g[l]));
        schedule.push_back(remat::Step::free(id.s[l]));
        schedule.push_back(remat::Step::free(id.a[l]));
        if (l - 1 != 0 && l - 1 != 3) schedule.push_back(remat::Step::free(id.a[l - 1]));
        if (l == 4) schedule.push_back(remat::Step::free(id.a[3]));
    }
    const remat::SimulationReport sim = remat::simulate(problem, schedule);
    INFO(sim.error);
    REQUIRE(sim.valid);

    std::vector<rt::ExecutablePlan> plans;
    plans.push_back(executor.prepare(schedule));

    // Hand-written 2: a_1 first made without grad and freed while s_2 (whose saved input it
    // is) lives; recomputing it with grad makes a second storage that s_1 saves, and both
    // graphs must see the same memory.
    remat::Schedule aliasing;
    aliasing.push_back(remat::Step::run(id.fwd[1]));
    for (std::size_t l = 2; l <= L; ++l) aliasing.push_back(remat::Step::run(id.fwd_grad[l]));
    aliasing.push_back(remat::Step::free(id.a[1]));
    aliasing.push_back(remat::Step::run(id.loss));
    for (std::size_t l = L; l >= 3; --l)
        for (const remat::Step st : {remat::Step::run(id.bwd[l]), remat::Step::free(id.g[l]), remat::Step::free(id.s[l]),
                                     remat::Step::free(id.a[l])})
            aliasing.push_back(st);
    for (const remat::Step st :
         {remat::Step::run(id.fwd_grad[1]), remat::Step::run(id.bwd[2]), remat::Step::free(id.g[2]),
          remat::Step::free(id.s[2]), remat::Step::free(id.a[2]), remat::Step::run(id.bwd[1]), remat::Step::free(id.g[1]),
          remat::Step::free(id.s[1]), remat::Step::free(id.a[1])})
        aliasing.push_back(st);
    INFO(remat::simulate(problem, aliasing).error);
    REQUIRE(remat::simulate(problem, aliasing).valid);
    plans.push_back(executor.prepare(aliasing));
    plans.push_back(executor.prepare(remat::StoreAll{}.solve(problem, remat::store_all_reference(problem).peak)));
    plans.push_back(executor.prepare(remat::Periodic{}.solve(problem, remat::store_all_reference(problem).peak)));

    for (std::size_t p = 0; p < plans.size(); ++p) {
        INFO("plan " << p << " (" << plans[p].plan().stats.solver << ")");
        for (auto& param : model->parameters()) param.mutable_grad() = at::Tensor();
        for (auto& param : reference->parameters()) param.mutable_grad() = at::Tensor();
        const at::Tensor x1 = x.clone().requires_grad_(true);
        const at::Tensor x2 = x.clone().requires_grad_(true);
        torch::manual_seed(42 + p);
        const at::Tensor out_ref = reference->forward(x1);
        const at::Tensor loss_ref = cross_entropy(out_ref, y);
        loss_ref.backward();

        torch::manual_seed(42 + p);
        rt::ChainStep<> step = executor.start(plans[p], x2);
        const bool timed = p % 2 == 1;  // waiting for the device after each op changes nothing else
        if (timed) step.time_each_op();
        const at::Tensor out = step.forward();
        CHECK(same(out, out_ref));
        at::Tensor leaf = out.detach().requires_grad_(true);
        at::Tensor grad = torch::autograd::grad({cross_entropy(leaf, y)}, {leaf})[0];
        rt::StepGradients grads = step.backward(std::move(grad));
        CHECK(same(grads.input, x1.grad()));
        CHECK(step.report().forward_runs >= L);
        if (timed) {
            const std::vector<double>& seconds = step.step_seconds();
            REQUIRE(seconds.size() == plans[p].schedule().size());
            CHECK(std::all_of(seconds.begin(), seconds.end(), [](double s) { return s >= 0.0; }));
            CHECK(std::any_of(seconds.begin(), seconds.end(), [](double s) { return s > 0.0; }));
        } else {
            CHECK(step.step_seconds().empty());
        }
        rt::accumulate_gradients(executor.parameters(), std::move(grads));
        const auto params = model->parameters();
        const auto ref_params = reference->parameters();
        REQUIRE(params.size() == ref_params.size());
        for (std::size_t i = 0; i < params.size(); ++i) {
            INFO("parameter " << i << " differs by " << remat_test::max_diff(params[i].grad(), ref_params[i].grad()));
            CHECK(same(params[i].grad(), ref_params[i].grad()));
        }
        // Batch-norm statistics moved once per step, as in plain training.
        const auto buffers = model->buffers();
        const auto ref_buffers = reference->buffers();
        for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(same(buffers[i], ref_buffers[i]));
    }
    CHECK(plans[0].predicted_time() > plans[2].predicted_time());
}

TEST_CASE("executor's measured peak matches the simulator's prediction", "[torch][executor][memory]") {
    at::set_num_threads(1);
    rt::CpuMemoryProbe probe;
    auto model = remat_test::make_mlp(64, 256, 8, 4, 0.2, 5);
    model->train();
    const at::Tensor x = torch::randn({128, 64});
    const at::Tensor y = torch::randint(0, 4, {128}, torch::kLong);
    const rt::StageList stages = remat_test::blocks_of(model);
    rt::ChainExecutor<> executor(stages, rt::profile_chain(stages, x, quick_profile()));
    const remat::Problem& problem = executor.problem();
    const remat::Bytes p_ref = remat::store_all_reference(problem).peak;
    const remat::Rotor rotor;
    const remat::Bytes smallest = rotor.smallest_budget(executor.chain());

    struct Case {
        std::string name;
        remat::Plan plan;
    };
    std::vector<Case> cases;
    cases.push_back({"store-all", remat::StoreAll{}.solve(problem, p_ref)});
    cases.push_back({"periodic", remat::Periodic{}.solve(problem, p_ref)});
    for (const double percent : {100.0, 70.0, 50.0, 30.0})
        if (remat::percent_of(p_ref, percent) >= smallest)
            cases.push_back({"rotor " + std::to_string(int(percent)) + "%",
                             rotor.solve(problem, remat::percent_of(p_ref, percent))});
    cases.push_back({"rotor smallest", rotor.solve(problem, smallest)});

    for (const Case& c : cases) {
        const rt::ExecutablePlan plan = executor.prepare(c.plan);
        for (int repeat = 0; repeat < 2; ++repeat) {
            for (auto& param : model->parameters()) param.mutable_grad() = at::Tensor();
            const remat::Bytes before = probe.current();
            // The second step times each op: the same memory either way.
            const rt::StepResult result = executor.step(
                plan, x, [&](const at::Tensor& out) { return cross_entropy(out, y); }, /*time_each_op=*/repeat == 1);
            CHECK(result.step_seconds.size() == (repeat == 1 ? c.plan.schedule.size() : 0));
            const rt::StepReport& r = result.report;
            INFO(c.name << ": predicted " << r.predicted_peak << " measured " << r.measured_peak << " budget "
                        << c.plan.budget);
            if (std::getenv("REMAT_TRACE") && repeat == 0)
                std::cerr << c.name << ": predicted " << r.predicted_peak << " measured " << r.measured_peak
                          << " (" << 100.0 * double(r.measured_peak - r.predicted_peak) / double(r.predicted_peak)
                          << " %)\n";
            CHECK(r.completed);
            if (std::getenv("REMAT_TRACE_STEPS")) {
                const auto& sim = plan.simulation();
                for (std::size_t i = 0; i < c.plan.schedule.size(); ++i)
                    std::cerr << i << " " << remat::describe(problem, c.plan.schedule[i]) << " sim " << sim.timeline[i].during
                              << " measured " << r.measured_timeline[i] << " diff "
                              << (r.measured_timeline[i] - sim.timeline[i].during) << "\n";
            }
            CHECK(r.predicted_peak == plan.predicted_peak());
            CHECK(r.planned_peak == c.plan.peak);
            CHECK(r.predicted_peak <= r.planned_peak);
            CHECK(std::abs(r.measured_peak - r.predicted_peak) <= tolerance(r.predicted_peak));
            // Step by step, memory never exceeds the simulator's timeline by more than what the
            // caller holds (the output and the loss) and a generator state being saved: every
            // free really gave its bytes back. (It may be lower: a backward frees its saved
            // tensors as it goes, before the plan's `free s_l`.)
            const remat::Bytes slack = executor.chain().stages.back().out_bytes + 16 * 1024;
            for (std::size_t i = 0; i < c.plan.schedule.size(); ++i) {
                if (r.measured_timeline[i] < 0) continue;
                INFO("step " << i << " " << remat::describe(problem, c.plan.schedule[i]) << ": measured "
                             << r.measured_timeline[i] << ", simulated " << plan.simulation().timeline[i].during);
                CHECK(r.measured_timeline[i] <= plan.simulation().timeline[i].during + slack);
            }
            CHECK(r.measured_peak <= c.plan.budget + tolerance(r.predicted_peak));
            // Nothing of the step stays but the output, the loss and the new gradients.
            remat::Bytes grad_bytes = 0;
            for (const auto& param : model->parameters()) grad_bytes += param.grad().nbytes();
            CHECK(probe.current() - before <= grad_bytes + static_cast<remat::Bytes>(result.output.nbytes()) + 64);
        }
    }
}

// ------------------------------------------------------------------ offloading (torch/offload.hpp)

namespace {

using OffloadCopies = remat::CpuTransfers<rt::OffloadedChain>;

// A Sequential, its copy trained by plain LibTorch with torch::optim::SGD, and a plan that
// offloads part of the weights and momentum.
struct OffloadCase {
    rt::CpuMemoryProbe probe;
    torch::nn::Sequential model = remat_test::make_mlp(32, 128, 4, 5, 0.3);
    torch::nn::Sequential reference = remat_test::copy_of(model);
    rt::StageList stages = remat_test::blocks_of(model);
    at::Tensor x = torch::randn({64, 32});
    at::Tensor y = torch::randint(0, 5, {64}, torch::kLong);
    rt::ChainLoss loss = [y = y](const at::Tensor& out) { return cross_entropy(out, y); };
    rt::OffloadTrainingProblems problems = make_problems();
    std::optional<remat::offload::OffloadPlan> plan =
        remat::offload::plan_with_offload(problems.planned, remat::store_all_reference(problems.planned).peak * 40 / 100,
                                          remat::Rotor{});

    rt::OffloadTrainingProblems make_problems() {
        const rt::ChainProfile profile = rt::profile_chain(stages, x, quick_profile(), probe);
        remat::offload::TrainingStateOptions options;
        options.transfers = remat::TransferSettings{std::nullopt, 1e10, 1e10};
        return rt::offload_training_problems(stages, profile, loss, x, options, probe);
    }

    // The weights and momentum as the step leaves them: host copies, device copies, memory.
    std::vector<std::vector<std::byte>> state(rt::OffloadedChain& training, OffloadCopies& copies) const {
        std::vector<std::vector<std::byte>> out;
        for (std::size_t k = 0; k < problems.predicting.data_count(); ++k) {
            const remat::DataId d{k};
            const std::string& name = problems.predicting.data(d).name;
            if (name.empty() || (name[0] != 'w' && name[0] != 'm')) continue;
            const auto host = copies.host_copy(d);
            out.emplace_back(host.begin(), host.end());
            out.emplace_back();
            for (const auto part : training.device_bytes(d)) out.back().insert(out.back().end(), part.begin(), part.end());
        }
        return out;
    }
};

using FaultyChain = remat_test::FaultyCompute<rt::OffloadedChain>;

// `steps` offloaded steps, each beside a plain step of the reference (`reference_loss` runs its
// forward and loss) with torch::optim::SGD, from the same seed: the same loss, and the
// predicted device and host peaks measured.
template <class ReferenceLoss>
void train_beside_plain_sgd(const remat::Problem& problem, const remat::offload::OffloadSchedule& schedule,
                            rt::OffloadedChain& training, OffloadCopies& copies, rt::CpuMemoryProbe& probe,
                            torch::optim::SGD& sgd, ReferenceLoss reference_loss, std::uint64_t seed, int steps) {
    for (int step = 0; step < steps; ++step) {
        INFO("step " << step);
        torch::manual_seed(seed + static_cast<std::uint64_t>(step));
        remat::OffloadStep<rt::OffloadedChain, OffloadCopies, rt::CpuMemoryProbe> run(problem, schedule, training, copies,
                                                                                     probe);
        run.run();
        torch::manual_seed(seed + static_cast<std::uint64_t>(step));
        sgd.zero_grad();
        const at::Tensor loss = reference_loss();
        loss.backward();
        sgd.step();
        CHECK(training.loss() == loss.item<double>());
        CHECK(run.report().measured_device_peak == run.report().predicted_device_peak);
        CHECK(run.report().measured_host_peak == run.report().predicted_host_peak);
        training.end_step();
    }
}

}  // namespace

TEST_CASE("offloading: a Sequential trained with weights and momentum moved to the host equals torch::optim::SGD bitwise",
          "[torch][offload]") {
    at::set_num_threads(1);
    OffloadCase c;
    REQUIRE(c.plan);
    INFO(c.plan->method);
    REQUIRE(c.plan->report.offloads > 0);
    REQUIRE_FALSE(c.plan->schedule.start_on_host.empty());
    const std::vector<at::Tensor> parameters = c.model->parameters();
    std::vector<const void*> identity;
    for (const at::Tensor& p : parameters) identity.push_back(p.unsafeGetTensorImpl());

    rt::OffloadedChain training(c.stages, c.problems.predicting, c.loss, {0.05, 0.9}, c.x);
    OffloadCopies copies(training, c.problems.predicting);
    remat::place_for(c.plan->schedule, copies);
    torch::optim::SGD sgd(c.reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    train_beside_plain_sgd(c.problems.predicting, c.plan->schedule, training, copies, c.probe, sgd,
                           [&] { return c.loss(c.reference->forward(c.x)); }, 100, 3);
    // Back on the device, every parameter is the model's own tensor, with plain training's values.
    remat::return_to_device(c.plan->schedule, copies);
    const std::vector<at::Tensor> trained = c.model->parameters(), expected = c.reference->parameters();
    REQUIRE(trained.size() == expected.size());
    for (std::size_t i = 0; i < trained.size(); ++i) {
        INFO("parameter " << i);
        CHECK(trained[i].unsafeGetTensorImpl() == identity[i]);
        CHECK(same(trained[i], expected[i]));
    }
    const std::vector<at::Tensor> buffers = c.model->buffers(), expected_buffers = c.reference->buffers();
    for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(same(buffers[i], expected_buffers[i]));
}

TEST_CASE("offloading: a fault mid-step leaves the Sequential's weights, momentum and buffers as they were",
          "[torch][offload][fault]") {
    at::set_num_threads(1);
    OffloadCase c;
    REQUIRE(c.plan);
    rt::OffloadedChain training(c.stages, c.problems.predicting, c.loss, {0.05, 0.9}, c.x);
    OffloadCopies copies(training, c.problems.predicting);
    remat::place_for(c.plan->schedule, copies);
    using Step = remat::OffloadStep<rt::OffloadedChain, OffloadCopies, rt::CpuMemoryProbe>;
    {
        Step run(c.problems.predicting, c.plan->schedule, training, copies, c.probe);
        run.run();
        training.end_step();
    }
    const auto before = c.state(training, copies);
    std::vector<at::Tensor> buffers_before;
    for (const at::Tensor& b : c.model->buffers()) buffers_before.push_back(b.clone());
    const remat::Bytes memory_before = c.probe.current();
    std::size_t runs = 0, first_update = 0;
    for (const auto& step : c.plan->schedule.steps) {
        if (!step.is_run()) continue;
        if (!c.problems.predicting.op(step.op()).updates.empty() && first_update == 0) first_update = runs;
        ++runs;
    }
    for (const std::size_t fail_at : {std::size_t{2}, (first_update + runs) / 2}) {
        INFO("fault at run " << fail_at << " of " << runs);
        FaultyChain faulty{&training, fail_at};
        remat::OffloadStep<FaultyChain, OffloadCopies, rt::CpuMemoryProbe> run(c.problems.predicting, c.plan->schedule,
                                                                               faulty, copies, c.probe);
        CHECK_THROWS_WITH(run.run(), Catch::Matchers::Contains("injected fault"));
        const bool unchanged = c.state(training, copies) == before;
        CHECK(unchanged);
        const std::vector<at::Tensor> buffers = c.model->buffers();
        for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(same(buffers[i], buffers_before[i]));
        CHECK(c.probe.current() == memory_before);
    }
}

namespace {

// A GPT-like chain as functor stages: token and position embeddings, transformer blocks
// (TorchScript modules with causal attention, GELU and dropout), a final layer norm and an
// untied head (a tied one would share a parameter between the first and the last stage).
struct GptChain {
    std::int64_t vocab = 256, embed = 64;
    double dropout = 0.1;
    at::Tensor wte, wpe, ln_w, ln_b, head_w;
    std::vector<torch::jit::Module> blocks;

    GptChain() {
        torch::manual_seed(21);
        remat_examples::GptConfig c;
        c.vocab = vocab;
        c.embed = embed;
        c.layers = 3;
        c.heads = 4;
        c.block_size = 32;
        c.dropout = dropout;
        wte = (at::randn({vocab, embed}) * 0.02).requires_grad_();
        wpe = (at::randn({c.block_size, embed}) * 0.01).requires_grad_();
        ln_w = at::ones({embed}).requires_grad_();
        ln_b = at::zeros({embed}).requires_grad_();
        head_w = (at::randn({vocab, embed}) * 0.02).requires_grad_();
        for (std::int64_t l = 0; l < c.layers; ++l) blocks.push_back(remat_examples::detail::gpt_block(c, l));
    }
    rt::StageList stages() const {
        rt::StageList out;
        out.push_back({"embed",
                       [wte = wte, wpe = wpe, p = dropout](const at::Tensor& idx) {
                           const at::Tensor pos = at::arange(idx.size(1), idx.options());
                           return at::dropout(at::embedding(wte, idx) + at::embedding(wpe, pos), p, true);
                       },
                       {wte, wpe},
                       {},
                       {}});
        for (std::size_t l = 0; l < blocks.size(); ++l) {
            std::vector<at::Tensor> parameters;
            for (const at::Tensor& p : blocks[l].parameters()) parameters.push_back(p);
            out.push_back({"h" + std::to_string(l),
                           [block = blocks[l]](const at::Tensor& x) mutable { return block.forward({x}).toTensor(); },
                           parameters,
                           {},
                           {}});
        }
        out.push_back({"head",
                       [ln_w = ln_w, ln_b = ln_b, head_w = head_w, d = embed](const at::Tensor& x) {
                           return at::linear(at::layer_norm(x, {d}, ln_w, ln_b, 1e-5, false), head_w);
                       },
                       {ln_w, ln_b, head_w},
                       {},
                       {}});
        return out;
    }
};

}  // namespace

TEST_CASE("offloading: a GPT-like chain trained with weights and momentum moved to the host equals plain SGD bitwise",
          "[torch][offload]") {
    at::set_num_threads(1);
    // The blocks run as written: the graph executor's optimizations would differentiate fused
    // regions by formulas of their own once a block has run a few times, at another time in
    // each chain.
    const torch::jit::GraphOptimizerEnabledGuard eager(false);
    rt::CpuMemoryProbe probe;
    const GptChain model, reference;  // the same values: each is made from the same seed
    const rt::StageList stages = model.stages(), reference_stages = reference.stages();
    const at::Tensor tokens = at::randint(0, model.vocab, {4, 32}, at::kLong);
    const at::Tensor targets = at::randint(0, model.vocab, {4, 32}, at::kLong);
    const rt::ChainLoss loss = [targets, v = model.vocab](const at::Tensor& out) {
        return cross_entropy(out.reshape({-1, v}), targets.reshape({-1}));
    };
    const rt::ChainProfile profile = rt::profile_chain(stages, tokens, quick_profile(), probe);
    remat::offload::TrainingStateOptions options;
    options.transfers = remat::TransferSettings{std::nullopt, 1e10, 1e10};
    const rt::OffloadTrainingProblems problems = rt::offload_training_problems(stages, profile, loss, tokens, options, probe);
    const auto plan = remat::offload::plan_with_offload(
        problems.planned, remat::store_all_reference(problems.planned).peak * 40 / 100, remat::Rotor{});
    REQUIRE(plan);
    INFO(plan->method);
    REQUIRE(plan->report.offloads > 0);

    rt::OffloadedChain training(stages, problems.predicting, loss, {0.05, 0.9}, tokens);
    OffloadCopies copies(training, problems.predicting);
    remat::place_for(plan->schedule, copies);
    std::vector<at::Tensor> reference_parameters;
    for (const rt::ChainStage& stage : reference_stages)
        reference_parameters.insert(reference_parameters.end(), stage.parameters.begin(), stage.parameters.end());
    torch::optim::SGD sgd(reference_parameters, torch::optim::SGDOptions(0.05).momentum(0.9));
    const auto reference_loss = [&] {
        at::Tensor x = tokens;
        for (const rt::ChainStage& stage : reference_stages) x = stage.forward(x);
        return loss(x);
    };
    train_beside_plain_sgd(problems.predicting, plan->schedule, training, copies, probe, sgd, reference_loss, 200, 3);
    remat::return_to_device(plan->schedule, copies);
    std::size_t k = 0;
    for (const rt::ChainStage& stage : stages)
        for (const at::Tensor& p : stage.parameters) {
            INFO("parameter " << k);
            CHECK(same(p, reference_parameters.at(k++)));
        }
}

// ------------------------------------------------------- the drop-in module with offloading

namespace {

rt::OffloadModuleOptions quick_offload(double optimizer_state) {
    rt::OffloadModuleOptions options;
    options.profile = quick_profile();
    options.transfers = remat::TransferSettings{std::nullopt, 1e10, 1e10};
    options.optimizer_state_per_parameter = optimizer_state;
    return options;
}

// Whether every parameter of the model owns its device memory (none is left on the host).
bool all_on_device(const torch::nn::Sequential& model) {
    for (const at::Tensor& p : model->parameters())
        if (p.storage().nbytes() != p.nbytes() || p.data_ptr() == nullptr) return false;
    return true;
}

// x -> 2x, whose backward throws while armed.
struct ThrowingBackward : torch::autograd::Function<ThrowingBackward> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::shared_ptr<bool> armed) {
        ctx->saved_data["armed"] = at::IValue::make_capsule(c10::make_intrusive<Flag>(std::move(armed)));
        return x * 2;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto* flag = static_cast<Flag*>(ctx->saved_data["armed"].toCapsule().get());
        if (*flag->armed) throw std::runtime_error("injected backward failure");
        return {grads[0] * 2, at::Tensor()};
    }
    struct Flag : torch::CustomClassHolder {
        explicit Flag(std::shared_ptr<bool> a) : armed(std::move(a)) {}
        std::shared_ptr<bool> armed;
    };
};

}  // namespace

TEST_CASE("offloading module: loss.backward() and torch::optim::Adam with weights offloaded equal plain training bitwise",
          "[torch][offload][module]") {
    at::set_num_threads(1);
    torch::manual_seed(7);
    torch::nn::Sequential model = remat_test::make_mlp(32, 128, 4, 5, 0.3);
    torch::nn::Sequential reference = remat_test::copy_of(model);
    const at::Tensor sample = torch::randn({64, 32});
    std::vector<const void*> identity;
    for (const at::Tensor& p : model->parameters()) identity.push_back(p.unsafeGetTensorImpl());

    auto m = rt::checkpoint_with_offload(model, sample, rt::budget_percent(100), remat::Rotor{}, quick_offload(2.0));
    // The lowest budget the planner reaches, in steps of 2 % of everything the step holds.
    for (int percent = 98; percent >= 30; percent -= 2) {
        try {
            m->replan(rt::budget_percent(percent));
        } catch (const remat::Infeasible&) {
            break;  // the plan at the last budget stays
        }
    }
    INFO(m->plan().method << ", budget " << m->budget() << " of " << m->store_all_total());
    REQUIRE(m->plan().report.offloads > 0);
    CHECK(m->plan().schedule.start_on_host.empty());
    CHECK(m->plan().report.device_peak + m->resident_bytes() <= m->budget());
    // Rematerialization alone does not reach this budget.
    remat::offload::CombinedOptions remat_only;
    remat_only.transfers = remat::TransferSettings{std::nullopt, 1e10, 1e10};
    CHECK_FALSE(remat::offload::plan_remat_only(m->planned_problem(), m->budget() - m->resident_bytes(), remat::Rotor{},
                                                remat_only));
    const std::vector<at::Tensor> exposed = m->parameters();
    REQUIRE(exposed.size() == identity.size());
    for (std::size_t i = 0; i < exposed.size(); ++i) CHECK(exposed[i].unsafeGetTensorImpl() == identity[i]);

    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
    torch::optim::Adam adam_ref(reference->parameters(), torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        torch::manual_seed(50 + step);
        const at::Tensor x = torch::randn({64, 32});
        const at::Tensor y = torch::randint(0, 5, {64}, torch::kLong);
        torch::manual_seed(step);
        const at::Tensor loss = cross_entropy(m->forward(x), y);
        loss.backward();
        torch::manual_seed(step);
        const at::Tensor loss_ref = cross_entropy(reference->forward(x), y);
        loss_ref.backward();
        CHECK(loss.item<double>() == loss_ref.item<double>());
        const auto p = model->parameters(), q = reference->parameters();
        for (std::size_t i = 0; i < p.size(); ++i) CHECK(same(p[i].grad(), q[i].grad()));
        adam.step();
        adam_ref.step();
        adam.zero_grad();
        adam_ref.zero_grad();
        for (std::size_t i = 0; i < p.size(); ++i) CHECK(same(p[i], q[i]));
        CHECK(all_on_device(model));
        const remat::OffloadStepReport& r = m->last_report();
        CHECK(r.completed);
        CHECK(r.measured_device_peak == r.predicted_device_peak);
        CHECK(r.measured_host_peak == r.predicted_host_peak);
    }
}

TEST_CASE("offloading module: a failing step, or one given up before its backward, leaves the model as it was",
          "[torch][offload][module][faults]") {
    at::set_num_threads(1);
    torch::manual_seed(8);
    const torch::nn::Sequential model = remat_test::make_mlp(32, 128, 4, 5, 0.3);
    const auto armed = std::make_shared<bool>(false);
    rt::StageList stages = remat_test::blocks_of(model);
    stages.insert(stages.begin() + 1, rt::make_stage("fault", [armed](const at::Tensor& x) {
                      return ThrowingBackward::apply(x, armed);
                  }));
    const at::Tensor sample = torch::randn({64, 32});
    auto m = rt::checkpoint_with_offload(stages, sample, rt::budget_percent(94), remat::Rotor{}, quick_offload(2.0));
    REQUIRE(m->plan().report.offloads > 0);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const at::Tensor y = torch::randint(0, 5, {64}, torch::kLong);
    cross_entropy(m->forward(sample), y).backward();  // gradients and momentum are non-trivial from here on
    sgd.step();
    const auto snapshot = [&] {
        std::vector<at::Tensor> out;
        for (const at::Tensor& p : model->parameters()) {
            out.push_back(p.detach().clone());
            out.push_back(p.grad().clone());
        }
        for (const at::Tensor& b : model->buffers()) out.push_back(b.clone());
        return out;
    };
    const auto unchanged = [&](const std::vector<at::Tensor>& before) {
        const std::vector<at::Tensor> now = snapshot();
        REQUIRE(now.size() == before.size());
        for (std::size_t i = 0; i < now.size(); ++i) CHECK(same(now[i], before[i]));
        CHECK(all_on_device(model));
    };
    {
        INFO("a backward that throws");
        const auto before = snapshot();
        *armed = true;
        const at::Tensor loss = cross_entropy(m->forward(sample), y);
        CHECK_THROWS_WITH(loss.backward(), Catch::Matchers::Contains("injected backward failure"));
        *armed = false;
        unchanged(before);
    }
    {
        INFO("a forward given up: the next forward takes over, the first backward is refused");
        std::vector<at::Tensor> before;
        for (const at::Tensor& p : model->parameters()) before.push_back(p.detach().clone());
        const at::Tensor abandoned = cross_entropy(m->forward(sample), y);
        const at::Tensor loss = cross_entropy(m->forward(sample), y);
        CHECK_THROWS_WITH(abandoned.backward(), Catch::Matchers::Contains("given up"));
        loss.backward();
        CHECK(m->last_report().completed);
        CHECK(m->last_report().measured_device_peak == m->last_report().predicted_device_peak);
        CHECK(all_on_device(model));
        const auto p = model->parameters();
        for (std::size_t i = 0; i < p.size(); ++i) CHECK(same(p[i], before[i]));
    }
    {
        INFO("a forward whose graph is dropped");
        { const at::Tensor dropped = m->forward(sample); }
        CHECK(all_on_device(model));
        const torch::NoGradGuard no_grad;
        CHECK(m->forward(sample).sizes() == std::vector<std::int64_t>{64, 5});
    }
    CHECK_THROWS_AS(rt::checkpoint_with_offload(stages, sample, rt::budget_bytes(1024), remat::Rotor{}, quick_offload(1.0)),
                    remat::Infeasible);
    CHECK_THROWS_WITH(m->forward(torch::randn({8, 32})), Catch::Matchers::Contains("build a module for that shape"));
    const remat::Bytes budget = m->budget();
    CHECK_THROWS_WITH(m->replan(rt::budget_bytes(1024)), Catch::Matchers::Contains("below the proven lower bound"));
    CHECK(m->budget() == budget);  // the plan stays
    m->replan(rt::budget_percent(100));
    CHECK(m->plan().report.offloads == 0);
    cross_entropy(m->forward(sample), y).backward();
    CHECK(m->last_report().measured_device_peak == m->last_report().predicted_device_peak);
}

TEST_CASE("offloading module: a GPT-like chain trained with torch::optim::Adam and weights offloaded equals plain training "
          "bitwise",
          "[torch][offload][module]") {
    at::set_num_threads(1);
    const torch::jit::GraphOptimizerEnabledGuard eager(false);  // as in the OffloadedChain test above
    const GptChain model, reference;
    const at::Tensor tokens = at::randint(0, model.vocab, {4, 32}, at::kLong);
    const at::Tensor targets = at::randint(0, model.vocab, {4, 32}, at::kLong);
    const auto loss_of = [&](const at::Tensor& out) {
        return cross_entropy(out.reshape({-1, model.vocab}), targets.reshape({-1}));
    };
    auto m = rt::checkpoint_with_offload(model.stages(), tokens, rt::budget_percent(100), remat::Rotor{}, quick_offload(2.0));
    for (int percent = 98; percent >= 30; percent -= 2) {
        try {
            m->replan(rt::budget_percent(percent));
        } catch (const remat::Infeasible&) {
            break;
        }
        if (m->plan().report.offloads > 0 && percent <= 90) break;
    }
    INFO(m->plan().method << " at " << m->budget() << " of " << m->store_all_total());
    REQUIRE(m->plan().report.offloads > 0);
    const rt::StageList reference_stages = reference.stages();
    std::vector<at::Tensor> parameters, reference_parameters;
    for (const rt::ChainStage& stage : model.stages()) parameters.insert(parameters.end(), stage.parameters.begin(), stage.parameters.end());
    for (const rt::ChainStage& stage : reference_stages)
        reference_parameters.insert(reference_parameters.end(), stage.parameters.begin(), stage.parameters.end());
    torch::optim::Adam adam(parameters, torch::optim::AdamOptions(1e-3));
    torch::optim::Adam adam_ref(reference_parameters, torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
        INFO("step " << step);
        torch::manual_seed(300 + step);
        const at::Tensor loss = loss_of(m->forward(tokens));
        loss.backward();
        torch::manual_seed(300 + step);
        at::Tensor x = tokens;
        for (const rt::ChainStage& stage : reference_stages) x = stage.forward(x);
        const at::Tensor loss_ref = loss_of(x);
        loss_ref.backward();
        CHECK(loss.item<double>() == loss_ref.item<double>());
        adam.step();
        adam_ref.step();
        adam.zero_grad();
        adam_ref.zero_grad();
        for (std::size_t i = 0; i < parameters.size(); ++i) CHECK(same(parameters[i], reference_parameters[i]));
        CHECK(m->last_report().measured_device_peak == m->last_report().predicted_device_peak);
        CHECK(m->last_report().measured_host_peak == m->last_report().predicted_host_peak);
    }
}

// On the CPU autograd runs every backward on the calling thread: the step's backward phase,
// recomputations included, runs there directly (the [cuda] twin checks the device thread).
TEST_CASE("a step's backward phase, recomputations included, runs on the calling thread on the CPU",
          "[torch][executor]") {
    torch::manual_seed(13);
    const remat_test::BackwardPhaseThreads t =
        remat_test::backward_phase_threads(at::Device(at::kCPU), rt::CpuMemoryProbe{}, 0.0);
    REQUIRE_FALSE(t.recomputed_on.empty());  // the tight plan recomputes in the backward phase
    CHECK(t.recomputed_on == std::set<std::thread::id>{std::this_thread::get_id()});
    CHECK(t.same_gradients);
}
