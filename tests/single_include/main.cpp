// Built with single_include/ as its only include path: the generated header must be
// self-sufficient. It plans a small chain with the umbrella's solvers and prepares the plan
// for the execution engine.
#include <remat/remat.hpp>

#include <cstdio>

int main() {
    const remat::Chain chain{"single-include", 1024,
                             {{"l1", 1.0, 2.0, 1024, 3072, 0, 0},
                              {"l2", 2.0, 3.0, 2048, 2048, 128, 0},
                              {"l3", 1.0, 1.0, 1024, 4096, 0, 256}}};
    const remat::Problem problem = remat::to_problem(chain);
    const remat::Reference ref = remat::store_all_reference(problem);
    const remat::Plan plan = remat::StoreAll{}.solve(problem, ref.peak);
    const remat::Plan exact = remat::Exhaustive{}.solve(problem, ref.peak);
    const remat::Plan greedy = remat::Greedy{}.solve(problem, ref.peak);
    const bool ok = plan.time == ref.time && exact.time <= plan.time && remat::simulate(problem, exact.schedule).valid &&
                    greedy.time == ref.time;
    // The execution engine's view of the chain: unit l for stage l.
    remat::ExecutionTable table;
    table.units = chain.length() + 1;
    const remat::ChainIds ids = remat::chain_ids(chain.length());
    table.op_role.assign(problem.op_count(), remat::ExecOpRole::forward);
    table.op_unit.assign(problem.op_count(), 0);
    table.data_role.assign(problem.data_count(), remat::ExecDataRole::activation);
    table.data_unit.assign(problem.data_count(), 0);
    for (std::size_t l = 1; l <= chain.length(); ++l) {
        table.op_role[ids.fwd_grad[l].index] = remat::ExecOpRole::forward_grad;
        table.op_role[ids.bwd[l].index] = remat::ExecOpRole::backward;
        for (const remat::OpId k : {ids.fwd[l], ids.fwd_grad[l], ids.bwd[l]}) table.op_unit[k.index] = l;
        table.data_role[ids.s[l].index] = remat::ExecDataRole::saved;
    }
    table.op_role[ids.loss.index] = remat::ExecOpRole::loss;
    table.check(problem);
    const remat::ExecutionPlan prepared = remat::prepare_execution(problem, problem, table, exact);
    const bool engine_ok = prepared.predicted_peak() == exact.peak && prepared.prepared().forward_runs.size() == 4;
    std::printf("single include: T_ref=%g P_ref=%lld exact=%g %s\n", ref.time, static_cast<long long>(ref.peak),
                exact.time, ok ? "ok" : "MISMATCH");
    return ok && engine_ok ? 0 : 1;
}
