// Memory given back (issue 30 item 5): large refused bodies parsed on the worker threads left an idle server
// holding hundreds of MB (eight 14 MB bodies: +2.24 GB five seconds later). After a few such bodies, once idle,
// the server trims its heap: VmRSS must come back within 10% of what it was before them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, testModel, BINARY } from './server.mjs';

const model = testModel();

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

test('RSS of an idle server comes back after large refused bodies', { timeout: 180000 }, async (t) => {
  if (/build-san/.test(BINARY)) {
    t.skip('sanitizer build: its allocator keeps freed memory in quarantine');
    return;
  }
  const srv = await startServer(model.path, ['--parallel', '2', '--threads', '2', '--ctx-size', '512']);
  try {
    // Warm-up: the start's own allocations (a worker thread's arena and stack, the scheduler's first step) are
    // there before the baseline. Four small refused bodies at once reach the pool's threads; one completion runs.
    const refused = (n) => JSON.stringify({ model: 'x', prompt: Array.from({ length: n }, (_, i) => 100 + (i % 200)),
      max_tokens: 1 });
    const post = (body) => fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    }).then(async (r) => { await r.text(); return r.status; });
    for (const s of await Promise.all(Array.from({ length: 4 }, () => post(refused(2000))))) assert.equal(s, 400);
    assert.equal(await post(JSON.stringify({ model: 'x', prompt: 'Once upon a time', max_tokens: 4 })), 200);
    await new Promise((r) => setTimeout(r, 500));
    const before = rssKiB(srv.child.pid);
    // Within 10% of the start, plus 2 MiB for what a tiny model's few-MB server cannot amortize (thread stacks
    // touched deeper by the large parse)
    const limit = before * 1.1 + 2048;
    // ~4 MB of token ids each: far past the context, refused with 400 after the parse
    const body = refused(800000);
    let peak = before;
    for (let round = 0; round < 2; round++) {
      const answers = await Promise.all(Array.from({ length: 4 }, () => post(body)));
      for (const s of answers) assert.equal(s, 400);
      peak = Math.max(peak, rssKiB(srv.child.pid));
    }
    let after = rssKiB(srv.child.pid);
    for (let i = 0; i < 50 && after > limit; i++) {
      await new Promise((r) => setTimeout(r, 100));
      after = rssKiB(srv.child.pid);
    }
    assert.ok(after <= limit, `idle RSS ${after} KiB after large bodies (peak ${peak} KiB), ${before} KiB before`);
    assert.equal(await srv.stop(), 0);
  } finally {
    if (srv.child.exitCode === null) srv.child.kill('SIGKILL');
  }
});
