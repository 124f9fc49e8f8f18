// remat/torch/memory.hpp — memory probes: how many bytes of tensor storage are live, and
// the most that were live since the last reset.
//
// Principle 2 of docs/design.md §1 (the cost model is measured with the executor's own
// primitives) needs a probe that sees every tensor allocation: predicted peak = measured
// peak only holds when both come from the same accounting. The CPU probe wraps c10's CPU
// allocator (the approach of Beaumont et al.'s rotor and of PyTorch's own memory profiler,
// applied at the allocator); the CUDA probe reads the caching allocator's statistics and
// is compiled only where LibTorch has CUDA (REMAT_WITH_CUDA, decided by CMake).
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceType.h>

#if REMAT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "../core/errors.hpp"
#include "detail/compat.hpp"

namespace remat::torch {

/// A probe reports live bytes now, and the most that were live since the last reset_peak().
/// Probes are cheap handles: copying one copies the view, not the counters.
/// `device_type()` says which tensors it sees, so that a CPU probe is never asked about
/// CUDA tensors (it would see none of their bytes and every measure would read zero).
template <class P>
concept MemoryProbe = requires(P& probe, const P& const_probe) {
    { const_probe.current() } -> std::convertible_to<Bytes>;
    { const_probe.peak() } -> std::convertible_to<Bytes>;
    probe.reset_peak();
    { const_probe.name() } -> std::convertible_to<std::string_view>;
    { const_probe.device_type() } -> std::convertible_to<c10::DeviceType>;
};

namespace detail::memory {

// Wraps the allocator that was installed before it. Every block carries a 64-byte header
// holding its size, so that the deleter — a plain function pointer, the only thing c10
// hands back on free — knows how much to subtract. The DataPtr's context must equal its
// data pointer: oneDNN frees through raw_deallocate(), which asserts exactly that.
class TrackingCpuAllocator final : public c10::Allocator {
public:
    static constexpr std::size_t header = 64;  // keeps c10's 64-byte alignment of the data

    // Both spellings of allocate: const in LibTorch 1.x, non-const from 2.3 on. Whichever the
    // base declares is overridden; the other is an ordinary overload.
    c10::DataPtr allocate(std::size_t n) const { return allocate_tracked(n); }
    c10::DataPtr allocate(std::size_t n) { return allocate_tracked(n); }
    // No `override` in this class: which of these override depends on the LibTorch version,
    // and clang warns when `override` is used on some overriders and not on others.
    c10::DeleterFnPtr raw_deleter() const { return &release; }
    // Pure virtual from LibTorch 2.3 on; an ordinary member before.
    void copy_data(void* dest, const void* src, std::size_t count) const {
        if (count > 0) std::copy_n(static_cast<const unsigned char*>(src), count, static_cast<unsigned char*>(dest));
    }

    [[nodiscard]] Bytes current() const noexcept { return current_.load(std::memory_order_relaxed); }
    [[nodiscard]] Bytes peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t allocations() const noexcept { return allocations_.load(std::memory_order_relaxed); }
    void reset_peak() noexcept { peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

    [[nodiscard]] bool installed() const noexcept { return c10::GetCPUAllocator() == this; }

    // Installs this allocator as c10's CPU allocator once. A later SetCPUAllocator with a lower
    // priority than ours is ignored by c10, so a high priority keeps the probe in place.
    void install() {
        if (installed()) return;
        if (base_ == nullptr) base_ = c10::GetCPUAllocator();
        c10::SetCPUAllocator(this, /*priority=*/100);
        if (!installed())
            throw ExecutionError(
                "remat could not install its tracking CPU allocator: another allocator was registered with a higher "
                "priority; memory cannot be measured (install remat's probe before other custom CPU allocators)");
    }

    static TrackingCpuAllocator& instance() {
        // One per process by nature: c10 keeps a single CPU allocator, and blocks freed after
        // this object died would call into it, so it is never destroyed.
        static TrackingCpuAllocator* const allocator = new TrackingCpuAllocator();
        return *allocator;
    }

private:
    TrackingCpuAllocator() = default;

    c10::DataPtr allocate_tracked(std::size_t n) const {
        if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
        auto* block = static_cast<unsigned char*>(base_->raw_allocate(n + header));
        *reinterpret_cast<std::size_t*>(block) = n;
        void* data = block + header;
        add(static_cast<Bytes>(n));
        return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
    }

    void add(Bytes n) const noexcept {
        allocations_.fetch_add(1, std::memory_order_relaxed);
        const Bytes now = current_.fetch_add(n, std::memory_order_relaxed) + n;
        Bytes seen = peak_.load(std::memory_order_relaxed);
        while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
        }
    }

    static void release(void* data) {
        if (data == nullptr) return;
        TrackingCpuAllocator& self = instance();
        auto* block = static_cast<unsigned char*>(data) - header;
        const auto n = *reinterpret_cast<const std::size_t*>(block);
        self.current_.fetch_sub(static_cast<Bytes>(n), std::memory_order_relaxed);
        self.base_->raw_deallocate(block);
    }

    c10::Allocator* base_ = nullptr;
    // Mutable: c10 allocates through a const allocator in LibTorch 1.x.
    mutable std::atomic<Bytes> current_{0};
    mutable std::atomic<Bytes> peak_{0};
    mutable std::atomic<std::uint64_t> allocations_{0};
};

}  // namespace detail::memory

/// Live bytes of CPU tensor storage allocated through c10's CPU allocator. Constructing the
/// first probe installs the tracking allocator; tensors allocated before that are invisible
/// to it (their bytes never count), so create a probe before building the model when the
/// absolute numbers matter. Differences over a step are exact either way. Allocations made
/// outside c10 (oneDNN scratch space, BLAS workspaces) are not seen.
class CpuMemoryProbe {
public:
    CpuMemoryProbe() : allocator_(&detail::memory::TrackingCpuAllocator::instance()) { allocator_->install(); }

    [[nodiscard]] Bytes current() const noexcept { return allocator_->current(); }
    [[nodiscard]] Bytes peak() const noexcept { return allocator_->peak(); }
    /// Sets the peak to the current value. The counters are process-wide: every probe sees
    /// the same numbers and a reset through one resets them all.
    void reset_peak() noexcept { allocator_->reset_peak(); }
    /// Number of tracked allocations so far (for cost estimates and tests).
    [[nodiscard]] std::uint64_t allocations() const noexcept { return allocator_->allocations(); }
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "cpu"; }
    [[nodiscard]] static constexpr c10::DeviceType device_type() noexcept { return c10::DeviceType::CPU; }

private:
    detail::memory::TrackingCpuAllocator* allocator_;
};

#if REMAT_WITH_CUDA
/// Live bytes of one CUDA device's tensors, from the caching allocator's statistics: the bytes
/// the tensors requested (detail::compat::cuda_allocated says why not the blocks' sizes), not
/// the reserved cache: neither the cache nor how its blocks are split is what a plan controls.
class CudaMemoryProbe {
public:
    explicit CudaMemoryProbe(c10::DeviceIndex device = 0) : device_(device) {
        if (device < 0 || device >= static_cast<c10::DeviceIndex>(c10::cuda::device_count()))
            throw InvalidInput("CudaMemoryProbe: CUDA device " + std::to_string(device) +
                               " does not exist: this process sees " + std::to_string(c10::cuda::device_count()) +
                               " CUDA devices (no GPU or driver, or CUDA_VISIBLE_DEVICES hides it); measure on the "
                               "CPU with CpuMemoryProbe, or run where the device is");
    }

    [[nodiscard]] Bytes current() const { return static_cast<Bytes>(detail::compat::cuda_allocated(device_).current); }
    [[nodiscard]] Bytes peak() const { return static_cast<Bytes>(detail::compat::cuda_allocated(device_).peak); }
    void reset_peak() { detail::compat::reset_cuda_peak(device_); }
    [[nodiscard]] c10::DeviceIndex device() const noexcept { return device_; }
    [[nodiscard]] static constexpr std::string_view name() noexcept { return "cuda"; }
    [[nodiscard]] static constexpr c10::DeviceType device_type() noexcept { return c10::DeviceType::CUDA; }

private:
    c10::DeviceIndex device_;
};
#endif

/// Throws InvalidInput, naming both, when `probe` does not measure the memory of `device`:
/// another device type (a CPU probe sees none of a GPU's bytes), or another CUDA device than
/// the one a probe with a device() reads.
template <MemoryProbe Probe>
void check_probe_device(const Probe& probe, const c10::Device& device, const std::string& who) {
    if (device.type() != probe.device_type())
        throw InvalidInput(who + ": the inputs are on " + device.str() + " but the memory probe ('" +
                           std::string(probe.name()) + "') measures " + c10::DeviceTypeName(probe.device_type()) +
                           " memory; use a probe for the model's device (CudaMemoryProbe for CUDA)");
    if constexpr (requires { probe.device(); }) {
        if (device.has_index() && device.index() != probe.device())
            throw InvalidInput(who + ": the inputs are on " + device.str() + " but the memory probe ('" +
                               std::string(probe.name()) + "') measures device " + std::to_string(probe.device()) +
                               "; give the probe the model's device (CudaMemoryProbe(" +
                               std::to_string(device.index()) + "))");
    }
}

}  // namespace remat::torch
