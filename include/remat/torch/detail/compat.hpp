// remat/torch/detail/compat.hpp — the one place where LibTorch 1.x and 2.x differ for remat.
//
// remat builds against Debian's LibTorch 1.13 (CPU) and the package index's LibTorch 2.x
// (CUDA). Every API that changed between them is wrapped here, behind TORCH_VERSION_MAJOR;
// no other header tests the version. docs/guide.md ("LibTorch 2.x with CUDA") lists them:
// - the CUDA caching allocator's statistics: DeviceStats moved to
//   c10::CachingDeviceAllocator (c10/core/CachingDeviceAllocator.h) and StatType to
//   c10::CachingAllocator in 2.x; 1.13 has both in c10::cuda::CUDACachingAllocator, and its
//   getDeviceStats/resetPeakStats take an int where 2.x takes a c10::DeviceIndex; 2.x
//   counts the bytes requested (requested_bytes), which 1.13 does not.
// - CUDA events: c10::cuda::CUDAEvent (c10/cuda/CUDAEvent.h) in recent 2.x, with no alias left
//   in at::cuda; at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h) before. Told apart by which
//   header exists, as the move happened within 2.x.
// - c10d: in 1.13 ProcessGroupGloo and ProcessGroupNCCL are c10d::ProcessGroups; since 2.0 they
//   are c10d::Backends, and a ProcessGroup dispatches each collective to the backend of its
//   tensors' device type (pytorch/pytorch#88330). process_group_of() makes either a process
//   group (distributed/process_group.hpp includes c10d; this header does not).
// - custom autograd Functions: 1.13's CppNode::apply hands backward() a copy of the output
//   gradients and keeps its own list until backward() returns; 2.x moves the list in
//   (custom_function_keeps_output_gradients).
// The CPU allocator's interface changed too (allocate const in 1.x, non-const from 2.3;
// copy_data pure virtual from 2.3); TrackingCpuAllocator (memory.hpp) declares both spellings,
// which needs no version test.
#pragma once

#include <cstdint>
#include <optional>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#if REMAT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<c10/cuda/CUDAEvent.h>)
#include <c10/cuda/CUDAEvent.h>
#define REMAT_DETAIL_C10_CUDA_EVENT 1
#else
#include <ATen/cuda/CUDAEvent.h>
#endif
#endif

#ifndef TORCH_VERSION_MAJOR
#error "remat: <torch/version.h> does not define TORCH_VERSION_MAJOR; remat needs LibTorch 1.13 or later"
#endif

namespace remat::torch::detail::compat {

/// Whether this LibTorch is 2.x or later.
inline constexpr bool torch2 = TORCH_VERSION_MAJOR >= 2;

/// The dtypes that only 2.x has, by the number torch.export's schema (ScalarType) gives them;
/// nullopt for the others, and for every one of them under 1.x.
[[nodiscard]] inline std::optional<c10::ScalarType> export_only_dtype(std::int64_t code) {
#if TORCH_VERSION_MAJOR >= 2
    switch (code) {
        case 28: return c10::ScalarType::UInt16;
        case 29: return c10::ScalarType::Float8_e4m3fn;
        case 30: return c10::ScalarType::Float8_e5m2;
        case 31: return c10::ScalarType::Float8_e4m3fnuz;
        case 32: return c10::ScalarType::Float8_e5m2fnuz;
        default: return std::nullopt;
    }
#else
    (void)code;
    return std::nullopt;
#endif
}

#if REMAT_WITH_CUDA

/// Bytes of one CUDA device's live tensors (all pools together), as the caching allocator
/// counts them. 2.x: the bytes its clients requested (`requested_bytes`). Not the blocks'
/// sizes (`allocated_bytes`): a block found in the cache is not split when what would remain
/// is under 1 MiB, so the same request counts up to 1 MiB more or less depending on what the
/// cache holds, and a profile and a step would disagree by that much (docs/design.md §7).
/// 1.13 has no requested bytes: its block sizes are used.
struct CudaAllocated {
    std::int64_t current = 0;
    std::int64_t peak = 0;
};

[[nodiscard]] inline CudaAllocated cuda_allocated(c10::DeviceIndex device) {
#if TORCH_VERSION_MAJOR >= 2
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    const auto& all = stats.requested_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
#else
    using c10::cuda::CUDACachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<int>(device));
    const auto& all = stats.allocated_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
#endif
    return {all.current, all.peak};
}

/// Sets the device's peak statistics to their current values.
inline void reset_cuda_peak(c10::DeviceIndex device) {
#if TORCH_VERSION_MAJOR >= 2
    c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#else
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<int>(device));
#endif
}

/// A CUDA event (movable, not copyable), created with timing on by CudaEvent(cudaEventDefault).
#if REMAT_DETAIL_C10_CUDA_EVENT
using CudaEvent = c10::cuda::CUDAEvent;
#else
using CudaEvent = at::cuda::CUDAEvent;
#endif

#endif  // REMAT_WITH_CUDA

/// A c10d Gloo or NCCL backend (`backend`, made by the caller) as a c10d::ProcessGroup of `size`
/// processes: the backend itself in 1.13; since 2.0 a ProcessGroup that sends `device`'s
/// collectives to it, `backend_name` ("gloo", "nccl") naming its type. Templated so that this
/// header needs no c10d include.
template <class ProcessGroup, class Backend, class Store>
[[nodiscard]] c10::intrusive_ptr<ProcessGroup> process_group_of(c10::intrusive_ptr<Backend> backend,
                                                                const c10::intrusive_ptr<Store>& store, int rank,
                                                                int size, c10::DeviceType device,
                                                                const char* backend_name) {
#if TORCH_VERSION_MAJOR >= 2
    auto group = c10::make_intrusive<ProcessGroup>(store, rank, size);
    const auto type = ProcessGroup::strToBackendType(backend_name);
    group->setBackend(device, type, backend);
    group->setDefaultBackend(type);
    return group;
#else
    (void)store, (void)rank, (void)size, (void)device, (void)backend_name;
    return backend;
#endif
}

/// Whether autograd keeps a reference to a custom Function's output gradients while its
/// backward runs (LibTorch 1.x), so that dropping the Function's own does not free them.
inline constexpr bool custom_function_keeps_output_gradients = TORCH_VERSION_MAJOR < 2;

}  // namespace remat::torch::detail::compat
