"""Exports the dropout-bearing torch.nn models of the test "[torch][dropout]" and what eager
PyTorch computes for them: the models in train mode, traced and scripted, and for each one
step of plain autograd (Python, eager) from a fixed seed — outputs, loss and every parameter
gradient — so that the C++ test can require remat's step to be that step, bit for bit.

    python3 export_dropout_models.py OUT_DIR

Run with Debian's python3 (python3-torch 1.13). OUT_DIR/manifest.json lists, per model, the
files, the input shapes, the seeds and the parameter names in the order of the gradients.

The step, from the inputs and loss weights w (one per output) saved beside the model:
torch.manual_seed(STEP_SEED); outputs = model(*inputs); loss = sum over outputs of
(output * w).sum() in double; loss.backward().
"""
import json
import os
import sys
import warnings

import torch
import torch.nn as nn

warnings.filterwarnings("ignore")

INPUT_SEED = 1
STEP_SEED = 7


class Decoder(nn.Module):
    """The decoder of issue 21: pre-norm, GELU, a causal target mask, a final LayerNorm."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(64, 4, 128, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.d = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(64))
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(12))

    def forward(self, tgt, memory):
        return self.d(tgt, memory, tgt_mask=self.mask)


class Transformer(nn.Module):
    """nn.Transformer as in issue 21: 2 + 2 layers, d_model 64, a causal target mask."""

    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                dim_feedforward=128, dropout=0.1, batch_first=True)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(12))

    def forward(self, src, tgt):
        return self.t(src, tgt, tgt_mask=self.mask)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True), 2)

    def forward(self, x):
        return self.e(x)


class Around(nn.Module):
    """One layer between two linear maps, so that its input requires grad and its output is
    not the model's output."""

    def __init__(self, layer, width, out_width=None):
        super().__init__()
        self.before = nn.Linear(width, width)
        self.layer = layer
        self.after = nn.Linear(out_width or width, 4)

    def forward(self, x):
        return self.after(self.layer(self.before(x)))


class AroundRecurrent(Around):
    def forward(self, x):
        y, _ = self.layer(self.before(x))
        return self.after(y)


class AroundAttention(Around):
    def forward(self, x):
        h = self.before(x)
        y, _ = self.layer(h, h, h, need_weights=False)
        return self.after(y)


class DecoderLayerAlone(nn.Module):
    def __init__(self):
        super().__init__()
        self.before = nn.Linear(16, 16)
        self.layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.2, batch_first=True)

    def forward(self, x, memory):
        return self.layer(self.before(x), memory)


def f(*shape):
    return {"dtype": "float", "shape": list(shape)}


# name: (constructor, input shapes)
MODELS = {
    "transformer": (Transformer, [f(2, 16, 64), f(2, 12, 64)]),
    "transformer_decoder": (Decoder, [f(2, 12, 64), f(2, 16, 64)]),
    "transformer_encoder": (Encoder, [f(2, 16, 64)]),
    "dropout": (lambda: Around(nn.Dropout(0.3), 8), [f(4, 8)]),
    "dropout1d": (lambda: Around(nn.Dropout1d(0.3), 8), [f(2, 5, 8)]),
    "dropout2d": (lambda: Around(nn.Dropout2d(0.3), 8), [f(2, 5, 3, 8)]),
    "dropout3d": (lambda: Around(nn.Dropout3d(0.3), 8), [f(2, 5, 2, 3, 8)]),
    "alpha_dropout": (lambda: Around(nn.AlphaDropout(0.3), 8), [f(4, 8)]),
    "feature_alpha_dropout": (lambda: Around(nn.FeatureAlphaDropout(0.3), 8), [f(2, 5, 3, 8)]),
    "multihead_attention": (lambda: AroundAttention(nn.MultiheadAttention(16, 2, dropout=0.2, batch_first=True), 16),
                            [f(2, 6, 16)]),
    "transformer_encoder_layer": (lambda: Around(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True),
                                                 16), [f(2, 6, 16)]),
    "transformer_decoder_layer": (DecoderLayerAlone, [f(2, 6, 16), f(2, 5, 16)]),
    "lstm": (lambda: AroundRecurrent(nn.LSTM(8, 8, num_layers=2, dropout=0.3, batch_first=True), 8), [f(2, 5, 8)]),
    "gru": (lambda: AroundRecurrent(nn.GRU(8, 8, num_layers=2, dropout=0.3, batch_first=True), 8), [f(2, 5, 8)]),
}


class Tensors(nn.Module):
    """A container TorchScript saves and LibTorch loads: one buffer per tensor."""

    def __init__(self, tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_buffer(name, t.detach().clone().contiguous())

    def forward(self):
        return 0


def eager_step(model, inputs, weights):
    torch.manual_seed(STEP_SEED)
    outputs = model(*inputs)
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    loss = sum((o * w).sum().double() for o, w in zip(outputs, weights))
    loss.backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros(0) for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return outputs, loss, grads


def export(out, name, make, shapes, manifest):
    torch.manual_seed(0)
    model = make().train()
    torch.manual_seed(INPUT_SEED)
    inputs = [torch.randn(s["shape"]) for s in shapes]
    with torch.no_grad():  # for the outputs' shapes; the step below starts from its own seed
        shaped = model(*inputs)
    shaped = (shaped,) if isinstance(shaped, torch.Tensor) else tuple(shaped)
    n_outputs = len(shaped)
    weights = [torch.randn(o.shape) for o in shaped]
    outputs, loss, grads = eager_step(model, inputs, weights)
    expected = {"loss": loss}
    for i, t in enumerate(inputs):
        expected[f"input_{i}"] = t
    for i, t in enumerate(weights):
        expected[f"weight_{i}"] = t
    for i, t in enumerate(outputs):
        expected[f"output_{i}"] = t
    for i, t in enumerate(grads):
        expected[f"grad_{i}"] = t
    expected_path = os.path.join(out, f"{name}.expected.pt")
    torch.jit.script(Tensors(expected)).save(expected_path)
    for mode in ("traced", "scripted"):
        path = os.path.join(out, f"{name}.{mode}.pt")
        if mode == "traced":
            module = torch.jit.trace(model, tuple(inputs), check_trace=False, strict=False)
        else:
            module = torch.jit.script(model)
        module.save(path)
        manifest.append({"model": name, "mode": mode, "file": os.path.abspath(path),
                         "expected": os.path.abspath(expected_path), "inputs": len(inputs), "outputs": n_outputs,
                         "parameters": [n for n, _ in model.named_parameters()], "step_seed": STEP_SEED})


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    manifest = []
    for name, (make, shapes) in MODELS.items():
        export(out, name, make, shapes, manifest)
    with open(os.path.join(out, "manifest.json"), "w") as file:
        json.dump(manifest, file, indent=1)
    print(f"exported {len(manifest)} models to {out}")


if __name__ == "__main__":
    main()
