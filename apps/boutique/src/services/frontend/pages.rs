//! The pages' contents: what each page asks of the other services, and the objects it
//! shows (serde types: the JSON answers, and what [`super::html`] renders).
//!
//! Each page fans out to the services it needs with one `call_all` per step (the original
//! calls them one after another):
//!
//! | page | steps |
//! |---|---|
//! | home | currencies + products + cart + ad; then every price converted |
//! | product | the product; then price converted + recommendations + ad + cart + currencies |
//! | add to cart | the product (it must exist); then the cart's add |
//! | view cart | cart + currencies; then recommendations + shipping quote + each product; then every price and the quote converted |
//! | checkout | checkout (which calls six services) + recommendations |
//! | empty cart | the cart's empty |
//! | set currency | currencies |

use serde::{Deserialize, Serialize};

use crate::money::Money;
use crate::rng::Rng;
use crate::rpc::{call, decode, encode, Peers, Service, ServiceError};
use crate::services::ad::{self, Ad, Ads};
use crate::services::cart::{self, Cart, CartItem};
use crate::services::checkout::{self, OrderResult};
use crate::services::currency::{self, Supported};
use crate::services::payment::CreditCard;
use crate::services::productcatalog::{self, Product, Products};
use crate::services::recommendation::{self, Recommendations};
use crate::services::shipping::{self, Address, Quote};

/// Most of one product a single add may put in the cart.
pub const MAX_QUANTITY: u32 = 1000;

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
    /// The session (from the cookie, or the one this answer sets).
    pub session_id: String,
    /// The page's currency.
    pub currency: String,
    /// Every supported currency.
    pub currencies: Vec<String>,
    /// Items in the cart.
    pub cart_size: u64,
    /// Every product.
    pub products: Vec<ProductView>,
    /// One ad.
    pub ad: Option<Ad>,
}

/// The form of `POST /setCurrency`, and its JSON answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrencyChoice {
    /// The code, kept in the `shop_currency` cookie from then on.
    pub currency_code: String,
}

/// `GET /product/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProductPage {
    /// The product.
    pub product: ProductView,
    /// The page's currency.
    pub currency: String,
    /// Every supported currency.
    pub currencies: Vec<String>,
    /// Ids of other products.
    pub recommendations: Vec<String>,
    /// One ad for the product's categories.
    pub ad: Option<Ad>,
    /// Items in the cart.
    pub cart_size: u64,
}

/// The form of `POST /cart`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddToCart {
    /// What to add.
    pub product_id: String,
    /// How many, 1 to [`MAX_QUANTITY`].
    pub quantity: u32,
}

/// The JSON answer to `POST /cart` and `POST /cart/empty` (beside the redirect).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CartChanged {
    /// The cart's items afterwards.
    pub items: Vec<CartItem>,
    /// Items in the cart afterwards.
    pub cart_size: u64,
}

impl From<Cart> for CartChanged {
    fn from(cart: Cart) -> Self {
        Self {
            cart_size: cart.size(),
            items: cart.items,
        }
    }
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

/// The form of `POST /cart/checkout` (the original's order form).
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

/// The JSON answer to `GET /logout` (beside the redirect).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedOut {
    /// The cookies the answer expires (those the request had).
    pub expired: Vec<String>,
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

/// The home page: every product in `currency`.
pub async fn home<P: Peers>(
    session: &str,
    currency: &str,
    peers: &mut P,
) -> Result<HomePage, ServiceError> {
    let calls = vec![
        encode(Service::Currency, &currency::Request::Supported),
        encode(Service::ProductCatalog, &productcatalog::Request::List),
        encode(Service::Ad, &ad::Request::default()),
        get_cart(session),
    ];
    let mut answers = peers.call_all(calls).await.into_iter();
    let mut next = || answers.next().expect("one answer per call");
    let currencies: Supported = decode(Service::Currency, next())?;
    let products: Products = decode(Service::ProductCatalog, next())?;
    let ads: Ads = decode(Service::Ad, next())?;
    let cart_size = decode::<Cart>(Service::Cart, next())?.size();
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
        session_id: session.to_owned(),
        currency: currency.to_owned(),
        currencies: currencies.currency_codes,
        cart_size,
        products,
        ad: choose_ad(ads),
    })
}

/// Checks the chosen currency against the supported ones (the original takes any code,
/// and then fails every page that converts to it).
pub async fn set_currency<P: Peers>(
    choice: CurrencyChoice,
    peers: &mut P,
) -> Result<CurrencyChoice, ServiceError> {
    let supported: Supported =
        call(peers, Service::Currency, &currency::Request::Supported).await?;
    check_supported(&choice.currency_code, &supported)?;
    Ok(choice)
}

/// One product's page.
pub async fn product<P: Peers>(
    session: &str,
    currency: &str,
    id: &str,
    peers: &mut P,
) -> Result<ProductPage, ServiceError> {
    let get = productcatalog::Request::Get { id: id.to_owned() };
    let product: Product = call(peers, Service::ProductCatalog, &get).await?;
    let recommend = recommendation::Request {
        user_id: session.to_owned(),
        product_ids: vec![product.id.clone()],
    };
    let ads = ad::Request {
        context_keys: product.categories.clone(),
    };
    let calls = vec![
        convert(&product.price_usd, currency),
        encode(Service::Recommendation, &recommend),
        encode(Service::Ad, &ads),
        get_cart(session),
        encode(Service::Currency, &currency::Request::Supported),
    ];
    let mut answers = peers.call_all(calls).await.into_iter();
    let mut next = || answers.next().expect("one answer per call");
    let price: Money = decode(Service::Currency, next())?;
    let recommended: Recommendations = decode(Service::Recommendation, next())?;
    let ads: Ads = decode(Service::Ad, next())?;
    let cart_size = decode::<Cart>(Service::Cart, next())?.size();
    let currencies: Supported = decode(Service::Currency, next())?;
    Ok(ProductPage {
        product: ProductView::new(product, price),
        currency: currency.to_owned(),
        currencies: currencies.currency_codes,
        recommendations: recommended.product_ids,
        ad: choose_ad(ads),
        cart_size,
    })
}

/// Adds to the session's cart a product that exists.
pub async fn add_to_cart<P: Peers>(
    session: &str,
    form: AddToCart,
    peers: &mut P,
) -> Result<CartChanged, ServiceError> {
    if !(1..=MAX_QUANTITY).contains(&form.quantity) {
        return Err(ServiceError::bad_request(format!(
            "quantity must be 1 to {MAX_QUANTITY}"
        )));
    }
    let get = productcatalog::Request::Get {
        id: form.product_id,
    };
    let product: Product = call(peers, Service::ProductCatalog, &get).await?;
    let add = cart::Request::Add {
        user_id: session.to_owned(),
        item: CartItem {
            product_id: product.id,
            quantity: form.quantity,
        },
    };
    let cart: Cart = call(peers, Service::Cart, &add).await?;
    Ok(cart.into())
}

/// Empties the session's cart.
pub async fn empty_cart<P: Peers>(
    session: &str,
    peers: &mut P,
) -> Result<CartChanged, ServiceError> {
    let user_id = session.to_owned();
    let cart: Cart = call(peers, Service::Cart, &cart::Request::Empty { user_id }).await?;
    Ok(cart.into())
}

/// The cart page: lines, shipping and total in `currency`.
pub async fn view_cart<P: Peers>(
    session: &str,
    currency: &str,
    peers: &mut P,
) -> Result<CartPage, ServiceError> {
    let calls = vec![
        get_cart(session),
        encode(Service::Currency, &currency::Request::Supported),
    ];
    let mut answers = peers.call_all(calls).await.into_iter();
    let cart: Cart = decode(Service::Cart, answers.next().expect("one answer per call"))?;
    let currencies: Supported = decode(Service::Currency, answers.next().expect("one answer"))?;
    check_supported(currency, &currencies)?;

    let recommend = recommendation::Request {
        user_id: session.to_owned(),
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
        session_id: session.to_owned(),
        currency: currency.to_owned(),
        currencies: currencies.currency_codes,
        cart_size: cart.size(),
        items,
        shipping_cost,
        total,
        recommendations: recommended.product_ids,
    })
}

/// Places the order of the session's cart.
pub async fn place_order<P: Peers>(
    session: &str,
    currency: &str,
    form: CheckoutForm,
    peers: &mut P,
) -> Result<OrderPage, ServiceError> {
    let order = checkout::Request {
        user_id: session.to_owned(),
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
        user_id: session.to_owned(),
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
