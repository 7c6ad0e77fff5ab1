// Types of the `zerohop` package (index.js). See docs/sdk-node.md.

/// <reference types="node" />

/** Bytes a method takes: a Buffer, any Uint8Array, another ArrayBuffer view, or a string (UTF-8). */
export type Bytes = Buffer | Uint8Array | ArrayBufferView | ArrayBuffer | string;

/** What a handler returns (or its promise resolves to). */
export type Result = undefined | null | void | Bytes | Reply | Forward;

/** A request handler; it may be async. */
export type Handler = (req: Request) => Result | Promise<Result>;

/**
 * Serves requests with `handler` until the agent stops the instance. Returns at once: the
 * runtime runs on threads of its own and keeps the process alive. A program not started by
 * the agent (`zerohop up`) exits with status 2 and says why.
 */
export function run(handler: Handler | Record<string, Handler>): void;

/** An error answer with a status of its own (400 to 599; anything else is 500). */
export class HandlerError extends Error {
  constructor(status: number, message: string);
  /** The HTTP status the client gets. */
  status: number;
}

/** Straight back to the client (with `data` as the body if given). */
export class Reply {
  constructor(data?: Bytes);
  readonly data: Bytes | undefined;
}

/** On to the function `function` (one of this function's `next`). */
export class Forward {
  constructor(name: string);
  readonly function: string;
}

/** Straight back to the client with the body as it is. */
export const REPLY: Reply;

/** Straight back to the client: `return zerohop.reply()`, or `reply(data)` with that body. */
export function reply(data?: Bytes): Reply;

/** On to the function `name` (in this function's `next` list). */
export function forward(name: string): Forward;

/**
 * The answer of a call: `status` 200 and the callee's output, or the call's error status
 * (the callee's own, 502 if it died, 504 if it did not answer in time, 503 if it could not
 * be reached, 500 if this function may not call it) and its message.
 */
export class Answer {
  readonly status: number;
  /** The output (a copy: it outlives the request), or the error's message. */
  readonly body: Buffer;
  /** Whether the callee gave an output (status 200). */
  readonly ok: boolean;
}

/**
 * One request, valid while its handler runs. Its methods throw once the handler has
 * returned (or its promise settled), and while a call made on it has not answered.
 */
export class Request {
  private constructor();
  /**
   * The body: a Buffer over the request's bytes in shared memory (no copy), writable in
   * place. Resizing the body or the handler's end detaches it (it then reads as empty);
   * `req.body` afterwards is a fresh one.
   */
  readonly body: Buffer;
  /** The most bytes the body may grow to in place (beyond, it moves into a large slot). */
  readonly capacity: number;
  /** The gateway's id of the request. */
  readonly id: number;
  /** This function's name. */
  readonly function: string;
  /** The HTTP method of the route the request came in by. */
  readonly method: string;
  /**
   * The request's path: as the client sent it (percent-encoded) when a function of the chain
   * lists `":path"` in its `headers`, else the route's path as the spec writes it.
   */
  readonly path: string;
  /** The path of the route the request came in by, as the spec writes it (`/item/{id}`). */
  readonly routePath: string;
  /** The query string as sent (not decoded), when a function lists `":query"` and there is one. */
  readonly queryString: string | undefined;
  /** Replaces the body with `data` (copied into the slot). Past `capacity`: HandlerError 500. */
  setBody(data: Bytes): void;
  /** Appends `data` to the body. */
  extend(data: Bytes): void;
  /** Resizes the body; new bytes are zero. */
  setLen(length: number): void;
  /**
   * The request header `name` (case-insensitive), if the spec lists it under the function's
   * `headers` and the client sent it.
   */
  header(name: string): string | undefined;
  /** The route's path parameter `name` (`{id}`, or `rest` for a trailing `*`), percent-decoded. */
  param(name: string): string | undefined;
  /** The first value of query parameter `name`, form-urlencoded decoded (`":query"` listed). */
  query(name: string): string | undefined;
  /** The value of cookie `name` (`cookie` listed in the function's `headers`). */
  cookie(name: string): string | undefined;
  /**
   * Adds `name: value` to the client's answer (e.g. `Location`, `Set-Cookie`); refused
   * (HandlerError 500) for headers the gateway sets, bad names or values, a 65th, or no room.
   * Detaches the body's Buffer (the body moves up in the slot).
   */
  addResponseHeader(name: string, value: string): void;
  /** Sets the answer's status: 200..399 but 204, 205 and 304, else HandlerError 500. */
  setStatus(status: number): void;
  /** Calls `fn` (one of this function's `calls`) with `data`; resolves to its answer. */
  call(fn: string, data: Bytes): Promise<Answer>;
  /** Calls every `[fn, data]` at once (a fan-out); resolves to their answers in order. */
  callAll(calls: ReadonlyArray<readonly [string, Bytes]>): Promise<Answer[]>;
  /** The answers of the static fan-out this function joins, in the route's order; else empty. */
  branches(): Answer[];
  /** The chain state's value of `key` (the function needs `state: true`). */
  stateGet(key: Bytes): Buffer | undefined;
  /** Sets the chain state's `key` to `value`. */
  stateSet(key: Bytes, value: Bytes): void;
  /** The same as `stateSet`. */
  statePut(key: Bytes, value: Bytes): void;
  /** Removes the chain state's `key`; whether it was there. */
  stateDelete(key: Bytes): boolean;
}
