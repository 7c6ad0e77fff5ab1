// Step 4 of the polyglot chain, in Node.js: checks that the Rust step came before it and
// appends its tag (req.body is a Buffer over the slot). A body starting with `SLEEP-JS:`
// waits 2 s first, without blocking the event loop.
'use strict';

const zerohop = require('zerohop');

/** @param {import('zerohop').Request} req */
exports.handle = async (req) => {
  const body = req.body;
  if (body.subarray(body.length - 3).toString('latin1') !== '+rs') {
    throw new zerohop.HandlerError(500, 'node: the Rust step did not run first');
  }
  if (body.subarray(0, 9).toString('latin1') === 'SLEEP-JS:') {
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
  req.extend(Buffer.from('+js'));
};
