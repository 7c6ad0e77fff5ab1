'use strict';
// currency, in Node.js as in Google's original: the supported currencies and conversion
// between them, with the original's EUR-based rates. A port of src/services/currency.rs:
// the same requests ({"op":"supported"}, {"op":"convert","from":MONEY,"to_code":CODE}), the
// same answers byte for byte, the same errors.
//
// A conversion goes through EUR in exact integer arithmetic (BigInt), as the Rust service
// does where the original uses floats: rates are fixed-point numbers with six decimals, the
// amount is `nanos * rate(to) / rate(from)`, truncated toward zero to whole nanos.
//
// Run by chain-polyglot.yaml as `runtime: node` with `handler: polyglot/currency.js:handle`.
// The rates are read once, at start, from ../data/currency_conversion.json by a path
// relative to this file: the instance runs under the chain's own uid, which may read the
// repository (world-readable) but nothing private to the agent's user.

const fs = require('node:fs');
const path = require('node:path');

const zerohop = require('zerohop');

const { WireError, parse, read, rustDebug } = require('./wire');

const RATES_FILE = path.join(__dirname, '..', 'data', 'currency_conversion.json');
/** Decimal places a rate may have. */
const RATE_DECIMALS = 6;
const NANOS_PER_UNIT = 1_000_000_000n;
const I32 = [-(2n ** 31n), 2n ** 31n - 1n];
const I64 = [-(2n ** 63n), 2n ** 63n - 1n];
const I128 = [-(2n ** 127n), 2n ** 127n - 1n];

/**
 * `"1.1305"` -> 1_130_500n; null for anything but a positive decimal with at most
 * RATE_DECIMALS decimals.
 * @param {string} s
 */
function parseRate(s) {
  const m = /^([0-9]+)(?:\.([0-9]*))?$/.exec(s);
  const frac = m?.[2] ?? '';
  if (!m || frac.length > RATE_DECIMALS) return null;
  const v = BigInt(m[1] + frac) * 10n ** BigInt(RATE_DECIMALS - frac.length);
  return v > 0n ? v : null;
}

/**
 * Units per EUR of each currency, scaled by 10^RATE_DECIMALS, by code in sorted order.
 * A file that does not hold them ends the instance with why (its log says).
 * @returns {Map<string, bigint>}
 */
function loadRates(file) {
  const raw = JSON.parse(fs.readFileSync(file, 'utf8'));
  const rates = new Map();
  for (const code of Object.keys(raw).sort()) {
    const rate = typeof raw[code] === 'string' ? parseRate(raw[code]) : null;
    if (rate === null) {
      throw new Error(`${file}: rate ${JSON.stringify(raw[code])} of ${code} is not a decimal`);
    }
    rates.set(code, rate);
  }
  return rates;
}

const RATES = loadRates(RATES_FILE);
const SUPPORTED = Buffer.from(JSON.stringify({ currency_codes: [...RATES.keys()] }));

function badRequest(message) {
  return new zerohop.HandlerError(400, message);
}

function rate(code) {
  const r = RATES.get(code);
  if (r === undefined) throw badRequest(`unsupported currency ${rustDebug(code)}`);
  return r;
}

/**
 * `from` in `toCode`, as the Money JSON the Rust service writes.
 * @param {{currencyCode: string, units: bigint, nanos: bigint}} from
 * @param {string} toCode
 */
function convert(from, toCode) {
  const { units, nanos } = from;
  const signsAgree = !((units > 0n && nanos < 0n) || (units < 0n && nanos > 0n));
  if (nanos < -999_999_999n || nanos > 999_999_999n || !signsAgree) {
    throw badRequest(`invalid amount ${units} units ${nanos} nanos`);
  }
  const fromRate = rate(from.currencyCode);
  const toRate = rate(toCode);
  // Where the Rust service's i128 would overflow (never, with i64 units and these rates).
  const scaled = (units * NANOS_PER_UNIT + nanos) * toRate;
  if (scaled < I128[0] || scaled > I128[1]) throw badRequest('amount out of range');
  // BigInt division truncates toward zero and the remainder takes the dividend's sign, as
  // in Rust: units and nanos keep one sign.
  const total = scaled / fromRate;
  const outUnits = total / NANOS_PER_UNIT;
  if (outUnits < I64[0] || outUnits > I64[1]) throw badRequest('amount out of range');
  const outNanos = total % NANOS_PER_UNIT;
  return `{"currency_code":${JSON.stringify(toCode)},"units":${outUnits},"nanos":${outNanos}}`;
}

/** The request in `bytes`, read as the Rust service's serde types read it. */
function parseRequest(bytes) {
  const root = read.struct(parse(bytes), 'internally tagged enum Request');
  const op = read.string(read.field(root, 'op'));
  if (op === 'supported') return { op };
  if (op !== 'convert') {
    throw new WireError(`unknown variant \`${op}\`, expected \`supported\` or \`convert\``);
  }
  const m = read.struct(read.field(root, 'from'), 'struct Money');
  const from = {
    currencyCode: read.string(read.field(m, 'currency_code', { alias: 'currencyCode' })),
    units: read.integer(read.field(m, 'units', { dflt: 0n }), ...I64, 'i64'),
    nanos: read.integer(read.field(m, 'nanos', { dflt: 0n }), ...I32, 'i32'),
  };
  return { op, from, toCode: read.string(read.field(root, 'to_code')) };
}

/** @param {import('zerohop').Request} req */
exports.handle = (req) => {
  let r;
  try {
    r = parseRequest(req.body);
  } catch (e) {
    if (e instanceof WireError) throw badRequest(`currency: bad request: ${e.message}`);
    throw e;
  }
  return r.op === 'supported' ? SUPPORTED : convert(r.from, r.toCode);
};
