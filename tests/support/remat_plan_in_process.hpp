// Runs the remat-plan command line in-process (examples/cli/remat_plan.hpp) and keeps what it
// printed, so the CLI tests of every layer check exit codes and output the same way.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "../../examples/cli/remat_plan.hpp"

namespace remat::testing {

struct CliResult {
    int code;
    std::string out;
    std::string err;
};

[[nodiscard]] inline CliResult remat_plan(const std::vector<std::string>& args) {
    std::ostringstream out, err;
    const int code = remat::cli::run_remat_plan(args, out, err);
    return {code, out.str(), err.str()};
}

}  // namespace remat::testing
