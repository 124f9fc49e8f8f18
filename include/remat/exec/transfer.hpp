// remat/exec/transfer.hpp — moving data between the device and host memory while a plan runs
// (docs/formats.md §11): the DeviceStore and TransferBackend concepts, and CpuTransfers, the
// transfer backend of a CPU-only machine.
//
// A framework says where the device copy of each offloadable data lives (DeviceStore): its
// bytes, how to allocate it (counted by the framework's device allocator at that moment, as a
// prefetch reserves its memory when issued) and how to release it. A transfer backend copies
// those bytes to host memory and back, asynchronously, and accounts the host memory it holds.
// The offloading engine (offload_step.hpp) drives it in schedule order and waits where the
// semantics say: an op for the prefetches it reads, a free for the transfers using the copy.
//
// A step is all or nothing: the backend keeps the values of a data before an op updates it
// (an optimizer step inside the plan), and a failed step puts every data's values and copies
// back as the step found them; the kept bytes are counted apart from the plan's host memory.
//
// CpuTransfers runs each direction on its own worker thread, so copies overlap the caller's
// compute for real; host copies are plain buffers outside the framework's allocator, counted
// by the backend itself. The CUDA backend (side streams, events, pinned buffers) lives with
// LibTorch's (torch/). Standard library only.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "../core/errors.hpp"
#include "../core/problem.hpp"

namespace remat {

/// Where a framework keeps the device copies of offloadable data.
template <class S>
concept DeviceStore = requires(S& store, DataId data) {
    /// The bytes of the live device copy, in a fixed order (several tensors may make one data).
    { store.device_bytes(data) } -> std::same_as<std::vector<std::span<std::byte>>>;
    /// Allocates the device copy (its contents are then written by a prefetch).
    store.make_device_copy(data);
    /// Releases the device copy.
    store.drop_device_copy(data);
};

/// Copies between the device and host memory; see the top of this header.
template <class T>
concept TransferBackend = requires(T& t, const T& ct, DataId data) {
    t.offload(data);         ///< takes the host memory now; copies after the compute issued so far
    t.prefetch(data);        ///< takes the device memory now; copies the host copy into it
    t.wait_device(data);     ///< until the device copy is complete
    t.wait_writable(data);   ///< until no transfer reads the device copy (before an op updates it)
    t.release_device(data);  ///< after the transfers using the device copy
    t.release_host(data);    ///< after the transfers using the host copy
    t.synchronize();         ///< until every transfer is done
    { ct.host_bytes() } -> std::convertible_to<Bytes>;
    { ct.host_peak() } -> std::convertible_to<Bytes>;
    t.reset_host_peak();
    // All or nothing: a step that fails leaves every data as the step found it.
    t.begin_step();                 ///< remembers where each data has a copy now
    t.keep_for_rollback(data);      ///< keeps the device copy's values (before an op updates it)
    t.roll_back();                  ///< puts values and copies back as begin_step found them
    t.commit_step();                ///< forgets what keep_for_rollback kept
    { ct.rollback_bytes() } -> std::convertible_to<Bytes>;  ///< bytes it keeps now
};

namespace detail::transfer {

// One direction: copies run in order on a worker thread; each has a ticket, waited for by number.
class CopyChannel {
public:
    CopyChannel() : worker_([this](std::stop_token stop) { serve(stop); }) {}
    CopyChannel(const CopyChannel&) = delete;
    CopyChannel& operator=(const CopyChannel&) = delete;
    ~CopyChannel() {
        worker_.request_stop();
        ready_.notify_all();
    }

    std::uint64_t push(std::function<void()> copy) {
        const std::lock_guard lock(mutex_);
        jobs_.push_back(std::move(copy));
        ready_.notify_all();
        return ++issued_;
    }
    void wait(std::uint64_t ticket) {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return completed_ >= ticket; });
    }
    void drain() {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return completed_ >= issued_; });
    }
    /// Seconds the worker spent copying.
    [[nodiscard]] double busy_seconds() const {
        const std::lock_guard lock(mutex_);
        return busy_;
    }

private:
    void serve(std::stop_token stop) {
        while (true) {
            std::function<void()> job;
            {
                std::unique_lock lock(mutex_);
                ready_.wait(lock, stop, [&] { return !jobs_.empty(); });
                if (jobs_.empty()) return;  // stop requested
                job = std::move(jobs_.front());
                jobs_.pop_front();
            }
            const auto t0 = std::chrono::steady_clock::now();
            job();
            const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
            const std::lock_guard lock(mutex_);
            busy_ += took.count();
            ++completed_;
            done_.notify_all();
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable_any ready_;
    std::condition_variable_any done_;
    std::deque<std::function<void()>> jobs_;
    std::uint64_t issued_ = 0, completed_ = 0;
    double busy_ = 0.0;
    std::jthread worker_;  // last: it starts once the members it uses exist
};

}  // namespace detail::transfer

/// The transfer backend of a CPU-only machine: see the top of this header.
template <DeviceStore Store>
class CpuTransfers {
public:
    CpuTransfers(Store& store, const Problem& problem)
        : store_(&store), bytes_(problem.data_count()), host_(problem.data_count()), device_ticket_(problem.data_count(), 0),
          read_ticket_(problem.data_count(), 0), host_ticket_(problem.data_count(), 0), host_read_ticket_(problem.data_count(), 0),
          kept_(problem.data_count()), device_live_(problem.data_count(), 1), started_on_device_(problem.data_count(), 1),
          started_on_host_(problem.data_count(), 0), touched_(problem.data_count(), 0) {
        for (std::size_t k = 0; k < problem.data_count(); ++k) bytes_[k] = problem.data(DataId{k}).bytes;
    }

    void offload(DataId d) {
        touched_[d.index] = 1;
        std::vector<std::span<std::byte>> source = store_->device_bytes(d);
        std::byte* target = host_buffer(d);
        // The copy waits, on its own channel, for the device copy to be complete and for a
        // prefetch still reading an old host copy it overwrites.
        const std::uint64_t written = device_ticket_[d.index], read = host_read_ticket_[d.index];
        detail::transfer::CopyChannel* to_device = to_device_.get();
        const std::uint64_t ticket = to_host_->push([source = std::move(source), target, to_device, written, read] {
            to_device->wait(std::max(written, read));
            gather(source, target);
        });
        read_ticket_[d.index] = host_ticket_[d.index] = ticket;
    }

    void prefetch(DataId d) {
        if (!host_[d.index]) throw ExecutionError("prefetch of data #" + std::to_string(d.index) + " without a host copy");
        store_->make_device_copy(d);
        device_live_[d.index] = 1;
        touched_[d.index] = 1;
        std::vector<std::span<std::byte>> target = store_->device_bytes(d);
        const std::byte* source = host_[d.index].get();
        // The copy waits, on its own channel, for the host copy to be complete.
        const std::uint64_t written = host_ticket_[d.index];
        detail::transfer::CopyChannel* to_host = to_host_.get();
        device_ticket_[d.index] = to_device_->push([target = std::move(target), source, to_host, written] {
            to_host->wait(written);
            scatter(source, target);
        });
        host_read_ticket_[d.index] = device_ticket_[d.index];
    }

    void wait_device(DataId d) { to_device_->wait(device_ticket_[d.index]); }
    void wait_writable(DataId d) {
        wait_device(d);
        to_host_->wait(read_ticket_[d.index]);
    }

    void release_device(DataId d) {
        wait_device(d);
        to_host_->wait(read_ticket_[d.index]);
        store_->drop_device_copy(d);
        device_live_[d.index] = 0;
        touched_[d.index] = 1;
    }

    void release_host(DataId d) {
        to_host_->wait(host_ticket_[d.index]);
        to_device_->wait(host_read_ticket_[d.index]);
        drop_host_copy(d);
        touched_[d.index] = 1;
    }

    // ---- all or nothing

    void begin_step() {
        synchronize();
        commit_step();
        for (std::size_t k = 0; k < bytes_.size(); ++k) {
            started_on_device_[k] = device_live_[k];
            started_on_host_[k] = host_[k] ? 1 : 0;
        }
        std::fill(touched_.begin(), touched_.end(), 0);
    }

    // A synchronous copy: the op that updates the data runs right after.
    void keep_for_rollback(DataId d) {
        if (kept_[d.index]) return;
        wait_writable(d);
        kept_[d.index].emplace(static_cast<std::size_t>(bytes_[d.index]));
        gather(store_->device_bytes(d), kept_[d.index]->data());
        rollback_bytes_ += bytes_[d.index];
        touched_[d.index] = 1;
    }

    // Each data the step moved or updated gets its values back (those kept before an update,
    // else those of a copy the step did not change) wherever it had a copy, and loses the
    // copies it did not have.
    void roll_back() {
        synchronize();
        for (std::size_t k = 0; k < bytes_.size(); ++k) {
            if (!touched_[k]) continue;
            const DataId d{k};
            const std::vector<std::byte> values = values_before_step(d);
            if (started_on_host_[k]) {
                std::memcpy(host_buffer(d), values.data(), values.size());
            } else {
                drop_host_copy(d);
            }
            if (started_on_device_[k]) {
                if (!device_live_[k]) {
                    store_->make_device_copy(d);
                    device_live_[k] = 1;
                }
                scatter(values.data(), store_->device_bytes(d));
            } else if (device_live_[k]) {
                store_->drop_device_copy(d);
                device_live_[k] = 0;
            }
        }
        commit_step();
        std::fill(touched_.begin(), touched_.end(), 0);
    }

    void commit_step() {
        for (auto& kept : kept_) kept.reset();
        rollback_bytes_ = 0;
    }

    void synchronize() {
        to_host_->drain();
        to_device_->drain();
    }

    [[nodiscard]] Bytes host_bytes() const noexcept { return host_bytes_; }
    /// Host bytes kept for a rollback (outside host_bytes(): the plan's host limit is not theirs).
    [[nodiscard]] Bytes rollback_bytes() const noexcept { return rollback_bytes_; }
    [[nodiscard]] Bytes host_peak() const noexcept { return host_peak_; }
    void reset_host_peak() noexcept { host_peak_ = host_bytes_; }
    /// The host copy of a data (empty when it has none), once its offload is done.
    [[nodiscard]] std::span<const std::byte> host_copy(DataId d) {
        to_host_->wait(host_ticket_[d.index]);
        if (!host_[d.index]) return {};
        return {host_[d.index].get(), static_cast<std::size_t>(bytes_[d.index])};
    }
    /// Seconds each worker spent copying (device → host, host → device).
    [[nodiscard]] std::pair<double, double> busy_seconds() const {
        return {to_host_->busy_seconds(), to_device_->busy_seconds()};
    }

private:
    // The host copy's buffer, allocated (and counted) on its first offload.
    std::byte* host_buffer(DataId d) {
        if (!host_[d.index]) {
            host_[d.index] = std::make_unique<std::byte[]>(static_cast<std::size_t>(bytes_[d.index]));
            host_bytes_ += bytes_[d.index];
            host_peak_ = std::max(host_peak_, host_bytes_);
        }
        return host_[d.index].get();  // a stale copy is overwritten in place
    }

    void drop_host_copy(DataId d) {
        if (!host_[d.index]) return;
        host_[d.index].reset();
        host_bytes_ -= bytes_[d.index];
    }

    // A data's device copy (its parts in order) into contiguous bytes, and back.
    static void gather(const std::vector<std::span<std::byte>>& parts, std::byte* target) {
        for (const std::span<std::byte> part : parts) {
            std::memcpy(target, part.data(), part.size());
            target += part.size();
        }
    }
    static void scatter(const std::byte* source, const std::vector<std::span<std::byte>>& parts) {
        for (const std::span<std::byte> part : parts) {
            std::memcpy(part.data(), source, part.size());
            source += part.size();
        }
    }

    // Where the values of a data at the start of the step are now: kept before its update;
    // else its device copy, when that copy lived through the step (nothing updated it);
    // else its host copy (an offload wrote the same values, or the step never touched it);
    // else a device copy made in the step (prefetched from a host copy since freed).
    [[nodiscard]] std::vector<std::byte> values_before_step(DataId d) {
        const auto n = static_cast<std::size_t>(bytes_[d.index]);
        if (kept_[d.index]) return *kept_[d.index];
        std::vector<std::byte> values(n);
        if ((started_on_device_[d.index] || !host_[d.index]) && device_live_[d.index]) {
            gather(store_->device_bytes(d), values.data());
        } else if (host_[d.index]) {
            std::memcpy(values.data(), host_[d.index].get(), n);
        } else {
            throw ExecutionError("rolling back data #" + std::to_string(d.index) +
                                 ": no copy of it is left on the device or the host (the schedule freed the last one)");
        }
        return values;
    }

    Store* store_;
    std::vector<Bytes> bytes_;
    std::vector<std::unique_ptr<std::byte[]>> host_;
    std::vector<std::uint64_t> device_ticket_;     // the prefetch writing the device copy
    std::vector<std::uint64_t> read_ticket_;       // the offload reading the device copy
    std::vector<std::uint64_t> host_ticket_;       // the offload writing the host copy
    std::vector<std::uint64_t> host_read_ticket_;  // the prefetch reading the host copy
    std::vector<std::optional<std::vector<std::byte>>> kept_;  // values before an update, for a rollback
    std::vector<char> device_live_, started_on_device_, started_on_host_, touched_;
    Bytes host_bytes_ = 0, host_peak_ = 0, rollback_bytes_ = 0;
    // Last: their workers stop (and join) before the buffers they copy go.
    std::unique_ptr<detail::transfer::CopyChannel> to_host_ = std::make_unique<detail::transfer::CopyChannel>();
    std::unique_ptr<detail::transfer::CopyChannel> to_device_ = std::make_unique<detail::transfer::CopyChannel>();
};

}  // namespace remat
