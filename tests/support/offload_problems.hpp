// docs/formats.md §11's worked example as a problem, shared by the offloading tests: one layer
// F (reads x and w), the loss, B (reads w, writes gx and the weight gradient gw) and the
// update U (reads gw, updates the weight w, 100 B, and its optimizer state m, 200 B).
#pragma once

#include <remat/core/problem.hpp>

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

}  // namespace remat::testing
