'use strict';
// Runs chains for the tests: the real `zerohop up` (target/release/zerohop, or
// $ZEROHOP_BIN) on a free port, the chain's spec written to a temporary folder, requests
// over real HTTP. Every wait is bounded; a chain is stopped by `stop()` (which the tests
// register with `t.after`, so a failing test stops its chain too).

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const JSFN = path.join(__dirname, 'jsfn.js');

function zerohopBin() {
  const bin = process.env.ZEROHOP_BIN || path.join(ROOT, 'target', 'release', 'zerohop');
  if (!fs.existsSync(bin)) {
    throw new Error(`${bin} is missing: build it with \`cargo build --release --bins\` in ${ROOT}`);
  }
  return bin;
}

function addonBuilt() {
  const addon = path.join(__dirname, '..', 'zerohop.node');
  if (!fs.existsSync(addon)) {
    throw new Error(`${addon} is missing: build it with \`npm run build\` in sdk/node`);
  }
}

/**
 * A function of the spec running test/jsfn.js in `mode`; `env` adds variables, `fields`
 * adds spec fields (`, calls: [a]`).
 */
function fn(name, mode, env = '', fields = '') {
  return (
    `  ${name}: { command: ["${process.execPath}", "${JSFN}"], ` +
    `env: { JSFN_MODE: ${mode}${env} }${fields} }\n`
  );
}

/** A running `zerohop up`: `url`, `pid`, `instances()`, `stop()`. */
class Chain {
  static async start(spec, { readyWithinMs = 30_000 } = {}) {
    addonBuilt();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zerohop-node-'));
    fs.chmodSync(dir, 0o755);
    const file = path.join(dir, 'chain.yaml');
    fs.writeFileSync(file, spec);
    const proc = spawn(zerohopBin(), ['up', file, '--listen', '127.0.0.1:0'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const chain = new Chain(proc, dir);
    let out = '';
    let err = '';
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      err += d;
    });
    proc.stdout.setEncoding('utf8');
    try {
      chain.url = await new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`zerohop up was not ready within ${readyWithinMs} ms`)),
          readyWithinMs,
        );
        proc.stdout.on('data', (d) => {
          out += d;
          const m = /ready at (http:\/\/[0-9.:]+)/.exec(out);
          if (m) {
            clearTimeout(timer);
            resolve(m[1]);
          }
        });
        proc.on('exit', (code, signal) => {
          clearTimeout(timer);
          reject(new Error(`zerohop up exited (${code ?? signal}) before it was ready`));
        });
      });
    } catch (e) {
      await chain.stop();
      e.message += `\n--- stdout\n${out}\n--- stderr\n${err.slice(-4000)}`;
      throw e;
    }
    chain.log = () => err;
    return chain;
  }

  constructor(proc, dir) {
    this.proc = proc;
    this.pid = proc.pid;
    this.dir = dir;
    this.url = null;
    this.log = () => '';
  }

  /** Stops the chain: SIGTERM, SIGKILL after 30 s. */
  async stop() {
    const p = this.proc;
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }

  /** The chain's Node.js instances: processes named as this `node` under `zerohop up`. */
  instances() {
    const parent = new Map();
    const name = new Map();
    for (const e of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(e)) continue;
      let s;
      try {
        s = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      } catch {
        continue;
      }
      const close = s.lastIndexOf(')');
      name.set(Number(e), s.slice(s.indexOf('(') + 1, close));
      parent.set(Number(e), Number(s.slice(close + 2).split(' ')[1]));
    }
    const under = (pid) => {
      for (let p = parent.get(pid), n = 0; p !== undefined && n < 64; p = parent.get(p), n++) {
        if (p === this.pid) return true;
      }
      return false;
    };
    // The kernel keeps the first 15 bytes of a program's name.
    const node = path.basename(process.execPath).slice(0, 15);
    return [...name].filter(([pid, comm]) => comm === node && under(pid)).map(([pid]) => pid);
  }
}

/** POSTs `body` to `url`; resolves to { status, body: Buffer, text }. */
async function post(url, body, headers = {}) {
  const r = await fetch(url, {
    method: 'POST',
    body,
    headers,
    signal: AbortSignal.timeout(30_000),
  });
  const buf = Buffer.from(await r.arrayBuffer());
  return { status: r.status, body: buf, text: buf.toString() };
}

/** CPU time (user + system, in clock ticks) process `pid` has used. */
function ticks(pid) {
  const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}

/** Resolves when `check()` is true; rejects after `ms`. */
async function until(check, ms, what) {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

module.exports = { Chain, fn, post, ticks, until, JSFN, ROOT };
