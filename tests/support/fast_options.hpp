// Short solver limits, for tests of validity rather than of plan quality.
#pragma once

#include <remat/solvers/hierarchical.hpp>

namespace remat::testing {

[[nodiscard]] inline HRockmateOptions fast_hrockmate_options() {
    HRockmateOptions fast;
    fast.greedy.portfolio_seconds = 0.02;
    fast.greedy.improve_seconds = 0.02;
    fast.improve.time_limit_seconds = 0.05;
    fast.top_time_limit_seconds = 0.2;
    fast.max_states = 20'000;
    fast.flat_max_states = 50'000;
    fast.search_time_limit_seconds = 0.5;
    fast.cluster_time_limit_seconds = 1.0;
    return fast;
}

}  // namespace remat::testing
