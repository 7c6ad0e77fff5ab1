// A zerohop function in Node.js: upper-cases the request body in place, in the chain's
// shared memory (req.body is a Buffer over the request's slot: nothing is copied), and
// passes it on along the route.
//
// Run by `runtime: node` (chain.yaml beside this file) the module's export is the handler;
// run as a program (`command: ["node", "upper.js"]`) it serves with it itself.
'use strict';

const zerohop = require('zerohop');

/** @param {zerohop.Request} req */
function upper(req) {
  const body = req.body;
  for (let i = 0; i < body.length; i++) {
    if (body[i] >= 0x61 && body[i] <= 0x7a) body[i] -= 0x20;
  }
}

module.exports = upper;

if (require.main === module) {
  zerohop.run(upper);
}
