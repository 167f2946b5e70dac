// End-to-end tests of response_format (structured output) with the official OpenAI SDK. The model is a
// random-weight chat model at temperature 1, so only constrained decoding can produce schema-valid JSON.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');
const MODEL = join(SHARED, 'models', 'synthetic', 'syn-qwen2-chat-q8_0.gguf');
const have = existsSync(MODEL);
if (!have) console.log(`# SKIP structured output e2e: ${MODEL} not found (../shared is absent)`);

// A small JSON Schema validator for the keywords the schemas below use.
function validate(schema, v, defs, path = '$') {
  if (schema.$ref) return validate(defs[schema.$ref.replace('#/$defs/', '')], v, defs, path);
  if (schema.anyOf) {
    const errs = schema.anyOf.map((s) => validate(s, v, defs, path));
    return errs.some((e) => e.length === 0) ? [] : [`${path}: matches no anyOf branch (${errs.flat().join('; ')})`];
  }
  const err = [];
  const t = schema.type;
  const typeOf = (x) => (x === null ? 'null' : Array.isArray(x) ? 'array' : Number.isInteger(x) ? 'integer' : typeof x);
  const types = Array.isArray(t) ? t : t ? [t] : null;
  if (types) {
    const tv = typeOf(v);
    const ok = types.includes(tv) || (tv === 'integer' && types.includes('number'));
    if (!ok) return [`${path}: ${JSON.stringify(v)} is not of type ${types.join('|')}`];
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) err.push(`${path}: ${JSON.stringify(v)} not in enum`);
  if (typeof v === 'number') {
    if (schema.minimum !== undefined && v < schema.minimum) err.push(`${path}: ${v} < minimum ${schema.minimum}`);
    if (schema.maximum !== undefined && v > schema.maximum) err.push(`${path}: ${v} > maximum ${schema.maximum}`);
  }
  if (typeof v === 'string') {
    const n = [...v].length;
    if (schema.maxLength !== undefined && n > schema.maxLength) err.push(`${path}: length ${n} > ${schema.maxLength}`);
    if (schema.minLength !== undefined && n < schema.minLength) err.push(`${path}: length ${n} < ${schema.minLength}`);
  }
  if (Array.isArray(v)) {
    if (schema.maxItems !== undefined && v.length > schema.maxItems) err.push(`${path}: ${v.length} items > ${schema.maxItems}`);
    if (schema.minItems !== undefined && v.length < schema.minItems) err.push(`${path}: ${v.length} items < ${schema.minItems}`);
    if (schema.items) v.forEach((x, i) => err.push(...validate(schema.items, x, defs, `${path}[${i}]`)));
  }
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    for (const k of schema.required || []) if (!(k in v)) err.push(`${path}: missing ${k}`);
    for (const [k, x] of Object.entries(v)) {
      if (schema.properties && k in schema.properties) err.push(...validate(schema.properties[k], x, defs, `${path}.${k}`));
      else if (schema.additionalProperties === false) err.push(`${path}: unexpected key ${k}`);
    }
  }
  return err;
}

const SCHEMAS = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 12 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      tags: { type: 'array', items: { type: 'string', enum: ['red', 'green', 'blue'] }, maxItems: 3 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  bounded: {
    type: 'object',
    properties: {
      status: { enum: ['ok', 'warn', 'fail'] },
      count: { type: 'integer', minimum: -5, maximum: 17 },
      ratio: { type: 'number', minimum: 0, maximum: 1 },
      flag: { type: 'boolean' },
      note: { anyOf: [{ type: 'string', maxLength: 6 }, { type: 'null' }] },
    },
    required: ['status', 'count', 'ratio', 'flag', 'note'],
    additionalProperties: false,
  },
  nested: {
    type: 'object',
    $defs: { point: { type: 'object', properties: { x: { type: 'integer', minimum: 0, maximum: 9 }, y: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['x', 'y'], additionalProperties: false } },
    properties: {
      points: { type: 'array', items: { $ref: '#/$defs/point' }, minItems: 1, maxItems: 2 },
      label: { type: ['string', 'null'], maxLength: 4 },
    },
    required: ['points', 'label'],
    additionalProperties: false,
  },
};

const rf = (name) => ({ type: 'json_schema', json_schema: { name, strict: true, schema: SCHEMAS[name] } });
const MSG = [{ role: 'user', content: 'Answer in JSON.' }];

function assertValid(name, text) {
  let v;
  assert.doesNotThrow(() => { v = JSON.parse(text); }, `not JSON: ${text}`);
  const errs = validate(SCHEMAS[name], v, SCHEMAS[name].$defs || {});
  assert.deepEqual(errs, [], `${name}: ${text}`);
  return v;
}

describe('response_format', { skip: !have }, () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer(MODEL, ['--parallel', '16', '--threads', '2']);
    client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  });
  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM');
  });

  test('chat.completions.parse returns schema-valid JSON with finish_reason stop (temperature 1)', async () => {
    const jobs = [];
    for (const name of Object.keys(SCHEMAS))
      for (let seed = 1; seed <= 4; seed++)
        jobs.push(client.chat.completions.parse({ model: 'x', messages: MSG, temperature: 1, seed, max_tokens: 400, response_format: rf(name) })
          .then((r) => ({ name, r })));
    for (const { name, r } of await Promise.all(jobs)) {
      const ch = r.choices[0];
      assert.equal(ch.finish_reason, 'stop', `${name}: ${ch.message.content}`);
      const v = assertValid(name, ch.message.content);
      assert.deepEqual(ch.message.parsed, v, 'the SDK parsed the same value');
    }
  });

  test('n = 2, top_p/top_k/min_p and penalties: every choice valid', async () => {
    const r = await client.chat.completions.create({
      model: 'x', messages: MSG, temperature: 1, n: 2, seed: 9, max_tokens: 400, top_p: 0.9, top_k: 50, min_p: 0.01,
      presence_penalty: 0.5, frequency_penalty: 0.3, response_format: rf('bounded'),
    });
    assert.equal(r.choices.length, 2);
    for (const ch of r.choices) {
      assert.equal(ch.finish_reason, 'stop', ch.message.content);
      assertValid('bounded', ch.message.content);
    }
  });

  test('streaming: the accumulated deltas are schema-valid, finish_reason stop', async () => {
    const stream = await client.chat.completions.create({ model: 'x', messages: MSG, temperature: 1, seed: 5, max_tokens: 400, stream: true, response_format: rf('nested') });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        text += ch.delta.content || '';
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert.equal(finish, 'stop', text);
    assertValid('nested', text);
  });

  test('a seed reproduces the same constrained output', async () => {
    const ask = () => client.chat.completions.create({ model: 'x', messages: MSG, temperature: 1, seed: 77, max_tokens: 400, response_format: rf('person') });
    const [a, b] = await Promise.all([ask(), ask()]);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assertValid('person', a.choices[0].message.content);
  });

  test('/v1/completions accepts response_format as an extension', async () => {
    const r = await client.completions.create({ model: 'x', prompt: 'JSON:', temperature: 1, seed: 3, max_tokens: 400, response_format: rf('bounded') });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].text);
    assertValid('bounded', r.choices[0].text);
  });

  test('json_object: every finished answer is a JSON object', async () => {
    const rs = await Promise.all([1, 2, 3, 4, 5, 6, 7, 8].map((seed) =>
      client.chat.completions.create({ model: 'x', messages: MSG, temperature: 1, seed, max_tokens: 200, response_format: { type: 'json_object' } })));
    let stopped = 0;
    for (const r of rs) {
      const ch = r.choices[0];
      assert.ok(ch.message.content.startsWith('{'), ch.message.content);
      if (ch.finish_reason === 'stop') {
        stopped++;
        const v = JSON.parse(ch.message.content);
        assert.ok(v && typeof v === 'object' && !Array.isArray(v), ch.message.content);
      } else {
        assert.equal(ch.finish_reason, 'length'); // a random model may write a long object
      }
    }
    assert.ok(stopped > 0, 'no json_object answer finished within 200 tokens');
  });

  test('an unsupported keyword is a 400 naming it; a bad schema is a 400', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'x', messages: MSG, response_format: { type: 'json_schema', json_schema: { name: 'u', schema: { type: 'array', uniqueItems: true } } } }),
      (e) => e.status === 400 && e.param === 'response_format' && /uniqueItems/.test(e.message));
    await assert.rejects(
      client.chat.completions.create({ model: 'x', messages: MSG, response_format: { type: 'json_schema', json_schema: { name: 'b', schema: { $ref: '#/$defs/none' } } } }),
      (e) => e.status === 400 && e.param === 'response_format');
    await assert.rejects(
      client.chat.completions.create({ model: 'x', messages: MSG, response_format: { type: 'yaml' } }),
      (e) => e.status === 400 && e.param === 'response_format');
  });
});
