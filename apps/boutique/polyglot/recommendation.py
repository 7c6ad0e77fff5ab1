"""recommendation, in Python as in Google's original: up to five products the user is not
looking at, in random order, asking productcatalog for the list every time. A port of
``src/services/recommendation.rs``: input ``{user_id, product_ids}`` (both optional), answer
``{product_ids}``.

Run by ``chain-polyglot.yaml`` as ``runtime: python`` with
``handler: polyglot.recommendation:handle``, with handler threads that wait for productcatalog
without the GIL (``concurrency``)."""

from __future__ import annotations

import json
import random

import zerohop

from . import wire

SERVICE = "recommendation"

MAX_RECOMMENDATIONS = 5

LIST = b'{"op":"list"}'


def catalog_ids(answer: zerohop.Answer) -> list[str]:
    """The product ids of productcatalog's list, in catalog order. A failed call passes on as
    it is (its message names who failed); an answer that is not the list is productcatalog's
    fault, 502, as in the Rust service."""
    if not answer.ok:
        raise zerohop.HandlerError(answer.status, answer.body.decode("utf-8", "replace"))
    try:
        ids = [p["id"] for p in json.loads(answer.body)["products"]]
        if not all(isinstance(i, str) for i in ids):
            raise TypeError("a product id is not a string")
    except (ValueError, TypeError, KeyError) as e:
        raise zerohop.HandlerError(502, f"productcatalog answered bad JSON: {e!r}") from None
    return ids


def handle(req: zerohop.Request) -> bytes:
    with req.body as body:
        data = wire.text(SERVICE, body)
    r = wire.Reader(SERVICE, data)
    obj = r.struct(r.root, "struct Request")
    r.string(r.field(obj, "user_id", default=""))  # unused, as in the original
    ids = r.sequence(r.field(obj, "product_ids", default=[]), "a sequence")
    excluded = {r.string(i) for i in ids}

    candidates = [i for i in catalog_ids(req.call("productcatalog", LIST)) if i not in excluded]
    random.shuffle(candidates)
    return wire.dump({"product_ids": candidates[:MAX_RECOMMENDATIONS]})
