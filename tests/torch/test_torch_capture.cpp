// Tests of op-level capture from TorchScript (remat/torch/script.hpp) and of the executor of
// captured problems (remat/torch/graph_executor.hpp): small modules (diamond, residual,
// attention, multi-output), the GPT-2-like and ResNet-like examples, plans at several
// budgets against plain autograd, measured against predicted peaks, and the constructs
// capture must refuse.
#include <catch2/catch.hpp>

#include <ATen/Parallel.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/torch/models.hpp"
#include "remat/io/json.hpp"
#include "remat/core/bounds.hpp"
#include "remat/solvers/greedy.hpp"
#include "remat/solvers/rockmate.hpp"
#include "remat/solvers/store_all.hpp"
#include "remat/torch/graph_executor.hpp"
#include "remat/solvers/auto.hpp"
#include "remat/torch/offload_script.hpp"
#include "remat/torch/script.hpp"

#include "capture_helpers.hpp"

using namespace capture_test;

TEST_CASE("capture: a diamond reproduces module.forward and every gradient", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(1);
    auto m = make_module("Diamond", {{"w1", at::randn({16, 16})}, {"w2", at::randn({16, 16})}, {"w3", at::randn({16, 16})}},
                         R"(
def forward(self, x):
    a = torch.relu(torch.matmul(x, self.w1))
    b = torch.tanh(torch.matmul(a, self.w2))
    c = torch.sigmoid(torch.matmul(a, self.w3))
    return torch.cat([b, c], 1)
)");
    const at::Tensor x = at::randn({8, 16}).requires_grad_(true);
    const ScriptCapture cap = capture_script(m, {x}, quick("diamond"));
    const remat::Problem& p = cap.problem();
    // a = relu(...) has two consumers: its gradient arrives as two contributions.
    REQUIRE(p.find_op("loss"));
    CHECK(p.final_data().size() == 1);  // the input's gradient
    const auto* relu = find_op(cap, "relu");
    REQUIRE(relu != nullptr);
    // relu's backward reads its own output, not its input.
    CHECK(contains(relu->backward_reads, relu->outputs.at(0)));
    const auto* tanh = find_op(cap, "tanh");
    REQUIRE(tanh != nullptr);
    CHECK(contains(tanh->backward_reads, tanh->outputs.at(0)));
    std::size_t contributions_to_a = 0;
    for (const auto& d : p.all_data())
        if (d.name.rfind("g:" + relu->outputs.at(0) + "<", 0) == 0) ++contributions_to_a;
    CHECK(contributions_to_a == 2);
    ScriptExecutor<> ex(cap);
    const auto report = check_against_plain(m, cap, ex, store_all(cap), {x}, sum_of_squares());
    CHECK(report.completed);
}

TEST_CASE("capture: a residual module with views, an in-place update and cheap ops", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(2);
    auto m = make_module("Residual", {{"w", at::randn({32, 32}) * 0.2}, {"b", at::randn({32})}}, R"(
def forward(self, x):
    B = x.size(0)
    h = torch.matmul(x.view(B, 4, 32), self.w)
    h.add_(self.b)
    h = torch.relu(h * 0.5)
    y = h.view(B, 128) + x
    return y.transpose(0, 1)
)");
    const at::Tensor x = at::randn({6, 128}).requires_grad_(true);
    const ScriptCapture cap = capture_script(m, {x}, quick("residual"));
    // The in-place add runs out of place and folds, like `h * 0.5`, into relu; the view of x
    // folds into matmul.
    const auto* matmul = find_op(cap, "matmul");
    REQUIRE(matmul != nullptr);
    CHECK(contains(matmul->nodes, "aten::view"));
    CHECK(!contains(matmul->nodes, "aten::add"));
    const auto* relu = find_op(cap, "relu");
    REQUIRE(relu != nullptr);
    CHECK(contains(relu->nodes, "aten::mul"));
    CHECK(contains(relu->nodes, "aten::add"));
    // The returned transpose is a view of another op's result: it gets its own memory.
    ScriptExecutor<> ex(cap);
    check_against_plain(m, cap, ex, store_all(cap), {x}, sum_of_squares());
}

TEST_CASE("capture: attention with dropout replays its random numbers", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(3);
    auto m = make_module("Attention", {{"wq", at::randn({16, 48}) * 0.3}}, R"(
def forward(self, x):
    T = x.size(1)
    q, k, v = torch.matmul(x, self.wq).split(16, 2)
    att = torch.matmul(q, k.transpose(1, 2)) * 0.25
    att = att.masked_fill(torch.ones(T, T).tril() == 0, -1e9)
    att = torch.dropout(torch.softmax(att, -1), 0.3, self.training)
    return torch.matmul(att, v)
)");
    const at::Tensor x = at::randn({2, 8, 16});
    const ScriptCapture cap = capture_script(m, {x}, quick("attention"));
    bool random = false;
    for (const auto& op : cap.ops()) random = random || op.random;
    CHECK(random);
    ScriptExecutor<> ex(cap);
    check_against_plain(m, cap, ex, store_all(cap), {x}, sum_of_squares());

    // A plan that recomputes everything it can: each forward again before its backward.
    // Dropout masks must be the ones of the first run, and the generator must end where
    // plain autograd leaves it.
    const remat::Plan plan = recompute_all(cap);
    const auto& params = cap.parameters();
    (void)plain_step(m, {x}, sum_of_squares(), params, 99);
    const auto after_plain = remat::torch::detail::RngState::capture(x.device());
    at::manual_seed(99);
    (void)ex.step(ex.prepare(plan), {x}, sum_of_squares());
    CHECK(remat::torch::detail::RngState::capture(x.device()) == after_plain);
    (void)take_grads(params, {});
    check_against_plain(m, cap, ex, plan, {x}, sum_of_squares());
}

TEST_CASE("capture: a forward with grad run again while its saved state is live costs what the simulator counts",
          "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(4);
    auto m = make_module("FeedForward", {{"w1", at::randn({16, 64}) * 0.3}, {"w2", at::randn({64, 16}) * 0.3}}, R"(
def forward(self, x):
    h = torch.relu(torch.matmul(x, self.w1))
    return torch.matmul(torch.dropout(h, 0.3, self.training), self.w2)
)");
    const at::Tensor x = at::randn({32, 16});
    const ScriptCapture cap = capture_script(m, {x}, quick("feed_forward"));
    const remat::Problem& p = cap.problem();
    // The second matmul's group holds dropout's output and mask: saved with grad, transient
    // without, so its forward without grad needs more memory than its forward with grad.
    const auto* second = [&]() -> const remat::torch::CapturedOp* {
        for (const auto& op : cap.ops())
            if (op.has_backward && p.op(p.op_id("F:" + op.name)).overhead > p.op(p.op_id("F+:" + op.name)).overhead)
                return &op;
        return nullptr;
    }();
    REQUIRE(second != nullptr);
    REQUIRE(contains(second->nodes, "aten::dropout"));
    // Store-all, except that right after the loss the group's output is freed and its forward
    // with grad runs again, with its saved state still live.
    remat::Plan plan = store_all(cap);
    const auto loss = std::find_if(plan.schedule.begin(), plan.schedule.end(),
                                   [&](const remat::Step& step) { return step.is_run() && step.op() == *p.loss(); });
    REQUIRE(loss != plan.schedule.end());
    std::vector<remat::Step> again;
    for (const std::string& out : second->outputs) again.push_back(remat::Step::free(p.data_id(out)));
    again.push_back(remat::Step::run(p.op_id("F+:" + second->name)));
    plan.schedule.insert(loss + 1, again.begin(), again.end());
    const remat::SimulationReport simulated = remat::simulate(p, plan.schedule);
    REQUIRE(simulated.valid);
    plan.time = simulated.time;
    plan.peak = plan.budget = simulated.peak;
    ScriptExecutor<> ex(cap);
    // Equal gradients, the same dropout mask, and no op above its prediction.
    check_against_plain(m, cap, ex, plan, {x}, sum_of_squares());
}

TEST_CASE("capture: multi-output modules keep their output structure", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(4);
    auto m = make_module("MultiOut", {{"w", at::randn({10, 10})}}, R"(
def forward(self, x, y):
    h = torch.matmul(x, self.w)
    s, t = torch.max(h, 1)
    return (torch.tanh(h), [s * 2.0, y + h], 3, t)
)");
    const at::Tensor x = at::randn({5, 10}).requires_grad_(true);
    const at::Tensor y = at::randn({5, 10});
    const ScriptCapture cap = capture_script(m, {x, y}, quick("multi"));
    CHECK(cap.input_count() == 2);
    CHECK(cap.output_count() == 4);  // tanh, s*2, y+h, the indices
    ScriptExecutor<> ex(cap);
    const auto report = check_against_plain(m, cap, ex, store_all(cap), {x, y}, sum_of_squares());
    CHECK(report.completed);
    // The rebuilt structure equals module.forward's.
    at::manual_seed(0);
    const c10::IValue expected = m.forward({x, y});
    auto step = ex.start(ex.prepare(store_all(cap)), {x, y});
    const c10::IValue got = cap.pack_outputs(step.forward());
    step.abort();
    REQUIRE(got.isTuple());
    const auto& items = got.toTupleRef().elements();
    REQUIRE(items.size() == 4);
    CHECK(items[2].toInt() == 3);
    REQUIRE(items[1].isList());
    CHECK(items[1].toListRef().size() == 2);
    CHECK(max_diff(items[3].toTensor(), expected.toTupleRef().elements()[3].toTensor()) == 0.0);
    // An integer output gets no gradient: the loss writes none for it.
    std::size_t loss_writes = cap.problem().op(*cap.problem().loss()).writes.size();
    CHECK(loss_writes == 3);
}

TEST_CASE("capture: loss.backward() through the planned forward accumulates like plain autograd", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(5);
    remat_examples::GptConfig c;
    c.layers = 2;
    c.embed = 32;
    c.heads = 2;
    c.vocab = 64;
    c.block_size = 16;
    auto m = remat_examples::make_gpt(c);
    const at::Tensor idx = at::randint(0, c.vocab, {2, 16});
    const at::Tensor targets = at::randint(0, c.vocab, {2, 16});
    const ScriptCapture cap = capture_script(m, {idx}, quick("gpt"));
    ScriptExecutor<> ex(cap);
    const auto loss = [&](const std::vector<at::Tensor>& o) {
        return at::cross_entropy_loss(o[0].reshape({-1, c.vocab}), targets.reshape({-1}));
    };
    const auto& params = cap.parameters();
    const Plain ref = plain_step(m, {idx}, loss, params, 7);
    // Two steps of accumulation: .grad must be twice the plain one.
    const auto plan = ex.prepare(store_all(cap));
    for (int k = 0; k < 2; ++k) {
        at::manual_seed(7);
        auto report = std::make_shared<remat::torch::StepReport>();
        const auto outputs = ex.forward(plan, {idx}, report);
        REQUIRE(outputs.size() == 1);
        CHECK(outputs[0].requires_grad());
        loss(outputs).backward();
        CHECK(report->completed);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
        INFO("parameter " << i);
        REQUIRE(params[i].grad().defined());
        CHECK(max_diff(params[i].grad(), ref.grads.parameters[i] * 2) <= 1e-6);
        params[i].mutable_grad() = at::Tensor();
    }
    // Without grad mode, forward() is the module's own forward.
    {
        const at::NoGradGuard no_grad;
        at::manual_seed(7);
        const auto outputs = ex.forward(plan, {idx});
        CHECK(max_diff(outputs[0], ref.output.toTensor()) == 0.0);
    }
}

TEST_CASE("capture: GPT-2-like model at several budgets equals plain autograd, peaks as predicted",
          "[torch][capture][gpt]") {
    remat::torch::CpuMemoryProbe probe;
    for (const std::int64_t layers : {2, 3}) {
        INFO(layers << " layers");
        at::manual_seed(10 + layers);
        remat_examples::GptConfig c;
        c.layers = layers;
        c.embed = 64;
        c.heads = 4;
        c.vocab = 256;
        c.block_size = 32;
        c.dropout = 0.1;
        auto m = remat_examples::make_gpt(c);
        const at::Tensor idx = at::randint(0, c.vocab, {4, 32});
        const at::Tensor targets = at::randint(0, c.vocab, {4, 32});
        const ScriptCapture cap = capture_script(m, {idx}, quick("gpt" + std::to_string(layers)));
        ScriptExecutor<> ex(cap);
        const auto loss = [&](const std::vector<at::Tensor>& o) {
            return at::cross_entropy_loss(o[0].reshape({-1, c.vocab}), targets.reshape({-1}));
        };
        const remat::Plan reference = store_all(cap);
        remat::RockmateOptions options;
        options.peak_budgets = 2;
        options.saved_budgets = 2;
        options.block_time_limit_seconds = 5.0;
        const remat::Rockmate<> rockmate(options);
        const auto model = rockmate.analyse(cap.problem());
        const Bytes smallest = rockmate.smallest_budget(model);
        CHECK(smallest < reference.peak / 2);
        std::vector<remat::Plan> plans{reference};
        for (const double fraction : {0.7, 0.45}) plans.push_back(rockmate.solve(model, Bytes(fraction * double(reference.peak))));
        plans.push_back(rockmate.solve(model, smallest));
        for (const remat::Plan& plan : plans) {
            INFO("budget " << plan.budget << " (store-all peak " << reference.peak << ")");
            const auto report = check_against_plain(m, cap, ex, plan, {idx}, loss);
            CHECK(report.predicted_peak <= plan.budget);
            CHECK(report.measured_peak <= plan.budget);
            CHECK(std::abs(double(report.measured_peak) / double(report.predicted_peak) - 1.0) <= 0.05);
        }
    }
}

TEST_CASE("capture: ResNet-like model with batch norm; running statistics change once per step", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(20);
    remat_examples::ResNetConfig c;
    c.width = 8;
    c.stages = 2;
    c.blocks_per_stage = 1;
    auto m = remat_examples::make_resnet(c);
    const at::Tensor x = at::randn({4, 3, 12, 12});
    const ScriptCapture cap = capture_script(m, {x}, quick("resnet"));
    bool updates = false;
    for (const auto& op : cap.ops()) updates = updates || op.mutates_buffers;
    CHECK(updates);
    ScriptExecutor<> ex(cap);
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& b : m.buffers()) buffers.push_back(b);
    const auto snapshot = [&] {
        std::vector<at::Tensor> s;
        for (const at::Tensor& b : buffers) s.push_back(b.clone());
        return s;
    };
    const auto restore = [&](const std::vector<at::Tensor>& s) {
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(s[i]);
    };
    const auto start = snapshot();
    remat::RockmateOptions options;
    options.store_all_only = true;
    const remat::Rockmate<> rotor_blocks(options);
    const auto model = rotor_blocks.analyse(cap.problem());
    for (const remat::Plan& plan :
         {store_all(cap), recompute_all(cap), rotor_blocks.solve(model, rotor_blocks.smallest_budget(model))}) {
        restore(start);
        (void)plain_step(m, {x}, sum_of_squares(), cap.parameters(), 3);
        const auto after_plain = snapshot();
        restore(start);
        check_against_plain(m, cap, ex, plan, {x}, sum_of_squares(), 1e-9);
        // check_against_plain ran plain then planned: buffers moved twice from `start`.
        restore(start);
        at::manual_seed(3);
        (void)ex.step(ex.prepare(plan), {x}, sum_of_squares());
        (void)take_grads(cap.parameters(), {});
        const auto after_planned = snapshot();
        for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(max_diff(after_plain[i], after_planned[i]) <= 1e-6);
    }
    // Eval mode is a different capture.
    m.eval();
    CHECK_THROWS_AS(ex.start(ex.prepare(store_all(cap)), {x}), remat::InvalidInput);
    m.train();
}

TEST_CASE("capture: a failing step leaves parameters, gradients, buffers and the generator untouched",
          "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(30);
    auto m = make_module("Lookup", {{"emb", at::randn({10, 8})}, {"w", at::randn({8, 8})}}, R"(
def forward(self, idx):
    h = torch.embedding(self.emb, idx)
    h = torch.dropout(torch.matmul(h, self.w), 0.5, self.training)
    return torch.tanh(h)
)");
    const at::Tensor idx = at::randint(0, 10, {4, 3});
    const ScriptCapture cap = capture_script(m, {idx}, quick("lookup"));
    ScriptExecutor<> ex(cap);
    const auto plan = ex.prepare(store_all(cap));
    // A first step leaves gradients in .grad.
    (void)ex.step(plan, {idx}, sum_of_squares());
    std::vector<at::Tensor> grads, values;
    for (const at::Tensor& p : cap.parameters()) {
        grads.push_back(p.grad().clone());
        values.push_back(p.detach().clone());
    }
    const auto rng = remat::torch::detail::RngState::capture(idx.device());
    const at::Tensor bad = at::full({4, 3}, 12, at::kLong);  // out of the embedding's range
    try {
        (void)ex.step(plan, {bad}, sum_of_squares());
        FAIL("the step should have failed");
    } catch (const remat::ExecutionError& e) {
        const std::string what = e.what();
        CHECK(what.find("embedding") != std::string::npos);
        CHECK(what.find("line") != std::string::npos);
        CHECK(what.find("forward phase") != std::string::npos);
    }
    CHECK(remat::torch::detail::RngState::capture(idx.device()) == rng);
    for (std::size_t i = 0; i < grads.size(); ++i) {
        CHECK(max_diff(cap.parameters()[i].grad(), grads[i]) == 0.0);
        CHECK(max_diff(cap.parameters()[i].detach(), values[i]) == 0.0);
    }
    // A loss that throws aborts the step the same way.
    CHECK_THROWS(ex.step(plan, {idx}, [](const std::vector<at::Tensor>&) -> at::Tensor {
        throw std::runtime_error("loss failed");
    }));
    for (std::size_t i = 0; i < grads.size(); ++i) CHECK(max_diff(cap.parameters()[i].grad(), grads[i]) == 0.0);
    // Inputs unlike the example are refused before anything runs.
    CHECK_THROWS_AS(ex.start(plan, {at::randint(0, 10, {5, 3})}), remat::InvalidInput);
    CHECK_THROWS_AS(ex.start(plan, {idx.to(at::kInt)}), remat::InvalidInput);
    // A schedule that is not valid is refused.
    remat::Schedule broken = plan.schedule();
    broken.erase(broken.begin());
    CHECK_THROWS_AS(ex.prepare(broken), remat::InvalidInput);
    for (const at::Tensor& p : cap.parameters()) p.mutable_grad() = at::Tensor();
}

TEST_CASE("capture: unsupported constructs are refused, naming the node and its line", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    const at::Tensor x = at::randn({4, 4});
    const std::vector<std::pair<std::string, at::Tensor>> w{{"w", at::randn({4, 4})}};
    SECTION("control flow on tensor values") {
        auto m = make_module("Branch", w, R"(
def forward(self, x):
    h = torch.matmul(x, self.w)
    if bool(h.sum() > 0):
        h = h * 2.0
    return h
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("branch")); });
        CHECK(what.find("'prim::If'") != std::string::npos);
        CHECK(what.find("line 4") != std::string::npos);
        CHECK(what.find("if bool(h.sum() > 0):") != std::string::npos);
    }
    SECTION("a branch on shapes is taken at capture") {
        auto m = make_module("ShapeBranch", w, R"(
def forward(self, x):
    h = torch.matmul(x, self.w)
    if h.size(0) > 2:
        h = torch.tanh(h)
    else:
        h = torch.sigmoid(h)
    return h
)");
        const ScriptCapture cap = capture_script(m, {x}, quick("shape-branch"));
        CHECK(find_op(cap, "tanh") != nullptr);
        CHECK(find_op(cap, "sigmoid") == nullptr);
    }
    SECTION("loops whose continuation depends on tensor values") {
        auto m = make_module("Loop", w, R"(
def forward(self, x):
    h = torch.matmul(x, self.w)
    while bool(h.sum() > 0):
        h = h - 1.0
    return h
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("loop")); });
        CHECK(what.find("'prim::Loop'") != std::string::npos);
        CHECK(what.find("line 4") != std::string::npos);
        CHECK(what.find("depends on tensor values") != std::string::npos);
    }
    SECTION("in-place update of a graph input") {
        auto m = make_module("InputUpdate", w, R"(
def forward(self, x):
    x.mul_(2.0)
    return torch.matmul(x, self.w)
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("input-update")); });
        CHECK(what.find("'aten::mul_'") != std::string::npos);
        CHECK(what.find("line 3") != std::string::npos);
        CHECK(what.find("graph input") != std::string::npos);
    }
    SECTION("in-place update of a parameter") {
        auto m = make_module("ParamUpdate", w, R"(
def forward(self, x):
    self.w.add_(1.0)
    return torch.matmul(x, self.w)
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("param-update")); });
        CHECK(what.find("'aten::add_'") != std::string::npos);
        CHECK(what.find("parameter") != std::string::npos);
    }
    SECTION("in-place update of a view whose base is read afterwards") {
        auto m = make_module("ViewUpdate", w, R"(
def forward(self, x):
    h = torch.matmul(x, self.w)
    v = h.view(16)
    v.relu_()
    return h * 2.0
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("view-update")); });
        CHECK(what.find("'aten::relu_'") != std::string::npos);
        CHECK(what.find("line 5") != std::string::npos);
        CHECK(what.find("shares") != std::string::npos);
    }
    SECTION("a module whose own backward fails: an in-place op overwrites what autograd saved") {
        auto m = make_module("Overwritten", w, R"(
def forward(self, x):
    h = torch.relu_(torch.matmul(x, self.w))
    h.mul_(2.0)
    return h
)");
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("overwritten")); });
        CHECK(what.find("plain autograd's backward") != std::string::npos);
        CHECK(what.find("does not train as it is") != std::string::npos);
        CHECK(what.find("inplace operation") != std::string::npos);  // autograd's own reason
    }
    SECTION("a node kind without an operator") {
        auto m = make_module("Mystery", w, R"(
def forward(self, x):
    h = torch.matmul(x, self.w)
    return torch.tanh(h)
)");
        // Splice a node of an unknown kind between the matmul and the tanh.
        auto graph = m.get_method("forward").graph();
        torch::jit::Node* tanh = nullptr;
        for (torch::jit::Node* n : graph->nodes())
            if (n->kind() == c10::Symbol::fromQualString("aten::tanh")) tanh = n;
        REQUIRE(tanh != nullptr);
        torch::jit::Node* mystery = graph->create(c10::Symbol::fromQualString("custom::mystery"), {tanh->input(0)}, 1);
        mystery->output()->setType(c10::TensorType::get());
        mystery->setSourceRange(tanh->sourceRange());
        mystery->insertBefore(tanh);
        tanh->replaceInput(0, mystery->output());
        const std::string what = message_of([&] { (void)capture_script(m, {x}, quick("mystery")); });
        CHECK(what.find("'custom::mystery'") != std::string::npos);
        CHECK(what.find("line 4") != std::string::npos);
    }
    SECTION("wrong inputs") {
        auto m = make_module("Plain", w, R"(
def forward(self, x):
    return torch.matmul(x, self.w)
)");
        CHECK(message_of([&] { (void)capture_script(m, {x, x}, quick("plain")); })
                  .find("takes 1 arguments but 2 example arguments") != std::string::npos);
        auto frozen = make_module("Frozen", {}, R"(
def forward(self, x):
    return torch.tanh(x)
)");
        CHECK(message_of([&] { (void)capture_script(frozen, {x}, quick("frozen")); }).find("nothing to train") !=
              std::string::npos);
    }
}

TEST_CASE("capture: a module saved and loaded with torch::jit::load", "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(50);
    remat_examples::GptConfig c;
    c.layers = 1;
    c.embed = 16;
    c.heads = 2;
    c.vocab = 32;
    c.block_size = 8;
    const std::string path = std::string(REMAT_BINARY_DIR) + "/test_capture_gpt.pt";
    remat_examples::make_gpt(c).save(path);
    auto m = torch::jit::load(path);
    m.train();
    const at::Tensor idx = at::randint(0, c.vocab, {2, 8});
    const ScriptCapture cap = capture_script(m, {idx}, quick("loaded"));
    CHECK(cap.parameters().size() == 16);
    ScriptExecutor<> ex(cap);
    check_against_plain(m, cap, ex, store_all(cap), {idx}, sum_of_squares());
    // Errors in a loaded module name the line of its serialized code.
    auto loop = make_module("SavedLoop", {{"w", at::randn({4, 4})}}, R"(
def forward(self, x):
    while bool(x.sum() > 0):
        x = torch.matmul(x, self.w)
    return x
)");
    const std::string loop_path = std::string(REMAT_BINARY_DIR) + "/test_capture_loop.pt";
    loop.save(loop_path);
    auto loaded = torch::jit::load(loop_path);
    const std::string what = message_of([&] { (void)capture_script(loaded, {at::randn({4, 4})}, quick("loop")); });
    CHECK(what.find("'prim::Loop' at line ") != std::string::npos);
    INFO(what);
    CHECK(what.find("of code/") != std::string::npos);
    std::remove(path.c_str());
    std::remove(loop_path.c_str());
}

TEST_CASE("capture: the problem is valid JSON and its store-all reference matches the autograd order",
          "[torch][capture]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(40);
    remat_examples::ResNetConfig c;
    c.width = 4;
    c.stages = 2;
    c.blocks_per_stage = 1;
    auto m = remat_examples::make_resnet(c);
    const ScriptCapture cap = capture_script(m, {at::randn({2, 3, 8, 8})}, quick("resnet-json"));
    const remat::Problem& p = cap.problem();
    const remat::Problem back = remat::io::parse_problem(remat::io::to_json(p));
    CHECK(back.op_count() == p.op_count());
    CHECK(back.data_count() == p.data_count());
    CHECK(remat::simulate(back, store_all(cap).schedule).valid);
    // Every group has F, and F+ and B when it has a backward; B ops are exactly once.
    std::size_t backward = 0;
    for (const auto& op : p.all_ops()) backward += op.exactly_once ? 1 : 0;
    std::size_t with_backward = 0;
    for (const auto& op : cap.ops()) with_backward += op.has_backward ? 1 : 0;
    CHECK(backward == with_backward + 1);
    // Rockmate's partition finds the residual blocks.
    const auto partition = remat::partition_blocks(p);
    CHECK(partition.blocks.size() >= 3);
    // Progress: one line per phase, and one per op for those who ask; past the time limit
    // every op is timed once.
    CaptureOptions o = quick("progress");
    o.repeats = 1000;
    o.time_limit_seconds = 0.0;
    std::vector<std::string> lines, op_lines;
    o.progress = [&lines](const std::string& line) { lines.push_back(line); };
    o.op_progress = [&op_lines](const std::string& line) { op_lines.push_back(line); };
    const ScriptCapture again = capture_script(m, {at::randn({2, 3, 8, 8})}, o);
    REQUIRE(op_lines.size() == again.ops().size());
    CHECK(op_lines.front().find("capture op " + again.ops().front().name) != std::string::npos);
    REQUIRE(lines.size() == 6);
    CHECK(lines[0].find("interpreted the graph") != std::string::npos);
    CHECK(lines[2].find("ran plain autograd") != std::string::npos);
    CHECK(lines[3].find("profiled the ops") != std::string::npos);
    CHECK(lines[4].find("built the problem") != std::string::npos);
    CHECK(lines[5].find("checked the store-all replay against plain autograd") != std::string::npos);
    CHECK(again.problem().op_count() == p.op_count());
}

TEST_CASE("capture: a U-Net and an encoder-decoder without blocks train under budgets like plain autograd",
          "[torch][capture][models]") {
    remat::torch::CpuMemoryProbe probe;
    at::manual_seed(70);
    remat_examples::UNetConfig u;
    u.levels = 4;
    u.width = 4;
    u.convs = 2;
    auto unet = remat_examples::make_unet(u);
    const at::Tensor image = at::randn({2, 3, 32, 32});
    remat_examples::EncoderDecoderConfig e;
    e.d_model = 16;
    e.heads = 2;
    e.feedforward = 32;
    auto encdec = remat_examples::make_encoder_decoder(e);
    const at::Tensor src = at::randn({2, 7, 16});
    const at::Tensor tgt = at::randn({2, 5, 16});
    struct Case {
        std::string name;
        torch::jit::Module* module;
        std::vector<at::Tensor> inputs;
    };
    for (const Case& c : {Case{"unet", &unet, {image}}, Case{"encdec", &encdec, {src, tgt}}}) {
        INFO(c.name);
        const ScriptCapture cap = capture_script(*c.module, c.inputs, quick(c.name));
        // The skips and the cross-attention tie the middle of the graph into one block.
        const auto partition = remat::partition_blocks(cap.problem());
        std::size_t largest = 0, forward = 0;
        for (const auto& b : partition.blocks) {
            largest = std::max(largest, b.forward_ops.size());
            forward += b.forward_ops.size();
        }
        CHECK(2 * largest >= forward);
        ScriptExecutor<> ex(cap);
        const remat::Plan reference = store_all(cap);
        const remat::MemoryLowerBound bound = remat::memory_lower_bound(cap.problem());
        INFO("lower bound " << bound.bytes << " (" << bound.reason << "), store-all " << reference.peak);
        // Budgets between the proven lower bound (at this size, a convolution's workspace) and
        // the store-all peak, down to the least the greedy reaches.
        std::vector<remat::Plan> plans{reference, recompute_all(cap)};
        const remat::Greedy greedy;
        const Bytes least = greedy.smallest_budget(cap.problem());
        for (const Bytes budget : {(bound.bytes + reference.peak) / 2, least}) plans.push_back(greedy.solve(cap.problem(), budget));
        CHECK(least < reference.peak * 3 / 4);
        for (const remat::Plan& plan : plans) {
            INFO("budget " << plan.budget << " of " << reference.peak << " (" << plan.stats.solver << ")");
            const auto report = check_against_plain(*c.module, cap, ex, plan, c.inputs, sum_of_squares());
            // Within 1 % (and a few hundred bytes of autograd's own on models this small).
            const Bytes slack = 1024 + report.predicted_peak / 100;
            CHECK(report.measured_peak <= plan.budget + slack);
            CHECK(std::abs(report.measured_peak - report.predicted_peak) <= slack);
        }
    }
}

TEST_CASE("capture: a captured module trained with its weights offloaded equals plain training with Adam",
          "[torch][capture][offload]") {
    // An MLP whose first weight is tied (read by two op groups: it stays on the device,
    // outside the problem), with dropout between its layers.
    at::manual_seed(21);
    const std::int64_t width = 128;
    std::vector<std::pair<std::string, at::Tensor>> parameters;
    for (int l = 0; l < 5; ++l) {
        parameters.emplace_back("w" + std::to_string(l), at::randn({width, width}) * 0.1);
        parameters.emplace_back("b" + std::to_string(l), at::randn({width}) * 0.1);
    }
    const std::string source = R"(
def forward(self, x):
    h = torch.relu(torch.matmul(x, self.w0.t()) + self.b0)
    h = torch.relu(torch.matmul(h, self.w1.t()) + self.b1)
    h = torch.dropout(h, 0.2, self.training)
    h = torch.relu(torch.matmul(h, self.w2.t()) + self.b2)
    h = torch.relu(torch.matmul(h, self.w3.t()) + self.b3)
    h = torch.matmul(h, self.w4.t()) + self.b4
    return torch.matmul(h, self.w0.t())
)";
    auto m = make_module("OffloadMlp", parameters, source);
    torch::jit::Module reference_module = make_module("OffloadMlp", parameters, source);
    const at::Tensor x = at::randn({256, width});
    const Loss loss = [](const std::vector<at::Tensor>& o) { return (o[0] * o[0]).mean(); };
    const ScriptCapture cap = capture_script(m, {x}, quick("offload_mlp"));

    remat::torch::ScriptOffloadOptions options;
    options.optimizer_state_per_parameter = 2.0;  // Adam
    remat::torch::OffloadedScript<> off(cap, options);
    const auto& training = off.training();
    CHECK(training.weights.size() == 9);  // every parameter but the tied w0
    REQUIRE(training.resident.size() == 1);
    CHECK(training.resident_reasons[0].find("w0: read by 2 op groups") != std::string::npos);

    // The smallest total budget (in steps of 2 % of store-all's total) the combined planner
    // reaches: there, weights move. (The planner runs Auto at many activation budgets without
    // its second opinion and exact fallback, so each takes milliseconds.)
    const remat::Auto quick_auto;
    std::optional<remat::offload::OffloadPlan> plan;
    double percent = 100.0;
    for (double p = 100.0; p >= 10.0; p -= 2.0) {
        try {
            plan = off.plan(remat::budget_percent(p), quick_auto);
            percent = p;
        } catch (const remat::Infeasible& e) {
            INFO(e.what());
            CHECK(std::string(e.what()).find("proven lower bound") != std::string::npos);
            break;
        }
    }
    REQUIRE(plan);
    INFO("plan at " << percent << " % of " << off.store_all_total() << " bytes: " << plan->method);
    CHECK(plan->method.find("greedy") != std::string::npos);
    remat::offload::CombinedOptions between_steps_on_device;
    between_steps_on_device.between_steps = false;
    CHECK_FALSE(remat::offload::plan_remat_only(off.problem(), plan->budget, quick_auto, between_steps_on_device));
    bool moves = false;
    for (const auto& s : plan->schedule.steps) moves = moves || s.is_transfer();
    CHECK(moves);

    // Three steps, each followed by the caller's Adam, against plain training from the same seeds.
    std::vector<at::Tensor> reference_parameters;
    for (const auto& p : reference_module.parameters()) reference_parameters.push_back(p);
    torch::optim::Adam reference_adam(reference_parameters, torch::optim::AdamOptions(1e-2));
    torch::optim::Adam adam(cap.parameters(), torch::optim::AdamOptions(1e-2));
    // Plain training's step `step` (its own seed) with its Adam update; the seed is then set
    // again for the step under test.
    const auto reference_step = [&](int step) {
        Plain ref = plain_step(reference_module, {x}, loss, reference_parameters, 500 + step);
        for (std::size_t i = 0; i < reference_parameters.size(); ++i)
            reference_parameters[i].mutable_grad() = ref.grads.parameters[i];
        reference_adam.step();
        for (const auto& p : reference_parameters) p.mutable_grad() = at::Tensor();
        at::manual_seed(500 + step);
        return ref;
    };
    for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        const Plain ref = reference_step(step);
        const auto result = off.step(*plan, {x}, loss);
        CHECK(max_diff(result.loss, ref.loss) == 0.0);
        for (std::size_t i = 0; i < cap.parameters().size(); ++i) {
            INFO("parameter " << cap.parameter_names()[i]);
            CHECK(max_diff(cap.parameters()[i].grad(), ref.grads.parameters[i]) == 0.0);
        }
        adam.step();
        adam.zero_grad();
        for (std::size_t i = 0; i < cap.parameters().size(); ++i) {
            INFO("parameter " << cap.parameter_names()[i]);
            CHECK(max_diff(cap.parameters()[i], reference_parameters[i]) == 0.0);
            CHECK(cap.parameters()[i].storage().nbytes() == cap.parameters()[i].nbytes());  // back on the device
        }
        const auto& r = result.report;
        INFO("device: predicted " << r.predicted_device_peak << ", measured " << r.measured_device_peak << "; host: predicted "
                                  << r.predicted_host_peak << ", measured " << r.measured_host_peak);
        CHECK(r.completed);
        CHECK(r.predicted_host_peak > 0);
        CHECK(r.measured_host_peak == r.predicted_host_peak);
        if (r.measured_device_peak != r.predicted_device_peak) {  // where: the first step that differs
            const auto predicted = remat::offload::simulate(off.problem(), plan->schedule);
            for (std::size_t i = 0; i < predicted.timeline.size(); ++i) {
                const auto& point = predicted.timeline[i];
                const Bytes expected = plan->schedule.steps[i].is_run() ? point.device_during : point.device_after;
                if (r.measured_device_timeline[i] == expected) continue;
                FAIL_CHECK("step " << i << " (" << remat::offload::describe(off.problem(), plan->schedule.steps[i])
                                   << "): measured " << r.measured_device_timeline[i] << ", predicted " << expected);
                break;
            }
        }
        CHECK(r.measured_device_peak == r.predicted_device_peak);
        CHECK(r.predicted_device_peak <= plan->budget);
    }

    // The drop-in form: forward under the plan, the caller's loss.backward(), Adam; two more
    // steps, still equal to plain training.
    for (int step = 3; step < 5; ++step) {
        INFO("drop-in step " << step);
        const Plain ref = reference_step(step);
        const std::vector<at::Tensor> outputs = off.forward(*plan, {x});
        REQUIRE(outputs.size() == 1);
        CHECK(outputs[0].requires_grad());
        const at::Tensor value = loss(outputs);
        value.backward();
        CHECK(max_diff(value, ref.loss) == 0.0);
        for (std::size_t i = 0; i < cap.parameters().size(); ++i) {
            INFO("parameter " << cap.parameter_names()[i]);
            CHECK(max_diff(cap.parameters()[i].grad(), ref.grads.parameters[i]) == 0.0);
            CHECK(cap.parameters()[i].storage().nbytes() == cap.parameters()[i].nbytes());  // back on the device
        }
        adam.step();
        adam.zero_grad();
        for (std::size_t i = 0; i < cap.parameters().size(); ++i) CHECK(max_diff(cap.parameters()[i], reference_parameters[i]) == 0.0);
        const auto& r = off.last_report();
        INFO("device: predicted " << r.predicted_device_peak << ", measured " << r.measured_device_peak << "; host: predicted "
                                  << r.predicted_host_peak << ", measured " << r.measured_host_peak);
        CHECK(r.completed);
        CHECK(r.measured_host_peak == r.predicted_host_peak);
        CHECK(r.measured_device_peak == r.predicted_device_peak);
    }

    // A forward whose backward never runs is given up, when its outputs and graph are freed or
    // by the next forward: its weights come back, and the next step starts from them.
    {
        {
            const std::vector<at::Tensor> dropped = off.forward(*plan, {x});
            (void)loss(dropped);
        }
        for (const at::Tensor& p : cap.parameters()) CHECK(p.storage().nbytes() == p.nbytes());  // no step under way
        const std::vector<at::Tensor> abandoned = off.forward(*plan, {x});
        const at::Tensor abandoned_loss = loss(abandoned);
        // The second forward gives the first up before it starts. Its own plan may keep weights
        // off the device until its backward (it moves them as often as it helps), so where they
        // are is checked after that, and its device timeline shows it started from them.
        const std::vector<at::Tensor> outputs = off.forward(*plan, {x});
        CHECK_THROWS_WITH(abandoned_loss.backward(), Catch::Matchers::Contains("given up"));
        loss(outputs).backward();
        const auto& r = off.last_report();
        CHECK(r.completed);
        CHECK(r.measured_device_peak == r.predicted_device_peak);
        for (const at::Tensor& p : cap.parameters()) CHECK(p.storage().nbytes() == p.nbytes());
        adam.zero_grad();
    }
    // Without grad mode the module simply runs.
    {
        const torch::NoGradGuard no_grad;
        const std::vector<at::Tensor> outputs = off.forward(*plan, {x});
        CHECK_FALSE(outputs[0].requires_grad());
    }
}
