// The Node.js row of zerohop-bench-languages, the same pass-through as pass.rs beside it:
// reads the body's first byte through the Buffer over the slot (no copy) and sends the body
// on unchanged (returns undefined).
'use strict';

const zerohop = require('zerohop');

let first = 0;

zerohop.run((req) => {
  const body = req.body;
  if (body.length > 0) {
    first = body[0];
  }
  return undefined;
});
