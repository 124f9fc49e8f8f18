// The fastest MILP backend built in, for the MILP tests: CBC where it was found, lp_solve
// otherwise.
#pragma once

#include <remat/milp/lp_solve.hpp>
#ifdef REMAT_WITH_CBC
#include <remat/milp/cbc.hpp>
#endif

namespace remat::testing {

#ifdef REMAT_WITH_CBC
using FastMilp = milp::Cbc;
#else
using FastMilp = milp::LpSolve;
#endif

}  // namespace remat::testing
