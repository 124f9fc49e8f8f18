// DataParallel over c10d's Gloo on loopback: the tests launch two processes of this program
// (the hidden "[ddp-worker]" case below, told its rank, world and scenario through the
// environment, as torchrun does), wait for both within a deadline, and read what each wrote.
#include <torch/torch.h>

#include <catch2/catch.hpp>  // after LibTorch, whose glog defines CHECK too

#include <remat/solvers/rotor.hpp>
#include <remat/torch/distributed/data_parallel.hpp>
#include <remat/torch/distributed/local_launch.hpp>
#include <remat/torch/module.hpp>
#include <remat/torch/remove_folder.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace rt = remat::torch;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kFeatures = 24;
constexpr std::int64_t kWidth = 64;
constexpr std::int64_t kOutputs = 8;
constexpr std::int64_t kRankBatch = 16;
constexpr int kSteps = 3;
constexpr double kLearningRate = 0.1;

// What a fault stage does at its next forward: nothing, throw, or end the process.
enum Fault : int { none = 0, throw_error = 1, die = 2 };

torch::nn::Sequential make_model(std::uint64_t seed) {
    torch::manual_seed(seed);
    torch::nn::Sequential model;
    model->push_back(torch::nn::Linear(kFeatures, kWidth));
    for (int i = 0; i < 4; ++i) {
        model->push_back(torch::nn::Tanh());
        model->push_back(torch::nn::Linear(kWidth, kWidth));
    }
    model->push_back(torch::nn::Tanh());
    model->push_back(torch::nn::Linear(kWidth, kOutputs));
    return model;
}

// The whole batch, the same in every process.
std::pair<at::Tensor, at::Tensor> global_batch(int world) {
    const torch::Generator generator = at::detail::createCPUGenerator(42);
    at::Tensor x = at::randn({world * kRankBatch, kFeatures}, generator);
    at::Tensor y = at::randn({world * kRankBatch, kOutputs}, generator);
    return {x, y};
}

std::string env(const char* name, const std::string& fallback = "") {
    const char* v = std::getenv(name);
    return v ? v : fallback;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : tensors) out.push_back(t.detach().clone());
    return out;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!torch::equal(a[i], b[i])) return false;
    return true;
}

// ------------------------------------------------------------------ launching the ranks

struct RankOutcome {
    int exit_code = -1;
    std::map<std::string, std::string> facts;  // key -> the rest of its line
    std::string log;
};

// The folder the ranks write their facts, logs and parameters to; removed with the test's
// Launch (the logs reach the report through show()), so runs leave nothing in the temp folder.
// rt::remove_folder, not fs::remove_all: the latter crashes in programs linked with the pip
// wheel's LibTorch.
class ScratchFolder {
public:
    explicit ScratchFolder(fs::path path) : path_(std::move(path)) {
        std::error_code error;
        rt::remove_folder(path_, error);
        if (error) throw std::runtime_error("cannot empty " + path_.string() + ": " + error.message());
        fs::create_directories(path_);
    }
    ScratchFolder(const ScratchFolder&) = delete;
    ScratchFolder& operator=(const ScratchFolder&) = delete;
    ~ScratchFolder() {
        std::error_code ignored;
        rt::remove_folder(path_, ignored);
    }
    const fs::path& path() const { return path_; }

private:
    fs::path path_;
};

struct Launch {
    std::vector<RankOutcome> ranks;
    double seconds = 0.0;
    bool timed_out = false;
    std::unique_ptr<const ScratchFolder> folder;
};

std::string self_path() {
    return fs::read_symlink("/proc/self/exe").string();
}

// How the ranks are started: by default this program itself on this machine, meeting through
// a file; `hosts` runs rank r inside network namespace hosts[r], meeting over TCP at the
// addresses given.
struct Placement {
    std::vector<std::string> namespaces;
    std::vector<std::string> addresses;
};

Launch launch(const std::string& scenario, int world, std::chrono::seconds deadline = std::chrono::seconds(60),
              const Placement& placement = {}) {
    auto folder = std::make_unique<const ScratchFolder>(fs::temp_directory_path() /
                                                        ("remat-ddp-" + std::to_string(::getpid()) + "-" + scenario));
    const fs::path& dir = folder->path();
    rt::distributed::LocalLaunchOptions options;
    options.environment = {"REMAT_DDP_SCENARIO=" + scenario, "REMAT_DDP_DIR=" + dir.string(), "OMP_NUM_THREADS=1"};
    options.log_folder = dir;
    options.deadline = deadline;
    std::string program = self_path();
    std::vector<std::string> arguments = {"[ddp-worker]"};
    if (!placement.namespaces.empty()) {
        std::string addresses;
        for (const std::string& a : placement.addresses) addresses += (addresses.empty() ? "" : ",") + a;
        options.environment.push_back("REMAT_DDP_ADDRESSES=" + addresses);
        options.master_address = placement.addresses.at(0);
        // A shell picks rank $RANK's namespace (the namespaces are named <prefix>$RANK).
        const std::string prefix = placement.namespaces[0].substr(0, placement.namespaces[0].size() - 1);
        arguments = {"-c", "exec ip netns exec " + prefix + "$RANK \"$0\" \"[ddp-worker]\"", program};
        program = "/bin/sh";
    }
    const rt::distributed::LocalJob job = rt::distributed::launch_local(program, arguments, world, options);
    Launch result;
    result.timed_out = job.timed_out;
    result.seconds = job.seconds;
    result.ranks.resize(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
        RankOutcome& out = result.ranks[static_cast<std::size_t>(r)];
        out.exit_code = job.exit_codes[static_cast<std::size_t>(r)];
        std::ifstream facts(dir / ("rank" + std::to_string(r) + ".txt"));
        for (std::string line; std::getline(facts, line);) {
            const auto space = line.find(' ');
            out.facts[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
        }
        std::ifstream log(dir / ("rank" + std::to_string(r) + ".log"));
        out.log.assign(std::istreambuf_iterator<char>(log), {});
    }
    result.folder = std::move(folder);
    return result;
}

std::vector<at::Tensor> load_parameters(const Launch& launched, int rank) {
    std::vector<at::Tensor> parameters;
    torch::load(parameters, (launched.folder->path() / ("rank" + std::to_string(rank) + ".pt")).string());
    return parameters;
}

void show(const Launch& l) {
    for (std::size_t r = 0; r < l.ranks.size(); ++r)
        UNSCOPED_INFO("rank " << r << " exit " << l.ranks[r].exit_code << ", log:\n" << l.ranks[r].log);
}

// Plain autograd on the whole batch, from rank 0's initial parameters: what data-parallel
// training must equal (up to the order of float additions).
std::vector<at::Tensor> single_process_training(int world) {
    auto model = make_model(1);
    const auto [x, y] = global_batch(world);
    torch::optim::SGD optimizer(model->parameters(), kLearningRate);
    for (int step = 0; step < kSteps; ++step) {
        optimizer.zero_grad();
        torch::mse_loss(model->forward(x), y).backward();
        optimizer.step();
    }
    return copies(model->parameters());
}

}  // namespace

// ------------------------------------------------------------------ one rank

TEST_CASE("data-parallel worker: one rank of a launched job", "[.][ddp-worker]") {
    const rt::distributed::LaunchEnvironment where = rt::distributed::LaunchEnvironment::from_environment();
    const std::string scenario = env("REMAT_DDP_SCENARIO");
    const fs::path dir = env("REMAT_DDP_DIR");
    REQUIRE(!dir.empty());
    std::ofstream facts(dir / ("rank" + std::to_string(where.rank) + ".txt"));
    const auto say = [&](const std::string& key, const std::string& value) { facts << key << ' ' << value << std::endl; };
    torch::set_num_threads(1);

    // The replicas start different: DataParallel makes them rank 0's.
    auto model = make_model(1 + static_cast<std::uint64_t>(where.rank));
    auto fault = std::make_shared<std::atomic<int>>(Fault::none);
    rt::StageList stages = rt::stages_of(model);
    stages.insert(stages.begin() + 3, rt::make_stage("fault", [fault](const at::Tensor& x) {
                      if (fault->load() == Fault::throw_error) throw std::runtime_error("injected fault in stage 'fault'");
                      if (fault->load() == Fault::die) std::_Exit(3);
                      return x;
                  }));
    const auto [x, y] = global_batch(where.world_size);
    const at::Tensor local_x = x.narrow(0, where.rank * kRankBatch, kRankBatch);
    const at::Tensor local_y = y.narrow(0, where.rank * kRankBatch, kRankBatch);

    // "mismatch": rank 1 plans at another budget; "cannot-run": rank 0 plans store-all, which
    // rank 1's budget does not hold.
    const double percent = scenario == "mismatch" && where.rank == 1   ? 75.0
                           : scenario == "cannot-run" && where.rank == 0 ? 100.0
                                                                          : 40.0;
    rt::CheckpointOptions checkpoint_options;
    checkpoint_options.progress = [](const std::string&) {};
    auto module = rt::checkpoint(stages, local_x, rt::budget_percent(percent).or_smallest(), remat::Rotor{},
                                 checkpoint_options);
    rt::distributed::GroupOptions group_options;
    group_options.timeout = std::chrono::seconds(10);
    // On separate hosts (REMAT_DDP_ADDRESSES: each rank's own address), the rendezvous is over
    // TCP at MASTER_ADDR; on one machine, through a file.
    rt::distributed::StorePtr store;
    if (const std::string addresses = env("REMAT_DDP_ADDRESSES"); !addresses.empty()) {
        std::istringstream list(addresses);
        for (int r = 0; r <= where.rank; ++r) std::getline(list, group_options.address, ',');
        store = rt::distributed::tcp_rendezvous(where, group_options.timeout);
    } else {
        store = rt::distributed::file_rendezvous((dir / "store").string(), where.world_size);
    }
    const auto group = rt::distributed::make_gloo_group(store, where.rank, where.world_size, group_options);
    {
        struct sigaction sigpipe {};
        ::sigaction(SIGPIPE, nullptr, &sigpipe);
        say("sigpipe", sigpipe.sa_handler == SIG_IGN ? "ignored" : "default");
    }
    rt::DataParallelOptions options;
    options.bucket_bytes = 8 * 1024;
    options.overlap = scenario != "no-overlap";
    options.share_plan = scenario != "mismatch";
    std::unique_ptr<rt::DataParallel<rt::Checkpointed<remat::Rotor>>> ddp;
    try {
        ddp = std::make_unique<rt::DataParallel<rt::Checkpointed<remat::Rotor>>>(module, group, options);
    } catch (const std::exception& e) {
        say("error", e.what());
        FAIL("rank " << where.rank << " stops: " << e.what());  // the process exits with an error
    }
    say("fingerprint", std::to_string(ddp->plan_fingerprint()));
    say("budget", std::to_string(ddp->module()->budget()));
    torch::optim::SGD optimizer(ddp->parameters(), kLearningRate);
    for (int step = 1; step <= kSteps; ++step) {
        if (step == 2 && where.rank == 1 && scenario == "throw") fault->store(Fault::throw_error);
        if (step == 2 && where.rank == 1 && scenario == "die") fault->store(Fault::die);
        const std::vector<at::Tensor> before = copies(ddp->parameters());
        optimizer.zero_grad();
        try {
            // The output is not kept past the loss (autograd's loss node keeps it until it runs).
            const at::Tensor loss = torch::mse_loss(ddp->forward(local_x), local_y);
            loss.backward();
        } catch (const std::exception& e) {
            say("error", e.what());
            bool untouched = all_equal(before, copies(ddp->parameters()));
            for (const at::Tensor& p : ddp->parameters())
                untouched = untouched && (!p.grad().defined() || torch::count_nonzero(p.grad()).item<std::int64_t>() == 0);
            say("unchanged", untouched ? "1" : "0");
            FAIL("rank " << where.rank << " stops: " << e.what());  // the process exits with an error
        }
        optimizer.step();
        const remat::StepReport& report = ddp->module()->last_report();
        say("peak" + std::to_string(step),
            std::to_string(report.predicted_peak) + " " + std::to_string(report.measured_peak));
        say("collectives" + std::to_string(step), std::to_string(ddp->last_reduction().collectives) + " " +
                                                      std::to_string(ddp->last_reduction().buckets_started_early));
    }
    std::vector<at::Tensor> parameters = copies(ddp->parameters());
    torch::save(parameters, (dir / ("rank" + std::to_string(where.rank) + ".pt")).string());
    say("done", "");
}

// ------------------------------------------------------------------ the tests

TEST_CASE("data-parallel: two ranks train bitwise alike, as one process on the whole batch, at predicted peaks",
          "[ddp]") {
    for (const std::string scenario : {"train", "no-overlap"}) {
        const Launch l = launch(scenario, 2);
        show(l);
        INFO("scenario " << scenario);
        REQUIRE_FALSE(l.timed_out);
        REQUIRE(l.ranks[0].exit_code == 0);
        REQUIRE(l.ranks[1].exit_code == 0);
        REQUIRE(l.ranks[0].facts.count("done") == 1);
        REQUIRE(l.ranks[1].facts.count("done") == 1);
        CHECK(l.ranks[0].facts.at("fingerprint") == l.ranks[1].facts.at("fingerprint"));
        for (int step = 1; step <= kSteps; ++step)
            for (const RankOutcome& rank : l.ranks) {
                std::istringstream peaks(rank.facts.at("peak" + std::to_string(step)));
                remat::Bytes predicted = 0, measured = 0;
                peaks >> predicted >> measured;
                INFO("step " << step << ": predicted " << predicted << ", measured " << measured);
                CHECK(measured == predicted);
                std::istringstream counts(rank.facts.at("collectives" + std::to_string(step)));
                std::size_t collectives = 0, early = 0;
                counts >> collectives >> early;
                CHECK(collectives == 12);  // 6 Linear layers, weight and bias each
                if (scenario == "train") CHECK(early > 0);
                if (scenario == "no-overlap") CHECK(early == 0);
            }
        const std::vector<at::Tensor> p0 = load_parameters(l, 0), p1 = load_parameters(l, 1);
        CHECK(all_equal(p0, p1));
        const std::vector<at::Tensor> reference = single_process_training(2);
        REQUIRE(reference.size() == p0.size());
        double largest = 0.0;
        for (std::size_t i = 0; i < p0.size(); ++i)
            largest = std::max(largest, (p0[i] - reference[i]).abs().max().item<double>());
        WARN(scenario << ": largest difference from one process on the whole batch after " << kSteps
                      << " steps: " << largest);
        CHECK(largest < 1e-5);
    }
}

TEST_CASE("data-parallel: a rank that throws fails every rank's step, and no parameter changes", "[ddp]") {
    const Launch l = launch("throw", 2, std::chrono::seconds(45));
    show(l);
    REQUIRE_FALSE(l.timed_out);
    for (const RankOutcome& rank : l.ranks) {
        REQUIRE(rank.exit_code != 0);  // each process exits with an error
        REQUIRE(rank.facts.count("error") == 1);
        CHECK(rank.facts.at("unchanged") == "1");
        CHECK(rank.facts.count("done") == 0);
    }
    CHECK(l.ranks[1].facts.at("error").find("injected fault") != std::string::npos);
    CHECK(l.ranks[0].facts.at("error").find("all-reduce of the parameter gradients failed") != std::string::npos);
    CHECK(l.seconds < 30.0);
}

TEST_CASE("data-parallel: a peer that dies mid-step is an error on the others within the timeout", "[ddp]") {
    const Launch l = launch("die", 2, std::chrono::seconds(45));
    show(l);
    // Rank 0's end, for every assertion below (show()'s lines go with the first one only).
    INFO("rank 0 exit " << l.ranks[0].exit_code << ", log:\n" << l.ranks[0].log);
    // Gloo's writes to the dead peer raise SIGPIPE, which make_gloo_group ignores: without
    // that, rank 0 died of it now and then (exit 141) instead of failing with an error.
    CHECK(l.ranks[0].facts.at("sigpipe") == "ignored");
    REQUIRE_FALSE(l.timed_out);
    CHECK(l.ranks[1].exit_code == 3);
    REQUIRE(l.ranks[0].exit_code != 0);
    REQUIRE(l.ranks[0].facts.count("error") == 1);
    CHECK(l.ranks[0].facts.at("unchanged") == "1");
    CHECK(l.seconds < 30.0);
}

TEST_CASE("data-parallel: plans that differ are refused before the first step", "[ddp]") {
    const Launch l = launch("mismatch", 2, std::chrono::seconds(45));
    show(l);
    REQUIRE_FALSE(l.timed_out);
    for (const RankOutcome& rank : l.ranks) {
        REQUIRE(rank.exit_code != 0);
        REQUIRE(rank.facts.count("error") == 1);
        CHECK(rank.facts.at("error").find("plans differ") != std::string::npos);
        CHECK(rank.facts.count("peak1") == 0);
    }
}

TEST_CASE("data-parallel: a rank whose budget rank 0's plan exceeds fails every rank, naming it", "[ddp]") {
    const Launch l = launch("cannot-run", 2, std::chrono::seconds(45));
    show(l);
    REQUIRE_FALSE(l.timed_out);
    for (const RankOutcome& rank : l.ranks) {
        REQUIRE(rank.exit_code != 0);
        REQUIRE(rank.facts.count("error") == 1);
        CHECK(rank.facts.at("error").find("rank(s) 1 cannot run rank 0's plan") != std::string::npos);
    }
    CHECK(l.ranks[1].facts.at("error").find("above its budget") != std::string::npos);
}

namespace {

// Two hosts on this machine: network namespaces <prefix>0 and <prefix>1 joined by a veth pair,
// each end with its own address. Made by `ip` (root); removed at the end.
class TwoHosts {
public:
    TwoHosts() : prefix_("rmt" + std::to_string(::getpid() % 100000) + "n") {
        const std::string a = prefix_ + "0", b = prefix_ + "1", va = prefix_ + "a", vb = prefix_ + "b";
        const std::vector<std::string> steps = {
            "ip netns add " + a,
            "ip netns add " + b,
            "ip link add " + va + " netns " + a + " type veth peer name " + vb + " netns " + b,
            "ip -n " + a + " addr add 10.77.0.1/24 dev " + va,
            "ip -n " + b + " addr add 10.77.0.2/24 dev " + vb,
            "ip -n " + a + " link set " + va + " up",
            "ip -n " + b + " link set " + vb + " up",
            "ip -n " + a + " link set lo up",
            "ip -n " + b + " link set lo up",
        };
        for (const std::string& step : steps)
            if (std::system((step + " 2>/dev/null").c_str()) != 0) {
                why_ = "'" + step + "' failed (network namespaces need root and CAP_NET_ADMIN)";
                return;
            }
        made_ = true;
    }
    ~TwoHosts() {
        for (const char* n : {"0", "1"}) (void)std::system(("ip netns del " + prefix_ + n + " 2>/dev/null").c_str());
    }
    TwoHosts(const TwoHosts&) = delete;
    TwoHosts& operator=(const TwoHosts&) = delete;

    [[nodiscard]] bool made() const noexcept { return made_; }
    [[nodiscard]] const std::string& why() const noexcept { return why_; }
    [[nodiscard]] Placement placement() const { return {{prefix_ + "0", prefix_ + "1"}, {"10.77.0.1", "10.77.0.2"}}; }

private:
    std::string prefix_;
    bool made_ = false;
    std::string why_;
};

}  // namespace

TEST_CASE("data-parallel: two hosts, each rank in its own network namespace joined by a veth pair", "[ddp][netns]") {
    const TwoHosts hosts;
    if (!hosts.made()) {
        WARN("skipped: no network namespaces here: " << hosts.why());
        return;
    }
    const Launch l = launch("two-hosts", 2, std::chrono::seconds(60), hosts.placement());
    show(l);
    REQUIRE_FALSE(l.timed_out);
    for (const RankOutcome& rank : l.ranks) {
        REQUIRE(rank.exit_code == 0);
        REQUIRE(rank.facts.count("done") == 1);
    }
    CHECK(l.ranks[0].facts.at("fingerprint") == l.ranks[1].facts.at("fingerprint"));
    const std::vector<at::Tensor> p0 = load_parameters(l, 0), p1 = load_parameters(l, 1);
    CHECK(all_equal(p0, p1));
    const std::vector<at::Tensor> reference = single_process_training(2);
    double largest = 0.0;
    for (std::size_t i = 0; i < p0.size(); ++i)
        largest = std::max(largest, (p0[i] - reference[i]).abs().max().item<double>());
    CHECK(largest < 1e-5);
}
