// The drop-in checkpointed module: same training as plain autograd, faults, budgets, shapes.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <remat/remat.hpp>
#include <remat/solvers/periodic.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/torch/module.hpp>
#include <remat/torch/remove_folder.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "models.hpp"

namespace rt = remat::torch;
using remat_test::same;

namespace {

rt::CheckpointOptions quick() {
    rt::CheckpointOptions options;
    options.profile.repeats = 1;
    options.profile.warmup = 0;
    return options;
}

at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
}

struct Shape {
    std::vector<std::int64_t> input;
    std::int64_t classes;
};

/// Trains `m` (whose parameters are `original`'s) and `reference` (a copy of `original`
/// before any step) side by side and requires bitwise equal outputs, losses, input
/// gradients, parameter gradients, and, at the end, parameters and buffers.
template <class Module>
void expect_same_training(torch::nn::Sequential original, Module& m, torch::nn::Sequential reference,
                          const Shape& shape, int steps, bool input_grad, std::uint64_t seed = 1) {
    torch::optim::SGD optimizer(original->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD optimizer_ref(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
        INFO("training step " << s);
        torch::manual_seed(seed * 1000 + static_cast<std::uint64_t>(s));
        const at::Tensor x = torch::randn(shape.input);
        const at::Tensor y = torch::randint(0, shape.classes, {shape.input[0]}, torch::kLong);
        const at::Tensor x_ref = x.clone().requires_grad_(input_grad);
        const at::Tensor x_m = x.clone().requires_grad_(input_grad);

        torch::manual_seed(seed * 77 + static_cast<std::uint64_t>(s));
        const at::Tensor out_ref = reference->forward(x_ref);
        const at::Tensor loss_ref = cross_entropy(out_ref, y);
        loss_ref.backward();

        torch::manual_seed(seed * 77 + static_cast<std::uint64_t>(s));
        const at::Tensor out = m->forward(x_m);
        const at::Tensor loss = cross_entropy(out, y);
        loss.backward();

        CHECK(same(out, out_ref));
        CHECK(same(loss, loss_ref));
        if (input_grad) CHECK(same(x_m.grad(), x_ref.grad()));
        const auto params = original->parameters();
        const auto params_ref = reference->parameters();
        REQUIRE(params.size() == params_ref.size());
        for (std::size_t i = 0; i < params.size(); ++i) {
            INFO("parameter " << i << " gradient differs by " << remat_test::max_diff(params[i].grad(), params_ref[i].grad()));
            CHECK(same(params[i].grad(), params_ref[i].grad()));
        }
        optimizer.step();
        optimizer_ref.step();
        optimizer.zero_grad();
        optimizer_ref.zero_grad();
    }
    const auto params = original->parameters();
    const auto params_ref = reference->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(same(params[i], params_ref[i]));
    const auto buffers = original->buffers();
    const auto buffers_ref = reference->buffers();
    REQUIRE(buffers.size() == buffers_ref.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(same(buffers[i], buffers_ref[i]));
}

using ModelMaker = std::function<torch::nn::Sequential()>;

struct ModelCase {
    std::string name;
    ModelMaker make;
    Shape shape;
};

std::vector<ModelCase> model_cases() {
    return {
        {"mlp", [] { return remat_test::make_mlp(16, 32, 6, 5, 0.3); }, {{16, 16}, 5}},
        {"convnet", [] { return remat_test::make_convnet(6, 4, 3, 0.2); }, {{4, 3, 8, 8}, 3}},
    };
}

/// Builds the module for `model` at `budget` with `solver`, and trains it against a copy.
template <class S>
void check_case(const ModelCase& c, S solver, const std::function<remat::BudgetSpec(const remat::Chain&)>& budget,
                bool input_grad, int steps = 3) {
    auto original = c.make();
    auto reference = remat_test::copy_of(original);
    original->train();
    reference->train();
    const at::Tensor sample = torch::randn(c.shape.input);
    // Plan at 100 % first to learn the chain, then at the budget under test.
    auto m = rt::checkpoint(remat_test::blocks_of(original), sample, rt::budget_percent(100), solver, quick());
    m->replan(budget(m->chain()));
    INFO(c.name << " with " << solver.name() << " at " << m->budget() << " bytes (store-all peak "
                << m->store_all_peak() << ", plan peak " << m->plan().peak << ")");
    CHECK(m->plan().peak <= m->budget());
    expect_same_training(original, m, reference, c.shape, steps, input_grad);
}

}  // namespace

TEST_CASE("module gradients equal plain autograd: store-all", "[torch][module][gradients]") {
    at::set_num_threads(1);
    for (const ModelCase& c : model_cases()) {
        check_case(c, remat::StoreAll{}, [](const remat::Chain&) { return rt::budget_percent(100); }, false);
        check_case(c, remat::StoreAll{}, [](const remat::Chain&) { return rt::budget_percent(100); }, true);
    }
}

TEST_CASE("module gradients equal plain autograd: periodic", "[torch][module][gradients]") {
    at::set_num_threads(1);
    for (const ModelCase& c : model_cases()) {
        check_case(c, remat::Periodic{}, [](const remat::Chain&) { return rt::budget_percent(100); }, true);
        check_case(c, remat::Periodic{2}, [](const remat::Chain&) { return rt::budget_percent(100); }, false);
    }
}

TEST_CASE("module gradients equal plain autograd: rotor at several budgets", "[torch][module][gradients]") {
    at::set_num_threads(1);
    for (const ModelCase& c : model_cases()) {
        for (const double percent : {60.0, 40.0})
            check_case(
                c, remat::Rotor{},
                [percent](const remat::Chain& chain) {
                    const remat::Bytes p_ref = remat::store_all_reference(remat::to_problem(chain)).peak;
                    const remat::Bytes smallest = remat::Rotor{}.smallest_budget(chain);
                    return rt::budget_bytes(std::max(smallest, remat::percent_of(p_ref, percent)));
                },
                percent < 50);
        // The tightest budget rotor accepts: the most recomputation.
        check_case(c, remat::Rotor{},
                   [](const remat::Chain& chain) { return rt::budget_bytes(remat::Rotor{}.smallest_budget(chain)); },
                   false);
    }
}

TEST_CASE("module gradients equal plain autograd: rotor-release, checkpoints freed and recomputed",
          "[torch][module][gradients]") {
    at::set_num_threads(1);
    for (const ModelCase& c : model_cases()) {
        for (const double percent : {60.0, 40.0})
            check_case(
                c, remat::RotorRelease{},
                [percent](const remat::Chain& chain) {
                    const remat::Bytes p_ref = remat::store_all_reference(remat::to_problem(chain)).peak;
                    const remat::Bytes smallest = remat::RotorRelease{}.smallest_budget(chain);
                    return rt::budget_bytes(std::max(smallest, remat::percent_of(p_ref, percent)));
                },
                percent < 50);
        check_case(c, remat::RotorRelease{},
                   [](const remat::Chain& chain) { return rt::budget_bytes(remat::RotorRelease{}.smallest_budget(chain)); },
                   false);
    }
}

TEST_CASE("module: explain() names the recomputed layers by their stage names", "[torch][module][explain]") {
    at::set_num_threads(1);
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                                torch::nn::ReLU(), torch::nn::Linear(64, 8));
    const at::Tensor x = torch::randn({16, 32});
    auto m = rt::checkpoint(model, x, rt::budget_above_smallest(0), remat::Rotor{}, quick());
    const std::string text = m->explain();
    CHECK_THAT(text, Catch::Contains("layers recomputed"));
    // The stages are named "<index>:<type>"; at the smallest budget some layer is recomputed.
    CHECK_THAT(text, Catch::Contains(":Linear") || Catch::Contains(":ReLU"));
    CHECK_THAT(text, Catch::Contains("recomputed"));
    CHECK(text == m->plan().explain(m->problem(), {remat::stage_labels(m->chain()),
                                                   remat::store_all_reference(m->problem()).time, false}));
}

TEST_CASE("module shares the model's parameters and registers its modules", "[torch][module]") {
    auto model = remat_test::make_mlp(8, 16, 2, 3, 0.1);
    auto m = rt::checkpoint(model, torch::randn({4, 8}), rt::budget_percent(100), remat::StoreAll{}, quick());
    std::unordered_set<const void*> mine, theirs;
    for (const auto& p : m->parameters()) mine.insert(p.unsafeGetTensorImpl());
    for (const auto& p : model->parameters()) theirs.insert(p.unsafeGetTensorImpl());
    CHECK(mine == theirs);
    CHECK(m->buffers().size() == model->buffers().size());
    m->eval();
    for (const auto& child : model->children()) CHECK_FALSE(child->is_training());
    m->train();
    for (const auto& child : model->children()) CHECK(child->is_training());
}

TEST_CASE("module without autograd runs the stages plainly", "[torch][module]") {
    auto model = remat_test::make_mlp(8, 16, 2, 3, 0.5);
    auto reference = remat_test::copy_of(model);
    auto m = rt::checkpoint(remat_test::blocks_of(model), torch::randn({4, 8}), rt::budget_percent(100),
                            remat::StoreAll{}, quick());
    m->eval();
    reference->eval();
    const at::Tensor x = torch::randn({4, 8});
    const torch::NoGradGuard no_grad;
    CHECK(same(m->forward(x), reference->forward(x)));
}

TEST_CASE("module accumulates gradients over several forwards before one backward", "[torch][module]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(12, 24, 4, 4, 0.3);
    auto reference = remat_test::copy_of(model);
    const at::Tensor sample = torch::randn({8, 12});
    auto m = rt::checkpoint(remat_test::blocks_of(model), sample, rt::budget_percent(100), remat::Periodic{}, quick());
    const at::Tensor x1 = torch::randn({8, 12}), x2 = torch::randn({8, 12});
    const at::Tensor y1 = torch::randint(0, 4, {8}, torch::kLong), y2 = torch::randint(0, 4, {8}, torch::kLong);
    torch::manual_seed(5);
    (cross_entropy(reference->forward(x1), y1) + cross_entropy(reference->forward(x2), y2)).backward();
    torch::manual_seed(5);
    (cross_entropy(m->forward(x1), y1) + cross_entropy(m->forward(x2), y2)).backward();
    const auto params = model->parameters(), params_ref = reference->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(same(params[i].grad(), params_ref[i].grad()));
    const auto buffers = model->buffers(), buffers_ref = reference->buffers();
    for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(same(buffers[i], buffers_ref[i]));
}

TEST_CASE("module: backward twice through one forward is refused", "[torch][module]") {
    auto model = remat_test::make_mlp(8, 16, 2, 3, 0.0);
    auto m = rt::checkpoint(model, torch::randn({4, 8}), rt::budget_percent(100), remat::StoreAll{}, quick());
    const at::Tensor loss = m->forward(torch::randn({4, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    CHECK_THROWS_WITH(loss.backward(), Catch::Contains("twice"));
}

TEST_CASE("module: an infeasible budget names the smallest feasible one", "[torch][module][budget]") {
    auto model = remat_test::make_mlp(16, 32, 5, 4, 0.2);
    const at::Tensor sample = torch::randn({16, 16});
    const rt::StageList stages = remat_test::blocks_of(model);
    try {
        (void)rt::checkpoint(stages, sample, rt::budget_bytes(1024), remat::Rotor{}, quick());
        FAIL("a 1 KiB budget was accepted");
    } catch (const remat::Infeasible& e) {
        REQUIRE(e.smallest_budget().has_value());
        const remat::Bytes smallest = *e.smallest_budget();
        CHECK(smallest > 1024);
        auto m = rt::checkpoint(stages, sample, rt::budget_bytes(smallest), remat::Rotor{}, quick());
        CHECK(m->plan().peak <= smallest);
        // Re-profiling measures the same sizes, so the same smallest budget holds.
        CHECK_THROWS_AS(m->replan(rt::budget_bytes(smallest - 1)), remat::Infeasible);
        CHECK(m->budget() == smallest);  // a failed replan keeps the old plan
    }
    try {
        (void)rt::checkpoint(stages, sample, rt::budget_percent(50), remat::StoreAll{}, quick());
        FAIL("store-all accepted half of its own peak");
    } catch (const remat::Infeasible& e) {
        auto m = rt::checkpoint(stages, sample, rt::budget_percent(100), remat::StoreAll{}, quick());
        CHECK(e.smallest_budget() == m->store_all_peak());
    }
}

TEST_CASE("module: budget policies never dead-end", "[torch][module][budget]") {
    auto model = remat_test::make_mlp(16, 32, 5, 4, 0.2);
    const at::Tensor sample = torch::randn({16, 16});
    const rt::StageList stages = remat_test::blocks_of(model);
    // The smallest budget in bytes and in % of the store-all peak.
    try {
        (void)rt::checkpoint(stages, sample, rt::budget_percent(1), remat::Rotor{}, quick());
        FAIL("1 % of the store-all peak was accepted");
    } catch (const remat::Infeasible& e) {
        REQUIRE(e.smallest_budget().has_value());
        REQUIRE(e.smallest_percent().has_value());
        CHECK(*e.smallest_percent() > 1.0);
        CHECK(*e.smallest_percent() < 100.0);
        const std::string what = e.what();
        CHECK(what.find("% of the store-all peak") != std::string::npos);
        CHECK(what.find("or_smallest") != std::string::npos);
    }
    // Falling back to the smallest budget, with a warning.
    std::vector<std::string> lines;
    rt::CheckpointOptions options = quick();
    options.progress = [&lines](const std::string& line) { lines.push_back(line); };
    auto fallen = rt::checkpoint(stages, sample, rt::budget_percent(1).or_smallest(), remat::Rotor{}, options);
    // Profiling's two phase lines, the warning, the plan's summary.
    REQUIRE(lines.size() == 4);
    CHECK(lines[0].find("profiling") != std::string::npos);
    CHECK(lines[2].find("planned at its smallest budget") != std::string::npos);
    CHECK(lines[3].find("plan peak") != std::string::npos);
    CHECK(fallen->budget() > remat::percent_of(fallen->store_all_peak(), 1));
    // The smallest budget plus a margin always plans.
    auto margin = rt::checkpoint(stages, sample, rt::budget_above_smallest(10), remat::Rotor{}, quick());
    CHECK(margin->budget() >= fallen->budget());
    CHECK(margin->budget() <= fallen->budget() + fallen->budget() / 10 + 1);
    CHECK(margin->plan().peak <= margin->budget());
}

TEST_CASE("module: inputs of another shape are re-planned, or rejected on request", "[torch][module][shape]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(8, 16, 3, 3, 0.2);
    auto reference = remat_test::copy_of(model);
    auto m = rt::checkpoint(remat_test::blocks_of(model), torch::randn({8, 8}), rt::budget_percent(60), remat::Rotor{},
                            quick());
    const remat::Bytes peak_8 = m->store_all_peak();
    expect_same_training(model, m, reference, {{5, 8}, 3}, 2, false, 3);
    CHECK(m->cached_shapes() == 2);
    CHECK(m->store_all_peak() < peak_8);
    CHECK(m->profile().input_sizes == std::vector<std::int64_t>{5, 8});

    rt::CheckpointOptions strict = quick();
    strict.on_new_shape = rt::ShapePolicy::reject;
    auto r = rt::checkpoint(remat_test::blocks_of(model), torch::randn({8, 8}), rt::budget_percent(100),
                            remat::StoreAll{}, strict);
    CHECK_THROWS_AS(r->forward(torch::randn({5, 8})), remat::InvalidInput);
    CHECK_THROWS_WITH(r->forward(torch::randn({5, 8})), Catch::Contains("[8, 8]") && Catch::Contains("[5, 8]"));
    r->replan(rt::budget_percent(100), torch::randn({5, 8}));
    CHECK_NOTHROW(r->forward(torch::randn({5, 8})).sum().backward());
}

// The meta device stands in for a GPU here: any device other than the model's.
TEST_CASE("module: an input on another device than the model is a clear error", "[torch][module][device]") {
    auto model = remat_test::make_mlp(8, 16, 3, 3, 0.0);
    auto m = rt::checkpoint(remat_test::blocks_of(model), torch::randn({4, 8}), rt::budget_percent(100),
                            remat::StoreAll{}, quick());
    const at::Tensor elsewhere = at::empty({4, 8}, at::TensorOptions().device(at::kMeta)).requires_grad_();
    CHECK_THROWS_AS(m->forward(elsewhere), remat::InvalidInput);
    CHECK_THROWS_WITH(m->forward(elsewhere), Catch::Contains("the model is on cpu but an input is on meta"));
    CHECK(m->cached_shapes() == 1);  // nothing was planned for it
    CHECK_THROWS_WITH(rt::checkpoint(remat_test::blocks_of(model), elsewhere, rt::budget_percent(100),
                                     remat::StoreAll{}, quick()),
                      Catch::Contains("an input is on meta"));
    CHECK_NOTHROW(m->forward(torch::randn({4, 8})).sum().backward());
}

namespace {

/// Throws from its backward while `armed` is set.
struct FailingBackward : torch::autograd::Function<FailingBackward> {
    static bool& armed() {
        static bool flag = false;
        return flag;
    }
    static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x * 2; }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                   torch::autograd::variable_list grads) {
        if (armed()) throw std::runtime_error("injected backward failure");
        return {grads[0] * 2};
    }
};

struct Snapshot {
    std::vector<at::Tensor> params, grads, buffers;
    explicit Snapshot(const torch::nn::Sequential& model) {
        for (const auto& p : model->parameters()) {
            params.push_back(p.detach().clone());
            grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
        }
        for (const auto& b : model->buffers()) buffers.push_back(b.clone());
    }
    void expect_unchanged(const torch::nn::Sequential& model) const {
        const auto p = model->parameters();
        for (std::size_t i = 0; i < p.size(); ++i) {
            CHECK(same(p[i], params[i]));
            CHECK(same(p[i].grad(), grads[i]));
        }
        const auto b = model->buffers();
        for (std::size_t i = 0; i < b.size(); ++i) CHECK(same(b[i], buffers[i]));
    }
};

}  // namespace

TEST_CASE("module: a stage failing in forward, in a recomputation or in backward leaves the model as it was",
          "[torch][module][faults]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(12, 24, 4, 4, 0.3);
    auto reference = remat_test::copy_of(model);
    int calls = 0, fail_at_call = -1;  // the fault stage throws on this call of the step
    rt::StageList stages = remat_test::blocks_of(model);
    stages.insert(stages.begin() + 3, rt::make_stage("fault", [&](const at::Tensor& x) {
                      if (calls++ == fail_at_call) throw std::runtime_error("injected forward failure");
                      return FailingBackward::apply(x);
                  }));
    // The same computation for the reference: x -> 2x between blocks 3 and 4.
    torch::nn::Sequential reference_model;
    {
        std::size_t block = 0;
        for (const auto& any : *reference) {
            if (any.ptr()->as<torch::nn::Linear>() && block++ == 3)
                reference_model->push_back(torch::nn::Functional([](const at::Tensor& x) { return x * 2; }));
            reference_model->push_back(any);
        }
    }
    const at::Tensor sample = torch::randn({8, 12});
    for (const bool recomputing : {false, true}) {
        INFO(std::string(recomputing ? "periodic (the fault stage is recomputed)" : "store-all"));
        auto m = recomputing
                     ? rt::checkpoint(stages, sample, rt::budget_percent(100), remat::Periodic{2}, quick())
                     : rt::checkpoint(stages, sample, rt::budget_percent(100), remat::Periodic{100}, quick());
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        torch::optim::SGD optimizer_ref(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        const auto good_step = [&](int s) {
            torch::manual_seed(100 + s);
            const at::Tensor x = torch::randn({8, 12});
            const at::Tensor y = torch::randint(0, 4, {8}, torch::kLong);
            calls = 0;
            fail_at_call = -1;
            torch::manual_seed(s);
            cross_entropy(reference_model->forward(x), y).backward();
            torch::manual_seed(s);
            cross_entropy(m->forward(x), y).backward();
            const auto p = model->parameters(), q = reference->parameters();
            for (std::size_t i = 0; i < p.size(); ++i) CHECK(same(p[i].grad(), q[i].grad()));
            optimizer.step();
            optimizer_ref.step();
        };
        good_step(0);  // parameters and gradients are non-trivial from here on
        const auto failing_step = [&](int fail_call, bool backward_fault, const char* expected) {
            const Snapshot before(model);
            const at::Tensor x = torch::randn({8, 12});
            const at::Tensor y = torch::randint(0, 4, {8}, torch::kLong);
            calls = 0;
            fail_at_call = fail_call;
            FailingBackward::armed() = backward_fault;
            try {
                const at::Tensor loss = cross_entropy(m->forward(x), y);
                loss.backward();
                FAIL("the injected failure did not surface");
            } catch (const remat::ExecutionError& e) {
                CHECK_THAT(e.what(), Catch::Contains(expected));
                CHECK_THAT(e.what(), Catch::Contains("as before the step"));
            }
            FailingBackward::armed() = false;
            fail_at_call = -1;
            before.expect_unchanged(model);
        };
        failing_step(0, false, "injected forward failure");
        if (recomputing) failing_step(1, false, "injected forward failure");  // its recomputation fails
        failing_step(-1, true, "injected backward failure");
        good_step(1);  // usable again, and still equal to plain training
        good_step(2);
    }
}

TEST_CASE("module: a forward failure leaves the random generator as before the step", "[torch][module][faults]") {
    auto model = remat_test::make_mlp(8, 16, 2, 3, 0.5);
    bool fail = false;
    rt::StageList stages = remat_test::blocks_of(model);
    stages.push_back(rt::make_stage("last", [&](const at::Tensor& x) {
        if (fail) throw std::runtime_error("late failure");
        return x + 1;
    }));
    auto m = rt::checkpoint(stages, torch::randn({4, 8}), rt::budget_percent(100), remat::StoreAll{}, quick());
    fail = true;
    const at::Tensor x = torch::randn({4, 8});
    const at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();
    CHECK_THROWS_AS(m->forward(x), remat::ExecutionError);
    // The dropout stages before the failure drew numbers; they are given back.
    CHECK(same(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
}

TEST_CASE("module: measured peak of a training step matches the plan", "[torch][module][memory]") {
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(64, 256, 6, 10, 0.2);
    const at::Tensor sample = torch::randn({128, 64});
    const rt::StageList stages = remat_test::blocks_of(model);
    for (const double percent : {100.0, 50.0}) {
        auto m = rt::checkpoint(stages, sample, rt::budget_percent(100), remat::Rotor{}, quick());
        const remat::Bytes smallest = remat::Rotor{}.smallest_budget(m->chain());
        m->replan(rt::budget_bytes(std::max(smallest, remat::percent_of(m->store_all_peak(), percent))));
        const at::Tensor y = torch::randint(0, 10, {128}, torch::kLong);
        for (int step = 0; step < 2; ++step) {
            const at::Tensor out = m->forward(torch::randn({128, 64}));
            cross_entropy(out, y).backward();
            const rt::StepReport& r = m->last_report();
            INFO(percent << "%: predicted " << r.predicted_peak << ", measured " << r.measured_peak << ", budget "
                         << m->budget());
            CHECK(r.completed);
            const remat::Bytes tolerance = std::max<remat::Bytes>(r.predicted_peak / 20, 64 * 1024);
            CHECK(std::abs(r.measured_peak - r.predicted_peak) <= tolerance);
            CHECK(r.measured_peak <= m->budget() + tolerance);
        }
    }
}

TEST_CASE("module: rotor-release's freed checkpoints free their memory: measured peak matches the plan",
          "[torch][module][memory]") {
    // A checkpoint freed while the next stage's graph still shows it (its saved input) must
    // give its memory back, and its recomputation must reach that graph.
    at::set_num_threads(1);
    auto model = remat_test::make_mlp(64, 256, 6, 10, 0.2);
    const at::Tensor sample = torch::randn({128, 64});
    const rt::StageList stages = remat_test::blocks_of(model);
    int faster_than_rotor = 0;
    for (const double percent : {60.0, 45.0, 35.0}) {
        auto m = rt::checkpoint(stages, sample, rt::budget_percent(100), remat::RotorRelease{}, quick());
        const remat::Bytes smallest = remat::RotorRelease{}.smallest_budget(m->chain());
        m->replan(rt::budget_bytes(std::max(smallest, remat::percent_of(m->store_all_peak(), percent))));
        try {
            if (m->plan().time < remat::Rotor{}.solve(m->chain(), m->budget()).time) ++faster_than_rotor;
        } catch (const remat::Infeasible&) {
            ++faster_than_rotor;  // Rotor has no plan at all
        }
        const at::Tensor y = torch::randint(0, 10, {128}, torch::kLong);
        for (int step = 0; step < 2; ++step) {
            const at::Tensor out = m->forward(torch::randn({128, 64}));
            cross_entropy(out, y).backward();
            const rt::StepReport& r = m->last_report();
            INFO(percent << "%: predicted " << r.predicted_peak << ", measured " << r.measured_peak << ", budget "
                         << m->budget() << ", " << m->plan().stats.options);
            CHECK(r.completed);
            const remat::Bytes tolerance = std::max<remat::Bytes>(r.predicted_peak / 20, 64 * 1024);
            CHECK(std::abs(r.measured_peak - r.predicted_peak) <= tolerance);
            CHECK(r.measured_peak <= m->budget() + tolerance);
        }
    }
    CHECK(faster_than_rotor > 0);
}

TEST_CASE("module: gradients asked for the input only leave the parameters alone", "[torch][module]") {
    auto model = remat_test::make_mlp(8, 16, 3, 3, 0.2);
    auto m = rt::checkpoint(remat_test::blocks_of(model), torch::randn({4, 8}), rt::budget_percent(100),
                            remat::Periodic{}, quick());
    const at::Tensor x = torch::randn({4, 8}, torch::requires_grad());
    const at::Tensor loss = m->forward(x).square().sum();
    const auto grads = torch::autograd::grad({loss}, {x});
    CHECK(grads[0].defined());
    for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

#if REMAT_WITH_CUDA
// Runs in every CUDA build, with a GPU or without: the probe's contract on devices that do
// not exist is a clear InvalidInput naming the device, never a crash.
TEST_CASE("cuda probe: a device that does not exist is a clear error", "[torch][cuda-probe]") {
    const auto devices = static_cast<c10::DeviceIndex>(c10::cuda::device_count());
    for (const c10::DeviceIndex missing : {devices, static_cast<c10::DeviceIndex>(devices + 3),
                                           static_cast<c10::DeviceIndex>(-1)}) {
        INFO("device " << int(missing) << " of " << int(devices));
        try {
            const rt::CudaMemoryProbe probe(missing);
            FAIL("no error for a CUDA device that does not exist");
        } catch (const remat::InvalidInput& e) {
            const std::string message = e.what();
            CHECK(message.find("CUDA device " + std::to_string(missing) + " does not exist") != std::string::npos);
            CHECK(message.find("sees " + std::to_string(devices) + " CUDA devices") != std::string::npos);
        }
    }
    if (devices == 0) {
        CHECK_FALSE(torch::cuda::is_available());
        CHECK_THROWS_AS(rt::CudaMemoryProbe(), remat::InvalidInput);
    }
}

// The [cuda] tests are hidden from the main run: ctest runs them as remat_cuda_tests, which
// reports them as skipped (exit 77) where "[cuda-device]" finds no device.
TEST_CASE("cuda device: this process sees a CUDA device", "[.][cuda-device]") {
    REQUIRE(torch::cuda::is_available());
}

TEST_CASE("cuda: probe, gradients and measured peak on a GPU", "[.][torch][cuda]") {
    REQUIRE(torch::cuda::is_available());
    rt::CudaMemoryProbe probe(0);
    const remat::Bytes before = probe.current();
    {
        const at::Tensor t = at::empty({1 << 20}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
        CHECK(probe.current() - before >= (4 << 20));
    }
    CHECK(probe.current() == before);

    auto model = remat_test::make_mlp(32, 256, 6, 5, 0.3);
    model->to(torch::kCUDA);
    auto reference = remat_test::copy_of(model);
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    const at::Tensor sample = torch::randn({64, 32}, cuda);
    auto m = rt::checkpoint<remat::Rotor, rt::CudaMemoryProbe>(remat_test::blocks_of(model), sample,
                                                               rt::budget_percent(100), remat::Rotor{}, quick(), probe);
    m->replan(rt::budget_bytes(std::max(remat::Rotor{}.smallest_budget(m->chain()),
                                        remat::percent_of(m->store_all_peak(), 50))));
    const at::Tensor x = torch::randn({64, 32}, cuda);
    const at::Tensor y = torch::randint(0, 5, {64}, torch::TensorOptions().dtype(torch::kLong).device(at::kCUDA));
    torch::manual_seed(3);
    const at::Tensor out_ref = reference->forward(x);
    cross_entropy(out_ref, y).backward();
    torch::manual_seed(3);
    const at::Tensor out = m->forward(x);
    cross_entropy(out, y).backward();
    CHECK(torch::allclose(out, out_ref, 1e-5, 1e-6));
    const auto p = model->parameters(), q = reference->parameters();
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(torch::allclose(p[i].grad(), q[i].grad(), 1e-4, 1e-6));
    const rt::StepReport& r = m->last_report();
    INFO("predicted " << r.predicted_peak << ", measured " << r.measured_peak << ", budget " << m->budget());
    CHECK(std::abs(r.measured_peak - r.predicted_peak) <= std::max<remat::Bytes>(r.predicted_peak / 20, 64 * 1024));
}
#endif

TEST_CASE("module: a total budget counts parameters, gradients and optimizer state", "[torch][module][budget]") {
    auto model = remat_test::make_mlp(16, 32, 5, 4, 0.2);
    const at::Tensor sample = torch::randn({16, 16});
    const rt::StageList stages = remat_test::blocks_of(model);
    remat::Bytes weights = 0, buffers = 0;
    for (const at::Tensor& p : model->parameters()) weights += static_cast<remat::Bytes>(p.nbytes());
    for (const at::Tensor& b : model->buffers()) buffers += static_cast<remat::Bytes>(b.nbytes());
    auto activations_only = rt::checkpoint(stages, sample, rt::budget_percent(100), remat::Rotor{}, quick());
    const remat::Bytes p_ref = activations_only->store_all_peak();
    // Everything the step holds: weights (and buffers), their gradients, Adam's two moments, and P_ref.
    rt::CheckpointOptions adam = quick();
    adam.optimizer_state_per_parameter = 2.0;
    auto total = rt::checkpoint(stages, sample, rt::budget_total(4 * weights + buffers + p_ref), remat::Rotor{}, adam);
    CHECK(total->budget() == p_ref);
    CHECK(total->plan().peak <= p_ref);
    // Plain SGD leaves the optimizer's share to the plan.
    auto sgd = rt::checkpoint(stages, sample, rt::budget_total(4 * weights + buffers + p_ref), remat::Rotor{}, quick());
    CHECK(sgd->budget() == p_ref + 2 * weights);
    // Below what the weights alone take: Infeasible, saying so.
    try {
        (void)rt::checkpoint(stages, sample, rt::budget_total(weights), remat::Rotor{}, adam);
        FAIL("a total budget below the weights was accepted");
    } catch (const remat::Infeasible& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("optimizer state take alone"));
    }
}

// The output's gradient comes from autograd into the module's backward. LibTorch 1.13 keeps its
// own reference to it until that backward returns; the plan's free of it must still give its
// memory back (or, where someone else holds it, count it outside the plan), so that every step
// of the measured timeline is the predicted one.
TEST_CASE("module: the output's gradient is freed where the plan frees it, on every LibTorch", "[torch][module][memory]") {
    torch::manual_seed(5);
    torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::Tanh(), torch::nn::Linear(256, 256),
                                torch::nn::Tanh(), torch::nn::Linear(256, 2048));
    const at::Tensor x = torch::randn({32, 64});
    const at::Tensor target = torch::randn({32, 2048});  // the output's gradient: 256 KiB
    auto m = rt::checkpoint(model, x, rt::budget_percent(70).or_smallest(), remat::Rotor{});
    const auto check_timeline = [&] {
        const rt::StepReport& r = m->last_report();
        const auto& predicted = m->executable_plan().simulation().timeline;
        REQUIRE(r.measured_timeline.size() == predicted.size());
        for (std::size_t i = 0; i < predicted.size(); ++i) {
            if (r.measured_timeline[i] < 0) continue;  // the loss: the caller's
            INFO("step " << i << ": " << remat::describe(m->problem(), m->plan().schedule[i]));
            // Never above (the prediction counts the input's gradient, which B1 does not make
            // here: the model's input needs none).
            CHECK(r.measured_timeline[i] <= predicted[i].during);
        }
        CHECK(r.measured_peak == r.predicted_peak);
    };
    SECTION("a loss on the output itself: its gradient's memory goes back where the plan frees it") {
        // Real memory at the end of the step, while autograd still holds its reference (the
        // hand-over hook runs inside the module's backward), against after the backward.
        const rt::CpuMemoryProbe probe;
        remat::Bytes at_hand_over = 0;
        rt::GradientHooks hooks;
        hooks.before_hand_over = [&](std::vector<at::Tensor>&) { at_hand_over = probe.current(); };
        m->set_gradient_hooks(hooks);
        for (int step = 0; step < 2; ++step) {
            for (at::Tensor& p : m->parameters()) p.mutable_grad() = at::Tensor();  // no accumulation
            const at::Tensor loss = torch::mse_loss(m->forward(x), target);
            loss.backward();
            const remat::Bytes after = probe.current();
            INFO("end of the step " << at_hand_over << " B, after the backward " << after << " B");
            CHECK(at_hand_over - after < static_cast<remat::Bytes>(target.nbytes()) / 2);
            check_timeline();
        }
    }
    SECTION("a loss on a view of the output: a gradient someone else holds is counted outside the plan") {
        const at::Tensor loss = torch::mse_loss(m->forward(x).reshape({-1, 64}), target.reshape({-1, 64}));
        loss.backward();
        check_timeline();
    }
}

// In a program linked with the pip wheel's LibTorch, std::filesystem::remove_all dies of
// SIGSEGV on a folder that is not empty (this executable links it in the 2.x configuration).
TEST_CASE("remove_folder removes a tree without following its links, where remove_all crashes", "[torch]") {
    namespace fs = std::filesystem;
    const fs::path root = fs::temp_directory_path() / ("remat-remove-folder-" + std::to_string(::getpid()));
    const fs::path tree = root / "tree", outside = root / "outside";
    std::error_code error;
    rt::remove_folder(root, error);
    REQUIRE_FALSE(error);
    fs::create_directories(tree / "a" / "b");
    fs::create_directories(outside);
    for (const fs::path& file : {tree / "x.txt", tree / "a" / "y.txt", tree / "a" / "b" / "z.txt", outside / "kept.txt"})
        std::ofstream(file) << "data";
    fs::create_symlink(outside, tree / "a" / "link-to-folder");
    fs::create_symlink(outside / "kept.txt", tree / "link-to-file");

    // 3 files, 2 links, 2 folders below the tree, and the tree itself.
    CHECK(rt::remove_folder(tree, error) == 8);
    CHECK_FALSE(error);
    CHECK_FALSE(fs::exists(tree));
    CHECK(fs::exists(outside / "kept.txt"));  // the links were removed, not followed

    CHECK(rt::remove_folder(tree, error) == 0);  // nothing there: nothing to do, no error
    CHECK_FALSE(error);
    CHECK(rt::remove_folder(outside / "kept.txt", error) == 1);  // a file on its own
    CHECK_FALSE(error);
    CHECK(rt::remove_folder(root, error) == 2);
    CHECK_FALSE(error);
    CHECK_FALSE(fs::exists(root));
}
