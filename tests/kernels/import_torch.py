#!/usr/bin/python3
"""PyTorch side of tests/kernels/test_weights_torch.c and tests/launch/test_import.c.

Usage: import_torch.py DIR. Builds, with torch's own initialisation
(torch.manual_seed(0)), the GPT (vocab 256, block_size 16, 2 layers, 2
heads, n_embd 32) and the CNN (1x28x28, 4/8 channels, kernel 5, 10 classes)
of tests/kernels/model_torch.py, and writes into DIR as safetensors:
  gpt_torch, cnn_torch   the state_dict under PyTorch's names
  gpt_hf                 the GPT under Hugging Face GPT-2 names (prefix
                         "transformer.", Conv1D weights stored [in, out], the
                         attention mask buffers and a tied lm_head.weight)
  gpt_missing            gpt_torch without ln_f.bias
  gpt_stage0             gpt_torch's embeddings and first block only, as a
                         pipeline's first stage holds them
  gpt_hf_f16             gpt_hf in half precision (F16), wte.weight's first
                         values set to the smallest and (negated) largest
                         subnormal and -0
  gpt_hf_f16_f32         the same values as torch's float() of them (F32)
  gpt_hf_f16_inf         gpt_hf_f16 with h.1.mlp.c_fc.weight's element 5 inf
  gpt_io, cnn_io         "input" (token ids I64 [2, 11] / images F32 [3, 1, 28, 28])
                         and torch's "logits" on it
Exits 2 if torch cannot be imported.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import torch
    import model_torch as mt
except Exception as exc:  # noqa: BLE001 - any import failure fails the test
    print(f"import_torch: cannot import torch with {sys.executable}: {exc}")
    sys.exit(2)

GPT = {"vocab": 256, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}
CNN = {"in_ch": 1, "img": 28, "ch1": 4, "ch2": 8, "kernel": 5, "classes": 10}
CODES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
         np.dtype(np.uint8): "U8"}


def write_safetensors(path, tensors):
    """Writes {name: tensor} as a safetensors file, in the given order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().numpy())
        header[name] = {"dtype": CODES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def hf_names(state, n_layer, block):
    """The GPT's state_dict as Hugging Face's GPT2LMHeadModel names it."""
    out = {}
    parts = {"ln1": "ln_1", "ln2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
             "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for name, t in state.items():
        hf = name
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            mod, kind = rest.rsplit(".", 1)
            hf = f"h.{i}.{parts[mod]}.{kind}"
            if kind == "weight" and t.dim() == 2:
                t = t.t().contiguous()  # Conv1D: [in, out]
        out["transformer." + hf] = t
    for i in range(n_layer):
        out[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(block, block)).view(1, 1, block, block)
        out[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    out["lm_head.weight"] = state["wte.weight"]
    return out


def main():
    d = sys.argv[1]
    torch.manual_seed(0)
    gpt, cnn = mt.GPT(GPT), mt.CNN(CNN)
    for m in (gpt, cnn):
        with torch.no_grad():  # nonzero biases and norms, so a dropped or swapped one shows
            for name, p in m.named_parameters():
                if p.dim() == 1:
                    p.uniform_(-0.5, 0.5)
                    if name.endswith("weight"):
                        p.add_(1.0)
    gs = dict(gpt.state_dict())
    write_safetensors(f"{d}/gpt_torch.safetensors", gs)
    write_safetensors(f"{d}/gpt_hf.safetensors", hf_names(gs, GPT["n_layer"], GPT["block_size"]))
    write_safetensors(f"{d}/gpt_missing.safetensors", {k: v for k, v in gs.items() if k != "ln_f.bias"})
    stage0 = {k: v for k, v in gs.items() if k.startswith(("wte.", "wpe.", "blocks.0."))}
    write_safetensors(f"{d}/gpt_stage0.safetensors", stage0)
    half = {k: v.half() for k, v in hf_names(gs, GPT["n_layer"], GPT["block_size"]).items()}
    half["transformer.wte.weight"][0, :3] = torch.tensor([2.0**-24, -1023 * 2.0**-24, -0.0])
    write_safetensors(f"{d}/gpt_hf_f16.safetensors", half)
    write_safetensors(f"{d}/gpt_hf_f16_f32.safetensors", {k: v.float() for k, v in half.items()})
    half["transformer.h.1.mlp.c_fc.weight"].view(-1)[5] = float("inf")
    write_safetensors(f"{d}/gpt_hf_f16_inf.safetensors", half)
    write_safetensors(f"{d}/cnn_torch.safetensors", dict(cnn.state_dict()))
    ids = torch.randint(0, GPT["vocab"], (2, 11))
    img = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        write_safetensors(f"{d}/gpt_io.safetensors", {"input": ids, "logits": gpt(ids)})
        write_safetensors(f"{d}/cnn_io.safetensors", {"input": img, "logits": cnn(img)})


if __name__ == "__main__":
    main()
