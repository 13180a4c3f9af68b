// ONNX Runtime (onnxruntime-node, CPU) on Tessera's exports (tests/launch/test_onnx.c).
//
// Usage: node onnx_ort.js DIR TAG... For each TAG, runs DIR/TAG.onnx on the
// "input" of every DIR/TAG_io<k>.safetensors and compares with the "logits"
// Tessera computed: max |ort - tessera| / max(|tessera|) must be <= 1e-4.
// onnxruntime-node is looked for in $TESSERA_ORT_DIR, then
// <source>/tools/onnxruntime (scripts/install-deps.sh installs it there).
// Exits 1 on a mismatch, 2 when ONNX Runtime cannot be loaded.
"use strict";
const fs = require("fs");
const path = require("path");

const TOL = 1e-4;
const src = process.env.TESSERA_SOURCE_DIR || path.join(__dirname, "..", "..");
const ortDir = process.env.TESSERA_ORT_DIR || path.join(src, "tools", "onnxruntime");
let ort;
try {
  ort = require(path.join(ortDir, "node_modules", "onnxruntime-node"));
} catch (e) {
  console.log(`onnx_ort: cannot load onnxruntime-node from ${ortDir}: ${e.message} (run scripts/install-deps.sh)`);
  process.exit(2);
}

// {name: {dtype, shape, data (typed array)}} of a safetensors file.
function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString());
  const base = 8 + n, out = {};
  for (const [name, e] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [b, end] = e.data_offsets;
    const bytes = buf.subarray(base + b, base + end);
    const copy = new Uint8Array(bytes).buffer;
    const data = e.dtype === "F32" ? new Float32Array(copy) : e.dtype === "I64" ? new BigInt64Array(copy) : null;
    if (!data) throw new Error(`${file}: ${name} has dtype ${e.dtype}`);
    out[name] = { dtype: e.dtype === "F32" ? "float32" : "int64", shape: e.shape, data };
  }
  return out;
}

async function main() {
  const [dir, ...tags] = process.argv.slice(2);
  let failed = false;
  for (const tag of tags) {
    const session = await ort.InferenceSession.create(path.join(dir, `${tag}.onnx`), { intraOpNumThreads: 1 });
    for (let k = 0; fs.existsSync(path.join(dir, `${tag}_io${k}.safetensors`)); k++) {
      const io = readSafetensors(path.join(dir, `${tag}_io${k}.safetensors`));
      const x = io.input, want = io.logits;
      const feeds = { [session.inputNames[0]]: new ort.Tensor(x.dtype, x.data, x.shape) };
      const got = (await session.run(feeds)).logits;
      let maxRef = 1e-6, maxDiff = 0;
      const sameShape = got.dims.join(",") === want.shape.join(",");
      for (let i = 0; sameShape && i < want.data.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(want.data[i]));
        maxDiff = Math.max(maxDiff, Math.abs(got.data[i] - want.data[i]));
      }
      const err = maxDiff / maxRef, ok = sameShape && err <= TOL;
      console.log(`  ${tag} input ${session.inputNames[0]} [${x.shape}] -> logits [${got.dims}]: ` +
                  `max |ort - tessera| / max|tessera| = ${err.toExponential(2)}${ok ? "" : "  FAIL"}`);
      failed = failed || !ok;
    }
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`onnx_ort: ${e.message}`);
  process.exit(1);
});
