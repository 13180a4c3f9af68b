#!/usr/bin/python3
"""PyTorch side of tests/kernels/test_model_torch.c.

Usage: model_torch.py DIR MODEL, MODEL "gpt" or "cnn". DIR holds, as
safetensors written by Tessera: MODEL_weights (initial parameters by name,
model and optimizer settings as metadata), MODEL_batches (x0, y0, ...),
MODEL_grads (every parameter's gradient on batch 0, plus __logits and
__loss) and MODEL_adamw / MODEL_sgd (parameters after the steps). This
script builds the same model with plain torch modules, loads the weights,
recomputes all of it in float32 and compares. The error of a tensor is
max|tessera - torch| / max(max|torch|, 1e-6) (for AdamW see GRAD_RTOL below).
Prints one line per tensor;
exits 1 if any error exceeds 1e-5, 2 if torch cannot be imported.
"""
import json
import math
import struct
import sys

TOL = 1e-5
# AdamW's update lr * m / (sqrt(v) + eps) does not depend on a gradient's
# size, so a gradient's relative error becomes its update's. An element
# whose gradient is r times smaller than its tensor's largest carries about
# GRAD_RTOL * r of relative error (the gradients agree within GRAD_RTOL of
# each tensor's largest; measured below 1e-6), up to 2 lr a step where a
# float-noise gradient (e.g. the key bias of attention, whose exact gradient
# is 0) takes either sign. Such elements of real weights move the whole
# trajectory a little: PyTorch in float32 and in float64 part the same way.
# So after `steps` AdamW steps an element may be off by steps * lr *
# max(TRAJECTORY, min(2, GRAD_RTOL * r)); the update rule itself is held to
# 1e-5 on fixed gradients by test_optim_torch.
GRAD_RTOL = 2e-6
TRAJECTORY = 1e-2

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as exc:  # noqa: BLE001 - any import failure fails the test
    print(f"model_torch: cannot import torch with {sys.executable}: {exc}")
    sys.exit(2)

INT_SETTINGS = ("n_layer", "n_head", "n_embd", "vocab", "block_size", "in_ch", "img", "ch1", "ch2", "kernel",
                "classes")
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


class Attention(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.h
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.h, d).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, c, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = Attention(c, h)
        self.ln2 = nn.LayerNorm(c)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        c = m["n_embd"]
        self.wte = nn.Embedding(m["vocab"], c)
        self.wpe = nn.Embedding(m["block_size"], c)
        self.blocks = nn.ModuleList(Block(c, m["n_head"]) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()  # LM head tied to wte


class CNN(nn.Module):
    """conv-relu-pool x2 + linear head, 'same' padding."""

    def __init__(self, m):
        super().__init__()
        k = m["kernel"]
        self.conv1 = nn.Conv2d(m["in_ch"], m["ch1"], k, padding=k // 2)
        self.conv2 = nn.Conv2d(m["ch1"], m["ch2"], k, padding=k // 2)
        self.fc = nn.Linear(m["ch2"] * (m["img"] // 4) ** 2, m["classes"])

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        return self.fc(x.flatten(1))


def rel_err(a, b):
    a, b = a.double(), b.double()
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-6)


class Checker:
    def __init__(self):
        self.worst = 0.0
        self.failed = []

    def check(self, label, tessera, ref, allowed=None):
        """Tolerance TOL relative to max|ref|, or per element |tessera - ref|
        <= allowed (a tensor of absolute bounds) where that is larger."""
        if tuple(tessera.shape) != tuple(ref.shape):
            print(f"  {label:44s} shape {list(tessera.shape)} vs torch {list(ref.shape)}  FAIL")
            self.failed.append(label)
            return
        diff = (tessera.double() - ref.double()).abs()
        bound = torch.full_like(diff, TOL * max(ref.double().abs().max().item() if ref.numel() else 0.0, 1e-6))
        note = ""
        if allowed is not None:
            wider = allowed.double() > bound
            bound = torch.maximum(bound, allowed.double())
            if wider.any():
                note = f"  ({int(wider.sum())} elements with small gradients: max diff {diff[wider].max().item():.2e})"
        e = TOL * (diff / bound).max().item() if diff.numel() else 0.0  # in units of the plain tolerance
        self.worst = max(self.worst, e)
        bad = not (e <= TOL)
        if bad:
            self.failed.append(label)
        print(f"  {label:44s} rel err {e:.3e}{'  FAIL' if bad else ''}{note}")


def build(kind, meta, weights):
    m = {k: int(meta[k]) for k in INT_SETTINGS}
    model = GPT(m) if kind == "gpt" else CNN(m)
    named = dict(model.named_parameters())
    if set(named) != set(weights):
        raise SystemExit(f"model_torch: names differ: only torch {sorted(set(named) - set(weights))}, "
                         f"only tessera {sorted(set(weights) - set(named))}")
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(weights[name])
    return model


def loss_of(model, x, y):
    logits = model(x)
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def groups(model, wd):
    """Weight decay on parameters with ndim >= 2 (the rule the C side uses)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def main():
    d, kind = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    weights, meta = read_safetensors(f"{d}/{kind}_weights.safetensors")
    batches, _ = read_safetensors(f"{d}/{kind}_batches.safetensors")
    steps = int(meta["steps"])
    chk = Checker()

    model = build(kind, meta, weights)
    got, _ = read_safetensors(f"{d}/{kind}_grads.safetensors")
    logits, loss = loss_of(model, batches["x0"], batches["y0"])
    loss.backward()
    print(f"{kind}: loss tessera {got['__loss'].item():.8f} torch {loss.item():.8f}")
    chk.check("logits", got["__logits"], logits.detach())
    chk.check("loss", got["__loss"], loss.detach().reshape(1))
    for name, p in model.named_parameters():
        chk.check(f"grad {name}", got[name], p.grad)

    settings = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=float(meta["adamw_lr"])),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=float(meta["sgd_lr"]), momentum=float(meta["sgd_momentum"])),
    }
    wds = {"adamw": float(meta["adamw_wd"]), "sgd": float(meta["sgd_wd"])}
    for opt_name, make in settings.items():
        model = build(kind, meta, weights)
        opt = make(groups(model, wds[opt_name]))
        smallness = {name: torch.ones(p.shape, dtype=torch.float64) for name, p in model.named_parameters()}
        for s in range(steps):
            opt.zero_grad()
            _, loss = loss_of(model, batches[f"x{s}"], batches[f"y{s}"])
            loss.backward()
            for name, p in model.named_parameters():
                g = p.grad.double().abs()
                smallness[name] = torch.maximum(smallness[name], g.max() / g.clamp_min(1e-300))
            opt.step()
        got, _ = read_safetensors(f"{d}/{kind}_{opt_name}.safetensors")
        lr = float(meta[f"{opt_name}_lr"])
        for name, p in model.named_parameters():
            if opt_name == "adamw":
                allowed = steps * lr * torch.clamp(GRAD_RTOL * smallness[name], min=TRAJECTORY, max=2.0)
                chk.check(f"{opt_name} x{steps} {name}", got[name], p.detach(), allowed)
            else:
                chk.check(f"{opt_name} x{steps} {name}", got[name], p.detach())

    print(f"{kind}: worst rel err {chk.worst:.3e} (tolerance {TOL:g})")
    if chk.failed:
        print(f"{kind}: FAILED: {', '.join(chk.failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
