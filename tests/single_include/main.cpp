// Built with single_include/ as its only include path: the generated header must be
// self-sufficient. It plans a small chain with every solver the umbrella offers.
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
    std::printf("single include: T_ref=%g P_ref=%lld exact=%g %s\n", ref.time, static_cast<long long>(ref.peak),
                exact.time, ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
