// gpt-oss end to end with the official `openai` client: a tiny gpt-oss model written by `kvserve mkmodel --preset
// tiny-oss` (harmony tokens, its harmony chat template) and quantized by `kvserve quantize ... MXFP4_MOE` (experts
// MXFP4), served as it is (no --chat-template). The weights are random, so the texts are compared between requests
// (temperature 0): the raw text (reasoning_format "none") against its split into reasoning_content and content, the
// stream against the whole answer, chat against Responses. Scripted harmony answers (analysis -> reasoning_content,
// a commentary call -> tool_calls, exact reasoning_tokens) are in test_api (fake engine).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { BINARY, startServer } from './server.mjs';

const dir = mkdtempSync(join(tmpdir(), 'kvserve-e2e-oss-'));
const N = 24;
const USER = [{ role: 'user', content: 'Hello, how is the weather?' }];
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'the weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

describe('gpt-oss (mkmodel tiny-oss, MXFP4 experts, harmony template)', () => {
  let srv, openai;
  before(async () => {
    const f16 = join(dir, 'oss-f16.gguf'), model = join(dir, 'oss.gguf');
    execFileSync(BINARY, ['mkmodel', '-o', f16, '--preset', 'tiny-oss', '--type', 'f16', '--swa', '8'], { stdio: 'ignore' });
    execFileSync(BINARY, ['quantize', f16, model, 'MXFP4_MOE'], { stdio: 'ignore' });
    srv = await startServer(model, ['--parallel', '4', '--threads', '2']);
    openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  });
  after(async () => {
    try { if (srv) assert.equal(await srv.stop(), 0); } finally { rmSync(dir, { recursive: true, force: true }); }
  });

  test('the model and its harmony template load: reasoning_effort and tools reach the prompt', async () => {
    const ask = (extra) => openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: 1, temperature: 0, ...extra });
    const plain = await ask({});
    const tools = await ask({ tools: TOOLS });
    assert.ok(tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10, 'the tools are declared in a developer message');
    const sys = await openai.chat.completions.create({ model: 'x', max_tokens: 1, temperature: 0,
      messages: [{ role: 'system', content: 'Answer in one word.' }, ...USER] });
    assert.ok(sys.usage.prompt_tokens > plain.usage.prompt_tokens + 3, 'the system prompt becomes the instructions');
    for (const effort of ['low', 'medium', 'high']) {
      const r = await ask({ reasoning_effort: effort });
      assert.equal(r.usage.completion_tokens, 1, effort);
    }
  });

  test('chat: the answer split by harmony channels is the raw text with its markers removed', async () => {
    const raw = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0,
      reasoning_format: 'none' });
    const text = raw.choices[0].message.content;
    assert.equal(raw.choices[0].message.reasoning_content, undefined);
    assert.equal(raw.usage.completion_tokens_details.reasoning_tokens, 0);
    const r = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0 });
    const m = r.choices[0].message;
    const reasoning = m.reasoning_content ?? '';
    const rt = r.usage.completion_tokens_details.reasoning_tokens;
    assert.ok(rt >= 0 && rt <= r.usage.completion_tokens);
    if (!text.startsWith('<|')) { // not harmony: all of it is the answer
      assert.equal(m.content, text);
      assert.equal(reasoning, '');
      assert.equal(rt, 0);
    } else { // what came out of the split is in the raw text
      assert.ok(text.includes(reasoning), `${JSON.stringify(reasoning)} in ${JSON.stringify(text)}`);
      if (reasoning) assert.ok(rt > 0, 'reasoning text comes from reasoning tokens');
    }
    // the stream gives the same split
    const s = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let sr = '', sc = '', usage = null;
    for await (const ch of s) {
      const d = ch.choices[0]?.delta ?? {};
      if (d.reasoning_content) sr += d.reasoning_content;
      if (d.content) sc += d.content;
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(sr, reasoning);
    assert.equal(sc, m.content ?? '');
    assert.equal(usage.completion_tokens_details.reasoning_tokens, rt);
  });

  test('responses: the same generation, output_tokens_details.reasoning_tokens as chat counts it', async () => {
    const c = await openai.chat.completions.create({ model: 'x', messages: USER, max_tokens: N, temperature: 0,
      reasoning_effort: 'low' });
    const r = await openai.responses.create({ model: 'x', input: USER[0].content, max_output_tokens: N,
      temperature: 0, reasoning: { effort: 'low' } });
    assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(r.usage.output_tokens_details.reasoning_tokens, c.usage.completion_tokens_details.reasoning_tokens);
    const item = r.output.find((it) => it.type === 'reasoning');
    assert.equal(item ? item.content[0].text : '', c.choices[0].message.reasoning_content ?? '');
  });
});
