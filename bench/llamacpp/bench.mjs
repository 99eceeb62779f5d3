// bench.mjs: llama.cpp's CPU backend timed like llama-bench, beside `lumen perf`.
//
// Uses the prebuilt llama.cpp libraries that the npm package node-llama-cpp (3.22.1) ships in
// @node-llama-cpp/linux-x64 (ggml CPU variants chosen at load time by the CPU's features:
// haswell, zen4, ...). No CUDA, nothing built from source. Install: `npm install --omit=optional
// --ignore-scripts` in this folder (package-lock.json pins the versions).
//
// Tests, as llama-bench defines them:
//   pp<P>: one evaluation of P prompt tokens into an empty context, tokens/s = P / time;
//   tg<N>: N evaluations of one token each (no sampling), after an empty context, tokens/s =
//          N / time.
// Each test runs once untimed (warm-up) and then -r times; the output gives mean ± std and
// min - max, like `lumen perf`. Token ids are deterministic pseudo-random ids (xorshift, as
// lumen perf), so the prompt is not text. Threads: getLlama({maxThreads: 0}) makes the context's
// `threads` the exact number used (node-llama-cpp's docs), set with -t.
//
// usage: node bench.mjs --model FILE.gguf [-t 2] [-p 512] [-n 128] [-r 3] [--mmap 0|1]
//                       [--fa 0|1] [-o md|json]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function usage(out) {
    out.write(
        "usage: node bench.mjs --model FILE.gguf [-t 2] [-p 512] [-n 128] [-r 3] [--mmap 0|1]\n" +
        "                      [--fa 0|1] [-o md|json]\n\n" +
        "Times llama.cpp (node-llama-cpp's prebuilt CPU libraries) like llama-bench: pp<P> is one\n" +
        "evaluation of P tokens, tg<N> is N evaluations of one token; tokens per second, mean ± std\n" +
        "and min - max over the repetitions after one warm-up.\n\n" +
        "  --model FILE   GGUF file (for example one written by `lumen build`)\n" +
        "  -t N           threads (default 2; exact: maxThreads 0)\n" +
        "  -p P           prompt tokens of the prefill test (0 skips; default 512)\n" +
        "  -n N           decode steps of the generation test (0 skips; default 128)\n" +
        "  -r R           timed repetitions (default 3)\n" +
        "  --mmap 0|1     1: weights mmap'd (llama.cpp's default); 0: read into memory (default 0)\n" +
        "  --fa 0|1       flash attention (default 0, llama-bench's default)\n" +
        "  -o md|json     output format (default md)\n" +
        "  -h, --help     show this help\n");
}

function fail(msg) {
    process.stderr.write(`bench.mjs: ${msg}\n`);
    process.exit(2);
}

const opt = {model: null, t: 2, p: 512, n: 128, r: 3, mmap: 0, fa: 0, o: "md"};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
        if (i + 1 >= argv.length) fail(`${a} needs a value`);
        return argv[++i];
    };
    const int = (lo) => {
        const s = val(), v = Number(s);
        if (!Number.isInteger(v) || v < lo) fail(`${a} must be an integer >= ${lo} (got "${s}")`);
        return v;
    };
    if (a === "-h" || a === "--help") {
        usage(process.stdout);
        process.exit(0);
    } else if (a === "--model" || a === "-m") opt.model = val();
    else if (a === "-t") opt.t = int(1);
    else if (a === "-p") opt.p = int(0);
    else if (a === "-n") opt.n = int(0);
    else if (a === "-r") opt.r = int(1);
    else if (a === "--mmap") opt.mmap = int(0);
    else if (a === "--fa") opt.fa = int(0);
    else if (a === "-o") {
        opt.o = val();
        if (opt.o !== "md" && opt.o !== "json") fail("-o must be md or json");
    } else fail(`unknown argument "${a}" (see --help)`);
}
if (!opt.model) fail("--model is required");
if (!opt.p && !opt.n) fail("nothing to measure (-p 0 and -n 0)");

function ids(count, vocab, seed) { // xorshift64, ids in [1, vocab)
    let s = BigInt(seed);
    const mask = (1n << 64n) - 1n, out = [];
    for (let i = 0; i < count; i++) {
        s ^= (s << 13n) & mask;
        s ^= s >> 7n;
        s ^= (s << 17n) & mask;
        out.push(1 + Number(s % BigInt(vocab - 1)));
    }
    return out;
}

function stats(x) {
    const n = x.length, mean = x.reduce((a, b) => a + b, 0) / n;
    const std = n > 1 ? Math.sqrt(x.reduce((a, b) => a + (b - mean) ** 2, 0) / (n - 1)) : 0;
    return {mean, std, min: Math.min(...x), max: Math.max(...x), samples: x};
}

const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error});
const t0 = performance.now();
const model = await llama.loadModel({modelPath: opt.model, gpuLayers: 0, useMmap: opt.mmap !== 0});
const loadS = (performance.now() - t0) / 1000;
const ctxSize = Math.max(256, opt.p + opt.n);
const context = await model.createContext({
    contextSize: ctxSize,
    batchSize: Math.max(opt.p, 1),
    threads: {ideal: opt.t, min: opt.t},
    flashAttention: opt.fa !== 0,
    sequences: 1,
});
const seq = context.getSequence();
const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 151643;
const prompt = ids(Math.max(opt.p, opt.n), nVocab, 42);

const rows = [];
async function run(name, fn) {
    const x = [];
    for (let rep = -1; rep < opt.r; rep++) {
        await seq.clearHistory();
        const tps = await fn();
        if (rep >= 0) x.push(tps);
    }
    rows.push({test: name, ...stats(x)});
}
if (opt.p)
    await run(`pp${opt.p}`, async () => {
        const s = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, opt.p));
        return opt.p / ((performance.now() - s) / 1000);
    });
if (opt.n)
    await run(`tg${opt.n}`, async () => {
        const s = performance.now();
        for (let i = 0; i < opt.n; i++) await seq.evaluateWithoutGeneratingNewTokens([prompt[i]]);
        return opt.n / ((performance.now() - s) / 1000);
    });

const fileName = opt.model.split("/").pop();
const info = {
    model: fileName,
    llama_cpp: llama.llamaCppRelease,
    build: llama.buildType,
    threads: opt.t,
    context_threads: context.currentThreads,
    mmap: model.useMmap,
    flash_attention: context.flashAttention,
    load_s: loadS,
    system_info: llama.systemInfo,
};
if (opt.o === "json") {
    process.stdout.write(JSON.stringify({...info, results: rows}, null, 1) + "\n");
} else {
    process.stdout.write(`llama.cpp ${JSON.stringify(info.llama_cpp)} (${info.build}, node-llama-cpp 3.22.1); ` +
        `model ${fileName} loaded in ${loadS.toFixed(2)} s, weights ${info.mmap ? "mmap'd" : "read into memory"}, ` +
        `${info.context_threads} threads, flash attention ${info.flash_attention}\n`);
    process.stdout.write(`system_info: ${info.system_info}\n\n`);
    process.stdout.write("| model | threads | weights | test | t/s (mean ± std) | t/s (min - max) |\n");
    process.stdout.write("| --- | ---: | --- | --- | ---: | ---: |\n");
    for (const r of rows)
        process.stdout.write(`| ${fileName} | ${opt.t} | ${info.mmap ? "mmap" : "ram"} | ${r.test} | ` +
            `${r.mean.toFixed(2)} ± ${r.std.toFixed(2)} | ${r.min.toFixed(2)} - ${r.max.toFixed(2)} |\n`);
}
await context.dispose();
await model.dispose();
await llama.dispose();
