// examples/torch/models.hpp — two example models written in TorchScript inside C++
// (torch::jit::Module::define), for capture (remat/torch/script.hpp), tests and benchmarks:
//
//  - a GPT-2-like language model (Radford et al., 2019): token and position embeddings,
//    N pre-norm blocks of causal self-attention with dropout and a GELU MLP, a final layer
//    norm, and an LM head tied to the token embedding;
//  - a ResNet-like network (He et al., 2016): a convolution stem, basic residual blocks of
//    two 3×3 convolutions with batch norm (strided blocks with a projection shortcut),
//    global average pooling and a linear classifier;
//  - a U-Net (Ronneberger et al., 2015): levels of (3×3 convolution, batch norm, ReLU) down
//    with max pooling, up with transposed convolutions, skip concatenations between them;
//  - an encoder-decoder transformer (Vaswani et al., 2017): two inputs, encoder layers of
//    self-attention and MLP, decoder layers of self-attention, cross-attention over the
//    encoder's output and MLP, dropout, post-residual layer norms.
//
// Each block is a submodule with its own forward, as a Python user's nn.Module would be when
// scripted; parameters require grad, and every module has the `training` attribute that
// train()/eval() and `self.training` need.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

namespace remat_examples {

struct GptConfig {
    std::int64_t vocab = 512;
    std::int64_t block_size = 64;  // longest sequence (the causal mask's size)
    std::int64_t layers = 2;
    std::int64_t heads = 4;
    std::int64_t embed = 64;
    double dropout = 0.1;
};

struct UNetConfig {
    std::int64_t in_channels = 3;
    std::int64_t width = 8;     // channels of the top level; doubled per level down
    std::int64_t levels = 4;    // levels with a skip connection (the bottom comes below them)
    std::int64_t convs = 2;     // (conv, batch norm, ReLU) per level and side
    std::int64_t classes = 3;
};

struct EncoderDecoderConfig {
    std::int64_t d_model = 32;
    std::int64_t heads = 4;
    std::int64_t encoder_layers = 2;
    std::int64_t decoder_layers = 2;
    std::int64_t feedforward = 64;
    double dropout = 0.1;
};

struct ResNetConfig {
    std::int64_t in_channels = 3;
    std::int64_t width = 16;               // channels of the first stage; doubled at each later stage
    std::int64_t stages = 3;
    std::int64_t blocks_per_stage = 2;
    std::int64_t classes = 10;
};

namespace detail {

inline std::string number(double v) {
    std::string s = std::to_string(v);
    return s;
}

inline void add_parameter(torch::jit::Module& m, const std::string& name, at::Tensor value) {
    m.register_parameter(name, value.requires_grad_(true), /*is_buffer=*/false);
}

inline torch::jit::Module new_module(const std::string& type) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    return m;
}

inline at::Tensor normal(std::int64_t rows, std::int64_t cols, double std) {
    return at::randn({rows, cols}) * std;
}

inline torch::jit::Module gpt_block(const GptConfig& c, std::int64_t index) {
    torch::jit::Module m = new_module("GptBlock");
    const std::int64_t C = c.embed;
    const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
    add_parameter(m, "ln1_w", at::ones({C}));
    add_parameter(m, "ln1_b", at::zeros({C}));
    add_parameter(m, "attn_w", normal(3 * C, C, std));
    add_parameter(m, "attn_b", at::zeros({3 * C}));
    add_parameter(m, "proj_w", normal(C, C, proj_std));
    add_parameter(m, "proj_b", at::zeros({C}));
    add_parameter(m, "ln2_w", at::ones({C}));
    add_parameter(m, "ln2_b", at::zeros({C}));
    add_parameter(m, "fc_w", normal(4 * C, C, std));
    add_parameter(m, "fc_b", at::zeros({4 * C}));
    add_parameter(m, "fc2_w", normal(C, 4 * C, proj_std));
    add_parameter(m, "fc2_b", at::zeros({C}));
    m.register_buffer("mask", at::ones({c.block_size, c.block_size}).tril());
    (void)index;
    const std::string H = std::to_string(c.heads);
    const std::string P = number(c.dropout);
    const std::string scale = number(1.0 / std::sqrt(static_cast<double>(C / c.heads)));
    m.define(R"(
def forward(self, x):
    B = x.size(0)
    T = x.size(1)
    C = x.size(2)
    h = torch.layer_norm(x, [C], self.ln1_w, self.ln1_b, 1e-5, False)
    qkv = torch.linear(h, self.attn_w, self.attn_b)
    q, k, v = qkv.split(C, 2)
    q = q.view(B, T, )" + H + R"(, C // )" + H + R"().transpose(1, 2)
    k = k.view(B, T, )" + H + R"(, C // )" + H + R"().transpose(1, 2)
    v = v.view(B, T, )" + H + R"(, C // )" + H + R"().transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * )" + scale + R"(
    att = att.masked_fill(self.mask[:T, :T] == 0, -1e30)
    att = torch.softmax(att, -1)
    att = torch.dropout(att, )" + P + R"(, self.training)
    y = torch.matmul(att, v)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    y = torch.linear(y, self.proj_w, self.proj_b)
    x = x + torch.dropout(y, )" + P + R"(, self.training)
    h = torch.layer_norm(x, [C], self.ln2_w, self.ln2_b, 1e-5, False)
    h = torch.gelu(torch.linear(h, self.fc_w, self.fc_b))
    h = torch.linear(h, self.fc2_w, self.fc2_b)
    return x + torch.dropout(h, )" + P + R"(, self.training)
)");
    return m;
}

inline std::string conv(const std::string& input, const std::string& weight, std::int64_t stride, std::int64_t padding) {
    const std::string s = std::to_string(stride), p = std::to_string(padding);
    return "torch.conv2d(" + input + ", self." + weight + ", None, [" + s + ", " + s + "], [" + p + ", " + p +
           "], [1, 1], 1)";
}

inline std::string batch_norm(const std::string& input, const std::string& prefix) {
    return "torch.batch_norm(" + input + ", self." + prefix + "_w, self." + prefix + "_b, self." + prefix + "_mean, self." +
           prefix + "_var, self.training, 0.1, 1e-5, False)";
}

inline void add_batch_norm(torch::jit::Module& m, const std::string& prefix, std::int64_t channels) {
    add_parameter(m, prefix + "_w", at::ones({channels}));
    add_parameter(m, prefix + "_b", at::zeros({channels}));
    m.register_buffer(prefix + "_mean", at::zeros({channels}));
    m.register_buffer(prefix + "_var", at::ones({channels}));
}

inline at::Tensor conv_weight(std::int64_t out, std::int64_t in, std::int64_t k) {
    return at::randn({out, in, k, k}) * std::sqrt(2.0 / static_cast<double>(in * k * k));
}

// A k x k convolution `name` from `in` to `out` channels, and its batch norm `bn`.
inline void add_conv_bn(torch::jit::Module& m, const std::string& name, const std::string& bn, std::int64_t out,
                        std::int64_t in, std::int64_t k) {
    add_parameter(m, name, conv_weight(out, in, k));
    add_batch_norm(m, bn, out);
}

// A residual block's shortcut: x itself, or a strided 1x1 convolution with batch norm where
// the block changes the shape.
inline std::string shortcut_of(torch::jit::Module& m, std::int64_t in, std::int64_t out, std::int64_t stride) {
    if (stride == 1 && in == out) return "x";
    add_conv_bn(m, "conv_sc", "bn_sc", out, in, 1);
    return batch_norm(conv("x", "conv_sc", stride, 0), "bn_sc");
}

inline torch::jit::Module basic_block(std::int64_t in, std::int64_t out, std::int64_t stride) {
    torch::jit::Module m = new_module("BasicBlock");
    add_conv_bn(m, "conv1", "bn1", out, in, 3);
    add_conv_bn(m, "conv2", "bn2", out, out, 3);
    const std::string shortcut = shortcut_of(m, in, out, stride);
    m.define(R"(
def forward(self, x):
    out = torch.relu()" + batch_norm(conv("x", "conv1", stride, 1), "bn1") + R"()
    out = )" + batch_norm(conv("out", "conv2", 1, 1), "bn2") + R"(
    return torch.relu(out + )" + shortcut + R"()
)");
    return m;
}

// ResNet-50's bottleneck: 1x1 down to `width`, 3x3 (with the stride), 1x1 up to 4 × width.
inline torch::jit::Module bottleneck_block(std::int64_t in, std::int64_t width, std::int64_t stride) {
    const std::int64_t out = 4 * width;
    torch::jit::Module m = new_module("Bottleneck");
    add_conv_bn(m, "conv1", "bn1", width, in, 1);
    add_conv_bn(m, "conv2", "bn2", width, width, 3);
    add_conv_bn(m, "conv3", "bn3", out, width, 1);
    const std::string shortcut = shortcut_of(m, in, out, stride);
    m.define(R"(
def forward(self, x):
    out = torch.relu()" + batch_norm(conv("x", "conv1", 1, 0), "bn1") + R"()
    out = torch.relu()" + batch_norm(conv("out", "conv2", stride, 1), "bn2") + R"()
    out = )" + batch_norm(conv("out", "conv3", 1, 0), "bn3") + R"(
    return torch.relu(out + )" + shortcut + R"()
)");
    return m;
}

// (conv, batch norm, ReLU) × convs: the body of a U-Net level's forward.
inline std::string conv_stack(torch::jit::Module& m, const std::string& prefix, std::int64_t in, std::int64_t out,
                              std::int64_t convs, const std::string& input) {
    std::string body, x = input;
    for (std::int64_t c = 0; c < convs; ++c) {
        std::string name = prefix;
        name += std::to_string(c);
        add_parameter(m, name + "_conv", conv_weight(out, c == 0 ? in : out, 3));
        add_batch_norm(m, name + "_bn", out);
        body += "    x = torch.relu(" + batch_norm(conv(x, name + "_conv", 1, 1), name + "_bn") + ")\n";
        x = "x";
    }
    return body;
}

// Multi-head attention of queries from `q` over keys and values from `kv`, with the output
// projection; the caller adds the residual and the norm.
inline std::string attention(torch::jit::Module& m, const std::string& p, const EncoderDecoderConfig& c,
                             const std::string& q, const std::string& kv) {
    const std::int64_t d = c.d_model;
    const double std = 1.0 / std::sqrt(static_cast<double>(d));
    for (const char* w : {"_q", "_k", "_v", "_o"}) {
        add_parameter(m, p + w + "_w", normal(d, d, std));
        add_parameter(m, p + w + "_b", at::zeros({d}));
    }
    const std::string H = std::to_string(c.heads), P = number(c.dropout);
    const std::string scale = number(1.0 / std::sqrt(static_cast<double>(d / c.heads)));
    const auto lin = [&](const std::string& in, const std::string& w) {
        return "torch.linear(" + in + ", self." + p + w + "_w, self." + p + w + "_b)";
    };
    return "    B = " + q + ".size(0)\n"
           "    Tq = " + q + ".size(1)\n"
           "    Tk = " + kv + ".size(1)\n"
           "    qh = " + lin(q, "_q") + ".view(B, Tq, " + H + ", " + std::to_string(d / c.heads) + ").transpose(1, 2)\n"
           "    kh = " + lin(kv, "_k") + ".view(B, Tk, " + H + ", " + std::to_string(d / c.heads) + ").transpose(1, 2)\n"
           "    vh = " + lin(kv, "_v") + ".view(B, Tk, " + H + ", " + std::to_string(d / c.heads) + ").transpose(1, 2)\n"
           "    att = torch.softmax(torch.matmul(qh, kh.transpose(-2, -1)) * " + scale + ", -1)\n"
           "    att = torch.dropout(att, " + P + ", self.training)\n"
           "    y = torch.matmul(att, vh).transpose(1, 2).contiguous().view(B, Tq, " + std::to_string(d) + ")\n"
           "    y = torch.dropout(" + lin("y", "_o") + ", " + P + ", self.training)\n";
}

inline std::string layer_norm(torch::jit::Module& m, const std::string& name, std::int64_t d, const std::string& x) {
    add_parameter(m, name + "_w", at::ones({d}));
    add_parameter(m, name + "_b", at::zeros({d}));
    return "torch.layer_norm(" + x + ", [" + std::to_string(d) + "], self." + name + "_w, self." + name + "_b, 1e-5, False)";
}

inline std::string feedforward(torch::jit::Module& m, const std::string& p, const EncoderDecoderConfig& c,
                               const std::string& x) {
    add_parameter(m, p + "_fc1_w", normal(c.feedforward, c.d_model, 1.0 / std::sqrt(static_cast<double>(c.d_model))));
    add_parameter(m, p + "_fc1_b", at::zeros({c.feedforward}));
    add_parameter(m, p + "_fc2_w", normal(c.d_model, c.feedforward, 1.0 / std::sqrt(static_cast<double>(c.feedforward))));
    add_parameter(m, p + "_fc2_b", at::zeros({c.d_model}));
    return "    h = torch.relu(torch.linear(" + x + ", self." + p + "_fc1_w, self." + p + "_fc1_b))\n"
           "    h = torch.dropout(torch.linear(h, self." + p + "_fc2_w, self." + p + "_fc2_b), " + number(c.dropout) +
           ", self.training)\n";
}

inline torch::jit::Module encoder_layer(const EncoderDecoderConfig& c) {
    torch::jit::Module m = new_module("EncoderLayer");
    std::string body = attention(m, "sa", c, "x", "x");
    body += "    x = " + layer_norm(m, "ln1", c.d_model, "x + y") + "\n";
    body += feedforward(m, "ff", c, "x");
    body += "    return " + layer_norm(m, "ln2", c.d_model, "x + h") + "\n";
    m.define("def forward(self, x):\n" + body);
    return m;
}

inline torch::jit::Module decoder_layer(const EncoderDecoderConfig& c) {
    torch::jit::Module m = new_module("DecoderLayer");
    std::string body = attention(m, "sa", c, "x", "x");
    body += "    x = " + layer_norm(m, "ln1", c.d_model, "x + y") + "\n";
    body += attention(m, "ca", c, "x", "memory");
    body += "    x = " + layer_norm(m, "ln2", c.d_model, "x + y") + "\n";
    body += feedforward(m, "ff", c, "x");
    body += "    return " + layer_norm(m, "ln3", c.d_model, "x + h") + "\n";
    m.define("def forward(self, x, memory):\n" + body);
    return m;
}

}  // namespace detail

/// The U-Net: forward(x: Float[B, in_channels, H, W]) → [B, classes, H, W], H and W
/// divisible by 2^levels.
[[nodiscard]] inline torch::jit::Module make_unet(const UNetConfig& c) {
    torch::jit::Module m = detail::new_module("UNet");
    std::string body;
    std::int64_t channels = c.in_channels;
    for (std::int64_t l = 0; l < c.levels; ++l) {
        std::string down = "down";
        down += std::to_string(l);
        const std::int64_t out = c.width << l;
        torch::jit::Module level = detail::new_module("Down");
        level.define("def forward(self, x):\n" + detail::conv_stack(level, "c", channels, out, c.convs, "x") + "    return x\n");
        m.register_module(down, level);
        body += "    s" + std::to_string(l) + " = self." + down + ".forward(x)\n";
        body += "    x = torch.max_pool2d(s" + std::to_string(l) + ", [2, 2], [2, 2], [0, 0], [1, 1], False)\n";
        channels = out;
    }
    torch::jit::Module bottom = detail::new_module("Bottom");
    const std::int64_t bottom_channels = c.width << c.levels;
    bottom.define("def forward(self, x):\n" + detail::conv_stack(bottom, "c", channels, bottom_channels, c.convs, "x") +
                  "    return x\n");
    m.register_module("bottom", bottom);
    body += "    x = self.bottom.forward(x)\n";
    channels = bottom_channels;
    for (std::int64_t l = c.levels; l-- > 0;) {
        const std::int64_t out = c.width << l;
        std::string up = "up";
        up += std::to_string(l);
        torch::jit::Module level = detail::new_module("Up");
        detail::add_parameter(level, "up_w", at::randn({channels, out, 2, 2}) * std::sqrt(1.0 / static_cast<double>(channels)));
        detail::add_parameter(level, "up_b", at::zeros({out}));
        level.define("def forward(self, x, skip):\n"
                     "    x = torch.conv_transpose2d(x, self.up_w, self.up_b, [2, 2], [0, 0], [0, 0], 1, [1, 1])\n"
                     "    x = torch.cat([x, skip], 1)\n" +
                     detail::conv_stack(level, "c", 2 * out, out, c.convs, "x") + "    return x\n");
        m.register_module(up, level);
        body += "    x = self." + up + ".forward(x, s" + std::to_string(l) + ")\n";
        channels = out;
    }
    detail::add_parameter(m, "head_w", detail::conv_weight(c.classes, channels, 1));
    m.define("def forward(self, x):\n" + body + "    return " + detail::conv("x", "head_w", 1, 0) + "\n");
    return m;
}

/// The encoder-decoder transformer: forward(src: Float[B, S, d_model], tgt: Float[B, T, d_model])
/// → [B, T, d_model].
[[nodiscard]] inline torch::jit::Module make_encoder_decoder(const EncoderDecoderConfig& c) {
    torch::jit::Module m = detail::new_module("EncoderDecoder");
    std::string body;
    for (std::int64_t l = 0; l < c.encoder_layers; ++l) {
        std::string name = "enc";
        name += std::to_string(l);
        m.register_module(name, detail::encoder_layer(c));
        body += "    src = self." + name + ".forward(src)\n";
    }
    for (std::int64_t l = 0; l < c.decoder_layers; ++l) {
        std::string name = "dec";
        name += std::to_string(l);
        m.register_module(name, detail::decoder_layer(c));
        body += "    tgt = self." + name + ".forward(tgt, src)\n";
    }
    m.define("def forward(self, src, tgt):\n" + body + "    return tgt\n");
    return m;
}

/// The GPT-2-like model: forward(idx: Long[B, T]) → logits [B, T, vocab], T ≤ block_size.
/// Parameters are drawn from the default generator (seed it for reproducible models).
[[nodiscard]] inline torch::jit::Module make_gpt(const GptConfig& c) {
    torch::jit::Module m = detail::new_module("Gpt");
    detail::add_parameter(m, "wte", detail::normal(c.vocab, c.embed, 0.02));
    detail::add_parameter(m, "wpe", detail::normal(c.block_size, c.embed, 0.01));
    detail::add_parameter(m, "lnf_w", at::ones({c.embed}));
    detail::add_parameter(m, "lnf_b", at::zeros({c.embed}));
    std::string body;
    for (std::int64_t l = 0; l < c.layers; ++l) {
        // (Appending, not "h" + to_string(l): GCC 12 warns falsely on that at -O3.)
        std::string name = "h";
        name += std::to_string(l);
        m.register_module(name, detail::gpt_block(c, l));
        body += "    x = self." + name + ".forward(x)\n";
    }
    m.define(R"(
def forward(self, idx):
    T = idx.size(1)
    pos = torch.arange(T, device=idx.device)
    x = torch.embedding(self.wte, idx) + torch.embedding(self.wpe, pos)
    x = torch.dropout(x, )" + detail::number(c.dropout) + R"(, self.training)
)" + body + R"(    x = torch.layer_norm(x, [x.size(2)], self.lnf_w, self.lnf_b, 1e-5, False)
    return torch.linear(x, self.wte)
)");
    return m;
}

/// The ResNet-like model: forward(x: Float[B, in_channels, H, W]) → logits [B, classes].
[[nodiscard]] inline torch::jit::Module make_resnet(const ResNetConfig& c) {
    torch::jit::Module m = detail::new_module("ResNet");
    detail::add_parameter(m, "stem", detail::conv_weight(c.width, c.in_channels, 3));
    detail::add_batch_norm(m, "bn", c.width);
    std::string body;
    std::int64_t channels = c.width;
    for (std::int64_t s = 0; s < c.stages; ++s) {
        const std::int64_t out = c.width << s;
        for (std::int64_t b = 0; b < c.blocks_per_stage; ++b) {
            const std::int64_t stride = (s > 0 && b == 0) ? 2 : 1;
            std::string name = "s";
            name += std::to_string(s);
            name += 'b';
            name += std::to_string(b);
            m.register_module(name, detail::basic_block(channels, out, stride));
            body += "    x = self." + name + ".forward(x)\n";
            channels = out;
        }
    }
    detail::add_parameter(m, "fc_w", detail::normal(c.classes, channels, 1.0 / std::sqrt(static_cast<double>(channels))));
    detail::add_parameter(m, "fc_b", at::zeros({c.classes}));
    m.define(R"(
def forward(self, x):
    x = torch.relu()" + detail::batch_norm(detail::conv("x", "stem", 1, 1), "bn") + R"()
)" + body + R"(    x = torch.adaptive_avg_pool2d(x, [1, 1]).flatten(1)
    return torch.linear(x, self.fc_w, self.fc_b)
)");
    return m;
}

/// ResNet-50 (He et al. 2016) for 224x224 images: a 7x7 stem with max pooling, then 3, 4, 6
/// and 3 bottleneck blocks of widths 64 to 512, as torchvision builds it.
[[nodiscard]] inline torch::jit::Module make_resnet50(std::int64_t classes = 1000) {
    torch::jit::Module m = detail::new_module("ResNet50");
    detail::add_parameter(m, "stem", detail::conv_weight(64, 3, 7));
    detail::add_batch_norm(m, "bn", 64);
    std::string body;
    std::int64_t channels = 64;
    const std::int64_t blocks[4] = {3, 4, 6, 3};
    for (std::int64_t s = 0; s < 4; ++s) {
        const std::int64_t width = std::int64_t{64} << s;
        for (std::int64_t b = 0; b < blocks[s]; ++b) {
            const std::int64_t stride = (s > 0 && b == 0) ? 2 : 1;
            const std::string name = "layer" + std::to_string(s + 1) + "_" + std::to_string(b);
            m.register_module(name, detail::bottleneck_block(channels, width, stride));
            body += "    x = self." + name + ".forward(x)\n";
            channels = 4 * width;
        }
    }
    detail::add_parameter(m, "fc_w", detail::normal(classes, channels, 1.0 / std::sqrt(static_cast<double>(channels))));
    detail::add_parameter(m, "fc_b", at::zeros({classes}));
    m.define(R"(
def forward(self, x):
    x = torch.relu()" + detail::batch_norm(detail::conv("x", "stem", 2, 3), "bn") + R"()
    x = torch.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False)
)" + body + R"(    x = torch.adaptive_avg_pool2d(x, [1, 1]).flatten(1)
    return torch.linear(x, self.fc_w, self.fc_b)
)");
    return m;
}

}  // namespace remat_examples
