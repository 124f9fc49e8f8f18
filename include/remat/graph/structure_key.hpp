// remat/graph/structure_key.hpp — a Problem's structure as a list of numbers, for finding
// sub-problems that are equal up to renaming.
//
// Rockmate solves structurally identical blocks once (Zhao et al., ICML 2023, §4) and
// H-Rockmate identical clusters once (docs/design.md §4.5). Both build their sub-problems in
// the same order from equal parts, so equal structures give equal keys: the data's sizes and
// roles (initial, final), every op's overhead, exactly-once flag, reads and writes by index,
// the loss, and, when asked, the ops' times (bit for bit). Standard library only.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "../core/problem.hpp"

namespace remat::graph {

/// The key of `q`; `with_times` adds every op's time, so that equal keys also mean equal costs.
[[nodiscard]] inline std::vector<std::int64_t> structure_key(const Problem& q, bool with_times) {
    std::vector<std::int64_t> key;
    key.push_back(static_cast<std::int64_t>(q.data_count()));
    for (std::size_t d = 0; d < q.data_count(); ++d) {
        key.push_back(q.data(DataId{d}).bytes);
        key.push_back((q.is_initial(DataId{d}) ? 1 : 0) + (q.is_final(DataId{d}) ? 2 : 0));
    }
    key.push_back(static_cast<std::int64_t>(q.op_count()));
    for (const Op& op : q.all_ops()) {
        key.push_back(op.overhead);
        key.push_back(op.exactly_once ? 1 : 0);
        if (with_times) key.push_back(std::bit_cast<std::int64_t>(op.time));
        key.push_back(static_cast<std::int64_t>(op.reads.size()));
        for (const DataId d : op.reads) key.push_back(static_cast<std::int64_t>(d.index));
        key.push_back(static_cast<std::int64_t>(op.writes.size()));
        for (const DataId d : op.writes) key.push_back(static_cast<std::int64_t>(d.index));
    }
    key.push_back(q.loss() ? static_cast<std::int64_t>(q.loss()->index) : -1);
    return key;
}

}  // namespace remat::graph
