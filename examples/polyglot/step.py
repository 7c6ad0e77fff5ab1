"""Step 1 of the polyglot chain, in Python: upper-cases the body in place (a memoryview over
the slot) and appends its tag. A body starting with `sleep-py:` first says "py: holding the
request" on standard error and holds it for a minute (the tests wait for that line, then kill
the instance while it holds the request)."""

import sys
import time

import zerohop


def handle(req: zerohop.Request) -> None:
    with req.body as body:
        if bytes(body[:9]).lower() == b"sleep-py:":
            print("py: holding the request", file=sys.stderr, flush=True)
            time.sleep(60)
        body[:] = bytes(body).upper()  # same length: written back into the slot
    req.extend(b"+py")
