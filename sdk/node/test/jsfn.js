'use strict';
// A Node.js function for the SDK's tests, its behaviour chosen by JSFN_MODE:
//   upper     upper-cases the body in place (through the Buffer)
//   exclaim   returns the body with "!" appended (a new body)
//   throw     throws a TypeError (calls something that is not a function)
//   fail      throws HandlerError 422 naming the body
//   reject    an async handler whose promise rejects with a RangeError
//   call      calls JSFN_CALLS (comma separated) one by one: "name=output;" or "name!status;"
//   callall   the same with one fan-out (callAll)
//   join      the same over a static fan-out's branches
//   count     a state counter named by the body (stateGet/stateSet), "N"
//   statedel  deletes the key named by the body: "true" or "false"
//   header    the X-Test header, or "<none>"
//   forward   on to JSFN_TARGET
//   reply     straight back to the client with "replied"
//   meta      "id function method path capacity" of the request
//   item      for GET /item/{id} with `headers: [":path", ":query", cookie]`: answers 303 with
//             a Location and a Set-Cookie naming the id, and a body of what it read (path,
//             route, param, query string, decoded query q, cookie session, what a refused
//             header and status threw, whether the body's Buffer was detached by a header)
//   resize    extend(" more"), then setLen(body length - 1), then returns req.body
//   toolarge  setLen to 80 MiB, past the chain's max_body (a HandlerError 500 naming it)
//   grow      answers capacity + 10 bytes of 'z' (past the slot's room: a large slot)
//   sleep     says "jsfn: holding BODY" on stderr (zerohop up echoes it: the test knows the
//             request reached the handler), waits JSFN_SLEEP_MS (default 300) on a timer (60 s
//             for a body starting with "hold": a request the test kills, which only the kill
//             ends in time), then upper-cases the body and appends " max=N": the most
//             handlers this instance had in flight at once
//   keep      keeps the body's Buffer; answers the length the Buffer kept by the previous
//             request reads now ("kept=N")
//   gone      keeps the request; the next request answers what using it throws
//   busy      starts a call and, without awaiting it, reads req.body: what that throws
//   block     busy-waits JSFN_SLEEP_MS (default 2000) on the event loop, then upper-cases
//   gather    holds each request until JSFN_GATHER of them are in flight in this instance
//             together (at most JSFN_GATHER_MS, default 20000, then lets the group go), then
//             upper-cases the body and appends " together=N": how many were held at once

const zerohop = require('../index.js');

const MODE = process.env.JSFN_MODE || 'upper';
const CALLS = (process.env.JSFN_CALLS || '').split(',').filter(Boolean);
const SLEEP_MS = Number(process.env.JSFN_SLEEP_MS || (MODE === 'block' ? 2000 : 300));
const GATHER = Number(process.env.JSFN_GATHER || 1);
const GATHER_MS = Number(process.env.JSFN_GATHER_MS || 20_000);

let kept = null;
let keptReq = null;
let inFlight = 0;
let most = 0;
// The requests `gather` holds: { n, done (resolves when n reaches GATHER), release }.
let group = null;

function listed(names, answers) {
  let out = '';
  names.forEach((name, i) => {
    const a = answers[i];
    out += a.ok ? `${name}=${a.body.toString()};` : `${name}!${a.status};`;
  });
  return out;
}

function upper(buf) {
  for (let i = 0; i < buf.length; i++) {
    if (buf[i] >= 0x61 && buf[i] <= 0x7a) buf[i] -= 0x20;
  }
}

const handlers = {
  upper(req) {
    upper(req.body);
  },
  exclaim(req) {
    return Buffer.concat([req.body, Buffer.from('!')]);
  },
  throw(req) {
    const notAFunction = req.body.length;
    return notAFunction();
  },
  fail(req) {
    throw new zerohop.HandlerError(422, `refusing ${req.body.toString()}`);
  },
  async reject() {
    await new Promise((r) => setTimeout(r, 10));
    throw new RangeError('out of range');
  },
  async call(req) {
    const data = Buffer.from(req.body);
    const answers = [];
    for (const name of CALLS) answers.push(await req.call(name, data));
    return listed(CALLS, answers);
  },
  async callall(req) {
    const answers = await req.callAll(CALLS.map((n) => [n, req.body]));
    return listed(CALLS, answers);
  },
  join(req) {
    return listed(CALLS, req.branches());
  },
  count(req) {
    const key = req.body.toString();
    const old = req.stateGet(key);
    const n = old && old.length === 8 ? old.readBigUInt64LE() + 1n : 1n;
    const v = Buffer.alloc(8);
    v.writeBigUInt64LE(n);
    req.stateSet(key, v);
    return String(n);
  },
  statedel(req) {
    return String(req.stateDelete(req.body));
  },
  header(req) {
    return req.header('X-Test') ?? '<none>';
  },
  forward() {
    return zerohop.forward(process.env.JSFN_TARGET);
  },
  reply() {
    return zerohop.reply('replied');
  },
  meta(req) {
    return `${req.id} ${req.function} ${req.method} ${req.path} ${req.capacity}`;
  },
  item(req) {
    const id = req.param('id');
    const refused = (action) => {
      try {
        action();
        return 'accepted';
      } catch (e) {
        return `${e.name} ${e.status}:${e.message}`;
      }
    };
    const owned = refused(() => req.addResponseHeader('Content-Length', '1'));
    const status404 = refused(() => req.setStatus(404)).split(':')[0];
    req.setBody(
      `path=${req.path} route=${req.routePath} id=${id} query=${req.queryString ?? '-'} ` +
        `q=${req.query('q') ?? '-'} session=${req.cookie('session') ?? '-'} ` +
        `refused=${owned} status404=${status404}`,
    );
    // After the body: the headers move it up within the slot, detaching its Buffer.
    const before = req.body;
    req.addResponseHeader('Location', `/item/${id}/done`);
    req.addResponseHeader('Set-Cookie', `seen=${id}; Path=/`);
    req.setStatus(303);
    req.extend(` detached=${before.length === 0}`);
  },
  resize(req) {
    req.extend(' more');
    req.setLen(req.body.length - 1);
    return req.body;
  },
  toolarge(req) {
    req.setLen(80 * 1024 * 1024);
  },
  grow(req) {
    return Buffer.alloc(req.capacity + 10, 'z');
  },
  async sleep(req) {
    inFlight++;
    most = Math.max(most, inFlight);
    try {
      process.stderr.write(`jsfn: holding ${req.body.toString()}\n`);
      const hold = req.body.subarray(0, 4).toString('latin1') === 'hold';
      await new Promise((r) => setTimeout(r, hold ? 60_000 : SLEEP_MS));
      upper(req.body);
      req.extend(` max=${most}`);
    } finally {
      inFlight--;
    }
  },
  async gather(req) {
    if (group === null) {
      let release;
      const done = new Promise((r) => {
        release = r;
      });
      group = { n: 0, done, release };
    }
    const g = group;
    g.n++;
    if (g.n >= GATHER) {
      group = null;
      g.release();
    }
    let timer;
    const late = new Promise((r) => {
      timer = setTimeout(r, GATHER_MS);
    });
    await Promise.race([g.done, late]);
    clearTimeout(timer);
    // Given up waiting: the next requests start a group of their own.
    if (group === g) group = null;
    upper(req.body);
    req.extend(` together=${g.n}`);
  },
  keep(req) {
    const before = kept === null ? 'none' : String(kept.length);
    kept = req.body;
    return `kept=${before}`;
  },
  gone(req) {
    let said = 'none';
    if (keptReq !== null) {
      try {
        keptReq.setBody('late');
        said = 'nothing thrown';
      } catch (e) {
        said = e.message;
      }
    }
    keptReq = req;
    return said;
  },
  async busy(req) {
    const pending = req.call(CALLS[0], 'x');
    let said = 'nothing thrown';
    try {
      void req.body;
    } catch (e) {
      said = e.message;
    }
    await pending;
    return said;
  },
  block(req) {
    const until = Date.now() + SLEEP_MS;
    while (Date.now() < until) {
      // The event loop is held.
    }
    upper(req.body);
  },
};

const handler = handlers[MODE];
if (!handler) {
  process.stderr.write(`jsfn: unknown JSFN_MODE ${MODE}\n`);
  process.exit(2);
}
zerohop.run(handler);
