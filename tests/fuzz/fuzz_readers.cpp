// libFuzzer target over the standard-library-only layer and its JSON formats (scripts/sanitize
// builds it with clang -fsanitize=fuzzer,address,undefined and runs it for a bounded time from
// the corpus in tests/fuzz/corpus/).
//
// An input is one of:
//   - a problem or chain document (remat.problem/1, remat.chain/1): read, written and read back
//     (the same problem), its store-all reference simulated, the greedy run on small problems
//     and Rotor on short chains;
//   - a problem or chain, a line "---", then a schedule of it (remat.schedule/1): the schedule
//     read, simulated and written back; a remat.schedule/2 (docs/formats.md §11) likewise,
//     with the offload simulator;
//   - "budget:" followed by a budget text (parse_budget_spec).
// remat::Error is the expected answer to bad input. Anything else (another exception, a
// "this is a bug" message, a round trip that changes the problem, a report that contradicts
// itself) aborts, which libFuzzer reports with the input.
#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/io/offload_json.hpp>
#include <remat/remat.hpp>
#include <remat/solvers/greedy.hpp>
#include <remat/solvers/rotor.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void bug(const std::string& what) {
    std::fprintf(stderr, "fuzz_readers: %s\n", what.c_str());
    std::abort();
}

void check(bool condition, const char* what) {
    if (!condition) bug(what);
}

// Cheap solvers on small problems; their plans are checked by make_checked_plan already.
void solve_small(const remat::Problem& p, const remat::Reference& ref) {
    if (p.has_updates()) return;  // planned by remat::offload, which splits the updates off first
    if (p.op_count() <= 60 && p.data_count() <= 60) {
        try {
            const remat::Plan plan = remat::Greedy{}.solve(p, ref.peak);
            check(plan.peak <= ref.peak, "greedy plan above its budget");
        } catch (const remat::Infeasible&) {
        }
    }
    if (const auto chain = remat::as_chain(p); chain && chain->length() <= 24) {
        try {
            const remat::Plan plan = remat::Rotor{}.solve(p, ref.peak / 2 + ref.peak / 4);
            check(plan.time >= ref.time * (1 - 1e-9) || plan.time >= ref.time - 1e-9, "rotor faster than store-all");
        } catch (const remat::Infeasible&) {
        }
    }
}

void problem_and_schedule(std::string_view problem_text, std::string_view schedule_text, bool with_schedule) {
    const remat::Problem p = remat::io::parse_any(problem_text, "fuzz");
    const remat::Problem again = remat::io::parse_problem(remat::io::to_json(p), "round-trip");
    check(again == p, "a problem written and read back differs");
    const remat::Reference ref = remat::store_all_reference(p);
    const remat::SimulationReport r = remat::simulate(p, ref.schedule);
    check(r.valid && r.peak == ref.peak && r.time == ref.time, "the store-all reference does not simulate to itself");
    if (!with_schedule) {
        solve_small(p, ref);
        return;
    }
    if (schedule_text.find("remat.schedule/2") != std::string_view::npos) {
        const remat::io::SavedOffloadSchedule saved = remat::io::parse_offload_schedule(p, schedule_text, "fuzz-schedule");
        const remat::offload::OffloadReport s = remat::offload::simulate(p, saved.schedule);
        check(s.valid || s.error_step.has_value(), "an invalid offloading schedule without its step");
        check(s.device_peak >= s.device_initial && s.host_peak >= s.host_initial, "a peak below the initial memory");
        check(!s.valid || s.makespan >= s.compute_time * (1 - 1e-12), "a makespan below the compute time");
        const auto back = remat::io::parse_offload_schedule(p, remat::io::to_json(p, saved), "round-trip");
        check(back == saved, "an offloading schedule written and read back differs");
        return;
    }
    const remat::io::SavedSchedule saved = remat::io::parse_schedule(p, schedule_text, "fuzz-schedule");
    const remat::SimulationReport s = remat::simulate(p, saved.steps);
    check(s.valid || s.error_step.has_value(), "an invalid schedule without its step");
    check(s.peak >= s.initial, "a peak below the initial memory");
    const remat::io::SavedSchedule back = remat::io::parse_schedule(p, remat::io::to_json(p, saved), "round-trip");
    check(back == saved, "a schedule written and read back differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    try {
        if (input.rfind("budget:", 0) == 0) {
            const remat::BudgetSpec spec = remat::parse_budget_spec(input.substr(7));
            const remat::Bytes b = spec.resolve(remat::Bytes{1} << 40, 1000);
            check(b >= 0, "a negative budget");
            return 0;
        }
        const auto separator = input.find("\n---\n");
        const bool with_schedule = separator != std::string_view::npos;
        problem_and_schedule(input.substr(0, separator), with_schedule ? input.substr(separator + 5) : std::string_view{},
                             with_schedule);
    } catch (const remat::SolverError& e) {
        if (std::string_view(e.what()).find("bug") != std::string_view::npos) bug(e.what());
    } catch (const remat::Error&) {
    } catch (const std::exception& e) {
        bug(std::string("an exception outside remat's hierarchy: ") + e.what());
    }
    return 0;
}
