// The fastest MILP backend built in, for the MILP tests (milp/preferred.hpp: CBC where it was
// found, lp_solve otherwise).
#pragma once

#include <remat/milp/lp_solve.hpp>
#include <remat/milp/preferred.hpp>

namespace remat::testing {

using FastMilp = milp::Preferred;

}  // namespace remat::testing
