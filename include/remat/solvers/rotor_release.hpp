// remat/solvers/rotor_release.hpp — RotorRelease: Rotor's DP with one more move, which takes
// chain plans beyond the persistent class.
//
// Rotor (Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
// heterogeneous chains", 2019) is optimal among persistent schedules: a sub-chain's input
// stays live until the sub-chain is back-propagated. The optimum over all schedules often
// does better on chains whose backward reads its input (convolutions, linear layers): it
// frees a checkpoint a_{j-1} right after stage j's forward with grad, runs the part above j
// without it, and recomputes a_{j-1} from the previous checkpoint just before stage j's
// backward. RotorRelease adds exactly that branch to the recursion (rotor/least_memory.hpp:
// F∅ from the sub-chain's input a_{a-1} up to a_{j-1}, stage j with grad, a_{j-1} freed, the
// part above j as a sub-chain that frees its input after its first forward, then the part
// below j as a "turn" sub-chain, which recomputes a_{j-1} for stage j's backward). Sub-chains
// may also free their input after its last use (open and partial ends). rotor/branches.hpp
// defines these shapes; RotorClass (rotor/chain.hpp) says which the DP ranges over. On a
// plain chain its work is O(M·L³), Rotor's complexity, with a larger constant: 4-7 times
// Rotor's solve time at 100-200 stages with the release class, 15-20 times with release_early
// (a chain of K options per stage has K² more shapes per sub-chain).
//
// Its plans are never slower than Rotor's at the same slots (its class contains every
// persistent schedule) and its smallest budget is never larger. Against the exact search over
// all schedules (Exhaustive, tests/core/test_rotor_release.cpp, 2,400 random plain chains of
// 1-6 stages): equal at every budget of every chain of up to 4 stages; at 5 and 6 stages equal
// at 99.7 % and 98.8 % of budgets (worst gaps 7.4 % and 13.5 %). What still separates them is
// a schedule that drops a stage's saved data, keeps its output, and runs its forward with
// grad again over the live output later: the stage then lives in two halves, which no shape of
// sub-chain describes (a shape's stage is either untouched, wholly stored, or pending with all
// its saved data).
#pragma once

#include <string_view>
#include <utility>

#include "../core/chain.hpp"
#include "../core/problem.hpp"
#include "../core/solver.hpp"
#include "rotor.hpp"

namespace remat {

/// The fastest schedule of a chain within the budget among persistent schedules and those
/// that release checkpoints (see above), checked by the simulator. Takes RotorOptions (slots,
/// time limit, table cap); its schedule class is release_by_length unless another wide class
/// is given, and short chains get more slots (RotorOptions::more_slots_for_short_chains).
class RotorRelease : public Rotor {
public:
    explicit RotorRelease(RotorOptions options = {}) : Rotor(widened(std::move(options)), name()) {}

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "rotor-release"; }

private:
    [[nodiscard]] static RotorOptions widened(RotorOptions options) {
        if (options.schedule_class == RotorClass::persistent) options.schedule_class = RotorClass::release_by_length;
        options.more_slots_for_short_chains = true;
        return options;
    }
};

}  // namespace remat
