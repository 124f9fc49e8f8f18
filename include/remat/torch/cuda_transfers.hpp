// remat/torch/cuda_transfers.hpp — the transfer backend of a CUDA device (exec/transfer.hpp's
// TransferBackend): copies between the device and pinned host memory on two side streams,
// ordered by CUDA events, while the compute stream goes on.
//
// Following what Offmate and POFO do on GPUs (docs/design.md §4.12):
// - each direction has its own stream from LibTorch's pool, so copies overlap compute and
//   each other; every transfer records an event, and the stream that consumes its result
//   waits on that event (cudaStreamWaitEvent: the host does not block);
// - host copies live in pinned memory (LibTorch's caching host allocator keeps the blocks
//   pinned for reuse), as only pinned memory copies asynchronously; the backend counts them;
// - a copy into a prefetched device copy first waits for the compute stream, which last used
//   that memory (the caching allocator hands blocks out per stream); a device copy is freed
//   only after the compute stream has waited for the transfers that read or write it, so
//   the allocator reuses its block after them;
// - a copy to the host first waits for the compute issued before it (the values it offloads);
// - a host copy leaves the count at its free, in plan order, without the host waiting: its
//   pinned buffer retires until the transfers using it are done, and the next host allocation
//   (or synchronize()) waits for the retired buffers first, so the pinned bytes never exceed
//   the count where it grows. Waiting at the free itself stalled the host for milliseconds
//   while the GPU ran out of queued work (bench_offload_torch on an H100).
// Parameters keep their identity: the DeviceStore (torch/offload.hpp's OffloadedChain)
// releases and allocates a storage's memory, never the tensor.
//
// All or nothing as every transfer backend (detail::transfer::StepLedger): the values kept
// before an update are copied on the compute stream into pinned buffers kept for the next
// steps, without the host waiting, and a rollback (after a synchronization) copies them back. timing() gives the bytes and seconds each direction copied (CUDA events), the
// measured bandwidth.
//
// Compiled only where LibTorch has CUDA (REMAT_WITH_CUDA, decided by CMake); elsewhere this
// header declares nothing.
#pragma once

#include "../exec/transfer.hpp"

#if REMAT_WITH_CUDA

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "detail/compat.hpp"

namespace remat::torch {

/// What the copies of a CudaTransfers took, per direction, since it was made or reset.
struct TransferTiming {
    Bytes bytes_to_host = 0;
    Bytes bytes_to_device = 0;
    double seconds_to_host = 0.0;
    double seconds_to_device = 0.0;
    /// Bytes per second, 0 where nothing was copied.
    [[nodiscard]] double to_host_rate() const noexcept { return seconds_to_host > 0 ? double(bytes_to_host) / seconds_to_host : 0.0; }
    [[nodiscard]] double to_device_rate() const noexcept {
        return seconds_to_device > 0 ? double(bytes_to_device) / seconds_to_device : 0.0;
    }
};

/// The transfer backend of one CUDA device: see the top of this header.
template <DeviceStore Store>
class CudaTransfers {
public:
    CudaTransfers(Store& store, const Problem& problem, c10::Device device)
        : store_(&store),
          ledger_(problem),
          device_(cuda_device(device)),
          host_(problem.data_count()), rollback_(problem.data_count()),
          device_written_(problem.data_count()),
          device_read_(problem.data_count()),
          host_written_(problem.data_count()),
          host_read_(problem.data_count()),
          to_host_(c10::cuda::getStreamFromPool(false, device_.index())),
          to_device_(c10::cuda::getStreamFromPool(false, device_.index())) {}

    void offload(DataId d) {
        const c10::cuda::CUDAGuard guard(device_);
        ledger_.touch(d);
        std::byte* target = host_buffer(d);
        // After the compute issued so far (the values), the prefetch that wrote the device
        // copy, and a prefetch still reading the old host copy this one overwrites.
        wait(to_host_, mark(compute()));
        wait(to_host_, device_written_[d.index]);
        wait(to_host_, host_read_[d.index]);
        const Event start = mark(to_host_);
        for (const std::span<std::byte> part : store_->device_bytes(d)) {
            C10_CUDA_CHECK(cudaMemcpyAsync(target, part.data(), part.size(), cudaMemcpyDeviceToHost, to_host_.stream()));
            target += part.size();
        }
        const Event done = mark(to_host_);
        copies_to_host_.push_back({start, done, ledger_.bytes(d)});
        device_read_[d.index] = host_written_[d.index] = done;
    }

    void prefetch(DataId d) {
        if (!host_[d.index].defined())
            throw ExecutionError("prefetch of data #" + std::to_string(d.index) + " without a host copy");
        const c10::cuda::CUDAGuard guard(device_);
        store_->make_device_copy(d);
        ledger_.device_made(d);
        // The new device memory was last used by the compute stream; the host copy is written
        // by its offload.
        wait(to_device_, mark(compute()));
        wait(to_device_, host_written_[d.index]);
        const Event start = mark(to_device_);
        const auto* source = static_cast<const std::byte*>(host_[d.index].data_ptr());
        for (const std::span<std::byte> part : store_->device_bytes(d)) {
            C10_CUDA_CHECK(cudaMemcpyAsync(part.data(), source, part.size(), cudaMemcpyHostToDevice, to_device_.stream()));
            source += part.size();
        }
        const Event done = mark(to_device_);
        copies_to_device_.push_back({start, done, ledger_.bytes(d)});
        device_written_[d.index] = host_read_[d.index] = done;
    }

    /// The compute stream waits for the prefetch of the device copy (the host goes on).
    void wait_device(DataId d) {
        const c10::cuda::CUDAGuard guard(device_);
        wait(compute(), device_written_[d.index]);
    }
    /// ... and for the offload still reading it.
    void wait_writable(DataId d) {
        wait_device(d);
        wait(compute(), device_read_[d.index]);
    }

    void release_device(DataId d) {
        wait_writable(d);
        const c10::cuda::CUDAGuard guard(device_);
        store_->drop_device_copy(d);
        ledger_.device_dropped(d);
    }

    /// The host copy leaves the count; its buffer retires until the transfers using it are done
    /// (the host goes on).
    void release_host(DataId d) {
        if (host_[d.index].defined()) {
            retired_.push_back({std::move(host_[d.index]), host_written_[d.index], host_read_[d.index]});
            host_[d.index] = at::Tensor();
            host_bytes_.remove(ledger_.bytes(d));
        }
        ledger_.touch(d);
    }

    void synchronize() {
        const c10::cuda::CUDAGuard guard(device_);
        to_host_.synchronize();
        to_device_.synchronize();
        retired_.clear();  // their transfers ran on those streams
    }

    // ---- all or nothing

    void begin_step() {
        synchronize();
        fold_timing();
        ledger_.begin([&](DataId d) { return host_[d.index].defined(); });
    }
    void keep_for_rollback(DataId d) {
        wait_writable(d);
        Copies copies{this};
        ledger_.keep(d, copies);
    }
    void roll_back() {
        synchronize();
        compute().synchronize();  // the failed op may still run
        Copies copies{this};
        ledger_.roll_back(copies);
    }
    void commit_step() { ledger_.commit(); }
    [[nodiscard]] Bytes rollback_bytes() const noexcept { return ledger_.rollback_bytes(); }

    [[nodiscard]] Bytes host_bytes() const noexcept { return host_bytes_.current(); }
    [[nodiscard]] Bytes host_peak() const noexcept { return host_bytes_.peak(); }
    void reset_host_peak() noexcept { host_bytes_.reset_peak(); }

    /// The host copy of a data (empty when it has none), once its offload is done.
    [[nodiscard]] std::span<const std::byte> host_copy(DataId d) {
        finish(host_written_[d.index]);
        if (!host_[d.index].defined()) return {};
        return {static_cast<const std::byte*>(host_[d.index].data_ptr()), static_cast<std::size_t>(ledger_.bytes(d))};
    }

    /// Bytes and seconds of the copies since the last reset (waits for them).
    [[nodiscard]] TransferTiming timing() {
        synchronize();
        fold_timing();
        return timing_;
    }
    void reset_timing() {
        synchronize();
        copies_to_host_.clear();
        copies_to_device_.clear();
        timing_ = {};
    }

private:
    using Event = std::shared_ptr<detail::compat::CudaEvent>;
    struct Copy {
        Event start, done;
        Bytes bytes;
    };

    // The ledger's access to the copies (remat::detail::transfer::StepLedger): synchronous copies on
    // the compute stream, once the transfers are done.
    struct Copies {
        CudaTransfers* self;
        void read_device(DataId d, std::byte* out) { self->copy_device(d, out, cudaMemcpyDeviceToHost); }
        // On the compute stream, not waited for: the op that updates the data runs after it on
        // that stream, and a rollback synchronizes first.
        void keep_device(DataId d, std::byte* out) { self->copy_device_to_host_async(d, out); }
        [[nodiscard]] std::byte* rollback_buffer(DataId d) {
            at::Tensor& buffer = self->rollback_[d.index];
            if (!buffer.defined())
                buffer = at::empty({static_cast<std::int64_t>(self->ledger_.bytes(d))},
                                   at::TensorOptions().dtype(at::kByte).pinned_memory(true));
            return static_cast<std::byte*>(buffer.data_ptr());
        }
        void write_device(DataId d, const std::byte* in) {
            self->copy_device(d, const_cast<std::byte*>(in), cudaMemcpyHostToDevice);  // only read
        }
        [[nodiscard]] std::byte* host_values(DataId d) {
            const at::Tensor& host = self->host_[d.index];
            return host.defined() ? static_cast<std::byte*>(host.data_ptr()) : nullptr;
        }
        [[nodiscard]] std::byte* make_host(DataId d) { return self->host_buffer(d); }
        void drop_host(DataId d) { self->drop_host_copy(d); }
        void make_device(DataId d) {
            const c10::cuda::CUDAGuard guard(self->device_);
            self->store_->make_device_copy(d);
        }
        void drop_device(DataId d) {
            const c10::cuda::CUDAGuard guard(self->device_);
            self->store_->drop_device_copy(d);
        }
    };

    // The copies' times into timing_ (their events done: after synchronize()).
    void fold_timing() {
        for (const Copy& c : copies_to_host_) {
            timing_.bytes_to_host += c.bytes;
            timing_.seconds_to_host += static_cast<double>(c.start->elapsed_time(*c.done)) / 1e3;
        }
        for (const Copy& c : copies_to_device_) {
            timing_.bytes_to_device += c.bytes;
            timing_.seconds_to_device += static_cast<double>(c.start->elapsed_time(*c.done)) / 1e3;
        }
        copies_to_host_.clear();
        copies_to_device_.clear();
    }

    [[nodiscard]] static c10::Device cuda_device(c10::Device device) {
        if (!device.is_cuda())
            throw InvalidInput("CudaTransfers: " + device.str() +
                               " is not a CUDA device; use remat::CpuTransfers for a chain trained on the CPU");
        return device.has_index() ? device : c10::Device(c10::kCUDA, c10::cuda::current_device());
    }

    [[nodiscard]] c10::cuda::CUDAStream compute() const { return c10::cuda::getCurrentCUDAStream(device_.index()); }
    // An event recorded on `stream` now, timing on.
    [[nodiscard]] static Event mark(const c10::cuda::CUDAStream& stream) {
        auto event = std::make_shared<detail::compat::CudaEvent>(cudaEventDefault);
        event->record(stream);
        return event;
    }
    static void wait(const c10::cuda::CUDAStream& stream, const Event& event) {
        if (event) event->block(stream);
    }
    static void finish(const Event& event) {
        if (event) event->synchronize();
    }

    // The device copy's parts into contiguous pinned host bytes, on the compute stream, not waited for.
    void copy_device_to_host_async(DataId d, std::byte* host) {
        const c10::cuda::CUDAGuard guard(device_);
        const c10::cuda::CUDAStream stream = compute();
        for (const std::span<std::byte> part : store_->device_bytes(d)) {
            C10_CUDA_CHECK(cudaMemcpyAsync(host, part.data(), part.size(), cudaMemcpyDeviceToHost, stream.stream()));
            host += part.size();
        }
    }

    // The device copy's parts to or from contiguous host bytes, on the compute stream, waited for.
    void copy_device(DataId d, std::byte* host, cudaMemcpyKind kind) {
        const c10::cuda::CUDAGuard guard(device_);
        const c10::cuda::CUDAStream stream = compute();
        for (const std::span<std::byte> part : store_->device_bytes(d)) {
            if (kind == cudaMemcpyDeviceToHost)
                C10_CUDA_CHECK(cudaMemcpyAsync(host, part.data(), part.size(), kind, stream.stream()));
            else
                C10_CUDA_CHECK(cudaMemcpyAsync(part.data(), host, part.size(), kind, stream.stream()));
            host += part.size();
        }
        stream.synchronize();
    }

    // The host copy's pinned buffer, allocated (and counted) on its first offload, once the
    // retired buffers are free.
    std::byte* host_buffer(DataId d) {
        at::Tensor& host = host_[d.index];
        if (!host.defined()) {
            free_retired();
            host = at::empty({static_cast<std::int64_t>(ledger_.bytes(d))}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
            host_bytes_.add(ledger_.bytes(d));
        }
        return static_cast<std::byte*>(host.data_ptr());  // a stale copy is overwritten in place
    }

    void free_retired() {
        for (const Retired& r : retired_) {
            finish(r.written);
            finish(r.read);
        }
        retired_.clear();
    }

    void drop_host_copy(DataId d) {
        if (!host_[d.index].defined()) return;
        host_[d.index] = at::Tensor();
        host_bytes_.remove(ledger_.bytes(d));
    }

    Store* store_;
    remat::detail::transfer::StepLedger ledger_;
    remat::detail::transfer::HostAccount host_bytes_;
    c10::Device device_;
    std::vector<at::Tensor> host_;      // pinned host copies
    std::vector<at::Tensor> rollback_;  // pinned values kept before an update (StepLedger)
    // A freed host copy's buffer, with the transfers that may still use it.
    struct Retired {
        at::Tensor buffer;
        Event written, read;
    };
    std::vector<Retired> retired_;
    std::vector<Event> device_written_;  // the prefetch writing the device copy
    std::vector<Event> device_read_;     // the offload reading the device copy
    std::vector<Event> host_written_;    // the offload writing the host copy
    std::vector<Event> host_read_;       // the prefetch reading the host copy
    std::vector<Copy> copies_to_host_, copies_to_device_;  // not yet in timing_
    TransferTiming timing_;
    c10::cuda::CUDAStream to_host_, to_device_;
};

}  // namespace remat::torch

#endif  // REMAT_WITH_CUDA
