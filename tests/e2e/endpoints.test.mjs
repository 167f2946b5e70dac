// End-to-end tests of /v1/embeddings, /v1/responses and fill-in-the-middle through the official openai SDK
// against a real `kvserve serve`.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, testModel, BINARY } from './server.mjs';

const model = testModel();
let srv;
let client;

// llama.cpp's vectors for stories260K, mean pooling, L2-normalized, produced with
//   llama-embedding -m stories260K.gguf -p "<prompt>" --pooling mean --embd-normalize 2 --embd-output-format json
// (llama.cpp build at /work/llama.cpp, rounded to 6 decimals). kvserve must agree within cosine 0.9999.
const LLAMA_CPP_MEAN = {
  'Once upon a time': [-0.016447, -0.073052, -0.028495, -0.123013, 0.088191, -0.263961, 0.10684, -0.023528, -0.05415, 0.025969, 0.07498, -0.122255, -0.110664, 0.03142, -0.232637, -0.447129, -0.029394, -0.193641, 0.072334, -0.223932, -0.017336, 0.044037, 0.034576, 0.219737, -0.025476, 0.073239, 0.044963, 0.060518, -0.015261, -0.107921, 0.138735, 0.507298, 0.104145, 0.103586, -0.043783, -0.112778, 0.139356, 0.055488, 0.014805, 0.139611, 0.018458, 0.060207, -0.047113, -0.016269, 0.059475, 0.095036, -0.008985, 0.036836, 0.063631, -0.009543, -0.001068, 0.01518, -0.002895, -0.094196, 0.120427, 0.000774, 0.036198, -0.005352, 0.034617, -0.113327, -0.041681, -0.009628, -0.055822, -0.070569],
  'Lily and Tom went to the park.': [0.029939, -0.115107, 0.005268, -0.003909, -0.019015, -0.277889, -0.020528, 0.05756, -0.031431, -0.083526, 0.06873, 0.081688, -0.086667, 0.05965, -0.112985, -0.386253, -0.032753, -0.163131, 0.05096, -0.190659, -0.060691, -0.007689, -0.076852, 0.068042, -0.073037, -0.003209, 0.13931, 0.064822, -4.8e-05, -0.107375, 0.110857, 0.500436, 0.147399, 0.003164, 0.174791, -0.242202, 0.0722, -0.208089, 0.010349, 0.080493, 0.191203, 0.035099, 0.034987, 0.017755, 0.005041, 0.098529, -0.049545, 0.029848, 0.011396, -0.001048, -0.044029, -0.035679, 0.098464, -0.144633, 0.12538, -0.060557, 0.109566, -0.117623, 0.044451, -0.161441, 0.010366, -0.024028, 0.031979, -0.024444],
};

function cosine(a, b) {
  let d = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { d += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return d / Math.sqrt(na * nb);
}
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

before(async () => {
  srv = await startServer(model.path, ['--parallel', '8', '--threads', '2']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM');
});

describe('embeddings', () => {
  test('default (base64) and float encodings give the same unit vectors', async () => {
    const input = ['Once upon a time', 'Lily and Tom went to the park.'];
    const b = await client.embeddings.create({ model: 'x', input }); // the SDK asks for base64 and decodes it
    const f = await client.embeddings.create({ model: 'x', input, encoding_format: 'float' });
    assert.equal(b.object, 'list');
    assert.equal(b.data.length, 2);
    for (let i = 0; i < 2; i++) {
      assert.equal(b.data[i].index, i);
      assert.equal(b.data[i].object, 'embedding');
      assert.equal(b.data[i].embedding.length, f.data[i].embedding.length);
      for (let k = 0; k < f.data[i].embedding.length; k++)
        assert.ok(Math.abs(b.data[i].embedding[k] - f.data[i].embedding[k]) < 1e-6);
      assert.ok(Math.abs(norm(f.data[i].embedding) - 1) < 1e-4, 'L2-normalized');
    }
    assert.ok(f.usage.prompt_tokens > 2);
    assert.equal(f.usage.total_tokens, f.usage.prompt_tokens);
    assert.ok(cosine(f.data[0].embedding, f.data[1].embedding) < 0.9999, 'different texts, different vectors');
  });

  test('vectors equal llama.cpp (mean pooling) within cosine 0.9999', async (t) => {
    if (!model.shared) return t.skip('stories260K not available');
    for (const [text, ref] of Object.entries(LLAMA_CPP_MEAN)) {
      const r = await client.embeddings.create({ model: 'x', input: text, encoding_format: 'float' });
      const c = cosine(r.data[0].embedding, ref);
      assert.ok(c > 0.9999, `cosine ${c} for ${JSON.stringify(text)}`);
    }
  });

  test('token-id inputs equal the text they tokenize to; a vector does not depend on its batch', async () => {
    const text = 'Once upon a time';
    const tok = await (await fetch(`${srv.base}/tokenize`, {
      method: 'POST', body: JSON.stringify({ content: text, add_special: true }),
    })).json();
    const a = await client.embeddings.create({ model: 'x', input: text, encoding_format: 'float' });
    const b = await client.embeddings.create({ model: 'x', input: tok.tokens, encoding_format: 'float' });
    const many = await client.embeddings.create({
      model: 'x', input: [tok.tokens, [1, 2, 3], tok.tokens.concat(tok.tokens)], encoding_format: 'float',
    });
    assert.equal(b.usage.prompt_tokens, tok.tokens.length);
    assert.ok(cosine(a.data[0].embedding, b.data[0].embedding) > 0.99999);
    assert.ok(cosine(a.data[0].embedding, many.data[0].embedding) > 0.99999);
    assert.equal(many.data.length, 3);
  });

  test('many inputs at once (more than the submission window) all come back in order', async () => {
    const input = Array.from({ length: 40 }, (_, i) => `item number ${i} of the list`);
    const r = await client.embeddings.create({ model: 'x', input, encoding_format: 'float' });
    assert.equal(r.data.length, 40);
    r.data.forEach((d, i) => assert.equal(d.index, i));
    const one = await client.embeddings.create({ model: 'x', input: input[17], encoding_format: 'float' });
    assert.ok(cosine(one.data[0].embedding, r.data[17].embedding) > 0.99999);
  });

  test('dimensions, empty input, bad ids and bad encoding are clear 400s', async () => {
    const bad = async (body, param) => {
      const r = await fetch(`${srv.base}/v1/embeddings`, { method: 'POST', body: JSON.stringify(body) });
      assert.equal(r.status, 400);
      const j = await r.json();
      assert.equal(j.error.param, param);
    };
    await bad({ input: 'hi', dimensions: 3 }, 'dimensions');
    await bad({ input: '' }, 'input');
    await bad({ input: [] }, 'input');
    await bad({}, 'input');
    await bad({ input: [-1] }, 'input');
    await bad({ input: [[1], 'x'] }, 'input');
    await bad({ input: 'hi', encoding_format: 'int8' }, 'encoding_format');
    const r = await fetch(`${srv.base}/embeddings`, { method: 'POST', body: JSON.stringify({ input: 'hi' }) });
    assert.equal(r.status, 200, 'the alias without /v1');
  });
});

describe('responses', () => {
  test('plain: output_text, usage, status; equals the chat completion of the same messages', async () => {
    const r = await client.responses.create({
      model: 'x', instructions: 'You tell stories.', input: 'Once upon a time', max_output_tokens: 12, temperature: 0,
    });
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, 'response');
    assert.ok(r.status === 'completed' || r.status === 'incomplete');
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].role, 'assistant');
    assert.equal(r.output[0].content[0].type, 'output_text');
    assert.equal(typeof r.output_text, 'string');
    assert.ok(r.usage.input_tokens > 0);
    assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    const chat = await client.chat.completions.create({
      model: 'x', messages: [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }],
      max_tokens: 12, temperature: 0,
    });
    // the same chat path: the same prompt, and at temperature 0 the same text
    assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
    assert.equal(r.output_text, chat.choices[0].message.content);
    if (r.usage.output_tokens === 12) {
      assert.equal(r.status, 'incomplete');
      assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    }
  });

  test('streaming: typed events in order with increasing sequence_number; text equals the plain one', async () => {
    const args = { model: 'x', input: [{ role: 'user', content: 'The little dog' }], max_output_tokens: 16, temperature: 0 };
    const plain = await client.responses.create(args);
    const stream = await client.responses.create({ ...args, stream: true });
    const types = [];
    let seq = -1, text = '', done = null, final = null;
    for await (const ev of stream) {
      types.push(ev.type);
      assert.equal(ev.sequence_number, seq + 1);
      seq = ev.sequence_number;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.output_text.done') done = ev.text;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
    }
    assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
      'response.content_part.added']);
    assert.deepEqual(types.slice(-4, -1), ['response.output_text.done', 'response.content_part.done',
      'response.output_item.done']);
    assert.ok(types.includes('response.output_text.delta'));
    assert.equal(text, plain.output_text);
    assert.equal(done, text);
    assert.equal(final.output[0].content[0].text, text);
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
    // the SDK's own accumulation of the events (responses.stream) gives the same text
    const acc = await client.responses.stream(args).finalResponse();
    assert.equal(acc.output[0].content[0].text, plain.output_text);
  });

  test('previous_response_id continues the conversation and reuses the cached prefix', async () => {
    const first = await client.responses.create({ model: 'x', input: 'Once upon a time there was a cat named Tom.', max_output_tokens: 20, temperature: 0 });
    const second = await client.responses.create({
      model: 'x', previous_response_id: first.id, input: 'What happened next?', max_output_tokens: 8, temperature: 0,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 2);
    assert.ok(second.usage.input_tokens_details.cached_tokens > 0, 'the first turn came from the prefix cache');
    const chat = await client.chat.completions.create({
      model: 'x', max_tokens: 8, temperature: 0, messages: [
        { role: 'user', content: 'Once upon a time there was a cat named Tom.' },
        { role: 'assistant', content: first.output_text }, { role: 'user', content: 'What happened next?' }],
    });
    assert.equal(second.output_text, chat.choices[0].message.content);
    const r = await fetch(`${srv.base}/v1/responses`, {
      method: 'POST', body: JSON.stringify({ input: 'x', previous_response_id: 'resp_nope' }),
    });
    assert.equal(r.status, 404);
  });

  test('bad fields are 400s naming them', async () => {
    for (const [body, param] of [[{}, 'input'], [{ input: 'x', temperature: 3 }, 'temperature'],
      [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'], [{ input: [{ type: 'function_call' }] }, 'input[0].call_id'],
      [{ input: [{ type: 'reasoning' }] }, 'input'], [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools']]) {
      const r = await fetch(`${srv.base}/v1/responses`, { method: 'POST', body: JSON.stringify(body) });
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal((await r.json()).error.param, param);
    }
  });
});

describe('fill-in-the-middle', () => {
  let fim;
  let fc;
  let fimDir;
  before(async () => {
    fimDir = mkdtempSync(join(tmpdir(), 'kvserve-fim-'));
    const path = join(fimDir, 'fim.gguf');
    execFileSync(BINARY, ['mkmodel', '--preset', 'tiny', '--fim', '-o', path], { stdio: 'ignore' });
    fim = await startServer(path, ['--parallel', '4', '--threads', '2']);
    fc = new OpenAI({ baseURL: `${fim.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  });
  after(async () => {
    try { if (fim) assert.equal(await fim.stop(), 0); } finally { if (fimDir) rmSync(fimDir, { recursive: true, force: true }); }
  });

  test('suffix builds [BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid> (same text as those token ids)', async () => {
    const tok = async (content, special) => (await (await fetch(`${fim.base}/tokenize`, {
      method: 'POST', body: JSON.stringify({ content, add_special: false, parse_special: special }),
    })).json()).tokens;
    const [pre, suf, mid] = await tok('<|fim_prefix|><|fim_suffix|><|fim_middle|>', true);
    const bos = (await (await fetch(`${fim.base}/tokenize`, {
      method: 'POST', body: JSON.stringify({ content: '', add_special: true }),
    })).json()).tokens;
    const prefix = 'def add(a, b):\n    ', suffix = '\n    return c\n';
    const ids = [...bos, pre, ...await tok(prefix, false), suf, ...await tok(suffix, false), mid];
    const a = await fc.completions.create({ model: 'x', prompt: prefix, suffix, max_tokens: 8, temperature: 0 });
    const b = await fc.completions.create({ model: 'x', prompt: ids, max_tokens: 8, temperature: 0 });
    assert.equal(a.usage.prompt_tokens, ids.length);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.ok(a.choices[0].text.length > 0);
  });

  test('a model without FIM tokens answers suffix with a 400 naming it', async () => {
    const r = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', body: JSON.stringify({ prompt: 'a', suffix: 'b', max_tokens: 2 }),
    });
    assert.equal(r.status, 400);
    const j = await r.json();
    assert.equal(j.error.param, 'suffix');
    assert.match(j.error.message, /fim_pre_token_id/);
  });
});

describe('infill', () => {
  test('/infill (llama.cpp fields) answers the same middle as suffix on /v1/completions', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvserve-fim-'));
    const path = join(dir, 'fim.gguf');
    execFileSync(BINARY, ['mkmodel', '--preset', 'tiny', '--fim', '-o', path], { stdio: 'ignore' });
    const s = await startServer(path, ['--parallel', '4', '--threads', '2']);
    try {
      const post = async (route, body) => fetch(`${s.base}${route}`, { method: 'POST', body: JSON.stringify(body) });
      const a = await (await post('/infill', { input_prefix: 'int main() {', input_suffix: '}', n_predict: 6, temperature: 0 })).json();
      const b = await (await post('/v1/completions', { prompt: 'int main() {', suffix: '}', max_tokens: 6, temperature: 0 })).json();
      assert.equal(a.choices[0].text, b.choices[0].text);
      assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
      const bad = await post('/infill', { input_prefix: 'a', input_extra: [{ filename: 'x', text: 'y' }] });
      assert.equal(bad.status, 400);
      assert.equal((await bad.json()).error.param, 'input_extra');
    } finally {
      try { assert.equal(await s.stop(), 0); } finally { rmSync(dir, { recursive: true, force: true }); }
    }
  });
});

// Issue 14: a request that outgrows the whole KV pool. A prompt that cannot fit is a 400 naming the sizes; a
// generation cut by the pool (not by max_tokens or the context) ends with finish_reason "length" plus
// "truncated": true, a warning in the log and kvserve:kv_pool_truncations_total.
describe('whole KV pool', () => {
  test('prompt too large for the pool: 400 naming the sizes; generation cut by the pool: truncated', async () => {
    const s = await startServer(model.path, ['--parallel', '2', '--threads', '2', '--kv-blocks', '4',
      '--block-size', '16', '--ctx-size', '256']);
    try {
      const post = async (route, body) => fetch(`${s.base}${route}`, { method: 'POST', body: JSON.stringify(body) });
      const big = await post('/v1/completions', { prompt: 'Once upon a time there was a girl. '.repeat(20), max_tokens: 4 });
      assert.equal(big.status, 400);
      const be = (await big.json()).error;
      assert.equal(be.param, 'prompt');
      assert.equal(be.code, 'context_length_exceeded');
      assert.match(be.message, /4 blocks \(64 tokens\)/);
      assert.match(be.message, /blocks of 16 tokens/);
      const chat = await post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Once upon a time there was a girl. '.repeat(20) }], max_tokens: 4 });
      assert.equal(chat.status, 400);
      assert.equal((await chat.json()).error.param, 'messages');
      // a short prompt whose generation outgrows the 64 tokens of the pool
      const body = { prompt: 'Once upon a time', max_tokens: 200, temperature: 0, ignore_eos: true };
      const cut = await (await post('/v1/completions', body)).json();
      assert.equal(cut.choices[0].finish_reason, 'length');
      assert.equal(cut.choices[0].truncated, true);
      assert.ok(cut.usage.prompt_tokens + cut.usage.completion_tokens <= 65, JSON.stringify(cut.usage));
      assert.ok(cut.usage.completion_tokens < 200);
      // streamed: the last chunk of the choice carries it too
      const r = await post('/v1/completions', { ...body, stream: true });
      const text = await r.text();
      const chunks = text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
      const last = chunks.filter((c) => c.choices.length && c.choices[0].finish_reason)[0];
      assert.equal(last.choices[0].finish_reason, 'length');
      assert.equal(last.choices[0].truncated, true);
      // an end by max_tokens says nothing of the kind
      const short = await (await post('/v1/completions', { ...body, max_tokens: 3 })).json();
      assert.equal(short.choices[0].finish_reason, 'length');
      assert.equal(short.choices[0].truncated, undefined);
      const m = await (await fetch(`${s.base}/metrics`)).text();
      assert.match(m, /^kvserve:kv_pool_truncations_total 2$/m);
      assert.match(s.log(), /choice 0 cut with finish_reason length: its context outgrew the whole KV cache \(64 tokens\)/);
    } finally {
      assert.equal(await s.stop(), 0);
    }
  });
});

describe('priority', () => {
  test('fcfs (the default) refuses a nonzero priority with a 400 naming it, as vLLM; 0 is fine', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, priority: 3 }),
      (e) => e.status === 400 && e.param === 'priority' && /not enabled/.test(e.message));
    await assert.rejects(client.embeddings.create({ model: 'x', input: 'hi', priority: -1 }), (e) => e.status === 400);
    await assert.rejects(client.responses.create({ model: 'x', input: 'hi', max_output_tokens: 2, priority: 1 }),
      (e) => e.status === 400);
    const ok = await client.completions.create({ model: 'x', prompt: 'Once', max_tokens: 2, priority: 0 });
    assert.equal(ok.choices.length, 1);
  });

  test('--scheduling-policy priority: mixed priorities on a small pool all complete with the fcfs answers', async () => {
    // 10 blocks of 8 tokens for 4 sequences of ~35: requests wait and preempt; greedy text must not depend on it
    const s = await startServer(model.path, ['--parallel', '4', '--threads', '2', '--scheduling-policy', 'priority',
      '--kv-blocks', '10', '--block-size', '8']);
    try {
      const pc = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
      const prompts = ['Once upon a time', 'Lily and Tom went to the park.', 'The cat sat', 'One day, a big dog'];
      const jobs = [];
      for (let i = 0; i < 12; i++) {
        const prompt = prompts[i % prompts.length];
        jobs.push(pc.completions.create({ model: 'x', prompt, max_tokens: 24, temperature: 0, priority: (i * 7) % 5 - 2 })
          .then((r) => ({ prompt, text: r.choices[0].text })));
      }
      const got = await Promise.all(jobs);
      for (const g of got) {
        const want = await client.completions.create({ model: 'x', prompt: g.prompt, max_tokens: 24, temperature: 0 });
        assert.equal(g.text, want.choices[0].text, g.prompt);
      }
      const e = await pc.embeddings.create({ model: 'x', input: ['Once upon a time'], encoding_format: 'float', priority: 5 });
      assert.equal(e.data.length, 1);
      const r = await pc.responses.create({ model: 'x', input: 'hi', max_output_tokens: 3, priority: -7 });
      assert.ok(['completed', 'incomplete'].includes(r.status));
      const bad = await fetch(`${s.base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'a', priority: 2.5 }) });
      assert.equal(bad.status, 400);
      assert.equal((await bad.json()).error.param, 'priority');
      const m = await (await fetch(`${s.base}/metrics`)).text();
      const pre = m.match(/^vllm:num_preemptions_total\{[^}]*\} (\d+)/m);
      assert.ok(pre && Number(pre[1]) > 0, 'the small pool preempted (vllm:num_preemptions_total)');
    } finally {
      assert.equal(await s.stop(), 0);
    }
  });
});

// Issue 30's limits as settings: each flag reaches the API layer (its answer names the key).
describe('text and template limits', () => {
  test('--text-answer-mb bounds /tokenize answers; --text-queue 0 refuses a waiting text job', async () => {
    const s = await startServer(model.path, ['--threads', '1', '--text-answer-mb', '0.001', '--text-queue', '0']);
    try {
      const big = await fetch(`${s.base}/tokenize`, { method: 'POST',
        body: JSON.stringify({ content: 'once upon a time '.repeat(200), with_pieces: true }) });
      assert.equal(big.status, 413);
      const j = await big.json();
      assert.equal(j.error.code, 'answer_too_large');
      assert.match(j.error.message, /text_answer_mb/);
      const small = await fetch(`${s.base}/tokenize`, { method: 'POST', body: JSON.stringify({ content: 'once' }) });
      assert.equal(small.status, 200);
      // one text job runs and none may wait: of several at once, at least one is a 503 text_queue_full
      const many = await Promise.all(Array.from({ length: 6 }, () => fetch(`${s.base}/detokenize`, { method: 'POST',
        body: JSON.stringify({ tokens: Array.from({ length: 200000 }, (_, i) => 100 + (i % 50)) }) })
        .then(async (r) => ({ status: r.status, body: await r.text() }))));
      const busy = many.filter((r) => r.status === 503);
      assert.ok(busy.length >= 1, `statuses ${many.map((r) => r.status)}`);
      assert.match(busy[0].body, /text_queue_full/);
    } finally {
      assert.equal(await s.stop(), 0);
    }
  });
});
