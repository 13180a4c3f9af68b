// serve_ort.js - ONNX Runtime's forward on an exported model, timed alone.
//
// usage: node bench/serve_ort.js MODEL.onnx THREADS BATCH...
// One CPU session with THREADS intra-op threads (one inter-op thread); for
// each batch size, runs random float inputs for about a second after a
// warm-up and prints "RESULT batch B median_ms M samples_per_s S".
// onnxruntime-node comes from tools/onnxruntime (scripts/install-deps.sh).
"use strict";
const path = require("path");
const ort = require(path.join(__dirname, "..", "tools", "onnxruntime", "node_modules", "onnxruntime-node"));

async function main() {
  const [file, threads, ...batches] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(file, {
    intraOpNumThreads: Number(threads), interOpNumThreads: 1, executionMode: "sequential",
  });
  const input = session.inputNames[0];
  for (const b of batches.map(Number)) {
    const x = new Float32Array(b * 784).map(() => Math.random());
    const feeds = { [input]: new ort.Tensor("float32", x, [b, 784]) };
    for (let w = 0; w < 5; w++) await session.run(feeds);
    const times = [];
    const start = process.hrtime.bigint();
    while (times.length < 20 || Number(process.hrtime.bigint() - start) / 1e6 < 1000) {
      const t0 = process.hrtime.bigint();
      await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    times.sort((a, c) => a - c);
    const med = times[Math.floor(times.length / 2)];
    console.log(`RESULT batch ${b} median_ms ${med.toFixed(4)} samples_per_s ${(b / med * 1e3).toFixed(0)}`);
  }
}

main().catch((e) => {
  console.error(`serve_ort: ${e.message}`);
  process.exit(1);
});
