// Offloading plans run for real (remat/exec/offload_step.hpp, remat/exec/transfer.hpp):
// minigrad (examples/embedding) trained with its optimizer step inside the plan and weights and
// momentum moved to host memory by the CPU transfer backend's worker threads gives the losses
// and weights of plain training bit for bit, with the device and host peaks the simulator
// predicts.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include <remat/remat.hpp>

#include "../../examples/embedding/minigrad_offload.hpp"

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

}  // namespace

TEST_CASE("offloaded training of minigrad equals plain training bitwise, with the predicted peaks", "[offload][exec]") {
    const int percent = GENERATE(45, 35);
    Fixture f;
    const Matrix x_ref = copy_into(f.reference_memory, f.x), target_ref = copy_into(f.reference_memory, f.target);
    const Profile profiled = profile(f.model, f.memory, f.x);
    f.reference.generator = f.model.generator;
    const std::vector<Bytes> params = parameter_bytes(f.model);
    const remat::TransferSettings transfers{std::nullopt, 2e9, 2e9};
    const remat::offload::TrainingStateOptions options{1.0, 0.0, true, transfers, true};
    const remat::Problem planned = remat::offload::training_problem(profiled.chain, params, options);
    const remat::Problem predicting = remat::offload::training_problem(profiled.problem, params, options);
    const remat::Bytes total = remat::store_all_reference(planned).peak;
    const auto plan = remat::offload::plan_with_offload(planned, total * percent / 100, remat::Rotor{});
    REQUIRE(plan);
    INFO(plan->method);
    REQUIRE(plan->report.offloads > 0);
    REQUIRE_FALSE(plan->schedule.start_on_host.empty());

    constexpr float lr = 0.05f, mu = 0.9f;
    OffloadTraining training(f.model, f.memory, f.x, f.target, predicting, lr, mu);
    remat::CpuTransfers<OffloadTraining> copies(training, predicting);
    AllocatorProbe probe{&f.memory};
    remat::place_for(plan->schedule, copies);
    std::vector<std::vector<Matrix>> velocity(f.reference.layers.size());
    for (std::size_t l = 0; l < f.reference.layers.size(); ++l)
        for (Matrix* p : parameters(f.reference.layers[l])) velocity[l].emplace_back(f.reference_memory, p->rows(), p->cols());

    for (int step = 0; step < 3; ++step) {
        remat::OffloadStep<OffloadTraining, remat::CpuTransfers<OffloadTraining>, AllocatorProbe> run(
            predicting, plan->schedule, training, copies, probe);
        run.run();
        const PlainStep plain = plain_step(f.reference, x_ref, target_ref);
        for (std::size_t l = 0; l < f.reference.layers.size(); ++l) {
            const auto ps = parameters(f.reference.layers[l]);
            for (std::size_t k = 0; k < ps.size(); ++k) momentum_update(*ps[k], velocity[l][k], plain.gradients[l][k], lr, mu);
        }
        INFO("step " << step);
        CHECK(training.loss() == plain.loss);
        CHECK(run.report().measured_device_peak == run.report().predicted_device_peak);
        CHECK(run.report().measured_host_peak == run.report().predicted_host_peak);
        for (std::size_t l = 1; l <= f.model.layers.size(); ++l) {
            if (params[l - 1] == 0) continue;
            const remat::DataId w = predicting.data_id("w" + std::to_string(l));
            const bool away = std::find(plan->schedule.start_on_host.begin(), plan->schedule.start_on_host.end(), w) !=
                              plan->schedule.start_on_host.end();
            const std::vector<std::byte> expected = weights_of(f.reference, l);
            if (away) {
                const auto host = copies.host_copy(w);
                REQUIRE(host.size() == expected.size());
                CHECK(std::memcmp(host.data(), expected.data(), expected.size()) == 0);
            } else {
                CHECK(weights_of(f.model, l) == expected);
            }
        }
        if (step == 0)
            WARN("minigrad offloaded at " << percent << " % of its total store-all peak " << total << " B: " << plan->method << ", "
                 << plan->report.offloads << " offloads, " << plan->report.prefetches << " prefetches; device peak "
                 << run.report().measured_device_peak << " B measured = " << run.report().predicted_device_peak
                 << " B predicted; host peak " << run.report().measured_host_peak << " B measured = "
                 << run.report().predicted_host_peak << " B predicted");
        training.end_step();
    }
    const auto [to_host, to_device] = copies.busy_seconds();
    CHECK(to_host > 0.0);
    CHECK(to_device > 0.0);
}
