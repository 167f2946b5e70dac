// The KV disk tier across restarts (issue 29): a long prompt computed by one server process is served from
// kv_disk_dir by the next one (usage.prompt_tokens_details.cached_tokens, /metrics), with the same greedy output,
// after a graceful stop and after kill -9; a tier written with another KV setting is never used.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startServer, testModel, metric } from './server.mjs';

const model = testModel();
const BLOCK = 16;

// ~700 tokens: a story's sentences, each numbered so that no two blocks are alike
const prompt = Array.from({ length: 40 }, (_, i) => `Sentence ${i}: the little dog ran to the park and played.`)
  .join(' ');

async function ask(srv) {
  const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  const r = await client.completions.create({ model: 'm', prompt, max_tokens: 24, temperature: 0 });
  return { text: r.choices[0].text, usage: r.usage };
}

async function metrics(srv) {
  return (await fetch(`${srv.base}/metrics`)).text();
}

// Waits until the tier has written at least one block (the writer thread runs behind the answer).
async function written(srv) {
  for (let i = 0; i < 100; i++) {
    const n = metric(await metrics(srv), 'kvserve:kv_disk_tier_blocks_written_total');
    if (n > 0) return n;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the disk tier wrote nothing');
}

const flags = (dir, extra = []) => ['--parallel', '2', '--threads', '2', '--ctx-size', '2048', '--kv-disk-dir', dir,
  '--kv-disk-gb', '0.5', ...extra];

test('a prompt computed before a restart is served from disk after it, with the same output',
  { timeout: 300000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvserve-tiers-'));
    let srv;
    try {
      srv = await startServer(model.path, flags(dir));
      const first = await ask(srv);
      assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
      const n = first.usage.prompt_tokens;
      assert.ok(n > 300, `prompt of ${n} tokens`);
      await written(srv);
      assert.equal(await srv.stop(), 0);
      assert.ok(readdirSync(dir).some((f) => f.endsWith('.kvt')), 'no tier file after the stop');

      // graceful restart: every full block of the prompt (but its last token) comes from disk
      srv = await startServer(model.path, flags(dir));
      assert.match(srv.log(), /KV disk tier .*: [1-9]\d* blocks/);
      const second = await ask(srv);
      assert.equal(second.usage.prompt_tokens_details.cached_tokens, Math.floor((n - 1) / BLOCK) * BLOCK);
      assert.equal(second.text, first.text);
      const m = await metrics(srv);
      assert.equal(metric(m, 'kvserve:kv_disk_tier_hit_blocks_total'), Math.floor((n - 1) / BLOCK));
      assert.ok(metric(m, 'kvserve:kv_disk_tier_lookups_total') >= 1);
      assert.ok(/kvserve:prefix_cache_tier_hits_total\{tier="disk"\} [1-9]/.test(m));
      assert.ok(/kvserve:kv_tier_bytes_total\{tier="disk",direction="read"\} [1-9]/.test(m));
      // a kill -9 after the answer: what was written survives
      srv.child.kill('SIGKILL');
      await new Promise((r) => srv.child.once('exit', r));

      srv = await startServer(model.path, flags(dir));
      const third = await ask(srv);
      assert.equal(third.usage.prompt_tokens_details.cached_tokens, Math.floor((n - 1) / BLOCK) * BLOCK);
      assert.equal(third.text, first.text);
      assert.equal(await srv.stop(), 0);

      // another KV setting (f32 instead of f16): the files are foreign, deleted, never loaded
      srv = await startServer(model.path, flags(dir, ['--kv-dtype', 'f32']));
      assert.match(srv.log(), /written for another model or setting/);
      const fourth = await ask(srv);
      assert.equal(fourth.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(metric(await metrics(srv), 'kvserve:kv_disk_tier_files_rejected_total') > 0, true);
      assert.equal(await srv.stop(), 0);
    } finally {
      if (srv && srv.child.exitCode === null) srv.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });

test('a kv_disk_dir that cannot be a directory stops the start with a message naming the key', async () => {
  await assert.rejects(startServer(model.path, flags('/dev/null/x')), /kv_disk_dir/);
});
