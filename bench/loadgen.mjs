#!/usr/bin/env node
// kvserve's load client: N concurrent streaming /v1/completions clients, each generating T tokens at
// temperature 0 with ignore_eos, against a running server. Reports aggregate generation throughput and
// time-to-first-token percentiles.
//
//   node bench/loadgen.mjs --url http://127.0.0.1:8080 --clients 32 --tokens 64 [--shared-prefix-words 800]
//                          [--prompt-words 24] [--rounds 1] [--warmup 1] [--json]
//                          [--response-format json_object|SCHEMA.json]
//
// Before the timed rounds, --warmup W untimed requests (8 tokens, prompts no timed request shares) let the
// client's own JIT warm up, so its first-request compilation does not compete with the server inside a
// measured request. Distinct prompts by default; --shared-prefix-words W puts the same W-word prefix in front of every
// client's distinct suffix (the shared-system-prompt workload). --response-format constrains every timed request
// (json_object, or a JSON Schema read from a file as json_schema): a request then ends when its value is
// complete, so compare tok/s (tokens generated over wall time), not request counts.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8080' },
    clients: { type: 'string', default: '1' },
    tokens: { type: 'string', default: '64' },
    'shared-prefix-words': { type: 'string', default: '0' },
    'prompt-words': { type: 'string', default: '24' },
    rounds: { type: 'string', default: '1' },
    warmup: { type: 'string', default: '1' },
    json: { type: 'boolean', default: false },
    'response-format': { type: 'string', default: '' },
    help: { type: 'boolean', default: false },
  },
});
if (opt.help) {
  console.log('usage: loadgen.mjs --url URL --clients N --tokens T [--shared-prefix-words W] [--prompt-words P] [--rounds R] [--warmup W] [--json] [--response-format json_object|SCHEMA.json]');
  process.exit(0);
}
const clients = parseInt(opt.clients, 10);
const tokens = parseInt(opt.tokens, 10);
const prefixWords = parseInt(opt['shared-prefix-words'], 10);
const promptWords = parseInt(opt['prompt-words'], 10);
const rounds = parseInt(opt.rounds, 10);
const warmup = parseInt(opt.warmup, 10);
for (const [k, v] of Object.entries({ clients, tokens, prefixWords, promptWords, rounds, warmup })) {
  if (!Number.isFinite(v) || v < 0) { console.error(`loadgen: bad value for ${k}`); process.exit(2); }
}

// Deterministic word stream (a small LCG over a fixed word list) so runs are comparable.
const WORDS = ('the a little girl boy dog cat sun park tree house ball red blue big small happy sad day night ' +
  'friend mom dad went saw played ran jumped looked found wanted loved said gave made took came home ' +
  'water sky bird flower garden school book toy cake apple rain wind snow star moon fish boat car').split(' ');
function words(n, seed) {
  let s = (seed * 2654435761 + 12345) >>> 0;
  const out = [];
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    out.push(WORDS[(s >>> 8) % WORDS.length]);
  }
  return out.join(' ');
}
const rfOpt = opt['response-format'];
const responseFormat = !rfOpt ? null : rfOpt === 'json_object' ? { type: 'json_object' }
  : { type: 'json_schema', json_schema: { name: 'bench', strict: true, schema: JSON.parse(readFileSync(rfOpt, 'utf8')) } };
const prefix = prefixWords > 0 ? words(prefixWords, 7) + '. ' : '';

async function one(i, round, maxTokens = tokens) {
  const prompt = round < 0 ? `Warm-up ${i}: ` + words(promptWords, 500000 + i)
    : prefix + `Story ${round}-${i}: ` + words(promptWords, 1000 + round * 997 + i);
  const t0 = performance.now();
  const r = await fetch(`${opt.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'bench', prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
      ...(responseFormat && round >= 0 ? { response_format: responseFormat } : {}),
    }),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  let ttft = null; let n = null; let buf = '';
  const dec = new TextDecoder();
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') continue;
      const j = JSON.parse(data);
      if (j.error) throw new Error(JSON.stringify(j.error));
      // The first chunk with text marks the first token; the usage chunk says how many were generated
      // (a chunk may carry several tokens when the client reads slower than the server writes).
      if (ttft === null && j.choices && j.choices.length && j.choices[0].text) ttft = performance.now() - t0;
      if (j.usage) n = j.usage.completion_tokens;
    }
  }
  if (n === null) throw new Error('no usage chunk in the stream');
  return { ttft, total: performance.now() - t0, n };
}

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

for (let w = 0; w < warmup; w++) await one(w, -1, 8);
const results = [];
const tStart = performance.now();
for (let round = 0; round < rounds; round++) {
  results.push(...await Promise.all(Array.from({ length: clients }, (_, i) => one(i, round))));
}
const wall = (performance.now() - tStart) / 1000;
const gen = results.reduce((a, r) => a + r.n, 0);
const ttfts = results.map((r) => r.ttft).filter((x) => x !== null).sort((a, b) => a - b);
const out = {
  clients, tokens, rounds, shared_prefix_words: prefixWords, response_format: rfOpt || 'none',
  requests: results.length, generated_tokens: gen, wall_s: +wall.toFixed(3),
  tok_s: +(gen / wall).toFixed(1),
  ttft_ms: { p50: +pct(ttfts, 50).toFixed(1), p95: +pct(ttfts, 95).toFixed(1), max: +ttfts[ttfts.length - 1].toFixed(1) },
};
if (opt.json) console.log(JSON.stringify(out));
else {
  console.log(`clients ${clients}, ${tokens} tokens each, shared prefix ${prefixWords} words, ${rounds} round(s)`);
  console.log(`generated ${gen} tokens in ${wall.toFixed(2)} s: ${out.tok_s} tok/s aggregate`);
  console.log(`TTFT p50 ${out.ttft_ms.p50} ms, p95 ${out.ttft_ms.p95} ms, max ${out.ttft_ms.max} ms`);
}
