// The hostile probes of issue 30, for the soak (SOAK_PROBES=1): each is one careless or hostile client, run again
// and again beside the normal streaming load. Every probe checks what the server must answer (a 400, a 413, a
// closed connection) and counts itself; a probe that finds a wrong answer reports it through fail().
import net from 'node:net';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One raw HTTP exchange on its own connection: writes `data`, then either reads the whole answer (resolves with
// its status line's code and the bytes read) or, with resetAfterMs, resets the connection (RST, SO_LINGER 0) after
// that long; with closeAfterWrite it half-closes right after writing and never reads.
function raw(port, data, { resetAfterMs = -1, closeAfterWrite = false, readTimeoutMs = 60000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let buf = Buffer.alloc(0), done = false;
    const finish = (r) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(r);
    };
    const timer = setTimeout(() => {
      if (resetAfterMs >= 0) { s.resetAndDestroy(); finish({ reset: true }); } else { s.destroy(); finish({ timeout: true }); }
    }, resetAfterMs >= 0 ? resetAfterMs : readTimeoutMs);
    s.on('connect', () => {
      s.write(data);
      if (closeAfterWrite) { s.destroy(); finish({ closed: true }); }
    });
    s.on('data', (d) => { if (buf.length < 1 << 20) buf = Buffer.concat([buf, d]); });
    s.on('end', () => {
      const m = /^HTTP\/1\.1 (\d{3})/.exec(buf.toString('latin1', 0, 20));
      finish({ status: m ? Number(m[1]) : 0, bytes: buf.length, head: buf.toString('utf8', 0, 300) });
    });
    s.on('error', (e) => finish({ error: e.code || e.message }));
  });
}

const post = (path, body, extraHeaders = '') => {
  const b = Buffer.from(body);
  return Buffer.concat([Buffer.from(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${b.length}\r\nConnection: close\r\n${extraHeaders}\r\n`), b]);
};
const words = (n) => { const w = 'lily tom ball park dog sun tree happy '.split(' '); let s = '';
  for (let i = 0; i < n; i++) s += w[i % 8] + ' '; return s; };
const ids = (n) => JSON.stringify(Array.from({ length: n }, (_, i) => 100 + (i % 200)));

// The probes. Each takes {port, pid, rand, fail} and resolves when its client is done.
export const PROBES = {
  // item 1 and 6: a large /tokenize with pieces (or /detokenize of many ids), the client resets after 0.3 s
  async tokenize_reset({ port }) {
    await raw(port, post('/tokenize', JSON.stringify({ content: words(200000), with_pieces: true })), { resetAfterMs: 300 });
  },
  async detokenize_reset({ port }) {
    await raw(port, post('/detokenize', `{"tokens":${ids(300000)}}`), { resetAfterMs: 300 });
  },
  // item 6: clients that send their text work and leave at once
  async tokenize_and_leave({ port }) {
    await Promise.all(Array.from({ length: 4 }, () =>
      raw(port, post('/tokenize', JSON.stringify({ content: words(100000), with_pieces: true })), { closeAfterWrite: true })));
  },
  // item 4: a /tokenize answer that is read whole: 200 (bounded) or 413, never more
  async tokenize_read({ port, fail }) {
    const r = await raw(port, post('/tokenize', JSON.stringify({ content: words(60000), with_pieces: true })));
    if (r.status !== 200 && r.status !== 413 && r.status !== 503) fail(`/tokenize with pieces answered ${r.status || r.error || 'nothing'}`);
  },
  // item 3: one connection pipelines many GETs and never reads, then goes
  async pipeline_unread({ port }) {
    const one = 'GET / HTTP/1.1\r\nHost: x\r\n\r\n';
    await raw(port, one.repeat(5000), { resetAfterMs: 1500 });
  },
  // item 5: large bodies of token ids, refused with 400 after the parse
  async refused_ids({ port, fail }) {
    const r = await raw(port, post('/v1/completions', `{"prompt":${ids(300000)},"max_tokens":1}`));
    if (r.status !== 400) fail(`a prompt of 300,000 ids answered ${r.status || r.error || 'nothing'}, not 400`);
  },
  // item 10: duplicate keys, and a body nested past any sane depth
  async duplicate_keys({ port, fail }) {
    const r = await raw(port, post('/v1/completions', '{"prompt":"a","prompt":"b","max_tokens":1}'));
    if (r.status !== 400) fail(`duplicate keys answered ${r.status || r.error || 'nothing'}, not 400`);
  },
  async deep_json({ port, fail }) {
    const r = await raw(port, post('/v1/chat/completions', '['.repeat(100000)));
    if (r.status !== 400) fail(`a 100,000-deep body answered ${r.status || r.error || 'nothing'}, not 400`);
  },
  // request smuggling: both framings at once is refused
  async smuggle({ port, fail }) {
    const r = await raw(port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n' +
      'Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n');
    if (r.status !== 400) fail(`Content-Length with Transfer-Encoding answered ${r.status || r.error || 'nothing'}, not 400`);
  },
  // item 10: n that cannot fit the small pool is refused up front (or served whole), never cut
  async n_too_many({ port, fail }) {
    const r = await raw(port, post('/v1/completions', JSON.stringify({ prompt: 'once upon', n: 64, max_tokens: 300,
      temperature: 1 })), { readTimeoutMs: 120000 });
    if (r.status === 200 && /"truncated":\s*true/.test(r.head)) fail('n=64 answered with truncated choices');
    if (r.status !== 200 && r.status !== 400 && r.status !== 503) fail(`n=64 answered ${r.status || r.error || 'nothing'}`);
  },
  // a stalled SSE reader: asks for a stream, reads nothing for 3 s, then resets
  async sse_stall({ port }) {
    await raw(port, post('/v1/completions', JSON.stringify({ prompt: 'once upon a time', max_tokens: 200, stream: true,
      temperature: 0, ignore_eos: true })), { resetAfterMs: 3000 });
  },
  // half a request, then nothing: the connection is the server's to time out; the client gives up after 2 s
  async slow_headers({ port }) {
    await raw(port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le', { resetAfterMs: 2000 });
  },
  // item 2: SIGHUP is ignored (documented); the process must still be there
  async sighup({ pid, fail }) {
    try { process.kill(pid, 'SIGHUP'); } catch (e) { fail(`SIGHUP: ${e.message}`); }
    await sleep(200);
    try { process.kill(pid, 0); } catch { fail('kvserve is gone after SIGHUP'); }
  },
};

// Runs random probes until the deadline; counts each in stats.probes[name].
export async function probeWorker({ port, pid, rand, fail, deadline, stats }) {
  const names = Object.keys(PROBES);
  while (Date.now() < deadline) {
    const name = names[Math.floor(rand() * names.length)];
    stats.probes[name] = (stats.probes[name] || 0) + 1;
    try {
      await PROBES[name]({ port, pid, rand, fail });
    } catch (e) {
      fail(`probe ${name} threw: ${e.message}`);
    }
    await sleep(50 + Math.floor(rand() * 250));
  }
}
