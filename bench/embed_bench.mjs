// Encoder embeddings throughput (issue 27): POSTs PASSAGES passages of about TOKENS tokens each to /v1/embeddings
// of one or more servers, as one request with an input array (batched: each server schedules the inputs its own
// way), ROUNDS times per server, alternating the servers round by round so that a shared machine's load falls on
// all of them alike. Prints each round's time and each server's best and median passages per second.
// usage: node bench/embed_bench.mjs [--passages 256] [--tokens 100] [--rounds 3] NAME=URL [NAME=URL ...]
const args = process.argv.slice(2);
const opt = { passages: 256, tokens: 100, rounds: 3 };
const servers = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a.startsWith('--')) opt[a.slice(2)] = Number(args[++i]);
  else { const [name, url] = a.split('='); servers.push({ name, url, times: [] }); }
}
if (!servers.length) { console.error('usage: embed_bench.mjs [--passages N] [--tokens N] [--rounds N] NAME=URL ...'); process.exit(2); }
// words of kvserve mkmodel's built-in vocabulary: each is one WordPiece token
const words = ('the of and to a in is it you that he was for on are with as his they be at one have this from or had ' +
  'by not word but what some we can out other were all there when up use your how said an each she which do their ' +
  'time if will way about many then them write would like so these her long make thing see him two has look more ' +
  'day could go come did number sound no most people my over know water than call first who may down side been now ' +
  'find any new work part take get place made live where after back little only round man year came show every good').split(' ');
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const passages = Array.from({ length: opt.passages }, () =>
  Array.from({ length: opt.tokens - 2 }, () => words[rnd(words.length)]).join(' '));
async function round(s) {
  const t0 = performance.now();
  const r = await fetch(`${s.url}/v1/embeddings`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'bench', input: passages }),
  });
  const j = await r.json();
  const dt = (performance.now() - t0) / 1000;
  if (r.status !== 200 || j.data.length !== passages.length) throw new Error(`${s.name}: ${r.status} ${JSON.stringify(j).slice(0, 200)}`);
  return { dt, tokens: j.usage?.prompt_tokens };
}
for (const s of servers) await round(s); // warm-up
for (let k = 0; k < opt.rounds; k++)
  for (const s of servers) {
    const { dt, tokens } = await round(s);
    s.times.push(dt);
    console.log(`round ${k + 1} ${s.name}: ${dt.toFixed(2)} s, ${(opt.passages / dt).toFixed(1)} passages/s (${tokens} prompt tokens)`);
  }
for (const s of servers) {
  const t = [...s.times].sort((a, b) => a - b);
  console.log(`${s.name}: best ${(opt.passages / t[0]).toFixed(1)} passages/s, median ${(opt.passages / t[t.length >> 1]).toFixed(1)} passages/s`);
}
