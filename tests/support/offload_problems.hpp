// Training problems shared by the offloading tests. one_layer_training(): docs/formats.md §11's
// worked example, one layer F (reads x and w), the loss, B (reads w, writes gx and the weight
// gradient gw) and the update U (reads gw, updates the weight w, 100 B, and its optimizer state
// m, 200 B). unet_training(): a U-Net (op_level_problems.hpp) with a weight per convolution.
#pragma once

#include <string>
#include <vector>

#include <remat/core/problem.hpp>
#include <remat/offload/training_state.hpp>

#include "op_level_problems.hpp"

namespace remat::testing {

inline Problem one_layer_training(TransferSettings transfers = {std::nullopt, 50.0, 100.0}) {
    ProblemBuilder b("one-layer");
    const DataId x = b.add_data("x", 10), w = b.add_data("w", 100, true), m = b.add_data("m", 200, true);
    const DataId h = b.add_data("h", 50), gh = b.add_data("gh", 50), gx = b.add_data("gx", 10);
    const DataId gw = b.add_data("gw", 100), u = b.add_data("u", 0);
    b.add_op({"F", 2, 0, {x, w}, {h}, false});
    b.add_op({"loss", 0, 0, {h}, {gh}, true});
    b.add_op({"B", 4, 0, {gh, x, w}, {gx, gw}, true});
    OpSpec update{"U", 1, 0, {gw}, {u}, true};
    update.updates = {w, m};
    b.add_op(std::move(update));
    for (const DataId d : {x, w, m}) b.add_initial(d);
    b.add_final(gx);
    b.add_final(u);
    b.set_transfers(transfers);
    return b.build();
}

/// The U-Net of `shape` with a weight of `weight_bytes` per convolution, read by its forwards
/// and its backward, which writes the weight's gradient; updated in the step, offloadable.
inline Problem unet_training(const UNetShape& shape, Bytes weight_bytes,
                             TransferSettings transfers = {std::nullopt, 1e9, 1e9}) {
    const Problem net = unet_like(shape);
    std::vector<offload::WeightUse> weights;
    for (const Op& op : net.all_ops()) {
        const std::string& name = op.name;
        if (!name.starts_with('F') || name.ends_with('+') || name.find("conv") == std::string::npos) continue;
        const std::string layer = name.substr(1);
        const OpId backward = net.op_id("B" + layer);
        weights.push_back({layer, weight_bytes, {net.op_id(name), net.op_id(name + "+"), backward}, backward});
    }
    offload::TrainingStateOptions options;
    options.transfers = transfers;
    return offload::training_problem(net, weights, options);
}

/// A small U-Net's training step (16-pixel images, 4 channels at the top, 4 KiB weights):
/// `levels` levels of `convs` convolutions per side.
inline Problem small_unet_training(std::size_t levels, std::size_t convs) {
    UNetShape shape;
    shape.levels = levels;
    shape.convs = convs;
    shape.pixels = 16;
    shape.channels = 4;
    return unet_training(shape, 4096);
}

}  // namespace remat::testing
