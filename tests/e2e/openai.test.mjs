// End-to-end: the official `openai` npm client against a real kvserve daemon serving a generated tiny model.
// Run: npm ci --prefix tests/e2e && KVSERVE_BINARY=build/kvserve node tests/e2e/openai.test.mjs
// Exits 77 (ctest: skipped) when the openai package or the kvserve binary is missing.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const binary = process.env.KVSERVE_BINARY || join(here, '..', '..', 'build', 'kvserve');
let OpenAI;
try {
  OpenAI = (await import('openai')).default;
} catch {
  console.log('SKIP: the openai package is not installed (npm ci --prefix tests/e2e)');
  process.exit(77);
}
if (!existsSync(binary)) {
  console.log(`SKIP: no kvserve binary at ${binary} (set KVSERVE_BINARY)`);
  process.exit(77);
}

const { test, before, after } = await import('node:test');
const assert = (await import('node:assert/strict')).default;

const API_KEY = 'e2e-key';
let dir, server, baseURL, client, stderr = '';

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvserve-e2e-'));
  const model = join(dir, 'tiny.gguf');
  execFileSync(binary, ['mkmodel', '-o', model, '--preset', 'tiny'], { stdio: 'ignore' });
  server = spawn(binary, ['serve', '--model', model, '--port', '0', '--threads', '1', '--parallel', '8',
                          '--api-key', API_KEY, '--log-format', 'json'], { stdio: ['ignore', 'ignore', 'pipe'] });
  server.stderr.setEncoding('utf8');
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port reported:\n${stderr}`)), 20000);
    server.stderr.on('data', (d) => {
      stderr += d;
      const m = stderr.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    server.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${stderr}`)));
  });
  baseURL = `http://127.0.0.1:${port}/v1`;
  for (let i = 0; i < 200; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  client = new OpenAI({ apiKey: API_KEY, baseURL, maxRetries: 0 });
});

after(async () => {
  if (server && server.exitCode === null) {
    const exited = new Promise((res) => server.on('exit', (code, sig) => res({ code, sig })));
    server.kill('SIGTERM');
    const { code } = await exited;
    assert.equal(code, 0, `the server did not exit cleanly:\n${stderr}`);
  }
  assert.ok(!/Sanitizer/.test(stderr), `sanitizer report:\n${stderr}`);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('models.list returns the loaded model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].object, 'model');
  assert.equal(list.data[0].owned_by, 'kvserve');
  const one = await client.models.retrieve(list.data[0].id);
  assert.equal(one.id, list.data[0].id);
});

test('completions.create: text, usage, logprobs, n', async () => {
  const r = await client.completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 6,
                                              n: 2, logprobs: 2, ignore_eos: true, seed: 1 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) {
    assert.equal(typeof c.text, 'string');
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.logprobs.tokens.length, 6);
    assert.equal(c.logprobs.token_logprobs.length, 6);
    assert.equal(c.logprobs.text_offset.length, 6);
    assert.ok(c.logprobs.top_logprobs.every((m) => Object.keys(m).length <= 2));
  }
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test('chat.completions.create: message, seeded determinism, logprobs', async () => {
  const ask = () => client.chat.completions.create({
    model: 'any', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi!' }],
    max_tokens: 8, temperature: 0.8, seed: 42, logprobs: true, top_logprobs: 3,
  });
  const a = await ask(), b = await ask();
  assert.match(a.id, /^chatcmpl-/);
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const lp = a.choices[0].logprobs.content;
  assert.ok(lp.length > 0);
  assert.equal(typeof lp[0].token, 'string');
  assert.ok(Array.isArray(lp[0].bytes));
  assert.ok(lp[0].top_logprobs.length <= 3);
  assert.ok(a.usage.prompt_tokens > 0);
});

test('chat stream with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'any', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 10, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true,
  });
  let text = '', first = true, finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) { usage = chunk.usage; assert.equal(chunk.choices.length, 0); continue; }
    const c = chunk.choices[0];
    if (first) { assert.equal(c.delta.role, 'assistant'); first = false; }
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(n >= 3);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
  assert.equal(typeof text, 'string');
});

test('completions stream with stop strings and several prompts', async () => {
  const stream = await client.completions.create({ model: 'any', prompt: ['a b', 'c d'], max_tokens: 5,
                                                   stream: true, ignore_eos: true });
  const seen = new Set();
  let finished = 0;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      seen.add(c.index);
      if (c.finish_reason) finished++;
    }
  }
  assert.deepEqual([...seen].sort(), [0, 1]);
  assert.equal(finished, 2);
});

test('errors surface as typed client errors', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'any', messages: [{ role: 'user', content: 'x' }],
                                                       temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  await assert.rejects(client.completions.create({ model: 'any', prompt: 'x'.repeat(3000), max_tokens: 1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  const bad = new OpenAI({ apiKey: 'wrong', baseURL, maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test('leaving a stream early closes it and the server keeps serving', async () => {
  const stream = await client.completions.create({ model: 'any', prompt: 'go', max_tokens: 400, stream: true,
                                                   ignore_eos: true });
  let got = 0;
  for await (const chunk of stream) { void chunk; if (++got === 3) break; } // break aborts the request
  assert.equal(got, 3);
  const r = await client.completions.create({ model: 'any', prompt: 'again', max_tokens: 2, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 2);
});
