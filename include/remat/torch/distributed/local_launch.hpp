// remat/torch/distributed/local_launch.hpp — starts the ranks of a data-parallel job as
// processes on this machine, as torchrun does on one node: each gets RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT (and LOCAL_RANK) in its environment, its output goes to a log
// file, and the job is waited for within a deadline, past which every rank still running is
// killed (a job never leaves processes behind). POSIX (posix_spawn); no LibTorch needed.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../../core/errors.hpp"

extern char** environ;  // POSIX: the process's environment, passed on to the ranks

namespace remat::torch::distributed {

struct LocalLaunchOptions {
    /// Variables added to every rank's environment ("NAME=value").
    std::vector<std::string> environment;
    /// Where rank r's standard output and error go: `log_folder`/rank<r>.log; empty: inherited.
    std::filesystem::path log_folder;
    std::string master_address = "127.0.0.1";
    /// 0: a free port is picked.
    std::uint16_t master_port = 0;
    /// Ranks still running after this are killed.
    std::chrono::milliseconds deadline{std::chrono::minutes(5)};
};

struct LocalJob {
    /// Per rank: its exit code, 128 + the signal that ended it, or -1 if it was killed at the
    /// deadline.
    std::vector<int> exit_codes;
    bool timed_out = false;
    double seconds = 0.0;

    [[nodiscard]] bool succeeded() const {
        for (const int code : exit_codes)
            if (code != 0) return false;
        return !timed_out;
    }
};

namespace detail::launch {

// A port the kernel says is free now (bound to port 0, read back, released).
inline std::uint16_t free_port();

}  // namespace detail::launch

/// Runs `program arguments...` as `world` ranks and waits for all of them (or the deadline).
[[nodiscard]] inline LocalJob launch_local(const std::string& program, const std::vector<std::string>& arguments,
                                           int world, const LocalLaunchOptions& options = {}) {
    if (world < 1) throw InvalidInput("launch_local: the world size must be at least 1, not " + std::to_string(world));
    const std::uint16_t port = options.master_port != 0 ? options.master_port : detail::launch::free_port();
    std::vector<pid_t> pids;
    const auto stop_all = [&pids] {
        for (pid_t& pid : pids)
            if (pid > 0) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
                pid = 0;
            }
    };
    const auto start = std::chrono::steady_clock::now();
    for (int rank = 0; rank < world; ++rank) {
        std::vector<std::string> env;
        for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
        for (const char* name : {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="})
            std::erase_if(env, [name](const std::string& v) { return v.rfind(name, 0) == 0; });
        env.push_back("RANK=" + std::to_string(rank));
        env.push_back("LOCAL_RANK=" + std::to_string(rank));
        env.push_back("WORLD_SIZE=" + std::to_string(world));
        env.push_back("MASTER_ADDR=" + options.master_address);
        env.push_back("MASTER_PORT=" + std::to_string(port));
        env.insert(env.end(), options.environment.begin(), options.environment.end());
        std::vector<char*> envp;
        for (std::string& v : env) envp.push_back(v.data());
        envp.push_back(nullptr);
        std::vector<std::string> args{program};
        args.insert(args.end(), arguments.begin(), arguments.end());
        std::vector<char*> argv;
        for (std::string& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);

        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        std::string log;
        if (!options.log_folder.empty()) {
            log = (options.log_folder / ("rank" + std::to_string(rank) + ".log")).string();
            posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            posix_spawn_file_actions_adddup2(&actions, 1, 2);
        }
        pid_t pid = 0;
        const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        if (rc != 0) {
            stop_all();
            throw InvalidInput("launch_local: cannot start '" + program + "' for rank " + std::to_string(rank) + ": " +
                               std::strerror(rc));
        }
        pids.push_back(pid);
    }
    LocalJob job;
    job.exit_codes.assign(pids.size(), -1);
    for (std::size_t running = pids.size(); running > 0;) {
        for (std::size_t r = 0; r < pids.size(); ++r) {
            int status = 0;
            if (pids[r] > 0 && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                job.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                pids[r] = 0;
                --running;
            }
        }
        if (running > 0 && std::chrono::steady_clock::now() - start > options.deadline) {
            job.timed_out = true;
            stop_all();
            break;
        }
        if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return job;
}

namespace detail::launch {

inline std::uint16_t free_port() {
    // Ports from the ephemeral range are what the kernel hands out for port 0; asking it
    // avoids a port another job holds (a race with a process that takes it meanwhile remains).
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw ExecutionError(std::string("launch_local: socket(): ") + std::strerror(errno));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof address;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
    ::close(fd);
    if (!ok) throw ExecutionError(std::string("launch_local: no free port: ") + std::strerror(errno));
    return ntohs(address.sin_port);
}

}  // namespace detail::launch

}  // namespace remat::torch::distributed
