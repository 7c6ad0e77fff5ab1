"""{{name}}: a zerohop function in Python. It upper-cases the request body in place, in the
chain's shared memory, and passes it on."""

import zerohop


def handle(req: zerohop.Request) -> None:
    with req.body as body:  # a memoryview over the request: no copy
        body[:] = bytes(body).upper()
