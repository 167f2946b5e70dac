// End-to-end: Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) with the official
// @anthropic-ai/sdk client, unmodified, against `kvserve serve` on the synthetic Qwen2 chat model with Qwen2.5's
// template (Hermes <tool_call> format). The weights are random: texts are compared between requests (greedy),
// never with expected words; tool calls are grammar-constrained (tool_choice any / a named tool), so their
// inputs are checked against the tool's schema. The server has an API key, which the SDK sends as x-api-key.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';

const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');
const MODEL = join(SHARED, 'models', 'synthetic', 'syn-qwen2-chat-q8_0.gguf');
const TEMPLATE = join(SHARED, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja');
const present = existsSync(MODEL) && existsSync(TEMPLATE);
if (!present) console.log(`SKIPPED: ${MODEL} or ${TEMPLATE} is absent (../shared is missing)`);

const KEY = 'sk-ant-kvserve-e2e';
const TOOLS = [
  {
    name: 'get_weather',
    description: 'The weather in a city',
    input_schema: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 10 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
  { name: 'get_time', description: 'The current time', input_schema: { type: 'object', properties: {}, additionalProperties: false } },
];
const USER = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkWeatherInput(input) {
  assert.equal(typeof input, 'object');
  assert.deepEqual(Object.keys(input).sort(), ['city', 'unit']);
  assert.equal(typeof input.city, 'string');
  assert.ok(input.city.length >= 1 && [...input.city].length <= 10, `city ${JSON.stringify(input.city)}`);
  assert.ok(['celsius', 'fahrenheit'].includes(input.unit));
}

function checkUsage(u) {
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens']) {
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k} = ${u[k]}`);
  }
}

describe('Anthropic Messages API with @anthropic-ai/sdk', { skip: !present }, () => {
  let srv, client;
  before(async () => {
    srv = await startServer(MODEL, ['--parallel', '4', '--threads', '2', '--chat-template', TEMPLATE, '--api-key', KEY]);
    client = new Anthropic({ apiKey: KEY, baseURL: srv.base, maxRetries: 0 });
  });
  after(async () => { if (srv) assert.equal(await srv.stop(), 0); });

  test('messages.create: a Message with a text block, stop_reason, usage; count_tokens agrees', async () => {
    const m = await client.messages.create({ model: 'claude-x', max_tokens: 12, temperature: 0, system: 'Be brief.', messages: USER });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.equal(m.content[0].type, 'text');
    assert.ok(m.content[0].text.length > 0);
    assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason));
    assert.equal(m.stop_sequence, null);
    checkUsage(m.usage);
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, 12);
    const c = await client.messages.countTokens({ model: 'claude-x', system: 'Be brief.', messages: USER });
    assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    // the same prompt again: its blocks come from the prefix cache
    const again = await client.messages.create({ model: 'claude-x', max_tokens: 12, temperature: 0, system: 'Be brief.', messages: USER });
    assert.equal(again.content[0].text, m.content[0].text);
    assert.ok(again.usage.cache_read_input_tokens > 0);
    // system as text blocks and content as text blocks: the same prompt
    const blocks = await client.messages.countTokens({
      model: 'claude-x', system: [{ type: 'text', text: 'Be brief.' }],
      messages: [{ role: 'user', content: [{ type: 'text', text: USER[0].content }] }],
    });
    assert.equal(blocks.input_tokens, c.input_tokens);
  });

  test('stop_sequences: stop_reason stop_sequence names the string', async () => {
    const m = await client.messages.create({ model: 'x', max_tokens: 16, temperature: 0, messages: USER });
    const text = m.content[0].text;
    assert.ok(text.length >= 8, `greedy text too short for the test: ${JSON.stringify(text)}`);
    const stop = text.slice(4, 8);
    const s = await client.messages.create({ model: 'x', max_tokens: 16, temperature: 0, messages: USER, stop_sequences: ['@@never@@', stop] });
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, stop);
    assert.equal((s.content[0]?.text ?? ''), text.slice(0, text.indexOf(stop)));
  });

  test('streaming: the stream helper and the raw events give the non-streamed text', async () => {
    const params = { model: 'x', max_tokens: 10, temperature: 0, messages: USER };
    const plain = await client.messages.create(params);
    let deltas = '';
    const stream = client.messages.stream(params).on('text', (d) => { deltas += d; });
    const fin = await stream.finalMessage();
    assert.equal(deltas, plain.content[0].text);
    assert.equal(fin.content[0].text, plain.content[0].text);
    assert.equal(fin.stop_reason, plain.stop_reason);
    assert.equal(fin.usage.output_tokens, plain.usage.output_tokens);
    assert.equal(fin.usage.input_tokens + fin.usage.cache_read_input_tokens,
      plain.usage.input_tokens + plain.usage.cache_read_input_tokens);

    const raw = await client.messages.create({ ...params, stream: true });
    const types = [];
    let text = '';
    for await (const ev of raw) {
      types.push(ev.type);
      if (ev.type === 'content_block_delta') { assert.equal(ev.delta.type, 'text_delta'); text += ev.delta.text; }
      if (ev.type === 'message_start') { assert.deepEqual(ev.message.content, []); assert.equal(ev.message.stop_reason, null); }
      if (ev.type === 'message_delta') { assert.equal(ev.delta.stop_reason, plain.stop_reason); assert.equal(ev.usage.output_tokens, plain.usage.output_tokens); }
    }
    assert.equal(text, plain.content[0].text);
    assert.equal(types[0], 'message_start');
    assert.equal(types[1], 'content_block_start');
    assert.equal(types.at(-3), 'content_block_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(types.at(-1), 'message_stop');
  });

  test('tools: tool_choice any gives tool_use blocks with valid input (several seeds at temperature 1)', async () => {
    for (let i = 0; i < 4; i++) {
      const m = await client.messages.create({ model: 'x', max_tokens: 1200, temperature: 1, messages: USER, tools: TOOLS, tool_choice: { type: 'any' } });
      assert.equal(m.stop_reason, 'tool_use');
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.ok(uses.length >= 1);
      for (const u of uses) {
        assert.match(u.id, /^toolu_/);
        if (u.name === 'get_weather') checkWeatherInput(u.input);
        else { assert.equal(u.name, 'get_time'); assert.deepEqual(u.input, {}); }
      }
    }
  });

  test('tools: a named tool, streamed as input_json_delta, and the stream helper parses its input', async () => {
    const params = { model: 'x', max_tokens: 1200, temperature: 1, messages: USER, tools: TOOLS,
      tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(uses[0].name, 'get_weather');
    checkWeatherInput(uses[0].input);

    const raw = await client.messages.create({ ...params, stream: true });
    let json = '', started = null;
    for await (const ev of raw) {
      if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use') started = ev.content_block;
      if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') json += ev.delta.partial_json;
      if (ev.type === 'message_delta') assert.equal(ev.delta.stop_reason, 'tool_use');
    }
    assert.equal(started.name, 'get_weather');
    checkWeatherInput(JSON.parse(json));

    const fin = await client.messages.stream(params).finalMessage();
    const fu = fin.content.find((b) => b.type === 'tool_use');
    assert.equal(fu.name, 'get_weather');
    checkWeatherInput(fu.input);
    assert.equal(fin.stop_reason, 'tool_use');
  });

  test('tool_result round trip: the call and its result in the history', async () => {
    const first = await client.messages.create({ model: 'x', max_tokens: 1200, temperature: 1, messages: USER, tools: TOOLS,
      tool_choice: { type: 'tool', name: 'get_weather' } });
    const use = first.content.find((b) => b.type === 'tool_use');
    assert.ok(use);
    const messages = [
      ...USER,
      { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 degrees, sunny' }, { type: 'text', text: 'Thanks!' }] },
    ];
    const m = await client.messages.create({ model: 'x', max_tokens: 8, temperature: 0, messages, tools: TOOLS });
    assert.equal(m.type, 'message');
    assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(m.stop_reason));
    const c = await client.messages.countTokens({ model: 'x', messages, tools: TOOLS });
    assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    // the result's text is in the prompt: a longer result is more tokens
    const longer = structuredClone(messages);
    longer[2].content[0].content = [{ type: 'text', text: '18 degrees, sunny, with a light wind from the west' }];
    assert.ok((await client.messages.countTokens({ model: 'x', messages: longer, tools: TOOLS })).input_tokens > c.input_tokens);
    // an unknown tool_use_id is a 400
    const bad = structuredClone(messages);
    bad[2].content[0].tool_use_id = 'toolu_unknown';
    await assert.rejects(client.messages.create({ model: 'x', max_tokens: 8, messages: bad, tools: TOOLS }),
      (e) => e instanceof Anthropic.BadRequestError && /toolu_unknown/.test(e.message));
  });

  test('errors: Anthropic error shapes surface as the SDK error classes', async () => {
    await assert.rejects(client.messages.create({ model: 'x', messages: USER }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.match(e.error.error.message, /max_tokens/);
      return true;
    });
    await assert.rejects(client.messages.create({ model: 'x', max_tokens: 4,
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }] }),
    (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.error.error.message));
    const wrong = new Anthropic({ apiKey: 'wrong', baseURL: srv.base, maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: 'x', max_tokens: 4, messages: USER }),
      (e) => e instanceof Anthropic.AuthenticationError);
    // the key as x-api-key works on the OpenAI routes too; a 404 under /v1/messages is in Anthropic's shape
    const r = await fetch(`${srv.base}/v1/models`, { headers: { 'x-api-key': KEY } });
    assert.equal(r.status, 200);
    const nf = await fetch(`${srv.base}/v1/messages/batches`, { headers: { 'x-api-key': KEY } });
    assert.equal(nf.status, 404);
    assert.equal((await nf.json()).error.type, 'not_found_error');
  });
});
