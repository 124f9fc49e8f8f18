// Tests of the execution engine (remat/exec/executor.hpp) without any framework: a fake
// backend that records its calls, keeps exact byte accounts in a fake allocator, counts
// "buffer" updates and draws from a fake generator, and fails on demand at every kind of call.
// Checks: the calls follow the plan (recomputations replayed with the first run's numbers,
// buffers updated once per step), measured memory equals the simulator's step by step,
// parameter gradients are handed over only at the end, and a failure anywhere rolls back,
// names the failing plan step and leaves the allocator where it started.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/core/chain.hpp>
#include <remat/exec/executor.hpp>
#include <remat/solvers/rotor.hpp>
#include <remat/solvers/store_all.hpp>

#include "../support/random_problems.hpp"

namespace {

using namespace remat;

struct FakeAllocator {
    Bytes current = 0;
    Bytes peak = 0;
    void allocate(Bytes b) {
        current += b;
        peak = std::max(peak, current);
    }
    void free(Bytes b) { current -= b; }
};

struct FakeProbe {
    FakeAllocator* memory;
    [[nodiscard]] Bytes current() const { return memory->current; }
    [[nodiscard]] Bytes peak() const { return memory->peak; }
    void reset_peak() { memory->peak = memory->current; }
};

// Where a call should fail: the n-th call (from 0) of a kind ("forward", "backward",
// "release", "commit").
struct Fault {
    std::string kind;
    std::size_t at = 0;
};

struct Shared {
    FakeAllocator memory;
    std::vector<std::string> calls;
    std::vector<int> buffers;            // per unit: times its running statistics changed
    std::vector<double> parameter_grads; // committed, per unit
    std::vector<int> draws;              // per unit: the generator's value at its last draw
    std::vector<int> kept;               // per unit: keep_state_for_reruns calls
    int kept_after_a_run = 0;            // of those, calls after the unit had run in the step
    int generator = 0;
    std::optional<Fault> fault;
    std::map<std::string, std::size_t> counts;
    std::vector<char> rollbacks;  // generators_too of each rollback
    std::size_t synchronizations = 0;
    double clock = 0.0;  // advances by one second at each reading
};

class FakeBackend {
public:
    using RngState = int;

    FakeBackend(const Problem& p, const ExecutionTable& t, Shared& shared) : p_(&p), t_(&t), s_(&shared) {
        live_.assign(p.data_count(), 0);
        for (const DataId d : p.initial()) live_[d.index] = 1;
        pending_.assign(t.units, 0.0);
    }
    FakeBackend(FakeBackend&&) noexcept = default;
    FakeBackend& operator=(FakeBackend&&) noexcept = default;

    RngState capture_rng() { return s_->generator; }
    void restore_rng(const RngState& state) { s_->generator = state; }
    [[nodiscard]] bool random(std::size_t unit) const { return unit % 2 == 1; }

    void forward(std::size_t unit, bool with_grad, bool first_run) {
        maybe_fail("forward");
        const OpId op = op_of(unit, with_grad ? ExecOpRole::forward_grad : ExecOpRole::forward);
        s_->calls.push_back(p_->op(op).name);
        for (const DataId d : p_->op(op).writes) write(d);
        transient(p_->op(op).overhead);
        if (random(unit)) s_->draws[unit] = s_->generator++;
        if (first_run) ++s_->buffers[unit];
        ran_.resize(std::max(ran_.size(), unit + 1), 0);
        ran_[unit] = 1;
    }

    void keep_state_for_reruns(std::size_t unit) {
        ++s_->kept[unit];
        if (unit < ran_.size() && ran_[unit]) ++s_->kept_after_a_run;
    }

    void backward(std::size_t unit) {
        maybe_fail("backward");
        const OpId op = op_of(unit, ExecOpRole::backward);
        s_->calls.push_back(p_->op(op).name);
        for (const DataId d : p_->op(op).reads)
            if (!live_[d.index]) throw ExecutionError("backward of unit " + std::to_string(unit) + " found " + p_->data(d).name + " freed");
        for (const DataId d : p_->op(op).writes) write(d);
        // The parameter gradient is part of the op's overhead while it runs (as profiling
        // measures it), and the step's, not the plan's, once it is collected.
        const Bytes gradient = std::min<Bytes>(8, p_->op(op).overhead);
        s_->memory.allocate(gradient);
        transient(p_->op(op).overhead - gradient);
        pending_[unit] += 1.0;
        pending_bytes_ += gradient;
    }

    void release(DataId d) {
        maybe_fail("release");
        s_->calls.push_back("free " + p_->data(d).name);
        if (live_[d.index]) s_->memory.free(p_->data(d).bytes);
        live_[d.index] = 0;
    }

    [[nodiscard]] Bytes pending_gradient_bytes() const { return pending_bytes_; }
    [[nodiscard]] Bytes caller_bytes() const { return 0; }
    void begin_step() {
        saved_buffers_ = s_->buffers;
        saved_generator_ = s_->generator;
    }
    void commit() {
        maybe_fail("commit");
        for (std::size_t u = 0; u < pending_.size(); ++u) s_->parameter_grads[u] += pending_[u];
        drop_pending();
    }
    void rollback(bool generators_too) noexcept {
        s_->rollbacks.push_back(generators_too ? 1 : 0);
        s_->buffers = saved_buffers_;
        if (generators_too) s_->generator = saved_generator_;
    }
    void clear() noexcept {
        if (s_ == nullptr) return;
        for (std::size_t d = 0; d < live_.size(); ++d)
            if (live_[d] && !p_->is_initial(DataId{d})) {
                s_->memory.free(p_->data(DataId{d}).bytes);
                live_[d] = 0;
            }
        drop_pending();
    }
    void synchronize() { ++s_->synchronizations; }
    [[nodiscard]] double now() const { return s_->clock += 1.0; }
    [[nodiscard]] std::string describe(std::size_t unit) const { return " (unit " + std::to_string(unit) + ")"; }

    [[nodiscard]] bool holds(DataId d) const { return live_.at(d.index) != 0; }
    void give_loss_gradient() {
        for (const DataId d : p_->op(*p_->loss()).writes) write(d);
    }

private:
    void maybe_fail(const std::string& kind) {
        const std::size_t n = s_->counts[kind]++;
        if (s_->fault && s_->fault->kind == kind && s_->fault->at == n) throw std::runtime_error("injected " + kind + " fault");
    }
    [[nodiscard]] OpId op_of(std::size_t unit, ExecOpRole role) const {
        for (std::size_t k = 0; k < t_->op_role.size(); ++k)
            if (t_->op_role[k] == role && t_->op_unit[k] == unit) return OpId{k};
        throw InvalidInput("no op for unit " + std::to_string(unit));
    }
    void transient(Bytes b) {
        s_->memory.allocate(b);
        s_->memory.free(b);
    }
    void write(DataId d) {
        if (live_[d.index]) return;
        live_[d.index] = 1;
        s_->memory.allocate(p_->data(d).bytes);
    }
    void drop_pending() {
        s_->memory.free(pending_bytes_);
        pending_bytes_ = 0;
        std::fill(pending_.begin(), pending_.end(), 0.0);
    }

    const Problem* p_;
    const ExecutionTable* t_;
    Shared* s_;
    std::vector<char> live_;
    std::vector<char> ran_;  // per unit: it ran in this step
    std::vector<double> pending_;
    Bytes pending_bytes_ = 0;
    std::vector<int> saved_buffers_;
    int saved_generator_ = 0;
};

static_assert(ExecutionBackend<FakeBackend>);
static_assert(MemoryReader<FakeProbe>);

// The execution table of a chain problem (docs/formats.md §5): unit l for stage l's ops and data.
ExecutionTable chain_table(const Problem& p, std::size_t stages) {
    ExecutionTable t;
    t.units = stages + 1;
    const ChainIds ids = chain_ids(stages);
    t.op_role.assign(p.op_count(), ExecOpRole::forward);
    t.op_unit.assign(p.op_count(), 0);
    t.data_role.assign(p.data_count(), ExecDataRole::activation);
    t.data_unit.assign(p.data_count(), 0);
    for (std::size_t l = 1; l <= stages; ++l) {
        t.op_role[ids.fwd_grad[l].index] = ExecOpRole::forward_grad;
        t.op_role[ids.bwd[l].index] = ExecOpRole::backward;
        for (const OpId k : {ids.fwd[l], ids.fwd_grad[l], ids.bwd[l]}) t.op_unit[k.index] = l;
        t.data_role[ids.s[l].index] = ExecDataRole::saved;
        t.data_unit[ids.s[l].index] = l;
        t.data_unit[ids.a[l].index] = l;
    }
    for (std::size_t l = 0; l <= stages; ++l) {
        t.data_role[ids.g[l].index] = ExecDataRole::gradient;
        t.data_unit[ids.g[l].index] = l;
    }
    t.op_role[ids.loss.index] = ExecOpRole::loss;
    return t;
}

struct Setup {
    Problem problem;
    ExecutionTable table;
    Shared shared;
    std::size_t stages;
};

Setup chain_setup(std::uint32_t seed, std::size_t stages) {
    std::mt19937 rng(seed);
    Chain c = remat::testing::random_chain(rng, stages);
    Problem p = to_problem(c);
    ExecutionTable t = chain_table(p, stages);
    Setup s{std::move(p), std::move(t), {}, stages};
    s.shared.buffers.assign(stages + 1, 0);
    s.shared.parameter_grads.assign(stages + 1, 0.0);
    s.shared.draws.assign(stages + 1, -1);
    s.shared.kept.assign(stages + 1, 0);
    return s;
}

using Engine = Executor<FakeBackend, FakeProbe>;

// A whole step; returns the report.
StepReport run_step(const Engine& engine, Setup& s, const ExecutionPlan& plan) {
    FakeProbe probe{&s.shared.memory};
    auto step = engine.start(plan, FakeBackend(engine.predicting_problem(), engine.table(), s.shared), probe);
    step.forward();
    step.backend().give_loss_gradient();
    step.backward();
    return step.report();
}

}  // namespace

TEST_CASE("executor: a step follows the plan and measures what the simulator predicts", "[executor]") {
    for (std::uint32_t seed = 1; seed <= 20; ++seed) {
        Setup s = chain_setup(seed, 6);
        s.shared.memory.allocate(s.problem.initial_bytes());  // the caller's input
        const Engine engine(s.problem, s.problem, s.table);
        const Reference ref = store_all_reference(s.problem);
        for (const Bytes budget : {ref.peak, ref.peak * 2 / 3, ref.peak / 2}) {
            INFO("seed " << seed << ", budget " << budget);
            Plan plan;
            try {
                plan = Rotor{}.solve(s.problem, budget);
            } catch (const Infeasible&) {
                continue;
            }
            const ExecutionPlan prepared = engine.prepare(plan);
            const Bytes start = s.shared.memory.current;
            const std::vector<int> buffers_before = s.shared.buffers;
            const StepReport r = run_step(engine, s, prepared);
            CHECK(r.completed);
            CHECK(r.measured_peak == r.predicted_peak);
            const auto& timeline = prepared.simulation().timeline;
            for (std::size_t i = 0; i < timeline.size(); ++i) {
                if (r.measured_timeline[i] < 0) continue;  // the loss
                const Bytes expected = plan.schedule[i].is_run() ? timeline[i].during : timeline[i].after;
                CHECK(r.measured_timeline[i] == expected);
            }
            CHECK(s.shared.memory.current == start);  // everything went back
            for (std::size_t u = 1; u <= s.stages; ++u) CHECK(s.shared.buffers[u] == buffers_before[u] + 1);
            CHECK(r.forward_runs >= s.stages);
        }
        for (std::size_t u = 1; u <= s.stages; ++u) CHECK(s.shared.parameter_grads[u] > 0.0);
    }
}

TEST_CASE("executor: the device is waited for at the end of each phase, after each op only when ops are timed",
          "[executor]") {
    Setup s = chain_setup(3, 5);
    s.shared.memory.allocate(s.problem.initial_bytes());
    const Engine engine(s.problem, s.problem, s.table);
    const Reference ref = store_all_reference(s.problem);
    const ExecutionPlan plan = engine.prepare(Rotor{}.solve(s.problem, ref.peak * 2 / 3));
    const auto& schedule = plan.schedule();
    const auto runs = static_cast<std::size_t>(
        std::count_if(schedule.begin(), schedule.end(), [&](const Step& step) {
            return step.is_run() && step.op() != *s.problem.loss();
        }));
    for (const bool timed : {false, true}) {
        INFO("time_each_op " << timed);
        s.shared.synchronizations = 0;
        FakeProbe probe{&s.shared.memory};
        auto step = engine.start(plan, FakeBackend(engine.predicting_problem(), engine.table(), s.shared), probe);
        step.time_each_op(timed);
        step.forward();
        CHECK_THROWS_AS(step.time_each_op(!timed), ExecutionError);  // only before the forward
        step.backend().give_loss_gradient();
        step.backward();
        CHECK(step.report().completed);
        CHECK(step.report().measured_peak == step.report().predicted_peak);  // the same memory either way
        if (!timed) {
            CHECK(s.shared.synchronizations == 2);
            CHECK(step.step_seconds().empty());
            continue;
        }
        // Every op the engine really runs is waited for before and after, and timed (one
        // reading before, one after: one second on the fake clock); a forward whose outputs
        // are live runs nothing.
        CHECK(s.shared.synchronizations >= 2 + 2 * s.stages);
        CHECK(s.shared.synchronizations <= 2 + 2 * runs);
        REQUIRE(step.step_seconds().size() == schedule.size());
        std::size_t timed_ops = 0;
        for (std::size_t i = 0; i < schedule.size(); ++i) {
            const double seconds = step.step_seconds()[i];
            if (!schedule[i].is_run()) CHECK(seconds == 0.0);
            if (seconds > 0.0) {
                CHECK(seconds == 1.0);
                ++timed_ops;
            }
        }
        CHECK(2 * timed_ops == s.shared.synchronizations - 2);
    }
}

TEST_CASE("executor: recomputations replay the first run's random numbers", "[executor]") {
    Setup s = chain_setup(5, 5);
    s.shared.memory.allocate(s.problem.initial_bytes());
    const Engine engine(s.problem, s.problem, s.table);
    // Every forward without grad first, then each stage's forward again with grad before its
    // backward: every stage runs twice.
    const ChainIds ids = chain_ids(s.stages);
    Schedule schedule;
    for (std::size_t l = 1; l <= s.stages; ++l) schedule.push_back(Step::run(ids.fwd[l]));
    schedule.push_back(Step::run(ids.loss));
    for (std::size_t l = s.stages; l >= 1; --l) {
        schedule.push_back(Step::free(ids.a[l]));
        schedule.push_back(Step::run(ids.fwd_grad[l]));
        schedule.push_back(Step::run(ids.bwd[l]));
        schedule.push_back(Step::free(ids.s[l]));
        schedule.push_back(Step::free(ids.a[l]));
        schedule.push_back(Step::free(ids.g[l]));
    }
    const ExecutionPlan plan = engine.prepare(schedule);
    FakeProbe probe{&s.shared.memory};
    auto step = engine.start(plan, FakeBackend(s.problem, s.table, s.shared), probe);
    step.forward();
    const std::vector<int> first = s.shared.draws;
    const int generator_after_forward = s.shared.generator;
    step.backend().give_loss_gradient();
    step.backward();
    CHECK(s.shared.draws == first);                          // the same numbers again
    CHECK(s.shared.generator == generator_after_forward);    // and the sequence put back
    for (std::size_t u = 1; u <= s.stages; ++u) CHECK(s.shared.buffers[u] == 1);  // once per step
    CHECK(step.report().forward_runs == 2 * s.stages);
    // KeepsStateForReruns: once per unit run twice, before its first run; never in a step
    // that runs every unit once.
    for (std::size_t u = 1; u <= s.stages; ++u) CHECK(s.shared.kept[u] == 1);
    CHECK(s.shared.kept_after_a_run == 0);
    s.shared.kept.assign(s.stages + 1, 0);
    (void)run_step(engine, s, engine.prepare(StoreAll{}.solve(s.problem, Bytes{1} << 40)));
    for (std::size_t u = 1; u <= s.stages; ++u) CHECK(s.shared.kept[u] == 0);
}

// The chain's problem with its forwards without grad given `extra` bytes more overhead than
// those with grad, as a captured group whose intermediates autograd saves has.
Problem with_no_grad_overhead(const Problem& p, std::size_t stages, Bytes extra) {
    const ChainIds ids = chain_ids(stages);
    std::vector<Bytes> overhead;
    for (const Op& op : p.all_ops()) overhead.push_back(op.overhead);
    for (std::size_t l = 1; l <= stages; ++l) overhead[ids.fwd[l].index] += extra;
    return p.with_overheads(overhead);
}

TEST_CASE("executor: a forward with grad whose saved state is live runs as the simulator counts it", "[executor]") {
    // Stage 1's forward with grad runs again before the backward of stage 2, which reads a_1,
    // while s_1 is still live. Rewriting a_1 without grad keeps s_1 but pays the forward
    // without grad's overhead; the simulator counts the forward with grad's. The engine runs
    // without grad only when that costs no more, and otherwise rewrites s_1 too.
    for (const Bytes extra : {Bytes{0}, Bytes{4096}}) {
        INFO("extra overhead without grad: " << extra);
        Setup s = chain_setup(3, 3);
        s.problem = with_no_grad_overhead(s.problem, s.stages, extra);
        s.shared.memory.allocate(s.problem.initial_bytes());
        const Engine engine(s.problem, s.problem, s.table);
        const ChainIds ids = chain_ids(s.stages);
        Schedule schedule;
        for (std::size_t l = 1; l <= s.stages; ++l) schedule.push_back(Step::run(ids.fwd_grad[l]));
        schedule.push_back(Step::free(ids.a[1]));
        schedule.push_back(Step::run(ids.loss));
        for (std::size_t l = s.stages; l >= 1; --l) {
            if (l == 2) schedule.push_back(Step::run(ids.fwd_grad[1]));
            schedule.push_back(Step::run(ids.bwd[l]));
            schedule.push_back(Step::free(ids.s[l]));
            schedule.push_back(Step::free(ids.a[l]));
            schedule.push_back(Step::free(ids.g[l]));
        }
        const ExecutionPlan plan = engine.prepare(schedule);
        const std::size_t before = s.shared.calls.size();
        const StepReport r = run_step(engine, s, plan);
        CHECK(r.completed);
        const auto& timeline = plan.simulation().timeline;
        for (std::size_t i = 0; i < timeline.size(); ++i) {
            if (r.measured_timeline[i] < 0) continue;
            INFO("step " << i << " " << describe(s.problem, schedule[i]));
            const Bytes expected = schedule[i].is_run() ? timeline[i].during : timeline[i].after;
            if (extra > 0)
                CHECK(r.measured_timeline[i] == expected);
            else
                CHECK(r.measured_timeline[i] <= expected);
        }
        CHECK(r.measured_peak <= r.predicted_peak);
        // Which forward the recomputation ran: without grad when it costs no more.
        const std::vector<std::string> calls(s.shared.calls.begin() + static_cast<std::ptrdiff_t>(before), s.shared.calls.end());
        const std::string rerun = extra > 0 ? s.problem.op(ids.fwd_grad[1]).name : s.problem.op(ids.fwd[1]).name;
        CHECK(std::count(calls.begin(), calls.end(), rerun) == (extra > 0 ? 2 : 1));
        if (extra > 0) CHECK(std::count(calls.begin(), calls.end(), "free " + s.problem.data(ids.s[1]).name) == 2);
    }
}

TEST_CASE("executor: a failure at any call rolls back, names the step and leaks nothing", "[executor]") {
    Setup base = chain_setup(9, 5);
    const Reference ref = store_all_reference(base.problem);
    const Plan plan = Rotor{}.solve(base.problem, ref.peak * 2 / 3);
    std::size_t scenarios = 0;
    for (const std::string kind : {"forward", "backward", "release", "commit"}) {
        for (std::size_t at = 0; at < 20; ++at) {
            Setup s = chain_setup(9, 5);
            s.shared.memory.allocate(s.problem.initial_bytes());
            const Engine engine(s.problem, s.problem, s.table);
            const ExecutionPlan prepared = engine.prepare(plan);
            s.shared.fault = Fault{kind, at};
            const Bytes start = s.shared.memory.current;
            const int generator_before = s.shared.generator;
            FakeProbe probe{&s.shared.memory};
            auto step = engine.start(prepared, FakeBackend(s.problem, s.table, s.shared), probe);
            bool failed = false;
            bool in_forward = false;
            try {
                step.forward();
                step.backend().give_loss_gradient();
                step.backward();
            } catch (const ExecutionError& e) {
                failed = true;
                in_forward = std::string(e.what()).find("forward phase") != std::string::npos;
                const std::string what = e.what();
                CHECK(what.find("step ") == 0);
                CHECK(what.find("injected " + kind + " fault") != std::string::npos);
                if (kind == "forward" || kind == "backward") CHECK(what.find("(unit ") != std::string::npos);
            }
            if (!failed) continue;  // fewer calls of this kind than `at`
            ++scenarios;
            INFO(kind << " fault at call " << at);
            CHECK(step.phase() == StepPhase::failed);
            CHECK(s.shared.memory.current == start);
            REQUIRE(s.shared.rollbacks.size() == 1);
            CHECK((s.shared.rollbacks[0] != 0) == in_forward);
            if (in_forward) CHECK(s.shared.generator == generator_before);
            for (std::size_t u = 0; u <= s.stages; ++u) {
                CHECK(s.shared.buffers[u] == 0);
                CHECK(s.shared.parameter_grads[u] == 0.0);  // nothing handed over
            }
            CHECK_THROWS_AS(step.backward(), ExecutionError);
        }
    }
    CHECK(scenarios >= 20);
}

TEST_CASE("executor: phases in order, abort between them, plans checked", "[executor]") {
    Setup s = chain_setup(3, 4);
    s.shared.memory.allocate(s.problem.initial_bytes());
    const Engine engine(s.problem, s.problem, s.table);
    const ExecutionPlan plan = engine.prepare(store_all_reference(s.problem).schedule);
    FakeProbe probe{&s.shared.memory};
    {
        auto step = engine.start(plan, FakeBackend(s.problem, s.table, s.shared), probe);
        CHECK_THROWS_WITH(step.backward(), Catch::Contains("before forward()"));
        step.forward();
        CHECK_THROWS_WITH(step.forward(), Catch::Contains("already called"));
        const Bytes before = s.problem.initial_bytes();
        step.abort();
        CHECK(step.phase() == StepPhase::failed);
        CHECK(s.shared.memory.current == before);
        CHECK(s.shared.rollbacks.back() == 0);  // the caller may have drawn numbers since
        for (std::size_t u = 0; u <= s.stages; ++u) CHECK(s.shared.buffers[u] == 0);
    }
    Schedule broken = plan.schedule();
    broken.erase(broken.begin());
    CHECK_THROWS_AS(engine.prepare(broken), InvalidInput);
    ExecutionTable wrong = s.table;
    wrong.op_role.pop_back();
    CHECK_THROWS_AS(Engine(s.problem, s.problem, wrong), InvalidInput);
}
