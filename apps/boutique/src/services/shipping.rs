//! shipping: quotes (a flat 8.99 USD for any non-empty order, as the current original does)
//! and shipments (a tracking id).

use serde::{Deserialize, Serialize};

use super::cart::CartItem;
use crate::money::Money;
use crate::rng::Rng;
use crate::rpc::{parse, reply, Service, ServiceError};

/// Where an order goes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// Street and number.
    pub street_address: String,
    /// City.
    pub city: String,
    /// State or region.
    pub state: String,
    /// Country.
    pub country: String,
    /// Postal code.
    pub zip_code: String,
}

/// What shipping is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The cost of shipping `items` to `address`: [`Quote`].
    Quote {
        /// Destination.
        address: Address,
        /// What is shipped.
        items: Vec<CartItem>,
    },
    /// Ships `items` to `address`: [`Shipment`].
    Ship {
        /// Destination.
        address: Address,
        /// What is shipped.
        items: Vec<CartItem>,
    },
}

/// A quote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// The cost, in USD.
    pub cost_usd: Money,
}

/// A shipment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipment {
    /// Tracking id, e.g. `QK-483920-118273`.
    pub tracking_id: String,
}

/// The cost of shipping `count` items.
pub fn quote(count: u64) -> Money {
    if count == 0 {
        Money::zero("USD")
    } else {
        Money::new("USD", 8, 990_000_000)
    }
}

fn tracking_id() -> String {
    let mut rng = Rng::from_entropy();
    let mut letter = || char::from(b'A' + rng.below(26) as u8);
    let (a, b) = (letter(), letter());
    format!(
        "{a}{b}-{:06}-{:06}",
        rng.below(1_000_000),
        rng.below(1_000_000)
    )
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    match parse(Service::Shipping, input)? {
        Request::Quote { items, .. } => reply(&Quote {
            cost_usd: quote(items.iter().map(|i| u64::from(i.quantity)).sum()),
        }),
        Request::Ship { address, items } => {
            if items.is_empty() {
                return Err(ServiceError::bad_request("nothing to ship"));
            }
            if address.street_address.is_empty() || address.country.is_empty() {
                return Err(ServiceError::bad_request(
                    "address needs a street and a country",
                ));
            }
            reply(&Shipment {
                tracking_id: tracking_id(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_ships() {
        assert_eq!(quote(0), Money::zero("USD"));
        assert_eq!(quote(7), Money::new("USD", 8, 990_000_000));
        let t = tracking_id();
        assert_eq!(t.len(), 16, "{t}");
        assert!(t.as_bytes()[..2].iter().all(u8::is_ascii_uppercase));
        let ship = br#"{"op":"ship","address":{"street_address":"","city":"","state":"","country":"","zip_code":""},"items":[{"product_id":"A","quantity":1}]}"#;
        assert_eq!(handle(ship).unwrap_err().status, 400);
    }
}
