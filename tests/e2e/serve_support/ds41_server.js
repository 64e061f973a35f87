// e2e support: starts `ds41 serve` on a free port (--port 0; the port is read from the ready line),
// makes the tiny model it serves, runs `ds41 generate` for reference outputs, reads the server's
// RSS and /metrics, and stops it. Used by the openai_client, serve_load and serve_shutdown tests.
// Node built-ins only (no npm packages).
'use strict';
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

// Servers and temp dirs still alive; killed / removed if this test process is itself stopped
// (ctest timeout: SIGTERM), so no `ds41 serve` outlives its test.
const live = new Set();
const liveDirs = new Set();
function cleanupAll() {
  for (const p of live) { try { p.kill('SIGKILL'); } catch { /* gone */ } }
  for (const d of liveDirs) fs.rmSync(d, { recursive: true, force: true });
}
process.on('exit', cleanupAll);
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => { cleanupAll(); process.exit(1); });

// Makes the tiny checkpoint (random weights, V4.1 tokenizer) in a fresh temp dir; returns its path.
// `preset` 'tiny-vision' adds a small vision tower (the image tests).
function makeTinyModel(ds41, sharedDir, seed = 1, preset = 'tiny') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ds41-e2e-model-'));
  const out = path.join(dir, 'tiny');
  execFileSync(ds41, ['make-checkpoint', '--preset', preset, '--seed', String(seed), '--out', out,
    '--tokenizer', path.join(sharedDir, 'tokenizer-v41')], { stdio: ['ignore', 'ignore', 'inherit'] });
  liveDirs.add(dir);
  return { dir, model: out, remove: () => { fs.rmSync(dir, { recursive: true, force: true }); liveDirs.delete(dir); } };
}

// Starts `ds41 serve --model MODEL --port PORT ...extra` and resolves when the ready line is out.
// Resolves to { proc, port, url, stderr(), stop(signal), exited }.
// The tests call `ds41 generate` synchronously (execFileSync), which blocks Node's event loop for
// seconds: the client's keep-alive timer cannot fire meanwhile, so it may reuse a pooled
// connection that the server closed after its idle timeout (default 5 s) and the next POST fails
// with "other side closed" (seen in CI under load). The servers of the tests keep idle
// connections for 300 s unless the test passes its own --keep-alive-timeout.
function startServer(ds41, model, extra = [], { port = 0, readyTimeoutMs = 60000 } = {}) {
  const keep = extra.includes('--keep-alive-timeout') ? [] : ['--keep-alive-timeout', '300'];
  const proc = spawn(ds41, ['serve', '--model', model, '--port', String(port), ...keep, ...extra],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(proc);
  proc.on('exit', () => live.delete(proc));
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('no ready line:\n' + err)); },
      readyTimeoutMs);
    exited.then((r) => { clearTimeout(timer); reject(new Error(`ds41 serve exited ${JSON.stringify(r)}:\n${err}`)); });
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /ready on (http:\/\/[^ ]+:(\d+))/.exec(out);
      if (!m) return;
      clearTimeout(timer);
      const srv = {
        proc, exited, url: m[1], port: Number(m[2]),
        stderr: () => err,
        // Sends `signal` and waits for the exit; a server still up after `ms` is killed (a failure).
        stop: async (signal = 'SIGTERM', ms = 30000) => {
          if (proc.exitCode !== null || proc.signalCode !== null) return exited;
          proc.kill(signal);
          let t;
          const killed = new Promise((res) => { t = setTimeout(() => { proc.kill('SIGKILL'); res(null); }, ms); });
          const r = await Promise.race([exited, killed]);
          clearTimeout(t);
          if (r === null) throw new Error(`ds41 serve did not exit within ${ms} ms of ${signal}`);
          return r;
        },
      };
      resolve(srv);
    });
  });
}

// `ds41 generate ...args` -> { text (stdout without the final newline), decoded (token count) }.
function generate(ds41, args) {
  const r = require('node:child_process').spawnSync(ds41, ['generate', ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ds41 generate ${args.join(' ')} failed:\n${r.stderr}`);
  const m = /decode: (\d+) tokens/.exec(r.stderr);
  return { text: r.stdout.replace(/\n$/, ''), decoded: m ? Number(m[1]) : -1 };
}

// Resident set size of a process in KiB (VmRSS of /proc/PID/status).
function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : -1;
}

// Children of a process (from /proc), to check that nothing is left behind.
function childPids(pid) {
  const kids = [];
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) kids.push(Number(e));
    } catch { /* gone */ }
  }
  return kids;
}

// GET /metrics -> { name or name{labels}: number }.
async function metrics(url, headers = {}) {
  const r = await fetch(url + '/metrics', { headers });
  if (r.status !== 200) throw new Error('/metrics answered ' + r.status);
  const out = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    out[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return out;
}

// Reads a Server-Sent-Event body to the end: { events: parsed JSON data, done: saw [DONE] }.
async function readSse(response) {
  const events = [];
  let done = false, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of response.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') done = true;
        else events.push(JSON.parse(data));
      }
    }
  }
  return { events, done };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `fn` until it returns true or `ms` pass; returns the last value.
async function waitFor(fn, ms, every = 100) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v || Date.now() > end) return v;
    await sleep(every);
  }
}

module.exports = { makeTinyModel, startServer, generate, rssKiB, childPids, metrics, readSse, sleep, waitFor };
