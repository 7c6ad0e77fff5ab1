'use strict';
// End to end: Node.js functions (test/jsfn.js) in chains run by the real `zerohop up`,
// answered over real HTTP. Build first: `cargo build --release --bins` at the repository's
// root, `npm run build` here.

const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const test = require('node:test');

const { Chain, fn, post, ticks, until, JSFN } = require('./chain.js');

async function chain(t, spec) {
  const c = await Chain.start(spec);
  t.after(() => c.stop());
  return c;
}

test('functions: in place, new bodies, errors, outcomes, calls, state, headers', async (t) => {
  const spec =
    'name: nodesdk\nstate: { entries: 16, value_size: 64 }\nfunctions:\n' +
    fn('up', 'upper') +
    fn('bang', 'exclaim') +
    fn('oops', 'throw') +
    fn('rej', 'reject') +
    fn('no', 'fail') +
    fn('caller', 'call', ', JSFN_CALLS: "up,no"', ', calls: [up, no]') +
    fn('fan', 'callall', ', JSFN_CALLS: "up,no,bang"', ', calls: [up, no, bang]') +
    fn('join', 'join', ', JSFN_CALLS: "up,bang"') +
    fn('count', 'count', '', ', state: true') +
    fn('del', 'statedel', '', ', state: true') +
    fn('hdr', 'header', '', ', headers: [X-Test]') +
    fn('fwd', 'forward', ', JSFN_TARGET: up', ', next: [up]') +
    fn('rep', 'reply') +
    fn('meta', 'meta') +
    fn('resize', 'resize') +
    fn('big', 'toolarge') +
    fn('grow', 'grow') +
    fn('gone', 'gone') +
    fn('busy', 'busy', ', JSFN_CALLS: up', ', calls: [up]') +
    fn('keep', 'keep') +
    'routes:\n' +
    '  - http: POST /hello\n    sequence: [up, bang]\n' +
    '  - http: POST /up\n    sequence: [up]\n' +
    '  - http: POST /oops\n    sequence: [oops]\n' +
    '  - http: POST /reject\n    sequence: [rej]\n' +
    '  - http: POST /no\n    sequence: [no]\n' +
    '  - http: POST /call\n    sequence: [caller]\n' +
    '  - http: POST /fan\n    sequence: [fan]\n' +
    '  - http: POST /join\n    sequence: [{ fan_out: [up, bang], join: join }]\n' +
    '  - http: POST /count\n    sequence: [count]\n' +
    '  - http: POST /del\n    sequence: [del]\n' +
    '  - http: POST /hdr\n    sequence: [hdr]\n' +
    '  - http: POST /fwd\n    sequence: [fwd]\n' +
    '  - http: POST /reply\n    sequence: [rep, up]\n' +
    '  - http: POST /meta\n    sequence: [meta]\n' +
    '  - http: POST /resize\n    sequence: [resize]\n' +
    '  - http: POST /big\n    sequence: [big]\n' +
    '  - http: POST /grow\n    sequence: [grow, bang]\n' +
    '  - http: POST /gone\n    sequence: [gone]\n' +
    '  - http: POST /busy\n    sequence: [busy]\n' +
    '  - http: POST /keep\n    sequence: [keep]\n';
  const c = await chain(t, spec);
  const expect = async (route, body, status, text, headers) => {
    const r = await post(c.url + route, body, headers);
    const what = `${route} ${JSON.stringify(body)}: ${r.status} ${r.text}`;
    assert.equal(r.status, status, what);
    if (text instanceof RegExp) assert.match(r.text, text, what);
    else assert.equal(r.text, text, what);
    return r;
  };

  await expect('/hello', 'hello from node', 200, 'HELLO FROM NODE!');
  // In place through the Buffer: only ASCII letters change, every other byte is kept.
  const r = await post(c.url + '/up', Buffer.from([0x61, 0xff, 0x00, 0x7a, 0x80, 0x31]));
  assert.equal(r.status, 200);
  assert.deepEqual([...r.body], [0x41, 0xff, 0x00, 0x5a, 0x80, 0x31]);
  // An empty body is an empty Buffer.
  await expect('/hello', '', 200, '!');

  // A thrown error: 500 naming it; the instance serves on (the same process).
  const before = c.instances().sort();
  // Else the comparison below would hold for want of anything to compare.
  assert.ok(before.length > 0, "the chain's Node.js instances are found");
  for (let i = 0; i < 2; i++) {
    await expect('/oops', 'x', 500, "function 'oops': TypeError: notAFunction is not a function\n");
  }
  await expect('/reject', 'x', 500, "function 'rej': RangeError: out of range\n");
  await expect('/no', 'this', 422, "function 'no': refusing this\n");
  await expect('/big', 'x', 500, /^function 'big': output of 83886080 bytes does not fit: .*raise max_body\n$/);
  // Past the slot's room the body moves into a large slot, where the next function finds it.
  const grown = await post(c.url + '/grow', 'x');
  assert.equal(grown.status, 200, grown.text.slice(0, 200));
  assert.ok(grown.body.length > 1000 && /^z+!$/.test(grown.text), `${grown.body.length}`);
  await expect('/hello', 'again', 200, 'AGAIN!');
  assert.deepEqual(c.instances().sort(), before, 'no instance was restarted');

  // Outcomes.
  await expect('/fwd', 'forwarded', 200, 'FORWARDED');
  await expect('/reply', 'ignored', 200, 'replied');
  const meta = await post(c.url + '/meta', 'x');
  assert.equal(meta.status, 200);
  assert.match(meta.text, /^\d+ meta POST \/meta \d+$/);
  await expect('/resize', 'abc', 200, 'abc mor');

  // Calls, one at a time and as a fan-out, and a static fan-out's branches.
  await expect('/call', 'ab', 200, 'up=AB;no!422;');
  await expect('/fan', 'cd', 200, 'up=CD;no!422;bang=cd!;');
  await expect('/join', 'ef', 200, 'up=EF;bang=ef!;');

  // State.
  for (let n = 1; n <= 3; n++) await expect('/count', 'visits', 200, String(n));
  await expect('/del', 'visits', 200, 'true');
  await expect('/del', 'visits', 200, 'false');
  await expect('/count', 'visits', 200, '1');

  // Headers the spec lists.
  await expect('/hdr', '', 200, 'from the client', { 'X-Test': 'from the client' });
  await expect('/hdr', '', 200, '<none>');

  // A request kept past its handler, or used while a call is in flight, throws.
  await expect('/gone', 'a', 200, 'none');
  await expect('/gone', 'b', 200, 'the request is gone: its handler has returned');
  await expect('/busy', 'x', 200, 'a call is in flight on this request; await it first');

  // A body Buffer kept past the handler is detached: the next request finds it empty.
  await expect('/keep', 'first', 200, 'kept=none');
  await expect('/keep', 'second', 200, 'kept=0');
  await expect('/keep', 'third', 200, 'kept=0');
});

test('route parameters, the query and cookies in; a 303 with headers out (fetch)', async (t) => {
  const spec =
    'name: nodesdk4\nfunctions:\n' +
    fn('item', 'item', '', ', headers: [":path", ":query", cookie]') +
    'routes:\n  - http: GET /item/{id}\n    sequence: [item]\n';
  const c = await chain(t, spec);
  const get = async (route, headers = {}) => {
    const r = await fetch(c.url + route, {
      headers,
      redirect: 'manual',
      signal: AbortSignal.timeout(30_000),
    });
    return { status: r.status, headers: r.headers, text: await r.text() };
  };
  const r = await get('/item/42?q=caf%C3%A9+au+lait&n=1', { Cookie: 'other=x; session=s-1' });
  assert.equal(r.status, 303, r.text);
  assert.equal(
    r.text,
    'path=/item/42 route=/item/{id} id=42 query=q=caf%C3%A9+au+lait&n=1 q=café au lait ' +
      'session=s-1 refused=HandlerError 500:`Content-Length` is set by the gateway, not by ' +
      'functions status404=HandlerError 500 detached=true',
  );
  assert.equal(r.headers.get('location'), '/item/42/done');
  assert.deepEqual(r.headers.getSetCookie(), ['seen=42; Path=/']);
  // Without a query or cookies: undefined, not empty; the parameter all the same.
  const bare = await get('/item/7');
  assert.equal(bare.status, 303, bare.text);
  assert.match(bare.text, /^path=\/item\/7 route=\/item\/\{id\} id=7 query=- q=- session=- /);
});

test('async handlers: concurrency N has N requests in flight at once', async (t) => {
  // `slow` holds each request until four are in flight in it (its guard: 12 s, then it says
  // how many were; two such waits stay within the client's 30 s): "together=4" is the
  // event that they overlapped, whatever the time.
  const spec =
    'name: nodesdk2\ntimeout: 60s\nfunctions:\n' +
    fn('slow', 'gather', ', JSFN_GATHER: 4, JSFN_GATHER_MS: 12000', ', concurrency: 4') +
    fn('one', 'sleep', ', JSFN_SLEEP_MS: 200') +
    fn('fan', 'callall', ', JSFN_CALLS: "slow,slow"', ', calls: [slow], concurrency: 2') +
    'routes:\n' +
    '  - http: POST /slow\n    sequence: [slow]\n' +
    '  - http: POST /one\n    sequence: [one]\n' +
    '  - http: POST /fan\n    sequence: [fan]\n';
  const c = await chain(t, spec);
  const answers = await Promise.all(['a', 'b', 'c', 'd'].map((b) => post(`${c.url}/slow`, b)));
  assert.deepEqual(
    answers.map((a) => [a.status, a.text]),
    ['A', 'B', 'C', 'D'].map((b) => [200, `${b} together=4`]),
    'four requests at concurrency 4 were in the handler at once',
  );
  // Two requests, each calling `slow` twice at once: four calls in flight, made by two
  // handler threads, each resolving its own promise.
  const fans = await Promise.all(['e', 'f'].map((b) => post(`${c.url}/fan`, b)));
  assert.deepEqual(
    fans.map((a) => [a.status, a.text]),
    ['E', 'F'].map((b) => [200, `slow=${b} together=4;slow=${b} together=4;`]),
    'two fan-outs of two calls each had their four calls in flight at once',
  );
  // At concurrency 1 they take turns.
  const one = await Promise.all(['x', 'y'].map((b) => post(`${c.url}/one`, b)));
  assert.deepEqual(
    one.map((a) => a.text),
    ['X max=1', 'Y max=1'],
  );
});

test('an idle instance uses no CPU; a killed one is answered 502 and restarted', async (t) => {
  const spec =
    'name: nodesdk3\ntimeout: 10s\nfunctions:\n' +
    fn('slow', 'sleep', ', JSFN_SLEEP_MS: 2000') +
    'routes:\n  - http: POST /slow\n    sequence: [slow]\n';
  const c = await chain(t, spec);
  await until(() => c.instances().length === 1, 10_000, 'one instance');
  const [pid] = c.instances();
  await new Promise((r) => setTimeout(r, 1000));
  const before = ticks(pid);
  await new Promise((r) => setTimeout(r, 2000));
  const used = ticks(pid) - before;
  assert.ok(used <= 5, `an idle Node.js instance used ${used} ticks in 2 s`);

  // The function says when it holds the request, and holds it a minute: only the kill ends
  // it within the chain's timeout.
  const inFlight = post(`${c.url}/slow`, 'hold');
  await until(
    () => c.log().includes('jsfn: holding hold'),
    30_000,
    'the Node.js instance holding the request',
  );
  process.kill(pid, 'SIGKILL');
  const killed = await inFlight;
  assert.equal(killed.status, 502, killed.text);
  await until(
    () => c.instances().some((p) => p !== pid),
    10_000,
    'a new instance',
  );
  const again = await post(`${c.url}/slow`, 'again');
  assert.deepEqual([again.status, again.text], [200, 'AGAIN max=1']);
});

test('outside a chain, run() exits 2 and says why', () => {
  const out = spawnSync(process.execPath, [JSFN], {
    env: { ...process.env, JSFN_MODE: 'upper' },
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(out.status, 2, out.stderr);
  assert.match(out.stderr, /zerohop: cannot start: ZEROHOP_\w+ is not set/);
});

test('runtime: node runs a handler file with the package from its node_modules', async (t) => {
  // As a user's project has it: the handler beside a node_modules/zerohop (here a link to
  // this package), in a folder the chain's uid can read.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zerohop-node-rt-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.chmodSync(dir, 0o755);
  fs.mkdirSync(path.join(dir, 'node_modules'), { mode: 0o755 });
  fs.symlinkSync(path.resolve(__dirname, '..'), path.join(dir, 'node_modules', 'zerohop'));
  fs.writeFileSync(
    path.join(dir, 'greet.js'),
    "const zerohop = require('zerohop');\n" +
      'exports.handle = async (req) => {\n' +
      "  if (req.body.length === 0) throw new zerohop.HandlerError(400, 'say who');\n" +
      "  return Buffer.concat([Buffer.from('hello, '), req.body]);\n" +
      '};\n',
    { mode: 0o644 },
  );
  // The example, both ways: its export run by the loader, and run as a program.
  const example = path.resolve(__dirname, '..', 'examples', 'upper.js');
  const node = process.execPath;
  const c = await chain(
    t,
    'name: noderuntime\nfunctions:\n' +
      `  greet: { runtime: node, handler: "${dir}/greet.js:handle", interpreter: "${node}" }\n` +
      `  upper: { runtime: node, handler: "${example}", interpreter: "${node}" }\n` +
      `  upper2: { command: ["${node}", "${example}"] }\n` +
      'routes:\n' +
      '  - http: POST /greet\n    sequence: [greet]\n' +
      '  - http: POST /upper\n    sequence: [upper]\n' +
      '  - http: POST /upper2\n    sequence: [upper2]\n',
  );
  const r = await post(`${c.url}/greet`, 'world');
  assert.deepEqual([r.status, r.text], [200, 'hello, world']);
  const e = await post(`${c.url}/greet`, '');
  assert.deepEqual([e.status, e.text], [400, "function 'greet': say who\n"]);
  for (const route of ['/upper', '/upper2']) {
    const u = await post(c.url + route, 'hello');
    assert.deepEqual([u.status, u.text], [200, 'HELLO'], route);
  }
});

test('a fused group loads a file per function into one interpreter', async (t) => {
  // `fuse: [[upper, exclaim]]` over two `runtime: node` functions, one file each: one
  // process runs both steps, the hop between them a call on the same request; an error in
  // the second step names it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zerohop-node-fused-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.chmodSync(dir, 0o755);
  fs.mkdirSync(path.join(dir, 'node_modules'), { mode: 0o755 });
  fs.symlinkSync(path.resolve(__dirname, '..'), path.join(dir, 'node_modules', 'zerohop'));
  fs.writeFileSync(
    path.join(dir, 'shout.js'),
    'exports.upper = (req) => Buffer.from(req.body.toString().toUpperCase());\n' +
      'exports.pid = () => String(process.pid);\n',
    { mode: 0o644 },
  );
  fs.writeFileSync(
    path.join(dir, 'bang.js'),
    "const zerohop = require('zerohop');\n" +
      'module.exports = async (req) => {\n' +
      '  const text = req.body.toString();\n' +
      "  if (text === 'NO') throw new zerohop.HandlerError(422, `refusing ${req.function}`);\n" +
      "  if (/^[0-9]+$/.test(text)) return `${text}=${process.pid}`;\n" +
      "  return text + '!';\n" +
      '};\n',
    { mode: 0o644 },
  );
  const node = process.execPath;
  const c = await chain(
    t,
    'name: nodefused\nfunctions:\n' +
      `  upper: { runtime: node, handler: "${dir}/shout.js:upper", interpreter: "${node}" }\n` +
      `  exclaim: { runtime: node, handler: "${dir}/bang.js", interpreter: "${node}" }\n` +
      `  pid: { runtime: node, handler: "${dir}/shout.js:pid", interpreter: "${node}" }\n` +
      `  pid2: { runtime: node, handler: "${dir}/bang.js", interpreter: "${node}" }\n` +
      'routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n' +
      '  - http: POST /pids\n    sequence: [pid, pid2]\n' +
      'fuse:\n  - [upper, exclaim]\n  - [pid, pid2]\n',
  );
  const hello = await post(`${c.url}/hello`, 'hello fused');
  assert.deepEqual([hello.status, hello.text], [200, 'HELLO FUSED!']);
  const no = await post(`${c.url}/hello`, 'no');
  assert.deepEqual([no.status, no.text], [422, "function 'exclaim': refusing exclaim\n"]);
  const pids = await post(`${c.url}/pids`, '');
  const [first, second] = pids.text.split('=');
  assert.deepEqual([pids.status, first], [200, second], pids.text);
  assert.equal(c.instances().length, 2, 'one instance per group');
});
