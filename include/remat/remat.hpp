// remat/remat.hpp — umbrella header: everything of remat that needs only the standard
// library (problem, chain, schedule, simulator, memory bounds, graph utilities, solvers, MILP
// model, partitioning, the hierarchy, H-Rockmate and the execution engine).
//
// Optional layers are included on their own: remat/io/json.hpp (nlohmann/json),
// remat/milp/lp_solve.hpp and remat/milp/cbc.hpp (MILP backends), remat/torch/*.hpp.
#pragma once

#include "core/bytes.hpp"
#include "version.hpp"
#include "core/errors.hpp"
#include "core/problem.hpp"
#include "core/chain.hpp"
#include "core/schedule.hpp"
#include "core/simulate.hpp"
#include "core/solver.hpp"
#include "core/time_bounded.hpp"
#include "core/timing.hpp"
#include "core/bounds.hpp"
#include "core/progress.hpp"
#include "core/explain.hpp"
#include "graph/topological.hpp"
#include "graph/dominators.hpp"
#include "graph/production.hpp"
#include "graph/structure_key.hpp"
#include "solvers/store_all.hpp"
#include "solvers/exhaustive.hpp"
#include "solvers/periodic.hpp"
#include "solvers/rotor.hpp"
#include "solvers/sequence_solver.hpp"
#include "partition/blocks.hpp"
#include "solvers/rockmate.hpp"
#include "solvers/improve.hpp"
#include "solvers/greedy.hpp"
#include "partition/hierarchy.hpp"
#include "solvers/hierarchical.hpp"
#include "solvers/auto.hpp"
#include "exec/report.hpp"
#include "exec/plan.hpp"
#include "exec/backend.hpp"
#include "exec/executor.hpp"
#include "io/budget.hpp"
#include "io/svg.hpp"
#include "io/sweep.hpp"
