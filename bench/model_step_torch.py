#!/usr/bin/python3
"""PyTorch side of bench/model_step.c: one training step of the GPT or CNN.

Usage: model_step_torch.py MODEL THREADS WARMUP STEPS, MODEL "gpt" or "cnn".
Builds the same model as Tessera (the plain torch modules of
tests/kernels/model_torch.py), AdamW with weight decay on ndim >= 2
parameters, one fixed batch; times zero_grad(set_to_none=True), forward,
cross-entropy, backward and the optimizer step. Memory is measured as in
model_step.c: peak RSS growth over the RSS before the model was built, and
the last step's peak RSS growth after malloc_trim(0) and a reset of the
high-water mark (echo 5 > /proc/self/clear_refs). Prints
"RESULT ms=<median> rss_mb=<...> step_rss_mb=<...>".
"""
import ctypes
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
import model_torch  # noqa: E402  (the reference modules)


def proc_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return -1.0


def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def clock():
    """The step clock: wall time, or the process's CPU time when
    BENCH_CLOCK=cpu (bench_model_step --cpu-time)."""
    return time.process_time() if os.environ.get("BENCH_CLOCK") == "cpu" else time.perf_counter()


def main():
    kind, threads, warmup, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    # Debian's torch calls the system OpenBLAS, which set_num_threads does not reach
    ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(threads)
    libc = ctypes.CDLL("libc.so.6")
    torch.manual_seed(0)
    if kind == "gpt":
        cfg = dict(n_layer=4, n_head=4, n_embd=256, vocab=256, block_size=128)
        x = torch.randint(0, 256, (8, 128))
        y = torch.randint(0, 256, (8 * 128,))
        classes = 256
    else:
        cfg = dict(in_ch=1, img=28, ch1=16, ch2=32, kernel=5, classes=10)
        x = torch.rand(64, 1, 28, 28)
        y = torch.arange(64) % 10
        classes = 10
    rss0 = proc_mb("VmRSS:")
    model = model_torch.GPT(cfg) if kind == "gpt" else model_torch.CNN(cfg)
    opt = torch.optim.AdamW(model_torch.groups(model, 0.01), lr=1e-3)
    times, hwm_before_last, step_rss = [], 0.0, 0.0
    for it in range(warmup + steps):
        last = it == warmup + steps - 1
        if last:
            hwm_before_last = proc_mb("VmHWM:")
            libc.malloc_trim(0)
            reset_hwm()
            rss_before = proc_mb("VmRSS:")
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, classes), y)
        loss.backward()
        opt.step()
        t1 = clock()
        del logits, loss
        if it >= warmup:
            times.append((t1 - t0) * 1e3)
        if last:
            step_rss = proc_mb("VmHWM:") - rss_before
    rss = max(proc_mb("VmHWM:"), hwm_before_last) - rss0
    print(f"RESULT ms={statistics.median(times):.3f} rss_mb={rss:.1f} step_rss_mb={step_rss:.1f}")


if __name__ == "__main__":
    main()
