#!/usr/bin/python3
"""PyTorch side of bench/mlp_epoch.c: one Fashion-MNIST epoch of the MLP.

Usage: mlp_epoch_torch.py THREADS WARMUP_STEPS

Reads the Debian package's IDX files with gzip + numpy, normalises with
(x/255 - 0.2860)/0.3530 as Tessera does, holds out the last 10% of the
training file for validation, and trains 784-256-128-10 (ReLU) with AdamW
(lr 1e-3, weight decay 0.01 on the matrices only, cosine schedule with 100
warm-up steps as in examples/mlp_fashion.json), batch 128, shuffled each
epoch, last incomplete batch dropped, loss.item() each step. WARMUP_STEPS
steps run before the timed epoch. Prints
"RESULT epoch_ms=.. load_ms=.. steps=.. loss=..".
"""
import ctypes
import gzip
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
BATCH, VAL_FRACTION, EPOCHS, WARMUP_LR = 128, 0.1, 8, 100


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    threads, warmup = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    # Debian's torch calls the system OpenBLAS, which set_num_threads does not reach
    ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(threads)
    torch.manual_seed(1)
    t0 = time.perf_counter()
    images = read_idx(f"{DIR}/train-images-idx3-ubyte.gz")
    labels = read_idx(f"{DIR}/train-labels-idx1-ubyte.gz")
    lut = ((np.arange(256, dtype=np.float32) / 255.0 - MEAN) / STD).astype(np.float32)
    x = torch.from_numpy(lut[images].reshape(len(images), -1))
    y = torch.from_numpy(labels.astype(np.int64))
    n_train = len(x) - int(round(len(x) * VAL_FRACTION))
    x, y = x[:n_train], y[:n_train]
    load_ms = (time.perf_counter() - t0) * 1e3

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3)
    per_epoch = n_train // BATCH
    total = per_epoch * EPOCHS

    def lr_at(step):
        if step < WARMUP_LR:
            return (step + 1) / WARMUP_LR
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP_LR) / max(1, total - WARMUP_LR)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(1)
    step, t1, loss_v = 0, 0.0, 0.0
    epoch = 0
    while step < warmup + per_epoch:
        perm = torch.randperm(n_train, generator=gen)
        for b in range(per_epoch):
            if step == warmup:
                t1 = time.perf_counter()
            if step == warmup + per_epoch:
                break
            idx = perm[b * BATCH:(b + 1) * BATCH]
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            loss_v = loss.item()
            step += 1
        epoch += 1
    epoch_ms = (time.perf_counter() - t1) * 1e3
    print(f"RESULT epoch_ms={epoch_ms:.3f} load_ms={load_ms:.3f} steps={per_epoch} loss={loss_v:.4f}")


if __name__ == "__main__":
    main()
