//! One simulated user, as the original's locust user: its own cookies (the session the
//! frontend gives it, the currency it chose) and keep-alive connection, tasks picked by
//! weight ([`TASKS`]), no think time (closed loop). It speaks the original frontend's
//! interface: form posts, cookies, and the redirects followed as a browser and Locust do
//! (`POST /cart` then `GET /cart`, `POST /setCurrency` then `GET /`). It asks for JSON
//! (`Accept: application/json`) so that every answer is checked against what the user
//! knows: the page parses, prices are in the user's currency, the cart holds exactly what
//! the user put in, totals add up, an order has ids, no second session.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;

use super::report::Stats;
use crate::money::Money;
use crate::rng::Rng;
use crate::services::frontend::form::{
    encode_add_to_cart, encode_checkout, encode_currency_choice,
};
use crate::services::frontend::{
    AddToCart, CartChanged, CartPage, CheckoutForm, CurrencyChoice, HomePage, OrderPage,
    ProductPage, Route, CURRENCY_COOKIE, DEFAULT_CURRENCY, JSON, SESSION_COOKIE,
};
use crate::services::{payment, productcatalog, recommendation};

/// How long one request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a user does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// `GET /`.
    Index,
    /// `POST /setCurrency` (then `GET /`), then use it.
    SetCurrency,
    /// `GET /product/{id}`.
    BrowseProduct,
    /// `GET /product/{id}`, then `POST /cart` (then `GET /cart`).
    AddToCart,
    /// `GET /cart`.
    ViewCart,
    /// Add to cart, then `POST /cart/checkout`.
    Checkout,
}

impl Task {
    /// Name, as in the original's locustfile.
    pub fn name(self) -> &'static str {
        match self {
            Task::Index => "index",
            Task::SetCurrency => "setCurrency",
            Task::BrowseProduct => "browseProduct",
            Task::AddToCart => "addToCart",
            Task::ViewCart => "viewCart",
            Task::Checkout => "checkout",
        }
    }
}

/// Tasks and their weights, those of the original's `locustfile.py`.
pub const TASKS: [(Task, u64); 6] = [
    (Task::Index, 1),
    (Task::SetCurrency, 2),
    (Task::BrowseProduct, 10),
    (Task::AddToCart, 2),
    (Task::ViewCart, 3),
    (Task::Checkout, 1),
];

/// Currencies the users pick from (the original's locustfile's list).
pub const CURRENCIES: [&str; 6] = ["EUR", "USD", "JPY", "CAD", "GBP", "TRY"];

/// Quantities a user adds (the locustfile's `random.randint(1,10)`).
pub const QUANTITIES: [u32; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// Picks a task by weight.
pub fn pick_task(rng: &mut Rng) -> Task {
    let total: u64 = TASKS.iter().map(|(_, w)| w).sum();
    let mut x = rng.below(total);
    for (task, w) in TASKS {
        if x < w {
            return task;
        }
        x -= w;
    }
    unreachable!("x < total")
}

/// A failed request: already counted; the task stops.
struct Failed;

/// Where the users send requests.
#[derive(Clone, Debug)]
pub struct Target {
    /// `HOST:PORT` to connect to.
    pub addr: String,
    /// `Host` header.
    pub host: String,
}

/// What an answer must be: a page (200) or a redirect (302).
fn expected_status(route: Route) -> u16 {
    match route {
        Route::AddToCart | Route::EmptyCart | Route::SetCurrency | Route::Logout => 302,
        _ => 200,
    }
}

/// An answer as the user reads it.
struct Reply {
    /// `Location`, for a redirect.
    location: Option<String>,
    /// The body (JSON: the user sends `Accept: application/json`).
    body: Bytes,
}

/// One user.
pub struct User {
    rng: Rng,
    /// The cookies the frontend set (name -> value), sent back with every request.
    cookies: BTreeMap<String, String>,
    currency: String,
    /// What the cart should hold: product id -> quantity.
    cart: BTreeMap<String, u32>,
    /// A request failed: the server's cart may differ from `cart` until emptied.
    unsure: bool,
    conn: Option<SendRequest<Full<Bytes>>>,
    target: Rc<Target>,
    stats: Rc<RefCell<Stats>>,
}

impl User {
    /// A user without cookies (the frontend gives it a session), choosing with `rng`.
    pub fn new(rng: Rng, target: Rc<Target>, stats: Rc<RefCell<Stats>>) -> Self {
        Self {
            rng,
            cookies: BTreeMap::new(),
            currency: DEFAULT_CURRENCY.to_owned(),
            cart: BTreeMap::new(),
            unsure: false,
            conn: None,
            target,
            stats,
        }
    }

    /// Runs tasks until `deadline` (the one under way finishes): the home page first, as
    /// the original's `on_start`, then tasks by weight.
    pub async fn run(mut self, deadline: Instant) {
        self.task(Task::Index).await;
        while Instant::now() < deadline {
            let task = pick_task(&mut self.rng);
            self.task(task).await;
        }
    }

    async fn task(&mut self, task: Task) {
        if self.unsure {
            self.resync().await;
        }
        *self
            .stats
            .borrow_mut()
            .tasks
            .entry(task.name())
            .or_default() += 1;
        let done = match task {
            Task::Index => self.index().await,
            Task::SetCurrency => self.set_currency().await,
            Task::BrowseProduct => {
                let id = self.random_product();
                self.browse(&id).await
            }
            Task::AddToCart => self.add_to_cart().await,
            Task::ViewCart => self.view_cart().await,
            Task::Checkout => self.checkout().await,
        };
        if done.is_err() {
            self.unsure = true;
        }
    }

    /// After a failure: empty the cart so that what the user expects holds again.
    async fn resync(&mut self) {
        let route = Route::EmptyCart;
        if let Ok(reply) = self.send(route, route.pattern(), None).await {
            if self
                .parse::<CartChanged>(route, &reply.body)
                .is_ok_and(|c| c.cart_size == 0)
            {
                self.cart.clear();
                self.unsure = false;
            }
        }
    }

    fn random_product(&mut self) -> String {
        self.rng.pick(productcatalog::products()).id.clone()
    }

    fn cart_size(&self) -> u64 {
        self.cart.values().map(|&q| u64::from(q)).sum()
    }

    fn session(&self) -> Option<&str> {
        self.cookies.get(SESSION_COOKIE).map(String::as_str)
    }

    async fn index(&mut self) -> Result<(), Failed> {
        let route = Route::Home;
        let body = self.send(route, route.pattern(), None).await?.body;
        self.check_home(&body)
    }

    fn check_home(&mut self, body: &[u8]) -> Result<(), Failed> {
        let route = Route::Home;
        let page: HomePage = self.parse(route, body)?;
        let mut problems = Vec::new();
        if page.products.len() != productcatalog::products().len() {
            problems.push(format!("{} products", page.products.len()));
        }
        if let Some(p) = page
            .products
            .iter()
            .find(|p| p.price.currency_code != self.currency)
        {
            problems.push(format!("{} priced in {}", p.id, p.price.currency_code));
        }
        if !page.currencies.contains(&self.currency) || page.currency != self.currency {
            problems.push(format!("currency {} not offered", self.currency));
        }
        if page.cart_size != self.cart_size() {
            problems.push(format!(
                "cart size {}, expected {}",
                page.cart_size,
                self.cart_size()
            ));
        }
        if Some(page.session_id.as_str()) != self.session() || page.ad.is_none() {
            problems.push("not the session's page, or no ad".into());
        }
        self.verdict(route, problems)
    }

    /// `POST /setCurrency`, its cookie, and the home page it leads to.
    async fn set_currency(&mut self) -> Result<(), Failed> {
        let route = Route::SetCurrency;
        let code = (*self.rng.pick(&CURRENCIES)).to_owned();
        let form = encode_currency_choice(&CurrencyChoice {
            currency_code: code.clone(),
        });
        let reply = self.send(route, route.pattern(), Some(form)).await?;
        let choice: CurrencyChoice = self.parse(route, &reply.body)?;
        let mut problems = Vec::new();
        if choice.currency_code != code || self.cookies.get(CURRENCY_COOKIE) != Some(&code) {
            problems.push(format!(
                "asked {code}, got {} and cookie {:?}",
                choice.currency_code,
                self.cookies.get(CURRENCY_COOKIE)
            ));
        }
        self.verdict(route, problems)?;
        self.currency = code;
        let body = self.follow(route, reply).await?;
        self.check_home(&body)
    }

    async fn browse(&mut self, id: &str) -> Result<(), Failed> {
        let route = Route::Product;
        let reply = self.send(route, &format!("/product/{id}"), None).await?;
        let page: ProductPage = self.parse(route, &reply.body)?;
        let mut problems = Vec::new();
        if page.product.id != id {
            problems.push(format!("asked {id}, got {}", page.product.id));
        }
        if page.product.price.currency_code != self.currency || page.currency != self.currency {
            problems.push(format!("price in {}", page.product.price.currency_code));
        }
        let recs = &page.recommendations;
        if recs.iter().any(|r| r == id) || recs.len() > recommendation::MAX_RECOMMENDATIONS {
            problems.push(format!("recommendations {recs:?}"));
        }
        if page.cart_size != self.cart_size() {
            problems.push(format!(
                "cart size {}, expected {}",
                page.cart_size,
                self.cart_size()
            ));
        }
        if page.ad.is_none() {
            problems.push("no ad".into());
        }
        self.verdict(route, problems)
    }

    /// The product's page, `POST /cart`, and the cart page it leads to.
    async fn add_to_cart(&mut self) -> Result<(), Failed> {
        let id = self.random_product();
        self.browse(&id).await?;
        let route = Route::AddToCart;
        let quantity = *self.rng.pick(&QUANTITIES);
        let form = encode_add_to_cart(&AddToCart {
            product_id: id.clone(),
            quantity,
        });
        let reply = self.send(route, route.pattern(), Some(form)).await?;
        // The add happened (302): expect it whether or not the answer checks out.
        *self.cart.entry(id).or_default() += quantity;
        let changed: CartChanged = self.parse(route, &reply.body)?;
        let got: BTreeMap<String, u32> = changed
            .items
            .iter()
            .map(|i| (i.product_id.clone(), i.quantity))
            .collect();
        let mut problems = Vec::new();
        if got != self.cart || changed.cart_size != self.cart_size() {
            problems.push(format!("cart {got:?}, expected {:?}", self.cart));
        }
        self.verdict(route, problems)?;
        let body = self.follow(route, reply).await?;
        self.check_cart(&body)
    }

    async fn view_cart(&mut self) -> Result<(), Failed> {
        let route = Route::ViewCart;
        let body = self.send(route, route.pattern(), None).await?.body;
        self.check_cart(&body)
    }

    fn check_cart(&mut self, body: &[u8]) -> Result<(), Failed> {
        let route = Route::ViewCart;
        let page: CartPage = self.parse(route, body)?;
        let got: BTreeMap<String, u32> = page
            .items
            .iter()
            .map(|l| (l.product_id.clone(), l.quantity))
            .collect();
        let mut problems = Vec::new();
        if got != self.cart || page.cart_size != self.cart_size() {
            problems.push(format!("cart {got:?}, expected {:?}", self.cart));
        }
        for line in &page.items {
            if line.price.currency_code != self.currency
                || line.price.times(line.quantity).ok().as_ref() != Some(&line.cost)
            {
                problems.push(format!("line {} costs {:?}", line.product_id, line.cost));
            }
        }
        let sum = Money::sum(&self.currency, page.items.iter().map(|l| &l.cost))
            .and_then(|s| s.checked_add(&page.shipping_cost));
        if sum.as_ref() != Ok(&page.total) {
            problems.push(format!(
                "total {:?}, lines and shipping make {sum:?}",
                page.total
            ));
        }
        if page.cart_size == 0 && page.shipping_cost.total_nanos() != 0 {
            problems.push("shipping an empty cart costs".into());
        }
        self.verdict(route, problems)
    }

    async fn checkout(&mut self) -> Result<(), Failed> {
        self.add_to_cart().await?;
        let route = Route::Checkout;
        let next_year = payment::current_year_month().0 + 1;
        let form = encode_checkout(&CheckoutForm {
            email: "someone@example.com".into(),
            street_address: "1600 Amphitheatre Parkway".into(),
            zip_code: "94043".into(),
            city: "Mountain View".into(),
            state: "CA".into(),
            country: "United States".into(),
            credit_card_number: "4432-8015-6152-0454".into(),
            credit_card_expiration_month: 1 + self.rng.below(12) as u32,
            credit_card_expiration_year: next_year + self.rng.below(70) as i32,
            credit_card_cvv: format!("{}", 100 + self.rng.below(900)),
        });
        let reply = self.send(route, route.pattern(), Some(form)).await?;
        let expected = std::mem::take(&mut self.cart);
        let page: OrderPage = self.parse(route, &reply.body)?;
        let o = &page.order;
        let got: BTreeMap<String, u32> = o
            .items
            .iter()
            .map(|i| (i.product_id.clone(), i.quantity))
            .collect();
        let mut problems = Vec::new();
        if got != expected {
            problems.push(format!("ordered {got:?}, cart held {expected:?}"));
        }
        if o.order_id.is_empty() || o.shipping_tracking_id.is_empty() || o.transaction_id.is_empty()
        {
            problems.push("an id is missing".into());
        }
        let total = crate::services::checkout::order_total(&o.items, &o.shipping_cost);
        if o.total.currency_code != self.currency || total.as_ref() != Ok(&o.total) {
            problems.push(format!(
                "total {:?}, items and shipping make {total:?}",
                o.total
            ));
        }
        self.verdict(route, problems)
    }

    /// Counts the check's problems as one error.
    fn verdict(&mut self, route: Route, problems: Vec<String>) -> Result<(), Failed> {
        if problems.is_empty() {
            return Ok(());
        }
        self.stats.borrow_mut().error(route, problems.join("; "));
        Err(Failed)
    }

    fn parse<T: DeserializeOwned>(&self, route: Route, body: &[u8]) -> Result<T, Failed> {
        serde_json::from_slice(body).map_err(|e| {
            let head = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
            self.stats
                .borrow_mut()
                .error(route, format!("answer is not the page: {e}: {head:?}"));
            Failed
        })
    }

    /// Follows the redirect `reply` of `from` as a browser (and Locust) does: `GET` of its
    /// `Location`, a page of this site; its body.
    async fn follow(&mut self, from: Route, reply: Reply) -> Result<Bytes, Failed> {
        let location = reply.location.unwrap_or_default();
        let Ok((route, None)) = Route::lookup("GET", &location) else {
            let problem = format!("redirects to {location:?}, not a page");
            return self.verdict(from, vec![problem]).map(|()| Bytes::new());
        };
        Ok(self.send(route, &location, None).await?.body)
    }

    /// Sends one request for `route` to `path` (with a form body, if any) and counts it;
    /// `Ok` only for the route's status ([`expected_status`]). Cookies the answer sets join
    /// the user's; a new session while the user has one is a failure (its cart is lost).
    async fn send(
        &mut self,
        route: Route,
        path: &str,
        form: Option<String>,
    ) -> Result<Reply, Failed> {
        let start = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(route, path, form)).await;
        let result = result.unwrap_or_else(|_| Err(format!("no answer in {REQUEST_TIMEOUT:?}")));
        let (status, set_cookies, reply) = match result {
            Ok(answer) => {
                self.stats
                    .borrow_mut()
                    .request(route, Some(start.elapsed()));
                answer
            }
            Err(e) => {
                self.conn = None;
                let mut stats = self.stats.borrow_mut();
                stats.request(route, None);
                stats.error(route, e);
                return Err(Failed);
            }
        };
        if status != expected_status(route) {
            let text = String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)]);
            let message = format!("status {status}: {}", text.trim());
            self.stats.borrow_mut().error(route, message);
            return Err(Failed);
        }
        let had_session = self.session().is_some();
        for (name, value) in set_cookies {
            if name == SESSION_COOKIE && had_session && value.is_some() {
                let problem = format!("a new session {value:?} for a user with one");
                return self.verdict(route, vec![problem]).map(|()| reply);
            }
            match value {
                Some(v) => self.cookies.insert(name, v),
                None => self.cookies.remove(&name),
            };
        }
        Ok(reply)
    }

    async fn exchange(
        &mut self,
        route: Route,
        path: &str,
        form: Option<String>,
    ) -> Result<(u16, Vec<SetCookie>, Reply), String> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(connect(&self.target).await?),
        };
        conn.ready().await.map_err(|e| format!("connection: {e}"))?;
        let mut req = http::Request::builder()
            .method(route.method())
            .uri(path)
            .header(http::header::HOST, &self.target.host)
            .header(http::header::ACCEPT, JSON);
        if !self.cookies.is_empty() {
            let jar: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            req = req.header(http::header::COOKIE, jar.join("; "));
        }
        if form.is_some() {
            req = req.header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            );
        }
        let req = req
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = conn
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers();
        let location = headers
            .get(http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let set_cookies = headers
            .get_all(http::header::SET_COOKIE)
            .iter()
            .filter_map(|v| parse_set_cookie(v.to_str().ok()?))
            .collect();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("read: {e}"))?
            .to_bytes();
        Ok((status, set_cookies, Reply { location, body }))
    }
}

/// A cookie an answer sets: its name, and its value (`None`: expired, `Max-Age=0`).
type SetCookie = (String, Option<String>);

/// The cookie of a `Set-Cookie` value (`name=value; Path=/; Max-Age=N`).
fn parse_set_cookie(header: &str) -> Option<SetCookie> {
    let mut parts = header.split(';');
    let (name, value) = parts.next()?.trim().split_once('=')?;
    let expired = parts.any(|a| {
        a.trim().split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("max-age") && v.trim().starts_with(['0', '-'])
        })
    });
    Some((
        name.trim().to_owned(),
        (!expired).then(|| value.trim().to_owned()),
    ))
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(&target.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", target.addr))?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    Ok(send)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_follow_the_locust_weights() {
        let mut rng = Rng::new(42);
        let mut counts = BTreeMap::new();
        let n = 190_000;
        for _ in 0..n {
            *counts.entry(pick_task(&mut rng).name()).or_insert(0u64) += 1;
        }
        for (task, w) in TASKS {
            let share = counts[task.name()] as f64 / n as f64;
            let expected = w as f64 / 19.0;
            assert!((share - expected).abs() < 0.01, "{}: {share}", task.name());
        }
    }

    #[test]
    fn set_cookie_values_name_a_cookie_or_expire_it() {
        assert_eq!(
            parse_set_cookie("shop_session-id=abc; Path=/; Max-Age=172800"),
            Some(("shop_session-id".into(), Some("abc".into())))
        );
        assert_eq!(
            parse_set_cookie("shop_currency=; Path=/; Max-Age=0; Expires=Thu, 01 Jan 1970"),
            Some(("shop_currency".into(), None))
        );
        assert_eq!(
            parse_set_cookie("a=1; max-age=-1"),
            Some(("a".into(), None))
        );
        assert_eq!(parse_set_cookie("garbage"), None);
    }
}
