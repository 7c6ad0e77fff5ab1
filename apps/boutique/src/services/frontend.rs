//! frontend: the boutique's HTTP face, one route per page of the original's site, answering
//! JSON instead of HTML. The session and the currency come in request headers
//! ([`SESSION_HEADER`], [`CURRENCY_HEADER`]), where the original keeps them in cookies.
//!
//! Each page fans out to the services it needs with one `call_all` per step (the original
//! calls them one after another):
//!
//! | route | steps |
//! |---|---|
//! | `GET /` | currencies + products + cart + ad; then every price converted |
//! | `POST /setCurrency` | currencies |
//! | `POST /product` | the product; then price converted + recommendations + ad + cart |
//! | `POST /cart` | the product (it must exist); then the cart's add |
//! | `GET /cart` | cart + currencies; then recommendations + shipping quote + each product; then every price and the quote converted |
//! | `POST /cart/checkout` | checkout (which calls six services) + recommendations |
//! | `POST /cart/empty` | the cart's empty |

use serde::{Deserialize, Serialize};

use super::ad::{self, Ad, Ads};
use super::cart::{self, Cart, CartItem};
use super::checkout::{self, OrderResult};
use super::currency::{self, Supported};
use super::payment::CreditCard;
use super::productcatalog::{self, Product, Products};
use super::recommendation::{self, Recommendations};
use super::shipping::{self, Address, Quote};
use crate::money::Money;
use crate::rng::Rng;
use crate::rpc::{call, decode, encode, Peers, Service, ServiceError};

/// Header naming the user's session (the cart's owner).
pub const SESSION_HEADER: &str = "X-Session";
/// Header naming the currency to show prices in; USD without it.
pub const CURRENCY_HEADER: &str = "X-Currency";
/// Currency without [`CURRENCY_HEADER`].
pub const DEFAULT_CURRENCY: &str = "USD";
/// Most of one product a single add may put in the cart.
pub const MAX_QUANTITY: u32 = 1000;

/// The frontend's routes (zerohop matches `METHOD /path` exactly: one route per page).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// `GET /`: the home page, every product.
    Home,
    /// `POST /setCurrency`: checks a currency code.
    SetCurrency,
    /// `POST /product`: one product's page; the body is its id.
    Product,
    /// `POST /cart`: adds to the cart.
    AddToCart,
    /// `GET /cart`: the cart page.
    ViewCart,
    /// `POST /cart/checkout`: places the order.
    Checkout,
    /// `POST /cart/empty`: empties the cart.
    EmptyCart,
}

impl Route {
    /// Every route.
    pub const ALL: [Route; 7] = [
        Route::Home,
        Route::SetCurrency,
        Route::Product,
        Route::AddToCart,
        Route::ViewCart,
        Route::Checkout,
        Route::EmptyCart,
    ];

    /// HTTP method.
    pub fn method(self) -> &'static str {
        match self {
            Route::Home | Route::ViewCart => "GET",
            _ => "POST",
        }
    }

    /// HTTP path.
    pub fn path(self) -> &'static str {
        match self {
            Route::Home => "/",
            Route::SetCurrency => "/setCurrency",
            Route::Product => "/product",
            Route::AddToCart | Route::ViewCart => "/cart",
            Route::Checkout => "/cart/checkout",
            Route::EmptyCart => "/cart/empty",
        }
    }

    /// The route for `method` and `path`: 404 for an unknown path, 405 for a known path
    /// with another method.
    pub fn lookup(method: &str, path: &str) -> Result<Route, ServiceError> {
        let on_path: Vec<Route> = Self::ALL.into_iter().filter(|r| r.path() == path).collect();
        if on_path.is_empty() {
            return Err(ServiceError::not_found(format!("no route {path}")));
        }
        on_path
            .iter()
            .copied()
            .find(|r| r.method() == method)
            .ok_or_else(|| ServiceError::new(405, format!("{path} does not take {method}")))
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method(), self.path())
    }
}

/// A request as the frontend sees it, whatever the deployment.
#[derive(Clone, Debug)]
pub struct PageRequest<'a> {
    /// Which page.
    pub route: Route,
    /// [`SESSION_HEADER`], if sent.
    pub session: Option<&'a str>,
    /// [`CURRENCY_HEADER`], if sent.
    pub currency: Option<&'a str>,
    /// The body.
    pub body: &'a [u8],
}

/// A product with its price in the user's currency.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProductView {
    /// Product id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Picture path.
    pub picture: String,
    /// Categories.
    pub categories: Vec<String>,
    /// Price in the page's currency.
    pub price: Money,
}

impl ProductView {
    fn new(p: Product, price: Money) -> Self {
        Self {
            id: p.id,
            name: p.name,
            description: p.description,
            picture: p.picture,
            categories: p.categories,
            price,
        }
    }
}

/// `GET /`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomePage {
    /// The session, if any.
    pub session_id: Option<String>,
    /// The page's currency.
    pub currency: String,
    /// Every supported currency.
    pub currencies: Vec<String>,
    /// Items in the cart (0 without a session).
    pub cart_size: u64,
    /// Every product.
    pub products: Vec<ProductView>,
    /// One ad.
    pub ad: Option<Ad>,
}

/// The body of `POST /setCurrency`, and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrencyChoice {
    /// The code; send it as [`CURRENCY_HEADER`] from then on.
    pub currency_code: String,
}

/// `POST /product`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProductPage {
    /// The product.
    pub product: ProductView,
    /// The page's currency.
    pub currency: String,
    /// Ids of other products.
    pub recommendations: Vec<String>,
    /// One ad for the product's categories.
    pub ad: Option<Ad>,
    /// Items in the cart.
    pub cart_size: u64,
}

/// The body of `POST /cart`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddToCart {
    /// What to add.
    pub product_id: String,
    /// How many, 1 to [`MAX_QUANTITY`].
    pub quantity: u32,
}

/// The answer to `POST /cart` and `POST /cart/empty`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CartChanged {
    /// The cart's items afterwards.
    pub items: Vec<CartItem>,
    /// Items in the cart afterwards.
    pub cart_size: u64,
}

/// One line of the cart page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CartLine {
    /// Product id.
    pub product_id: String,
    /// Product name.
    pub name: String,
    /// How many.
    pub quantity: u32,
    /// Price of one, in the page's currency.
    pub price: Money,
    /// `price * quantity`.
    pub cost: Money,
}

/// `GET /cart`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CartPage {
    /// The session.
    pub session_id: String,
    /// The page's currency.
    pub currency: String,
    /// Every supported currency.
    pub currencies: Vec<String>,
    /// The cart's lines.
    pub items: Vec<CartLine>,
    /// Items in the cart.
    pub cart_size: u64,
    /// Shipping the cart, in the page's currency.
    pub shipping_cost: Money,
    /// Shipping plus every line's cost.
    pub total: Money,
    /// Ids of products not in the cart.
    pub recommendations: Vec<String>,
}

/// The body of `POST /cart/checkout` (the original's order form, as JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckoutForm {
    /// Confirmation goes here.
    pub email: String,
    /// Street and number.
    pub street_address: String,
    /// Postal code.
    pub zip_code: String,
    /// City.
    pub city: String,
    /// State or region.
    pub state: String,
    /// Country.
    pub country: String,
    /// Card number.
    pub credit_card_number: String,
    /// 1 to 12.
    pub credit_card_expiration_month: u32,
    /// Four digits.
    pub credit_card_expiration_year: i32,
    /// Security code.
    pub credit_card_cvv: String,
}

/// `POST /cart/checkout`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPage {
    /// The order placed.
    pub order: OrderResult,
    /// Ids of products to buy next.
    pub recommendations: Vec<String>,
}

/// Answers one page.
pub async fn handle<P: Peers>(
    req: &PageRequest<'_>,
    peers: &mut P,
) -> Result<Vec<u8>, ServiceError> {
    let currency = req.currency.unwrap_or(DEFAULT_CURRENCY);
    match req.route {
        Route::Home => json(&home(req.session, currency, peers).await?),
        Route::SetCurrency => json(&set_currency(req.body, peers).await?),
        Route::Product => json(&product(req, currency, peers).await?),
        Route::AddToCart => json(&add_to_cart(session(req)?, req.body, peers).await?),
        Route::ViewCart => json(&view_cart(session(req)?, currency, peers).await?),
        Route::Checkout => json(&place_order(session(req)?, currency, req.body, peers).await?),
        Route::EmptyCart => {
            let user_id = session(req)?.to_owned();
            let cart: Cart = call(peers, Service::Cart, &cart::Request::Empty { user_id }).await?;
            json(&CartChanged {
                cart_size: cart.size(),
                items: cart.items,
            })
        }
    }
}

fn json<T: Serialize>(page: &T) -> Result<Vec<u8>, ServiceError> {
    crate::rpc::reply(page)
}

fn session<'a>(req: &PageRequest<'a>) -> Result<&'a str, ServiceError> {
    req.session
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ServiceError::bad_request(format!("{SESSION_HEADER} header missing")))
}

fn body_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ServiceError> {
    serde_json::from_slice(body).map_err(|e| ServiceError::bad_request(format!("bad body: {e}")))
}

fn convert(from: &Money, to: &str) -> (Service, Vec<u8>) {
    let req = currency::Request::Convert {
        from: from.clone(),
        to_code: to.to_owned(),
    };
    encode(Service::Currency, &req)
}

fn get_cart(user_id: &str) -> (Service, Vec<u8>) {
    let req = cart::Request::Get {
        user_id: user_id.to_owned(),
    };
    encode(Service::Cart, &req)
}

/// One of the ads, picked at random (the original shows one).
fn choose_ad(ads: Ads) -> Option<Ad> {
    if ads.ads.is_empty() {
        return None;
    }
    let i = Rng::from_entropy().below(ads.ads.len() as u64) as usize;
    ads.ads.into_iter().nth(i)
}

fn check_supported(currency: &str, supported: &Supported) -> Result<(), ServiceError> {
    if supported.currency_codes.iter().any(|c| c == currency) {
        Ok(())
    } else {
        Err(ServiceError::bad_request(format!(
            "unsupported currency {currency:?}"
        )))
    }
}

async fn home<P: Peers>(
    session: Option<&str>,
    currency: &str,
    peers: &mut P,
) -> Result<HomePage, ServiceError> {
    let mut calls = vec![
        encode(Service::Currency, &currency::Request::Supported),
        encode(Service::ProductCatalog, &productcatalog::Request::List),
        encode(Service::Ad, &ad::Request::default()),
    ];
    if let Some(s) = session {
        calls.push(get_cart(s));
    }
    let mut answers = peers.call_all(calls).await.into_iter();
    let mut next = || answers.next().expect("one answer per call");
    let currencies: Supported = decode(Service::Currency, next())?;
    let products: Products = decode(Service::ProductCatalog, next())?;
    let ads: Ads = decode(Service::Ad, next())?;
    let cart_size = match session {
        Some(_) => decode::<Cart>(Service::Cart, next())?.size(),
        None => 0,
    };
    check_supported(currency, &currencies)?;

    let calls = products
        .products
        .iter()
        .map(|p| convert(&p.price_usd, currency))
        .collect();
    let prices = peers.call_all(calls).await;
    let products = products
        .products
        .into_iter()
        .zip(prices)
        .map(|(p, price)| Ok(ProductView::new(p, decode(Service::Currency, price)?)))
        .collect::<Result<Vec<_>, ServiceError>>()?;
    Ok(HomePage {
        session_id: session.map(str::to_owned),
        currency: currency.to_owned(),
        currencies: currencies.currency_codes,
        cart_size,
        products,
        ad: choose_ad(ads),
    })
}

async fn set_currency<P: Peers>(
    body: &[u8],
    peers: &mut P,
) -> Result<CurrencyChoice, ServiceError> {
    let choice: CurrencyChoice = body_json(body)?;
    let supported: Supported =
        call(peers, Service::Currency, &currency::Request::Supported).await?;
    check_supported(&choice.currency_code, &supported)?;
    Ok(choice)
}

fn product_id(body: &[u8]) -> Result<&str, ServiceError> {
    let id = std::str::from_utf8(body)
        .map_err(|_| ServiceError::bad_request("the body must be a product id"))?
        .trim();
    if id.is_empty() {
        return Err(ServiceError::bad_request("the body must be a product id"));
    }
    Ok(id)
}

async fn product<P: Peers>(
    req: &PageRequest<'_>,
    currency: &str,
    peers: &mut P,
) -> Result<ProductPage, ServiceError> {
    let id = product_id(req.body)?.to_owned();
    let product: Product = call(
        peers,
        Service::ProductCatalog,
        &productcatalog::Request::Get { id },
    )
    .await?;
    let recommend = recommendation::Request {
        user_id: req.session.unwrap_or_default().to_owned(),
        product_ids: vec![product.id.clone()],
    };
    let ads = ad::Request {
        context_keys: product.categories.clone(),
    };
    let mut calls = vec![
        convert(&product.price_usd, currency),
        encode(Service::Recommendation, &recommend),
        encode(Service::Ad, &ads),
    ];
    if let Some(s) = req.session {
        calls.push(get_cart(s));
    }
    let mut answers = peers.call_all(calls).await.into_iter();
    let mut next = || answers.next().expect("one answer per call");
    let price: Money = decode(Service::Currency, next())?;
    let recommended: Recommendations = decode(Service::Recommendation, next())?;
    let ads: Ads = decode(Service::Ad, next())?;
    let cart_size = match req.session {
        Some(_) => decode::<Cart>(Service::Cart, next())?.size(),
        None => 0,
    };
    Ok(ProductPage {
        product: ProductView::new(product, price),
        currency: currency.to_owned(),
        recommendations: recommended.product_ids,
        ad: choose_ad(ads),
        cart_size,
    })
}

async fn add_to_cart<P: Peers>(
    user_id: &str,
    body: &[u8],
    peers: &mut P,
) -> Result<CartChanged, ServiceError> {
    let form: AddToCart = body_json(body)?;
    if !(1..=MAX_QUANTITY).contains(&form.quantity) {
        return Err(ServiceError::bad_request(format!(
            "quantity must be 1 to {MAX_QUANTITY}"
        )));
    }
    let get = productcatalog::Request::Get {
        id: form.product_id.clone(),
    };
    let product: Product = call(peers, Service::ProductCatalog, &get).await?;
    let add = cart::Request::Add {
        user_id: user_id.to_owned(),
        item: CartItem {
            product_id: product.id,
            quantity: form.quantity,
        },
    };
    let cart: Cart = call(peers, Service::Cart, &add).await?;
    Ok(CartChanged {
        cart_size: cart.size(),
        items: cart.items,
    })
}

async fn view_cart<P: Peers>(
    user_id: &str,
    currency: &str,
    peers: &mut P,
) -> Result<CartPage, ServiceError> {
    let calls = vec![
        get_cart(user_id),
        encode(Service::Currency, &currency::Request::Supported),
    ];
    let mut answers = peers.call_all(calls).await.into_iter();
    let cart: Cart = decode(Service::Cart, answers.next().expect("one answer per call"))?;
    let currencies: Supported = decode(Service::Currency, answers.next().expect("one answer"))?;
    check_supported(currency, &currencies)?;

    let recommend = recommendation::Request {
        user_id: user_id.to_owned(),
        product_ids: cart.items.iter().map(|i| i.product_id.clone()).collect(),
    };
    let quote = shipping::Request::Quote {
        address: Address::default(),
        items: cart.items.clone(),
    };
    let mut calls = vec![
        encode(Service::Recommendation, &recommend),
        encode(Service::Shipping, &quote),
    ];
    calls.extend(cart.items.iter().map(|i| {
        let get = productcatalog::Request::Get {
            id: i.product_id.clone(),
        };
        encode(Service::ProductCatalog, &get)
    }));
    let mut answers = peers.call_all(calls).await.into_iter();
    let recommended: Recommendations =
        decode(Service::Recommendation, answers.next().expect("one answer"))?;
    let quote: Quote = decode(Service::Shipping, answers.next().expect("one answer"))?;
    let products = answers
        .map(|a| decode::<Product>(Service::ProductCatalog, a))
        .collect::<Result<Vec<_>, _>>()?;

    let mut calls = vec![convert(&quote.cost_usd, currency)];
    calls.extend(products.iter().map(|p| convert(&p.price_usd, currency)));
    let mut answers = peers.call_all(calls).await.into_iter();
    let shipping_cost: Money = decode(Service::Currency, answers.next().expect("one answer"))?;
    let mut total = shipping_cost.clone();
    let mut items = Vec::with_capacity(products.len());
    for ((item, product), price) in cart.items.iter().zip(products).zip(answers) {
        let price: Money = decode(Service::Currency, price)?;
        let cost = price.times(item.quantity)?;
        total = total.checked_add(&cost)?;
        items.push(CartLine {
            product_id: item.product_id.clone(),
            name: product.name,
            quantity: item.quantity,
            price,
            cost,
        });
    }
    Ok(CartPage {
        session_id: user_id.to_owned(),
        currency: currency.to_owned(),
        currencies: currencies.currency_codes,
        cart_size: cart.size(),
        items,
        shipping_cost,
        total,
        recommendations: recommended.product_ids,
    })
}

async fn place_order<P: Peers>(
    user_id: &str,
    currency: &str,
    body: &[u8],
    peers: &mut P,
) -> Result<OrderPage, ServiceError> {
    let form: CheckoutForm = body_json(body)?;
    let order = checkout::Request {
        user_id: user_id.to_owned(),
        user_currency: currency.to_owned(),
        address: Address {
            street_address: form.street_address,
            city: form.city,
            state: form.state,
            country: form.country,
            zip_code: form.zip_code,
        },
        email: form.email,
        credit_card: CreditCard {
            credit_card_number: form.credit_card_number,
            credit_card_cvv: form.credit_card_cvv,
            credit_card_expiration_year: form.credit_card_expiration_year,
            credit_card_expiration_month: form.credit_card_expiration_month,
        },
    };
    let recommend = recommendation::Request {
        user_id: user_id.to_owned(),
        product_ids: Vec::new(),
    };
    let calls = vec![
        encode(Service::Checkout, &order),
        encode(Service::Recommendation, &recommend),
    ];
    let mut answers = peers.call_all(calls).await.into_iter();
    let order: OrderResult = decode(Service::Checkout, answers.next().expect("one answer"))?;
    let recommended: Recommendations =
        decode(Service::Recommendation, answers.next().expect("one answer"))?;
    Ok(OrderPage {
        order,
        recommendations: recommended.product_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_resolve_by_method_and_path() {
        for r in Route::ALL {
            assert_eq!(Route::lookup(r.method(), r.path()), Ok(r));
        }
        assert_eq!(Route::lookup("GET", "/nope").unwrap_err().status, 404);
        assert_eq!(Route::lookup("DELETE", "/cart").unwrap_err().status, 405);
        assert_eq!(Route::lookup("GET", "/product").unwrap_err().status, 405);
    }

    #[test]
    fn product_ids_are_trimmed_text() {
        assert_eq!(product_id(b" OLJCESPC7Z\n"), Ok("OLJCESPC7Z"));
        assert!(product_id(b"  ").is_err());
        assert!(product_id(&[0xff]).is_err());
    }
}
