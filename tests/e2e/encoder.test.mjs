// Encoder models end to end (issue 27 items 2 and 3): a bert embedding model written by `kvserve mkmodel --arch bert`
// through the official openai package's client.embeddings.create, and a bert reranker (--rerank: a classification
// head, pooling type rank) through fetch on /v1/rerank, /rerank and /v2/rerank as LangChain's and Cohere-style
// clients call them; the errors of bad requests and of routes a model cannot serve. A Qwen3-Reranker-style decoder
// (mkmodel --arch qwen3 --rerank with ../shared's Qwen2 vocabulary; skipped without it) answers llama.cpp's scores
// and order (tests/reference/mk-encoders.json) through the server's rerank prompt; jina-bert-v2 (ALiBi, GEGLU)
// embeddings and reranker scores match the same reference.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import { startServer, metric, BINARY } from './server.mjs';

const dir = mkdtempSync(join(tmpdir(), 'kvserve-e2e-encoder-'));
const common = ['--embd', '64', '--layers', '2', '--heads', '4', '--ff', '96', '--ctx', '256', '--type', 'q8_0'];
let embSrv, rrSrv, client;

before(async () => {
  execFileSync(BINARY, ['mkmodel', '-o', join(dir, 'bert.gguf'), '--arch', 'bert', ...common], { stdio: 'ignore' });
  execFileSync(BINARY, ['mkmodel', '-o', join(dir, 'rr.gguf'), '--arch', 'bert', '--rerank', ...common],
    { stdio: 'ignore' });
  embSrv = await startServer(join(dir, 'bert.gguf'), ['--threads', '2', '--parallel', '8']);
  rrSrv = await startServer(join(dir, 'rr.gguf'), ['--threads', '2', '--parallel', '8', '--reranking']);
  client = new OpenAI({ baseURL: `${embSrv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (embSrv) assert.equal(await embSrv.stop(), 0);
  if (rrSrv) assert.equal(await rrSrv.stop(), 0);
  rmSync(dir, { recursive: true, force: true });
});

const post = async (base, path, body) => {
  const r = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
};

test('openai embeddings.create on a bert model: unit vectors, the same alone and batched', async () => {
  const inputs = ['The dog ran to the park.', 'hello world', 'a long day at school, then home again', 'x'];
  const all = await client.embeddings.create({ model: 'bert', input: inputs });
  assert.equal(all.data.length, inputs.length);
  assert.ok(all.usage.prompt_tokens >= inputs.length * 3); // [CLS] ... [SEP] each
  for (const [i, d] of all.data.entries()) {
    assert.equal(d.index, i);
    assert.equal(d.embedding.length, 64);
    const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
    const one = await client.embeddings.create({ model: 'bert', input: inputs[i] });
    assert.deepEqual(one.data[0].embedding, d.embedding, `input ${i}: batching changed the vector`);
  }
  // different texts, different vectors
  assert.notDeepEqual(all.data[0].embedding, all.data[1].embedding);
  // asked for explicitly, base64 comes back as the string: little-endian float32, the same values
  const b64 = await client.embeddings.create({ model: 'bert', input: inputs[0], encoding_format: 'base64' });
  const buf = Buffer.from(b64.data[0].embedding, 'base64');
  const floats = Array.from({ length: buf.length / 4 }, (_, i) => buf.readFloatLE(4 * i));
  assert.deepEqual(floats, all.data[0].embedding.map((x) => Math.fround(x)));
});

test('an encoder does not generate, and an embedding model does not rerank', async () => {
  const chat = await post(embSrv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(chat.status, 501);
  assert.match(chat.body.error.message, /cannot generate/);
  const rr = await post(embSrv.base, '/v1/rerank', { query: 'q', documents: ['a'] });
  assert.equal(rr.status, 501);
  assert.match(rr.body.error.message, /classification head/);
});

const docs = ['the dog ran to the park', 'hello world', 'a little girl named lily', 'the sun and the sea',
  'water', 'the dog saw a big red ball'];

test('rerank: every route, sorted by score, top_n, return_documents, the same scores one by one', async () => {
  const full = await post(rrSrv.base, '/v1/rerank', { model: 'rr', query: 'the dog', documents: docs });
  assert.equal(full.status, 200);
  const res = full.body.results;
  assert.equal(res.length, docs.length);
  assert.deepEqual([...res.map((r) => r.index)].sort((a, b) => a - b), docs.map((_, i) => i));
  for (let i = 1; i < res.length; i++) assert.ok(res[i - 1].relevance_score >= res[i].relevance_score);
  assert.ok(res.every((r) => r.document === undefined));
  assert.ok(full.body.usage.prompt_tokens > 0 && full.body.usage.total_tokens === full.body.usage.prompt_tokens);
  assert.equal(full.body.model, 'kvserve-mkmodel-bert-reranker');
  // one document per request: the same score as in the batch (a pair's numbers do not depend on its batch)
  for (const r of res) {
    const one = await post(rrSrv.base, '/rerank', { query: 'the dog', documents: [docs[r.index]] });
    assert.equal(one.status, 200);
    assert.equal(one.body.results[0].relevance_score, r.relevance_score);
  }
  // Cohere's v2 shape: {text} documents, top_n, documents returned as {text}
  const v2 = await post(rrSrv.base, '/v2/rerank', {
    model: 'rr', query: 'the dog', documents: docs.map((text) => ({ text })), top_n: 3, return_documents: true,
  });
  assert.equal(v2.status, 200);
  assert.equal(v2.body.results.length, 3);
  for (const [k, r] of v2.body.results.entries()) {
    assert.equal(r.index, res[k].index);
    assert.equal(r.relevance_score, res[k].relevance_score);
    assert.deepEqual(r.document, { text: docs[r.index] });
  }
});

test('rerank: bad requests are 400s naming the field', async () => {
  const cases = [
    [{ documents: ['a'] }, 'query'],
    [{ query: 3, documents: ['a'] }, 'query'],
    [{ query: 'q' }, 'documents'],
    [{ query: 'q', documents: [] }, 'documents'],
    [{ query: 'q', documents: 'a' }, 'documents'],
    [{ query: 'q', documents: ['a', 7] }, 'documents'],
    [{ query: 'q', documents: [{ txt: 'a' }] }, 'documents'],
    [{ query: 'q', documents: ['a'], top_n: -1 }, 'top_n'],
    [{ query: 'q', documents: ['a'], top_n: 1.5 }, 'top_n'],
    [{ query: 'q', documents: ['a'], return_documents: 'yes' }, 'return_documents'],
    [{ query: 'q', documents: ['word '.repeat(400)] }, 'documents'],
  ];
  for (const [body, param] of cases) {
    const r = await post(rrSrv.base, '/v1/rerank', body);
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
    assert.equal(r.body.error.param, param);
  }
  const notJson = await fetch(`${rrSrv.base}/v1/rerank`, { method: 'POST', body: '{"query": ' });
  assert.equal(notJson.status, 400);
});

const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');

test('a Qwen3-Reranker-style decoder: llama.cpp\'s scores and order, special-token text kept as text', async (t) => {
  const ref = JSON.parse(readFileSync(resolve('../reference/mk-encoders.json'), 'utf8'));
  const m = ref.models['qwen3-reranker'];
  const args = m.mkmodel_args.map((a) => (a.startsWith('@SHARED/') ? join(SHARED, a.slice(8)) : a));
  const vocab = args[m.mkmodel_args.findIndex((a) => a.startsWith('@SHARED/'))];
  if (!existsSync(vocab)) {
    t.skip(`${vocab} is absent (the shared test material)`);
    return;
  }
  execFileSync(BINARY, ['mkmodel', '-o', join(dir, 'q3r.gguf'), ...args], { stdio: 'ignore' });
  const srv = await startServer(join(dir, 'q3r.gguf'), ['--threads', '2', '--parallel', '4', '--reranking']);
  try {
    const r = await post(srv.base, '/v1/rerank', { query: ref.query, documents: ref.documents });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(r.body.results.map((x) => x.index), m.rerank.map((x) => x.index), 'llama.cpp\'s order');
    for (const [k, x] of r.body.results.entries())
      assert.ok(Math.abs(x.relevance_score - m.rerank[k].relevance_score) < 1e-3,
        `document ${x.index}: ${x.relevance_score}, llama.cpp ${m.rerank[k].relevance_score}`);
    const nTok = m.pair_tokens.reduce((s, p) => s + p.length, 0);
    assert.equal(r.body.usage.prompt_tokens, nTok, 'the pairs\' prompts have llama.cpp\'s token counts');
    // "<|im_end|>" inside a document is text, not the end of the user turn: more tokens than the special token
    const plain = await post(srv.base, '/rerank', { query: 'q', documents: ['a b'] });
    const special = await post(srv.base, '/rerank', { query: 'q', documents: ['a<|im_end|>b'] });
    assert.equal(special.status, 200);
    assert.ok(special.body.usage.prompt_tokens > plain.body.usage.prompt_tokens + 2,
      `${special.body.usage.prompt_tokens} vs ${plain.body.usage.prompt_tokens}`);
    // its /v1/embeddings pool the last token (the row the head reads; the first of a causal model sees nothing else)
    const e = await post(srv.base, '/v1/embeddings', { input: ['the dog ran', 'the sea is blue'] });
    assert.equal(e.status, 200);
    assert.notDeepEqual(e.body.data[0].embedding, e.body.data[1].embedding, 'same first token, different vectors');
    const metrics = await (await fetch(`${srv.base}/metrics`)).text();
    assert.equal(metric(metrics, 'kvserve:kv_blocks_used'), 0, 'no KV block stays in use');
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('jina-bert-v2 (ALiBi, GEGLU): llama.cpp\'s embeddings and reranker scores', async () => {
  const ref = JSON.parse(readFileSync(resolve('../reference/mk-encoders.json'), 'utf8'));
  const emb = ref.models['jina-bert-v2'], rr = ref.models['jina-bert-v2-reranker'];
  execFileSync(BINARY, ['mkmodel', '-o', join(dir, 'jina.gguf'), ...emb.mkmodel_args], { stdio: 'ignore' });
  execFileSync(BINARY, ['mkmodel', '-o', join(dir, 'jinarr.gguf'), ...rr.mkmodel_args], { stdio: 'ignore' });
  const es = await startServer(join(dir, 'jina.gguf'), ['--threads', '2']);
  const rs = await startServer(join(dir, 'jinarr.gguf'), ['--threads', '2']);
  try {
    const c = new OpenAI({ baseURL: `${es.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
    const got = await c.embeddings.create({ model: 'jina', input: ref.prompts });
    for (const [i, d] of got.data.entries()) {
      const want = emb.embeddings[i];
      const dot = d.embedding.reduce((s, x, j) => s + x * want[j], 0);
      const nw = Math.sqrt(want.reduce((s, x) => s + x * x, 0));
      assert.ok(dot / nw >= 0.9999, `prompt ${i}: cosine ${dot / nw}`);
    }
    const r = await post(rs.base, '/v1/rerank', { query: ref.query, documents: ref.documents });
    assert.equal(r.status, 200);
    assert.deepEqual(r.body.results.map((x) => x.index), rr.rerank.map((x) => x.index), 'llama.cpp\'s order');
    for (const [k, x] of r.body.results.entries())
      assert.ok(Math.abs(x.relevance_score - rr.rerank[k].relevance_score) < 1e-3, `document ${x.index}`);
  } finally {
    assert.equal(await es.stop(), 0);
    assert.equal(await rs.stop(), 0);
  }
});
