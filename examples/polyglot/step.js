// Step 4 of the polyglot chain, in Node.js: checks that the Rust step came before it and
// appends its tag (req.body is a Buffer over the slot). A body starting with `SLEEP-JS:`
// first says "js: holding the request" on standard error and holds it for a minute, without
// blocking the event loop (the tests wait for that line, then kill the instance while it
// holds the request).
'use strict';

const zerohop = require('zerohop');

/** @param {import('zerohop').Request} req */
exports.handle = async (req) => {
  const body = req.body;
  if (body.subarray(body.length - 3).toString('latin1') !== '+rs') {
    throw new zerohop.HandlerError(500, 'node: the Rust step did not run first');
  }
  if (body.subarray(0, 9).toString('latin1') === 'SLEEP-JS:') {
    process.stderr.write('js: holding the request\n');
    await new Promise((resolve) => setTimeout(resolve, 60_000));
  }
  req.extend(Buffer.from('+js'));
};
