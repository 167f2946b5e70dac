// End-to-end tests of what browsers and llama.cpp-style tools use: CORS (preflight and headers on every kind of
// response), the routes without /v1 (through the official OpenAI SDK), GET /props, the chat page as served
// (CSP hashes checked independently here) and the page script's markdown renderer and SSE parser (run in node).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import vm from 'node:vm';
import OpenAI from 'openai';
import { BINARY, startServer, testModel } from './server.mjs';

const model = testModel();
const PAGE_PATH = new URL('../../web/index.html', import.meta.url);
let srv;

before(async () => { srv = await startServer(model.path, ['--parallel', '8', '--threads', '2']); });
after(async () => { if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM'); });

const ORIGIN = 'http://app.example.test';
const EXPOSED = 'Retry-After, WWW-Authenticate';

function preflight(base, path, method = 'POST', origin = ORIGIN, headers = 'content-type, authorization') {
  return fetch(`${base}${path}`, {
    method: 'OPTIONS',
    headers: { Origin: origin, 'Access-Control-Request-Method': method, 'Access-Control-Request-Headers': headers },
  });
}

// The routes with the method each allows (the model id route included).
const ROUTES = [
  ['/v1/chat/completions', 'POST'], ['/chat/completions', 'POST'], ['/v1/completions', 'POST'],
  ['/completions', 'POST'], ['/v1/models', 'GET'], ['/models', 'GET'], ['/health', 'GET'], ['/v1/health', 'GET'],
  ['/metrics', 'GET'], ['/tokenize', 'POST'], ['/detokenize', 'POST'], ['/props', 'GET'], ['/', 'GET'],
];

describe('CORS on a loopback server (default: any origin)', () => {
  test('preflight on every route: 204 with methods, the asked headers and max-age', async () => {
    const asked = 'content-type, authorization, x-stainless-os, x-stainless-retry-count';
    for (const [path, method] of [...ROUTES, ['/v1/models/some-id', 'GET']]) {
      const r = await preflight(srv.base, path, method, ORIGIN, asked);
      assert.equal(r.status, 204, path);
      assert.equal(await r.text(), '');
      assert.equal(r.headers.get('access-control-allow-origin'), '*', path);
      assert.equal(r.headers.get('access-control-allow-methods'), `${method}, OPTIONS`, path);
      assert.equal(r.headers.get('access-control-allow-headers'), asked, path);
      assert.equal(r.headers.get('access-control-max-age'), '7200');
      assert.equal(r.headers.get('content-length'), null, '204 has no Content-Length');
    }
  });

  test('a malformed Access-Control-Request-Headers is not echoed', async () => {
    const r = await preflight(srv.base, '/v1/completions', 'POST', ORIGIN, 'content-type; evil="1"');
    assert.equal(r.status, 204);
    assert.equal(r.headers.get('access-control-allow-headers'), 'Authorization, Content-Type');
  });

  test('OPTIONS on an unknown path is a 404 that still carries the CORS headers', async () => {
    const r = await preflight(srv.base, '/v1/nope');
    assert.equal(r.status, 404);
    assert.equal(r.headers.get('access-control-allow-origin'), '*');
    assert.equal((await r.json()).error.code, 'not_found');
  });

  test('JSON answers, errors, metrics and SSE streams all carry Allow-Origin and Expose-Headers', async () => {
    const h = { Origin: ORIGIN, 'content-type': 'application/json' };
    const answers = [
      await fetch(`${srv.base}/v1/models`, { headers: h }),
      await fetch(`${srv.base}/metrics`, { headers: h }),
      await fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: h, body: '{"prompt": ' }),
      await fetch(`${srv.base}/v1/completions`, { method: 'GET', headers: h }),
      await fetch(`${srv.base}/nope`, { headers: h }),
      await fetch(`${srv.base}/v1/chat/completions`, {
        method: 'POST', headers: h,
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, stream: true }),
      }),
    ];
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 400, 405, 404, 200]);
    for (const r of answers) {
      assert.equal(r.headers.get('access-control-allow-origin'), '*', r.url);
      assert.equal(r.headers.get('access-control-expose-headers'), EXPOSED, r.url);
      await r.text();
    }
    assert.match(answers[5].headers.get('content-type'), /^text\/event-stream/);
  });

  test('a request body over the limit gets a 413 with CORS headers from the HTTP layer', async () => {
    const small = await startServer(model.path, ['--threads', '1', '--body-limit-mb', '0.001']);
    try {
      const r = await fetch(`${small.base}/v1/completions`, {
        method: 'POST', headers: { Origin: ORIGIN, 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'x'.repeat(5000) }),
      });
      assert.equal(r.status, 413);
      assert.equal(r.headers.get('access-control-allow-origin'), '*');
      await r.text();
    } finally {
      assert.equal(await small.stop(), 0);
    }
  });

  test('with an API key: the preflight needs none, the 401 is readable cross-origin', async () => {
    const k = await startServer(model.path, ['--threads', '1', '--api-key', 'sekret']);
    try {
      const p = await preflight(k.base, '/v1/chat/completions');
      assert.equal(p.status, 204);
      assert.equal(p.headers.get('access-control-allow-origin'), '*');
      const r = await fetch(`${k.base}/v1/models`, { headers: { Origin: ORIGIN } });
      assert.equal(r.status, 401);
      assert.equal(r.headers.get('access-control-allow-origin'), '*');
      assert.match(r.headers.get('access-control-expose-headers'), /WWW-Authenticate/);
      assert.equal(r.headers.get('www-authenticate'), 'Bearer');
      const page = await fetch(`${k.base}/`);
      assert.equal(page.status, 200, 'the page itself needs no key: it asks for one');
      assert.equal((await fetch(`${k.base}/props`)).status, 401, '/props needs the key like the API');
      assert.equal((await fetch(`${k.base}/props`, { headers: { authorization: 'Bearer sekret' } })).status, 200);
    } finally {
      assert.equal(await k.stop(), 0);
    }
  });
});

describe('CORS with a list of origins', () => {
  async function checkListed(base) {
    const good = await fetch(`${base}/v1/models`, { headers: { Origin: 'http://good.test:3000' } });
    assert.equal(good.headers.get('access-control-allow-origin'), 'http://good.test:3000');
    assert.equal(good.headers.get('vary'), 'Origin');
    assert.equal(good.headers.get('access-control-expose-headers'), EXPOSED);
    const caps = await fetch(`${base}/v1/models`, { headers: { Origin: 'HTTP://GOOD.test:3000' } });
    assert.equal(caps.headers.get('access-control-allow-origin'), 'HTTP://GOOD.test:3000', 'matched ignoring case');
    const other = await fetch(`${base}/v1/models`, { headers: { Origin: 'http://evil.test' } });
    assert.equal(other.status, 200);
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    assert.equal(other.headers.get('vary'), 'Origin');
    const none = await fetch(`${base}/v1/models`);
    assert.equal(none.headers.get('access-control-allow-origin'), null);
    const p = await preflight(base, '/v1/chat/completions', 'POST', 'https://second.test');
    assert.equal(p.status, 204);
    assert.equal(p.headers.get('access-control-allow-origin'), 'https://second.test');
    const bad = await preflight(base, '/v1/chat/completions', 'POST', 'http://evil.test');
    assert.equal(bad.status, 204);
    assert.equal(bad.headers.get('access-control-allow-origin'), null, 'the browser then refuses the call');
    await Promise.all([good, caps, other, none].map((r) => r.text()));
  }

  test('a comma string flag', async () => {
    const s = await startServer(model.path, ['--threads', '1', '--cors-origins', 'http://good.test:3000 , https://second.test']);
    try { await checkListed(s.base); } finally { assert.equal(await s.stop(), 0); }
  });

  test('a JSON list in the config file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvserve-cors-'));
    const cfg = join(dir, 'cfg.json');
    writeFileSync(cfg, JSON.stringify({ cors_origins: ['http://good.test:3000', 'https://second.test'] }));
    try {
      const s = await startServer(model.path, ['--threads', '1', '--config', cfg]);
      try { await checkListed(s.base); } finally { assert.equal(await s.stop(), 0); }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('"none" sends no CORS headers; a preflight is still 204 with Allow', async () => {
    const s = await startServer(model.path, ['--threads', '1', '--cors-origins', 'none']);
    try {
      const r = await fetch(`${s.base}/v1/models`, { headers: { Origin: ORIGIN } });
      assert.equal(r.headers.get('access-control-allow-origin'), null);
      assert.equal(r.headers.get('vary'), null);
      await r.text();
      const p = await preflight(s.base, '/v1/completions');
      assert.equal(p.status, 204);
      assert.equal(p.headers.get('allow'), 'POST, OPTIONS');
      assert.equal(p.headers.get('access-control-allow-methods'), null);
    } finally {
      assert.equal(await s.stop(), 0);
    }
  });

  test('a malformed origin stops start-up with a message naming the key', () => {
    for (const bad of ['http://x.test/', 'http://x.test/path', 'x.test', 'http://a.test,,http://b.test']) {
      const r = spawnSync(BINARY, ['serve', '-m', model.path, '--port', '0', '--cors-origins', bad], { encoding: 'utf8' });
      assert.equal(r.status, 2, bad);
      assert.match(r.stderr, /cors_origins/, bad);
    }
  });
});

describe('routes without /v1 and /props', () => {
  test('the SDK with a base URL without /v1 gets the same answers', async () => {
    const v1 = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const bare = new OpenAI({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });
    const messages = [{ role: 'user', content: 'Tell me about a cat.' }];
    const a = await v1.chat.completions.create({ model: 'x', messages, max_tokens: 16, temperature: 0 });
    const b = await bare.chat.completions.create({ model: 'x', messages, max_tokens: 16, temperature: 0 });
    assert.equal(b.object, 'chat.completion');
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
    assert.equal(b.usage.completion_tokens, a.usage.completion_tokens);
    assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, 'the same prompt again: its prefix comes from the cache');
    let streamed = '';
    for await (const chunk of await bare.chat.completions.create({ model: 'x', messages, max_tokens: 16, temperature: 0, stream: true })) {
      if (chunk.choices.length && chunk.choices[0].delta.content) streamed += chunk.choices[0].delta.content;
    }
    assert.equal(streamed, a.choices[0].message.content);
    const c1 = await v1.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
    const c2 = await bare.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
    assert.equal(c2.choices[0].text, c1.choices[0].text);
    const m1 = await v1.models.list();
    const m2 = await bare.models.list();
    assert.deepEqual(m2.data.map((m) => m.id), m1.data.map((m) => m.id));
    const one = await bare.models.retrieve(m1.data[0].id);
    assert.equal(one.id, m1.data[0].id);
  });

  test('/v1/health answers as /health', async () => {
    const a = await fetch(`${srv.base}/health`);
    const b = await fetch(`${srv.base}/v1/health`);
    assert.equal(b.status, a.status);
    assert.deepEqual(await b.json(), await a.json());
  });

  test('/props has the fields llama.cpp tools read, consistent with /v1/models and the flags', async () => {
    const r = await fetch(`${srv.base}/props`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^application\/json/);
    const p = await r.json();
    const m = (await (await fetch(`${srv.base}/v1/models`)).json()).data[0];
    assert.equal(p.model_alias, m.id);
    assert.equal(p.default_generation_settings.n_ctx, m.max_model_len);
    assert.equal(p.total_slots, 8, '--parallel 8');
    assert.equal(p.model_path, model.path);
    assert.equal(typeof p.chat_template, 'string');
    assert.match(p.chat_template_family, /^(jinja|chatml|llama3|llama2|mistral|phi3|zephyr|gemma)$/);
    assert.deepEqual(p.modalities, { vision: false, audio: false });
    assert.equal(p.batch_tokens, 512);
    const version = execFileSync(BINARY, ['--version'], { encoding: 'utf8' }).trim().split(' ')[1];
    assert.equal(p.build.version, version);
    assert.match(p.build_info, new RegExp(`^kvserve ${version.replace(/\./g, '\\.')} `));
    assert.match(p.build.simd, /^(scalar|avx2|avx512)/);
    assert.equal(typeof p.build.cuda, 'boolean');
    assert.equal(p.build.device, 'cpu');
    assert.equal(p.build.threads, 2);
    assert.equal(p.is_sleeping, false);
    assert.equal(p.context_shift, false, 'off by default');
    assert.equal(p.scheduling_policy, 'fcfs');
    assert.equal(p.default_generation_settings.params.n_keep, 0);
  });

  test('/props reports the scheduling policy and the context shift settings', async () => {
    const s = await startServer(model.path, ['--threads', '1', '--scheduling-policy', 'priority', '--context-shift',
      '--n-keep', '4']);
    try {
      const p = await (await fetch(`${s.base}/props`)).json();
      assert.equal(p.scheduling_policy, 'priority');
      assert.equal(p.context_shift, true);
      assert.equal(p.default_generation_settings.params.n_keep, 4);
    } finally { await s.stop(); }
  });
});

describe('the chat page as served', () => {
  const source = readFileSync(PAGE_PATH);
  const between = (s, a, b) => s.slice(s.indexOf(a) + a.length, s.indexOf(b, s.indexOf(a)));
  const b64sha = (s) => createHash('sha256').update(s, 'utf8').digest('base64');

  test('GET / and /index.html serve the embedded web/index.html with a CSP that hashes its script and style', async () => {
    for (const path of ['/', '/index.html']) {
      const r = await fetch(`${srv.base}${path}`);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
      assert.equal(r.headers.get('cache-control'), 'no-cache');
      assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
      const body = Buffer.from(await r.arrayBuffer());
      assert.ok(body.equals(source), 'the page is web/index.html byte for byte');
      const html = body.toString('utf8');
      const csp = r.headers.get('content-security-policy');
      assert.ok(csp.includes(`script-src 'sha256-${b64sha(between(html, '<script>', '</script>'))}'`), csp);
      assert.ok(csp.includes(`style-src 'sha256-${b64sha(between(html, '<style>', '</style>'))}'`), csp);
      assert.match(csp, /default-src 'none'/);
      assert.match(csp, /connect-src 'self'/);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/);
      assert.equal(html.split('<script').length, 2, 'one script element');
      const markup = html.replace(between(html, '<script>', '</script>'), '');
      assert.doesNotMatch(markup, /\ssrc=|\shref="(?!data:)|@import|url\(/, 'nothing loaded from elsewhere');
    }
  });

  test('If-None-Match with the ETag gives 304 without a body', async () => {
    const r = await fetch(`${srv.base}/`);
    const etag = r.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{16}"$/);
    await r.arrayBuffer();
    const again = await fetch(`${srv.base}/`, { headers: { 'If-None-Match': etag } });
    assert.equal(again.status, 304);
    assert.equal(again.headers.get('etag'), etag);
    assert.equal(await again.text(), '');
    const other = await fetch(`${srv.base}/`, { headers: { 'If-None-Match': '"0000000000000000"' } });
    assert.equal(other.status, 200);
    await other.arrayBuffer();
  });

  test('POST / is 405', async () => {
    const r = await fetch(`${srv.base}/`, { method: 'POST', body: 'x' });
    assert.equal(r.status, 405);
    await r.text();
  });
});

// ---- the page's script in node: its pure functions (the DOM part does not start without a document) ----
const script = (() => {
  const html = readFileSync(PAGE_PATH, 'utf8');
  return html.slice(html.indexOf('<script>') + 8, html.indexOf('</script>'));
})();
const ctx = vm.createContext({});
vm.runInContext(script, ctx);
const { renderMarkdown, sseParser } = ctx;

function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => { x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0; return x / 4294967296; };
}
const pick = (r, s) => s[Math.floor(r() * s.length)];

// Everything the renderer may emit: these tags, attributes only on <a> (safe href) and <ol start>, and text in
// which no character could open markup.
const ALLOWED = new Set(['p', 'br', 'strong', 'em', 'del', 'code', 'pre', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul',
  'ol', 'li', 'blockquote', 'hr', 'a']);
function assertSafe(html, input) {
  const tag = /<(\/?)([a-z0-9]+)((?:\s+[a-z]+="[^"<>]*")*)>/g;
  let rest = '';
  let last = 0;
  for (let m; (m = tag.exec(html)) !== null;) {
    rest += html.slice(last, m.index);
    last = tag.lastIndex;
    assert.ok(ALLOWED.has(m[2]), `tag <${m[2]}> from ${JSON.stringify(input)}`);
    const attrs = [...m[3].matchAll(/([a-z]+)="([^"]*)"/g)];
    for (const [, name, value] of attrs) {
      if (m[2] === 'a' && name === 'href') assert.match(value, /^(https?:\/\/|mailto:)/, `href from ${JSON.stringify(input)}`);
      else if (m[2] === 'a') assert.ok(['rel', 'target'].includes(name), `a ${name}`);
      else assert.ok(m[2] === 'ol' && name === 'start' && /^\d+$/.test(value), `<${m[2]} ${name}> from ${JSON.stringify(input)}`);
    }
  }
  rest += html.slice(last);
  assert.doesNotMatch(rest, /[<>"']/, `raw markup character in text from ${JSON.stringify(input)}: ${html}`);
  assert.doesNotMatch(rest.replace(/&(amp|lt|gt|quot|#39);/g, ''), /&/, 'every & is an entity');
}
const decode = (s) => s.replace(/<br>/g, '\n').replace(/<[^>]+>/g, '')
  .replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&amp;/g, '&');

describe('the page script: markdown', () => {
  test('the constructs answers use', () => {
    const cases = [
      ['# Title', '<h1>Title</h1>'],
      ['### Sub ###', '<h3>Sub</h3>'],
      ['#hashtag', '<p>#hashtag</p>'],
      ['a **bold** and *it* and _it_ and ~~gone~~', '<p>a <strong>bold</strong> and <em>it</em> and <em>it</em> and <del>gone</del></p>'],
      ['snake_case_name stays', '<p>snake_case_name stays</p>'],
      ['use `<b>` here', '<p>use <code>&lt;b&gt;</code> here</p>'],
      ['``a ` b``', '<p><code>a ` b</code></p>'],
      ['```js\nif (a < b) { x(); }\n```\nafter', '<pre><code>if (a &lt; b) { x(); }</code></pre><p>after</p>'],
      ['```\nstill streaming <i>', '<pre><code>still streaming &lt;i&gt;</code></pre>'],
      ['- one\n- two\n  more', '<ul><li>one</li><li>two<br>more</li></ul>'],
      ['1. a\n2. b', '<ol><li>a</li><li>b</li></ol>'],
      ['3) c\n4) d', '<ol start="3"><li>c</li><li>d</li></ol>'],
      ['> quoted\n> **text**', '<blockquote><p>quoted<br><strong>text</strong></p></blockquote>'],
      ['line one\nline two\n\nnext', '<p>line one<br>line two</p><p>next</p>'],
      ['---', '<hr>'],
      ['[site](https://example.com/a_b?x=1&y=2)', '<p><a href="https://example.com/a_b?x=1&amp;y=2" rel="noopener noreferrer" target="_blank">site</a></p>'],
      ['[bad](javascript:alert(1))', '<p>[bad](javascript:alert(1))</p>'],
      ['<img src=x onerror=alert(1)>', '<p>&lt;img src=x onerror=alert(1)&gt;</p>'],
      ['[x](https://a.test/"onmouseover="y)', '<p><a href="https://a.test/&quot;onmouseover=&quot;y" rel="noopener noreferrer" target="_blank">x</a></p>'],
      ['', ''],
    ];
    for (const [md, html] of cases) assert.equal(renderMarkdown(md), html, JSON.stringify(md));
  });

  test('random input never yields markup beyond the allowed tags (3000 cases)', () => {
    const r = rng(7);
    const atoms = ['<', '>', '&', '"', "'", '`', '```', '*', '**', '_', '~~', '#', '# ', '> ', '- ', '1. ', '[', ']',
      '(', ')', 'https://x.test/', 'javascript:', 'mailto:a@b', '\n', '\n\n', ' ', '  ', 'a', 'bc', 'script', '=',
      '<script>', '</p>', '&amp;', '\u0001', '\u0002', '0', '\r\n', '---', 'on', '<a href="x">'];
    for (let i = 0; i < 3000; i++) {
      let s = '';
      const n = 1 + Math.floor(r() * 30);
      for (let k = 0; k < n; k++) s += pick(r, atoms);
      assertSafe(renderMarkdown(s), s);
    }
  });

  test('plain text with HTML characters comes back unchanged (2000 cases)', () => {
    const r = rng(11);
    const chars = 'abcxyz <>&"\'/=;:!?,0';
    for (let i = 0; i < 2000; i++) {
      let s = pick(r, 'abcxyz');
      const n = Math.floor(r() * 40);
      for (let k = 0; k < n; k++) s += pick(r, chars);
      s += pick(r, 'abcxyz');
      const html = renderMarkdown(s);
      assertSafe(html, s);
      assert.equal(decode(html), s);
    }
  });
});

describe('the page script: SSE parsing', () => {
  test('any split of the stream gives the same events; CRLF and LF both end lines', () => {
    const events = ['{"a":1}', '{"b":"x\\ny"}', '[DONE]'];
    for (const nl of ['\n', '\r\n']) {
      const stream = events.map((e) => `data: ${e}${nl}${nl}`).join('') + `: comment${nl}${nl}`;
      const r = rng(nl.length);
      for (let trial = 0; trial < 300; trial++) {
        const p = sseParser();
        const got = [];
        for (let i = 0; i < stream.length;) {
          const n = 1 + Math.floor(r() * 9);
          got.push(...p.push(stream.slice(i, i + n)));
          i += n;
        }
        assert.deepEqual(got, events, JSON.stringify(nl));
      }
    }
    const p = sseParser();
    assert.deepEqual([...p.push('data:x\ndata: y\n\n')], ['x\ny'], 'multi-line data joins with a newline');
  });
});
