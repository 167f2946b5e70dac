// End-to-end: reasoning output with the official `openai` and `@anthropic-ai/sdk` clients against `kvserve serve`
// on the synthetic Qwen2 chat model rendered with QwQ-32B's template, whose generation prompt opens `<think>`:
// what the model generates after it is thinking, so it must arrive as reasoning_content (chat), a reasoning item
// (Responses) and a thinking block (Messages), never as content. The weights are random: texts are compared between
// requests at temperature 0 (the same text with reasoning_format "none" is the content), never with expected words.
// chat_template_kwargs {enable_thinking: false} (the template then closes the block in the prompt) gives content.
// The split after a </think> the model writes, and tool calls after it, are in test_api (scripted engine) and
// test_reasoning (the parser).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';

const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');
const MODEL = join(SHARED, 'models', 'synthetic', 'syn-qwen2-chat-q8_0.gguf');
const TEMPLATE = join(SHARED, 'templates', 'Qwen-QwQ-32B.jinja');
const present = existsSync(MODEL) && existsSync(TEMPLATE);
if (!present) console.log(`SKIPPED: ${MODEL} or ${TEMPLATE} is absent (../shared is missing)`);

const USER = [{ role: 'user', content: 'How much is 17 times 23?' }];
const N = 10;

describe('reasoning output (a template that opens <think>)', { skip: !present }, () => {
  let srv, openai, anthropic, thinking;
  before(async () => {
    srv = await startServer(MODEL, ['--parallel', '4', '--threads', '2', '--chat-template', TEMPLATE]);
    openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    anthropic = new Anthropic({ apiKey: 'unused', baseURL: srv.base, maxRetries: 0 });
    // the reference: the same generation with the thinking left in content
    const raw = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0, reasoning_format: 'none' });
    assert.equal(raw.choices[0].message.reasoning_content, undefined);
    thinking = raw.choices[0].message.content;
    assert.ok(thinking.trim().length > 0, 'the model generated text');
    assert.ok(!thinking.includes('</think>'), 'the block stays open for the test (random weights)');
  });
  after(async () => { if (srv) assert.equal(await srv.stop(), 0); });

  test('chat: message.reasoning_content holds the thinking, content is empty', async () => {
    const r = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0 });
    const m = r.choices[0].message;
    assert.equal(m.reasoning_content, thinking.trim());
    assert.equal(m.content, '');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, N);
    assert.equal(r.usage.completion_tokens_details.reasoning_tokens, N, 'every token went to the open block');
  });

  test('chat streaming: delta.reasoning_content pieces give the same thinking, no content', async () => {
    const s = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0, stream: true });
    let reasoning = '', content = '', pieces = 0;
    for await (const ch of s) {
      const d = ch.choices[0]?.delta ?? {};
      if (d.reasoning_content) { reasoning += d.reasoning_content; pieces++; }
      if (d.content) content += d.content;
    }
    assert.equal(reasoning, thinking.trim());
    assert.equal(content, '');
    assert.ok(pieces > 1, 'the reasoning streams as it is generated');
  });

  test('chat_template_kwargs enable_thinking false and reasoning_effort none: the answer is content', async () => {
    const on = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: 2, temperature: 0 });
    for (const extra of [{ chat_template_kwargs: { enable_thinking: false } }, { reasoning_effort: 'none' }]) {
      const r = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0, ...extra });
      const m = r.choices[0].message;
      assert.equal(m.reasoning_content, undefined, JSON.stringify(extra));
      assert.ok(m.content.length > 0);
      assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0);
      assert.ok(r.usage.prompt_tokens > on.usage.prompt_tokens, 'the template closed the block in the prompt');
    }
    await assert.rejects(openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: 2, chat_template_kwargs: { enable_thinking: 'no' } }),
      (e) => e.status === 400 && /enable_thinking/.test(e.message));
    await assert.rejects(openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: 2, reasoning_format: 'sideways' }),
      (e) => e.status === 400 && /reasoning_format/.test(e.message));
  });

  test('responses: a reasoning output item, streamed as response.reasoning_text.delta', async () => {
    const r = await openai.responses.create({ model: 'x', input: USER[0].content, max_output_tokens: N, temperature: 0 });
    assert.equal(r.output[0].type, 'reasoning');
    assert.equal(r.output[0].content[0].type, 'reasoning_text');
    assert.equal(r.output[0].content[0].text, thinking.trim());
    assert.ok(!r.output.some((it) => it.type === 'message'), 'no empty message item');
    assert.equal(r.usage.output_tokens_details.reasoning_tokens, N);
    const s = await openai.responses.create({ model: 'x', input: USER[0].content, max_output_tokens: N, temperature: 0, stream: true });
    let deltas = '', done = null, final = null;
    for await (const ev of s) {
      if (ev.type === 'response.reasoning_text.delta') deltas += ev.delta;
      if (ev.type === 'response.reasoning_text.done') done = ev.text;
      if (ev.type === 'response.incomplete' || ev.type === 'response.completed') final = ev.response;
    }
    assert.equal(deltas, thinking.trim());
    assert.equal(done, deltas);
    assert.equal(final.output[0].content[0].text, deltas);
  });

  test('messages (@anthropic-ai/sdk): a thinking block, streamed as thinking_delta; thinking disabled: text', async () => {
    const params = { model: 'x', max_tokens: N, temperature: 0, messages: USER, thinking: { type: 'enabled', budget_tokens: 1024 } };
    const m = await anthropic.messages.create(params);
    assert.equal(m.content[0].type, 'thinking');
    assert.equal(m.content[0].thinking, thinking.trim());
    assert.equal(typeof m.content[0].signature, 'string');
    assert.equal(m.stop_reason, 'max_tokens');
    let deltas = '';
    const stream = anthropic.messages.stream(params).on('thinking', (d) => { deltas += d; });
    const fin = await stream.finalMessage();
    assert.equal(deltas, thinking.trim());
    assert.deepEqual(fin.content, m.content);
    const off = await anthropic.messages.create({ ...params, thinking: { type: 'disabled' } });
    assert.ok(off.content.every((b) => b.type === 'text'), JSON.stringify(off.content));
    assert.ok(off.content.length > 0);
  });

  test('the Messages routes without /v1', async () => {
    const body = JSON.stringify({ model: 'x', max_tokens: 3, messages: USER });
    const r = await fetch(`${srv.base}/messages`, { method: 'POST', body });
    assert.equal(r.status, 200);
    assert.equal((await r.json()).content[0].type, 'thinking');
    const c = await fetch(`${srv.base}/messages/count_tokens`, { method: 'POST', body: JSON.stringify({ model: 'x', messages: USER }) });
    assert.equal(c.status, 200);
    assert.ok((await c.json()).input_tokens > 0);
    const bad = await fetch(`${srv.base}/messages`, { method: 'POST', body: JSON.stringify({ model: 'x', messages: USER }) });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).type, 'error');
  });
});
