// A consumer of the JSON component: a problem written and read back.
#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include <string>

int main() {
    remat::Chain chain{"json", 1024, {}};
    for (int l = 0; l < 3; ++l) chain.stages.push_back({"l" + std::to_string(l), 1.0, 1.0, 1024, 2048, 0, 0});
    const remat::Problem problem = remat::to_problem(chain);
    const remat::Problem back = remat::io::parse_problem(remat::io::to_json(problem));
    return back.op_count() == problem.op_count() ? 0 : 1;
}
