// Smoke test of a running kvserve container with the official openai client (tests/docker/run.sh).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
const require = createRequire(new URL('../e2e/package.json', import.meta.url));
const { default: OpenAI } = await import(require.resolve('openai'));

const base = process.env.KVSERVE_URL;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const models = await client.models.list();
assert.ok(models.data.length >= 1);
const r = await client.completions.create({ model: 'x', prompt: 'Hello', max_tokens: 8, temperature: 0 });
assert.equal(r.choices.length, 1);
assert.ok(r.usage.completion_tokens >= 1);
const stream = await client.chat.completions.create({
  model: 'x', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, temperature: 0, stream: true,
});
let chunks = 0;
for await (const _ of stream) chunks++;
assert.ok(chunks >= 2);
const metrics = await (await fetch(`${base}/metrics`)).text();
assert.match(metrics, /kvserve:num_requests_running/);
console.log('docker smoke: ok');
