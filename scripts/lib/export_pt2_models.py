"""Exports the models of the test "[torch][pt2]" with torch.export, in train mode, and what
eager PyTorch computes for them, so that the C++ test can require remat's steps to be these.

    python export_pt2_models.py OUT_DIR [--only a,b] [--without-torchvision-ok]

Run with the 2.x configuration's Python (torch >= 2.8 with torch.export.save's archive
format, and torchvision; --without-torchvision-ok leaves torchvision's models out, saying so,
where it is not installed, as on a GPU machine with torch alone). For each model, OUT_DIR holds NAME.pt2 (torch.export.save) and
NAME.expected/ with raw little-endian tensors and an index.json: the inputs, the loss weights
(one tensor per output leaf), and for each step its seed, loss, outputs, every parameter
gradient by name, and every buffer after the step. OUT_DIR/manifest.json lists the models.

A step, from the inputs and weights w saved beside the model:
    torch.manual_seed(seed); outputs = model(*inputs)
    loss = sum over output leaves of (output * w).sum() in double; loss.backward()
    then SGD (lr = LR, no momentum) on every parameter that has a gradient.
"""
import argparse
import json
import math
import os
import sys
import time
import warnings
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_dropout_models  # noqa: E402  (its nn.Transformer model)

warnings.filterwarnings("ignore")

INPUT_SEED = 1
STEP_SEEDS = [7, 8]
LR = 0.01


# ----------------------------------------------------------------------------- models


class GPT(nn.Module):
    """nanoGPT's structure, small: token and position embeddings, pre-norm blocks with causal
    attention (scaled_dot_product_attention with dropout) and a GELU MLP, and an lm_head whose
    weight is the token embedding's (weight tying)."""

    def __init__(self, vocab=64, block=16, layers=2, heads=2, width=32, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "ln_1": nn.LayerNorm(width), "c_attn": nn.Linear(width, 3 * width), "c_proj": nn.Linear(width, width),
                "ln_2": nn.LayerNorm(width), "fc": nn.Linear(width, 4 * width), "proj": nn.Linear(4 * width, width),
                "resid_drop": nn.Dropout(dropout)}))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        b, t = idx.shape
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            h = blk["ln_1"](x)
            q, k, v = blk["c_attn"](h).split(h.shape[-1], dim=2)
            q = q.view(b, t, self.heads, -1).transpose(1, 2)
            k = k.view(b, t, self.heads, -1).transpose(1, 2)
            v = v.view(b, t, self.heads, -1).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
            y = y.transpose(1, 2).contiguous().view(b, t, -1)
            x = x + blk["resid_drop"](blk["c_proj"](y))
            x = x + blk["resid_drop"](blk["proj"](F.gelu(blk["fc"](blk["ln_2"](x)))))
        return self.lm_head(self.ln_f(x))


class UNet(nn.Module):
    """Two levels down and up, conv-BN-ReLU pairs, max pooling, transposed convolutions and
    skip connections by concatenation."""

    def __init__(self, c=8):
        super().__init__()

        def pair(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.down1, self.down2, self.bottom = pair(3, c), pair(c, 2 * c), pair(2 * c, 4 * c)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2), pair(4 * c, 2 * c)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2), pair(2 * c, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.head(u1)


class Recurrent(nn.Module):
    """A 2-layer LSTM with dropout between its layers, between two linear maps."""

    def __init__(self):
        super().__init__()
        self.before = nn.Linear(8, 8)
        self.lstm = nn.LSTM(8, 8, num_layers=2, dropout=0.3, batch_first=True)
        self.after = nn.Linear(8, 4)

    def forward(self, x):
        y, _ = self.lstm(self.before(x))
        return self.after(y)


class Transformer(export_dropout_models.Transformer):
    """nn.Transformer of the dropout tests: 2 + 2 layers, d_model 64, a causal target mask."""

    def forward(self, src, tgt):
        # tgt_is_causal: export cannot compare the mask with a causal one (a data-dependent test).
        return self.t(src, tgt, tgt_mask=self.mask, tgt_is_causal=True)


class Structured(nn.Module):
    """Exported with a dynamic batch size (symbolic sizes in the program), a mask written in
    place into a fresh tensor, and a dict of a list and a tuple as output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, y):
        b = x.shape[0]
        h = self.lin(x) + y.sum()
        mask = torch.zeros(b, 8)
        mask[:, 2:5] = 1.0
        return {"parts": list(h.split(4, dim=1)), "masked": (h * mask, torch.tanh(h).view(b * 2, 4))}


class NoGradRegion(nn.Module):
    """A `with torch.no_grad():` block in the forward (torch.export wraps it in
    wrap_with_set_grad_enabled), with an in-place op inside: a per-row scale that gradients do
    not flow through."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        with torch.no_grad():
            scale = h.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-3)
        return self.b(h / scale)


class FoldedPatches(nn.Module):
    """Unfold, a pointwise map and fold (im2col, col2im): col2im returns an output whose memory
    is the size of its input, ten times its own, and the loss's gradient is of its shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        patches = F.unfold(self.conv(x), 3, padding=1)
        return F.fold(torch.tanh(patches), (8, 8), 3, padding=1)


class Spectrum(nn.Module):
    """A complex value between two linear maps: the magnitude of a real FFT."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(9, 4)

    def forward(self, x):
        return self.b(torch.fft.rfft(self.a(x)).abs())


class RunningState(nn.Module):
    """Buffers the forward updates itself: a step counter added to the output, and an average
    scaled in one op and added to in another, which the output reads."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("average", torch.zeros(16))

    def forward(self, x):
        h = self.a(x)
        self.steps.add_(1)
        self.average.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)
        return h * torch.sigmoid(self.average) + self.steps


class Siamese(nn.Module):
    """One encoder with batch norm applied to two inputs on independent branches: both uses
    update the same running statistics, in the module's order."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x, y):
        return self.head(self.encoder(x) * self.encoder(y))


class Reused(nn.Module):
    """A value read twice by one op (a Gram matrix) and once by another: autograd adds the
    three contributions to its gradient in one order, and a sum's gradient is expanded."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        return torch.mm(h.t(), h).sum(0) + F.softplus(h).sum(0)


class Autocast(nn.Module):
    """A torch.autocast region (bfloat16 on the CPU): saved after run_decompositions({}), which
    writes autocast's casts into the graph; without it, capture refuses the region."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            h = torch.relu(self.a(x))
        return self.b(h.float())


def autocast_model():
    return Autocast()


autocast_model.decompose = True


def spectral_norm_mlp():
    """Spectral normalization (torch.nn.utils.parametrizations): its power iteration runs in a
    no-grad block and writes its buffers u and v with out= ops, once per forward."""
    return nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(16, 64)), nn.Tanh(), nn.Linear(64, 64),
                         nn.Tanh(), nn.Linear(64, 4))


def dynamic_batch(*inputs):
    """export's arguments for a dynamic first dimension of `inputs` (made when exporting: a
    torch without torch.export must still load this file)."""
    def arguments(count):
        batch = torch.export.Dim("batch", min=2, max=64)
        return {"dynamic_shapes": tuple({0: batch} if i in inputs else None for i in range(count))}
    return arguments


def torchvision_model(name, **kwargs):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(**kwargs)
    make.torchvision = True
    return make


def image(b, size):
    return {"dtype": "float", "shape": [b, 3, size, size]}


def f(*shape):
    return {"dtype": "float", "shape": list(shape)}


def tokens(vocab, *shape):
    return {"dtype": "long", "shape": list(shape), "high": vocab}


# name: (constructor, input specs)
MODELS = {
    "resnet18": (torchvision_model("resnet18", num_classes=10), [image(2, 64)]),
    "mobilenet_v3_small": (torchvision_model("mobilenet_v3_small", num_classes=10), [image(2, 64)]),
    "vit_b_16": (torchvision_model("vit_b_16", image_size=32, num_classes=10), [image(2, 32)]),
    "swin_t": (torchvision_model("swin_t", num_classes=10), [image(1, 64)]),
    "efficientnet_b0": (torchvision_model("efficientnet_b0", num_classes=10, stochastic_depth_prob=0.2),
                        [image(2, 64)]),
    "transformer": (Transformer, [f(2, 16, 64), f(2, 12, 64)]),
    "gpt": (GPT, [tokens(64, 2, 16)]),
    "unet": (UNet, [image(2, 32)]),
    "lstm": (Recurrent, [f(2, 5, 8)]),
    "structured": (Structured, [f(4, 8), f(3)], dynamic_batch(0)),
    "no_grad_region": (NoGradRegion, [f(4, 16)]),
    "spectral_norm": (spectral_norm_mlp, [f(32, 16)]),
    "folded_patches": (FoldedPatches, [f(2, 3, 8, 8)]),
    "spectrum": (Spectrum, [f(4, 16)]),
    "running_state": (RunningState, [f(4, 16)]),
    "siamese": (Siamese, [f(4, 16), f(4, 16)]),
    "reused": (Reused, [f(5, 16)]),
    "autocast": (autocast_model, [f(4, 16)]),
}


# ----------------------------------------------------------------------------- saving


class Writer:
    """Raw tensors in a folder, with an index of names, dtypes and shapes."""

    def __init__(self, folder):
        self.folder = folder
        self.index = {}
        os.makedirs(folder, exist_ok=True)

    def put(self, name, t):
        t = t.detach().contiguous().cpu()
        shape = list(t.shape)
        t = t.reshape(-1)
        file = f"t{len(self.index)}.bin"
        with open(os.path.join(self.folder, file), "wb") as out:
            out.write(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        self.index[name] = {"file": file, "dtype": str(t.dtype).replace("torch.", ""), "shape": shape}

    def close(self, extra):
        with open(os.path.join(self.folder, "index.json"), "w") as out:
            json.dump({"tensors": self.index, **extra}, out, indent=1)


def leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    return []


def step(model, inputs, weights, seed, parameters):
    torch.manual_seed(seed)
    outputs = leaves(model(*inputs))
    loss = sum((o * w).sum().double() for o, w in zip(outputs, weights))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in parameters if p.grad is not None}
    with torch.no_grad():
        for _, p in parameters:
            if p.grad is not None:
                p.add_(p.grad, alpha=-LR)
            p.grad = None
    return outputs, loss.detach(), grads


def export(out, name, make, specs, export_args=None):
    start = time.time()
    torch.manual_seed(0)
    model = make().train()
    torch.manual_seed(INPUT_SEED)
    inputs = []
    for s in specs:
        if s["dtype"] == "long":
            inputs.append(torch.randint(0, s["high"], s["shape"]))
        else:
            inputs.append(torch.randn(s["shape"]))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    program = torch.export.export(model, tuple(inputs), **(export_args(len(inputs)) if export_args else {}))
    if getattr(make, "decompose", False):
        program = program.run_decompositions({})
    torch.export.save(program, os.path.join(out, f"{name}.pt2"))
    model.load_state_dict(state)
    exported = time.time() - start
    with torch.no_grad():
        torch.manual_seed(STEP_SEEDS[0])
        shaped = leaves(model(*inputs))
    model.load_state_dict(state)
    weights = [torch.randn(o.shape, dtype=o.dtype) for o in shaped]
    writer = Writer(os.path.join(out, f"{name}.expected"))
    for i, t in enumerate(inputs):
        writer.put(f"input_{i}", t)
    for i, t in enumerate(weights):
        writer.put(f"weight_{i}", t)
    parameters = list(model.named_parameters())
    for k, seed in enumerate(STEP_SEEDS):
        outputs, loss, grads = step(model, inputs, weights, seed, parameters)
        writer.put(f"step{k}.loss", loss)
        for i, t in enumerate(outputs):
            writer.put(f"step{k}.output_{i}", t)
        for n, g in grads.items():
            writer.put(f"step{k}.grad.{n}", g)
        for n, b in model.named_buffers():
            writer.put(f"step{k}.buffer.{n}", b)
    writer.close({"inputs": len(inputs), "outputs": len(weights), "steps": len(STEP_SEEDS), "seeds": STEP_SEEDS,
                  "lr": LR, "parameters": [n for n, _ in parameters],
                  "buffers": [n for n, _ in model.named_buffers()]})
    return {"model": name, "file": os.path.abspath(os.path.join(out, f"{name}.pt2")),
            "expected": os.path.abspath(os.path.join(out, f"{name}.expected")),
            "export_seconds": round(exported, 2), "torch": torch.__version__}


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Branching(nn.Module):
    """Control flow on a tensor's value, which export keeps as torch.cond."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: self.lin(y), lambda y: -self.lin(y), (x,))


def rewritten(source, target, change):
    """A copy of the archive `source` whose model JSON is change(json)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("models/model.json"):
                program = json.loads(data)
                change(program)
                data = json.dumps(program).encode()
            zout.writestr(item, data)


def export_refused(out):
    """Archives capture must refuse by name: truncated, an unknown schema major, an unknown
    operator, control flow."""
    folder = os.path.join(out, "refused")
    os.makedirs(folder, exist_ok=True)
    x = torch.randn(2, 8)
    good = os.path.join(folder, "small.pt2")
    torch.export.save(torch.export.export(Small().train(), (x,)), good)
    with open(good, "rb") as file:
        data = file.read()
    with open(os.path.join(folder, "truncated.pt2"), "wb") as file:
        file.write(data[: len(data) // 2])

    def schema_99(program):
        program["schema_version"]["major"] = 99

    def unknown_op(program):
        for node in program["graph_module"]["graph"]["nodes"]:
            if node["target"] == "torch.ops.aten.relu.default":
                node["target"] = "torch.ops.aten.no_such_op.default"

    rewritten(good, os.path.join(folder, "schema_99.pt2"), schema_99)
    rewritten(good, os.path.join(folder, "unknown_op.pt2"), unknown_op)
    torch.export.save(torch.export.export(Branching().train(), (x,)), os.path.join(folder, "cond.pt2"))
    torch.export.save(torch.export.export(Autocast().train(), (torch.randn(2, 16),)), os.path.join(folder, "autocast.pt2"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", default="")
    parser.add_argument("--without-torchvision-ok", action="store_true")
    args = parser.parse_args()
    if not hasattr(torch, "export") or not hasattr(torch.export, "save"):
        print(f"torch {torch.__version__} has no torch.export.save: nothing to export")
        return 0
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    only = [m for m in args.only.split(",") if m]
    manifest = []
    try:
        import torchvision  # noqa: F401
        have_torchvision = True
    except ImportError:
        have_torchvision = False
    for name, (make, specs, *export_args) in MODELS.items():
        if only and name not in only:
            continue
        if getattr(make, "torchvision", False) and not have_torchvision and args.without_torchvision_ok:
            print(f"left out {name}: this Python has no torchvision", flush=True)
            continue
        manifest.append(export(args.out, name, make, specs, *export_args))
        print(f"exported {name} in {manifest[-1]['export_seconds']} s", flush=True)
    export_refused(args.out)
    with open(os.path.join(args.out, "manifest.json"), "w") as file:
        json.dump(manifest, file, indent=1)
    print(f"exported {len(manifest)} models to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
