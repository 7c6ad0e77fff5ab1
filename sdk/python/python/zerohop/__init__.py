"""Write zerohop functions in Python.

A function is a program that calls :func:`run` with its handler::

    import zerohop

    def upper(req: zerohop.Request):
        with req.body as body:          # a memoryview over the request, in place
            body[:] = bytes(body).upper()

    zerohop.run(upper)

The handler gets a :class:`Request` and returns where the request goes:

- ``None``: on along the route, with the body as the handler left it;
- ``bytes``, ``bytearray`` or ``memoryview``: that becomes the body, then on along the route;
- :data:`REPLY` or ``Reply(data)``: straight back to the client;
- ``Forward("name")``: on to the function ``name`` (in the function's ``next``).

An exception becomes an error answer and the instance serves on:
:class:`HandlerError` carries its own status, anything else is a 500 that names the
exception's type (``function 'f': ValueError: bad input``).

The body is a ``memoryview`` on the request's bytes in the chain's shared memory: reading and
writing it copies nothing. It must not outlive the handler: the slot goes on to the next
function once the handler returns. Use ``with req.body as body:`` (or ``body.release()``);
an instance whose handler returns with a view still alive stops (its requests are answered
502 and the agent starts a new instance), rather than letting the view write into a later
request.

Concurrency: with ``concurrency: N`` in the chain spec, N handler threads take requests.
Python code holds the GIL, so CPU-bound handlers take turns; everything that waits (for the
next request, a call to another function, the state store's lock) releases it. For CPU
parallelism run more instances (``instances``, ``scale``): each is a process with its own GIL.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

from . import _native

__all__ = [
    "Answer",
    "Forward",
    "HandlerError",
    "REPLY",
    "Reply",
    "Request",
    "run",
]


class HandlerError(Exception):
    """An error answer with a status of its own (400 to 599; anything else is 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Forward:
    """Send the request on to the function ``function`` (one of this function's ``next``)."""

    function: str


@dataclass(frozen=True)
class Reply:
    """Send the request straight back to the client, with ``data`` as the body if given."""

    data: Optional[bytes] = None


REPLY = Reply()
"""Straight back to the client with the body as it is."""


@dataclass(frozen=True)
class Answer:
    """The answer of a call: ``status`` 200 and the callee's output, or the call's error
    status (the callee's own, 502 if it died, 504 if it did not answer in time, 503 if it
    could not be reached, 500 if this function may not call it) and its message."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        """Whether the callee gave an output."""
        return self.status == 200


class Request:
    """One request, valid while the handler runs."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.NativeRequest) -> None:
        self._native = native

    @property
    def body(self) -> memoryview:
        """The body: a writable memoryview on the request in shared memory (no copy).
        Release it before the handler returns (``with req.body as body:``)."""
        return memoryview(self._native)

    def set_body(self, data: bytes | bytearray | memoryview) -> None:
        """Replaces the body with ``data`` (copied into the slot, or into a large slot when it
        does not fit this one; up to the chain's ``max_body``)."""
        self._native.set_body(data)

    def extend(self, data: bytes | bytearray | memoryview) -> None:
        """Appends ``data`` to the body."""
        self._native.extend(data)

    def set_len(self, length: int) -> None:
        """Resizes the body (new bytes are zero); beyond :attr:`capacity`, the request moves
        into a large slot (up to the chain's ``max_body``)."""
        self._native.set_len(length)

    @property
    def capacity(self) -> int:
        """The most bytes the body may grow to in place; it may grow beyond, into a large
        slot (see :meth:`set_len`)."""
        return self._native.capacity()

    @property
    def id(self) -> int:
        """The gateway's id of the request."""
        return self._native.id()

    @property
    def function(self) -> str:
        """This function's name."""
        return self._native.function()

    @property
    def method(self) -> str:
        """The HTTP method of the route the request came in by."""
        return self._native.method()

    @property
    def path(self) -> str:
        """The request's path: as the client sent it (percent-encoded) when a function of
        the chain lists ``":path"`` in its ``headers``, else the route's path as the spec
        writes it (:attr:`route_path`)."""
        return self._native.path()

    @property
    def route_path(self) -> str:
        """The path of the route the request came in by, as the spec writes it
        (``/item/{id}``, ``/static/{*rest}``)."""
        return self._native.route_path()

    @property
    def query_string(self) -> Optional[str]:
        """The query string as the client sent it (after ``?``, not decoded), when a
        function of the chain lists ``":query"`` in its ``headers`` and the request had
        one."""
        return self._native.query_string()

    def header(self, name: str) -> Optional[str]:
        """The request header ``name`` (case-insensitive), if the spec lists it under the
        function's ``headers`` and the client sent it."""
        return self._native.header(name)

    def param(self, name: str) -> Optional[str]:
        """The route's path parameter ``name`` (``id`` for ``GET /item/{id}``, ``rest`` for
        a trailing ``*``), percent-decoded. Parameters always arrive, listed in ``headers``
        or not."""
        return self._native.param(name)

    def query(self, name: str) -> Optional[str]:
        """The first value of query parameter ``name`` (``application/x-www-form-urlencoded``
        decoding), when a function of the chain lists ``":query"`` in its ``headers``."""
        return self._native.query(name)

    def cookie(self, name: str) -> Optional[str]:
        """The value of cookie ``name`` from the request's ``Cookie`` headers, when a
        function of the chain lists ``cookie`` in its ``headers``."""
        return self._native.cookie(name)

    def add_response_header(self, name: str, value: str) -> None:
        """Adds the header ``name: value`` to the client's answer (HTTP only), e.g.
        ``Location`` with a 303 or ``Set-Cookie``; a ``Content-Type`` replaces the route's.
        Headers the gateway sets (``Content-Length``, ``Connection``, ...), names that are
        not header names, values with a line break, a 65th header and one that does not fit
        the slot beside the body are refused (nothing changes). The header rides in the slot
        before the body, which moves up: no ``memoryview`` of the body may be alive."""
        self._native.add_response_header(name, value)

    def set_status(self, status: int) -> None:
        """Sets the answer's status for the client: 200 (the default) to 399, except 204,
        205 and 304 (an error is a :class:`HandlerError`). With a 3xx, add a ``Location``
        (:meth:`add_response_header`)."""
        self._native.set_status(status)

    def call(self, function: str, data: bytes | bytearray | memoryview) -> Answer:
        """Calls ``function`` (one of this function's ``calls``) with ``data`` and waits for
        its answer; the GIL is released while waiting."""
        status, body = self._native.call(function, data)
        return Answer(status, body)

    def call_all(
        self, calls: Sequence[tuple[str, bytes | bytearray | memoryview]]
    ) -> list[Answer]:
        """Calls every ``(function, data)`` of ``calls`` at once (a fan-out) and waits for
        all of them; their answers in the same order. The GIL is released while waiting."""
        return [
            Answer(status, body)
            for status, body in self._native.call_all([(f, bytes(d)) for f, d in calls])
        ]

    def branches(self) -> list[Answer]:
        """The answers of a static fan-out's branches in the route's order, when this
        function is the route's ``join`` (the runtime called them before the handler);
        empty otherwise."""
        return [Answer(status, body) for status, body in self._native.branches()]

    def state_get(self, key: bytes) -> Optional[bytes]:
        """The chain state's value of ``key`` (the function needs ``state: true``)."""
        return self._native.state_get(key)

    def state_put(self, key: bytes, value: bytes) -> None:
        """Sets the chain state's ``key`` to ``value``."""
        self._native.state_put(key, value)

    def state_delete(self, key: bytes) -> bool:
        """Removes the chain state's ``key``; whether it was there."""
        return self._native.state_delete(key)


Result = Union[None, bytes, bytearray, memoryview, Reply, Forward]
Handler = Callable[[Request], Result]


def _decide(native: _native.NativeRequest, handler: Handler) -> tuple[int, int, str]:
    """Runs the handler; (kind, status, text) for the native layer."""
    req = Request(native)
    try:
        result = handler(req)
        if result is None:
            return (0, 0, "")
        if isinstance(result, (bytes, bytearray, memoryview)):
            req.set_body(result)
            return (0, 0, "")
        if isinstance(result, Reply):
            if result.data is not None:
                req.set_body(result.data)
            return (1, 0, "")
        if isinstance(result, Forward):
            return (2, 0, result.function)
        raise TypeError(
            f"the handler returned {type(result).__name__}; return None, bytes, "
            "zerohop.Reply or zerohop.Forward"
        )
    except HandlerError as e:
        return (3, e.status, e.message)
    except RuntimeError as e:
        # The native layer's errors carry (status, message).
        if len(e.args) == 2 and isinstance(e.args[0], int):
            return (3, e.args[0], str(e.args[1]))
        return (3, 500, f"RuntimeError: {e}")
    except Exception as e:  # noqa: BLE001 - every exception becomes the request's answer
        traceback.print_exc()
        return (3, 500, f"{type(e).__name__}: {e}")


def _by_name(handlers: Mapping[str, Handler]) -> Handler:
    """One handler that runs the one registered for the request's function."""
    for name, h in handlers.items():
        if not isinstance(name, str) or not callable(h):
            raise TypeError(
                "zerohop.run takes a handler or a mapping of function names to handlers; "
                f"{name!r} maps to {type(h).__name__}"
            )
    table = dict(handlers)

    def dispatch(req: Request) -> Result:
        h = table.get(req.function)
        if h is None:
            raise HandlerError(
                500,
                f"this program registers no handler for function `{req.function}` "
                f"(it has: {', '.join(table)})",
            )
        return h(req)

    return dispatch


def run(handler: Union[Handler, Mapping[str, Handler]]) -> None:
    """Serves requests with ``handler`` until the agent stops the instance; never returns.
    A program not started by the agent exits with status 2 and says why.

    ``handler`` may be a mapping of function names to handlers instead
    (``zerohop.run({"upper": upper, "exclaim": exclaim})``): each request runs the handler
    of its function (:attr:`Request.function`). That is how one interpreter serves a fused
    group (``fuse:`` in the chain spec), its steps called one after the other on the same
    request, in place; ``runtime: python`` functions of a group get it without any code
    (each function's ``MODULE:FUNCTION`` is loaded into the one interpreter)."""
    if isinstance(handler, Mapping):
        handler = _by_name(handler)
    elif not callable(handler):
        raise TypeError(
            "zerohop.run takes a handler or a mapping of function names to handlers, not "
            f"{type(handler).__name__}"
        )
    _native.run(lambda native: _decide(native, handler))
