// remat-plan — plan a training step within a memory budget from a problem or chain file.
// The command line itself lives in cli/remat_plan.hpp (tested in-process); see --help.
#include <iostream>
#include <string>
#include <vector>

#include "cli/remat_plan.hpp"

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    return remat::cli::run_remat_plan(args, std::cout, std::cerr);
}
