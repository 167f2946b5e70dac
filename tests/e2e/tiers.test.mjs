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

// llama.cpp's slot API: save a conversation's KV, restore it into a server whose tier is empty, erase; names that
// leave the directory and unknown actions are refused.
test('POST /slots/{id}?action=save|restore|erase', { timeout: 300000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kvserve-tiers-'));
  const slots = join(dir, 'slots');
  const post = async (srv, path, body) => {
    const r = await fetch(`${srv.base}${path}`, { method: 'POST', body: body ? JSON.stringify(body) : undefined });
    return { status: r.status, json: await r.json() };
  };
  let srv;
  try {
    srv = await startServer(model.path, flags(join(dir, 'kv1'), ['--parallel', '1', '--slot-save-path', slots]));
    const first = await ask(srv);
    const n = first.usage.prompt_tokens + first.usage.completion_tokens;
    let r = await post(srv, '/slots/0?action=save', { filename: 'story.bin' });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.id_slot, 0);
    assert.equal(r.json.filename, 'story.bin');
    // the committed context: everything but the last sampled token, in full blocks
    assert.equal(r.json.n_saved, Math.floor((n - 1) / BLOCK) * BLOCK);
    assert.ok(r.json.n_written > 0 && r.json.timings.save_ms >= 0);
    for (const filename of ['../x', '/etc/passwd', '..', '', 'a/b', '.hidden']) {
      r = await post(srv, '/slots/0?action=save', { filename });
      assert.equal(r.status, 400, filename);
      assert.equal(r.json.error.param, 'filename');
    }
    assert.equal((await post(srv, '/slots/0?action=fly', { filename: 'x' })).status, 400);
    assert.equal((await post(srv, '/slots/7?action=save', { filename: 'x' })).status, 400);
    assert.equal((await post(srv, '/slots/abc?action=save', { filename: 'x' })).status, 400);
    assert.equal((await post(srv, '/slots/0?action=restore', { filename: 'missing.bin' })).status, 404);
    r = await post(srv, '/slots/0?action=erase');
    assert.deepEqual(r.json, { id_slot: 0, n_erased: n - 1 });
    assert.equal((await post(srv, '/slots/0?action=save', { filename: 'y.bin' })).status, 404);
    assert.equal(await srv.stop(), 0);

    // a new server with an empty disk tier: the restored session serves the prompt
    srv = await startServer(model.path, flags(join(dir, 'kv2'), ['--parallel', '1', '--slot-save-path', slots]));
    r = await post(srv, '/slots/0?action=restore', { filename: 'story.bin' });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.n_restored, Math.floor((n - 1) / BLOCK) * BLOCK);
    const again = await ask(srv);
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, Math.floor((first.usage.prompt_tokens - 1) / BLOCK) * BLOCK);
    assert.equal(again.text, first.text);
    assert.equal(await srv.stop(), 0);

    // without slot_save_path: 501
    srv = await startServer(model.path, flags(join(dir, 'kv3')));
    assert.equal((await post(srv, '/slots/0?action=save', { filename: 'z.bin' })).status, 501);
    assert.equal(await srv.stop(), 0);
  } finally {
    if (srv && srv.child.exitCode === null) srv.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

// The host-memory tier (kv_host_gb, no disk tier): a prompt pushed out of a tiny pool by another one comes back from
// RAM (cached_tokens, tier="host" hits) with the same greedy tokens and the same logprobs, bit for bit, as when it
// was computed.
test('a prompt evicted from a tiny pool comes back from the host tier with the tokens and logprobs of recompute',
  { timeout: 300000 }, async () => {
    const other = Array.from({ length: 40 }, (_, i) => `Line ${i}: a red bird sang in the tall old tree at dawn.`)
      .join(' ');
    const hostFlags = ['--parallel', '1', '--threads', '2', '--ctx-size', '2048', '--kv-blocks', '96'];
    const client = (srv) => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    const run = async (srv, p) => {
      const r = await client(srv).completions.create({ model: 'm', prompt: p, max_tokens: 16, temperature: 0,
        logprobs: 3 });
      return { text: r.choices[0].text, lp: r.choices[0].logprobs, usage: r.usage };
    };
    let srv;
    try {
      srv = await startServer(model.path, [...hostFlags, '--kv-host-gb', '0.05']);
      assert.match(srv.log(), /KV host tier: [1-9]\d* blocks/);
      const first = await run(srv, prompt);
      const n = first.usage.prompt_tokens;
      assert.ok(n > 40 * BLOCK && n < 90 * BLOCK, `prompt of ${n} tokens`);
      await run(srv, other); // needs most of the 96 blocks: the first prompt's leave the pool for the host tier
      const m1 = await metrics(srv);
      assert.ok(metric(m1, 'kvserve:kv_host_tier_stored_total') > 0, 'nothing was copied to the host tier');
      const again = await run(srv, prompt);
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, Math.floor((n - 1) / BLOCK) * BLOCK);
      assert.equal(again.text, first.text);
      assert.deepEqual(again.lp, first.lp);
      const m2 = await metrics(srv);
      const hostHits = Number(/kvserve:prefix_cache_tier_hits_total\{tier="host"\} (\d+)/.exec(m2)[1]);
      assert.ok(hostHits > 0 && hostHits % BLOCK === 0, `host hits ${hostHits}`);
      assert.ok(/kvserve:kv_tier_bytes_total\{tier="host",direction="read"\} [1-9]/.test(m2));
      assert.equal(metric(m2, 'kvserve:kv_host_tier_hit_blocks_total'), hostHits / BLOCK);
      assert.equal(await srv.stop(), 0);

      // the same three requests without the host tier: the prompt is recomputed, to the same tokens and logprobs
      srv = await startServer(model.path, hostFlags);
      await run(srv, prompt);
      await run(srv, other);
      const recomputed = await run(srv, prompt);
      assert.ok(recomputed.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens);
      assert.equal(recomputed.text, again.text);
      assert.deepEqual(recomputed.lp, again.lp);
      assert.equal(await srv.stop(), 0);
    } finally {
      if (srv && srv.child.exitCode === null) srv.child.kill('SIGKILL');
    }
  });

test('kv_host_gb below one block stops the start with a message naming the key', async () => {
  await assert.rejects(startServer(model.path, ['--kv-host-gb', '0.000000001']), /kv_host_gb/);
});
