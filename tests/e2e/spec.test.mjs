// Speculative decoding end to end (issue 28) with the official openai package: a server with --spec-type ngram
// and one without answer the same requests (completions with logprobs, streamed chat, several at once,
// temperature 0 and a seeded temperature 0.8) identically; llama.cpp's speculative.n_max / n_min request fields
// pass through the SDK's extra body fields and bad values are a 400 naming the field; /metrics counts the
// drafts under vLLM's and kvserve's names. A third server drafts with a draft model (the model drafting for
// itself, -md) and must answer alike too; a draft model with another vocabulary stops the server at start-up
// with a message naming the file.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, testModel, metric, BINARY } from './server.mjs';

const model = testModel();
let plain;
let spec;
let draft;

// Prompts that repeat themselves, so the lookup has something to find.
const PROMPTS = [
  'Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time, there was a little',
  'The cat sat on the mat. The dog sat on the mat. The cat sat on the',
  'Tom and Sue went to the park. Tom and Sue went to the park. Tom and Sue went',
  'One day, a big dog came to the park. The big dog',
];

before(async () => {
  const args = ['--parallel', '8', '--threads', '2', '--ctx-size', '512'];
  plain = await startServer(model.path, args);
  spec = await startServer(model.path, [...args, '--spec-type', 'ngram', '--draft-max', '8']);
  draft = await startServer(model.path, [...args, '-md', model.path, '--draft-max', '4']);
});

after(async () => {
  if (plain) assert.equal(await plain.stop(), 0);
  if (spec) assert.equal(await spec.stop(), 0);
  if (draft) assert.equal(await draft.stop(), 0);
});

const client = (srv) => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

test('completions: the same text and logprobs with speculation on, at temperature 0 and seeded sampling', async () => {
  for (const extra of [{ temperature: 0 }, { temperature: 0.8, seed: 11 }, { temperature: 0, 'speculative.n_max': 3 }]) {
    const ask = (srv) => Promise.all(PROMPTS.map((prompt) => client(srv).completions.create({
      model: 'x', prompt, max_tokens: 48, logprobs: 2, ...extra,
    })));
    const [a, b, d] = await Promise.all([ask(plain), ask(spec), ask(draft)]);
    for (const [name, got] of [['ngram', b], ['draft', d]]) {
      for (let i = 0; i < PROMPTS.length; i++) {
        const what = `${name} prompt ${i} ${JSON.stringify(extra)}`;
        assert.equal(got[i].choices[0].text, a[i].choices[0].text, what);
        assert.deepEqual(got[i].choices[0].logprobs, a[i].choices[0].logprobs, what);
        assert.equal(got[i].choices[0].finish_reason, a[i].choices[0].finish_reason, what);
        // (cached_tokens: timing of copies)
        assert.equal(got[i].usage.completion_tokens, a[i].usage.completion_tokens, what);
      }
    }
  }
});

test('streamed chat with a stop string: the same chunks joined', async () => {
  const run = async (srv) => {
    const stream = await client(srv).chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: PROMPTS[0] }], max_tokens: 48, temperature: 0, stream: true,
      stop: ['park'], 'speculative.n_min': 1,
    });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      if (!chunk.choices.length) continue;
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    return { text, finish };
  };
  const want = await run(plain);
  assert.deepEqual(await run(spec), want);
  assert.deepEqual(await run(draft), want);
});

test('bad speculative fields are a 400 naming the field', async () => {
  for (const [field, value] of [['speculative.n_max', 33], ['speculative.n_max', -1], ['speculative.n_min', 'x']]) {
    await assert.rejects(client(spec).completions.create({ model: 'x', prompt: 'a', max_tokens: 2, [field]: value }),
      (e) => e.status === 400 && e.message.includes(field));
  }
});

test('/metrics counts drafts under vLLM\'s and kvserve\'s names, only where speculation is on', async () => {
  const text = await (await fetch(`${spec.base}/metrics`)).text();
  const drafts = metric(text, 'kvserve:spec_decode_num_drafts_total');
  const guessed = metric(text, 'kvserve:spec_decode_num_draft_tokens_total');
  const accepted = metric(text, 'kvserve:spec_decode_num_accepted_tokens_total');
  assert.ok(drafts > 0, 'no drafts');
  assert.ok(guessed >= drafts && accepted <= guessed, `${drafts} ${guessed} ${accepted}`);
  assert.equal(metric(text, 'vllm:spec_decode_num_drafts_total'), drafts);
  assert.equal(metric(text, 'vllm:spec_decode_num_accepted_tokens_total'), accepted);
  assert.match(text, /vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="7"\}/);
  assert.doesNotMatch(text, /position="8"/);
  const off = await (await fetch(`${plain.base}/metrics`)).text();
  assert.doesNotMatch(off, /spec_decode/);
});

test('the draft model\'s drafts are counted under the same names', async () => {
  const text = await (await fetch(`${draft.base}/metrics`)).text();
  const drafts = metric(text, 'vllm:spec_decode_num_drafts_total');
  assert.ok(drafts > 0, 'the draft model drafted');
  assert.ok(metric(text, 'vllm:spec_decode_num_accepted_tokens_total') > 0, 'a model drafting for itself is right');
  assert.match(text, /vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="3"\}/);
  assert.doesNotMatch(text, /position="4"/);
  // the draft model's own work
  const calls = metric(text, 'kvserve:spec_decode_draft_calls_total');
  const rows = metric(text, 'kvserve:spec_decode_draft_rows_total');
  assert.ok(calls > 0 && rows >= calls, `${calls} draft calls, ${rows} rows`);
  assert.ok(metric(text, 'kvserve:spec_decode_draft_catchup_rows_total') <= rows);
  assert.ok(metric(text, 'kvserve:spec_decode_draft_seconds_total') > 0);
  const ngramText = await (await fetch(`${spec.base}/metrics`)).text();
  assert.doesNotMatch(ngramText, /spec_decode_draft_calls/);
});

test('a draft model with another vocabulary stops the server at start-up, naming the file', async (t) => {
  if (!model.shared) { t.skip('the test model is mkmodel\'s own vocabulary'); return; }
  const dir = mkdtempSync(join(tmpdir(), 'kvserve-e2e-draft-'));
  try {
    const other = join(dir, 'other.gguf');
    execFileSync(BINARY, ['mkmodel', '--preset', 'tiny', '-o', other], { stdio: 'ignore' });
    await assert.rejects(startServer(model.path, ['--model-draft', other]),
      (e) => e.message.includes('other.gguf') && /vocabulary/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
