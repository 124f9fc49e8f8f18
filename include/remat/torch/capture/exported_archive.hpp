// remat/torch/capture/exported_archive.hpp — reading a torch.export archive (.pt2): the
// serialized ExportedProgram and its weights and constants, as tensors.
//
// torch.export.save (PyTorch 2.8 and later) writes a zip with one root folder holding
// `archive_format` ("pt2"), `models/<name>.json` (the program, schema
// torch/_export/serde/schema.py), `data/weights/` and `data/constants/` (raw storage bytes,
// described by `<name>_weights_config.json` and `<name>_constants_config.json`: file, tensor
// metadata, whether a parameter). docs/guide.md, "Capturing a torch.export program", says what
// remat reads. LibTorch's PyTorchStreamReader opens the zip; nlohmann-json reads the JSON.
// The major version of the schema changes only on breaking changes: remat reads major 8 and
// refuses another one by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include "../../core/errors.hpp"
#include "../detail/compat.hpp"

namespace remat::torch::detail::exported {

using Json = nlohmann::json;

/// The schema major version of torch.export's serialized programs that remat reads.
inline constexpr std::int64_t supported_schema_major = 8;

/// dtype of torch.export's schema (ScalarType, which numbers dtypes its own way).
[[nodiscard]] inline c10::ScalarType dtype_of(std::int64_t code, const std::string& what) {
    switch (code) {
        case 1: return c10::ScalarType::Byte;
        case 2: return c10::ScalarType::Char;
        case 3: return c10::ScalarType::Short;
        case 4: return c10::ScalarType::Int;
        case 5: return c10::ScalarType::Long;
        case 6: return c10::ScalarType::Half;
        case 7: return c10::ScalarType::Float;
        case 8: return c10::ScalarType::Double;
        case 9: return c10::ScalarType::ComplexHalf;
        case 10: return c10::ScalarType::ComplexFloat;
        case 11: return c10::ScalarType::ComplexDouble;
        case 12: return c10::ScalarType::Bool;
        case 13: return c10::ScalarType::BFloat16;
        default: break;
    }
    if (const auto later = compat::export_only_dtype(code)) return *later;
    throw InvalidInput(what + " has dtype number " + std::to_string(code) +
                       ", which this LibTorch does not know (torch.export's ScalarType)");
}

/// Layout of torch.export's schema; only strided tensors are read.
[[nodiscard]] inline c10::Layout layout_of(std::int64_t code, const std::string& what) {
    switch (code) {
        case 7: return c10::Layout::Strided;
        case 1: return c10::Layout::Sparse;
        case 2: return c10::Layout::SparseCsr;
        default: throw InvalidInput(what + " has layout number " + std::to_string(code) + ", which remat does not read");
    }
}

/// Memory format of torch.export's schema.
[[nodiscard]] inline c10::MemoryFormat memory_format_of(std::int64_t code, const std::string& what) {
    switch (code) {
        case 1: return c10::MemoryFormat::Contiguous;
        case 2: return c10::MemoryFormat::ChannelsLast;
        case 3: return c10::MemoryFormat::ChannelsLast3d;
        case 4: return c10::MemoryFormat::Preserve;
        default: throw InvalidInput(what + " has memory format number " + std::to_string(code) + ", unknown to remat");
    }
}

/// A device of the schema: {"type": "cuda", "index": 0}.
[[nodiscard]] inline c10::Device device_of(const Json& device) {
    std::string text = device.at("type").get<std::string>();
    if (device.contains("index") && !device.at("index").is_null())
        text += ":" + std::to_string(device.at("index").get<std::int64_t>());
    return c10::Device(text);
}

/// An integer of the schema that must be concrete ({"as_int": 4}); `what` names it.
[[nodiscard]] inline std::int64_t concrete_int(const Json& sym_int, const std::string& what) {
    if (sym_int.is_number_integer()) return sym_int.get<std::int64_t>();
    if (sym_int.contains("as_int")) return sym_int.at("as_int").get<std::int64_t>();
    throw InvalidInput(what + " has a symbolic size; export the weights with concrete shapes");
}

/// A whole archive in memory: the program's JSON, and every weight and constant by its
/// qualified name ("encoder.0.weight", "lifted_tensor_0") on the CPU.
struct Archive {
    std::string file;
    std::string model;  ///< the name of the program in the archive ("model")
    Json program;
    std::map<std::string, at::Tensor> weights;
    std::map<std::string, bool> weight_is_parameter;
    std::map<std::string, at::Tensor> constants;
};

class ArchiveReader {
public:
    ArchiveReader(std::filesystem::path file, std::string model) : file_(std::move(file)), model_(std::move(model)) {}

    [[nodiscard]] Archive read() {
        const std::string who = "'" + file_.string() + "'";
        if (!std::filesystem::exists(file_)) throw InvalidInput(who + " does not exist");
        try {
            reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(file_.string());
        } catch (const std::exception& e) {
            throw InvalidInput(who + " is not a readable .pt2 archive (a zip written by torch.export.save): " +
                               first_line(e.what()));
        }
        Archive archive;
        archive.file = file_.string();
        check_format(who);
        archive.model = model_name(who);
        archive.program = json_record("models/" + archive.model + ".json", who);
        check_schema(archive.program, who);
        tensors("data/weights/", archive.model + "_weights_config.json", who, archive.weights,
                &archive.weight_is_parameter);
        tensors("data/constants/", archive.model + "_constants_config.json", who, archive.constants, nullptr);
        return archive;
    }

private:
    [[nodiscard]] static std::string first_line(const std::string& text) {
        const auto end = text.find('\n');
        return end == std::string::npos ? text : text.substr(0, end);
    }

    [[nodiscard]] std::string record(const std::string& name, const std::string& who) const {
        if (!reader_->hasRecord(name)) throw InvalidInput(who + " has no '" + name + "': not a torch.export archive");
        try {
            const auto [data, size] = reader_->getRecord(name);
            return std::string(static_cast<const char*>(data.get()), size);
        } catch (const std::exception& e) {
            throw InvalidInput(who + ": '" + name + "' cannot be read (a truncated or damaged archive?): " +
                               first_line(e.what()));
        }
    }

    [[nodiscard]] Json json_record(const std::string& name, const std::string& who) const {
        const std::string text = record(name, who);
        try {
            return Json::parse(text);
        } catch (const Json::exception& e) {
            throw InvalidInput(who + ": '" + name + "' is not valid JSON: " + e.what());
        }
    }

    void check_format(const std::string& who) const {
        std::string format = record("archive_format", who);
        while (!format.empty() && (format.back() == '\n' || format.back() == ' ')) format.pop_back();
        if (format != "pt2")
            throw InvalidInput(who + " is an archive of format '" + format + "', not 'pt2' (torch.export.save)");
    }

    // The program's name: the one asked for, or the archive's only one.
    [[nodiscard]] std::string model_name(const std::string& who) const {
        std::vector<std::string> models;
        for (const std::string& name : reader_->getAllRecords()) {
            const std::string prefix = "models/", suffix = ".json";
            if (name.size() > prefix.size() + suffix.size() && name.starts_with(prefix) && name.ends_with(suffix) &&
                name.find('/', prefix.size()) == std::string::npos)
                models.push_back(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
        }
        if (!model_.empty()) {
            for (const std::string& m : models)
                if (m == model_) return m;
            throw InvalidInput(who + " has no program named '" + model_ + "'");
        }
        if (models.empty()) throw InvalidInput(who + " holds no program (no models/*.json)");
        if (models.size() > 1) {
            std::string list;
            for (const std::string& m : models) list += (list.empty() ? "'" : ", '") + m + "'";
            throw InvalidInput(who + " holds several programs (" + list + "); name the one to read");
        }
        return models.front();
    }

    static void check_schema(const Json& program, const std::string& who) {
        if (!program.contains("schema_version") || !program.at("schema_version").contains("major"))
            throw InvalidInput(who + ": the program has no schema_version; it was not written by torch.export.save");
        const auto major = program.at("schema_version").at("major").get<std::int64_t>();
        if (major != supported_schema_major) {
            std::string by = program.contains("torch_version") ? " (written by torch " +
                                                                   program.at("torch_version").get<std::string>() + ")"
                                                             : "";
            throw InvalidInput(who + ": the program's schema is version " + std::to_string(major) + by +
                               "; remat reads major version " + std::to_string(supported_schema_major) +
                               " (PyTorch 2.8 to 2.11); export it again with such a PyTorch");
        }
        if (!program.contains("graph_module"))
            throw InvalidInput(who + ": the program has no graph_module");
    }

    // The tensors a config file describes, several names sharing one storage where they share
    // its file, and one tensor where their metadata are the same too (tied weights).
    void tensors(const std::string& folder, const std::string& config_name, const std::string& who,
                 std::map<std::string, at::Tensor>& out, std::map<std::string, bool>* is_parameter) const {
        const std::string config_path = folder + config_name;
        if (!reader_->hasRecord(config_path)) return;
        const Json config = json_record(config_path, who);
        if (!config.contains("config")) return;
        std::map<std::string, at::Storage> storages;
        std::map<std::string, at::Tensor> by_file_and_meta;
        for (const auto& [name, entry] : config.at("config").items()) {
            const std::string what = who + ": tensor '" + name + "'";
            if (entry.value("use_pickle", false))
                throw InvalidInput(what + " is pickled (a tensor subclass or a non-tensor constant); remat reads plain tensors");
            const std::string file = entry.at("path_name").get<std::string>();
            const Json& meta = entry.at("tensor_meta");
            const std::string key = file + "|" + meta.dump();
            if (const auto same = by_file_and_meta.find(key); same != by_file_and_meta.end()) {
                out[name] = same->second;
            } else {
                auto storage = storages.find(file);
                if (storage == storages.end()) storage = storages.emplace(file, storage_of(folder + file, who)).first;
                at::Tensor t = tensor_on(storage->second, meta, what);
                by_file_and_meta.emplace(key, t);
                out[name] = t;
            }
            if (is_parameter != nullptr) (*is_parameter)[name] = entry.value("is_param", false);
        }
    }

    [[nodiscard]] at::Storage storage_of(const std::string& record_name, const std::string& who) const {
        const std::string bytes = record(record_name, who);
        at::Tensor holder = at::empty({static_cast<std::int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
        if (!bytes.empty()) std::memcpy(holder.data_ptr(), bytes.data(), bytes.size());
        return holder.storage();
    }

    [[nodiscard]] static at::Tensor tensor_on(const at::Storage& storage, const Json& meta, const std::string& what) {
        const c10::ScalarType dtype = dtype_of(meta.at("dtype").get<std::int64_t>(), what);
        if (layout_of(meta.value("layout", 7), what) != c10::Layout::Strided)
            throw InvalidInput(what + " is sparse; remat reads strided tensors");
        std::vector<std::int64_t> sizes, strides;
        for (const Json& s : meta.at("sizes")) sizes.push_back(concrete_int(s, what));
        for (const Json& s : meta.at("strides")) strides.push_back(concrete_int(s, what));
        const std::int64_t offset = meta.contains("storage_offset") ? concrete_int(meta.at("storage_offset"), what) : 0;
        std::int64_t extent = sizes.empty() ? 1 : 0;
        if (!sizes.empty()) {
            bool empty = false;
            for (std::size_t d = 0; d < sizes.size(); ++d) {
                empty = empty || sizes[d] == 0;
                extent += (sizes[d] - 1) * strides[d];
            }
            extent = empty ? 0 : extent + 1;
        }
        const auto needed = static_cast<std::size_t>((offset + extent) * static_cast<std::int64_t>(c10::elementSize(dtype)));
        if (extent > 0 && needed > storage.nbytes())
            throw InvalidInput(what + " needs " + std::to_string(needed) + " bytes but its file has " +
                               std::to_string(storage.nbytes()) + " (a truncated archive?)");
        at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
        t.set_(storage, offset, sizes, strides);
        return t;
    }

    std::filesystem::path file_;
    std::string model_;
    std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
};

}  // namespace remat::torch::detail::exported
