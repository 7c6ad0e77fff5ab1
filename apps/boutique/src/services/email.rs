//! email: formats an order confirmation (sends nothing, as the original's dummy mode).

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::checkout::OrderResult;
use crate::rpc::{parse, reply, Service, ServiceError};

/// A confirmation to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// To whom.
    pub email: String,
    /// The order.
    pub order: OrderResult,
}

/// The message that would be sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Recipient.
    pub to: String,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
}

/// The confirmation for `req`.
pub fn confirmation(req: &Request) -> Result<Confirmation, ServiceError> {
    if !req.email.contains('@') {
        return Err(ServiceError::bad_request(format!(
            "{:?} is not an e-mail address",
            req.email
        )));
    }
    let o = &req.order;
    let mut text = format!(
        "Thank you for your order!\n\nOrder {}\nTracking {}\n\n",
        o.order_id, o.shipping_tracking_id
    );
    for item in &o.items {
        // Writing to a String cannot fail.
        let _ = writeln!(
            text,
            "{} x {} at {}",
            item.quantity, item.product_id, item.unit_price
        );
    }
    let a = &o.shipping_address;
    let _ = write!(
        text,
        "\nShipping {}\nTotal {}\n\nShips to {}, {} {}, {}, {}\n",
        o.shipping_cost, o.total, a.street_address, a.zip_code, a.city, a.state, a.country
    );
    Ok(Confirmation {
        to: req.email.clone(),
        subject: format!("Your order {}", o.order_id),
        text,
    })
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    let req: Request = parse(Service::Email, input)?;
    reply(&confirmation(&req)?)
}
