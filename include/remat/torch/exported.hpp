// remat/torch/exported.hpp — torch.export programs (.pt2 files) trained under a memory budget:
// the .pt2 front end of capture, beside TorchScript's (script.hpp).
//
//     auto m = remat::torch::checkpoint("model.pt2", {x}, remat::budget_percent(50));
//     auto loss = criterion(m->forward({x}).toTensor(), y);
//     loss.backward();
//     optimizer.step();   // on m->parameters(): the program's own weights, updated in place
//
// A PyTorch 2.x user exports a model with torch.export.export(model, args) and
// torch.export.save(program, "model.pt2") (docs/guide.md, "Capturing a torch.export
// program"). load_exported() reads the archive (capture/exported_archive.hpp) and turns the
// program into the op-level program that capture reads (capture/exported_program.hpp): a
// module holding the program's parameters and buffers, whose forward calls the program's ATen
// operators through the dispatcher. From there everything is shared with TorchScript: capture
// (script.hpp: grouping, profiling, the problem, the replay check against plain autograd),
// planning, the executor (graph_executor.hpp), the drop-in module (script_module.hpp),
// explain() and remat-capture. Gradients come from autograd recording the dispatched forward
// ops, never from a joint graph of torch.export. Needs the json component (nlohmann-json).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include "../core/solver.hpp"
#include "../io/budget.hpp"
#include "../solvers/auto.hpp"
#include "capture/exported_archive.hpp"
#include "capture/exported_program.hpp"
#include "memory.hpp"
#include "script.hpp"
#include "script_module.hpp"

namespace remat::torch {

struct LoadExportedOptions {
    /// The program to read from an archive that holds several ("model" is torch.export.save's
    /// name); empty: the archive's only one.
    std::string program;
    /// Where the weights, buffers and constants go, with the program's device arguments that
    /// named the device it was exported on (a program exported on the CPU trained on "cuda:0");
    /// none: where they were saved. The program keeps the layouts its export saw: a view of a
    /// tensor whose layout only the other device's kernel produced fails on the example
    /// inputs, naming the node (torchvision's ViT-B/16 exported on the CPU, on a GPU); export
    /// on the device you train on.
    std::optional<c10::Device> device;
};

/// A .pt2 program as a TorchScript-free module that capture, checkpoint() and the executor
/// read like any scripted module: parameters and buffers under the program's qualified names
/// (one tensor for tied weights), forward taking the program's positional arguments, then its
/// keyword arguments in the order they were exported with. The training mode is the one the
/// program was exported in; the program cannot switch it (export again in the other mode).
/// Throws InvalidInput for an unreadable archive, an unknown schema version, an operator this
/// LibTorch lacks, or a construct no single graph holds (control flow), naming the node and its
/// Python source line.
[[nodiscard]] inline ::torch::jit::Module load_exported(const std::filesystem::path& file,
                                                        const LoadExportedOptions& options = {}) {
    const detail::exported::Archive archive = detail::exported::ArchiveReader(file, options.program).read();
    detail::exported::TranslateOptions translate;
    translate.device = options.device;
    return detail::exported::Translator(archive, translate).run();
}

/// Whether `module` came from load_exported, and then the training mode it was exported in.
[[nodiscard]] inline std::optional<bool> exported_training_mode(const ::torch::jit::Module& module) {
    if (!module.hasattr(detail::exported_mode_attribute)) return std::nullopt;
    return module.attr(detail::exported_mode_attribute).toBool();
}

/// Captures the program of a .pt2 file on example arguments, like capture_script on a
/// TorchScript module.
template <MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ScriptCapture capture_exported(const std::filesystem::path& file, const std::vector<c10::IValue>& inputs,
                                             const CaptureOptions& options = {}, Probe probe = Probe{},
                                             const LoadExportedOptions& load = {}) {
    return capture_script<Probe>(load_exported(file, load), inputs, options, std::move(probe));
}

/// Reads the program of a .pt2 file, captures it on `sample`, plans at `budget` with `solver`,
/// and returns the drop-in module (the same as checkpoint() of a TorchScript module):
/// forward() and `loss.backward()` run the plan, and m->parameters() are the program's weights.
template <Solver S = Auto, MemoryProbe Probe = CpuMemoryProbe>
[[nodiscard]] ScriptCheckpointed<S, Probe> checkpoint(const std::filesystem::path& file,
                                                      const std::vector<c10::IValue>& sample, BudgetSpec budget,
                                                      S solver = S{}, ScriptCheckpointOptions options = {},
                                                      Probe probe = Probe{}, const LoadExportedOptions& load = {}) {
    return checkpoint<S, Probe>(load_exported(file, load), sample, budget, std::move(solver), std::move(options),
                                std::move(probe));
}

}  // namespace remat::torch
