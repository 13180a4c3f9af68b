"""PyTorch side of tests/kernels/test_optim_torch.c.

Usage: /usr/bin/python3 optim_torch.py DIR CASE

DIR holds what the C test wrote: layout.txt (one "name offset dim..." line
per parameter of the flat buffer), params.f32 (initial flat parameters),
grads.f32 (one flat gradient per step), lrs.f64 (the lr of each step) and
case.txt (the optimizer settings of CASE as "key value" lines). This script
builds the same parameters as torch tensors, puts those with ndim >= 2 and no
"bias"/"ln" in their name into a weight-decay group and the rest into a group
without decay, runs the steps with torch.optim and writes the flat parameters
after every step to DIR/torch_CASE.f32. Exit status 3 when torch is missing.
"""
import array
import sys

try:
    import torch
except Exception as e:  # the C test turns this into a failure
    print("optim_torch: cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(3)


def read_f(path, dtype):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=dtype).clone()


def main():
    d, case = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    layout = []
    with open(d + "/layout.txt") as f:
        for line in f:
            parts = line.split()
            layout.append((parts[0], int(parts[1]), [int(x) for x in parts[2:]]))
    opts = {}
    with open(d + "/case.txt") as f:
        for line in f:
            k, v = line.split()
            opts[k] = float(v)
    flat = read_f(d + "/params.f32", torch.float32)
    lrs = read_f(d + "/lrs.f64", torch.float64).tolist()
    n = flat.numel()
    grads = read_f(d + "/grads.f32", torch.float32).view(len(lrs), n)

    params, decay, no_decay = [], [], []
    for name, off, shape in layout:
        numel = 1
        for s in shape:
            numel *= s
        p = flat[off:off + numel].clone().view(shape).requires_grad_(True)
        params.append((name, off, numel, p))
        if len(shape) >= 2 and "bias" not in name and "ln" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    wd = opts["weight_decay"]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if case in ("adamw", "adam"):
        cls = torch.optim.AdamW if case == "adamw" else torch.optim.Adam
        opt = cls(groups, lr=lrs[0], betas=(opts["beta1"], opts["beta2"]), eps=opts["eps"])
    elif case in ("sgd", "nesterov"):
        opt = torch.optim.SGD(groups, lr=lrs[0], momentum=opts["momentum"], dampening=opts["dampening"],
                              nesterov=case == "nesterov")
    else:
        print("optim_torch: unknown case %s" % case, file=sys.stderr)
        sys.exit(2)

    out = []
    for t, lr in enumerate(lrs):
        for name, off, numel, p in params:
            p.grad = grads[t, off:off + numel].clone().view(p.shape)
        if opts["max_norm"] > 0:
            torch.nn.utils.clip_grad_norm_([p for _, _, _, p in params], opts["max_norm"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        now = flat.clone()
        for name, off, numel, p in params:
            now[off:off + numel] = p.detach().reshape(-1)
        out.append(now)
    with open(d + "/torch_%s.f32" % case, "wb") as f:
        f.write(array.array("f", torch.stack(out).reshape(-1).tolist()).tobytes())


if __name__ == "__main__":
    main()
