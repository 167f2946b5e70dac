// Soak test (issue 14): streaming load with random client aborts against a kvserve whose KV pool is tiny and
// whose parallelism is high, so that requests are preempted and recomputed all the time. Checks:
//   - determinism: every temperature-0 request that completes returns the same text, finish_reason and token
//     count as the same request run alone (taken first, one at a time, on the same server);
//   - no leak: after warm-up the server's RSS stays within a bound, and at the end (idle) the KV blocks are all
//     back (used 0, free + cached = total) and its open file descriptors are what they were at the start;
//   - idle metrics: running and waiting back to 0; preemptions happened (else the run tested nothing).
// `make soak` runs it (SOAK_MINUTES, default 5) against build/kvserve; `make test-tsan` runs it briefly against
// a ThreadSanitizer build (SOAK_TSAN=1: ThreadSanitizer reports fail the run, RSS is not checked).
//
// Environment: KVSERVE_BINARY (default ../../build/kvserve), KVSERVE_SHARED (stories260K; otherwise a tiny
// random model from `kvserve mkmodel`), SOAK_MINUTES (default 5; fractions allowed), SOAK_CLIENTS (default 24),
// SOAK_ABORT (fraction of requests aborted, default 0.25), SOAK_TSAN, SOAK_SEED, SOAK_JSON (a file to write the
// figures to), SOAK_PROBES (default 0: that many more clients run issue 30's hostile probes of probes.mjs beside the
// load; then a warm-up of 20 s of the load and each probe once comes first, and the idle RSS at the end must come
// back within 10% + 2 MiB of the idle RSS after that warm-up). Prints one summary and exits 1 when a check fails.
import http from 'node:http';
import { readFileSync, readdirSync, readlinkSync, writeFileSync } from 'node:fs';
import { startServer, testModel, metric } from '../e2e/server.mjs';
import { PROBES, probeWorker } from './probes.mjs';

const MINUTES = Number(process.env.SOAK_MINUTES || 5);
const CLIENTS = Number(process.env.SOAK_CLIENTS || 24);
const ABORT = Number(process.env.SOAK_ABORT ?? 0.25);
const TSAN = process.env.SOAK_TSAN === '1';
const N_PROBES = Number(process.env.SOAK_PROBES || 0);
let seed = Number(process.env.SOAK_SEED || 14);
const rand = () => { // xorshift32: a reproducible choice sequence for a given seed
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];

// ---- the server: 24 blocks of 16 tokens (384 tokens) for up to 16 sequences: requests of 60-200 tokens
// overflow it as soon as a few run together.
const SERVER_FLAGS = ['--parallel', '16', '--batch-tokens', '128', '--kv-blocks', '24', '--block-size', '16',
  '--threads', '2', '--ctx-size', '512', '--log-format', 'none', '--max-queue', '1024'];

// ---- the requests: a fixed set of specs; each has its reference (run alone) ----------------------------------
const WORDS = ('once upon a time there was little girl named lily she loved to play in the park with her dog ' +
  'one day they found big red ball under tree and were very happy sun was shining birds sang tom came too').split(' ');
const routeOf = (s) => `/v1/${s.kind === 'chat' ? 'chat/completions' : 'completions'}`;

function makeSpecs() {
  const specs = [];
  for (let i = 0; i < 24; i++) {
    const n = 4 + Math.floor(rand() * 60);
    const words = [];
    for (let k = 0; k < n; k++) words.push(pick(WORDS));
    const text = words.join(' ');
    const max = 16 + Math.floor(rand() * 96);
    specs.push({ kind: 'completions', body: { prompt: text, max_tokens: max, temperature: 0 } });
    if (i % 2 === 0)
      specs.push({ kind: 'chat', body: { messages: [{ role: 'user', content: text }], max_tokens: max, temperature: 0 } });
  }
  return specs;
}

const agentless = { agent: false }; // a new connection per request: connection churn is part of the soak
function request(base, path, body, { stream = false, abortAfterMs = -1, abortAfterChunks = -1 } = {}) {
  return new Promise((resolve) => {
    const u = new URL(path, base);
    const data = JSON.stringify(stream ? { ...body, stream: true, stream_options: { include_usage: true } } : body);
    let done = false;
    const finish = (r) => { if (!done) { done = true; clearTimeout(timer); resolve(r); } };
    const req = http.request({ ...agentless, host: u.hostname, port: u.port, path: u.pathname, method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } }, (res) => {
      let buf = '', chunks = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        chunks++;
        if (abortAfterChunks >= 0 && chunks > abortAfterChunks) { req.destroy(); finish({ aborted: true }); }
      });
      res.on('end', () => finish({ status: res.statusCode, text: buf }));
      res.on('error', () => finish({ aborted: true, error: true }));
      res.on('aborted', () => finish({ aborted: true }));
    });
    req.on('error', (e) => finish({ aborted: done ? true : abortAfterMs >= 0 || abortAfterChunks >= 0, error: e.message }));
    const timer = abortAfterMs >= 0 ? setTimeout(() => { req.destroy(); finish({ aborted: true }); }, abortAfterMs) : null;
    req.end(data);
  });
}

// The result of a finished request as {text, finish, tokens} per choice, from a JSON body or an SSE stream.
function parseResult(kind, stream, text) {
  if (!stream) {
    const j = JSON.parse(text);
    return { choices: j.choices.map((c) => ({ text: kind === 'chat' ? c.message.content : c.text, finish: c.finish_reason })),
      tokens: j.usage.completion_tokens };
  }
  const out = [];
  let tokens = -1, sawDone = false;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const p = line.slice(6);
    if (p === '[DONE]') { sawDone = true; continue; }
    const j = JSON.parse(p);
    if (j.error) throw new Error(`stream error: ${p}`);
    if (j.usage) tokens = j.usage.completion_tokens;
    for (const c of j.choices || []) {
      const o = (out[c.index] ||= { text: '', finish: null });
      o.text += (kind === 'chat' ? c.delta?.content : c.text) || '';
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  if (!sawDone) throw new Error('stream without [DONE]');
  return { choices: out, tokens };
}

const procStatus = (pid) => {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) * 1024 : 0;
};
const openFds = (pid) => readdirSync(`/proc/${pid}/fd`).length;
// What each open fd is (socket:[inode], anon_inode:[eventfd], a path), to name the ones that stayed open.
const fdTargets = (pid) => readdirSync(`/proc/${pid}/fd`).map((f) => {
  try { return readlinkSync(`/proc/${pid}/fd/${f}`).replace(/\[\d+\]$/, ''); } catch { return '?'; }
});
const extra = (a, b) => { const m = new Map(); for (const x of a) m.set(x, (m.get(x) || 0) + 1);
  return b.filter((x) => { const k = m.get(x) || 0; if (k > 0) { m.set(x, k - 1); return false; } return true; }); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const MiB = (b) => (b / 1048576).toFixed(1);

async function metrics(base) {
  const r = await new Promise((resolve, reject) => {
    http.get(`${base}/metrics`, { agent: false }, (res) => {
      let b = ''; res.setEncoding('utf8'); res.on('data', (d) => { b += d; }); res.on('end', () => resolve(b));
    }).on('error', reject);
  });
  const g = (n) => metric(r, n);
  return { running: g('kvserve:num_requests_running'), waiting: g('kvserve:num_requests_waiting'),
    total: g('kvserve:kv_blocks_total'), used: g('kvserve:kv_blocks_used'), cached: g('kvserve:kv_blocks_cached'),
    free: g('kvserve:kv_blocks_free'), preemptions: g('kvserve:num_preemptions_total'),
    truncations: g('kvserve:kv_pool_truncations_total') };
}

async function main() {
  const model = testModel();
  const env = TSAN ? { TSAN_OPTIONS: process.env.TSAN_OPTIONS || 'halt_on_error=0 second_deadlock_stack=1' } : {};
  const srv = await startServer(model.path, SERVER_FLAGS, env);
  const pid = srv.child.pid;
  const failures = [];
  const fail = (msg) => { if (failures.length < 20) failures.push(msg); else if (failures.length === 20) failures.push('...'); };
  const stats = { requests: 0, completed: 0, aborted: 0, compared: 0, mismatches: 0, errors: 0, streamed: 0 };
  const figures = { model: model.path, minutes: MINUTES, clients: CLIENTS, server_flags: SERVER_FLAGS.join(' ') };
  try {
    // 1. references, one at a time
    const specs = makeSpecs();
    const t0 = Date.now();
    for (const s of specs) {
      const r = await request(srv.base, routeOf(s), s.body);
      if (r.status !== 200) throw new Error(`reference request failed: ${r.status} ${r.text}`);
      s.ref = parseResult(s.kind, false, r.text);
    }
    const m0 = await metrics(srv.base);
    if (m0.preemptions !== 0) fail(`references were preempted (${m0.preemptions}): they must run alone`);
    figures.references = specs.length;
    figures.reference_seconds = (Date.now() - t0) / 1000;
    stats.probes = {};
    if (N_PROBES > 0) {
      // a warm-up, so that the baseline holds what a first use allocates (the engine's step buffers at the
      // largest batch, the workers' stacks): 20 s of the same streaming load, and each probe once
      const warmDeadline = Date.now() + 20000;
      await Promise.all(Array.from({ length: CLIENTS }, async () => {
        while (Date.now() < warmDeadline) {
          const s = pick(specs);
          await request(srv.base, routeOf(s), s.body, { stream: true });
        }
      }));
      for (const [name, probe] of Object.entries(PROBES)) {
        await probe({ port: srv.port, pid, rand, fail });
        stats.probes[name] = 1;
      }
      await sleep(3000); // the server trims its heap once idle
    }
    await sleep(1000); // the references' last connections close
    const fdStart = openFds(pid), fdsStart = fdTargets(pid), rssStart = procStatus(pid);

    // 2. load: CLIENTS workers until the deadline
    const tLoad = Date.now(), deadline = tLoad + MINUTES * 60000, warmEnd = tLoad + Math.max(20000, MINUTES * 60000 * 0.2);
    let rssWarm = 0, rssMax = 0;
    const rssSamples = [];
    const sampler = setInterval(() => {
      const r = procStatus(pid);
      rssMax = Math.max(rssMax, r);
      if (Date.now() >= warmEnd) { if (!rssWarm) rssWarm = r; rssSamples.push(r); }
    }, 1000);
    const worker = async () => {
      while (Date.now() < deadline) {
        const s = pick(specs);
        const stream = rand() < 0.7;
        const n = !stream && s.kind === 'completions' && rand() < 0.15 ? 2 : 1;
        const opts = { stream };
        if (rand() < ABORT) {
          if (stream && rand() < 0.5) opts.abortAfterChunks = Math.floor(rand() * 12);
          else opts.abortAfterMs = Math.floor(rand() * 1500);
        }
        stats.requests++;
        if (stream) stats.streamed++;
        const body = n > 1 ? { ...s.body, n } : s.body;
        const r = await request(srv.base, routeOf(s), body, opts);
        if (r.aborted) { stats.aborted++; continue; }
        if (r.status !== 200) { stats.errors++; fail(`status ${r.status}: ${String(r.text).slice(0, 300)}`); continue; }
        stats.completed++;
        let got;
        try { got = parseResult(s.kind, stream, r.text); } catch (e) { stats.errors++; fail(`bad answer: ${e.message}`); continue; }
        stats.compared++;
        const ref = s.ref.choices[0];
        let same = got.choices.length === n && got.tokens === s.ref.tokens * n;
        for (const c of got.choices) same &&= c && c.text === ref.text && c.finish === ref.finish;
        if (!same) {
          stats.mismatches++;
          fail(`differs from alone (${s.kind}, stream ${stream}, n ${n}, max_tokens ${s.body.max_tokens}): ` +
               `got ${JSON.stringify(got).slice(0, 200)} want ${JSON.stringify(s.ref).slice(0, 200)}`);
        }
      }
    };
    const probers = Array.from({ length: N_PROBES }, () =>
      probeWorker({ port: srv.port, pid, rand, fail, deadline, stats }));
    await Promise.all([...Array.from({ length: CLIENTS }, worker), ...probers]);
    clearInterval(sampler);
    figures.load_seconds = (Date.now() - tLoad) / 1000;

    // 3. back to idle: metrics, blocks, fds, RSS
    let m;
    const tIdle = Date.now();
    for (;;) {
      m = await metrics(srv.base);
      await sleep(500); // the /metrics connection itself closes
      if ((m.running === 0 && m.waiting === 0 && m.used === 0 && openFds(pid) <= fdStart) || Date.now() - tIdle > 30000) break;
    }
    await sleep(1000);
    let rssEnd = procStatus(pid);
    const rssIdleBound = rssStart * 1.1 + 2 * 1048576;
    for (let i = 0; N_PROBES > 0 && i < 100 && rssEnd > rssIdleBound; i++) { await sleep(100); rssEnd = procStatus(pid); }
    if (N_PROBES > 0 && !TSAN && rssEnd > rssIdleBound)
      fail(`idle RSS ${MiB(rssEnd)} MiB at the end, ${MiB(rssStart)} MiB at the start (bound ${MiB(rssIdleBound)})`);
    const fdEnd = openFds(pid), fdsEnd = fdTargets(pid);
    if (m.running !== 0 || m.waiting !== 0) fail(`not idle: running ${m.running}, waiting ${m.waiting}`);
    if (m.used !== 0 || m.free + m.cached !== m.total) fail(`KV blocks not back: used ${m.used}, free ${m.free}, cached ${m.cached}, total ${m.total}`);
    // a leak grows with the load: any socket left open, or more than one other new fd (a lazily opened one,
    // e.g. a runtime's, is not a leak)
    const more = extra(fdsStart, fdsEnd);
    if (more.some((x) => x.startsWith('socket:')) || more.length > 1)
      fail(`open fds ${fdStart} at the start, ${fdEnd} at the end; new: ${more.join(', ')}`);
    figures.fds_new = more.join(', ');
    const preempt = m.preemptions - m0.preemptions;
    if (preempt <= 0) fail('no preemption happened: the pool was not under pressure');
    if (m.truncations !== 0) fail(`${m.truncations} choices were cut by the pool`);
    // RSS: after warm-up it may wander (allocator), but not climb: the last samples stay within 10% + 16 MiB
    // of the first sample after warm-up
    const rssLate = rssSamples.length ? Math.max(...rssSamples.slice(-10)) : rssEnd;
    const rssBound = rssWarm * 1.1 + 16 * 1048576;
    if (!TSAN && rssWarm && rssLate > rssBound)
      fail(`RSS grew after warm-up: ${MiB(rssWarm)} MiB then ${MiB(rssLate)} MiB (bound ${MiB(rssBound)})`);
    if (stats.compared === 0) fail('no request completed');
    Object.assign(figures, stats, {
      preemptions: preempt, truncations: m.truncations, rss_start_mib: +MiB(rssStart), rss_after_warmup_mib: +MiB(rssWarm),
      rss_max_mib: +MiB(rssMax), rss_end_mib: +MiB(rssEnd), fds_start: fdStart, fds_end: fdEnd,
      kv_blocks_total: m.total, kv_blocks_used_end: m.used, running_end: m.running, waiting_end: m.waiting,
    });
  } catch (e) {
    fail(`soak aborted: ${e.stack || e}`);
  }
  let code;
  try { code = await srv.stop(); } catch (e) { fail(String(e.message).slice(0, 4000)); }
  if (code !== 0 && code !== undefined) fail(`kvserve exited with ${code}`);
  if (/WARNING: ThreadSanitizer|ThreadSanitizer: /.test(srv.log())) {
    const log = srv.log();
    const at = log.indexOf('WARNING: ThreadSanitizer');
    fail(`ThreadSanitizer reports (${(log.match(/WARNING: ThreadSanitizer/g) || []).length}):\n${log.slice(Math.max(0, at), at + 6000)}`);
  }
  figures.failures = failures.length;
  console.log(JSON.stringify(figures, null, 1));
  if (process.env.SOAK_JSON) writeFileSync(process.env.SOAK_JSON, JSON.stringify(figures, null, 1) + '\n');
  if (failures.length) {
    console.log(`soak: FAILED\n${failures.join('\n')}`);
    process.exit(1);
  }
  console.log(`soak: ok (${stats.requests} requests, ${stats.aborted} aborted, ${figures.preemptions} preemptions, ` +
              `${stats.compared} compared with their run alone)`);
}

main().catch((e) => { console.error(e); process.exit(1); });
