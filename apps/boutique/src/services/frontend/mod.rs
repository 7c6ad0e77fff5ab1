//! frontend: the boutique's HTTP face, with the original frontend's interface (its
//! `main.go` and `handlers.go`): the same routes, form posts, cookies and redirects, so
//! that the original's `locustfile.py` drives either deployment unchanged.
//!
//! | route | form | answer |
//! |---|---|---|
//! | `GET /` | | the home page |
//! | `GET /product/{id}` | | the product's page |
//! | `GET /cart` | | the cart page |
//! | `POST /cart` | `product_id`, `quantity` | 302 to `/cart` |
//! | `POST /cart/empty` | | 302 to `/` |
//! | `POST /setCurrency` | `currency_code` | sets the cookie `shop_currency`; 302 to the `Referer` or `/` |
//! | `GET /logout` | | expires the request's cookies; 302 to `/` |
//! | `POST /cart/checkout` | the order form ([`CheckoutForm`]) | the order page |
//! | `GET /_healthz` | | `ok` |
//!
//! As the original's `ensureSessionID` middleware does, a request without the cookie
//! [`SESSION_COOKIE`] gets a new session id, set on the answer (`Max-Age` 48 h); prices are
//! in the currency of [`CURRENCY_COOKIE`], USD without it. Pages are small HTML documents
//! ([`html`]), or JSON (the [`pages`] objects) when the request's `Accept` names
//! `application/json`; a redirect's JSON body is the object it changed. Errors are a status
//! (400 bad input, 404 unknown product or path, 405 wrong method, 5xx a failed service) and
//! one line naming the service that failed.
//!
//! One deviation: the cookies are set with `Path=/`. The original sets none, so a first
//! visit to `/product/X` would scope the session to `/product` and a later `/cart` would
//! start another session (an empty cart).
//!
//! Both deployments call [`handle`] with what they read from the request: the zerohop
//! function from the route it came in by (its spec lists [`HEADERS`]), the HTTP process
//! from [`Route::lookup`] of the path.

pub mod form;
pub mod html;
pub mod pages;

pub use pages::{
    AddToCart, CartChanged, CartLine, CartPage, CheckoutForm, CurrencyChoice, HomePage, LoggedOut,
    OrderPage, ProductPage, ProductView, MAX_QUANTITY,
};
use serde::Serialize;

use crate::rng;
use crate::rpc::{Peers, ServiceError};

/// The cookie naming the user's session (the cart's owner), as the original names it.
pub const SESSION_COOKIE: &str = "shop_session-id";
/// The cookie naming the currency to show prices in.
pub const CURRENCY_COOKIE: &str = "shop_currency";
/// Currency without [`CURRENCY_COOKIE`].
pub const DEFAULT_CURRENCY: &str = "USD";
/// Lifetime of the cookies the frontend sets: 48 hours, as the original's.
pub const COOKIE_MAX_AGE_S: u64 = 48 * 60 * 60;
/// The request headers the frontend reads (the zerohop function lists them in `headers`).
pub const HEADERS: [&str; 3] = ["cookie", "referer", "accept"];
/// The type of the JSON answers.
pub const JSON: &str = "application/json";
/// The type of the HTML pages.
pub const HTML: &str = "text/html; charset=utf-8";

/// The frontend's routes, the original's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// `GET /`: the home page, every product.
    Home,
    /// `GET /product/{id}`: one product's page.
    Product,
    /// `GET /cart`: the cart page.
    ViewCart,
    /// `POST /cart`: adds to the cart.
    AddToCart,
    /// `POST /cart/empty`: empties the cart.
    EmptyCart,
    /// `POST /setCurrency`: changes the currency cookie.
    SetCurrency,
    /// `GET /logout`: expires the cookies.
    Logout,
    /// `POST /cart/checkout`: places the order.
    Checkout,
    /// `GET /_healthz`: `ok`.
    Health,
}

impl Route {
    /// Every route.
    pub const ALL: [Route; 9] = [
        Route::Home,
        Route::Product,
        Route::ViewCart,
        Route::AddToCart,
        Route::EmptyCart,
        Route::SetCurrency,
        Route::Logout,
        Route::Checkout,
        Route::Health,
    ];

    /// HTTP method.
    pub fn method(self) -> &'static str {
        match self {
            Route::Home | Route::Product | Route::ViewCart | Route::Logout | Route::Health => "GET",
            Route::AddToCart | Route::EmptyCart | Route::SetCurrency | Route::Checkout => "POST",
        }
    }

    /// The path, as a zerohop spec writes it (`{id}`: the product's id).
    pub fn pattern(self) -> &'static str {
        match self {
            Route::Home => "/",
            Route::Product => "/product/{id}",
            Route::ViewCart | Route::AddToCart => "/cart",
            Route::EmptyCart => "/cart/empty",
            Route::SetCurrency => "/setCurrency",
            Route::Logout => "/logout",
            Route::Checkout => "/cart/checkout",
            Route::Health => "/_healthz",
        }
    }

    /// The route of `method` and a spec's `pattern` (what the zerohop gateway matched).
    pub fn from_pattern(method: &str, pattern: &str) -> Option<Route> {
        Self::ALL
            .into_iter()
            .find(|r| r.method() == method && r.pattern() == pattern)
    }

    /// The route for `method` and a request's `path`, with the product id of
    /// `/product/{id}` (percent-decoded): 404 for an unknown path, 405 for a known path with
    /// another method.
    pub fn lookup(method: &str, path: &str) -> Result<(Route, Option<String>), ServiceError> {
        let id = path
            .strip_prefix("/product/")
            .filter(|id| !id.is_empty() && !id.contains('/'));
        let on_path: Vec<Route> = match id {
            Some(_) => vec![Route::Product],
            None => Self::ALL
                .into_iter()
                .filter(|r| *r != Route::Product && r.pattern() == path)
                .collect(),
        };
        if on_path.is_empty() {
            return Err(ServiceError::not_found(format!("no route {path}")));
        }
        let route = on_path
            .into_iter()
            .find(|r| r.method() == method)
            .ok_or_else(|| ServiceError::new(405, format!("{path} does not take {method}")))?;
        let id = id.map(|id| percent_encoding::percent_decode_str(id).decode_utf8_lossy());
        Ok((route, id.map(|id| id.into_owned())))
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method(), self.pattern())
    }
}

/// A request as the frontend sees it, whatever the deployment.
#[derive(Clone, Debug)]
pub struct PageRequest<'a> {
    /// Which page.
    pub route: Route,
    /// The `{id}` of `/product/{id}`.
    pub product_id: Option<&'a str>,
    /// The `Cookie` header.
    pub cookie: Option<&'a str>,
    /// The `Referer` header.
    pub referer: Option<&'a str>,
    /// The `Accept` header.
    pub accept: Option<&'a str>,
    /// The body (a form for the `POST` routes).
    pub body: &'a [u8],
}

/// The frontend's answer: status, headers for the client, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// 200, or 302 for the redirects.
    pub status: u16,
    /// `Content-Type`, `Set-Cookie`, `Location`, in order.
    pub headers: Vec<(&'static str, String)>,
    /// The page.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The value of cookie `name` in a `Cookie` header (`a=1; b="2"`).
pub fn cookie<'a>(header: Option<&'a str>, name: &str) -> Option<&'a str> {
    cookies(header).find_map(|(k, v)| (k == name).then_some(v))
}

/// The `(name, value)` pairs of a `Cookie` header.
fn cookies(header: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    header
        .into_iter()
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
}

/// A `Set-Cookie` value for `name=value` that lives [`COOKIE_MAX_AGE_S`].
fn set_cookie(name: &str, value: &str) -> String {
    format!("{name}={value}; Path=/; Max-Age={COOKIE_MAX_AGE_S}")
}

/// Whether an `Accept` header names `application/json`.
pub fn wants_json(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|t| {
            let t = t.split(';').next().unwrap_or_default().trim();
            t.eq_ignore_ascii_case(JSON)
        })
    })
}

/// How a page is answered: JSON or HTML.
#[derive(Clone, Copy)]
struct Format {
    json: bool,
}

impl Format {
    /// A page: `page` as JSON, or `html(page)`.
    fn page<T: Serialize>(self, page: &T, html: impl FnOnce(&T) -> Vec<u8>) -> Page {
        if self.json {
            Page::new(200, JSON, crate::rpc::reply(page))
        } else {
            Page::new(200, HTML, Ok(html(page)))
        }
    }

    /// A 302 to `location`; with JSON, `changed` is the body.
    fn redirect<T: Serialize>(self, location: &str, changed: &T) -> Page {
        let mut page = if self.json {
            Page::new(302, JSON, crate::rpc::reply(changed))
        } else {
            Page::new(302, HTML, Ok(Vec::new()))
        };
        page.headers.push(("Location", location.to_owned()));
        page
    }
}

/// A page before the session's cookie joins its headers.
struct Page {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Result<Vec<u8>, ServiceError>,
}

impl Page {
    fn new(status: u16, content_type: &str, body: Result<Vec<u8>, ServiceError>) -> Self {
        Page {
            status,
            headers: vec![("Content-Type", content_type.to_owned())],
            body,
        }
    }
}

/// Answers one request.
pub async fn handle<P: Peers>(
    req: &PageRequest<'_>,
    peers: &mut P,
) -> Result<Response, ServiceError> {
    let mut headers = Vec::new();
    let session = match cookie(req.cookie, SESSION_COOKIE).filter(|s| !s.is_empty()) {
        Some(s) => s.to_owned(),
        None => {
            let id = rng::uuid();
            headers.push(("Set-Cookie", set_cookie(SESSION_COOKIE, &id)));
            id
        }
    };
    let currency = cookie(req.cookie, CURRENCY_COOKIE)
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CURRENCY);
    let f = Format {
        json: wants_json(req.accept),
    };
    let page = match req.route {
        Route::Home => f.page(&pages::home(&session, currency, peers).await?, html::home),
        Route::Product => {
            let id = req
                .product_id
                .filter(|id| !id.is_empty())
                .ok_or_else(|| ServiceError::bad_request("product id not specified"))?;
            let page = pages::product(&session, currency, id, peers).await?;
            f.page(&page, html::product)
        }
        Route::ViewCart => f.page(
            &pages::view_cart(&session, currency, peers).await?,
            html::cart,
        ),
        Route::AddToCart => {
            let add = form::add_to_cart(req.body)?;
            f.redirect("/cart", &pages::add_to_cart(&session, add, peers).await?)
        }
        Route::EmptyCart => f.redirect("/", &pages::empty_cart(&session, peers).await?),
        Route::SetCurrency => {
            let choice = pages::set_currency(form::currency_choice(req.body)?, peers).await?;
            let referer = req.referer.filter(|r| !r.is_empty()).unwrap_or("/");
            let mut page = f.redirect(referer, &choice);
            let cookie = set_cookie(CURRENCY_COOKIE, &choice.currency_code);
            page.headers.push(("Set-Cookie", cookie));
            page
        }
        Route::Logout => {
            let expired: Vec<String> = cookies(req.cookie).map(|(k, _)| k.to_owned()).collect();
            let mut page = f.redirect(
                "/",
                &LoggedOut {
                    expired: expired.clone(),
                },
            );
            for name in expired {
                let gone =
                    format!("{name}=; Path=/; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:00 GMT");
                page.headers.push(("Set-Cookie", gone));
            }
            page
        }
        Route::Checkout => {
            let order = form::checkout(req.body)?;
            let page = pages::place_order(&session, currency, order, peers).await?;
            f.page(&page, |p| html::order(p, currency))
        }
        Route::Health => Page::new(200, "text/plain; charset=utf-8", Ok(b"ok".to_vec())),
    };
    headers.extend(page.headers);
    Ok(Response {
        status: page.status,
        headers,
        body: page.body?,
    })
}

#[cfg(test)]
mod tests;
