// remat/core/problem.hpp — the rematerialization problem: a bipartite graph of data and ops.
//
// This is the `remat.problem/1` model of docs/formats.md §1 (problems), with the offloading
// fields of `remat.problem/2` (§11: offloadable data, ops that update weights in place, a host
// limit and bandwidths) (after Checkmate, Jain et al.,
// MLSys 2020, and Rockmate, Zhao et al., ICML 2023, whose graphs of data and computations
// it generalises): data have sizes, ops read and write data, take time and transient
// memory, and some must run exactly once. A Problem is immutable; ProblemBuilder makes
// one and checks it, naming the offending item in every error.
//
// Limits (checked by ProblemBuilder::build(), so by every reader too):
// - Sizes: memory is counted in Bytes, a signed 64-bit integer. A problem is rejected
//   (InvalidInput naming the problem and the data where the sum overflows) when the sum of
//   the sizes of all its data plus its largest op overhead exceeds 2^63 - 1 bytes. Every
//   memory figure remat computes (the simulator's states and peaks, P_ref, the solvers'
//   tables) is at most that sum, so no sum of sizes overflows after validation. Budgets
//   above it are fine (they are compared with sums, never added to); a percentage budget
//   whose bytes would exceed 2^63 - 1 is rejected when it is resolved.
// - Times: every op time must be finite and non-negative, and the sum of all op times,
//   times the number of ops, must be finite as a double: a problem whose times are so large
//   that recomputing every op once per op could overflow to infinity is rejected. T_ref and
//   every predicted time are therefore finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace remat {

namespace detail {
// A name in quotes for a message, shortened and escaped (errors.hpp: printable()).
inline std::string quoted(std::string_view name) {
    std::string out(1, '\'');  // appended, not "'" + ...: GCC 12 warns (-Wrestrict) on the latter
    out += printable(name);
    out += '\'';
    return out;
}
// Names to indices, looked up by string_view without a copy.
struct NameHash {
    using is_transparent = void;
    [[nodiscard]] std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using NameIndex = std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>>;
}  // namespace detail

/// Dense index of a data in its Problem.
struct DataId {
    std::size_t index = 0;
    friend auto operator<=>(const DataId&, const DataId&) = default;
};

/// Dense index of an op in its Problem.
struct OpId {
    std::size_t index = 0;
    friend auto operator<=>(const OpId&, const OpId&) = default;
};

struct Data {
    std::string name;
    Bytes bytes = 0;
    /// May have a copy in host memory and leave the device (docs/formats.md §11, offloading).
    bool offloadable = false;
    friend bool operator==(const Data&, const Data&) = default;
};

struct Op {
    std::string name;
    double time = 0.0;
    Bytes overhead = 0;
    std::vector<DataId> reads;
    std::vector<DataId> writes;
    bool exactly_once = false;
    /// Initial data this op changes in place (an optimizer step on a weight and its state):
    /// live when it starts, and read by no op after it (docs/formats.md §11).
    std::vector<DataId> updates;
    friend bool operator==(const Op&, const Op&) = default;
};

/// What a problem says about host memory and transfers (docs/formats.md §11). Bandwidths
/// are in bytes per unit of the problem's time (bytes per second for profiled problems); 0
/// means "not given".
struct TransferSettings {
    std::optional<Bytes> host_limit;
    double bandwidth_to_host = 0.0;
    double bandwidth_to_device = 0.0;
    friend bool operator==(const TransferSettings&, const TransferSettings&) = default;
};

class ProblemBuilder;

class Problem {
public:
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    [[nodiscard]] std::size_t data_count() const noexcept { return data_.size(); }
    [[nodiscard]] std::size_t op_count() const noexcept { return ops_.size(); }
    [[nodiscard]] std::span<const Data> all_data() const noexcept { return data_; }
    [[nodiscard]] std::span<const Op> all_ops() const noexcept { return ops_; }
    [[nodiscard]] const Data& data(DataId id) const { return data_.at(id.index); }
    [[nodiscard]] const Op& op(OpId id) const { return ops_.at(id.index); }

    /// Ops that write / read a data, in op order.
    [[nodiscard]] std::span<const OpId> writers(DataId id) const { return writers_.at(id.index); }
    [[nodiscard]] std::span<const OpId> readers(DataId id) const { return readers_.at(id.index); }

    [[nodiscard]] std::span<const DataId> initial() const noexcept { return initial_; }
    [[nodiscard]] std::span<const DataId> final_data() const noexcept { return final_; }
    [[nodiscard]] bool is_initial(DataId id) const { return is_initial_.at(id.index) != 0; }
    [[nodiscard]] bool is_final(DataId id) const { return is_final_.at(id.index) != 0; }

    /// The op that ends the forward phase, when the problem names one.
    [[nodiscard]] std::optional<OpId> loss() const noexcept { return loss_; }
    /// The framework's own order of the step (docs/formats.md §4 (store-all reference)); empty when not given.
    [[nodiscard]] std::span<const OpId> autograd_order() const noexcept { return autograd_; }

    /// Host limit and bandwidths (docs/formats.md §11); all unset for a `remat.problem/1` problem.
    [[nodiscard]] const TransferSettings& transfers() const noexcept { return transfers_; }
    /// The op that updates a data in place, if any (at most one does).
    [[nodiscard]] std::optional<OpId> updater(DataId id) const {
        const std::size_t k = updater_.at(id.index);
        return k == no_updater ? std::nullopt : std::optional<OpId>(OpId{k});
    }
    [[nodiscard]] bool has_updates() const noexcept { return has_updates_; }
    /// Whether the problem uses a field of `remat.problem/2` (offloadable data, updates, a
    /// host limit or bandwidths), so that it must be written in that format.
    [[nodiscard]] bool uses_transfer_fields() const noexcept {
        return has_updates_ || transfers_ != TransferSettings{} ||
               std::any_of(data_.begin(), data_.end(), [](const Data& d) { return d.offloadable; });
    }

    [[nodiscard]] std::optional<DataId> find_data(std::string_view name) const {
        if (const auto it = data_index_.find(name); it != data_index_.end()) return DataId{it->second};
        return std::nullopt;
    }
    [[nodiscard]] std::optional<OpId> find_op(std::string_view name) const {
        if (const auto it = op_index_.find(name); it != op_index_.end()) return OpId{it->second};
        return std::nullopt;
    }
    /// Like find_data / find_op, but an unknown name is an InvalidInput error.
    [[nodiscard]] DataId data_id(std::string_view name) const {
        if (auto id = find_data(name)) return *id;
        throw InvalidInput("problem " + detail::quoted(name_) + " has no data named " + detail::quoted(name));
    }
    [[nodiscard]] OpId op_id(std::string_view name) const {
        if (auto id = find_op(name)) return *id;
        throw InvalidInput("problem " + detail::quoted(name_) + " has no op named " + detail::quoted(name));
    }

    /// Sum of the sizes of all initial data: the memory of the first state.
    [[nodiscard]] Bytes initial_bytes() const noexcept {
        Bytes total = 0;
        for (const DataId d : initial_) total += data_[d.index].bytes;
        return total;
    }

    /// This problem with other op overheads, one per op by index, and everything else the
    /// same (ids included): what a profile that measured the ops' transient memory gives.
    /// Throws InvalidInput on a count that is not op_count() or a negative overhead.
    [[nodiscard]] Problem with_overheads(std::span<const Bytes> overheads) const {
        if (overheads.size() != ops_.size())
            throw InvalidInput("problem " + detail::quoted(name_) + " has " + std::to_string(ops_.size()) +
                               " ops, but " + std::to_string(overheads.size()) + " overheads were given for them");
        Problem p = *this;
        for (std::size_t k = 0; k < ops_.size(); ++k) {
            if (overheads[k] < 0)
                throw InvalidInput("op " + detail::quoted(ops_[k].name) + " would get negative overhead " +
                                   std::to_string(overheads[k]));
            p.ops_[k].overhead = overheads[k];
        }
        return p;
    }

    friend bool operator==(const Problem&, const Problem&) = default;

private:
    friend class ProblemBuilder;
    Problem() = default;

    std::string name_;
    std::vector<Data> data_;
    std::vector<Op> ops_;
    std::vector<std::vector<OpId>> writers_;
    std::vector<std::vector<OpId>> readers_;
    std::vector<DataId> initial_;
    std::vector<DataId> final_;
    std::vector<char> is_initial_;
    std::vector<char> is_final_;
    std::optional<OpId> loss_;
    std::vector<OpId> autograd_;
    TransferSettings transfers_;
    static constexpr std::size_t no_updater = static_cast<std::size_t>(-1);
    std::vector<std::size_t> updater_;  // by data: the op that updates it, or no_updater
    bool has_updates_ = false;
    detail::NameIndex data_index_;
    detail::NameIndex op_index_;
};

/// What an op is, before it gets its id.
struct OpSpec {
    std::string name;
    double time = 0.0;
    Bytes overhead = 0;
    std::vector<DataId> reads;
    std::vector<DataId> writes;
    bool exactly_once = false;
    std::vector<DataId> updates{};  // docs/formats.md §11; an initializer keeps {name, ..., once} warning-free
};

/// Builds a Problem. Names are checked as they are added; the graph as a whole
/// (writers of final data, reachability of exactly-once ops, the autograd order) in build().
class ProblemBuilder {
public:
    explicit ProblemBuilder(std::string name) {
        if (name.empty()) throw InvalidInput("a problem needs a non-empty name");
        problem_.name_ = std::move(name);
    }

    /// Room for this many data and ops (an optimisation for large problems; never required).
    void reserve(std::size_t data, std::size_t ops) {
        problem_.data_.reserve(data);
        problem_.data_index_.reserve(data);
        problem_.ops_.reserve(ops);
        problem_.op_index_.reserve(ops);
    }

    DataId add_data(std::string name, Bytes bytes, bool offloadable = false) {
        if (name.empty()) throw InvalidInput("data #" + std::to_string(problem_.data_.size()) + " has an empty name");
        if (bytes < 0)
            throw InvalidInput("data " + detail::quoted(name) + " has negative size " + std::to_string(bytes) + " bytes");
        if (problem_.data_index_.contains(name)) throw InvalidInput("data " + detail::quoted(name) + " is defined twice");
        const DataId id{problem_.data_.size()};
        problem_.data_index_.emplace(name, id.index);
        problem_.data_.push_back(Data{std::move(name), bytes, offloadable});
        return id;
    }

    OpId add_op(OpSpec spec) {
        const std::string& name = spec.name;
        if (name.empty()) throw InvalidInput("op #" + std::to_string(problem_.ops_.size()) + " has an empty name");
        const auto op = [&name] { return "op " + detail::quoted(name); };  // messages only
        if (problem_.op_index_.contains(name)) throw InvalidInput(op() + " is defined twice");
        if (!std::isfinite(spec.time) || spec.time < 0)
            throw InvalidInput(op() + " has time " + std::to_string(spec.time) + "; times must be finite and non-negative");
        if (spec.overhead < 0) throw InvalidInput(op() + " has negative overhead " + std::to_string(spec.overhead));
        if (spec.writes.empty()) throw InvalidInput(op() + " writes nothing; every op must write a data");
        check_list(name, "reads", spec.reads);
        check_list(name, "writes", spec.writes);
        check_list(name, "updates", spec.updates);
        if (!spec.updates.empty() && !spec.exactly_once)
            throw InvalidInput(op() + " updates data in place, so it must be exactly_once");
        for (const DataId d : spec.updates)
            if (std::find(spec.writes.begin(), spec.writes.end(), d) != spec.writes.end())
                throw InvalidInput(op() + " both writes and updates " + detail::quoted(problem_.data_[d.index].name));
        const OpId id{problem_.ops_.size()};
        problem_.op_index_.emplace(name, id.index);
        problem_.ops_.push_back(Op{std::move(spec.name), spec.time, spec.overhead, std::move(spec.reads),
                                   std::move(spec.writes), spec.exactly_once, std::move(spec.updates)});
        return id;
    }

    void add_initial(DataId id) { add_to_list(id, "initial", problem_.initial_); }
    void add_final(DataId id) { add_to_list(id, "final", problem_.final_); }
    void set_loss(OpId id) {
        check_op(id, "loss");
        problem_.loss_ = id;
    }
    /// docs/formats.md §11: a host-memory limit and the bandwidths of both directions.
    void set_transfers(TransferSettings settings) {
        if (settings.host_limit && *settings.host_limit < 0)
            throw InvalidInput("problem " + detail::quoted(problem_.name_) + ": the host limit is negative");
        for (const double b : {settings.bandwidth_to_host, settings.bandwidth_to_device})
            if (!std::isfinite(b) || b < 0)
                throw InvalidInput("problem " + detail::quoted(problem_.name_) + ": bandwidth " + std::to_string(b) +
                                   " is not a finite non-negative number of bytes per time unit");
        problem_.transfers_ = settings;
    }
    void set_autograd_order(std::vector<OpId> order) {
        for (const OpId op : order) check_op(op, "autograd");
        problem_.autograd_ = std::move(order);
    }

    /// Names already added, for readers of other formats.
    [[nodiscard]] std::optional<DataId> find_data(std::string_view name) const { return problem_.find_data(name); }
    [[nodiscard]] std::optional<OpId> find_op(std::string_view name) const { return problem_.find_op(name); }
    [[nodiscard]] DataId data_id(std::string_view name) const { return problem_.data_id(name); }
    [[nodiscard]] OpId op_id(std::string_view name) const { return problem_.op_id(name); }

    /// Checks the whole graph and returns the problem. The builder is left empty.
    [[nodiscard]] Problem build() {
        Problem& p = problem_;
        const std::size_t n_data = p.data_.size();
        p.writers_.assign(n_data, {});
        p.readers_.assign(n_data, {});
        for (std::size_t i = 0; i < p.ops_.size(); ++i) {
            for (const DataId d : p.ops_[i].reads) p.readers_[d.index].push_back(OpId{i});
            for (const DataId d : p.ops_[i].writes) p.writers_[d.index].push_back(OpId{i});
        }
        p.is_initial_.assign(n_data, 0);
        p.is_final_.assign(n_data, 0);
        for (const DataId d : p.initial_) p.is_initial_[d.index] = 1;
        for (const DataId d : p.final_) p.is_final_[d.index] = 1;

        // Which data can ever become live, ignoring memory: a fixpoint from the initial data.
        std::vector<char> reachable = p.is_initial_;
        std::vector<char> runnable(p.ops_.size(), 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (std::size_t i = 0; i < p.ops_.size(); ++i) {
                if (runnable[i]) continue;
                const Op& op = p.ops_[i];
                bool ready = true;
                for (const DataId d : op.reads) ready = ready && reachable[d.index];
                if (!ready) continue;
                runnable[i] = 1;
                changed = true;
                for (const DataId d : op.writes) reachable[d.index] = 1;
            }
        }
        for (const DataId d : p.final_) {
            const Data& data = p.data_[d.index];
            if (p.writers_[d.index].empty() && !p.is_initial_[d.index])
                throw InvalidInput("final data " + detail::quoted(data.name) + " has no writer and is not initial");
            if (!reachable[d.index])
                throw InvalidInput("final data " + detail::quoted(data.name) +
                                   " can never be computed: every writer needs data that nothing produces");
        }
        for (std::size_t i = 0; i < p.ops_.size(); ++i) {
            const Op& op = p.ops_[i];
            if (!op.exactly_once || runnable[i]) continue;
            std::string missing;
            for (const DataId d : op.reads)
                if (!reachable[d.index]) missing += (missing.empty() ? "" : ", ") + detail::quoted(p.data_[d.index].name);
            throw InvalidInput("exactly-once op " + detail::quoted(op.name) + " can never run: it reads " + missing +
                               ", which no op can produce from the initial data");
        }
        check_updates();
        check_autograd_order();
        check_totals();

        Problem result = std::move(problem_);
        problem_ = Problem{};
        in_initial_.clear();
        in_final_.clear();
        return result;
    }

private:
    void check_data(DataId id, const std::string& where) const {
        if (id.index >= problem_.data_.size())
            throw InvalidInput(where + ": data id " + std::to_string(id.index) + " does not exist");
    }
    void check_op(OpId id, const std::string& where) const {
        if (id.index >= problem_.ops_.size())
            throw InvalidInput(where + ": op id " + std::to_string(id.index) + " does not exist");
    }
    // Ids exist and none repeats; n log n in the list (a sorted copy) however long it is.
    void check_list(const std::string& op, const char* field, const std::vector<DataId>& list) const {
        for (const DataId d : list)
            if (d.index >= problem_.data_.size()) check_data(d, "op " + detail::quoted(op) + " " + field);
        std::optional<DataId> twice;
        if (list.size() <= 16) {
            for (std::size_t i = 0; i < list.size() && !twice; ++i)
                for (std::size_t j = 0; j < i && !twice; ++j)
                    if (list[j] == list[i]) twice = list[i];
        } else {
            std::vector<DataId> sorted = list;
            std::sort(sorted.begin(), sorted.end());
            if (const auto it = std::adjacent_find(sorted.begin(), sorted.end()); it != sorted.end()) twice = *it;
        }
        if (twice)
            throw InvalidInput("op " + detail::quoted(op) + " lists data " + detail::quoted(problem_.data_[twice->index].name) +
                               " twice in " + field);
    }
    void add_to_list(DataId id, const char* list_name, std::vector<DataId>& list) {
        check_data(id, list_name);
        std::vector<char>& listed = &list == &problem_.initial_ ? in_initial_ : in_final_;
        listed.resize(problem_.data_.size(), 0);
        if (listed[id.index])
            throw InvalidInput("data " + detail::quoted(problem_.data_[id.index].name) + " is listed twice in " + list_name);
        listed[id.index] = 1;
        list.push_back(id);
    }

    // The limits of the header comment: sizes whose sum (plus the largest overhead) fits in
    // Bytes, and times whose sum, times the number of ops, is finite.
    void check_totals() const {
        const Problem& p = problem_;
        constexpr Bytes max = std::numeric_limits<Bytes>::max();
        Bytes overhead = 0;
        double time = 0.0;
        for (const Op& op : p.ops_) {
            overhead = std::max(overhead, op.overhead);
            time += op.time;
        }
        Bytes total = overhead;
        for (const Data& d : p.data_) {
            if (d.bytes > max - total)
                throw InvalidInput("problem " + detail::quoted(p.name_) + ": its data sizes add up to more than 2^63 - 1 "
                                   "bytes (the sum overflows at data " + detail::quoted(d.name) + ", " +
                                   std::to_string(d.bytes) + " bytes, with the largest op overhead of " +
                                   std::to_string(overhead) + " bytes counted); remat counts memory in signed 64-bit "
                                   "bytes: give the sizes in a coarser unit");
            total += d.bytes;
        }
        if (!std::isfinite(time * static_cast<double>(std::max<std::size_t>(1, p.ops_.size()))))
            throw InvalidInput("problem " + detail::quoted(p.name_) + ": its op times add up to " + std::to_string(time) +
                               ", too large for sums of recomputations to stay finite (times the number of ops, it "
                               "overflows a double); give the times in a coarser unit");
    }

    // docs/formats.md §11: only initial data are updated, each by at most one op.
    void check_updates() {
        Problem& p = problem_;
        p.updater_.assign(p.data_.size(), Problem::no_updater);
        for (std::size_t i = 0; i < p.ops_.size(); ++i)
            for (const DataId d : p.ops_[i].updates) {
                const std::string& data = p.data_[d.index].name;
                if (!p.is_initial_[d.index])
                    throw InvalidInput("op " + detail::quoted(p.ops_[i].name) + " updates " + detail::quoted(data) +
                                       ", which is not initial; only initial data (weights, optimizer state) are updated "
                                       "in place");
                if (p.updater_[d.index] != Problem::no_updater)
                    throw InvalidInput("data " + detail::quoted(data) + " is updated by two ops, " +
                                       detail::quoted(p.ops_[p.updater_[d.index]].name) + " and " +
                                       detail::quoted(p.ops_[i].name) + "; at most one op may update a data");
                p.updater_[d.index] = i;
                p.has_updates_ = true;
            }
    }

    // The autograd order must be runnable as written: each op's reads written earlier (or
    // initial), each exactly-once op once, and every final data produced.
    void check_autograd_order() const {
        const Problem& p = problem_;
        if (p.autograd_.empty()) return;
        std::vector<char> available = p.is_initial_;
        std::vector<char> updated(p.data_.size(), 0);
        std::vector<char> ran(p.ops_.size(), 0);
        for (std::size_t pos = 0; pos < p.autograd_.size(); ++pos) {
            const Op& op = p.ops_[p.autograd_[pos].index];
            for (const DataId d : op.reads)
                if (!available[d.index])
                    throw InvalidInput("autograd order: op " + detail::quoted(op.name) + " (position " +
                                       std::to_string(pos) + ") reads " + detail::quoted(p.data_[d.index].name) +
                                       " before any earlier op writes it");
            if (op.exactly_once && ran[p.autograd_[pos].index])
                throw InvalidInput("autograd order: exactly-once op " + detail::quoted(op.name) + " appears twice");
            for (const std::vector<DataId>* list : {&op.reads, &op.updates})
                for (const DataId d : *list)
                    if (updated[d.index])
                        throw InvalidInput("autograd order: op " + detail::quoted(op.name) + " (position " +
                                           std::to_string(pos) + ") uses " + detail::quoted(p.data_[d.index].name) +
                                           " after an earlier op updated it");
            for (const DataId d : op.updates) updated[d.index] = 1;
            ran[p.autograd_[pos].index] = 1;
            for (const DataId d : op.writes) available[d.index] = 1;
        }
        for (std::size_t i = 0; i < p.ops_.size(); ++i)
            if (p.ops_[i].exactly_once && !ran[i])
                throw InvalidInput("autograd order omits exactly-once op " + detail::quoted(p.ops_[i].name));
        for (const DataId d : p.final_)
            if (!available[d.index])
                throw InvalidInput("autograd order never produces final data " + detail::quoted(p.data_[d.index].name));
    }

    Problem problem_;
    std::vector<char> in_initial_;  // by data index: already in initial_ / final_
    std::vector<char> in_final_;
};

}  // namespace remat
