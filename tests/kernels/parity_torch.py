#!/usr/bin/python3
"""Recomputes the cases of tests/kernels/test_parity.c with PyTorch.

Usage: parity_torch.py DIR, where DIR holds manifest.json and the raw
little-endian tensors it names. For every case the forward output and the
gradient of every float input (with the same upstream gradient) are computed
by torch in float32 and compared with Tessera's. The error of a tensor is
max|tessera - torch| / max|torch| (1e-30 floor): the largest deviation
against the tensor's own scale. Prints one line per case and tensor; exits 1
if any error exceeds 1e-5, 2 if torch cannot be imported.
"""
import json
import os
import sys

TOL = 1e-5

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as exc:  # noqa: BLE001 - any import failure fails the test
    print(f"parity: cannot import torch with {sys.executable}: {exc}")
    sys.exit(2)

DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32}


def load(folder, desc):
    data = np.fromfile(os.path.join(folder, desc["file"]), dtype=DTYPES[desc["dtype"]])
    return torch.from_numpy(data.reshape(desc["shape"]).copy())


def attention(q, k, v, causal, scale):
    scale = scale if scale != 0 else q.shape[-1] ** -0.5
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        mask = torch.ones(tq, tk, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def forward(op, a, t):
    if op == "matmul":
        return t["a"] @ t["b"]
    if op == "layernorm":
        x = t["x"]
        return F.layer_norm(x, (x.shape[-1],), t["weight"], t["bias"], a["eps"])
    if op == "softmax":
        fn = torch.log_softmax if a["log"] else torch.softmax
        return fn(t["x"], dim=a["dim"])
    if op == "cross_entropy":
        logits = t["logits"]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t["targets"].reshape(-1),
                               ignore_index=a["ignore_index"], reduction=a["reduction"])
    if op == "conv2d":
        return F.conv2d(t["x"], t["weight"], t["bias"], stride=a["stride"], padding=a["padding"],
                        dilation=a["dilation"])
    if op == "max_pool2d":
        return F.max_pool2d(t["x"], a["kernel"], a["stride"], a["padding"])
    if op == "attention":
        return attention(t["q"], t["k"], t["v"], a["causal"], a["scale"])
    raise ValueError(f"unknown op {op}")


def rel_error(ours, ref):
    scale = max(ref.abs().max().item(), 1e-30) if ref.numel() else 1.0
    return (ours - ref).abs().max().item() / scale if ref.numel() else 0.0


def main():
    folder = sys.argv[1]
    with open(os.path.join(folder, "manifest.json")) as f:
        cases = json.load(f)["cases"]
    torch.set_num_threads(1)
    worst, failed = 0.0, 0
    for case in cases:
        t = {}
        for name, desc in case["inputs"].items():
            x = load(folder, desc)
            if x.is_floating_point():
                x.requires_grad_(True)
            t[name] = x
        out = forward(case["op"], case["attrs"], t)
        out.backward(load(folder, case["upstream"]).reshape(out.shape))
        checks = [("output", load(folder, case["output"]).reshape(out.shape), out.detach())]
        for name, desc in case["grads"].items():
            checks.append(("grad " + name, load(folder, desc), t[name].grad))
        for name, x in t.items():
            if x.is_floating_point() and name not in case["grads"]:
                checks.append(("grad " + name, torch.zeros(0), None))
        for what, ours, ref in checks:
            if ref is None:
                print(f"  {case['name']:<24} {what:<14} MISSING in tessera")
                failed += 1
                continue
            err = rel_error(ours.double(), ref.double())
            worst = max(worst, err)
            bad = not err <= TOL
            failed += bad
            print(f"  {case['name']:<24} {what:<14} max rel err {err:.2e}{'  FAIL' if bad else ''}")
    print(f"parity: {len(cases)} cases, worst {worst:.2e}, tolerance {TOL:.0e}, {failed} failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
