// End-to-end tests: the official OpenAI SDK against a real `kvserve serve` on 127.0.0.1.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, testModel, metric } from './server.mjs';

const model = testModel();
let srv;
let client;

const PROMPTS = [
  'Once upon a time', 'The little dog', 'Lily wanted to', 'One day, a big', 'Tom and Sue went to the',
  'The sun was', 'She saw a bird', 'In the park there was',
];

async function complete(c, prompt, extra = {}) {
  return c.completions.create({ model: 'x', prompt, max_tokens: 24, temperature: 0, ...extra });
}

async function streamText(c, prompt, extra = {}) {
  const stream = await c.completions.create({ model: 'x', prompt, max_tokens: 24, temperature: 0, stream: true, ...extra });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
  }
  return { text, finish };
}

before(async () => {
  srv = await startServer(model.path, ['--parallel', '64', '--threads', '2']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM');
});

describe('basic API', () => {
  test('models list has the loaded model', async () => {
    const list = await client.models.list();
    assert.ok(list.data.length >= 1);
    assert.equal(list.data[0].object, 'model');
    assert.equal(typeof list.data[0].id, 'string');
  });

  test('health is ok', async () => {
    const r = await fetch(`${srv.base}/health`);
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { status: 'ok' });
  });

  test('completion: shape and usage', async () => {
    const r = await complete(client, 'Once upon a time', { max_tokens: 16 });
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(typeof r.choices[0].text, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 0);
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    if (model.shared) assert.ok(r.choices[0].text.length > 0, 'stories260K writes text');
  });

  test('streamed completion text equals the non-streamed text at temperature 0', async () => {
    for (const p of PROMPTS.slice(0, 3)) {
      const full = await complete(client, p);
      const s = await streamText(client, p);
      assert.equal(s.text, full.choices[0].text, `prompt ${JSON.stringify(p)}`);
      assert.equal(s.finish, full.choices[0].finish_reason);
    }
  });

  test('chat completion, streamed and not, agree', async () => {
    const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about a cat.' }];
    const r = await client.chat.completions.create({ model: 'x', messages, max_tokens: 20, temperature: 0 });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    const stream = await client.chat.completions.create({
      model: 'x', messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let text = ''; let sawRole = false; let usage = null; let finish = null; let first = true;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      if (!chunk.choices.length) continue;
      const d = chunk.choices[0].delta;
      if (first) { assert.equal(d.role, 'assistant', 'the first delta carries the role'); first = false; }
      if (d.role) sawRole = true;
      if (d.content) text += d.content;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    assert.ok(sawRole);
    assert.equal(text, r.choices[0].message.content);
    assert.equal(finish, r.choices[0].finish_reason);
    assert.ok(usage, 'include_usage sends a usage chunk');
    assert.equal(usage.completion_tokens, r.usage.completion_tokens);
    assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
  });

  test('stop strings end the text right before the stop', async () => {
    const full = (await complete(client, 'Once upon a time', { max_tokens: 40 })).choices[0].text;
    // Pick a stop string from the middle of the greedy text: the output must end right before it.
    const start = Math.floor(full.length / 3);
    const stop = full.slice(start, start + 3);
    if (stop.length < 3) return; // a model that stops at once leaves nothing to test
    const cut = full.indexOf(stop);
    const r = await complete(client, 'Once upon a time', { max_tokens: 40, stop: [stop, '\u0001never'] });
    assert.equal(r.choices[0].text, full.slice(0, cut));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await streamText(client, 'Once upon a time', { max_tokens: 40, stop });
    assert.equal(s.text, full.slice(0, cut));
  });

  test('n > 1 returns n choices; at temperature 0 they agree', async () => {
    const r = await complete(client, 'The little dog', { n: 3, max_tokens: 12 });
    assert.equal(r.choices.length, 3);
    assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2]);
    assert.equal(r.choices[1].text, r.choices[0].text);
    assert.equal(r.choices[2].text, r.choices[0].text);
    const single = await complete(client, 'The little dog', { max_tokens: 12 });
    assert.equal(r.choices[0].text, single.choices[0].text);
  });

  test('same seed, same sampled output', async () => {
    const a = await complete(client, 'Lily wanted to', { temperature: 1.0, seed: 1234, max_tokens: 24 });
    const b = await complete(client, 'Lily wanted to', { temperature: 1.0, seed: 1234, max_tokens: 24 });
    assert.equal(a.choices[0].text, b.choices[0].text);
  });

  test('logprobs: completions and chat shapes', async () => {
    const r = await complete(client, 'Once upon a time', { max_tokens: 5, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    for (let i = 0; i < lp.tokens.length; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const top = lp.top_logprobs[i];
      assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
      // greedy: the chosen token is the best one
      const best = Math.max(...Object.values(top));
      assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-4);
    }
    const c = await client.chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
    });
    const content = c.choices[0].logprobs.content;
    assert.equal(content.length, c.usage.completion_tokens);
    for (const e of content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 2);
    }
  });

  test('cached_tokens reported on a repeated prefix', async () => {
    const prefix = 'Once upon a time there was a little girl named Lily. She loved to play outside in the park. '.repeat(3);
    await complete(client, prefix + 'One day', { max_tokens: 2 });
    const r = await complete(client, prefix + 'The next day', { max_tokens: 2 });
    assert.ok(r.usage.prompt_tokens_details.cached_tokens >= 16,
      `cached_tokens ${r.usage.prompt_tokens_details.cached_tokens}`);
  });
});

describe('errors', () => {
  async function raw(path, body, method = 'POST', headers = {}) {
    const r = await fetch(`${srv.base}${path}`, {
      method, headers: { 'content-type': 'application/json', ...headers },
      body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body)),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not json */ }
    return { status: r.status, json, headers: r.headers };
  }
  function isError(res, status, param) {
    assert.equal(res.status, status);
    assert.ok(res.json && res.json.error, 'OpenAI error JSON');
    assert.equal(typeof res.json.error.message, 'string');
    assert.ok('type' in res.json.error && 'param' in res.json.error && 'code' in res.json.error);
    if (param) assert.equal(res.json.error.param, param);
  }

  test('invalid JSON is 400', async () => isError(await raw('/v1/completions', '{"prompt": '), 400));
  test('missing prompt is 400 naming it', async () => isError(await raw('/v1/completions', { model: 'x' }), 400, 'prompt'));
  test('missing messages is 400 naming it', async () =>
    isError(await raw('/v1/chat/completions', { model: 'x' }), 400, 'messages'));
  test('wrong types are 400 naming the field', async () => {
    isError(await raw('/v1/completions', { prompt: 'a', max_tokens: 'many' }), 400, 'max_tokens');
    isError(await raw('/v1/completions', { prompt: 'a', temperature: 'hot' }), 400, 'temperature');
    isError(await raw('/v1/completions', { prompt: 'a', stream: 3 }), 400, 'stream');
    isError(await raw('/v1/chat/completions', { messages: 'hi' }), 400, 'messages');
  });
  test('out-of-range values are 400', async () => {
    isError(await raw('/v1/completions', { prompt: 'a', temperature: -1 }), 400, 'temperature');
    isError(await raw('/v1/completions', { prompt: 'a', top_p: 1.5 }), 400, 'top_p');
    isError(await raw('/v1/completions', { prompt: 'a', n: 0 }), 400, 'n');
    isError(await raw('/v1/completions', { prompt: 'a', max_tokens: 0 }), 400, 'max_tokens');
    isError(await raw('/v1/completions', { prompt: 'a', logprobs: 50 }), 400, 'logprobs');
  });
  test('a prompt longer than the context is 400 with both numbers', async () => {
    const res = await raw('/v1/completions', { prompt: 'word '.repeat(20000), max_tokens: 4 });
    isError(res, 400);
    assert.match(res.json.error.message, /\d+.*\d+/);
  });
  test('unknown route 404, wrong method 405', async () => {
    isError(await raw('/v1/nope', {}), 404);
    isError(await raw('/v1/completions', undefined, 'GET'), 405);
  });
  test('SDK surfaces errors as APIError with the status', async () => {
    await assert.rejects(client.completions.create({ model: 'x', prompt: 'a', temperature: 9 }),
      (e) => e.status === 400);
  });

  test('a NUL in a prompt is refused with 400 naming it, never cut (issue 14)', async () => {
    await assert.rejects(client.completions.create({ model: 'x', prompt: 'keep\u0000this', max_tokens: 1 }),
      (e) => e.status === 400 && /NUL/.test(e.message));
  });
});

describe('concurrency and cancellation', () => {
  test('abort mid-stream frees its blocks', async () => {
    const ac = new AbortController();
    const stream = await client.completions.create(
      { model: 'x', prompt: 'Once upon a time', max_tokens: 400, temperature: 0, stream: true, ignore_eos: true },
      { signal: ac.signal });
    let n = 0;
    try {
      for await (const _ of stream) { if (++n === 3) ac.abort(); }
    } catch { /* aborted */ }
    // Within a few scheduler steps the server notices and frees the sequence.
    let running = 1; let used = 1;
    for (let i = 0; i < 100 && (running || used); i++) {
      await new Promise((r) => setTimeout(r, 50));
      const text = await (await fetch(`${srv.base}/metrics`)).text();
      running = metric(text, 'kvserve:num_requests_running');
      used = metric(text, 'kvserve:kv_blocks_used');
    }
    assert.equal(running, 0, 'no request running after abort');
    assert.equal(used, 0, 'no KV blocks held after abort');
  });

  test('64 concurrent streams each equal their sequential result', async () => {
    const prompts = Array.from({ length: 64 }, (_, i) => `${PROMPTS[i % PROMPTS.length]} ${i}`);
    const sequential = [];
    for (const p of prompts.slice(0, 16)) sequential.push((await complete(client, p, { max_tokens: 16 })).choices[0].text);
    const results = await Promise.all(prompts.map((p) => streamText(client, p, { max_tokens: 16 })));
    for (let i = 0; i < 16; i++) assert.equal(results[i].text, sequential[i], `stream ${i}`);
    // The rest: compare with a sequential run after the fact.
    for (let i = 16; i < 64; i += 6) {
      const seq = (await complete(client, prompts[i], { max_tokens: 16 })).choices[0].text;
      assert.equal(results[i].text, seq, `stream ${i}`);
    }
  });
});

describe('context shift', () => {
  test('with --context-shift a long generation crosses the context size; without it max_tokens must fit', async () => {
    const cs = await startServer(model.path, ['--ctx-size', '64', '--context-shift', '--parallel', '4', '--threads', '2']);
    const off = await startServer(model.path, ['--ctx-size', '64', '--parallel', '4', '--threads', '2']);
    try {
      const c = new OpenAI({ baseURL: `${cs.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 300000 });
      const r = await complete(c, PROMPTS[0], { max_tokens: 150, ignore_eos: true, n_keep: 2 });
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(r.usage.completion_tokens, 150);
      assert.ok(r.usage.prompt_tokens + r.usage.completion_tokens > 64 * 2, 'generated past the context twice');
      if (model.shared) assert.ok(r.choices[0].text.length > 0);
      // the same request streamed gives the same text (greedy, one sequence)
      const s = await streamText(c, PROMPTS[0], { max_tokens: 150, ignore_eos: true, n_keep: 2 });
      assert.equal(s.finish, 'length');
      assert.equal(s.text, r.choices[0].text);
      // no max_tokens: the context bounds the generation even with the shift on
      const chat = await c.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }],
        temperature: 0, ignore_eos: true });
      assert.equal(chat.choices[0].finish_reason, 'length');
      assert.equal(chat.usage.prompt_tokens + chat.usage.completion_tokens, 64);
      // a bad n_keep is a 400 naming it
      await assert.rejects(complete(c, 'x', { n_keep: -5 }), (e) => e.status === 400 && /n_keep/.test(e.message));
      // without the shift the same request does not fit
      const c2 = new OpenAI({ baseURL: `${off.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 300000 });
      await assert.rejects(complete(c2, PROMPTS[0], { max_tokens: 150 }),
        (e) => e.status === 400 && e.code === 'context_length_exceeded');
    } finally {
      assert.equal(await cs.stop(), 0);
      assert.equal(await off.stop(), 0);
    }
  });
});

describe('small pools and queues', () => {
  test('a tiny KV pool completes every request correctly through preemption', async () => {
    const small = await startServer(model.path, ['--parallel', '16', '--kv-blocks', '24', '--block-size', '16']);
    try {
      const c = new OpenAI({ baseURL: `${small.base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 300000 });
      const prompts = Array.from({ length: 12 }, (_, i) => `${PROMPTS[i % PROMPTS.length]} number ${i}`);
      const alone = [];
      for (const p of prompts) alone.push((await complete(c, p, { max_tokens: 48, ignore_eos: true })).choices[0].text);
      const together = await Promise.all(prompts.map((p) => complete(c, p, { max_tokens: 48, ignore_eos: true })));
      for (let i = 0; i < prompts.length; i++) assert.equal(together[i].choices[0].text, alone[i], `request ${i}`);
      const text = await (await fetch(`${small.base}/metrics`)).text();
      assert.ok(metric(text, 'kvserve:num_preemptions_total') > 0, 'the pool was small enough to preempt');
    } finally {
      assert.equal(await small.stop(), 0);
    }
  });

  test('a full queue answers 429 with Retry-After', async () => {
    const q = await startServer(model.path, ['--parallel', '1', '--max-queue', '1']);
    try {
      const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true });
      const reqs = Array.from({ length: 8 }, () => fetch(`${q.base}/v1/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body,
      }));
      const res = await Promise.all(reqs);
      const codes = res.map((r) => r.status);
      assert.ok(codes.includes(429), `codes ${codes}`);
      assert.ok(codes.includes(200));
      const r429 = res.find((r) => r.status === 429);
      assert.ok(r429.headers.get('retry-after'));
      await Promise.all(res.map((r) => r.text()));
    } finally {
      assert.equal(await q.stop(), 0);
    }
  });

  test('--api-key guards every route but /health', async () => {
    const k = await startServer(model.path, ['--api-key', 'sekret']);
    try {
      assert.equal((await fetch(`${k.base}/health`)).status, 200);
      assert.equal((await fetch(`${k.base}/v1/models`)).status, 401);
      const ok = await fetch(`${k.base}/v1/models`, { headers: { authorization: 'Bearer sekret' } });
      assert.equal(ok.status, 200);
      const c = new OpenAI({ baseURL: `${k.base}/v1`, apiKey: 'sekret', maxRetries: 0 });
      const r = await c.completions.create({ model: 'x', prompt: 'Hi', max_tokens: 2 });
      assert.equal(r.choices.length, 1);
    } finally {
      assert.equal(await k.stop(), 0);
    }
  });
});
