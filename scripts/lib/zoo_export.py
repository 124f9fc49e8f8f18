"""Exports the model zoo of scripts/zoo: standard torchvision and torch.nn models, built
untrained (random weights, seed 0) in train mode, saved with torch.jit.trace and with
torch.jit.script at small input sizes — and with torch.export (.pt2) where the Python's torch
has it — and a manifest (manifest.json) that says how to feed each one. Run with Debian's
python3 (python3-torch 1.13, python3-torchvision 0.14), or with the 2.x configuration's Python
(scripts/zoo --torch pip), which exports the three ways.

    python3 zoo_export.py OUT_DIR [MODEL ...]

An export already in OUT_DIR is reused; ZOO_FRESH=1 exports every model again.
"""
import json
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_pt2_models  # noqa: E402  (its nanoGPT-style GPT)

warnings.filterwarnings("ignore")


class LSTMModel(nn.Module):
    """Embedding, a two-layer nn.LSTM and a classifier on the last step."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        y, _ = self.lstm(self.emb(x))
        return self.head(y[:, -1])


class TransformerModel(nn.Module):
    """torch.nn.Transformer (2 + 2 layers) on two inputs."""

    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                dim_feedforward=64, batch_first=True)

    def forward(self, src, tgt):
        return self.t(src, tgt)


class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A U-Net: 4 levels down and up, skip concatenations, batch norm."""

    def __init__(self, width=8, levels=4, classes=3):
        super().__init__()
        chans = [width * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList([DoubleConv(3 if i == 0 else chans[i - 1], chans[i]) for i in range(levels)])
        self.bottom = DoubleConv(chans[levels - 1], chans[levels])
        self.up = nn.ModuleList([nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2) for i in reversed(range(levels))])
        self.merge = nn.ModuleList([DoubleConv(2 * chans[i], chans[i]) for i in reversed(range(levels))])
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for i, (up, merge) in enumerate(zip(self.up, self.merge)):
            x = merge(torch.cat([up(x), skips[len(skips) - 1 - i]], 1))
        return self.head(x)


class VAE(nn.Module):
    """A small variational autoencoder: the reparametrisation draws noise inside the step."""

    def __init__(self, features=784, hidden=256, latent=16):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mean = nn.Linear(hidden, latent)
        self.log_variance = nn.Linear(hidden, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                     nn.Linear(hidden, features), nn.Sigmoid())

    def forward(self, x):
        h = self.encoder(x)
        mean, log_variance = self.mean(h), self.log_variance(h)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_variance)
        return self.decoder(z)


def image(batch=4, size=64):
    """Large enough that activations, not the weights' workspaces, set the memory."""
    return [{"dtype": "float", "shape": [batch, 3, size, size]}]


MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), image()),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10), image()),
    "densenet121": (lambda: torchvision.models.densenet121(num_classes=10), image()),
    "efficientnet_b0": (lambda: torchvision.models.efficientnet_b0(num_classes=10), image()),
    "vit_b_16": (lambda: torchvision.models.vit_b_16(image_size=64, num_classes=10), image()),
    "vit_small": (lambda: torchvision.models.VisionTransformer(image_size=64, patch_size=8, num_layers=4, num_heads=4,
                                                               hidden_dim=64, mlp_dim=128, num_classes=10), image()),
    "fcn_resnet50": (lambda: torchvision.models.segmentation.fcn_resnet50(num_classes=4, weights_backbone=None),
                     image()),
    "lraspp_mobilenet_v3_large": (
        lambda: torchvision.models.segmentation.lraspp_mobilenet_v3_large(num_classes=4, weights_backbone=None),
        image()),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10), image()),
    "resnext50_32x4d": (lambda: torchvision.models.resnext50_32x4d(num_classes=10), image()),
    "regnet_y_400mf": (lambda: torchvision.models.regnet_y_400mf(num_classes=10), image()),
    "shufflenet_v2_x1_0": (lambda: torchvision.models.shufflenet_v2_x1_0(num_classes=10), image()),
    "mnasnet0_5": (lambda: torchvision.models.mnasnet0_5(num_classes=10), image()),
    "swin_t": (lambda: torchvision.models.swin_t(num_classes=10), image()),
    # nanoGPT's structure with tied weights (export_pt2_models.GPT; scaled_dot_product_attention
    # needs PyTorch 2.x, so its TorchScript exports under 1.13 fail and say so).
    "gpt": (lambda: export_pt2_models.GPT(vocab=256, block=64, layers=4, heads=4, width=128),
            [{"dtype": "long", "shape": [8, 64], "high": 256}]),
    "unet": (UNet, image()),
    "vae": (VAE, [{"dtype": "float", "shape": [32, 784]}]),
    "transformer": (TransformerModel, [{"dtype": "float", "shape": [8, 32, 32]},
                                       {"dtype": "float", "shape": [8, 24, 32]}]),
    "lstm": (LSTMModel, [{"dtype": "long", "shape": [8, 32], "high": 100}]),
}


# torch.export (.pt2) beside TorchScript where this Python's torch has it (PyTorch 2.8+).
MODES = ("traced", "scripted") + (("exported",) if hasattr(torch, "export") and hasattr(torch.export, "save") else ())


def example(spec):
    if spec["dtype"] == "long":
        return torch.randint(0, spec["high"], spec["shape"])
    return torch.randn(spec["shape"])


def main():
    out = sys.argv[1]
    wanted = sys.argv[2:] or list(MODELS)
    os.makedirs(out, exist_ok=True)
    manifest = []
    for name in wanted:
        make, inputs = MODELS[name]
        torch.manual_seed(0)
        model = make().train()
        args = tuple(example(s) for s in inputs)
        for mode in MODES:
            path = os.path.join(out, f"{name}.{mode}.{'pt2' if mode == 'exported' else 'pt'}")
            if os.path.exists(path) and not os.environ.get("ZOO_FRESH"):
                manifest.append({"model": name, "mode": mode, "file": os.path.abspath(path), "inputs": inputs})
                continue
            try:
                if mode == "exported":
                    state = {k: v.clone() for k, v in model.state_dict().items()}
                    torch.export.save(torch.export.export(model, args), path)
                    model.load_state_dict(state)
                else:
                    module = (torch.jit.trace(model, args, check_trace=False, strict=False) if mode == "traced"
                              else torch.jit.script(model))
                    module.save(path)
            except Exception as e:  # report and go on: the table says which exports failed
                print(f"zoo: {name} {mode}: export failed: {str(e).splitlines()[0]}", file=sys.stderr)
                continue
            manifest.append({"model": name, "mode": mode, "file": os.path.abspath(path), "inputs": inputs})
            print(f"zoo: exported {name} ({mode})", file=sys.stderr, flush=True)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
