'use strict';
/**
 * Write zerohop functions in Node.js.
 *
 * A function is a program that calls {@link run} with its handler:
 *
 * ```js
 * const zerohop = require('zerohop');
 *
 * zerohop.run((req) => {
 *   const body = req.body;                  // a Buffer over the request in shared memory
 *   for (let i = 0; i < body.length; i++) { // edited in place: no copy
 *     if (body[i] >= 0x61 && body[i] <= 0x7a) body[i] -= 0x20;
 *   }
 * });
 * ```
 *
 * The handler gets a {@link Request} and returns (or resolves to) where the request goes:
 *
 * - `undefined`: on along the route, with the body as the handler left it;
 * - a `Buffer`, `Uint8Array` or string: that becomes the body, then on along the route;
 * - `zerohop.reply()` (or `reply(data)`): straight back to the client;
 * - `zerohop.forward('name')`: on to the function `name` (in the function's `next`).
 *
 * A thrown error (or a rejected promise) becomes an error answer and the instance serves on:
 * a {@link HandlerError} carries its own status, anything else is a 500 naming the error
 * (`function 'f': TypeError: x is not a function`).
 *
 * The body is a Buffer over the request's bytes in the chain's shared memory: reading and
 * writing it copies nothing. When the handler finishes, and when the body is resized, that
 * Buffer's memory is detached: a Buffer kept past then reads as empty (length 0) instead
 * of reaching into the slot, which goes on to other requests. Copy what you keep
 * (`Buffer.from(req.body)`).
 *
 * Concurrency: the runtime runs on threads of its own; the handler runs on the event loop.
 * With `concurrency: N` in the chain spec, N requests can be in the handler at once: an
 * async handler that awaits (a call to another function, a timer, I/O) lets the others run.
 */

const { inspect } = require('node:util');
const { markAsUntransferable } = require('node:worker_threads');

const native = loadNative();

function loadNative() {
  try {
    return require('./zerohop.node');
  } catch (e) {
    if (e && e.code === 'MODULE_NOT_FOUND') {
      throw new Error(
        `zerohop: the native addon ${__dirname}/zerohop.node is missing: build it with ` +
          '`npm run build` in sdk/node (a Rust toolchain is needed), or install the package ' +
          'from a tarball made by `npm pack`, which carries it',
      );
    }
    throw e;
  }
}

const BRAND = Symbol.for('zerohop.kind');

/** An error answer with a status of its own (400 to 599; anything else is 500). */
class HandlerError extends Error {
  /**
   * @param {number} status the HTTP status the client gets
   * @param {string} message one line saying what went wrong
   */
  constructor(status, message) {
    super(message);
    this.name = 'HandlerError';
    /** @type {number} */
    this.status = status;
  }
}
Object.defineProperty(HandlerError.prototype, BRAND, { value: 'HandlerError' });

/** Send the request straight back to the client (with `data` as the body if given). */
class Reply {
  /** @param {Buffer | Uint8Array | string} [data] */
  constructor(data) {
    /** @type {Buffer | Uint8Array | string | undefined} */
    this.data = data;
    Object.freeze(this);
  }
}
Object.defineProperty(Reply.prototype, BRAND, { value: 'Reply' });

/** Send the request on to the function `function` (one of this function's `next`). */
class Forward {
  /** @param {string} name */
  constructor(name) {
    if (typeof name !== 'string' || name === '') {
      throw new TypeError('zerohop.forward needs the name of a function');
    }
    /** @type {string} */
    this.function = name;
    Object.freeze(this);
  }
}
Object.defineProperty(Forward.prototype, BRAND, { value: 'Forward' });

/** Straight back to the client with the body as it is. */
const REPLY = new Reply();

/**
 * Straight back to the client: `return zerohop.reply()`, or `reply(data)` with `data` as the
 * body.
 * @param {Buffer | Uint8Array | string} [data]
 * @returns {Reply}
 */
function reply(data) {
  return data === undefined ? REPLY : new Reply(data);
}

/**
 * On to the function `name` (in this function's `next` list): `return zerohop.forward('b')`.
 * @param {string} name
 * @returns {Forward}
 */
function forward(name) {
  return new Forward(name);
}

/**
 * The answer of a call: `status` 200 and the callee's output, or the call's error status
 * (the callee's own, 502 if it died, 504 if it did not answer in time, 503 if it could not
 * be reached, 500 if this function may not call it) and its message.
 */
class Answer {
  /**
   * @param {number} status
   * @param {Buffer} body
   */
  constructor(status, body) {
    /** @type {number} */
    this.status = status;
    /** @type {Buffer} the output (a copy: it outlives the request), or the error message */
    this.body = body;
    Object.freeze(this);
  }

  /** Whether the callee gave an output. */
  get ok() {
    return this.status === 200;
  }
}

/** A native answer ({ status, body }) as an {@link Answer}. */
function toAnswer(a) {
  return new Answer(a.status, a.body);
}

/** The bytes of `data`, without a copy where it already is bytes. */
function bytes(data, what) {
  if (typeof data === 'string') return Buffer.from(data);
  if (data instanceof Uint8Array) return data;
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  throw new TypeError(`${what} must be a Buffer, a Uint8Array or a string, not ${typeName(data)}`);
}

function typeName(v) {
  if (v === null) return 'null';
  if (typeof v !== 'object') return typeof v;
  return (v.constructor && v.constructor.name) || 'an object';
}

/** A native failure that carries a status becomes a HandlerError with it. */
function fromNative(e) {
  const m = e && typeof e.code === 'string' && /^ZEROHOP_STATUS_(\d+)$/.exec(e.code);
  return m ? new HandlerError(Number(m[1]), e.message) : e;
}

const IS_BODY = Symbol('isBody');

/**
 * One request, valid while its handler runs. Its methods throw once the handler has
 * returned (or its promise settled), and while a call made on it has not answered.
 */
class Request {
  #n;
  /** The Buffer last handed out as the body (over the ArrayBuffer `#n.body()` returns). */
  #buf = null;

  /** @hideconstructor Requests are made by {@link run}. */
  constructor(nativeRequest) {
    this.#n = nativeRequest;
  }

  /**
   * The body: a Buffer over the request's bytes in shared memory (no copy), writable in
   * place. Resizing the body (`setBody`, `extend`, `setLen`) or the handler's end detaches
   * it (it then reads as empty); `req.body` afterwards is a fresh one.
   * @type {Buffer}
   */
  get body() {
    const ab = this.#n.body();
    if (this.#buf === null || this.#buf.buffer !== ab) {
      if (ab.byteLength > 0) markAsUntransferable(ab);
      this.#buf = Buffer.from(ab);
    }
    return this.#buf;
  }

  /** @returns {boolean} whether `v` is the body Buffer as handed out (no copy needed) */
  [IS_BODY](v) {
    return v === this.#buf && v.length > 0 && v.length === this.#n.bodyLen();
  }

  /**
   * Replaces the body with `data` (copied into the slot).
   * @param {Buffer | Uint8Array | string} data
   */
  setBody(data) {
    const d = bytes(data, 'the body');
    try {
      this.#n.setBody(d);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * Appends `data` to the body.
   * @param {Buffer | Uint8Array | string} data
   */
  extend(data) {
    const d = bytes(data, 'the data');
    try {
      this.#n.extend(d);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * Resizes the body; new bytes are zero. Past `capacity` it throws a HandlerError (500).
   * @param {number} length
   */
  setLen(length) {
    if (!Number.isSafeInteger(length) || length < 0) {
      throw new RangeError(`the body's length must be a whole number of bytes, not ${length}`);
    }
    try {
      this.#n.setLen(Math.min(length, 0xffffffff));
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** The most bytes the body may grow to in place (beyond, it moves into a large slot). @type {number} */
  get capacity() {
    return this.#n.capacity();
  }

  /** The gateway's id of the request. @type {number} */
  get id() {
    return this.#n.id();
  }

  /** This function's name. @type {string} */
  get function() {
    return this.#n.function();
  }

  /** The HTTP method of the route the request came in by. @type {string} */
  get method() {
    return this.#n.method();
  }

  /**
   * The request's path: as the client sent it (percent-encoded) when a function of the chain
   * lists `":path"` in its `headers`, else the route's path as the spec writes it
   * ({@link Request#routePath}).
   * @type {string}
   */
  get path() {
    return this.#n.path();
  }

  /**
   * The path of the route the request came in by, as the spec writes it (`/item/{id}`,
   * `/static/{*rest}`).
   * @type {string}
   */
  get routePath() {
    return this.#n.routePath();
  }

  /**
   * The query string as the client sent it (after `?`, not decoded), when a function of the
   * chain lists `":query"` in its `headers` and the request had one.
   * @type {string | undefined}
   */
  get queryString() {
    const v = this.#n.queryString();
    return v === null ? undefined : v;
  }

  /**
   * The request header `name` (case-insensitive), if the spec lists it under the function's
   * `headers` and the client sent it.
   * @param {string} name
   * @returns {string | undefined}
   */
  header(name) {
    const v = this.#n.header(String(name));
    return v === null ? undefined : v;
  }

  /**
   * The route's path parameter `name` (`id` for `GET /item/{id}`, `rest` for a trailing
   * `*`), percent-decoded. Parameters always arrive, listed in `headers` or not.
   * @param {string} name
   * @returns {string | undefined}
   */
  param(name) {
    const v = this.#n.param(String(name));
    return v === null ? undefined : v;
  }

  /**
   * The first value of query parameter `name` (`application/x-www-form-urlencoded`
   * decoding), when a function of the chain lists `":query"` in its `headers`.
   * @param {string} name
   * @returns {string | undefined}
   */
  query(name) {
    const v = this.#n.query(String(name));
    return v === null ? undefined : v;
  }

  /**
   * The value of cookie `name` from the request's `Cookie` headers, when a function of the
   * chain lists `cookie` in its `headers`.
   * @param {string} name
   * @returns {string | undefined}
   */
  cookie(name) {
    const v = this.#n.cookie(String(name));
    return v === null ? undefined : v;
  }

  /**
   * Adds the header `name: value` to the client's answer (HTTP only), e.g. `Location` with a
   * 303 or `Set-Cookie`; a `Content-Type` replaces the route's. Headers the gateway sets
   * (`Content-Length`, `Connection`, ...), names that are not header names, values with a
   * line break, a 65th header and one that does not fit the slot beside the body throw a
   * HandlerError (500; nothing changes). The header rides in the slot before the body, which
   * moves up: the body's Buffer is detached, as by a resize (`req.body` is a fresh one).
   * @param {string} name
   * @param {string} value
   */
  addResponseHeader(name, value) {
    try {
      this.#n.addResponseHeader(String(name), String(value));
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * Sets the answer's status for the client: 200 (the default) to 399, except 204, 205 and
   * 304 (an error is a thrown HandlerError); anything else throws a HandlerError (500). With
   * a 3xx, add a `Location` ({@link Request#addResponseHeader}).
   * @param {number} status
   */
  setStatus(status) {
    if (!Number.isInteger(status) || status < 0 || status > 0xffff) {
      throw new RangeError(`a status is a whole number from 200 to 399, not ${status}`);
    }
    try {
      this.#n.setStatus(status);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * Calls `fn` (one of this function's `calls`) with `data` and resolves to its answer. The
   * event loop runs on meanwhile; the request's other methods throw until it answers.
   * @param {string} fn
   * @param {Buffer | Uint8Array | string} data
   * @returns {Promise<Answer>}
   */
  call(fn, data) {
    return this.callAll([[fn, data]]).then((answers) => answers[0]);
  }

  /**
   * Calls every `[fn, data]` of `calls` at once (a fan-out) and resolves to their answers
   * in the same order, when all have answered.
   * @param {Array<[string, Buffer | Uint8Array | string]>} calls
   * @returns {Promise<Answer[]>}
   */
  callAll(calls) {
    let pending;
    try {
      if (!Array.isArray(calls)) throw new TypeError('callAll takes an array of [function, data]');
      const names = [];
      const inputs = [];
      for (const c of calls) {
        if (!Array.isArray(c) || typeof c[0] !== 'string') {
          throw new TypeError('callAll takes an array of [function, data]');
        }
        names.push(c[0]);
        inputs.push(bytes(c[1], 'a call\'s data'));
      }
      pending = this.#n.call(names, inputs);
    } catch (e) {
      return Promise.reject(e);
    }
    return pending.then((list) => list.map(toAnswer));
  }

  /**
   * The answers of a static fan-out's branches in the route's order, when this function is
   * the route's `join` (the runtime called them before the handler); empty otherwise.
   * @returns {Answer[]}
   */
  branches() {
    return this.#n.branches().map(toAnswer);
  }

  /**
   * The chain state's value of `key` (the function needs `state: true`).
   * @param {Buffer | Uint8Array | string} key
   * @returns {Buffer | undefined}
   */
  stateGet(key) {
    const k = bytes(key, 'the key');
    let v;
    try {
      v = this.#n.stateGet(k);
    } catch (e) {
      throw fromNative(e);
    }
    return v === null ? undefined : v;
  }

  /**
   * Sets the chain state's `key` to `value`.
   * @param {Buffer | Uint8Array | string} key
   * @param {Buffer | Uint8Array | string} value
   */
  stateSet(key, value) {
    const k = bytes(key, 'the key');
    const v = bytes(value, 'the value');
    try {
      this.#n.statePut(k, v);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** The same as {@link Request#stateSet}. */
  statePut(key, value) {
    this.stateSet(key, value);
  }

  /**
   * Removes the chain state's `key`.
   * @param {Buffer | Uint8Array | string} key
   * @returns {boolean} whether it was there
   */
  stateDelete(key) {
    const k = bytes(key, 'the key');
    try {
      return this.#n.stateDelete(k);
    } catch (e) {
      throw fromNative(e);
    }
  }
}

// The outcomes `finish` takes.
const CONTINUE = 0;
const TO_CLIENT = 1;
const FORWARD = 2;
const FAIL = 3;

function brand(v) {
  return v !== null && (typeof v === 'object' || typeof v === 'function') ? v[BRAND] : undefined;
}

/** What an error says in its answer: `TypeError: x is not a function`. */
function describe(e) {
  try {
    if (e instanceof Error) {
      let name = e.name;
      if (name === 'Error' && e.constructor && e.constructor.name) name = e.constructor.name;
      return `${name}: ${e.message}`;
    }
    return `a non-Error was thrown: ${inspect(e, { depth: 0, breakLength: Infinity })}`;
  } catch {
    return 'an exception that cannot be described';
  }
}

/** Ends the request with the error `e` as its answer. */
function fail(nativeRequest, e) {
  let status = 500;
  let text;
  if (brand(e) === 'HandlerError') {
    status = Number.isInteger(e.status) && e.status >= 0 && e.status <= 0xffff ? e.status : 500;
    try {
      text = String(e.message);
    } catch {
      text = 'HandlerError';
    }
  } else {
    text = describe(e);
    try {
      process.stderr.write(`zerohop: the handler threw: ${inspect(e)}\n`);
    } catch {
      // Logging is best effort; the answer is not.
    }
  }
  try {
    nativeRequest.finish(FAIL, status, text);
  } catch {
    // Already finished: nothing to answer.
  }
}

/** Ends the request as the handler's result `v` says. */
function settle(nativeRequest, req, v) {
  try {
    let kind = CONTINUE;
    let text; // Only a forward names something: no string to convert otherwise.
    if (v === undefined || v === null) {
      // On with the body as it is.
    } else if (typeof v === 'string' || ArrayBuffer.isView(v) || v instanceof ArrayBuffer) {
      if (!req[IS_BODY](v)) req.setBody(v);
    } else if (brand(v) === 'Reply') {
      if (v.data !== undefined && v.data !== null && !req[IS_BODY](v.data)) req.setBody(v.data);
      kind = TO_CLIENT;
    } else if (brand(v) === 'Forward') {
      kind = FORWARD;
      text = String(v.function);
    } else {
      throw new TypeError(
        `the handler returned ${typeName(v)}; return undefined, a Buffer, a string, ` +
          'zerohop.reply() or zerohop.forward(name)',
      );
    }
    nativeRequest.finish(kind, 0, text);
  } catch (e) {
    fail(nativeRequest, fromNative(e));
  }
}

/** Runs the handler on one request; whatever happens, the request is finished. */
function dispatch(nativeRequest, handler) {
  const req = new Request(nativeRequest);
  let result;
  try {
    result = handler(req);
  } catch (e) {
    fail(nativeRequest, e);
    return;
  }
  if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
    Promise.resolve(result).then(
      (v) => settle(nativeRequest, req, v),
      (e) => fail(nativeRequest, e),
    );
  } else {
    settle(nativeRequest, req, result);
  }
}

/**
 * One handler that runs the one registered in `handlers` for the request's function.
 * @param {Record<string, (req: Request) => unknown>} handlers
 */
function byName(handlers) {
  const table = new Map();
  for (const [name, h] of Object.entries(handlers)) {
    if (typeof h !== 'function') {
      throw new TypeError(
        `zerohop.run takes a handler function or an object of them by function name; ` +
          `${name} is ${typeName(h)}`,
      );
    }
    table.set(name, h);
  }
  return (req) => {
    const h = table.get(req.function);
    if (h === undefined) {
      throw new HandlerError(
        500,
        `this program registers no handler for function \`${req.function}\` ` +
          `(it has: ${[...table.keys()].join(', ')})`,
      );
    }
    return h(req);
  };
}

/**
 * Serves requests with `handler` until the agent stops the instance. Returns at once: the
 * runtime runs on threads of its own and keeps the process alive. A program not started by
 * the agent (`zerohop up`) exits with status 2 and says why.
 *
 * `handler` may be an object of handlers by function name instead
 * (`zerohop.run({ upper, exclaim })`): each request runs the handler of its function
 * (`req.function`). That is how one interpreter serves a fused group (`fuse:` in the chain
 * spec), its steps called one after the other on the same request, in place; `runtime: node`
 * functions of a group get it without any code (each function's file loaded into the one
 * interpreter).
 * @param {((req: Request) => unknown) | Record<string, (req: Request) => unknown>} handler
 */
function run(handler) {
  if (handler !== null && typeof handler === 'object') {
    handler = byName(handler);
  }
  if (typeof handler !== 'function') {
    throw new TypeError(`zerohop.run needs a handler function, not ${typeName(handler)}`);
  }
  try {
    native.run((nativeRequest) => dispatch(nativeRequest, handler));
  } catch (e) {
    if (e && e.code === 'ZEROHOP_NOT_STARTED') {
      process.stderr.write(`zerohop: cannot start: ${e.message}\n`);
      process.exit(2);
    }
    throw e;
  }
}

module.exports = {
  run,
  Request,
  Answer,
  HandlerError,
  Reply,
  Forward,
  REPLY,
  reply,
  forward,
};
