// Offloading plans run for real (remat/exec/offload_step.hpp, remat/exec/transfer.hpp):
// minigrad (examples/embedding) trained with its optimizer step inside the plan and weights and
// momentum moved to host memory by the CPU transfer backend's worker threads gives the losses
// and weights of plain training bit for bit, with the device and host peaks the simulator
// predicts.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>

#include <remat/remat.hpp>

#include "../../examples/embedding/minigrad_offload.hpp"
#include "../support/faulty_compute.hpp"

namespace {

using namespace minigrad;
using remat::Bytes;

struct Fixture {
    Allocator memory;
    Model model = make_model(memory, 16, 32, 64, 3, 4);
    Allocator reference_memory;
    Model reference = make_model(reference_memory, 16, 32, 64, 3, 4);
    std::mt19937 data{3};
    Matrix x = random_matrix(memory, 8, 16, data, 1.0f);
    Matrix target = random_matrix(memory, 8, 4, data, 1.0f);
};

Matrix copy_into(Allocator& a, const Matrix& m) {
    Matrix out(a, m.rows(), m.cols());
    out.values() = m.values();
    return out;
}

// The weights of layer l as bytes: from the device, or from the host copy when they are away.
std::vector<std::byte> weights_of(Model& m, std::size_t l) {
    std::vector<std::byte> out;
    for (Matrix* p : parameters(m.layers[l - 1])) {
        const auto bytes = std::as_bytes(std::span(p->values()));
        out.insert(out.end(), bytes.begin(), bytes.end());
    }
    return out;
}

constexpr float lr = 0.05f, mu = 0.9f;

// The model profiled, its training problems (with the weights and momentum as data), and a
// plan at `percent` of the store-all total; plain training of the reference model beside it.
struct Setup {
    Fixture f;
    Matrix x_ref = copy_into(f.reference_memory, f.x), target_ref = copy_into(f.reference_memory, f.target);
    Profile profiled = profile(f.model, f.memory, f.x);
    std::vector<Bytes> params = parameter_bytes(f.model);
    remat::offload::TrainingStateOptions options{1.0, 0.0, true, remat::TransferSettings{std::nullopt, 2e9, 2e9}, true};
    remat::Problem planned = remat::offload::training_problem(profiled.chain, params, options);
    remat::Problem predicting = remat::offload::training_problem(profiled.problem, params, options);
    Bytes total = remat::store_all_reference(planned).peak;
    std::optional<remat::offload::OffloadPlan> plan;
    std::vector<std::vector<Matrix>> velocity;

    explicit Setup(int percent) : plan(remat::offload::plan_with_offload(planned, total * percent / 100, remat::Rotor{})) {
        f.reference.generator = f.model.generator;
        for (Layer& layer : f.reference.layers) {
            velocity.emplace_back();
            for (Matrix* p : parameters(layer)) velocity.back().emplace_back(f.reference_memory, p->rows(), p->cols());
        }
    }

    // One step of plain training with the same optimizer; its loss.
    double plain_training_step() {
        const PlainStep plain = plain_step(f.reference, x_ref, target_ref);
        for (std::size_t l = 0; l < f.reference.layers.size(); ++l) {
            const auto ps = parameters(f.reference.layers[l]);
            for (std::size_t k = 0; k < ps.size(); ++k) momentum_update(*ps[k], velocity[l][k], plain.gradients[l][k], lr, mu);
        }
        return plain.loss;
    }

    // The offloaded model's weights equal the reference's, bit for bit, wherever they are.
    void check_weights(remat::CpuTransfers<OffloadTraining>& copies) {
        const auto& away = plan->schedule.start_on_host;
        for (std::size_t l = 1; l <= f.model.layers.size(); ++l) {
            if (params[l - 1] == 0) continue;
            const remat::DataId w = predicting.data_id(std::string{"w"} + std::to_string(l));
            const std::vector<std::byte> expected = weights_of(f.reference, l);
            INFO("layer " << l);
            if (std::find(away.begin(), away.end(), w) != away.end()) {
                const auto host = copies.host_copy(w);
                CHECK(std::vector<std::byte>(host.begin(), host.end()) == expected);
            } else {
                CHECK(weights_of(f.model, l) == expected);
            }
        }
    }
};

using Step = remat::OffloadStep<OffloadTraining, remat::CpuTransfers<OffloadTraining>, AllocatorProbe>;

// Runs a step that must fail: an ExecutionError whose message holds `cause` and `where`.
template <class FailingStep>
void check_step_fails(FailingStep& run, const std::string& cause, const std::string& where) {
    try {
        run.run();
        FAIL("the fault did not surface: " << cause);
    } catch (const remat::ExecutionError& e) {
        CHECK_THAT(e.what(), Catch::Matchers::Contains(cause));
        CHECK_THAT(e.what(), Catch::Matchers::Contains(where));
    }
}

}  // namespace

TEST_CASE("offloaded training of minigrad equals plain training bitwise, with the predicted peaks", "[offload][exec]") {
    const int percent = GENERATE(45, 35);
    Setup s(percent);
    REQUIRE(s.plan);
    INFO(s.plan->method);
    REQUIRE(s.plan->report.offloads > 0);
    REQUIRE_FALSE(s.plan->schedule.start_on_host.empty());

    OffloadTraining training(s.f.model, s.f.memory, s.f.x, s.f.target, s.predicting, lr, mu);
    remat::CpuTransfers<OffloadTraining> copies(training, s.predicting);
    AllocatorProbe probe{&s.f.memory};
    remat::place_for(s.plan->schedule, copies);
    for (int step = 0; step < 3; ++step) {
        Step run(s.predicting, s.plan->schedule, training, copies, probe);
        run.run();
        INFO("step " << step);
        CHECK(training.loss() == s.plain_training_step());
        CHECK(run.report().measured_device_peak == run.report().predicted_device_peak);
        CHECK(run.report().measured_host_peak == run.report().predicted_host_peak);
        s.check_weights(copies);
        if (step == 0)
            WARN("minigrad offloaded at " << percent << " % of its total store-all peak " << s.total << " B: "
                 << s.plan->method << ", " << s.plan->report.offloads << " offloads, " << s.plan->report.prefetches
                 << " prefetches; device peak " << run.report().measured_device_peak << " B measured = "
                 << run.report().predicted_device_peak << " B predicted; host peak " << run.report().measured_host_peak
                 << " B measured = " << run.report().predicted_host_peak << " B predicted");
        training.end_step();
    }
    const auto [to_host, to_device] = copies.busy_seconds();
    CHECK(to_host > 0.0);
    CHECK(to_device > 0.0);
}

namespace {

using FaultyTraining = remat_test::FaultyCompute<OffloadTraining>;

// The training state as the transfer backend and the store hold it: per weight and momentum
// data, its host copy (or nothing) and its device copy (or nothing); the memory of both.
struct StateCopy {
    std::vector<std::vector<std::byte>> host, device;
    Bytes host_bytes = 0, device_memory = 0;
    bool operator==(const StateCopy&) const = default;
};

StateCopy state_of(const remat::Problem& problem, OffloadTraining& training, remat::CpuTransfers<OffloadTraining>& copies,
                   const Allocator& memory) {
    StateCopy s;
    for (std::size_t k = 0; k < problem.data_count(); ++k) {
        const remat::DataId d{k};
        const std::string& name = problem.data(d).name;
        if (name.empty() || (name[0] != 'w' && name[0] != 'm')) continue;
        const auto host = copies.host_copy(d);
        s.host.emplace_back(host.begin(), host.end());
        std::vector<std::byte> device;
        for (const auto part : training.device_bytes(d)) device.insert(device.end(), part.begin(), part.end());
        s.device.push_back(std::move(device));
    }
    s.host_bytes = copies.host_bytes();
    s.device_memory = memory.current();
    return s;
}

}  // namespace

TEST_CASE("a fault mid-step leaves weights and momentum as they were, on the device and on the host",
          "[offload][exec][fault]") {
    Setup s(35);
    REQUIRE(s.plan);
    REQUIRE_FALSE(s.plan->schedule.start_on_host.empty());
    OffloadTraining training(s.f.model, s.f.memory, s.f.x, s.f.target, s.predicting, lr, mu);
    remat::CpuTransfers<OffloadTraining> copies(training, s.predicting);
    AllocatorProbe probe{&s.f.memory};
    remat::place_for(s.plan->schedule, copies);
    {  // a first step, so that the momentum is not zero
        Step run(s.predicting, s.plan->schedule, training, copies, probe);
        run.run();
        CHECK(run.report().rollback_bytes > 0);
        (void)s.plain_training_step();
        training.end_step();
    }
    const StateCopy before = state_of(s.predicting, training, copies, s.f.memory);

    // Faults in the forward, at the first update, in the middle of the updates, at the last op.
    std::size_t first_update = 0, runs = 0;
    for (const auto& step : s.plan->schedule.steps) {
        if (!step.is_run()) continue;
        if (!s.predicting.op(step.op()).updates.empty() && first_update == 0) first_update = runs;
        ++runs;
    }
    REQUIRE(first_update > 0);
    for (const std::size_t fail_at : {std::size_t{1}, first_update, (first_update + runs) / 2, runs - 1}) {
        INFO("fault at run " << fail_at << " of " << runs);
        FaultyTraining faulty{&training, fail_at};
        remat::OffloadStep<FaultyTraining, remat::CpuTransfers<OffloadTraining>, AllocatorProbe> run(
            s.predicting, s.plan->schedule, faulty, copies, probe);
        check_step_fails(run, "injected fault", "step ");
        CHECK(state_of(s.predicting, training, copies, s.f.memory) == before);
        CHECK(copies.rollback_bytes() == 0);
        CHECK_THROWS_AS(run.backward(), remat::ExecutionError);
    }

    // Then the step runs as if nothing had happened: plain training's loss and weights.
    Step run(s.predicting, s.plan->schedule, training, copies, probe);
    run.run();
    CHECK(training.loss() == s.plain_training_step());
    s.check_weights(copies);
}

TEST_CASE("an error the device reports only when the phase's end waits for it still rolls the step back",
          "[offload][exec][fault]") {
    Setup s(35);
    REQUIRE(s.plan);
    OffloadTraining training(s.f.model, s.f.memory, s.f.x, s.f.target, s.predicting, lr, mu);
    remat::CpuTransfers<OffloadTraining> copies(training, s.predicting);
    AllocatorProbe probe{&s.f.memory};
    remat::place_for(s.plan->schedule, copies);
    using LateFault = remat_test::LateFaultCompute<OffloadTraining>;
    using LateStep = remat::OffloadStep<LateFault, remat::CpuTransfers<OffloadTraining>, AllocatorProbe>;
    {  // a step without a fault waits twice: at the end of each phase, not after each op
        LateFault waits_only{&training, std::size_t(-1)};
        LateStep run(s.predicting, s.plan->schedule, waits_only, copies, probe);
        run.run();
        CHECK(run.completed());
        CHECK(waits_only.waits == 2);
        (void)s.plain_training_step();
        training.end_step();
    }
    const StateCopy before = state_of(s.predicting, training, copies, s.f.memory);
    for (const std::size_t wait : {std::size_t{0}, std::size_t{1}}) {
        INFO((wait == 0 ? "at the end of the forward phase" : "at the end of the backward phase"));
        LateFault late{&training, wait};
        LateStep run(s.predicting, s.plan->schedule, late, copies, probe);
        check_step_fails(run, "late device fault", "waiting for the device");
        CHECK_FALSE(run.completed());
        CHECK(state_of(s.predicting, training, copies, s.f.memory) == before);
        CHECK(copies.rollback_bytes() == 0);
    }
    Step run(s.predicting, s.plan->schedule, training, copies, probe);
    run.run();
    CHECK(training.loss() == s.plain_training_step());
    s.check_weights(copies);
}
