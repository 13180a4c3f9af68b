"""PyTorch side of bench/kernels.c, served over stdin/stdout so the C
program can interleave Tessera and PyTorch repetitions (a loaded machine
then slows both alike). Requests, one per line:

  threads N         set torch's and OpenBLAS's thread counts -> "ok <blas threads>"
  warm CASE K       run CASE K times untimed                 -> "ok <note>"
  time CASE         run CASE once                            -> "<ms>"

Cases and shapes are those of bench/kernels.c. Run by bench_kernels with
/usr/bin/python3 (Debian's python3-torch)."""
import ctypes
import math
import sys
import os
import time

import torch
import torch.nn.functional as F


def set_threads(n):
    """torch.set_num_threads does not reach the BLAS torch calls (Debian's
    torch uses the system OpenBLAS, the same library Tessera links), so set
    OpenBLAS's count too, as TESSERA_NUM_THREADS does. Returns the BLAS count."""
    torch.set_num_threads(n)
    try:
        blas = ctypes.CDLL("libopenblas.so.0")
        blas.openblas_set_num_threads(n)
        return blas.openblas_get_num_threads()
    except (OSError, AttributeError):
        return -1


# the clock: wall time, or the process's CPU time when BENCH_CLOCK=cpu
# (bench_kernels --cpu-time)
clock = time.process_time if os.environ.get("BENCH_CLOCK") == "cpu" else time.perf_counter


def timed(fn):
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def matmul_case(name, g):
    a = torch.randn(4096, 768, generator=g)
    b = torch.randn(768, 3072, generator=g)
    dc = torch.randn(4096, 3072, generator=g)
    fns = {
        "matmul_fwd": lambda: torch.matmul(a, b),
        "matmul_bwd_dA": lambda: torch.matmul(dc, b.t()),
        "matmul_bwd_dB": lambda: torch.matmul(a.t(), dc),
    }
    return fns[name], "torch.matmul"


def layernorm_case(g):
    x = torch.randn(8, 256, 768, generator=g).requires_grad_()
    w = torch.randn(768, generator=g).requires_grad_()
    b = torch.randn(768, generator=g).requires_grad_()
    gy = torch.randn(8, 256, 768, generator=g)

    def run():
        for t in (x, w, b):
            t.grad = None
        F.layer_norm(x, (768,), w, b, 1e-5).backward(gy)

    return run, "F.layer_norm"


def attention_case(g):
    B, H, T, D = 8, 8, 256, 64
    q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_() for _ in range(3))
    gy = torch.randn(B, H, T, D, generator=g)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scale = 1.0 / math.sqrt(D)

    def math_form():
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        return torch.matmul(torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1), v)

    variants = {"matmul+masked softmax+matmul": math_form}
    if hasattr(F, "scaled_dot_product_attention"):
        variants["F.scaled_dot_product_attention"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif hasattr(F, "_scaled_dot_product_attention"):  # torch 1.13
        variants["F._scaled_dot_product_attention"] = lambda: F._scaled_dot_product_attention(
            q, k, v, None, 0.0, False, True)[0]

    def make(fwd):
        def run():
            for t in (q, k, v):
                t.grad = None
            fwd().backward(gy)
        return run

    # the faster implementation is the reference: best of 3 runs each
    runs = {name: make(fwd) for name, fwd in variants.items()}
    best = min(runs, key=lambda name: min(timed(runs[name]) for _ in range(3)))
    return runs[best], best


def build(name, g):
    if name.startswith("matmul"):
        return matmul_case(name, g)
    if name == "layernorm_fwd_bwd":
        return layernorm_case(g)
    if name == "attention_fwd_bwd":
        return attention_case(g)
    raise ValueError(f"unknown case {name}")


def main():
    g = torch.Generator().manual_seed(0)
    cases = {}
    for line in sys.stdin:
        req = line.split()
        if not req:
            continue
        if req[0] == "threads":
            cases.clear()  # the attention variant is chosen per thread count
            reply = f"ok {set_threads(int(req[1]))}"
        elif req[0] == "warm":
            if req[1] not in cases:
                cases[req[1]] = build(req[1], g)
            fn, note = cases[req[1]]
            for _ in range(int(req[2])):
                fn()
            reply = f"ok {note}"
        elif req[0] == "time":
            reply = f"{timed(cases[req[1]][0]):.4f}"
        else:
            reply = f"error unknown request {req[0]}"
        print(reply, flush=True)


if __name__ == "__main__":
    main()
