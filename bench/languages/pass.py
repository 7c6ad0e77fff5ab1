"""The Python row of zerohop-bench-languages, the same pass-through as pass.rs beside it:
reads the body's first byte through the memoryview over the slot (no copy) and sends the
body on unchanged (returns None)."""

import zerohop


def handle(req: zerohop.Request) -> None:
    with req.body as body:
        if len(body):
            body[0]


zerohop.run(handle)
