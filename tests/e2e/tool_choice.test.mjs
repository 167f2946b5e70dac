// End-to-end: tool_choice "required" and a named function are grammar-constrained (issue 10), with the official
// OpenAI SDK against `kvserve serve` on the synthetic Qwen2 chat model. Its weights are random and it runs at
// temperature 1, so only constrained decoding can produce calls whose arguments are valid: every call's arguments
// are checked by a real JSON Schema validator (Debian's python3-jsonschema, Draft 2020-12) against the function's
// parameters. With Qwen2.5's template (Hermes <tool_call> format), then with the built-in families forced by
// --chat-template (chatml, llama3, mistral, gemma: each its own format, the tools written into the prompt).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');
const MODEL = join(SHARED, 'models', 'synthetic', 'syn-qwen2-chat-q8_0.gguf');
const TEMPLATE = join(SHARED, 'templates', 'Qwen-Qwen2.5-7B-Instruct.jinja');
const present = existsSync(MODEL) && existsSync(TEMPLATE);
if (!present) console.log(`SKIPPED: ${MODEL} or ${TEMPLATE} is absent (../shared is missing)`);

// ---- a real JSON Schema validator ---------------------------------------------------------------------------
const PY = `import json, sys
from jsonschema import Draft202012Validator
out = []
for schema, value in json.load(sys.stdin):
    out.append([e.message for e in Draft202012Validator(schema).iter_errors(value)])
print(json.dumps(out))`;

function findPython() {
  // Debian's python3 first: python3-jsonschema (scripts/install-deps.sh) is installed for it
  for (const p of ['/usr/bin/python3', 'python3']) {
    try { execFileSync(p, ['-c', 'import jsonschema'], { stdio: 'ignore' }); return p; } catch { /* next */ }
  }
  return null;
}
const PYTHON = present ? findPython() : null;

// [[schema, value], ...] -> one array of error messages per pair
function validateAll(pairs) {
  assert.ok(PYTHON, 'no python3 with jsonschema: run scripts/install-deps.sh (python3-jsonschema)');
  return JSON.parse(execFileSync(PYTHON, ['-c', PY], { input: JSON.stringify(pairs) }).toString());
}

// ---- the tools ----------------------------------------------------------------------------------------------
const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', minLength: 1, maxLength: 12 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
          days: { type: 'integer', minimum: 1, maximum: 7 },
        },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'search', description: 'Search the web',
      parameters: {
        type: 'object',
        $defs: { filter: { type: 'string', enum: ['news', 'web', 'images'] } },
        properties: {
          query: { type: 'string', maxLength: 16 },
          limit: { anyOf: [{ type: 'integer', minimum: 1, maximum: 5 }, { type: 'null' }] },
          filters: { type: 'array', items: { $ref: '#/$defs/filter' }, minItems: 1, maxItems: 2 },
          score: { type: 'number', minimum: 0, maximum: 1 },
        },
        required: ['query', 'limit', 'filters', 'score'],
        additionalProperties: false,
      },
    },
  },
  { type: 'function', function: { name: 'get_time', description: 'The current time' } }, // no parameters: {}
];
const PARAMS = Object.fromEntries(TOOLS.map((t) => [t.function.name,
  t.function.parameters || { type: 'object', properties: {}, additionalProperties: false }]));
const USER = [{ role: 'user', content: 'What is the weather in Paris?' }];

// Checks a message's tool calls: names allowed, arguments JSON valid against the parameters. Returns the calls.
function checkCalls(message, finish, { names = Object.keys(PARAMS), one = false } = {}) {
  const calls = message.tool_calls;
  assert.equal(finish, 'tool_calls', `finish_reason ${finish}: ${JSON.stringify(message)}`);
  assert.ok(Array.isArray(calls) && calls.length >= 1, JSON.stringify(message));
  if (one) assert.equal(calls.length, 1, `parallel_tool_calls false: ${JSON.stringify(calls)}`);
  assert.ok(!message.content, `no content besides the calls: ${JSON.stringify(message.content)}`);
  const pairs = [];
  for (const c of calls) {
    assert.equal(c.type, 'function');
    assert.match(c.id, /^call_/);
    assert.ok(names.includes(c.function.name), `unexpected function ${c.function.name}`);
    let args;
    assert.doesNotThrow(() => { args = JSON.parse(c.function.arguments); }, `arguments not JSON: ${c.function.arguments}`);
    pairs.push([PARAMS[c.function.name], args]);
  }
  validateAll(pairs).forEach((errs, i) => assert.deepEqual(errs, [], `${calls[i].function.name}: ${calls[i].function.arguments}`));
  return calls;
}

function makeClient(srv) {
  return new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
}

const SEEDS = [1, 2, 3, 4, 5, 6];
const base = { model: 'x', messages: USER, tools: TOOLS, temperature: 1, max_tokens: 1200 };

describe('constrained tool calls with the model\'s template (Qwen2.5, Hermes format)', { skip: !present && 'shared model or template absent' }, () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer(MODEL, ['--parallel', '16', '--threads', '2', '--chat-template', TEMPLATE]);
    client = makeClient(srv);
  });
  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM');
  });

  test('tool_choice required: valid calls for every seed (temperature 1)', async () => {
    const rs = await Promise.all(SEEDS.map((seed) => client.chat.completions.create({ ...base, seed, tool_choice: 'required' })));
    let several = 0;
    for (const r of rs) several += checkCalls(r.choices[0].message, r.choices[0].finish_reason).length > 1;
    console.log(`# required: ${several} of ${SEEDS.length} answers made several calls`);
  });

  test('tool_choice required, streamed: the calls the SDK accumulates are valid', async () => {
    for (const seed of SEEDS.slice(0, 4)) {
      const s = client.chat.completions.stream({ ...base, seed, tool_choice: 'required' });
      const done = await s.finalChatCompletion();
      checkCalls(done.choices[0].message, done.choices[0].finish_reason);
    }
  });

  test('a named function: only its calls, valid, streamed and not', async () => {
    for (const name of ['search', 'get_weather', 'get_time']) {
      const tool_choice = { type: 'function', function: { name } };
      const r = await client.chat.completions.create({ ...base, seed: 11, tool_choice });
      checkCalls(r.choices[0].message, r.choices[0].finish_reason, { names: [name] });
      const s = client.chat.completions.stream({ ...base, seed: 12, tool_choice });
      const done = await s.finalChatCompletion();
      checkCalls(done.choices[0].message, done.choices[0].finish_reason, { names: [name] });
    }
  });

  test('parallel_tool_calls false: exactly one call', async () => {
    const rs = await Promise.all(SEEDS.map((seed) =>
      client.chat.completions.create({ ...base, seed, tool_choice: 'required', parallel_tool_calls: false })));
    for (const r of rs) checkCalls(r.choices[0].message, r.choices[0].finish_reason, { one: true });
    const s = client.chat.completions.stream({ ...base, seed: 8, tool_choice: 'required', parallel_tool_calls: false });
    const done = await s.finalChatCompletion();
    checkCalls(done.choices[0].message, done.choices[0].finish_reason, { one: true });
  });

  test('n = 3 and seeds: every choice valid, a seed reproduces the calls', async () => {
    const ask = () => client.chat.completions.create({ ...base, seed: 21, n: 3, tool_choice: 'required' });
    const [a, b] = await Promise.all([ask(), ask()]);
    assert.equal(a.choices.length, 3);
    for (const ch of a.choices) checkCalls(ch.message, ch.finish_reason);
    const strip = (r) => r.choices.map((ch) => ch.message.tool_calls.map((c) => c.function));
    assert.deepEqual(strip(a), strip(b), 'the same seed gives the same calls');
  });

  test('a parameters keyword the grammar cannot honour is a 400 naming it', async () => {
    const bad = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'array', uniqueItems: true } } } } }];
    await assert.rejects(client.chat.completions.create({ ...base, tools: bad, tool_choice: 'required' }),
      (e) => e.status === 400 && e.param === 'tools' && /uniqueItems/.test(e.message) && /'f'/.test(e.message));
    const notObject = [{ type: 'function', function: { name: 'g', parameters: { type: 'string' } } }];
    await assert.rejects(client.chat.completions.create({ ...base, tools: notObject, tool_choice: { type: 'function', function: { name: 'g' } } }),
      (e) => e.status === 400 && e.param === 'tools');
    // tool_choice auto is not constrained: the same tools are accepted
    const r = await client.chat.completions.create({ ...base, tools: bad, max_tokens: 2 });
    assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  });
});

// The built-in families (no Jinja template): the tools written into the system prompt, calls in the family's
// format, and the history's calls and results written as the family shows them.
for (const family of ['chatml', 'llama3', 'mistral', 'gemma']) {
  describe(`constrained tool calls with the built-in ${family} family`, { skip: !present && 'shared model absent' }, () => {
    let srv;
    let client;
    before(async () => {
      srv = await startServer(MODEL, ['--parallel', '8', '--threads', '2', '--chat-template', family]);
      client = makeClient(srv);
    });
    after(async () => {
      if (srv) assert.equal(await srv.stop(), 0);
    });

    test('the tools are in the prompt; tool_choice none leaves them out', async () => {
      const plain = await client.chat.completions.create({ model: 'x', messages: USER, max_tokens: 1 });
      const auto = await client.chat.completions.create({ model: 'x', messages: USER, tools: TOOLS, max_tokens: 1 });
      const none = await client.chat.completions.create({ model: 'x', messages: USER, tools: TOOLS, tool_choice: 'none', max_tokens: 1 });
      assert.ok(auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50, `${auto.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
      assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
      // a history with a call and its result renders (and adds tokens)
      const history = [...USER,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"celsius"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' }];
      const h = await client.chat.completions.create({ model: 'x', messages: history, tools: TOOLS, max_tokens: 1 });
      assert.ok(h.usage.prompt_tokens > auto.usage.prompt_tokens + 15, `${h.usage.prompt_tokens} vs ${auto.usage.prompt_tokens}`);
    });

    test('tool_choice required and a named function: valid calls, streamed and not', async () => {
      const rs = await Promise.all([31, 32, 33].map((seed) => client.chat.completions.create({ ...base, seed, tool_choice: 'required' })));
      for (const r of rs) checkCalls(r.choices[0].message, r.choices[0].finish_reason);
      const s = client.chat.completions.stream({ ...base, seed: 34, tool_choice: { type: 'function', function: { name: 'search' } }, parallel_tool_calls: false });
      const done = await s.finalChatCompletion();
      checkCalls(done.choices[0].message, done.choices[0].finish_reason, { names: ['search'], one: true });
    });
  });
}
