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
#include <span>
#include <string>
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
    t.commit_step();                ///< forgets what keep_for_rollback kept (its buffers may stay for reuse)
    { ct.rollback_bytes() } -> std::convertible_to<Bytes>;  ///< bytes this step keeps now
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


// Which copies each data had when the step began, what the step did to it, and the values
// kept before its updates: what a failed step needs to put everything back (all or
// nothing). Shared by the transfer backends, which give their copies through `copies`:
//   read_device(d, std::byte* out)     the device copy's values, contiguous
//   keep_device(d, std::byte* out)     the same, but it may complete later: before any op issued
//                                      after it changes the device copy, and before the backend's
//                                      synchronize() returns (a GPU copies on the compute stream)
//   rollback_buffer(d) -> std::byte*   where the values kept before an update go: the backend's,
//                                      allocated on first use and reused by later steps (a step
//                                      allocating them afresh paid page faults or pinning each time)
//   write_device(d, const std::byte* in)
//   host_values(d) -> std::byte*       the host copy (nullptr when there is none)
//   make_host(d) -> std::byte*         the host copy, allocated (and counted) when missing
//   drop_host(d), make_device(d), drop_device(d)
// Each is called once no transfer is in flight (the backend synchronizes first).
class StepLedger {
public:
    explicit StepLedger(const Problem& problem)
        : bytes_(problem.data_count()), device_live_(problem.data_count(), 1), started_on_device_(problem.data_count(), 1),
          started_on_host_(problem.data_count(), 0), touched_(problem.data_count(), 0), kept_(problem.data_count(), nullptr) {
        for (std::size_t k = 0; k < problem.data_count(); ++k) bytes_[k] = problem.data(DataId{k}).bytes;
    }

    [[nodiscard]] Bytes bytes(DataId d) const { return bytes_[d.index]; }
    [[nodiscard]] bool device_live(DataId d) const { return device_live_[d.index] != 0; }
    void device_made(DataId d) { device_live_[d.index] = touched_[d.index] = 1; }
    void device_dropped(DataId d) {
        device_live_[d.index] = 0;
        touched_[d.index] = 1;
    }
    void touch(DataId d) { touched_[d.index] = 1; }

    /// Remembers where each data has a copy now (`has_host(d)`: whether it has a host copy).
    template <class HasHost>
    void begin(HasHost has_host) {
        commit();
        for (std::size_t k = 0; k < bytes_.size(); ++k) {
            started_on_device_[k] = device_live_[k];
            started_on_host_[k] = has_host(DataId{k}) ? 1 : 0;
        }
        std::fill(touched_.begin(), touched_.end(), 0);
    }

    /// Keeps the device copy's values before an op updates them (once per step).
    template <class Copies>
    void keep(DataId d, Copies& copies) {
        if (kept_[d.index]) return;
        kept_[d.index] = copies.rollback_buffer(d);
        copies.keep_device(d, kept_[d.index]);
        rollback_bytes_ += bytes_[d.index];
        touched_[d.index] = 1;
    }

    /// Each data the step moved or updated gets its values back (those kept before an update,
    /// else those of a copy the step did not change) wherever it had a copy, and loses the
    /// copies it did not have.
    template <class Copies>
    void roll_back(Copies& copies) {
        for (std::size_t k = 0; k < bytes_.size(); ++k) {
            if (!touched_[k]) continue;
            const DataId d{k};
            const std::span<const std::byte> values = values_before_step(d, copies);
            if (started_on_host_[k]) std::memcpy(copies.make_host(d), values.data(), values.size());
            else copies.drop_host(d);
            if (started_on_device_[k]) {
                if (!device_live_[k]) {
                    copies.make_device(d);
                    device_live_[k] = 1;
                }
                copies.write_device(d, values.data());
            } else if (device_live_[k]) {
                copies.drop_device(d);
                device_live_[k] = 0;
            }
        }
        commit();
        std::fill(touched_.begin(), touched_.end(), 0);
    }

    /// Forgets the kept values (their buffers stay with the backend).
    void commit() {
        std::fill(kept_.begin(), kept_.end(), nullptr);
        rollback_bytes_ = 0;
    }
    [[nodiscard]] Bytes rollback_bytes() const noexcept { return rollback_bytes_; }

private:
    // Where the values of a data at the start of the step are now: kept before its update;
    // else its device copy, when that copy lived through the step (nothing updated it);
    // else its host copy (an offload wrote the same values, or the step never touched it);
    // else a device copy made in the step (prefetched from a host copy since freed).
    // The span lives until the next call.
    template <class Copies>
    [[nodiscard]] std::span<const std::byte> values_before_step(DataId d, Copies& copies) {
        const auto n = static_cast<std::size_t>(bytes_[d.index]);
        if (kept_[d.index]) return {kept_[d.index], n};
        scratch_.resize(n);
        const std::byte* host = copies.host_values(d);
        if ((started_on_device_[d.index] || !host) && device_live_[d.index]) {
            copies.read_device(d, scratch_.data());
        } else if (host) {
            std::memcpy(scratch_.data(), host, n);
        } else {
            throw ExecutionError("rolling back data #" + std::to_string(d.index) +
                                 ": no copy of it is left on the device or the host (the schedule freed the last one)");
        }
        return scratch_;
    }

    std::vector<Bytes> bytes_;
    std::vector<char> device_live_, started_on_device_, started_on_host_, touched_;
    std::vector<std::byte*> kept_;   // the backend's buffer holding the values before an update; null: none kept
    std::vector<std::byte> scratch_;  // the values of a data not kept (read back from a copy)
    Bytes rollback_bytes_ = 0;
};

/// The bytes of a backend's host copies, and their peak.
class HostAccount {
public:
    void add(Bytes bytes) {
        current_ += bytes;
        peak_ = std::max(peak_, current_);
    }
    void remove(Bytes bytes) { current_ -= bytes; }
    [[nodiscard]] Bytes current() const noexcept { return current_; }
    [[nodiscard]] Bytes peak() const noexcept { return peak_; }
    void reset_peak() noexcept { peak_ = current_; }

private:
    Bytes current_ = 0, peak_ = 0;
};

}  // namespace detail::transfer

/// The transfer backend of a CPU-only machine: see the top of this header.
template <DeviceStore Store>
class CpuTransfers {
public:
    CpuTransfers(Store& store, const Problem& problem)
        : store_(&store), ledger_(problem), host_(problem.data_count()), rollback_(problem.data_count()),
          device_ticket_(problem.data_count(), 0),
          read_ticket_(problem.data_count(), 0), host_ticket_(problem.data_count(), 0),
          host_read_ticket_(problem.data_count(), 0) {}

    void offload(DataId d) {
        ledger_.touch(d);
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
        ledger_.device_made(d);
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
        wait_writable(d);
        store_->drop_device_copy(d);
        ledger_.device_dropped(d);
    }

    void release_host(DataId d) {
        to_host_->wait(host_ticket_[d.index]);
        to_device_->wait(host_read_ticket_[d.index]);
        drop_host_copy(d);
        ledger_.touch(d);
    }

    // ---- all or nothing

    void begin_step() {
        synchronize();
        ledger_.begin([&](DataId d) { return host_[d.index] != nullptr; });
    }
    // A synchronous copy: the op that updates the data runs right after.
    void keep_for_rollback(DataId d) {
        wait_writable(d);
        Copies copies{this};
        ledger_.keep(d, copies);
    }
    void roll_back() {
        synchronize();
        Copies copies{this};
        ledger_.roll_back(copies);
    }
    void commit_step() { ledger_.commit(); }

    void synchronize() {
        to_host_->drain();
        to_device_->drain();
    }

    [[nodiscard]] Bytes host_bytes() const noexcept { return host_bytes_.current(); }
    /// Host bytes kept for a rollback (outside host_bytes(): the plan's host limit is not theirs).
    [[nodiscard]] Bytes rollback_bytes() const noexcept { return ledger_.rollback_bytes(); }
    [[nodiscard]] Bytes host_peak() const noexcept { return host_bytes_.peak(); }
    void reset_host_peak() noexcept { host_bytes_.reset_peak(); }
    /// The host copy of a data (empty when it has none), once its offload is done.
    [[nodiscard]] std::span<const std::byte> host_copy(DataId d) {
        to_host_->wait(host_ticket_[d.index]);
        if (!host_[d.index]) return {};
        return {host_[d.index].get(), static_cast<std::size_t>(ledger_.bytes(d))};
    }
    /// Seconds each worker spent copying (device → host, host → device).
    [[nodiscard]] std::pair<double, double> busy_seconds() const {
        return {to_host_->busy_seconds(), to_device_->busy_seconds()};
    }

private:
    // The ledger's access to the copies (detail::transfer::StepLedger).
    struct Copies {
        CpuTransfers* self;
        void read_device(DataId d, std::byte* out) { gather(self->store_->device_bytes(d), out); }
        void keep_device(DataId d, std::byte* out) { read_device(d, out); }
        [[nodiscard]] std::byte* rollback_buffer(DataId d) {
            auto& buffer = self->rollback_[d.index];
            if (!buffer) buffer = std::make_unique<std::byte[]>(static_cast<std::size_t>(self->ledger_.bytes(d)));
            return buffer.get();
        }
        void write_device(DataId d, const std::byte* in) { scatter(in, self->store_->device_bytes(d)); }
        [[nodiscard]] std::byte* host_values(DataId d) { return self->host_[d.index].get(); }
        [[nodiscard]] std::byte* make_host(DataId d) { return self->host_buffer(d); }
        void drop_host(DataId d) { self->drop_host_copy(d); }
        void make_device(DataId d) { self->store_->make_device_copy(d); }
        void drop_device(DataId d) { self->store_->drop_device_copy(d); }
    };

    // The host copy's buffer, allocated (and counted) on its first offload.
    std::byte* host_buffer(DataId d) {
        if (!host_[d.index]) {
            host_[d.index] = std::make_unique<std::byte[]>(static_cast<std::size_t>(ledger_.bytes(d)));
            host_bytes_.add(ledger_.bytes(d));
        }
        return host_[d.index].get();  // a stale copy is overwritten in place
    }

    void drop_host_copy(DataId d) {
        if (!host_[d.index]) return;
        host_[d.index].reset();
        host_bytes_.remove(ledger_.bytes(d));
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

    Store* store_;
    detail::transfer::StepLedger ledger_;
    detail::transfer::HostAccount host_bytes_;
    std::vector<std::unique_ptr<std::byte[]>> host_;
    std::vector<std::unique_ptr<std::byte[]>> rollback_;  // values kept before an update (StepLedger)
    std::vector<std::uint64_t> device_ticket_;     // the prefetch writing the device copy
    std::vector<std::uint64_t> read_ticket_;       // the offload reading the device copy
    std::vector<std::uint64_t> host_ticket_;       // the offload writing the host copy
    std::vector<std::uint64_t> host_read_ticket_;  // the prefetch reading the host copy
    // Last: their workers stop (and join) before the buffers they copy go.
    std::unique_ptr<detail::transfer::CopyChannel> to_host_ = std::make_unique<detail::transfer::CopyChannel>();
    std::unique_ptr<detail::transfer::CopyChannel> to_device_ = std::make_unique<detail::transfer::CopyChannel>();
};

}  // namespace remat
