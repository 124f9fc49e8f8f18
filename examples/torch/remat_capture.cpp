// remat-capture — captures a model into an op-level remat.problem/1 problem, profiled on this
// machine, so that every solver (remat-plan --solver ...) can study it.
//
//   remat-capture MODEL.pt2 --input-shape 8x3x32x32 [--input-shape ...] --out problem.json
//   remat-capture MODEL.pt --input-shape 8x3x32x32 [--input-shape ...] --out problem.json
//   remat-capture --example gpt|resnet [--layers N] [--batch N] --out problem.json
//
// MODEL.pt2 is a torch.export program (torch.export.export, then torch.export.save; see
// docs/guide.md, "Capturing a torch.export program"), captured in the mode it was exported in.
// MODEL.pt is a TorchScript module saved from Python (torch.jit.script or torch.jit.trace, then
// .save(); see examples/export_from_python.md) or from C++, captured in training mode unless
// --eval is given. Each --input-shape adds one random input (--input-dtype
// float|double|long|int; integer inputs are drawn in [0, --int-high)). Exit codes: 0 success,
// 2 invalid input (bad option, unsupported construct), 1 other errors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <remat/io/budget.hpp>
#include <remat/io/json.hpp>
#include <remat/solvers/store_all.hpp>
#include <remat/torch/exported.hpp>
#include <remat/torch/script.hpp>

#include "models.hpp"

namespace {

struct Options {
    std::string model;
    std::string example;
    std::vector<std::vector<std::int64_t>> shapes;
    std::vector<std::string> dtypes;
    std::int64_t int_high = 2;
    std::string out;
    std::string name;
    std::size_t repeats = 5;
    std::optional<double> time_limit;
    bool eval = false;
    bool verbose = false;
    bool quiet = false;
    int threads = 1;
    std::uint64_t seed = 0;
    std::int64_t layers = 12;
    std::int64_t batch = 0;
};

constexpr const char* usage_text =
    "usage: remat-capture MODEL.pt2|MODEL.pt --input-shape DxDx... [--input-shape ...]\n"
    "                     [--input-dtype float|double|long|int]\n"
    "                     [--int-high N] --out FILE [--name NAME] [--repeats N] [--time-limit S] [--eval]\n"
    "                     [--threads N] [--seed N] [--verbose|--quiet]\n"
    "       remat-capture --example gpt|resnet [--layers N] [--batch N] --out FILE [same options]\n"
    "Captures the model's forward on random inputs of the given shapes into a remat.problem/1 problem,\n"
    "profiled on this machine (times in seconds, sizes in bytes), and writes it to FILE. It prints one line\n"
    "per phase on stderr (--quiet: none; --verbose: also one per op, and the table of ops).\n";

[[noreturn]] void bad(const std::string& why) { throw remat::InvalidInput(why + "\n" + usage_text); }

std::vector<std::int64_t> parse_shape(const std::string& text) {
    std::vector<std::int64_t> shape;
    std::stringstream in(text);
    std::string part;
    while (std::getline(in, part, 'x')) {
        char* end = nullptr;
        const long long v = std::strtoll(part.c_str(), &end, 10);
        if (part.empty() || end == nullptr || *end != '\0' || v <= 0)
            bad("--input-shape '" + text + "': expected positive sizes separated by 'x', such as 8x3x32x32");
        shape.push_back(v);
    }
    if (shape.empty()) bad("--input-shape is empty");
    return shape;
}

template <class T>
T parse_number(const std::string& option, const std::string& text) {
    std::stringstream in(text);
    T v{};
    if (!(in >> v) || !in.eof()) bad(option + " '" + text + "' is not a number");
    return v;
}

Options parse(int argc, char** argv) {
    Options o;
    const auto value = [&](int& i) -> std::string {
        if (i + 1 >= argc) bad(std::string(argv[i]) + " needs a value");
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << usage_text;
            std::exit(0);
        } else if (a == "--input-shape") {
            o.shapes.push_back(parse_shape(value(i)));
        } else if (a == "--input-dtype") {
            o.dtypes.push_back(value(i));
        } else if (a == "--int-high") {
            o.int_high = parse_number<std::int64_t>(a, value(i));
        } else if (a == "--out") {
            o.out = value(i);
        } else if (a == "--name") {
            o.name = value(i);
        } else if (a == "--repeats") {
            o.repeats = parse_number<std::size_t>(a, value(i));
        } else if (a == "--time-limit") {
            o.time_limit = parse_number<double>(a, value(i));
        } else if (a == "--eval") {
            o.eval = true;
        } else if (a == "--verbose") {
            o.verbose = true;
        } else if (a == "--quiet") {
            o.quiet = true;
        } else if (a == "--threads") {
            o.threads = parse_number<int>(a, value(i));
        } else if (a == "--seed") {
            o.seed = parse_number<std::uint64_t>(a, value(i));
        } else if (a == "--example") {
            o.example = value(i);
        } else if (a == "--layers") {
            o.layers = parse_number<std::int64_t>(a, value(i));
        } else if (a == "--batch") {
            o.batch = parse_number<std::int64_t>(a, value(i));
        } else if (!a.empty() && a[0] == '-') {
            bad("unknown option '" + a + "'");
        } else if (o.model.empty()) {
            o.model = a;
        } else {
            bad("more than one model file ('" + o.model + "', '" + a + "')");
        }
    }
    if (o.out.empty()) bad("--out FILE is required");
    if (o.model.empty() == o.example.empty()) bad("give either a MODEL.pt file or --example gpt|resnet");
    if (!o.example.empty() && o.example != "gpt" && o.example != "resnet")
        bad("--example must be gpt or resnet, not '" + o.example + "'");
    if (!o.model.empty() && o.shapes.empty()) bad("give the shape of every input with --input-shape");
    if (o.dtypes.size() > o.shapes.size()) bad("more --input-dtype than --input-shape");
    if (o.repeats == 0) bad("--repeats must be at least 1");
    if (o.threads < 1) bad("--threads must be at least 1");
    if (o.int_high < 1) bad("--int-high must be at least 1");
    return o;
}

at::ScalarType dtype_of(const std::string& name) {
    if (name == "float" || name == "float32") return at::kFloat;
    if (name == "double" || name == "float64") return at::kDouble;
    if (name == "long" || name == "int64") return at::kLong;
    if (name == "int" || name == "int32") return at::kInt;
    bad("--input-dtype '" + name + "': expected float, double, long or int");
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse(argc, argv);
        at::set_num_threads(o.threads);
        const remat::torch::CpuMemoryProbe probe;  // before the model, so that everything is seen
        at::manual_seed(o.seed);
        torch::jit::Module module;
        std::vector<at::Tensor> inputs;
        std::string name = o.name;
        if (o.example == "gpt") {
            remat_examples::GptConfig c;
            c.layers = o.layers;
            c.embed = 128;
            c.heads = 4;
            c.vocab = 1024;
            c.block_size = 128;
            module = remat_examples::make_gpt(c);
            inputs.push_back(at::randint(0, c.vocab, {o.batch > 0 ? o.batch : 8, c.block_size}));
            if (name.empty()) name = "gpt-" + std::to_string(o.layers);
        } else if (o.example == "resnet") {
            remat_examples::ResNetConfig c;
            c.blocks_per_stage = std::max<std::int64_t>(1, o.layers / 3);
            module = remat_examples::make_resnet(c);
            inputs.push_back(at::randn({o.batch > 0 ? o.batch : 16, c.in_channels, 32, 32}));
            if (name.empty()) name = "resnet-" + std::to_string(c.blocks_per_stage * c.stages);
        } else {
            if (o.model.ends_with(".pt2")) {
                module = remat::torch::load_exported(o.model);
                if (o.eval && remat::torch::exported_training_mode(module) == std::optional<bool>(true))
                    throw remat::InvalidInput("'" + o.model + "' was exported in train mode; --eval needs a program "
                                              "exported after model.eval()");
            } else {
                try {
                    module = torch::jit::load(o.model);
                } catch (const std::exception& e) {
                    throw remat::InvalidInput("cannot load '" + o.model +
                                              "' as a TorchScript module: " + remat::torch::error_message(e));
                }
            }
            for (std::size_t i = 0; i < o.shapes.size(); ++i) {
                const at::ScalarType dtype = i < o.dtypes.size() ? dtype_of(o.dtypes[i]) : at::kFloat;
                inputs.push_back(at::isIntegralType(dtype, false)
                                     ? at::randint(0, o.int_high, o.shapes[i], at::TensorOptions().dtype(dtype))
                                     : at::randn(o.shapes[i], at::TensorOptions().dtype(dtype)));
            }
            if (name.empty()) {
                name = o.model;
                if (const auto slash = name.find_last_of('/'); slash != std::string::npos) name = name.substr(slash + 1);
                if (const auto dot = name.rfind('.'); dot != std::string::npos && dot > 0) name = name.substr(0, dot);
            }
        }
        if (!remat::torch::exported_training_mode(module)) module.train(!o.eval);
        remat::torch::CaptureOptions options;
        options.name = name;
        options.repeats = o.repeats;
        options.time_limit_seconds = o.time_limit;
        const auto to_stderr = [](const std::string& line) { std::cerr << line << '\n'; };
        if (!o.quiet) options.progress = to_stderr;
        if (o.verbose) options.op_progress = to_stderr;
        const remat::torch::ScriptCapture capture = remat::torch::capture_script(module, inputs, options);
        std::ofstream out(o.out);
        if (!out) throw remat::InvalidInput("cannot write '" + o.out + "'");
        out << remat::io::to_json(capture.problem());
        if (!out) throw remat::InvalidInput("error while writing '" + o.out + "'");
        const remat::Plan reference = remat::StoreAll{}.solve(capture.problem(), remat::Bytes{1} << 62);
        if (o.verbose) std::cerr << capture.summary();
        std::cout << "captured '" << name << "': " << capture.ops().size() << " op groups, "
                  << capture.problem().op_count() << " ops, " << capture.problem().data_count()
                  << " data; store-all peak " << remat::format_bytes(reference.peak) << ", step "
                  << reference.time * 1e3 << " ms; capture took " << capture.seconds() << " s; wrote " << o.out << "\n";
        return 0;
    } catch (const remat::InvalidInput& e) {
        std::cerr << "remat-capture: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "remat-capture: " << remat::torch::error_message(e) << "\n";
        return 1;
    }
}
