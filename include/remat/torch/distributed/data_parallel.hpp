// remat/torch/distributed/data_parallel.hpp — DataParallel: a planned module (Checkpointed,
// ScriptCheckpointed, a torch.export program) trained data-parallel over a c10d process group,
// with one plan for every process.
//
// As in PyTorch's DistributedDataParallel (Li et al., "PyTorch Distributed: Experiences on
// Accelerating Data Parallel Training", VLDB 2020), every process holds a replica of the model,
// the replicas start equal (rank 0's parameters and buffers are broadcast), and each backward
// ends with the parameter gradients averaged across processes by all-reduce in buckets, so that
// every replica's optimizer takes the same step. What remat adds:
//   - One plan. Plans made from each process's own profile can differ, and processes with
//     different plans would launch their collectives in different orders (a deadlock, or sums
//     of unrelated gradients). Rank 0's plan is broadcast; every rank checks it against its own
//     measurements and budget (one rank that cannot run it fails every rank, with its reason
//     where it is that rank); a fingerprint of the plan is compared across ranks before any
//     gradient is reduced, and again at the end of every step.
//   - The reduction is part of the step's all-or-nothing hand-over (torch/gradient_hooks.hpp):
//     gradients are reduced while the step still holds them, and handed to the parameters only
//     once every bucket has completed. A rank that throws, or a peer that dies, makes every
//     rank's step fail within the process group's timeout, and no parameter's gradient changes.
//   - With overlap (the default), a bucket's all-reduce starts as soon as the plan's backward
//     has finished with every parameter in it; the plan's order says when that is.
//   - Exact memory. Each gradient is reduced in place, a bucket's collectives launched together:
//     no flat copy of a bucket exists, so the step's memory is the plan's, as measured without
//     data parallelism. The price is one collective per gradient tensor instead of one per
//     bucket (c10d's coalesced all-reduce would flatten into memory the plan does not hold).
// After a failed step the process group is out of step (a rank may have launched collectives
// its peers never will): DataParallel refuses further steps, as torch's DDP cannot go on
// either; make a new process group (or restart the job).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../../core/errors.hpp"
#include "../../core/schedule.hpp"
#include "../../core/solver.hpp"
#include "../../core/timing.hpp"
#include "../gradient_hooks.hpp"
#include "process_group.hpp"

namespace remat::torch {

struct DataParallelOptions {
    /// Gradient bytes per bucket: parameters are grouped, in the reverse of their order (the
    /// order a backward finishes them), into buckets of about this size.
    Bytes bucket_bytes = Bytes{25} << 20;
    /// Start a bucket's all-reduce during the backward, as soon as its gradients are final;
    /// false: all of them at the end of the backward.
    bool overlap = true;
    /// Every rank runs rank 0's plan; false: every rank keeps its own, which must then be the
    /// same (the fingerprints are compared).
    bool share_plan = true;
    /// Rank 0's parameters and buffers are copied to every rank before the first step.
    bool broadcast_state = true;
};

/// What the last step's gradient reduction did.
struct ReductionReport {
    std::size_t buckets = 0;
    /// All-reduce calls (one per gradient tensor).
    std::size_t collectives = 0;
    /// Buckets whose all-reduce started during the backward (overlap).
    std::size_t buckets_started_early = 0;
    Bytes bytes = 0;
    /// How long the end of the step waited for the all-reduces: the part of the reduction not
    /// hidden under the backward.
    double wait_seconds = 0.0;
};

namespace detail::distributed {

/// FNV-1a, 64 bits: a fingerprint of a plan, equal on every rank that runs the same one.
class Fingerprint {
public:
    void add(std::uint64_t value) noexcept {
        for (int i = 0; i < 8; ++i) {
            hash_ ^= (value >> (8 * i)) & 0xffU;
            hash_ *= 0x100000001b3ULL;
        }
    }
    void add(const std::string& text) noexcept {
        add(text.size());
        for (const char c : text) add(static_cast<std::uint64_t>(static_cast<unsigned char>(c)));
    }
    [[nodiscard]] std::uint64_t value() const noexcept { return hash_; }

private:
    std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

/// The names and order of a problem's ops and data: what a schedule's indices refer to.
[[nodiscard]] inline std::uint64_t structure_fingerprint(const Problem& problem) {
    Fingerprint f;
    f.add(problem.op_count());
    for (std::size_t k = 0; k < problem.op_count(); ++k) f.add(problem.op(OpId{k}).name);
    f.add(problem.data_count());
    for (std::size_t k = 0; k < problem.data_count(); ++k) f.add(problem.data(DataId{k}).name);
    return f.value();
}

/// A schedule step as one number, the same on every rank: the op's or the data's index, times
/// 2, plus 1 for a free.
[[nodiscard]] inline std::uint64_t step_code(const Step& step) noexcept {
    return (step.is_run() ? step.op().index : step.data().index) * 2 + (step.is_free() ? 1 : 0);
}

[[nodiscard]] inline std::uint64_t plan_fingerprint(const Problem& problem, const Schedule& schedule) {
    Fingerprint f;
    f.add(structure_fingerprint(problem));
    f.add(schedule.size());
    for (const Step& step : schedule) f.add(step_code(step));
    return f.value();
}

/// Collectives on small control tensors, on the device the group reduces on.
///
/// On the CPU their tensors live in memory of their own (at::from_blob), not in c10's CPU
/// allocator: Gloo's worker thread may drop its reference to a collective's tensors after
/// wait() returns, and a free there lands in whatever step runs then. The CPU probe counts the
/// whole process, so the end-of-step gather's 32 bytes, freed during the next forward, made
/// that step's measured peak 32 bytes below the plan's (the data-parallel test failed so in
/// about 2 runs of 5).
class Control {
public:
    Control(remat::torch::distributed::ProcessGroupPtr group, c10::Device device)
        : group_(std::move(group)), device_(device) {}

    [[nodiscard]] int rank() const { return group_->getRank(); }
    [[nodiscard]] int size() const { return group_->getSize(); }

    /// Every rank's `row` (same length on all), gathered: row r of the result is rank r's.
    [[nodiscard]] std::vector<std::vector<std::int64_t>> gather(const std::vector<std::int64_t>& row) const {
        const auto width = static_cast<std::int64_t>(row.size());
        at::Tensor table = at::zeros({size(), width}, at::TensorOptions().dtype(at::kLong));
        for (std::int64_t j = 0; j < width; ++j) table[rank()][j] = row[static_cast<std::size_t>(j)];
        table = all_sum(table);
        std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(size()));
        for (int r = 0; r < size(); ++r)
            for (std::int64_t j = 0; j < width; ++j) out[static_cast<std::size_t>(r)].push_back(table[r][j].item<std::int64_t>());
        return out;
    }

    /// Rank 0's values, on every rank (`values` is only read on rank 0).
    [[nodiscard]] std::vector<std::int64_t> broadcast(std::vector<std::int64_t> values) const {
        const std::vector<std::int64_t> length = broadcast_fixed({static_cast<std::int64_t>(values.size())});
        values.resize(static_cast<std::size_t>(length[0]));
        return values.empty() ? values : broadcast_fixed(values);
    }

    /// Copies rank 0's value of `t` into `t` on every rank.
    void broadcast_in_place(const at::Tensor& t) const {
        const at::NoGradGuard no_grad;
        const bool dense = t.is_contiguous();
        std::vector<at::Tensor> list{dense ? t.detach() : on_device(t)};
        group_->broadcast(list)->wait();
        if (!dense) t.detach().copy_(list[0]);
    }

private:
    // A copy of `t` for a collective: on the CPU in memory that c10's allocator does not count
    // (see the class comment), elsewhere on the device.
    [[nodiscard]] at::Tensor on_device(const at::Tensor& t) const {
        if (!device_.is_cpu()) return t.to(device_).contiguous();
        auto memory = std::make_shared<std::vector<std::byte>>(t.nbytes());
        at::Tensor copy = at::from_blob(memory->data(), t.sizes(), [memory](void*) mutable { memory.reset(); },
                                        at::TensorOptions().dtype(t.scalar_type()));
        copy.copy_(t);
        return copy;
    }
    [[nodiscard]] at::Tensor all_sum(const at::Tensor& host) const {
        std::vector<at::Tensor> list{on_device(host)};
        group_->allreduce(list)->wait();
        return list[0].to(at::kCPU);
    }
    [[nodiscard]] std::vector<std::int64_t> broadcast_fixed(const std::vector<std::int64_t>& values) const {
        const auto count = static_cast<std::int64_t>(values.size());
        std::vector<at::Tensor> list{on_device(at::from_blob(const_cast<std::int64_t*>(values.data()), {count},
                                                             at::TensorOptions().dtype(at::kLong)))};
        group_->broadcast(list)->wait();
        const at::Tensor host = list[0].to(at::kCPU).contiguous();
        const auto* first = host.data_ptr<std::int64_t>();
        return {first, first + host.numel()};
    }

    remat::torch::distributed::ProcessGroupPtr group_;
    c10::Device device_;
};

/// Averages a step's parameter gradients across the group, bucket by bucket, in place (see the
/// top of this header); what the module's gradient hooks call.
class GradientReducer {
public:
    GradientReducer(remat::torch::distributed::ProcessGroupPtr group, std::vector<at::Tensor> parameters,
                    const DataParallelOptions& options)
        : group_(std::move(group)), parameters_(std::move(parameters)), overlap_(options.overlap) {
        bucket_of_.assign(parameters_.size(), 0);
        Bytes filled = 0;
        for (std::size_t i = parameters_.size(); i-- > 0;) {
            const at::Tensor& p = parameters_[i];
            const bool fresh = buckets_.empty() || filled >= options.bucket_bytes ||
                               p.scalar_type() != parameters_[buckets_.back().members.front()].scalar_type() ||
                               p.device() != parameters_[buckets_.back().members.front()].device();
            if (fresh) {
                buckets_.emplace_back();
                filled = 0;
            }
            buckets_.back().members.push_back(i);
            bucket_of_[i] = buckets_.size() - 1;
            filled += static_cast<Bytes>(p.nbytes());
            report_.bytes += static_cast<Bytes>(p.nbytes());
        }
        report_.buckets = buckets_.size();
        staged_.resize(parameters_.size());
    }

    /// The hooks that route a step's gradients through this reducer.
    [[nodiscard]] static GradientHooks hooks(const std::shared_ptr<GradientReducer>& self,
                                             std::function<void(std::vector<at::Tensor>&)> then_check) {
        GradientHooks h;
        if (self->overlap_) h.on_final = [self](std::size_t index, at::Tensor& g) { self->on_final(index, g); };
        h.before_hand_over = [self, check = std::move(then_check)](std::vector<at::Tensor>& gradients) {
            self->finish(gradients);
            check(gradients);
        };
        h.on_abandon = [self] { self->forget(); };
        return h;
    }

    [[nodiscard]] const ReductionReport& report() const noexcept { return report_; }
    [[nodiscard]] bool abandoned() const noexcept { return abandoned_; }

private:
    using WorkPtr = decltype(std::declval<c10d::ProcessGroup&>().allreduce(std::declval<std::vector<at::Tensor>&>()));

    struct Bucket {
        std::vector<std::size_t> members;  // parameter indices
        std::size_t final_members = 0;
        bool started = false;
    };

    // A gradient the all-reduce may write in place (the step gives it memory of its own) and
    // reduces through a contiguous view of that memory (a Linear layer's weight gradient is a
    // transposed one), so that no copy is made. A parameter no backward reached counts as
    // zero, so that every rank launches the same collectives.
    void stage(std::size_t index, at::Tensor& g) {
        const at::NoGradGuard no_grad;
        if (!g.defined())
            g = at::zeros_like(parameters_[index]);
        else if (!g.is_non_overlapping_and_dense())
            g = g.clone(at::MemoryFormat::Contiguous);
        staged_[index] = in_memory_order(g);
    }

    // `g`'s memory with its dimensions ordered by decreasing stride: contiguous for a dense
    // tensor. In the odd case where it is not, `g` becomes a contiguous copy (the step then
    // holds what the all-reduce writes).
    [[nodiscard]] static at::Tensor in_memory_order(at::Tensor& g) {
        if (g.is_contiguous()) return g;
        std::vector<std::int64_t> order(static_cast<std::size_t>(g.dim()));
        for (std::size_t d = 0; d < order.size(); ++d) order[d] = static_cast<std::int64_t>(d);
        std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return g.stride(a) > g.stride(b); });
        at::Tensor view = g.permute(order);
        if (view.is_contiguous()) return view;
        g = g.contiguous();
        return g;
    }

    void on_final(std::size_t index, at::Tensor& g) {
        stage(index, g);
        Bucket& bucket = buckets_[bucket_of_[index]];
        if (++bucket.final_members == bucket.members.size()) {
            start(bucket);
            ++step_.buckets_started_early;
        }
    }

    void start(Bucket& bucket) {
        for (const std::size_t i : bucket.members) {
            std::vector<at::Tensor> one{staged_[i]};
            works_.push_back(group_->allreduce(one));
            ++step_.collectives;
        }
        bucket.started = true;
    }

    // Starts what has not started (in bucket order, the same on every rank), waits for all,
    // and divides by the world size.
    void finish(std::vector<at::Tensor>& gradients) {
        try {
            for (std::size_t i = 0; i < gradients.size() && i < staged_.size(); ++i)
                if (!staged_[i].defined()) stage(i, gradients[i]);
            for (Bucket& bucket : buckets_)
                if (!bucket.started) start(bucket);
            const Stopwatch clock;
            for (const WorkPtr& work : works_) work->wait();
            step_.wait_seconds = clock.seconds();
        } catch (const std::exception& e) {
            forget();
            throw ExecutionError("rank " + std::to_string(group_->getRank()) + " of " +
                                 std::to_string(group_->getSize()) +
                                 ": the all-reduce of the parameter gradients failed (a peer failed or is gone, or "
                                 "the process group's timeout passed); no gradient was handed over: " +
                                 e.what());
        }
        const at::NoGradGuard no_grad;
        const int world = group_->getSize();
        if (world > 1)
            for (std::size_t i = 0; i < gradients.size(); ++i)
                if (gradients[i].defined()) gradients[i].div_(world);
        const ReductionReport done = {report_.buckets, step_.collectives, step_.buckets_started_early, report_.bytes,
                                      step_.wait_seconds};
        reset();
        report_ = done;
    }

    void forget() noexcept {
        abandoned_ = true;
        reset();
    }

    void reset() noexcept {
        works_.clear();
        for (auto& t : staged_) t = at::Tensor();
        for (Bucket& b : buckets_) {
            b.final_members = 0;
            b.started = false;
        }
        step_ = {};
    }

    remat::torch::distributed::ProcessGroupPtr group_;
    std::vector<at::Tensor> parameters_;
    bool overlap_;
    std::vector<Bucket> buckets_;
    std::vector<std::size_t> bucket_of_;
    std::vector<at::Tensor> staged_;  // this step's gradients under reduction
    std::vector<WorkPtr> works_;
    ReductionReport step_;
    ReductionReport report_;
    bool abandoned_ = false;
};

}  // namespace detail::distributed

/// A planned module (a holder such as Checkpointed<S, Probe>) trained data-parallel over
/// `group`; see the top of this header. Construct it on every rank with the same model and
/// options (it runs collectives). Then, as with the module itself:
///     auto loss = criterion(ddp.forward(x), y); loss.backward(); optimizer.step();
/// with `x` this rank's share of the batch: each rank's parameters get the gradient averaged
/// over the ranks.
template <class Module>
class DataParallel {
public:
    using Impl = typename Module::ContainedType;
    using Arguments = typename Impl::Arguments;
    using Result = typename Impl::Result;

    DataParallel(Module module, remat::torch::distributed::ProcessGroupPtr group, DataParallelOptions options = {})
        : module_(std::move(module)), group_(std::move(group)), options_(options) {
        if (!module_) throw InvalidInput("DataParallel: the module is empty");
        if (!group_) throw InvalidInput("DataParallel: the process group is null");
        if (options_.bucket_bytes <= 0)
            throw InvalidInput("DataParallel: bucket_bytes must be positive, not " + std::to_string(options_.bucket_bytes));
        const auto& parameters = module_->executor().parameters();
        control_ = std::make_unique<detail::distributed::Control>(
            group_, parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().device());
        if (options_.broadcast_state) broadcast_state();
        agree_on_plan();
    }

    /// The module's forward under the agreed plan; loss.backward() runs the rest and reduces the
    /// gradients. Inputs must have the shape the plan was made for (the same on every rank).
    Result forward(const Arguments& arguments) {
        if (broken_ || reducer_->abandoned())
            throw ExecutionError("DataParallel (rank " + std::to_string(rank()) +
                                 "): an earlier step failed, so the ranks' collectives are out of step; make a new "
                                 "process group and DataParallel (or restart the job)");
        if (!module_->front_end().fits(module_->executor(), arguments))
            throw InvalidInput("DataParallel (rank " + std::to_string(rank()) + "): " +
                               module_->front_end().mismatch(module_->executor(), arguments) +
                               "; every rank must run the agreed plan: call replan on every rank, then "
                               "agree_on_plan() on every rank");
        if (detail::distributed::plan_fingerprint(module_->problem(), module_->plan().schedule) != fingerprint_)
            throw InvalidInput("DataParallel (rank " + std::to_string(rank()) +
                               "): the module's plan changed since the ranks agreed on one; call agree_on_plan() on "
                               "every rank");
        if (::torch::autograd::GradMode::is_enabled()) ++steps_;  // a step, if anything requires grad
        try {
            return module_->forward(arguments);
        } catch (...) {
            broken_ = true;
            throw;
        }
    }

    /// Makes every rank run one plan (rank 0's, with share_plan) and checks that they do: a
    /// collective, to call on every rank at the same point. Throws on every rank when some
    /// rank cannot run the plan or the plans differ.
    void agree_on_plan() {
        namespace dd = detail::distributed;
        const Problem& problem = module_->problem();
        const std::uint64_t structure = dd::structure_fingerprint(problem);
        std::string failure;
        if (options_.share_plan) {
            std::vector<std::int64_t> message;
            if (rank() == 0) {
                message.push_back(static_cast<std::int64_t>(structure));
                for (const Step& s : module_->plan().schedule)
                    message.push_back(static_cast<std::int64_t>(dd::step_code(s)));
            }
            message = control_->broadcast(std::move(message));
            if (rank() != 0) failure = adopt(message, structure);
        }
        fingerprint_ = dd::plan_fingerprint(problem, module_->plan().schedule);
        const auto rows = control_->gather({failure.empty() ? 0 : 1, static_cast<std::int64_t>(fingerprint_)});
        std::vector<int> failed, differ;
        for (int r = 0; r < size(); ++r) {
            if (rows[static_cast<std::size_t>(r)][0] != 0) failed.push_back(r);
            if (rows[static_cast<std::size_t>(r)][1] != rows[0][1]) differ.push_back(r);
        }
        if (!failed.empty())
            throw Infeasible("DataParallel (rank " + std::to_string(rank()) + "): rank(s) " + list(failed) +
                                 " cannot run rank 0's plan" + (failure.empty() ? "" : ": " + failure) +
                                 "; give every rank the same budget and model, or a budget the largest rank's "
                                 "measurements fit",
                             module_->budget(), std::nullopt, module_->store_all_peak());
        if (!differ.empty()) {
            std::ostringstream text;
            text << "DataParallel (rank " << rank() << "): the ranks' plans differ (fingerprints";
            for (int r = 0; r < size(); ++r) text << " rank " << r << ": " << std::hex << rows[static_cast<std::size_t>(r)][1] << std::dec;
            text << "); with share_plan = false every rank must make the same plan; use share_plan = true";
            throw InvalidInput(text.str());
        }
        reducer_ = std::make_shared<dd::GradientReducer>(group_, module_->executor().parameters(), options_);
        module_->set_gradient_hooks(dd::GradientReducer::hooks(reducer_, [this](std::vector<at::Tensor>&) { check_in_step(); }));
        steps_ = 0;
    }

    // The module's hooks point at this object.
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;
    /// The module goes on without data parallelism.
    ~DataParallel() {
        if (module_) module_->set_gradient_hooks({});
    }

    [[nodiscard]] Module& module() noexcept { return module_; }
    [[nodiscard]] const Module& module() const noexcept { return module_; }
    [[nodiscard]] std::vector<at::Tensor> parameters() const { return module_->parameters(); }
    [[nodiscard]] int rank() const { return control_->rank(); }
    [[nodiscard]] int size() const { return control_->size(); }
    /// The agreed plan's fingerprint (the same on every rank).
    [[nodiscard]] std::uint64_t plan_fingerprint() const noexcept { return fingerprint_; }
    /// The last completed step's reduction.
    [[nodiscard]] const ReductionReport& last_reduction() const noexcept { return reducer_->report(); }
    [[nodiscard]] const DataParallelOptions& options() const noexcept { return options_; }

private:
    void broadcast_state() {
        for (const at::Tensor& p : module_->parameters()) control_->broadcast_in_place(p);
        for (const at::Tensor& b : module_->front_end().state_buffers(*module_)) control_->broadcast_in_place(b);
    }

    // Rank 0's plan on this rank: empty when adopted, else why not.
    [[nodiscard]] std::string adopt(const std::vector<std::int64_t>& message, std::uint64_t structure) {
        if (message.empty() || static_cast<std::uint64_t>(message[0]) != structure)
            return "rank " + std::to_string(rank()) +
                   "'s problem has other ops or data than rank 0's (a different model, input shape or front end)";
        Plan plan;
        const Problem& problem = module_->problem();
        for (std::size_t i = 1; i < message.size(); ++i) {  // step_code's inverse
            const auto code = static_cast<std::size_t>(message[i]);
            const std::size_t index = code / 2;
            const bool free = code % 2 == 1;
            if (index >= (free ? problem.data_count() : problem.op_count()))
                return "rank 0's plan names an op or data that rank " + std::to_string(rank()) + " does not have";
            plan.schedule.push_back(free ? Step::free(DataId{index}) : Step::run(OpId{index}));
        }
        plan.stats.solver = "rank 0's plan";
        try {
            module_->adopt_plan(std::move(plan));
        } catch (const std::exception& e) {
            return "rank " + std::to_string(rank()) + ": " + e.what();
        }
        return {};
    }

    // At the end of each step, after the all-reduces: every rank ran the same step of the
    // same plan, or nothing is handed over.
    void check_in_step() {
        const auto rows = control_->gather({static_cast<std::int64_t>(steps_), static_cast<std::int64_t>(fingerprint_)});
        for (int r = 0; r < size(); ++r)
            if (rows[static_cast<std::size_t>(r)] != rows[0]) {
                broken_ = true;
                throw ExecutionError("DataParallel (rank " + std::to_string(rank()) + "): rank " + std::to_string(r) +
                                     " is at step " + std::to_string(rows[static_cast<std::size_t>(r)][0]) +
                                     " where rank 0 is at step " + std::to_string(rows[0][0]) +
                                     " (or runs another plan): a rank gave up a step (its loss failed?) or ran "
                                     "another number of forwards; no gradient was handed over");
            }
    }

    static std::string list(const std::vector<int>& ranks) {
        std::string out;
        for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
        return out;
    }

    Module module_;
    remat::torch::distributed::ProcessGroupPtr group_;
    DataParallelOptions options_;
    std::unique_ptr<detail::distributed::Control> control_;
    std::shared_ptr<detail::distributed::GradientReducer> reducer_;
    std::uint64_t fingerprint_ = 0;
    std::uint64_t steps_ = 0;
    bool broken_ = false;
};

}  // namespace remat::torch
