"""email, in Python as in Google's original: formats an order confirmation and sends nothing
(the original's dummy mode). A port of ``src/services/email.rs``: the same input (checkout's
``{email, order}``), the same answer ``{to, subject, text}`` byte for byte, the same errors.

Run by ``chain-polyglot.yaml`` as ``runtime: python`` with ``handler: polyglot.email:handle``
(a module of the package ``polyglot``, so that it never shadows the standard ``email``).
"""

from __future__ import annotations

import zerohop

from . import wire

SERVICE = "email"


def amount(m: wire.Money) -> str:
    """``12.34 EUR``: cents truncated toward zero, as ``Money``'s ``Display`` in money.rs."""
    nanos = m.total_nanos
    cents = abs(nanos) // 10_000_000
    sign = "-" if cents and nanos < 0 else ""
    return f"{sign}{cents // 100}.{cents % 100:02} {m.currency_code}"


def confirmation(data: str) -> bytes:
    """The answer to the request ``data`` (JSON text): the confirmation, as compact JSON."""
    r = wire.Reader(SERVICE, data)
    req = r.struct(r.root, "struct Request")
    email = r.string(r.field(req, "email"))
    order = r.struct(r.field(req, "order"), "struct OrderResult")
    order_id = r.string(r.field(order, "order_id"))
    tracking = r.string(r.field(order, "shipping_tracking_id"))
    shipping = r.money(r.field(order, "shipping_cost"))
    a = r.struct(r.field(order, "shipping_address"), "struct Address")
    street, city, state, country, zip_code = (
        r.string(r.field(a, name))
        for name in ("street_address", "city", "state", "country", "zip_code")
    )
    items = []
    for item in r.sequence(r.field(order, "items"), "a sequence"):
        item = r.struct(item, "struct OrderItem")
        items.append(
            (
                r.string(r.field(item, "product_id")),
                r.integer(r.field(item, "quantity"), 0, wire.U32_MAX, "u32"),
                r.money(r.field(item, "unit_price")),
            )
        )
    total = r.money(r.field(order, "total"))
    r.string(r.field(order, "transaction_id"))

    if "@" not in email:
        raise zerohop.HandlerError(400, f"{wire.rust_debug(email)} is not an e-mail address")
    text = f"Thank you for your order!\n\nOrder {order_id}\nTracking {tracking}\n\n"
    for product_id, quantity, unit_price in items:
        text += f"{quantity} x {product_id} at {amount(unit_price)}\n"
    text += (
        f"\nShipping {amount(shipping)}\nTotal {amount(total)}\n\n"
        f"Ships to {street}, {zip_code} {city}, {state}, {country}\n"
    )
    return wire.dump({"to": email, "subject": f"Your order {order_id}", "text": text})


def handle(req: zerohop.Request) -> bytes:
    with req.body as body:
        data = wire.text(SERVICE, body)
    return confirmation(data)
