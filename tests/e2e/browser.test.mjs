// The built-in chat page in a real headless browser: Debian's chromium driven by puppeteer-core (which never
// downloads a browser of its own), against a real `kvserve serve` on the embedded default model. It loads under
// its CSP with nothing fetched from elsewhere, streams an answer, stops a long generation (the server cancels
// it), asks for and keeps an API key, and leaves a screenshot in the build folder. Where no browser can run it
// prints `SKIPPED: <why>` and passes.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BINARY, startServer, metric } from './server.mjs';

const SHOTS = process.env.KVSERVE_SCREENSHOT_DIR || resolve('../../build');
const CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run'];

function findChromium() {
  const env = process.env.KVSERVE_CHROMIUM;
  if (env) return existsSync(env) ? env : null;
  for (const p of ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/lib/chromium/chromium']) if (existsSync(p)) return p;
  return null;
}

let skip = null;     // why the browser cannot run here, or null
let browser = null;
let userDir = null;
let srv = null;
let modelPath = null;
let modelDir = null;

before(async () => {
  const exe = findChromium();
  if (!exe) { skip = 'no chromium found (scripts/install-deps.sh installs Debian\'s chromium package)'; }
  let puppeteer = null;
  if (!skip) {
    try {
      puppeteer = (await import('puppeteer-core')).default;
    } catch (e) {
      skip = `puppeteer-core is not installed (npm ci --prefix tests/e2e): ${e.message}`;
    }
  }
  if (!skip) {
    userDir = mkdtempSync(join(tmpdir(), 'kvserve-chromium-'));
    try {
      browser = await puppeteer.launch({
        executablePath: exe, headless: true, args: [...CHROMIUM_FLAGS, `--user-data-dir=${userDir}`],
        // puppeteer's own defaults would add flags of its choosing; these are the only ones
        ignoreDefaultArgs: true, pipe: true, timeout: 60000,
      });
    } catch (e) {
      skip = `chromium cannot start here: ${String(e.message).split('\n')[0]}`;
    }
  }
  if (skip) { console.log(`SKIPPED: ${skip}`); return; }
  modelDir = mkdtempSync(join(tmpdir(), 'kvserve-browser-'));
  modelPath = join(modelDir, 'default.gguf');
  execFileSync(BINARY, ['mkmodel', '--preset', 'default', '-o', modelPath], { stdio: 'ignore' });
  // a context long enough that a greedy answer runs for seconds: the stop button has something to stop
  srv = await startServer(modelPath, ['--threads', '2', '--parallel', '4', '--ctx-size', '16384']);
});

after(async () => {
  if (browser) await browser.close();
  if (userDir) rmSync(userDir, { recursive: true, force: true });
  try {
    if (srv) assert.equal(await srv.stop(), 0, 'kvserve exits 0 on SIGTERM');
  } finally {
    if (modelDir) rmSync(modelDir, { recursive: true, force: true });
  }
});

// A page that records CSP violations, console errors and every URL it requests.
async function openPage(base) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 760 });
  const seen = { violations: [], errors: [], urls: [] };
  page.on('console', (m) => { if (m.type() === 'error') seen.errors.push(m.text()); });
  page.on('pageerror', (e) => seen.errors.push(String(e)));
  page.on('request', (r) => seen.urls.push(r.url()));
  await page.exposeFunction('__cspViolation', (v) => seen.violations.push(v));
  await page.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (e) => window.__cspViolation(`${e.violatedDirective} ${e.blockedURI}`));
  });
  const resp = await page.goto(`${base}/`, { waitUntil: 'load' });
  return { page, seen, resp };
}

const idle = (page) => page.waitForFunction(() => document.body.dataset.state === 'idle', { timeout: 60000 });
const assistantText = (page) => page.evaluate(() => {
  const all = document.querySelectorAll('.msg.assistant');
  return all.length ? all[all.length - 1].textContent : '';
});

async function metrics(base) {
  return (await fetch(`${base}/metrics`)).text();
}

async function setField(page, sel, value) {
  await page.$eval(sel, (el, v) => { el.value = v; }, String(value));
}

describe('the chat page in chromium', () => {
  let page = null;
  let seen = null;

  test('loads under its CSP, shows the model and its context, fetches nothing from elsewhere', async (t) => {
    if (skip) return t.skip(skip);
    ({ page, seen } = await openPage(srv.base).then((o) => {
      assert.equal(o.resp.status(), 200);
      assert.match(o.resp.headers()['content-security-policy'], /script-src 'sha256-/);
      return o;
    }));
    await idle(page);
    const id = (await (await fetch(`${srv.base}/v1/models`)).json()).data[0].id;
    assert.equal(await page.$eval('#model', (e) => e.textContent), id);
    assert.equal(await page.$eval('#ctx', (e) => e.textContent), 'context 16384 tokens');
    assert.equal(await page.$eval('#key-row', (e) => e.hidden), true, 'no key asked when none is needed');
    assert.deepEqual(seen.violations, []);
    assert.deepEqual(seen.errors, []);
    for (const u of seen.urls) assert.ok(u.startsWith(`${srv.base}/`) || u.startsWith('data:'), u);
  });

  test('the CSP blocks a script that is not the page\'s own', async (t) => {
    if (skip) return t.skip(skip);
    const ran = await page.evaluate(() => {
      const s = document.createElement('script');
      s.textContent = 'window.__injected = 1;';
      document.body.appendChild(s);
      return window.__injected === 1;
    });
    assert.equal(ran, false);
    for (let i = 0; i < 50 && !seen.violations.length; i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(seen.violations.some((v) => v.startsWith('script-src')), JSON.stringify(seen.violations));
    seen.violations.length = 0;
    seen.errors.length = 0; // chromium also logs the blocked script as a console error
  });

  test('a message streams into the page and equals the server\'s own answer', async (t) => {
    if (skip) return t.skip(skip);
    await setField(page, '#temperature', 0);
    await setField(page, '#max-tokens', 300);
    // record every distinct length the answer takes while it streams
    await page.evaluate(() => {
      window.__lengths = new Set();
      new MutationObserver(() => {
        const all = document.querySelectorAll('.msg.assistant');
        if (all.length) window.__lengths.add(all[all.length - 1].textContent.length);
      }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    });
    await page.type('#input', 'Hello there, who are you?');
    await page.click('#send');
    await page.waitForFunction(() => document.body.dataset.state === 'generating', { timeout: 10000 }).catch(() => {});
    await idle(page);
    const lengths = await page.evaluate(() => [...window.__lengths].filter((n) => n > 0).length);
    assert.ok(lengths >= 2, `the answer grew in steps while streaming (${lengths} distinct lengths)`);
    // the same conversation through the API, greedy: the page must show exactly that text, rendered
    const r = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello there, who are you?' }], temperature: 0, max_tokens: 300 }),
    });
    const want = (await r.json()).choices[0].message.content;
    assert.ok(want.length > 0);
    const html = await page.evaluate(() => { const a = document.querySelectorAll('.msg.assistant'); return a[a.length - 1].innerHTML; });
    const rendered = await page.evaluate((s) => {
      const d = document.createElement('div');
      d.innerHTML = renderMarkdown(s); // as the page shows it: serialized back by the DOM
      return d.innerHTML;
    }, want);
    assert.equal(html, rendered);
    assert.match(await page.$eval('#status', (e) => e.textContent), /^\d+ tokens in [\d.]+ s/);
    assert.equal(await page.$eval('.msg.user', (e) => e.textContent), 'Hello there, who are you?');
    await page.screenshot({ path: join(SHOTS, 'e2e-chat-page.png') });
    assert.deepEqual(seen.violations, []);
    assert.deepEqual(seen.errors, []);
  });

  test('Stop ends a long generation and the server cancels it', async (t) => {
    if (skip) return t.skip(skip);
    await page.click('#clear');
    assert.equal(await page.$$eval('.msg', (l) => l.length), 0, 'Clear empties the conversation');
    const abortedBefore = abortCount(await metrics(srv.base));
    await setField(page, '#temperature', 0);
    await setField(page, '#max-tokens', 16000);
    await page.type('#input', 'Write a long story');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const a = document.querySelectorAll('.msg.assistant');
      return a.length && a[a.length - 1].textContent.length > 200;
    }, { timeout: 30000 });
    assert.equal(await page.$eval('#stop', (e) => e.disabled), false);
    assert.equal(await page.$eval('#send', (e) => e.disabled), true);
    await page.click('#stop');
    await idle(page);
    const status = await page.$eval('#status', (e) => e.textContent);
    assert.equal(await page.$$eval('.msg.assistant .note', (l) => l.map((e) => e.textContent).join()), 'stopped',
      `status: ${status}; answer: ${(await assistantText(page)).length} characters`);
    assert.match(await page.$eval('#status', (e) => e.textContent), /^stopped/);
    const len = (await assistantText(page)).length;
    await new Promise((r) => setTimeout(r, 400));
    assert.equal((await assistantText(page)).length, len, 'nothing arrives after Stop');
    // the server saw the disconnect: the request ends as aborted and nothing keeps running
    let m = '';
    for (let i = 0; i < 100; i++) {
      m = await metrics(srv.base);
      if (abortCount(m) === abortedBefore + 1 && metric(m, 'kvserve:num_requests_running') === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(abortCount(m), abortedBefore + 1, 'one request aborted');
    assert.equal(metric(m, 'kvserve:num_requests_running'), 0);
    await page.screenshot({ path: join(SHOTS, 'e2e-chat-page-stopped.png') });
    // the conversation goes on after a stop
    await setField(page, '#max-tokens', 8);
    await page.type('#input', 'Shorter, please.');
    await page.click('#send');
    await idle(page);
    assert.equal(await page.$$eval('.msg.assistant', (l) => l.length), 2);
    assert.deepEqual(seen.errors, []);
    await page.close();
  });

  test('asks for the API key on 401, uses it and keeps it', async (t) => {
    if (skip) return t.skip(skip);
    const k = await startServer(modelPath, ['--threads', '1', '--api-key', 'sekret']);
    try {
      const { page: p, seen: s } = await openPage(k.base);
      await p.waitForFunction(() => !document.getElementById('key-row').hidden, { timeout: 10000 });
      assert.match(await p.$eval('#key-msg', (e) => e.textContent), /API key/);
      await p.type('#api-key', 'sekret');
      await p.click('#save-key');
      await p.waitForFunction(() => document.body.dataset.state === 'idle' && document.getElementById('key-row').hidden);
      await setField(p, '#max-tokens', 8);
      await p.type('#input', 'Hi');
      await p.click('#send');
      await idle(p);
      assert.equal(await p.$$eval('.msg.assistant.error', (l) => l.length), 0);
      assert.ok((await p.$eval('.msg.assistant', (e) => e.textContent)).length > 0);
      assert.equal(await p.evaluate(() => localStorage.getItem('kvserve.apiKey')), 'sekret');
      await p.reload({ waitUntil: 'load' });
      await p.waitForFunction(() => document.body.dataset.state === 'idle');
      assert.equal(await p.$eval('#key-row', (e) => e.hidden), true, 'the kept key is used after a reload');
      assert.deepEqual(s.violations, []);
      // a wrong key: the message comes back to the input and the key is asked for again
      await p.evaluate(() => localStorage.setItem('kvserve.apiKey', 'wrong'));
      await p.reload({ waitUntil: 'load' });
      await p.waitForFunction(() => !document.getElementById('key-row').hidden);
      await p.close();
    } finally {
      assert.equal(await k.stop(), 0);
    }
  });
});

function abortCount(text) {
  const m = text.match(/^kvserve:request_success_total\{finished_reason="abort"\} (\d+)/m);
  return m ? Number(m[1]) : NaN;
}
