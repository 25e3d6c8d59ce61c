// Next-token logits from a real llama.cpp (the prebuilt CPU build of the npm package
// node-llama-cpp, third_party/npm-llama-cpp) for forja's GGUF export tests (tests/interop/test_gguf_llama_cpp.cpp).
//
//   node llama_cpp_logits.mjs MODEL.gguf ADAPTER.gguf|- IDS_JSON OUT.json [TEXT]
//
// Loads the model (and the LoRA adapter unless "-"), evaluates the token ids of IDS_JSON (a JSON
// array) in one sequence with an fp32 KV cache, and writes {"logits": [[...vocab] per position],
// "tokens": llama.cpp's tokenisation of TEXT (when given), "n_vocab": ...} to OUT.json.
// Errors print to stderr and exit 1.
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const {getLlama, LlamaLogLevel} = await import(
  path.join(here, "..", "..", "third_party", "npm-llama-cpp", "node_modules", "node-llama-cpp", "dist", "index.js"));

const [modelPath, adapterPath, idsPath, outPath, text] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node llama_cpp_logits.mjs MODEL.gguf ADAPTER.gguf|- IDS_JSON OUT.json [TEXT]");
  process.exit(2);
}
try {
  // CPU only, prebuilt binaries only: never build llama.cpp from source or download anything.
  const llama = await getLlama({gpu: false, build: "never", usePrebuiltBinaries: true,
                                logLevel: LlamaLogLevel.error});
  const model = await llama.loadModel({modelPath, gpuLayers: 0});
  const ids = JSON.parse(fs.readFileSync(idsPath, "utf8"));
  const context = await model.createContext({
    contextSize: Math.max(64, ids.length + 8), batchSize: Math.max(64, ids.length + 8), threads: 2,
    flashAttention: false,
    // fp32 KV cache: the default f16 cache would round K and V, the comparison is against fp32.
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
    lora: adapterPath === "-" ? undefined : {adapters: [{filePath: adapterPath, scale: 1}]},
  });
  const sequence = context.getSequence();
  const input = ids.map((id) => [id, {generateNext: {logits: true}}]);
  const results = await sequence.controlledEvaluate(input);
  const n_vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
  const logits = results.map((r) => {
    // logits: a Map token -> logit (sorted by value): back to vocabulary order.
    const row = new Array(n_vocab).fill(null);
    for (const [token, value] of r.next.logits) row[token] = value;
    return row;
  });
  const out = {logits, n_vocab};
  if (text !== undefined) out.tokens = Array.from(model.tokenize(text));
  fs.writeFileSync(outPath, JSON.stringify(out));
  await context.dispose();
  await model.dispose();
  await llama.dispose();
} catch (e) {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
}
