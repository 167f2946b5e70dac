// Starts and stops real kvserve processes for the end-to-end tests, and finds the model they serve.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

export const BINARY = process.env.KVSERVE_BINARY || resolve('../../build/kvserve');
const SHARED = process.env.KVSERVE_SHARED || resolve('../../../shared');

// The model under test: stories260K (a real trained model: its greedy text is meaningful) when ../shared is
// present, otherwise a tiny random model that `kvserve mkmodel` writes.
export function testModel() {
  const stories = join(SHARED, 'models', 'stories260K.gguf');
  if (existsSync(stories)) return { path: stories, shared: true };
  console.log(`# ../shared not found (${SHARED}): using a model written by kvserve mkmodel`);
  const dir = mkdtempSync(join(tmpdir(), 'kvserve-e2e-'));
  const path = join(dir, 'tiny.gguf');
  // the directory is this process's own: removed when the test file's process exits
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  execFileSync(BINARY, ['mkmodel', '--preset', 'tiny', '-o', path], { stdio: 'inherit' });
  return { path, shared: false };
}

function freePort() {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
    srv.on('error', rej);
  });
}

// Starts `kvserve serve` with extra flags; resolves when /health answers 200.
export async function startServer(model, extra = [], env = {}) {
  const port = await freePort();
  const args = ['serve', '-m', model, '--host', '127.0.0.1', '--port', String(port), ...extra];
  const child = spawn(BINARY, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  let log = '';
  child.stderr.on('data', (d) => { log += d.toString(); if (log.length > 1 << 20) log = log.slice(-(1 << 19)); });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`kvserve exited with ${child.exitCode}:\n${log}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`kvserve did not become healthy:\n${log}`); }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    base, port, child,
    log: () => log,
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      const done = new Promise((r) => child.once('exit', (code) => r(code)));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 20000);
      const code = await done;
      clearTimeout(t);
      // A sanitizer build reports leaks and undefined behaviour on the server's stderr: fail on them here,
      // since ctest only sees this test's own output.
      if (/ERROR: (Address|Leak)Sanitizer|runtime error:/.test(log)) {
        throw new Error(`kvserve reported a sanitizer error:\n${log.slice(-20000)}`);
      }
      return code;
    },
  };
}

// Reads one Prometheus sample value (first series with that name) from /metrics text.
export function metric(text, name) {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = line.match(/^([^\s{]+)(\{[^}]*\})?\s+(\S+)/);
    if (m && m[1] === name) return Number(m[3]);
  }
  return undefined;
}
