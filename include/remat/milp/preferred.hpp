// remat/milp/preferred.hpp — the MILP backend a program uses when its user names none: CBC
// where the build has it, lp_solve otherwise, none without either.
//
// Checkmate (Jain et al., MLSys 2020), the time bound (bounds/time_lower_bound.hpp) and the
// offloading MILP are templates over a milp::MilpBackend (backend.hpp). CBC proves their
// optima several times faster than lp_solve (bench_checkmate), and lp_solve reports no bound
// for a search it stops. A target that links remat::cbc or remat::lpsolve gets
// REMAT_WITH_CBC or REMAT_WITH_LPSOLVE from CMake; without either, have_preferred_backend is
// false and milp::Preferred does not exist.
#pragma once

#if defined(REMAT_WITH_CBC)
#include "cbc.hpp"
#elif defined(REMAT_WITH_LPSOLVE)
#include "lp_solve.hpp"
#endif

namespace remat::milp {

#if defined(REMAT_WITH_CBC)
using Preferred = Cbc;
inline constexpr bool have_preferred_backend = true;
#elif defined(REMAT_WITH_LPSOLVE)
using Preferred = LpSolve;
inline constexpr bool have_preferred_backend = true;
#else
inline constexpr bool have_preferred_backend = false;
#endif

}  // namespace remat::milp
