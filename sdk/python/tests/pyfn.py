"""A Python function for the SDK's tests, its behaviour chosen by PYFN_MODE:
upper (in place), exclaim (returns bytes), raise (ValueError), fail (HandlerError 422),
call (calls PYFN_CALLS, comma separated: "name=output;" or "name!status;"), callall (the
same with one fan-out call), join (the same over a static fan-out's branches), count (state
counter named by the body), header (the X-Test header), forward (to PYFN_TARGET),
item (for GET /item/{id} with ``headers: [":path", ":query", cookie]``: answers 303 with a
Location and a Set-Cookie naming the id, and a body of what it read: path, route, param,
query string, decoded query q, cookie session, what a refused header and status said),
keep (keeps a view of the body past its return), grow (answers its body repeated to
PYFN_GROW_TO bytes, far beyond a slot: the runtime moves the request into a large slot),
sizes (calls each of PYFN_CALLS, "name" or "name:N", with its body or the body's first N
bytes, and answers "name=length:first4..last2;" for each), sleep (says "pyfn: holding BODY" on stderr,
which zerohop up echoes, so the test knows the request reached the handler; then 2 s, or 60 s
for a body starting with "hold": a request the test kills, which only the kill ends in time;
then upper-cases)."""

import os
import sys
import time

import zerohop

MODE = os.environ.get("PYFN_MODE", "upper")
KEPT = []


def _listed(names: list[str], answers: list[zerohop.Answer]) -> bytes:
    out = b""
    for name, a in zip(names, answers, strict=True):
        out += (name.encode() + b"=" + a.body) if a.ok else f"{name}!{a.status}".encode()
        out += b";"
    return out


def _refused(action) -> str:
    """What the native layer's error of ``action`` says: "status:message"."""
    try:
        action()
    except RuntimeError as e:
        return f"{e.args[0]}:{e.args[1]}"
    return "accepted"


def _or_dash(v):
    return "-" if v is None else v


def item(req: zerohop.Request) -> None:
    ident = req.param("id")
    refused = _refused(lambda: req.add_response_header("Content-Length", "1"))
    status404 = _refused(lambda: req.set_status(404))
    req.set_body(
        (
            f"path={req.path} route={req.route_path} id={ident} "
            f"query={_or_dash(req.query_string)} q={_or_dash(req.query('q'))} "
            f"session={_or_dash(req.cookie('session'))} refused={refused} "
            f"status404={status404.split(':')[0]}"
        ).encode()
    )
    # A live view of the body is refused: the header would move the body under it.
    with req.body:
        try:
            req.add_response_header("Location", "/nowhere")
            held = "accepted"
        except BufferError:
            held = "BufferError"
    req.extend(f" with-view={held}".encode())
    # After the body: the headers move it up within the slot.
    req.add_response_header("Location", f"/item/{ident}/done")
    req.add_response_header("Set-Cookie", f"seen={ident}; Path=/")
    req.set_status(303)


def handle(req: zerohop.Request):
    if MODE == "upper":
        with req.body as body:
            body[:] = bytes(body).upper()
        return None
    if MODE == "exclaim":
        with req.body as body:
            return bytes(body) + b"!"
    if MODE == "raise":
        raise ValueError("bad input")
    if MODE == "fail":
        with req.body as body:
            raise zerohop.HandlerError(422, "refusing " + bytes(body).decode())
    if MODE == "call":
        with req.body as body:
            data = bytes(body)
        out = b""
        for name in os.environ["PYFN_CALLS"].split(","):
            a = req.call(name, data)
            out += (name.encode() + b"=" + a.body) if a.ok else f"{name}!{a.status}".encode()
            out += b";"
        return out
    if MODE == "callall":
        with req.body as body:
            data = bytes(body)
        names = os.environ["PYFN_CALLS"].split(",")
        return _listed(names, req.call_all([(n, data) for n in names]))
    if MODE == "join":
        return _listed(os.environ["PYFN_CALLS"].split(","), req.branches())
    if MODE == "count":
        with req.body as body:
            key = bytes(body)
        old = req.state_get(key)
        n = int.from_bytes(old, "little") + 1 if old and len(old) == 8 else 1
        req.state_put(key, n.to_bytes(8, "little"))
        return str(n).encode()
    if MODE == "header":
        return (req.header("X-Test") or "<none>").encode()
    if MODE == "forward":
        return zerohop.Forward(os.environ["PYFN_TARGET"])
    if MODE == "item":
        return item(req)
    if MODE == "grow":
        with req.body as body:
            data = bytes(body)
        size = int(os.environ["PYFN_GROW_TO"])
        return (data * (size // len(data) + 1))[:size]
    if MODE == "sizes":
        with req.body as body:
            data = bytes(body)
        out = ""
        for entry in os.environ["PYFN_CALLS"].split(","):
            name, _, n = entry.partition(":")
            a = req.call(name, data[: int(n)] if n else data)
            if not a.ok:
                out += f"{name}!{a.status};"
                continue
            b = a.body
            out += f"{name}={len(b)}:{b[:4].decode()}..{b[-2:].decode()};"
        return out.encode()
    if MODE == "keep":
        KEPT.append(req.body)
        return None
    if MODE == "sleep":
        with req.body as body:
            held = bytes(body)
        print(f"pyfn: holding {held.decode(errors='replace')}", file=sys.stderr, flush=True)
        time.sleep(60 if held.startswith(b"hold") else 2)
        with req.body as body:
            body[:] = bytes(body).upper()
        return None
    raise zerohop.HandlerError(500, f"unknown PYFN_MODE {MODE}")


zerohop.run(handle)
