// remat/torch/distributed/process_group.hpp — c10d process groups for remat's data-parallel
// wrapper (data_parallel.hpp), made the same way on LibTorch 1.13 and 2.x: Gloo on the CPU,
// NCCL on CUDA (where LibTorch has it), and the rendezvous of torchrun's environment
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or a shared file.
//
// In 1.13, ProcessGroupGloo and ProcessGroupNCCL are c10d::ProcessGroups; since 2.0 they are
// c10d::Backends behind a ProcessGroup (detail/compat.hpp, process_group_of). make_gloo_group()
// and make_nccl_group() return a ProcessGroup on both.
//
// LibTorch declares its Gloo process group only when USE_C10D_GLOO is defined (NCCL's with
// USE_C10D_NCCL), as its own build does; this header defines them for the c10d headers it
// includes. Debian's LibTorch needs Gloo's headers for that: `apt-get install libgloo-dev`.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#if !__has_include(<gloo/rendezvous/store.h>)
#error "remat/torch/distributed needs Gloo's headers, which LibTorch's c10d includes: on Debian, apt-get install libgloo-dev"
#endif
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#if defined(REMAT_WITH_CUDA) && __has_include(<nccl.h>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#define REMAT_HAVE_NCCL 1
#endif

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef REMAT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "../../core/errors.hpp"
#include "../detail/compat.hpp"

namespace remat::torch::distributed {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

struct GroupOptions {
    /// How long a collective (and the rendezvous) may wait for the other processes before it
    /// fails: a dead or failed peer is an error on every process within it, never a hang.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    /// The address Gloo listens on and tells its peers: this machine's address on the network
    /// that joins the processes (127.0.0.1 for one machine).
    std::string address = "127.0.0.1";
    /// Gloo sends with writev(), which raises SIGPIPE in a process writing to a peer that has
    /// died, and SIGPIPE's default action ends the process at once: no error, nothing
    /// written, exit code 141. When the program left SIGPIPE at that default, make_gloo_group
    /// ignores it, as Python (and so every PyTorch job) does, so that a dead peer is an error
    /// here. False: SIGPIPE is left as it is.
    bool ignore_sigpipe = true;
};

/// Ignores SIGPIPE when the program left it at its default action (a handler or an ignore
/// the program set stays): make_gloo_group calls it unless GroupOptions::ignore_sigpipe is false.
inline void ignore_sigpipe_if_default() {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    (void)::sigaction(SIGPIPE, &ignore, nullptr);
}

/// A Gloo process group of `world_size` processes that meet through `store`.
[[nodiscard]] inline ProcessGroupPtr make_gloo_group(const StorePtr& store, int rank, int world_size,
                                                     const GroupOptions& options = {}) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        throw InvalidInput("make_gloo_group: rank " + std::to_string(rank) + " of a world of " +
                           std::to_string(world_size) + " (ranks go from 0 to the world size - 1)");
    if (options.ignore_sigpipe) ignore_sigpipe_if_default();
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.address));
    return detail::compat::process_group_of<c10d::ProcessGroup>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options), store, rank, world_size,
        c10::DeviceType::CPU, "gloo");
}

#ifdef REMAT_HAVE_NCCL
/// An NCCL process group for CUDA tensors (one GPU per process: set the current device first).
[[nodiscard]] inline ProcessGroupPtr make_nccl_group(const StorePtr& store, int rank, int world_size,
                                                     const GroupOptions& options = {}) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        throw InvalidInput("make_nccl_group: rank " + std::to_string(rank) + " of a world of " +
                           std::to_string(world_size));
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    return detail::compat::process_group_of<c10d::ProcessGroup>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options), store, rank, world_size,
        c10::DeviceType::CUDA, "nccl");
}
#endif

/// Where a process stands in a job, as torchrun says it: RANK, WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT.
struct LaunchEnvironment {
    int rank = 0;
    int world_size = 1;
    std::string master_address = "127.0.0.1";
    std::uint16_t master_port = 29500;

    /// Reads the variables; a missing RANK or WORLD_SIZE means a single process (rank 0 of 1).
    [[nodiscard]] static LaunchEnvironment from_environment() {
        LaunchEnvironment e;
        const auto integer = [](const char* name, long low, long high, long fallback) {
            const char* text = std::getenv(name);
            if (!text || !*text) return fallback;
            char* end = nullptr;
            const long value = std::strtol(text, &end, 10);
            if (*end != '\0' || value < low || value > high)
                throw InvalidInput(std::string("environment variable ") + name + "='" + text +
                                   "' is not an integer between " + std::to_string(low) + " and " +
                                   std::to_string(high));
            return value;
        };
        e.world_size = static_cast<int>(integer("WORLD_SIZE", 1, 1 << 20, 1));
        e.rank = static_cast<int>(integer("RANK", 0, e.world_size - 1, 0));
        if (const char* address = std::getenv("MASTER_ADDR"); address && *address) e.master_address = address;
        e.master_port = static_cast<std::uint16_t>(integer("MASTER_PORT", 1, 65535, 29500));
        return e;
    }
};

/// The rendezvous over TCP: rank 0 serves the store at the master's address and port, the
/// others connect to it (waiting up to `timeout` for it).
[[nodiscard]] inline StorePtr tcp_rendezvous(const LaunchEnvironment& where,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    c10d::TCPStoreOptions options;
    options.port = where.master_port;
    options.isServer = where.rank == 0;
    options.numWorkers = static_cast<std::size_t>(where.world_size);
    options.waitWorkers = true;
    options.timeout = timeout;
    try {
        return c10::make_intrusive<c10d::TCPStore>(where.master_address, options);
    } catch (const std::exception& e) {
        throw ExecutionError("rank " + std::to_string(where.rank) + " of " + std::to_string(where.world_size) +
                             ": the rendezvous at " + where.master_address + ":" + std::to_string(where.master_port) +
                             " failed (is MASTER_ADDR/MASTER_PORT the same for every process, and the port free on "
                             "rank 0's machine?): " + e.what());
    }
}

/// The rendezvous through a file every process can reach (a fresh path per job).
[[nodiscard]] inline StorePtr file_rendezvous(const std::string& path, int world_size) {
    return c10::make_intrusive<c10d::FileStore>(path, world_size);
}

}  // namespace remat::torch::distributed
