'use strict';
// The boutique's JSON as the Node.js port reads it, held to what the Rust services' serde
// types accept, so that a caller cannot tell the port from the Rust service: an input that
// is not UTF-8 or not JSON, a missing or mistyped field, a field given twice, an integer out
// of its Rust type's range are errors (400 `SERVICE: bad request: WHY`, WHY in serde's
// words without its line and column). And input quoted in a message as Rust's `{:?}` does.
//
// JSON.parse will not do: it reads every number as a double (a unit count past 2^53 would
// lose digits, where the Rust service computes in exact integers), keeps the last of two
// equal keys and lets lone surrogate escapes through. This parser keeps integers as BigInt
// and floats apart, objects as JsonObject (members in a Map, so no key can reach a
// prototype), and nests at most 128 deep, as serde_json.

/** A reason the input is refused (the caller turns it into the 400). */
class WireError extends Error {}

/** A JSON object: its members, and the keys it has more than once. */
class JsonObject {
  constructor() {
    /** @type {Map<string, unknown>} */
    this.members = new Map();
    /** @type {Set<string>} */
    this.twice = new Set();
  }
}

/** A JSON number with a fraction or an exponent: a float to serde, never an integer. */
class JsonFloat {
  /** @param {string} text */
  constructor(text) {
    this.text = text;
  }
}

const MAX_DEPTH = 128;
const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const HEX4 = /[0-9a-fA-F]{4}/y;
const SIMPLE_ESCAPES = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Parses `bytes` (UTF-8 JSON text): integers as BigInt, other numbers as JsonFloat, objects as
 * JsonObject, arrays, strings, booleans and null.
 * @param {Uint8Array} bytes
 */
function parse(bytes) {
  let text;
  try {
    text = UTF8.decode(bytes);
  } catch {
    throw new WireError('invalid UTF-8');
  }
  let i = 0;
  let depth = 0;
  const fail = (why) => {
    throw new WireError(why);
  };
  const space = () => {
    for (;;) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else return;
    }
  };
  const hex4 = () => {
    HEX4.lastIndex = i;
    if (!HEX4.test(text)) fail('invalid escape');
    i += 4;
    return parseInt(text.slice(i - 4, i), 16);
  };

  function string() {
    i++; // the opening quote
    let out = '';
    let start = i;
    for (;;) {
      if (i >= text.length) fail('EOF while parsing a string');
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i++);
        return out;
      }
      if (c < 0x20) fail('control character (\\u0000-\\u001F) found while parsing a string');
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      const e = text[i + 1];
      i += 2;
      if (e === 'u') {
        const hi = hex4();
        if (hi >= 0xdc00 && hi <= 0xdfff) fail('lone trailing surrogate in hex escape');
        if (hi >= 0xd800 && hi <= 0xdbff) {
          if (text[i] !== '\\' || text[i + 1] !== 'u') fail('lone leading surrogate in hex escape');
          i += 2;
          const lo = hex4();
          if (lo < 0xdc00 || lo > 0xdfff) fail('lone leading surrogate in hex escape');
          out += String.fromCharCode(hi, lo);
        } else {
          out += String.fromCharCode(hi);
        }
      } else if (Object.hasOwn(SIMPLE_ESCAPES, e)) {
        out += SIMPLE_ESCAPES[e];
      } else {
        fail('invalid escape');
      }
      start = i;
    }
  }

  function nested(close, what, member) {
    if (++depth > MAX_DEPTH) fail('recursion limit exceeded');
    i++; // the opening bracket
    space();
    if (text[i] === close) {
      i++;
    } else {
      for (;;) {
        member();
        space();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === close) {
          i++;
          break;
        }
        fail(i >= text.length ? `EOF while parsing ${what}` : `expected \`,\` or \`${close}\``);
      }
    }
    depth--;
  }

  function value() {
    space();
    if (i >= text.length) fail('EOF while parsing a value');
    const c = text[i];
    if (c === '{') {
      const o = new JsonObject();
      nested('}', 'an object', () => {
        space();
        if (text[i] !== '"') fail(i >= text.length ? 'EOF while parsing an object' : 'key must be a string');
        const key = string();
        space();
        if (text[i] !== ':') fail('expected `:`');
        i++;
        const v = value();
        if (o.members.has(key)) o.twice.add(key);
        o.members.set(key, v);
      });
      return o;
    }
    if (c === '[') {
      const a = [];
      nested(']', 'a list', () => a.push(value()));
      return a;
    }
    if (c === '"') return string();
    if (c === '-' || (c >= '0' && c <= '9')) {
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(text);
      if (!m) fail('invalid number');
      i = NUMBER.lastIndex;
      return m[1] === undefined && m[2] === undefined ? BigInt(m[0]) : new JsonFloat(m[0]);
    }
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    return fail('expected value');
  }

  const root = value();
  space();
  if (i < text.length) fail('trailing characters');
  return root;
}

const RUST_ESCAPES = { '\0': '\\0', '\t': '\\t', '\r': '\\r', '\n': '\\n', '"': '\\"', '\\': '\\\\' };
// What Rust's `{:?}` writes as \u{..}: not printable (categories C* and Z*, but the space),
// or a combining mark.
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}\p{Grapheme_Extend}]/u;

/**
 * `s` quoted as Rust's `{:?}` shows a string.
 * @param {string} s
 */
function rustDebug(s) {
  let out = '"';
  for (const ch of s) {
    const e = RUST_ESCAPES[ch];
    if (e !== undefined) out += e;
    else if (ch !== ' ' && UNPRINTABLE.test(ch)) out += `\\u{${ch.codePointAt(0).toString(16)}}`;
    else out += ch;
  }
  return `${out}"`;
}

/** How serde names an unexpected value. */
function describe(v) {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return `boolean \`${v}\``;
  if (typeof v === 'bigint') return `integer \`${v}\``;
  if (v instanceof JsonFloat) return `floating point \`${v.text}\``;
  if (typeof v === 'string') return `string ${rustDebug(v)}`;
  if (Array.isArray(v)) return 'sequence';
  return 'map';
}

const NO_DEFAULT = Symbol('no default');

/** Type checks on parsed values: each returns the value or throws the WireError serde's would be. */
const read = {
  /** @returns {JsonObject} */
  struct(v, what) {
    if (!(v instanceof JsonObject)) throw new WireError(`invalid type: ${describe(v)}, expected ${what}`);
    return v;
  },

  /**
   * The field `name` (or its serde `alias`) of `obj`; `dflt` when absent, else missing is an
   * error.
   * @param {JsonObject} obj
   */
  field(obj, name, { alias = '', dflt = NO_DEFAULT } = {}) {
    const present = [name, alias].filter((n) => n !== '' && obj.members.has(n));
    if (present.length > 1 || (present.length === 1 && obj.twice.has(present[0]))) {
      throw new WireError(`duplicate field \`${name}\``);
    }
    if (present.length === 0) {
      if (dflt === NO_DEFAULT) throw new WireError(`missing field \`${name}\``);
      return dflt;
    }
    return obj.members.get(present[0]);
  },

  /** @returns {string} */
  string(v) {
    if (typeof v !== 'string') throw new WireError(`invalid type: ${describe(v)}, expected a string`);
    return v;
  },

  /**
   * An integer of the Rust type `what` (`i64`), from `lo` to `hi`.
   * @returns {bigint}
   */
  integer(v, lo, hi, what) {
    if (typeof v !== 'bigint') throw new WireError(`invalid type: ${describe(v)}, expected ${what}`);
    if (v < lo || v > hi) throw new WireError(`invalid value: integer \`${v}\`, expected ${what}`);
    return v;
  },
};

module.exports = { WireError, parse, rustDebug, read };
