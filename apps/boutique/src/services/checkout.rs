//! checkout: places an order, as the original's `PlaceOrder`: reads the user's cart, prices
//! every item and the shipping in the user's currency, charges the card for the total,
//! ships, then empties the cart and sends the confirmation (a failed e-mail does not fail the
//! order, as in the original).

use serde::{Deserialize, Serialize};

use super::cart::{self, Cart};
use super::payment::{self, Charged, CreditCard};
use super::productcatalog::{self, Product};
use super::shipping::{self, Address, Quote, Shipment};
use super::{currency, email};
use crate::money::Money;
use crate::rng;
use crate::rpc::{call, decode, encode, parse, reply, Peers, Service, ServiceError};

/// An order to place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Whose cart.
    pub user_id: String,
    /// Currency to charge in.
    pub user_currency: String,
    /// Where to ship.
    pub address: Address,
    /// Where to confirm.
    pub email: String,
    /// How to pay.
    pub credit_card: CreditCard,
}

/// One line of an order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderItem {
    /// The product.
    pub product_id: String,
    /// How many.
    pub quantity: u32,
    /// Price of one, in the order's currency.
    pub unit_price: Money,
}

/// A placed order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderResult {
    /// The order's id.
    pub order_id: String,
    /// The shipment's tracking id.
    pub shipping_tracking_id: String,
    /// Shipping, in the order's currency.
    pub shipping_cost: Money,
    /// Where it ships.
    pub shipping_address: Address,
    /// What was bought.
    pub items: Vec<OrderItem>,
    /// What was charged: shipping plus every unit price times its quantity.
    pub total: Money,
    /// The payment's transaction id.
    pub transaction_id: String,
}

/// Serves one call.
pub async fn handle<P: Peers>(input: &[u8], peers: &mut P) -> Result<Vec<u8>, ServiceError> {
    let req: Request = parse(Service::Checkout, input)?;
    reply(&place_order(req, peers).await?)
}

async fn place_order<P: Peers>(req: Request, peers: &mut P) -> Result<OrderResult, ServiceError> {
    let user_id = req.user_id.clone();
    let cart: Cart = call(peers, Service::Cart, &cart::Request::Get { user_id }).await?;
    if cart.items.is_empty() {
        return Err(ServiceError::bad_request("the cart is empty"));
    }

    // Every product and the shipping quote at once.
    let mut calls: Vec<_> = cart
        .items
        .iter()
        .map(|i| {
            let get = productcatalog::Request::Get {
                id: i.product_id.clone(),
            };
            encode(Service::ProductCatalog, &get)
        })
        .collect();
    let quote = shipping::Request::Quote {
        address: req.address.clone(),
        items: cart.items.clone(),
    };
    calls.push(encode(Service::Shipping, &quote));
    let mut answers = peers.call_all(calls).await;
    let quote: Quote = decode(
        Service::Shipping,
        answers.pop().expect("one answer per call"),
    )?;
    let products = answers
        .into_iter()
        .map(|a| decode::<Product>(Service::ProductCatalog, a))
        .collect::<Result<Vec<_>, _>>()?;

    // Then every price and the shipping in the user's currency, at once.
    let to = |from: &Money| {
        let convert = currency::Request::Convert {
            from: from.clone(),
            to_code: req.user_currency.clone(),
        };
        encode(Service::Currency, &convert)
    };
    let mut calls: Vec<_> = products.iter().map(|p| to(&p.price_usd)).collect();
    calls.push(to(&quote.cost_usd));
    let mut answers = peers.call_all(calls).await;
    let shipping_cost: Money = decode(Service::Currency, answers.pop().expect("one answer"))?;
    let items = cart
        .items
        .iter()
        .zip(answers)
        .map(|(item, a)| {
            Ok(OrderItem {
                product_id: item.product_id.clone(),
                quantity: item.quantity,
                unit_price: decode(Service::Currency, a)?,
            })
        })
        .collect::<Result<Vec<_>, ServiceError>>()?;
    let total = order_total(&items, &shipping_cost)?;

    let charge = payment::Request {
        amount: total.clone(),
        credit_card: req.credit_card,
    };
    let charged: Charged = call(peers, Service::Payment, &charge).await?;
    let ship = shipping::Request::Ship {
        address: req.address.clone(),
        items: cart.items.clone(),
    };
    let shipment: Shipment = call(peers, Service::Shipping, &ship).await?;

    let order = OrderResult {
        order_id: rng::uuid(),
        shipping_tracking_id: shipment.tracking_id,
        shipping_cost,
        shipping_address: req.address,
        items,
        total,
        transaction_id: charged.transaction_id,
    };
    let empty = cart::Request::Empty {
        user_id: req.user_id,
    };
    let confirm = email::Request {
        email: req.email,
        order: order.clone(),
    };
    let mut answers = peers
        .call_all(vec![
            encode(Service::Cart, &empty),
            encode(Service::Email, &confirm),
        ])
        .await;
    if let Err(e) = answers.pop().expect("one answer per call") {
        eprintln!(
            "checkout: order {} placed, confirmation not sent: {e}",
            order.order_id
        );
    }
    decode::<Cart>(Service::Cart, answers.pop().expect("one answer per call"))?;
    Ok(order)
}

/// Shipping plus every unit price times its quantity, in the shipping's currency.
pub fn order_total(items: &[OrderItem], shipping: &Money) -> Result<Money, ServiceError> {
    let mut total = shipping.clone();
    for i in items {
        total = total.checked_add(&i.unit_price.times(i.quantity)?)?;
    }
    Ok(total)
}
