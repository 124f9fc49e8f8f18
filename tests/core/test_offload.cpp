// Offloading (docs/formats.md §11): the problem fields, the simulator's figures by hand, the
// training state split, Greedy and Greedy* against an exhaustive search, and the combined
// planner.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include "../support/offload_problems.hpp"
#include "../support/random_problems.hpp"

using namespace remat;
using namespace remat::offload;

namespace {

OffloadSchedule steps(const Problem& p, std::vector<std::string> on_host,
                      std::initializer_list<std::pair<TransferStep::Kind, const char*>> list) {
    OffloadSchedule s;
    for (const auto& name : on_host) s.start_on_host.push_back(p.data_id(name));
    using K = TransferStep::Kind;
    for (const auto& [kind, name] : list) {
        switch (kind) {
            case K::run: s.steps.push_back(TransferStep::run(p.op_id(name))); break;
            case K::free: s.steps.push_back(TransferStep::free(p.data_id(name))); break;
            case K::offload: s.steps.push_back(TransferStep::offload(p.data_id(name))); break;
            case K::prefetch: s.steps.push_back(TransferStep::prefetch(p.data_id(name))); break;
            case K::free_host: s.steps.push_back(TransferStep::free_host(p.data_id(name))); break;
        }
    }
    return s;
}
constexpr auto Run = TransferStep::Kind::run;
constexpr auto Free = TransferStep::Kind::free;
constexpr auto Off = TransferStep::Kind::offload;
constexpr auto Pre = TransferStep::Kind::prefetch;
constexpr auto FreeHost = TransferStep::Kind::free_host;

// The schedule of docs/formats.md §11's worked example.
OffloadSchedule example(const Problem& p) {
    return steps(p, {"m"},
                 {{Run, "F"}, {Off, "w"}, {Run, "loss"}, {Free, "h"}, {Free, "w"}, {Pre, "w"}, {Pre, "m"}, {Run, "B"},
                  {Free, "gh"}, {Run, "U"}, {Free, "gw"}, {Off, "m"}, {Free, "m"}, {FreeHost, "w"}});
}

}  // namespace

TEST_CASE("offload simulator: device and host peaks, makespan, overlap and stalls by hand", "[offload]") {
    const Problem p = testing::one_layer_training();
    const OffloadReport r = simulate(p, example(p));
    INFO(r.error);
    REQUIRE(r.valid);
    CHECK(r.device_initial == 110);  // x + w; m starts on the host
    CHECK(r.host_initial == 200);
    CHECK(r.device_peak == 470);  // during B: x w m gh gx gw
    CHECK(r.host_peak == 300);    // m and w's copy
    CHECK(r.compute_time == 7.0);
    // The free of w waits for its offload (2 → 4); B waits for w's prefetch (4 → 5); the free
    // of m waits for its offload after U (10 → 14).
    CHECK(r.makespan == 14.0);
    CHECK(r.stall_time() == 7.0);
    CHECK(r.bytes_to_host == 300);
    CHECK(r.bytes_to_device == 300);
    REQUIRE(r.timeline.size() == 14);
    CHECK(r.timeline[1].start == 2.0);  // the offload starts after F
    CHECK(r.timeline[1].end == 4.0);
    CHECK(r.timeline[4].start == 4.0);  // the free of w, after the offload
    CHECK(r.timeline[6].start == 5.0);  // m's prefetch queues behind w's
    CHECK(r.timeline[6].end == 7.0);
    CHECK(r.timeline[7].start == 5.0);  // B starts when w is back, overlapping m's prefetch
    CHECK(r.timeline[7].device_during == 470);
    CHECK(r.timeline[11].start == 10.0);
    CHECK(r.timeline[13].host_after == 200);
    CHECK(r.fits(470, 300));
    CHECK_FALSE(r.fits(469, std::nullopt));
    CHECK_FALSE(r.fits(470, 299));
}

TEST_CASE("offload simulator: peaks do not depend on bandwidth, time does", "[offload]") {
    const Problem p = testing::one_layer_training();
    const OffloadReport fast = simulate(p, example(p), TransferSettings{std::nullopt, 0.0, 0.0});  // instantaneous
    REQUIRE(fast.valid);
    CHECK(fast.device_peak == 470);
    CHECK(fast.host_peak == 300);
    CHECK(fast.makespan == 7.0);
}

TEST_CASE("offload simulator: every invalid step says why", "[offload]") {
    const Problem p = testing::one_layer_training();
    const auto error = [&](const OffloadSchedule& s) {
        const OffloadReport r = simulate(p, s);
        CHECK_FALSE(r.valid);
        return r.error;
    };
    CHECK_THAT(error(steps(p, {}, {{Free, "w"}})), Catch::Contains("only copy"));
    CHECK_THAT(error(steps(p, {}, {{Pre, "w"}})), Catch::Contains("already live"));
    CHECK_THAT(error(steps(p, {}, {{Off, "w"}, {Free, "w"}, {Run, "F"}})), Catch::Contains("prefetch it first"));
    CHECK_THAT(error(steps(p, {}, {{Off, "x"}})), Catch::Contains("not offloadable"));
    CHECK_THAT(error(steps(p, {}, {{Off, "w"}, {Off, "w"}})), Catch::Contains("already has a current host copy"));
    CHECK_THAT(error(steps(p, {"m"}, {{FreeHost, "m"}})), Catch::Contains("only copy"));
    CHECK_THAT(error(steps(p, {}, {{FreeHost, "w"}})), Catch::Contains("no host copy"));
    CHECK_THAT(error(steps(p, {}, {{Pre, "h"}})), Catch::Contains("not offloadable"));
    CHECK_THAT(error(steps(p, {"h"}, {})), Catch::Contains("not initial"));
    CHECK_THAT(error(steps(p, {"m", "m"}, {})), Catch::Contains("twice"));
    // A stale host copy: offloaded before the update.
    CHECK_THAT(error(steps(p, {}, {{Run, "F"}, {Run, "loss"}, {Run, "B"}, {Off, "w"}, {Run, "U"}, {Free, "w"}})),
               Catch::Contains("only copy"));
    CHECK_THAT(error(steps(p, {}, {{Run, "F"}, {Run, "loss"}, {Run, "B"}, {Off, "m"}, {Run, "U"}, {Free, "gw"},
                                   {Off, "w"}, {Free, "w"}, {Pre, "m"}})),
               Catch::Contains("already live"));
    // Reading the weight after its update.
    CHECK_THAT(error(steps(p, {}, {{Run, "F"}, {Run, "loss"}, {Run, "B"}, {Run, "U"}, {Free, "h"}, {Run, "F"}})),
               Catch::Contains("after op 'U' updated it"));
    // The end: m started on the host and must end there; w started on the device.
    const auto end = steps(p, {"m"}, {{Run, "F"}, {Run, "loss"}, {Pre, "m"}, {Run, "B"}, {Run, "U"}});
    CHECK_THAT(error(end), Catch::Contains("must end there"));
    CHECK_THAT(error(steps(p, {}, {{Run, "F"}, {Run, "loss"}, {Run, "B"}, {Run, "U"}, {Off, "w"}})),
               Catch::Contains("free_host it"));
}

TEST_CASE("offload simulator: run and free steps alone give simulate()'s figures", "[offload]") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; ++trial) {
        const Problem p = testing::random_dag(rng, {});
        const Plan plan = StoreAll{}.solve(p, std::numeric_limits<Bytes>::max());
        const SimulationReport base = remat::simulate(p, plan.schedule);
        const OffloadReport r = simulate(p, with_no_transfers(plan.schedule));
        REQUIRE(r.valid);
        CHECK(r.device_peak == base.peak);
        CHECK(r.makespan == Approx(base.time));
        CHECK(r.host_peak == 0);
    }
}

TEST_CASE("problem/2 fields: updates are checked by the builder and the autograd order", "[offload]") {
    ProblemBuilder b("bad");
    const DataId x = b.add_data("x", 1), y = b.add_data("y", 1);
    b.add_initial(x);
    OpSpec not_once{"U", 1, 0, {x}, {y}, false};
    not_once.updates = {x};
    CHECK_THROWS_WITH(b.add_op(not_once), Catch::Contains("must be exactly_once"));
    OpSpec non_initial{"V", 1, 0, {x}, {y}, true};
    non_initial.updates = {y};
    CHECK_THROWS_WITH(b.add_op(non_initial), Catch::Contains("both writes and updates"));
    const Problem p = testing::one_layer_training();
    CHECK(p.uses_transfer_fields());
    CHECK(p.updater(p.data_id("w")) == p.op_id("U"));
    CHECK_FALSE(p.updater(p.data_id("x")));
    CHECK_FALSE(to_problem(testing::random_chain(*std::make_unique<std::mt19937>(1), 3)).uses_transfer_fields());
    // Store-all runs the update after every reader of what it updates.
    const auto order = store_all_order(p);
    CHECK(order.back() == p.op_id("U"));
}

TEST_CASE("training state: a chain's training problem splits back into the chain", "[offload]") {
    std::mt19937 rng(3);
    const Chain chain = testing::random_chain(rng, 5);
    const std::vector<Bytes> params{64, 0, 128, 32, 16};
    const Problem full = training_problem(chain, params);
    CHECK(full.uses_transfer_fields());
    const TrainingSplit split = split_training_state(full);
    CHECK(split.activations == to_problem(chain));
    REQUIRE(as_chain(split.activations));
    const Plan rotor = Rotor{}.solve(split.activations, store_all_reference(split.activations).peak);
    const Schedule plan = with_training_state(full, split, rotor.schedule);
    const SimulationReport r = remat::simulate(full, plan);
    INFO(r.error);
    REQUIRE(r.valid);
    // Each update right after its backward and the frees that follow it (the backward's
    // saved state first), each gradient freed after its update.
    for (std::size_t i = 0; i + 1 < plan.size(); ++i) {
        if (!plan[i].is_run() || full.op(plan[i].op()).name != "B3") continue;
        std::size_t next = i + 1;
        while (next < plan.size() && plan[next].is_free()) ++next;
        REQUIRE(next < plan.size());
        CHECK(full.op(plan[next].op()).name == "U3");
        CHECK(next > i + 1);
    }
}

namespace {

// The least bytes any set of absences transfers to fit `budget` with infinite bandwidth
// (every subset of every data's gaps), or nullopt when none fits.
std::optional<Bytes> exhaustive_transfers(const Problem& p, const Schedule& plan, Bytes budget) {
    const SimulationReport base = remat::simulate(p, plan);
    offload::detail::greedy::Selection s = offload::detail::greedy::find_gaps(p, plan, base, budget);
    const std::size_t n = s.gaps.size();
    REQUIRE(n <= 14);
    std::optional<Bytes> best;
    for (std::size_t mask = 0; mask < (std::size_t{1} << n); ++mask) {
        std::vector<Bytes> excess = s.excess;
        for (std::size_t g = 0; g < n; ++g) {
            s.gaps[g].chosen = (mask >> g) & 1;
            if (!s.gaps[g].chosen) continue;
            for (const auto& [first, last] : s.gaps[g].ranges)
                for (std::size_t i = first; i <= last && i < excess.size(); ++i) excess[i] -= p.data(DataId{s.gaps[g].data}).bytes;
        }
        if (std::any_of(excess.begin(), excess.end(), [](Bytes e) { return e > 0; })) continue;
        Bytes bytes = 0;
        for (std::size_t d = 0; d < p.data_count(); ++d) bytes += offload::detail::greedy::transferred(p, s, d, std::nullopt);
        if (!best || bytes < *best) best = bytes;
    }
    return best;
}

}  // namespace

TEST_CASE("Greedy and Greedy*: valid, within budget, and Greedy* fits wherever an exhaustive search does", "[offload]") {
    std::mt19937 rng(11);
    std::size_t cases = 0, optimal = 0;
    double worst = 1.0;
    for (int trial = 0; trial < 40; ++trial) {
        const Chain chain = testing::random_chain(rng, 3);
        std::vector<Bytes> params;
        std::uniform_int_distribution<int> size(1, 10);
        for (std::size_t l = 0; l < chain.length(); ++l) params.push_back(size(rng) * 16);
        const Problem full = training_problem(chain, params, {1.0, 0.01, true});
        const TrainingSplit split = split_training_state(full);
        const Plan store_all = StoreAll{}.solve(split.activations, std::numeric_limits<Bytes>::max());
        const Schedule plan = with_training_state(full, split, store_all.schedule);
        const Bytes peak = remat::simulate(full, plan).peak;
        for (const int percent : {95, 80, 65, 50, 35}) {
            const Bytes budget = peak * percent / 100;
            const auto optimum = exhaustive_transfers(full, plan, budget);
            for (const GreedyVariant v : {GreedyVariant::once, GreedyVariant::repeated}) {
                const auto schedule = offload_weights(full, plan, budget, {v, TransferSettings{std::nullopt, 8.0, 8.0}});
                if (v == GreedyVariant::repeated) CHECK(schedule.has_value() == optimum.has_value());
                if (!schedule) continue;
                const OffloadReport r = simulate(full, *schedule);
                INFO(r.error);
                REQUIRE(r.valid);
                CHECK(r.device_peak <= budget);
                if (v == GreedyVariant::repeated && optimum) {
                    const Bytes bytes = r.bytes_to_host + r.bytes_to_device;
                    CHECK(bytes >= *optimum);
                    ++cases;
                    optimal += bytes == *optimum;
                    if (*optimum > 0) worst = std::max(worst, double(bytes) / double(*optimum));
                }
            }
        }
    }
    WARN("Greedy* transfers the exhaustive minimum in " << optimal << " of " << cases << " cases; worst ratio " << worst);
    CHECK(cases > 50);
}

TEST_CASE("combined planner: fits, and is never worse than rematerialization or weight offloading alone", "[offload]") {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 12; ++trial) {
        const Chain chain = testing::random_chain(rng, 6);
        std::vector<Bytes> params;
        std::uniform_int_distribution<int> size(2, 12);
        for (std::size_t l = 0; l < chain.length(); ++l) params.push_back(size(rng) * 16);
        const Problem full = training_problem(chain, params, {2.0, 0.005, true});
        const Bytes reference = store_all_reference(full).peak;
        const CombinedOptions options{GreedyVariant::repeated, 8, TransferSettings{std::nullopt, 40.0, 40.0}};
        for (const int percent : {90, 70, 50, 35}) {
            const Bytes budget = reference * percent / 100;
            const auto remat_only = plan_remat_only(full, budget, Rotor{}, options);
            const auto offload_only = plan_offload_only(full, budget, options);
            const auto combined = plan_with_offload(full, budget, Rotor{}, options);
            CHECK(combined.has_value() == (combined || remat_only || offload_only));
            if (!combined) continue;
            INFO(combined->report.error);
            REQUIRE(combined->report.valid);
            CHECK(combined->report.device_peak <= budget);
            CHECK(combined->report.device_peak >= device_memory_lower_bound(full));
            if (remat_only) CHECK(combined->report.makespan <= remat_only->report.makespan);
            if (offload_only) CHECK(combined->report.makespan <= offload_only->report.makespan);
        }
    }
}

TEST_CASE("device memory lower bound: no plan goes below it, and it is reached on a single op", "[offload]") {
    // One stage with 100 B of weights (and 100 B of gradient, 100 B of momentum): its update
    // holds all three, and every schedule runs it once.
    const Chain chain{"one", 8, {{"s1", 1.0, 2.0, 8, 16, 0, 0}}};
    const std::vector<Bytes> params{100};
    const Problem full = training_problem(chain, params, {1.0, 0.0, true, TransferSettings{std::nullopt, 1e3, 1e3}});
    const Bytes bound = device_memory_lower_bound(full);
    CHECK(bound >= 300);
    CHECK_FALSE(plan_with_offload(full, bound - 1, Rotor{}));
    std::mt19937 rng(9);
    for (int trial = 0; trial < 8; ++trial) {
        const Chain random = testing::random_chain(rng, 5);
        std::vector<Bytes> sizes;
        for (std::size_t l = 0; l < random.length(); ++l) sizes.push_back(16 * (1 + static_cast<Bytes>(l % 3)));
        const Problem p = training_problem(random, sizes, {1.0, 0.0, true, TransferSettings{std::nullopt, 40.0, 40.0}});
        CHECK_FALSE(plan_with_offload(p, device_memory_lower_bound(p) - 1, Rotor{}));
    }
}

TEST_CASE("activation offloading: stage outputs and saved states leave the device between their uses", "[offload]") {
    std::mt19937 rng(21);
    std::size_t fitted = 0, with_activations = 0, weights_fitted = 0;
    for (int trial = 0; trial < 40; ++trial) {
        const Chain chain = testing::random_chain(rng, 2);
        const std::vector<Bytes> params{32, 48};
        offload::TrainingStateOptions options{1.0, 0.01, true, TransferSettings{std::nullopt, 8.0, 8.0}};
        options.offloadable_activations = true;
        const Problem full = training_problem(chain, params, options);
        const TrainingSplit split = split_training_state(full);
        CHECK(split.activations == to_problem(chain));  // the flags stay with the full problem
        const Plan store_all = StoreAll{}.solve(split.activations, std::numeric_limits<Bytes>::max());
        const Schedule plan = with_training_state(full, split, store_all.schedule);
        const Bytes peak = remat::simulate(full, plan).peak;
        for (const int percent : {80, 60, 45}) {
            const Bytes budget = peak * percent / 100;
            const auto optimum = exhaustive_transfers(full, plan, budget);
            const auto schedule = offload_weights(full, plan, budget, {GreedyVariant::repeated, std::nullopt});
            CHECK(schedule.has_value() == optimum.has_value());
            // The same step with weights alone offloadable.
            options.offloadable_activations = false;
            const Problem weights_only = training_problem(chain, params, options);
            options.offloadable_activations = true;
            const Schedule plan_weights = with_training_state(weights_only, split_training_state(weights_only), store_all.schedule);
            if (offload_weights(weights_only, plan_weights, budget, {GreedyVariant::repeated, std::nullopt})) ++weights_fitted;
            if (!schedule) continue;
            const OffloadReport r = simulate(full, *schedule);
            INFO(r.error);
            REQUIRE(r.valid);
            CHECK(r.device_peak <= budget);
            ++fitted;
            for (const TransferStep& step : schedule->steps)
                if (step.kind() == TransferStep::Kind::offload && !full.is_initial(step.data())) {
                    ++with_activations;
                    break;
                }
        }
    }
    WARN("activation offloading fits " << fitted << " of 120 budgets, weights alone " << weights_fitted);
    CHECK(fitted > weights_fitted);
    CHECK(with_activations > 0);
}

TEST_CASE("training state: an update that reads an activation keeps it live until the update", "[offload]") {
    ProblemBuilder b("update-reads-h");
    const DataId x = b.add_data("x", 10), w = b.add_data("w", 100, true);
    const DataId h = b.add_data("h", 50), gh = b.add_data("gh", 50), gx = b.add_data("gx", 10);
    const DataId gw = b.add_data("gw", 100), u = b.add_data("u", 0);
    b.add_op({"F", 2, 0, {x, w}, {h}, false});
    b.add_op({"loss", 0, 0, {h}, {gh}, true});
    b.add_op({"B", 4, 0, {gh, x, w}, {gx, gw}, true});
    OpSpec update{"U", 1, 0, {gw, h}, {u}, true};  // reads the activation h too
    update.updates = {w};
    b.add_op(std::move(update));
    for (const DataId d : {x, w}) b.add_initial(d);
    b.add_final(gx);
    b.add_final(u);
    const Problem full = b.build();
    const TrainingSplit split = split_training_state(full);
    const Plan store_all = StoreAll{}.solve(split.activations, std::numeric_limits<Bytes>::max());
    const Schedule plan = with_training_state(full, split, store_all.schedule);
    const SimulationReport r = remat::simulate(full, plan);
    INFO(r.error);
    REQUIRE(r.valid);
    // h is freed once, after U.
    std::size_t frees_of_h = 0, at = 0, update_at = 0;
    for (std::size_t i = 0; i < plan.size(); ++i) {
        if (plan[i].is_free() && plan[i].data() == h) ++frees_of_h, at = i;
        if (plan[i].is_run() && plan[i].op() == full.op_id("U")) update_at = i;
    }
    CHECK(frees_of_h == 1);
    CHECK(at > update_at);
}

TEST_CASE("caller's optimizer: gradients are final, updates take no time, and weights stay on the device between steps",
          "[offload]") {
    std::mt19937 rng(11);
    int offloading_plans = 0;
    for (int trial = 0; trial < 12; ++trial) {
        const Chain chain = testing::random_chain(rng, 5);
        std::vector<Bytes> params;
        std::uniform_int_distribution<int> size(4, 16);
        for (std::size_t l = 0; l < chain.length(); ++l) params.push_back(size(rng) * 16);
        TrainingStateOptions state{2.0, 0.01, true};
        state.gradients_to_caller = true;
        const Problem full = training_problem(chain, params, state);
        for (std::size_t l = 1; l <= chain.length(); ++l) {
            const std::string n = std::to_string(l);
            CHECK(full.is_final(full.data_id("gw" + n)));
            CHECK_FALSE(full.find_data("m" + n));
            CHECK(full.op(full.op_id("U" + n)).time == 0.0);
        }
        const Bytes reference = store_all_reference(full).peak;
        CombinedOptions options{GreedyVariant::repeated, 8, TransferSettings{std::nullopt, 40.0, 40.0}};
        options.between_steps = false;
        for (const int percent : {90, 70, 50}) {
            const Bytes budget = reference * percent / 100;
            const auto plan = plan_with_offload(full, budget, Rotor{}, options);
            if (!plan) continue;
            INFO("trial " << trial << " at " << percent << " %: " << plan->report.error);
            REQUIRE(plan->report.valid);
            CHECK(plan->report.device_peak <= budget);
            CHECK(plan->schedule.start_on_host.empty());
            offloading_plans += plan->report.offloads > 0;
        }
    }
    CHECK(offloading_plans > 0);  // the weights still leave the device inside the step
}

TEST_CASE("training state of any graph: weights of random DAGs, planned with offloading, split back into the DAG",
          "[offload]") {
    std::mt19937 rng(29);
    int offloading_plans = 0;
    for (int trial = 0; trial < 10; ++trial) {
        const Problem dag = testing::random_dag(rng, testing::DagShape{6});
        // Weights of the first forward ops: read by their forwards and backward, whose
        // backward writes the gradient.
        std::vector<WeightUse> weights;
        std::uniform_int_distribution<int> size(4, 16);
        for (std::size_t i = 1; i <= 3; ++i) {
            const std::string n = std::to_string(i);
            const OpId backward = dag.op_id("B" + n);
            std::vector<OpId> readers{dag.op_id("F" + n + "+"), backward};
            if (const auto no_grad = dag.find_op("F" + n)) readers.push_back(*no_grad);
            weights.push_back({"layer" + n, size(rng) * 16, readers, backward});
        }
        TrainingStateOptions state;
        state.gradients_to_caller = true;
        state.transfers = TransferSettings{std::nullopt, 40.0, 40.0};
        const Problem full = training_problem(dag, weights, state);
        INFO("trial " << trial);
        // The DAG keeps its ids; the weights come after.
        const TrainingSplit split = split_training_state(full);
        CHECK(split.activations == dag);
        CHECK(full.find_data("w:layer1"));
        CHECK(full.is_final(full.data_id("gw:layer2")));
        CHECK(full.op(full.op_id("U:layer3")).time == 0.0);
        const auto& w1 = full.op(full.op_id("B1")).reads;
        CHECK(std::find(w1.begin(), w1.end(), full.data_id("w:layer1")) != w1.end());
        CHECK_NOTHROW(check_training_problem(full, dag));

        const Bytes reference = store_all_reference(full).peak;
        CombinedOptions options{GreedyVariant::repeated, 4, std::nullopt};
        options.between_steps = false;
        for (const int percent : {90, 75, 60}) {
            const Bytes budget = reference * percent / 100;
            // The fast greedy: the combined planner runs the solver at every activation budget.
            const auto plan = plan_with_offload(full, budget, Greedy{}, options);
            if (!plan) continue;
            INFO(percent << " %: " << plan->report.error);
            REQUIRE(plan->report.valid);
            CHECK(plan->report.device_peak <= budget);
            offloading_plans += plan->report.offloads > 0;
        }
    }
    CHECK(offloading_plans > 0);

    // What the executor's adapter refuses, and what the builder refuses.
    std::mt19937 again(29);
    const Problem dag = testing::random_dag(again, testing::DagShape{6});
    const std::vector<WeightUse> one{{"layer1", 64, {dag.op_id("F1+"), dag.op_id("B1")}, dag.op_id("B1")}};
    const Problem in_step_optimizer = training_problem(dag, one);  // gradients freed inside the step
    CHECK_THROWS_WITH(check_training_problem(in_step_optimizer, dag), Catch::Contains("gradients_to_caller"));
    CHECK_THROWS_WITH(check_training_problem(in_step_optimizer, to_problem(testing::random_chain(again, 3))),
                      Catch::Contains("is not"));
    const std::vector<WeightUse> bad{{"ghost", 64, {OpId{dag.op_count() + 3}}, dag.op_id("B1")}};
    CHECK_THROWS_WITH(training_problem(dag, bad), Catch::Contains("weight 'ghost'"));
    const std::vector<WeightUse> empty{{"empty", 0, {dag.op_id("B1")}, dag.op_id("B1")}};
    CHECK_THROWS_WITH(training_problem(dag, empty), Catch::Contains("leave out weights without bytes"));
}

TEST_CASE("combined planner with remat::Auto: analysed once, without per-budget second opinion and last resorts",
          "[offload][auto][timing]") {
    std::mt19937 rng(31);
    const Problem dag = testing::random_dag(rng, testing::DagShape{6});
    std::vector<WeightUse> weights;
    for (std::size_t i = 1; i <= 3; ++i) {
        const std::string n = std::to_string(i);
        const OpId backward = dag.op_id("B" + n);
        weights.push_back({"layer" + n, 128, {dag.op_id("F" + n + "+"), backward}, backward});
    }
    TrainingStateOptions state;
    state.gradients_to_caller = true;
    state.transfers = TransferSettings{std::nullopt, 40.0, 40.0};
    const Problem full = training_problem(dag, weights, state);
    CombinedOptions options{GreedyVariant::repeated, 8, std::nullopt};
    options.between_steps = false;
    AutoOptions fast;
    fast.second_opinion_max_ops = 0;
    fast.greedy_fallback_seconds = 0.05;
    fast.exact_fallback = false;
    const Bytes reference = store_all_reference(full).peak;
    // Analysed anew at each of the ~25 activation budgets, with the last resorts searching a
    // few seconds where the solver misses, this took 82 s: the default Auto now answers like
    // the fast one, in seconds.
    const auto start = std::chrono::steady_clock::now();
    int planned = 0;
    for (const int percent : {100, 97, 95}) {
        const Bytes budget = reference * percent / 100;
        const auto with_default = plan_with_offload(full, budget, Auto{}, options);
        const auto with_fast = plan_with_offload(full, budget, Auto(fast), options);
        REQUIRE(with_default.has_value() == with_fast.has_value());
        if (!with_default) continue;
        ++planned;
        CHECK(with_default->schedule == with_fast->schedule);
        CHECK(with_default->report.makespan == with_fast->report.makespan);
    }
    CHECK(planned >= 2);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 20.0);
}

// Greedy, recording each budget it is asked to plan.
struct BudgetRecordingSolver {
    std::shared_ptr<std::vector<Bytes>> budgets = std::make_shared<std::vector<Bytes>>();
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "recording"; }
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        budgets->push_back(budget);
        return Greedy{}.solve(problem, budget);
    }
    [[nodiscard]] Bytes smallest_budget(const Problem& problem) const { return Greedy{}.smallest_budget(problem); }
};

TEST_CASE("combined planner: no activation budget below the solver's smallest is planned", "[offload]") {
    // Below it the solver has no plan, and Auto and H-Rockmate searched again for their
    // smallest budget to say so: the bisection of rematerialization alone went down to one
    // byte where no activation budget fit, 2.5 times the planner's time on a 283-op U-Net.
    std::mt19937 rng(43);
    int bisected = 0;
    for (int trial = 0; trial < 8; ++trial) {
        const Problem full = training_problem(testing::random_chain(rng, 6), std::vector<Bytes>(6, 64),
                                              TrainingStateOptions{2.0, 0.01, true, TransferSettings{std::nullopt, 8.0, 8.0}});
        const Bytes least = Greedy{}.smallest_budget(split_training_state(full).activations);
        const Bytes reference = store_all_reference(full).peak;
        for (const int percent : {90, 60, 40}) {
            const Bytes budget = reference * percent / 100;
            const CombinedOptions options{GreedyVariant::repeated, 8, std::nullopt};
            const BudgetRecordingSolver recording;
            const auto remat_only = plan_remat_only(full, budget, recording, options);
            INFO("trial " << trial << " at " << percent << " %: " << recording.budgets->size() << " solves");
            for (const Bytes b : *recording.budgets) CHECK(b >= least);
            // The top, the smallest, the bisection between them where the smallest fits, the grid.
            if (recording.budgets->size() > 10) ++bisected;
            else CHECK(recording.budgets->size() <= 2 + options.activation_budgets);
            const auto combined = plan_with_offload(full, budget, recording, options);
            for (const Bytes b : *recording.budgets) CHECK(b >= least);
            if (remat_only) CHECK(combined);
        }
    }
    CHECK(bisected > 0);
}

TEST_CASE("rematerialization alone: the largest activation budget that fits, as a dense scan finds it", "[offload]") {
    // Its bisection started from 0 bytes: where half the top was below the solver's smallest
    // budget, it went down among budgets with no plan and never came back up, and only the
    // grid's budgets were left: at 65 % of the GPT-like example 95.8 against 81.4 (bench_offload
    // at 60 % of a GPU-like model: +140 % against +49 %).
    const Problem full = remat::io::load_problem(std::string(REMAT_SOURCE_DIR) + "/examples/problems/gpt-like-training.json");
    const TrainingSplit split = split_training_state(full);
    const Bytes least = Auto{}.smallest_budget(split.activations);
    const Bytes reference = store_all_reference(full).peak;
    const Bytes activations = store_all_reference(split.activations).peak;
    const auto scanning = offload::detail::combined::for_many_budgets(Auto{});  // as the planner runs it
    for (const int percent : {80, 75, 70, 65}) {
        const Bytes budget = reference * percent / 100;
        double scanned = std::numeric_limits<double>::infinity();
        const Bytes top = std::min(activations, budget);
        for (Bytes i = 0; i <= 100; ++i) {
            const Bytes b = least + (top - least) * i / 100;
            const auto plan = offload::detail::combined::full_plan(full, split, scanning, b);
            if (!plan) continue;
            const SimulationReport report = remat::simulate(full, *plan);
            if (report.peak <= budget) scanned = std::min(scanned, report.time);
        }
        INFO(percent << " %");
        REQUIRE(std::isfinite(scanned));
        const auto remat_only = plan_remat_only(full, budget, Auto{}, CombinedOptions{});
        REQUIRE(remat_only);
        CHECK(remat_only->report.fits(budget, std::nullopt));
        CHECK(remat_only->report.makespan <= scanned);
    }
}

TEST_CASE("combined planner: H-Rockmate plans each activation budget within many_budgets_budget_seconds",
          "[offload][hierarchical]") {
    // Its hierarchy's top search took up to 1.2 s at each of some 30 activation budgets on a
    // 283-op U-Net, where its greedy component's plan was the faster one at every budget.
    CHECK(hrockmate_for_many_budgets({}).budget_time_limit_seconds == many_budgets_budget_seconds);
    HRockmateOptions tight;
    tight.budget_time_limit_seconds = many_budgets_budget_seconds / 4;
    CHECK(hrockmate_for_many_budgets(tight).budget_time_limit_seconds == many_budgets_budget_seconds / 4);
    HRockmateOptions loose;
    loose.budget_time_limit_seconds = 30.0;
    CHECK(hrockmate_for_many_budgets(loose).budget_time_limit_seconds == many_budgets_budget_seconds);
    // Auto's H-Rockmate too.
    const AutoOptions automatic = auto_for_many_budgets({});
    REQUIRE(automatic.hrockmate_adjustment);
    CHECK(automatic.hrockmate_adjustment(HRockmateOptions{}).budget_time_limit_seconds == many_budgets_budget_seconds);
}

TEST_CASE("combined planner: the fastest activation budget is refined; the GPT-like example at 20 % of its memory",
          "[offload]") {
    // The makespan is far from smooth in the activation budget: the grid of 12 found 95.9 at
    // 20 %, the fastest split at 70.9, which a grid of 48 finds too.
    const Problem full = remat::io::load_problem(std::string(REMAT_SOURCE_DIR) + "/examples/problems/gpt-like-training.json");
    const Bytes reference = store_all_reference(full).peak;
    for (const int percent : {20, 25, 30, 40, 60}) {
        const Bytes budget = reference * percent / 100;
        CombinedOptions grid{GreedyVariant::repeated, 12, std::nullopt};
        grid.refinement_rounds = 0;
        CombinedOptions dense = grid;
        dense.activation_budgets = 48;
        const CombinedOptions refined{GreedyVariant::repeated, 12, std::nullopt};
        REQUIRE(refined.refinement_rounds > 0);
        const auto coarse = plan_with_offload(full, budget, Auto{}, grid);
        const auto fine = plan_with_offload(full, budget, Auto{}, dense);
        const auto plan = plan_with_offload(full, budget, Auto{}, refined);
        INFO(percent << " %");
        REQUIRE(coarse);
        REQUIRE(fine);
        REQUIRE(plan);
        CHECK(plan->report.fits(budget, std::nullopt));
        CHECK(plan->report.makespan <= coarse->report.makespan);  // the grid's budgets are among those tried
        CHECK(plan->report.makespan <= fine->report.makespan);
        if (percent == 20) CHECK(plan->report.makespan < 0.8 * coarse->report.makespan);
    }
}

TEST_CASE("combined planner with remat::HRockmate: analysed once, its greedy component's portfolio cut short",
          "[offload][hierarchical][timing]") {
    // The GPT-like example at 50 % of P_ref: the greedy component's portfolio and improvement
    // ran until their 1.5 s were spent at each of the ~25 activation budgets (48 s in all); with
    // them cut to many_budgets_component_seconds the plan is the same, given the same options.
    const Problem full = remat::io::load_problem(std::string(REMAT_SOURCE_DIR) + "/examples/problems/gpt-like-training.json");
    const Bytes budget = store_all_reference(full).peak / 2;
    const CombinedOptions options{GreedyVariant::repeated, 12, std::nullopt};
    HRockmateOptions short_greedy;
    short_greedy.greedy = greedy_within(short_greedy.greedy, many_budgets_component_seconds);
    const auto start = std::chrono::steady_clock::now();
    const auto with_default = plan_with_offload(full, budget, HRockmate{}, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto with_short = plan_with_offload(full, budget, HRockmate(short_greedy), options);
    REQUIRE(with_default);
    REQUIRE(with_short);
    CHECK(with_default->report.makespan == with_short->report.makespan);
    CHECK(with_default->report.fits(budget, std::nullopt));
    CHECK(seconds < 15.0);
}

TEST_CASE("combined planner with remat::Auto: a time bound and an exact component given for one budget stay out of "
          "its activation budgets",
          "[offload][auto]") {
    // What remat-plan gives its Auto at one budget: a proven time bound (here one every plan
    // beats, which Auto refuses as no bound at a budget it was not proven for) and Checkmate as
    // its exact component (seconds at each of ~25 activation budgets).
    const Problem full = testing::small_unet_training(1, 1);
    REQUIRE(split_training_state(full).activations.op_count() <= AutoOptions{}.exact_component_max_ops);
    auto calls = std::make_shared<int>(0);
    AutoOptions given;
    given.time_bound = 1e9;
    given.exact_component = [calls](const Problem&, Bytes, const Plan& incumbent, double) -> std::optional<Plan> {
        ++*calls;
        return incumbent;
    };
    const CombinedOptions options{GreedyVariant::repeated, 6, std::nullopt};
    const Bytes reference = store_all_reference(full).peak;
    for (const int percent : {90, 60}) {
        const Bytes budget = reference * percent / 100;
        INFO(percent << " %");
        std::optional<OffloadPlan> plan;
        REQUIRE_NOTHROW(plan = plan_with_offload(full, budget, Auto(given), options));
        REQUIRE(plan);
        CHECK(plan->report.fits(budget, std::nullopt));
        const auto plain = plan_with_offload(full, budget, Auto{}, options);
        REQUIRE(plain);
        CHECK(plan->report.makespan == plain->report.makespan);
    }
    CHECK(*calls == 0);
}

TEST_CASE("combined planner with remat::Auto on a graph it plans with H-Rockmate: analysed once, H-Rockmate's greedy "
          "and exact search cut short at each activation budget",
          "[offload][auto][hierarchical]") {
    // Auto ran H-Rockmate's greedy component (1.5 s, until spent) and exact search (2 s, which
    // seldom finishes) at each activation budget: 4 s per budget on a 94-op U-Net, 67 s in all
    // on a 283-op one at 40 %.
    const Problem full = testing::small_unet_training(2, 2);
    REQUIRE(auto_choice(split_training_state(full).activations) == AutoChoice::hrockmate);
    std::vector<std::string> lines;
    AutoOptions watched;
    watched.progress = [&](const std::string& line) { lines.push_back(line); };
    const Bytes budget = store_all_reference(full).peak * 6 / 10;
    const auto plan = plan_with_offload(full, budget, Auto(watched), CombinedOptions{GreedyVariant::repeated, 6, std::nullopt});
    REQUIRE(plan);
    CHECK(plan->report.fits(budget, std::nullopt));
    // Each component's line says when it finished, counted from the budget's start.
    int analyses = 0, components = 0;
    double previous = 0.0;
    for (const std::string& line : lines) {
        INFO(line);
        analyses += line.starts_with("hrockmate: analysed");
        const auto done = line.find(" done after ");
        if (!line.starts_with("hrockmate: ") || done == std::string::npos) continue;
        const double at = std::stod(line.substr(done + 12));
        if (line.starts_with("hrockmate: exact search") || line.starts_with("hrockmate: greedy")) {
            ++components;
            CHECK(at - previous < 0.75);  // 2 s and 1.5 s before
        }
        previous = at;
    }
    CHECK(analyses == 1);
    CHECK(components >= 6);
}

namespace {

// Greedy{}, recording the limit of each solve (infinity where none was set).
struct LimitRecordingSolver {
    std::shared_ptr<std::vector<double>> limits = std::make_shared<std::vector<double>>();
    double limit = std::numeric_limits<double>::infinity();
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "recording"; }
    [[nodiscard]] Plan solve(const Problem& problem, Bytes budget) const {
        limits->push_back(limit);
        return Greedy{}.solve(problem, budget);
    }
    [[nodiscard]] LimitRecordingSolver with_time_limit_at_most(double seconds) const {
        LimitRecordingSolver copy = *this;
        copy.limit = std::min(limit, seconds);
        return copy;
    }
};
static_assert(TimeBoundedSolver<LimitRecordingSolver>);

}  // namespace

TEST_CASE("combined planner: its time limit stops further activation budgets, and each solve gets at most what is left",
          "[offload]") {
    std::mt19937 rng(37);
    const Problem full = training_problem(testing::random_chain(rng, 6), std::vector<Bytes>(6, 64),
                                          TrainingStateOptions{2.0, 0.01, true, TransferSettings{std::nullopt, 8.0, 8.0}});
    const Bytes budget = store_all_reference(full).peak * 6 / 10;
    CombinedOptions options{GreedyVariant::repeated, 12, std::nullopt};

    const LimitRecordingSolver unlimited;
    const auto everything = plan_with_offload(full, budget, unlimited, options);
    REQUIRE(everything);
    CHECK(unlimited.limits->size() > 12);  // the bisection and both grids
    CHECK(std::all_of(unlimited.limits->begin(), unlimited.limits->end(), [](double s) { return std::isinf(s); }));

    // A limit already spent: every solve is asked for its quickest plan, and once a plan fits
    // no further activation budget is tried; but the budget still gets a plan.
    options.time_limit_seconds = 0.0;
    const LimitRecordingSolver spent;
    const auto quick = plan_with_offload(full, budget, spent, options);
    INFO(spent.limits->size() << " solves, against " << unlimited.limits->size());
    CHECK(spent.limits->size() <= 4);  // the smallest budget, the top, the smallest again, one more
    for (const double s : *spent.limits) CHECK(s <= 1e-6);
    REQUIRE(quick);
    CHECK(quick->report.fits(budget, std::nullopt));
    CHECK(quick->report.makespan >= everything->report.makespan);

    // A generous limit changes nothing but the limits passed on.
    options.time_limit_seconds = 3600.0;
    const LimitRecordingSolver generous;
    const auto same = plan_with_offload(full, budget, generous, options);
    REQUIRE(same);
    CHECK(same->report.makespan == everything->report.makespan);
    CHECK(generous.limits->size() == unlimited.limits->size());
    for (const double s : *generous.limits) CHECK(s <= 3600.0);
}
