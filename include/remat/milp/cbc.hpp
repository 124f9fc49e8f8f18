// remat/milp/cbc.hpp — the COIN-OR CBC backend of the MilpBackend concept.
//
// CBC (Forrest, Lougee-Heimer et al., COIN-OR Branch and Cut; EPL) through its C interface
// (coinor-libcbc-dev, pkg-config cbc). Its cutting planes and heuristics often close the
// gap of scheduling MILPs much faster than plain branch and bound, and it accepts a MIP
// start. Each solve owns its Cbc_Model through a RAII handle; log levels are 0; the time
// limit and gaps go through CBC's own parameters ("sec", "ratioGap", "allowableGap"). Include
// this header only when linking CBC (CMake: remat::cbc).
//
// Threads: "threads 1" in CBC 2.10 is not a serial search but a tree search in one worker
// thread, and in about one solve of 200 (19 of 3,000 solves of an 8-variable knapsack) the
// main thread then waits 10 s to join it, a lost wake-up in CbcBaseModel::waitForThreadsInTree,
// whatever the time limit: a 3 s limit took 10 s, a knapsack under a 5 s limit came back
// "feasible" instead of optimal, and the time bound's tiny relaxations lost their stage's share
// of its limit. "threads 0" (serial, in the calling thread) never stalled in 5,000 such solves,
// each within 6 ms. But on some larger models the serial search is slower: the time bound's
// 21-cut relaxation of a 61-op chain (920 variables) took 4.4 s serial against 1.3 s threaded.
// So models of fewer than serial_below_variables variables, which solve in milliseconds and for
// which a 10 s stall is a thousand times their cost, are solved serially; larger ones keep the
// one worker thread, and with it the rare stall (1 of 3,000 solves of a 300-variable knapsack,
// 3 of 3,000 in CBC's deterministic mode, "threads 101"). Under a time limit such a solve runs
// in the child process below, whatever its size, so that the deadline holds: a stalled child
// is killed at the limit, and the answer is the MIP start or "no solution in time".
//
// CBC does not stop inside its root LP and root cut loop, whatever "sec" says (a Checkmate
// model of 12,000 columns ran 272 s under a 40 s limit), and it overruns "sec" elsewhere too
// (by a fifth on a 40-op DAG's model). With a finite time limit the solve therefore runs in a
// child process (POSIX fork) and the result comes back through a pipe. CBC's "sec" there is
// own_limit_share of the limit, so that it usually stops by itself, with its incumbent and
// its proven bound; a child still running at the limit is killed and the answer is "no
// solution in time" (or the MIP start, when one was given). A serial model of fewer than
// in_process_below_variables variables stays in this process: its root LP and cut loop take
// milliseconds, while a fork costs about 25 ms, and far more in a large process (under
// AddressSanitizer, the time bound's test on 78 tiny problems took 408 s with a fork per
// solve, 76 s without). Set hard_deadline = false to solve every model in-process.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <coin/Cbc_C_Interface.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdint>
#include <cerrno>
#include <cstring>

#include "../core/timing.hpp"
#include "backend.hpp"
#include "model.hpp"

namespace remat::milp {

namespace detail::cbc {

struct CbcDeleter {
    void operator()(Cbc_Model* model) const noexcept {
        if (model != nullptr) Cbc_deleteModel(model);
    }
};
using CbcHandle = std::unique_ptr<Cbc_Model, CbcDeleter>;

// CBC's infinity (COIN_DBL_MAX, not exported by the C interface).
inline constexpr double cbc_infinity = std::numeric_limits<double>::max();

// CBC's C interface takes parameters as command-line strings.
inline std::string cbc_number(double x) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.17g", x);
    return buffer;
}

// The child's answer on the pipe: this header, the values, then an error message.
struct CbcWire {
    int status = 0;
    int failed = 0;
    double objective = 0.0, best_bound = 0.0, seconds = 0.0;
    std::uint64_t values = 0, message = 0;
};

// Writes all of `size` bytes (a pipe may take them in parts).
inline bool write_all(int fd, const void* data, std::size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t n = ::write(fd, p, size);
        if (n <= 0) return false;
        p += n;
        size -= static_cast<std::size_t>(n);
    }
    return true;
}

// The model as Cbc_loadProblem wants it: the rows copied column by column, row and
// column bounds clamped to CBC's infinity, the objective.
struct CbcColumns {
    std::vector<CoinBigIndex> col_start;
    std::vector<int> row_index;
    std::vector<double> value;
    std::vector<double> row_lower, row_upper;
    std::vector<double> col_lower, col_upper, objective;
    bool has_integers = false;
};

inline CbcColumns column_major(const Model& model) {
    const auto& vars = model.variables();
    const auto& rows = model.rows();
    const std::size_t n = vars.size();
    CbcColumns c;
    c.col_start.assign(n + 1, 0);
    for (const Row& row : rows)
        for (const Term& t : row.terms) ++c.col_start[t.var.index + 1];
    for (std::size_t j = 0; j < n; ++j) c.col_start[j + 1] += c.col_start[j];
    c.row_index.resize(static_cast<std::size_t>(c.col_start[n]));
    c.value.resize(static_cast<std::size_t>(c.col_start[n]));
    std::vector<CoinBigIndex> fill(c.col_start.begin(), c.col_start.end() - 1);
    c.row_lower.resize(rows.size());
    c.row_upper.resize(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& row = rows[i];
        for (const Term& t : row.terms) {
            const auto at = static_cast<std::size_t>(fill[t.var.index]++);
            c.row_index[at] = static_cast<int>(i);
            c.value[at] = t.coef;
        }
        c.row_lower[i] = row.sense == Sense::less_equal ? -cbc_infinity : row.rhs;
        c.row_upper[i] = row.sense == Sense::greater_equal ? cbc_infinity : row.rhs;
    }
    c.col_lower.resize(n);
    c.col_upper.resize(n);
    c.objective.resize(n);
    const auto clamp = [](double x) { return std::clamp(x, -cbc_infinity, cbc_infinity); };
    for (std::size_t j = 0; j < n; ++j) {
        c.col_lower[j] = clamp(vars[j].lower);
        c.col_upper[j] = clamp(vars[j].upper);
        c.objective[j] = vars[j].objective;
        c.has_integers = c.has_integers || vars[j].type != VarType::continuous;
    }
    return c;
}

}  // namespace detail::cbc

class Cbc {
public:
    /// Run a time-limited solve in a child process killed at its hard deadline (see above).
    bool hard_deadline = true;
    /// Serial models with fewer variables than this are solved in-process even with a hard
    /// deadline (threaded ones never are: see serial_below_variables).
    std::size_t in_process_below_variables = 1000;
    /// With the hard deadline, the share of the time limit (in (0, 1]) given to CBC's own
    /// "sec": the rest is room for its overruns before the child is killed at the limit (see
    /// above). On bench_checkmate's 20- to 60-op DAGs, 0.8 gave the same plans as the full limit.
    double own_limit_share = 0.8;
    /// Models with fewer variables than this are solved serially ("threads 0"), larger ones
    /// with one worker thread ("threads 1"), and under a time limit with the hard deadline
    /// in the child process, which honours the limit even when CBC stalls (see the top of
    /// this header).
    std::size_t serial_below_variables = 256;

    [[nodiscard]] static constexpr std::string_view name() noexcept { return "cbc"; }

    [[nodiscard]] Result solve(const Model& model) const {
        // A threaded solve may stall 10 s past any limit (see above): under a limit it runs in
        // the child, which the deadline kills, whatever its size.
        if (hard_deadline && std::isfinite(model.parameters().time_limit_seconds) &&
            (threaded(model) || model.variable_count() >= in_process_below_variables))
            return solve_in_child(model);
        return solve_here(model);
    }

private:
    // Whether CBC runs this model's tree search in its worker thread (serial_below_variables).
    [[nodiscard]] bool threaded(const Model& model) const noexcept {
        return model.variable_count() >= serial_below_variables;
    }

    // Forks; the child solves and writes its Result; the parent reads it until the deadline.
    [[nodiscard]] Result solve_in_child(const Model& model) const {
        const auto start = std::chrono::steady_clock::now();
        int fds[2];
        if (::pipe(fds) != 0) return solve_here(model);
        // Output buffered in this process would otherwise be written twice: CBC flushes
        // the child's copy of the buffers.
        std::fflush(nullptr);
        const pid_t child = ::fork();
        if (child < 0) {
            ::close(fds[0]);
            ::close(fds[1]);
            return solve_here(model);
        }
        const double limit = std::max(0.01, model.parameters().time_limit_seconds);
        if (child == 0) {
            ::close(fds[0]);
            child_main(model, own_limit_share * limit, fds[1]);
        }
        ::close(fds[1]);
        std::string bytes;
        const bool complete = read_until(fds[0], bytes, start, limit);
        ::close(fds[0]);
        if (!complete) ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        if (!complete) return stopped(model, start);
        return decode(bytes, start);
    }

    [[noreturn]] void child_main(const Model& model, double own_limit_seconds, int fd) const {
        detail::cbc::CbcWire head;
        std::vector<double> values;
        std::string message;
        try {
            Result r = solve_here(model, own_limit_seconds);
            head.status = static_cast<int>(r.status);
            head.objective = r.objective;
            head.best_bound = r.best_bound;
            head.seconds = r.seconds;
            values = std::move(r.values);
        } catch (const std::exception& e) {
            head.failed = 1;
            message = e.what();
        }
        head.values = values.size();
        head.message = message.size();
        const bool ok = detail::cbc::write_all(fd, &head, sizeof head) &&
                        detail::cbc::write_all(fd, values.data(), values.size() * sizeof(double)) &&
                        detail::cbc::write_all(fd, message.data(), message.size());
        ::close(fd);
        ::_exit(ok ? 0 : 1);
    }

    // Reads the pipe to its end; false when the deadline (seconds from start) passes first.
    [[nodiscard]] static bool read_until(int fd, std::string& bytes, std::chrono::steady_clock::time_point start,
                                         double deadline) {
        char buffer[65536];
        for (;;) {
            const double left = deadline - seconds_since(start);
            if (left <= 0) return false;
            pollfd p{fd, POLLIN, 0};
            const int ready = ::poll(&p, 1, static_cast<int>(std::min(left, 60.0) * 1000) + 1);
            if (ready < 0 && errno != EINTR) return false;
            if (ready <= 0) continue;
            const ssize_t n = ::read(fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return true;
            bytes.append(buffer, static_cast<std::size_t>(n));
        }
    }

    // The answer when the child was killed: the MIP start when it is a solution, else none.
    [[nodiscard]] static Result stopped(const Model& model, std::chrono::steady_clock::time_point start) {
        Result r;
        r.status = Status::time_limit_no_solution;
        if (model.start() && model.is_feasible(*model.start())) {
            r.status = Status::feasible;
            r.values = *model.start();
            r.objective = model.objective_value(r.values);
        }
        r.seconds = seconds_since(start);
        return r;
    }

    [[nodiscard]] static Result decode(const std::string& bytes, std::chrono::steady_clock::time_point start) {
        detail::cbc::CbcWire head;
        if (bytes.size() < sizeof head)
            throw SolverError("cbc: the solving process ended without an answer (killed, or out of memory?)");
        std::memcpy(&head, bytes.data(), sizeof head);
        if (bytes.size() != sizeof head + head.values * sizeof(double) + head.message)
            throw SolverError("cbc: the solving process sent a truncated answer");
        if (head.failed) throw SolverError(bytes.substr(sizeof head + head.values * sizeof(double)));
        Result r;
        r.status = static_cast<Status>(head.status);
        r.objective = head.objective;
        r.best_bound = head.best_bound;
        r.values.resize(head.values);
        // No values (a model without a solution): an empty vector's data() may be null, which
        // memcpy must not get even for zero bytes.
        if (head.values > 0) std::memcpy(r.values.data(), bytes.data() + sizeof head, head.values * sizeof(double));
        r.seconds = seconds_since(start);
        return r;
    }

    // `own_limit_seconds`: CBC's "sec" when not the model's time limit (in the child).
    [[nodiscard]] Result solve_here(const Model& model, std::optional<double> own_limit_seconds = std::nullopt) const {
        const auto start = std::chrono::steady_clock::now();
        const detail::cbc::CbcColumns columns = detail::cbc::column_major(model);
        const detail::cbc::CbcHandle cbc = load(model, columns);
        set_parameters(cbc.get(), model.parameters(), own_limit_seconds.value_or(model.parameters().time_limit_seconds),
                       !threaded(model));
        const bool use_start = columns.has_integers && model.start().has_value() && model.is_feasible(*model.start());
        if (use_start) set_mip_start(cbc.get(), model);

        Cbc_solve(cbc.get());

        Result r = outcome(cbc.get(), model, columns.has_integers, use_start);
        r.seconds = seconds_since(start);
        return r;
    }

    // A silenced Cbc_Model holding the model, to be minimised.
    [[nodiscard]] static detail::cbc::CbcHandle load(const Model& model, const detail::cbc::CbcColumns& c) {
        const auto& vars = model.variables();
        const std::size_t n = vars.size();
        detail::cbc::CbcHandle cbc(Cbc_newModel());
        if (!cbc) throw SolverError("cbc: Cbc_newModel failed (out of memory?)");
        Cbc_setLogLevel(cbc.get(), 0);
        Cbc_setParameter(cbc.get(), "log", "0");
        Cbc_setParameter(cbc.get(), "slog", "0");
        Cbc_loadProblem(cbc.get(), static_cast<int>(n), static_cast<int>(model.rows().size()), c.col_start.data(),
                        c.row_index.data(), c.value.data(), c.col_lower.data(), c.col_upper.data(), c.objective.data(),
                        c.row_lower.data(), c.row_upper.data());
        for (std::size_t j = 0; j < n; ++j)
            if (vars[j].type != VarType::continuous) Cbc_setInteger(cbc.get(), static_cast<int>(j));
        Cbc_setObjSense(cbc.get(), 1.0);
        return cbc;
    }

    // The time limit and gaps, both through the API and as CBC's own parameters.
    static void set_parameters(Cbc_Model* cbc, const Parameters& par, double time_limit_seconds, bool serial) {
        if (std::isfinite(time_limit_seconds)) {
            const double seconds = std::max(0.01, time_limit_seconds);
            Cbc_setMaximumSeconds(cbc, seconds);
            Cbc_setParameter(cbc, "timeMode", "elapsed");
            Cbc_setParameter(cbc, "sec", detail::cbc::cbc_number(seconds).c_str());
        }
        Cbc_setAllowableFractionGap(cbc, par.relative_gap);
        Cbc_setAllowableGap(cbc, par.absolute_gap);
        Cbc_setParameter(cbc, "ratioGap", detail::cbc::cbc_number(par.relative_gap).c_str());
        Cbc_setParameter(cbc, "allowableGap", detail::cbc::cbc_number(par.absolute_gap).c_str());
        Cbc_setParameter(cbc, "threads", serial ? "0" : "1");  // see the top of this header
        // CBC 2.10's preprocessing can shrink a model to under three rows, on which its
        // heuristics abort in OsiClpSolverInterface::crunch (coin-or/Cbc#684).
        Cbc_setParameter(cbc, "preprocess", "off");
    }

    // The model's start as CBC's MIP start: its integer columns, rounded.
    static void set_mip_start(Cbc_Model* cbc, const Model& model) {
        const auto& vars = model.variables();
        const std::vector<double>& given = *model.start();
        std::vector<int> columns;
        std::vector<double> values;
        for (std::size_t j = 0; j < vars.size(); ++j)
            if (vars[j].type != VarType::continuous) {
                columns.push_back(static_cast<int>(j));
                values.push_back(std::round(given[j]));
            }
        Cbc_setMIPStartI(cbc, static_cast<int>(columns.size()), columns.data(), values.data());
    }

    // The Result of a finished Cbc_solve (seconds left at 0): CBC's solution, or the start
    // when CBC found nothing better, with the bound CBC proved.
    [[nodiscard]] static Result outcome(Cbc_Model* cbc, const Model& model, bool has_integers, bool use_start) {
        if (Cbc_isAbandoned(cbc)) throw SolverError("cbc: the solve was abandoned because of numerical difficulties");
        if (Cbc_isContinuousUnbounded(cbc))
            throw SolverError("cbc: the model is unbounded (a variable without a bound has a negative cost)");
        const double offset = model.objective_offset();
        const bool limit_hit = Cbc_isSecondsLimitReached(cbc) || Cbc_status(cbc) == 1;
        const double* best = has_integers ? Cbc_bestSolution(cbc) : nullptr;
        const bool proven_optimal = Cbc_isProvenOptimal(cbc) != 0;
        const bool solution = has_integers ? best != nullptr : proven_optimal;
        double bound = Cbc_getBestPossibleObjValue(cbc) + offset;
        if (!std::isfinite(bound) || std::abs(bound) >= 1e50) bound = -infinity;
        const double start_objective = use_start ? model.objective_value(*model.start()) : infinity;

        if (solution) {
            const double* x = has_integers ? best : Cbc_getColSolution(cbc);
            std::vector<double> values(x, x + model.variables().size());
            const double objective_value = Cbc_getObjValue(cbc) + offset;
            if (use_start && objective_value > start_objective + 1e-9 * std::max(1.0, std::abs(start_objective))) {
                Result r{limit_hit ? Status::feasible : Status::optimal, *model.start(), start_objective, bound, 0.0};
                if (!limit_hit) r.best_bound = start_objective;
                return r;
            }
            const bool optimal = proven_optimal || !limit_hit;
            return Result{optimal ? Status::optimal : Status::feasible, std::move(values), objective_value,
                          optimal ? objective_value : std::min(bound, objective_value), 0.0};
        }
        if (use_start)
            return Result{limit_hit ? Status::feasible : Status::optimal, *model.start(), start_objective,
                          limit_hit ? std::min(bound, start_objective) : start_objective, 0.0};
        if (limit_hit) return Result{Status::time_limit_no_solution, {}, infinity, bound, 0.0};
        if (Cbc_isProvenInfeasible(cbc) || !has_integers) return Result{Status::infeasible, {}, infinity, infinity, 0.0};
        throw SolverError("cbc: the solve ended with status " + std::to_string(Cbc_status(cbc)) + "/" +
                          std::to_string(Cbc_secondaryStatus(cbc)) + " and no solution");
    }
};

static_assert(MilpBackend<Cbc>);

}  // namespace remat::milp
