//! The pages as small HTML documents: what a browser gets when it does not ask for JSON.
//!
//! Not the original's templates (no styles, pictures or scripts): a header with the
//! currency form and the cart's size, then the page's facts as text (product names and
//! prices, cart lines and totals, the order's ids) and the original's forms with its field
//! names, so that a person can shop with a browser and a test can find the facts in the
//! text. Every value from a service or a request is escaped.

use std::fmt::Write;

use super::pages::{CartPage, HomePage, OrderPage, ProductPage};
use crate::money::Money;
use crate::services::ad::Ad;

/// `text` with the characters HTML gives a meaning escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An amount as the original shows it: code, units and cents (truncated).
pub fn money(m: &Money) -> String {
    let sign = if m.total_nanos() < 0 { "-" } else { "" };
    format!(
        "{} {sign}{}.{:02}",
        escape(&m.currency_code),
        m.units.unsigned_abs(),
        m.nanos.unsigned_abs() / 10_000_000
    )
}

/// A document: the shared header, then `main`.
fn document(
    title: &str,
    currency: &str,
    currencies: &[String],
    cart_size: u64,
    main: &str,
) -> Vec<u8> {
    let mut s = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{} | Online Boutique</title></head><body>\n<header><a href=\"/\">Online \
         Boutique</a> <form method=\"post\" action=\"/setCurrency\"><select name=\"currency_code\">",
        escape(title)
    );
    for c in currencies {
        let selected = if c == currency { " selected" } else { "" };
        let c = escape(c);
        let _ = write!(s, "<option value=\"{c}\"{selected}>{c}</option>");
    }
    let _ = write!(
        s,
        "</select><button type=\"submit\">Set currency</button></form> \
         <a href=\"/cart\">Cart ({cart_size})</a> <a href=\"/logout\">Log out</a></header>\n\
         <main>\n{main}</main></body></html>\n"
    );
    s.into_bytes()
}

fn ad(s: &mut String, ad: Option<&Ad>) {
    if let Some(ad) = ad {
        let _ = writeln!(
            s,
            "<aside class=\"ad\">Advertisement: <a href=\"{}\">{}</a></aside>",
            escape(&ad.redirect_url),
            escape(&ad.text)
        );
    }
}

fn recommendations(s: &mut String, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    s.push_str("<section class=\"recommendations\"><h2>You May Also Like</h2><ul>");
    for id in ids {
        let id = escape(id);
        let _ = write!(s, "<li><a href=\"/product/{id}\">{id}</a></li>");
    }
    s.push_str("</ul></section>\n");
}

/// `GET /`.
pub fn home(page: &HomePage) -> Vec<u8> {
    let mut s = String::from("<h1>Hot Products</h1>\n<ul class=\"products\">\n");
    for p in &page.products {
        let _ = writeln!(
            s,
            "<li class=\"product\" id=\"{id}\"><a href=\"/product/{id}\">{}</a> \
             <span class=\"price\">{}</span></li>",
            escape(&p.name),
            money(&p.price),
            id = escape(&p.id),
        );
    }
    s.push_str("</ul>\n");
    ad(&mut s, page.ad.as_ref());
    document("Home", &page.currency, &page.currencies, page.cart_size, &s)
}

/// `GET /product/{id}`: the product, its add-to-cart form (quantities 1 to 10, as the
/// original's), recommendations and an ad.
pub fn product(page: &ProductPage) -> Vec<u8> {
    let p = &page.product;
    let id = escape(&p.id);
    let mut s = format!(
        "<h1 class=\"product-name\">{}</h1>\n<p class=\"price\">{}</p>\n\
         <p class=\"description\">{}</p>\n<p class=\"categories\">{}</p>\n\
         <form method=\"post\" action=\"/cart\"><input type=\"hidden\" name=\"product_id\" \
         value=\"{id}\"><select name=\"quantity\">",
        escape(&p.name),
        money(&p.price),
        escape(&p.description),
        escape(&p.categories.join(", ")),
    );
    for q in 1..=10 {
        let _ = write!(s, "<option>{q}</option>");
    }
    s.push_str("</select><button type=\"submit\">Add to cart</button></form>\n");
    recommendations(&mut s, &page.recommendations);
    ad(&mut s, page.ad.as_ref());
    document(
        &p.name,
        &page.currency,
        &page.currencies,
        page.cart_size,
        &s,
    )
}

/// `GET /cart`: the lines, shipping and total, the empty-cart and checkout forms.
pub fn cart(page: &CartPage) -> Vec<u8> {
    let mut s = format!(
        "<h1>Cart ({} items)</h1>\n<form method=\"post\" action=\"/cart/empty\">\
         <button type=\"submit\">Empty cart</button></form>\n<table class=\"cart\">\n\
         <tr><th>product</th><th>quantity</th><th>price</th><th>cost</th></tr>\n",
        page.cart_size
    );
    for l in &page.items {
        let _ = writeln!(
            s,
            "<tr class=\"line\" id=\"{id}\"><td><a href=\"/product/{id}\">{}</a></td>\
             <td class=\"quantity\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&l.name),
            l.quantity,
            money(&l.price),
            money(&l.cost),
            id = escape(&l.product_id),
        );
    }
    let _ = write!(
        s,
        "<tr><td>Shipping</td><td></td><td></td><td class=\"shipping\">{}</td></tr>\n\
         <tr><td>Total</td><td></td><td></td><td class=\"total\">{}</td></tr>\n</table>\n",
        money(&page.shipping_cost),
        money(&page.total)
    );
    if !page.items.is_empty() {
        s.push_str("<form method=\"post\" action=\"/cart/checkout\">\n");
        for (name, value) in [
            ("email", "someone@example.com"),
            ("street_address", "1600 Amphitheatre Parkway"),
            ("zip_code", "94043"),
            ("city", "Mountain View"),
            ("state", "CA"),
            ("country", "United States"),
            ("credit_card_number", "4432-8015-6152-0454"),
            ("credit_card_expiration_month", "1"),
            ("credit_card_expiration_year", ""),
            ("credit_card_cvv", "672"),
        ] {
            let _ = writeln!(
                s,
                "<label>{name} <input name=\"{name}\" value=\"{value}\"></label>"
            );
        }
        s.push_str("<button type=\"submit\">Place order</button></form>\n");
    }
    recommendations(&mut s, &page.recommendations);
    document("Cart", &page.currency, &page.currencies, page.cart_size, &s)
}

/// `POST /cart/checkout`: the order's ids, items and total paid.
pub fn order(page: &OrderPage, currency: &str) -> Vec<u8> {
    let o = &page.order;
    let mut s = format!(
        "<h1>Your order is complete!</h1>\n<p>Order confirmation ID: \
         <span class=\"order-id\">{}</span></p>\n<p>Shipping tracking ID: \
         <span class=\"tracking-id\">{}</span></p>\n<p>Transaction ID: \
         <span class=\"transaction-id\">{}</span></p>\n<ul class=\"items\">\n",
        escape(&o.order_id),
        escape(&o.shipping_tracking_id),
        escape(&o.transaction_id)
    );
    for i in &o.items {
        let _ = writeln!(
            s,
            "<li id=\"{}\">{} x {}</li>",
            escape(&i.product_id),
            i.quantity,
            money(&i.unit_price)
        );
    }
    let _ = write!(
        s,
        "</ul>\n<p>Shipping: <span class=\"shipping\">{}</span></p>\n\
         <p>Total paid: <span class=\"total\">{}</span></p>\n\
         <p><a href=\"/\">Continue shopping</a></p>\n",
        money(&o.shipping_cost),
        money(&o.total)
    );
    recommendations(&mut s, &page.recommendations);
    document("Order", currency, &[currency.to_owned()], 0, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_money_shows_cents() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(money(&Money::new("EUR", 60, 141_530_296)), "EUR 60.14");
        assert_eq!(money(&Money::new("JPY", 7, 5_000_000)), "JPY 7.00");
        assert_eq!(money(&Money::new("USD", -1, -990_000_000)), "USD -1.99");
        assert_eq!(money(&Money::new("USD", 0, -500_000_000)), "USD -0.50");
    }
}
