// A planner-only consumer: the standard library and remat, nothing else.
#include <remat/remat.hpp>

#include <cstdio>
#include <cstring>
#include <string>

int main() {
    static_assert(REMAT_VERSION >= 200, "the installed remat is older than this test");
    remat::Chain chain{"consumer", 1 << 20, {}};
    for (int l = 0; l < 6; ++l) chain.stages.push_back({"layer" + std::to_string(l), 1.0, 2.0, 1 << 20, 1 << 21, 0, 0});
    const remat::Problem problem = remat::to_problem(chain);
    const remat::Reference reference = remat::store_all_reference(problem);
    const remat::Plan plan = remat::Auto{}.solve(problem, reference.peak * 6 / 10);
    std::printf("remat %s: planned '%s' at %lld of %lld bytes, time %.1f (store-all %.1f)\n", remat::version_string,
                problem.name().c_str(), static_cast<long long>(plan.peak), static_cast<long long>(reference.peak),
                plan.time, reference.time);
    return plan.peak <= reference.peak * 6 / 10 && std::strcmp(remat::version_string, REMAT_VERSION_STRING) == 0 ? 0 : 1;
}
