// bench_limits — how remat behaves at the edges of size (docs/formats.md §8, limits).
//
// 1. Rotor (Beaumont et al. 2019) on chains of L = 1,000, 2,000 and 10,000 stages, with a
//    time limit: the wall time, the peak resident memory of the process that solved it, and
//    what it answered (a plan, or a refusal that names the phase and the limit). The DP's
//    work grows as L³ and its tables as L², so a long chain must stop within its limit
//    rather than run for hours or be killed for memory.
// 2. Reading a problem of about one million ops (a chain expanded by to_problem, written
//    with to_json): the read time and the peak memory of the reader.
//
// Each case runs in its own child process (fork), so that its peak resident memory is its
// own. Linux and other POSIX systems only.
//
//   bench_limits [--time-limit SECONDS] [--ops N]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <remat/io/json.hpp>
#include <remat/remat.hpp>

namespace {

remat::Chain random_chain(std::size_t length, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(std::log(64.0 * 1024), std::log(4.0 * 1024 * 1024));
    std::uniform_real_distribution<double> log_time(std::log(0.1e-3), std::log(5e-3));
    const auto size = [&] { return static_cast<remat::Bytes>(std::exp(log_size(rng))); };
    remat::Chain chain{"chain-" + std::to_string(length), size(), {}};
    for (std::size_t l = 1; l <= length; ++l) {
        const remat::Bytes out = size();
        const double fwd = std::exp(log_time(rng));
        chain.stages.push_back(remat::Stage{std::to_string(l), fwd, 2.0 * fwd, out, 2 * out, 0, 0});
    }
    return chain;
}

double seconds_between(std::chrono::steady_clock::time_point from) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
}

// Runs `work` in a child process; it writes one line of result into a pipe. Returns the
// line, the child's wall time and its peak resident memory in MiB.
struct ChildResult {
    std::string line;
    double seconds = 0.0;
    double peak_mib = 0.0;
};

template <class Work>
ChildResult in_child(Work work) {
    int fds[2];
    if (pipe(fds) != 0) std::exit(1);
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid < 0) std::exit(1);
    if (pid == 0) {
        close(fds[0]);
        const std::string line = work();
        const ssize_t written = write(fds[1], line.data(), line.size());
        _exit(written == static_cast<ssize_t>(line.size()) ? 0 : 1);
    }
    close(fds[1]);
    ChildResult result;
    char buffer[512];
    ssize_t got = 0;
    while ((got = read(fds[0], buffer, sizeof buffer)) > 0) result.line.append(buffer, static_cast<std::size_t>(got));
    close(fds[0]);
    int status = 0;
    rusage usage{};
    wait4(pid, &status, 0, &usage);
    result.seconds = seconds_between(start);
    result.peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) result.line = "child failed (status " + std::to_string(status) + ")";
    return result;
}

std::string first_words(const std::string& text, std::size_t limit) {
    return text.size() <= limit ? text : text.substr(0, limit - 3) + "...";
}

}  // namespace

int main(int argc, char** argv) {
    double time_limit = 5.0;
    std::size_t ops = 1'000'000;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--time-limit" && i + 1 < argc) {
            time_limit = std::atof(argv[++i]);
        } else if (arg == "--ops" && i + 1 < argc) {
            ops = static_cast<std::size_t>(std::atoll(argv[++i]));
        } else {
            std::fprintf(stderr, "usage: bench_limits [--time-limit SECONDS] [--ops N]\n");
            return 2;
        }
    }
    if (!(time_limit > 0) || ops < 8) {
        std::fprintf(stderr, "bench_limits: the time limit must be positive and --ops at least 8\n");
        return 2;
    }

    std::printf("Rotor on long chains, 500 slots, budget 30%% of P_ref, time limit %g s, one process per case\n\n",
                time_limit);
    std::printf("%7s %9s %10s  %s\n", "L", "wall s", "peak MiB", "answer");
    bool within_limits = true;
    for (const std::size_t length : {std::size_t{1000}, std::size_t{2000}, std::size_t{10000}}) {
        const ChildResult r = in_child([&] {
            const remat::Chain chain = random_chain(length, 7 + length);
            const remat::Problem problem = remat::to_problem(chain);
            const remat::Bytes budget = remat::percent_of(remat::store_all_reference(problem).peak, 30.0);
            remat::RotorOptions options;
            options.time_limit_seconds = time_limit;
            try {
                const remat::Plan plan = remat::Rotor(options).solve(chain, budget);
                char text[96];
                std::snprintf(text, sizeof text, "plan, %zu steps, peak %.1f%% of the budget", plan.schedule.size(),
                              100.0 * static_cast<double>(plan.peak) / static_cast<double>(budget));
                return std::string(text);
            } catch (const remat::Error& e) {
                return std::string(e.what());
            }
        });
        // The answer must come within the limit, plus the chain's construction and slack.
        within_limits = within_limits && r.seconds < 1.5 * time_limit + 2.0;
        std::printf("%7zu %9.2f %10.1f  %s\n", length, r.seconds, r.peak_mib, first_words(r.line, 150).c_str());
    }

    // A chain of S stages expands to 3 S + 1 ops (docs/formats.md §5).
    const std::size_t stages = std::max<std::size_t>(2, ops / 3);
    // The text is generated inside the reader's process: a child forked from a parent with a
    // large heap pays copy-on-write faults that a real reader never pays.
    const ChildResult read = in_child([&] {
        std::string text;
        {
            const remat::Problem big = remat::to_problem(random_chain(stages, 11));
            text = remat::io::to_json(big);
        }
        const auto start = std::chrono::steady_clock::now();
        const remat::Problem problem = remat::io::parse_problem(text, "generated");
        char line[160];
        std::snprintf(line, sizeof line, "%zu ops and %zu data (%.1f MiB of JSON) read in %.2f s",
                      problem.all_ops().size(), problem.all_data().size(), static_cast<double>(text.size()) / 1048576.0,
                      seconds_between(start));
        return std::string(line);
    });
    std::printf("\nReading a large problem (remat.problem/1)\n\n%s\npeak resident memory %.1f MiB (the generation of "
                "the text included)\n", read.line.c_str(), read.peak_mib);
    std::printf("\n%s\n", within_limits ? "every Rotor case answered within its time limit"
                                        : "some Rotor case ran past its time limit");
    return within_limits ? 0 : 1;
}
