#!/usr/bin/env node
// Structured-output checks against any OpenAI-compatible server: json_schema variants (enum, const, anyOf,
// oneOf, $ref, arrays with min/maxItems, strings with min/maxLength and pattern, integer and number bounds,
// nullable, ...), json_object, and tool_choice "required" / a named function (with and without
// parallel_tool_calls, streamed). Meant for a random-weight chat model at temperature 1, where only constrained
// decoding can pass. Each check runs with --seeds seeds; it passes when every run does: HTTP 200, the expected
// finish_reason ("stop" for response_format, "tool_calls" for tools), and JSON valid against the schema (or the
// function's parameters), checked with Python's jsonschema (Draft 2020-12; Debian's python3-jsonschema).
//
//   node bench/structured_checks.mjs --url http://127.0.0.1:8080 [--seeds 3] [--max-tokens 400] [--json]
//
// The same model and chat template on both servers, for instance:
//   kvserve serve -m ../shared/models/synthetic/syn-qwen2-chat-q8_0.gguf \
//       --chat-template ../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja --port 8090
//   llama-server -m ../shared/models/synthetic/syn-qwen2-chat-q8_0.gguf --jinja \
//       --chat-template-file ../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja --port 8091
import { execFileSync } from 'node:child_process';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8080' },
    seeds: { type: 'string', default: '3' },
    'max-tokens': { type: 'string', default: '400' },
    json: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (opt.help) {
  console.log('usage: structured_checks.mjs --url URL [--seeds N] [--max-tokens T] [--json]');
  process.exit(0);
}
const SEEDS = Array.from({ length: parseInt(opt.seeds, 10) }, (_, i) => i + 1);
const MAX_TOKENS = parseInt(opt['max-tokens'], 10);

// ---- the validator --------------------------------------------------------------------------------------------
const PY = `import json, sys
from jsonschema import Draft202012Validator
out = []
for schema, value in json.load(sys.stdin):
    out.append([e.message for e in Draft202012Validator(schema).iter_errors(value)])
print(json.dumps(out))`;
let PYTHON = null;
for (const p of ['/usr/bin/python3', 'python3']) {
  try { execFileSync(p, ['-c', 'import jsonschema'], { stdio: 'ignore' }); PYTHON = p; break; } catch { /* next */ }
}
if (!PYTHON) {
  console.error('structured_checks: no python3 with jsonschema (apt-get install python3-jsonschema)');
  process.exit(2);
}
function schemaErrors(schema, value) {
  return JSON.parse(execFileSync(PYTHON, ['-c', PY], { input: JSON.stringify([[schema, value]]) }).toString())[0];
}

// ---- the checks ------------------------------------------------------------------------------------------------
const obj = (properties, required = Object.keys(properties)) => ({ type: 'object', properties, required, additionalProperties: false });
const SCHEMAS = [
  ['enum', obj({ color: { type: 'string', enum: ['red', 'green', 'blue'] } })],
  ['const', obj({ kind: { const: 'point' }, v: { type: 'integer', minimum: 0, maximum: 9 } })],
  ['anyOf', obj({ id: { anyOf: [{ type: 'integer', minimum: 0, maximum: 999 }, { type: 'string', maxLength: 6 }] } })],
  ['oneOf', obj({ shape: { oneOf: [obj({ r: { type: 'integer', minimum: 1, maximum: 9 } }),
    obj({ w: { type: 'integer', minimum: 1, maximum: 9 }, h: { type: 'integer', minimum: 1, maximum: 9 } })] } })],
  ['$ref/$defs', { ...obj({ a: { $ref: '#/$defs/p' }, b: { $ref: '#/$defs/p' } }),
    $defs: { p: obj({ x: { type: 'integer', minimum: 0, maximum: 9 }, y: { type: 'integer', minimum: 0, maximum: 9 } }) } }],
  ['array minItems/maxItems', obj({ xs: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 99 }, minItems: 2, maxItems: 4 } })],
  ['top-level array', { type: 'array', items: { type: 'string', enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 }],
  ['string minLength/maxLength', obj({ s: { type: 'string', minLength: 3, maxLength: 8 } })],
  ['string pattern', obj({ code: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' } })],
  ['integer minimum/maximum', obj({ n: { type: 'integer', minimum: -20, maximum: 20 } })],
  ['integer narrow range', obj({ n: { type: 'integer', minimum: 1000, maximum: 1099 } })],
  ['number minimum/maximum', obj({ x: { type: 'number', minimum: 0, maximum: 1 } })],
  ['exclusiveMinimum/Maximum', obj({ x: { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 } })],
  ['nullable (type list)', obj({ v: { type: ['string', 'null'], maxLength: 5 } })],
  ['nullable (anyOf null)', obj({ v: { anyOf: [{ type: 'integer', minimum: 0, maximum: 5 }, { type: 'null' }] } })],
  ['boolean and nested object', obj({ ok: { type: 'boolean' }, meta: obj({ a: { type: 'integer', minimum: 0, maximum: 3 } }) })],
  ['enum of mixed values', obj({ v: { enum: [1, 'two', null, true] } })],
  ['optional properties', obj({ a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'string', maxLength: 4 }, c: { type: 'boolean' } }, ['a'])],
];

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: obj({
    city: { type: 'string', minLength: 1, maxLength: 12 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    days: { type: 'integer', minimum: 1, maximum: 7 } }, ['city', 'unit']) } },
  { type: 'function', function: { name: 'search', description: 'Search the web', parameters: obj({
    query: { type: 'string', maxLength: 16 }, limit: { anyOf: [{ type: 'integer', minimum: 1, maximum: 5 }, { type: 'null' }] },
    score: { type: 'number', minimum: 0, maximum: 1 } }) } },
];
const PARAMS = Object.fromEntries(TOOLS.map((t) => [t.function.name, t.function.parameters]));

const CHECKS = [
  ...SCHEMAS.map(([name, schema]) => ({ name: `json_schema: ${name}`, kind: 'schema', schema,
    body: { response_format: { type: 'json_schema', json_schema: { name: 'out', strict: true, schema } } } })),
  { name: 'json_object', kind: 'object', body: { response_format: { type: 'json_object' } } },
  { name: 'tool_choice required (one tool)', kind: 'tools', body: { tools: TOOLS.slice(0, 1), tool_choice: 'required' } },
  { name: 'tool_choice required (two tools)', kind: 'tools', body: { tools: TOOLS, tool_choice: 'required' } },
  { name: 'tool_choice named', kind: 'tools', names: ['search'],
    body: { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'search' } } } },
  { name: 'tool_choice required, parallel_tool_calls false', kind: 'tools', one: true,
    body: { tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false } },
  { name: 'tool_choice required, streamed', kind: 'tools', stream: true, body: { tools: TOOLS, tool_choice: 'required' } },
];

// ---- requests --------------------------------------------------------------------------------------------------
async function post(body) {
  const r = await fetch(`${opt.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  if (!body.stream) return { status: r.status, json: r.status === 200 ? await r.json() : await r.text() };
  if (r.status !== 200) return { status: r.status, json: await r.text() };
  // accumulate the SSE chunks as the openai SDK does: content appended, tool_calls by index
  const text = await r.text();
  const msg = { content: '', tool_calls: [] };
  let finish = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ch = JSON.parse(line.slice(6)).choices?.[0];
    if (!ch) continue;
    if (ch.delta?.content) msg.content += ch.delta.content;
    for (const tc of ch.delta?.tool_calls || []) {
      const cur = msg.tool_calls[tc.index] ||= { id: '', type: 'function', function: { name: '', arguments: '' } };
      if (tc.id) cur.id = tc.id;
      if (tc.function?.name) cur.function.name += tc.function.name;
      if (tc.function?.arguments) cur.function.arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { status: 200, json: { choices: [{ message: msg, finish_reason: finish }] } };
}

// One run of a check: '' when it passed, else why not.
async function runOnce(c, seed) {
  const body = { model: 'x', messages: [{ role: 'user', content: 'Answer the question, in JSON where asked. What is the weather in Paris?' }],
    temperature: 1, seed, max_tokens: MAX_TOKENS, ...c.body, ...(c.stream ? { stream: true } : {}) };
  let r;
  try { r = await post(body); } catch (e) { return `request failed: ${e.message}`; }
  if (r.status !== 200) return `HTTP ${r.status}: ${String(typeof r.json === 'string' ? r.json : JSON.stringify(r.json)).slice(0, 160)}`;
  const ch = r.json.choices?.[0];
  if (!ch) return 'no choice';
  const m = ch.message || {};
  if (c.kind !== 'tools') {
    if (ch.finish_reason !== 'stop') return `finish_reason ${ch.finish_reason}`;
    let v;
    try { v = JSON.parse(m.content); } catch { return `not JSON: ${String(m.content).slice(0, 80)}`; }
    if (c.kind === 'object') return v && typeof v === 'object' && !Array.isArray(v) ? '' : 'not an object';
    const errs = schemaErrors(c.schema, v);
    return errs.length ? `invalid: ${errs[0]} in ${m.content.slice(0, 80)}` : '';
  }
  if (ch.finish_reason !== 'tool_calls') return `finish_reason ${ch.finish_reason}: ${String(m.content).slice(0, 80)}`;
  const calls = m.tool_calls || [];
  if (calls.length === 0) return 'no tool_calls';
  if (c.one && calls.length !== 1) return `${calls.length} calls with parallel_tool_calls false`;
  for (const call of calls) {
    const name = call.function?.name;
    if (!(c.names || Object.keys(PARAMS)).includes(name) || !(c.body.tools.some((t) => t.function.name === name)))
      return `unexpected function ${name}`;
    let args;
    try { args = JSON.parse(call.function.arguments); } catch { return `arguments not JSON: ${call.function.arguments}`; }
    const errs = schemaErrors(PARAMS[name], args);
    if (errs.length) return `arguments invalid: ${errs[0]} in ${call.function.arguments}`;
  }
  return '';
}

const results = [];
for (const c of CHECKS) {
  const fails = [];
  for (const seed of SEEDS) {
    const why = await runOnce(c, seed);
    if (why) fails.push(`seed ${seed}: ${why}`);
  }
  results.push({ name: c.name, pass: fails.length === 0, runs: SEEDS.length, failed: fails.length, why: fails });
  if (!opt.json) console.log(`${fails.length === 0 ? 'PASS' : 'FAIL'}  ${c.name}${fails.length ? `  (${fails.length}/${SEEDS.length} failed; ${fails[0]})` : ''}`);
}
const passed = results.filter((r) => r.pass).length;
if (opt.json) console.log(JSON.stringify({ url: opt.url, seeds: SEEDS.length, passed, total: results.length, results }, null, 1));
else console.log(`${passed} of ${results.length} checks passed (${SEEDS.length} seeds each, temperature 1, max_tokens ${MAX_TOKENS})`);
