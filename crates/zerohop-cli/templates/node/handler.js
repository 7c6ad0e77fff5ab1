// {{name}}: a zerohop function in Node.js. It upper-cases the request body in place, in the
// chain's shared memory, and passes it on.
'use strict';

/** @param {import('zerohop').Request} req */
exports.handle = (req) => {
  const body = req.body; // a Buffer over the request: no copy
  for (let i = 0; i < body.length; i++) {
    if (body[i] >= 0x61 && body[i] <= 0x7a) body[i] -= 0x20;
  }
};
