"""Step 1 of the polyglot chain, in Python: upper-cases the body in place (a memoryview over
the slot) and appends its tag. A body starting with `sleep-py:` waits 2 s first (the tests
use it to kill an instance while it holds a request)."""

import time

import zerohop


def handle(req: zerohop.Request) -> None:
    with req.body as body:
        if bytes(body[:9]).lower() == b"sleep-py:":
            time.sleep(2)
        body[:] = bytes(body).upper()  # same length: written back into the slot
    req.extend(b"+py")
