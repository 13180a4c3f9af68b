"""Reads a safetensors file written by Tessera and writes one from PyTorch,
both by the format's spec alone (json + struct + torch.frombuffer), for
test_safetensors_torch.c.

usage: safetensors_torch.py TESSERA_FILE OUT_FILE
Exit status 0 when every value matches; non-zero (with a message) otherwise,
including when torch cannot be imported.
"""
import json
import struct
import sys

try:
    import torch
except Exception as e:  # the test must fail, not skip, without torch
    print("cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(3)

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
          "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}
NAMES = {v: k for k, v in DTYPES.items()}


def expected():
    """The tensors test_safetensors_torch.c writes (same formulas)."""
    return {
        "encoder.layers.0.weight": (torch.arange(12, dtype=torch.float32) * 0.25 - 1).reshape(3, 4),
        "f64": torch.arange(6, dtype=torch.float64).reshape(2, 3) / 3,
        "bf16": (torch.arange(8, dtype=torch.float32) * 0.5 - 2).to(torch.bfloat16),
        "i32": torch.arange(5, dtype=torch.int32) * -7,
        "i64": torch.arange(4, dtype=torch.int64) * (1 << 40) + 1,
        "u8": (torch.arange(10, dtype=torch.int64) * 37 % 256).to(torch.uint8),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if (8 + n) % 8 != 0:
        raise SystemExit("header length %d leaves the data unaligned" % n)
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        buf = bytearray(data[b:end])
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, meta


def write(path, tensors, meta):
    header, off, blobs = {"__metadata__": meta}, 0, []
    for name, t in tensors.items():
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    got, meta = read(sys.argv[1])
    want = expected()
    if sorted(got) != sorted(want):
        raise SystemExit("names differ: %s vs %s" % (sorted(got), sorted(want)))
    for name, w in want.items():
        g = got[name]
        if g.dtype != w.dtype or list(g.shape) != list(w.shape) or not torch.equal(g, w):
            raise SystemExit("tensor %s differs: got %s %s %s, want %s %s %s"
                             % (name, g.dtype, list(g.shape), g, w.dtype, list(w.shape), w))
    if meta.get("written_by") != "tessera":
        raise SystemExit("metadata differs: %s" % meta)
    # from PyTorch: a transposed (non-contiguous) tensor and every dtype
    out = {
        "decoder.proj.weight": (torch.arange(6, dtype=torch.float32) * 1.5).reshape(2, 3).t(),
        "h": torch.tensor([1.0, -2.0, 1e-300], dtype=torch.float64),
        "b": torch.tensor([0.5, -3.0, 256.0], dtype=torch.bfloat16),
        "i": torch.tensor([[-1, 2, 3], [4, 5, -(1 << 50)]], dtype=torch.int64),
        "idx": torch.tensor([7, -8, 9], dtype=torch.int32),
        "m": torch.tensor([0, 128, 255], dtype=torch.uint8),
    }
    write(sys.argv[2], out, {"format": "pt", "written_by": "torch %s" % torch.__version__})
    print("ok: read %d tensors, wrote %d" % (len(got), len(out)))


main()
