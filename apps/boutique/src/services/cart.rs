//! cart: one cart per user, kept in the deployment's [`Store`] under `cart:USER` as a JSON
//! list of items. Adding merges quantities of the same product in one atomic update, so two
//! concurrent adds to one cart both count.

use serde::{Deserialize, Serialize};

use crate::rpc::{parse, reply, Service, ServiceError, Store};

/// Longest user id (a store key is at most 128 bytes, `cart:` included).
pub const MAX_USER_ID: usize = 120;

/// Most distinct products in one cart (keeps a cart well under the store's value size).
pub const MAX_LINES: usize = 32;

/// A product and how many of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CartItem {
    /// The product's id.
    pub product_id: String,
    /// How many, at least 1.
    pub quantity: u32,
}

/// A user's cart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cart {
    /// Whose.
    pub user_id: String,
    /// In the order the products were first added.
    pub items: Vec<CartItem>,
}

impl Cart {
    /// Items in the cart, counting quantities (what the original's header shows).
    pub fn size(&self) -> u64 {
        self.items.iter().map(|i| u64::from(i.quantity)).sum()
    }
}

/// What cart is asked; each answers the cart as it is afterwards ([`Cart`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Adds `item` (quantities of the same product add up).
    Add {
        /// Whose cart.
        user_id: String,
        /// What to add.
        item: CartItem,
    },
    /// The cart.
    Get {
        /// Whose cart.
        user_id: String,
    },
    /// Empties the cart.
    Empty {
        /// Whose cart.
        user_id: String,
    },
}

fn key(user_id: &str) -> Result<Vec<u8>, ServiceError> {
    if user_id.is_empty() || user_id.len() > MAX_USER_ID {
        return Err(ServiceError::bad_request(format!(
            "user id must be 1 to {MAX_USER_ID} bytes"
        )));
    }
    Ok(format!("cart:{user_id}").into_bytes())
}

fn items_of(value: Option<&[u8]>) -> Vec<CartItem> {
    // Only this module writes carts; an unreadable one (never seen) counts as empty.
    value
        .and_then(|v| serde_json::from_slice(v).ok())
        .unwrap_or_default()
}

fn add(store: &dyn Store, user_id: &str, item: CartItem) -> Result<Vec<CartItem>, ServiceError> {
    if item.quantity == 0 {
        return Err(ServiceError::bad_request("quantity must be at least 1"));
    }
    let mut refused = None;
    let new = store.update(&key(user_id)?, &mut |old| {
        let mut items = items_of(old);
        let lines = items.len();
        match items.iter_mut().find(|i| i.product_id == item.product_id) {
            Some(line) => match line.quantity.checked_add(item.quantity) {
                Some(q) => line.quantity = q,
                None => refused = Some("quantity too large"),
            },
            None if lines >= MAX_LINES => refused = Some("cart is full"),
            None => items.push(item.clone()),
        }
        if refused.is_some() {
            return old.map(<[u8]>::to_vec);
        }
        Some(serde_json::to_vec(&items).expect("cart items serialise"))
    })?;
    match refused {
        Some(why) => Err(ServiceError::bad_request(why)),
        None => Ok(items_of(new.as_deref())),
    }
}

/// Serves one call.
pub fn handle(input: &[u8], store: &dyn Store) -> Result<Vec<u8>, ServiceError> {
    let (user_id, items) = match parse(Service::Cart, input)? {
        Request::Add { user_id, item } => {
            let items = add(store, &user_id, item)?;
            (user_id, items)
        }
        Request::Get { user_id } => {
            let items = items_of(store.get(&key(&user_id)?)?.as_deref());
            (user_id, items)
        }
        Request::Empty { user_id } => {
            store.update(&key(&user_id)?, &mut |_| None)?;
            (user_id, Vec::new())
        }
    };
    reply(&Cart { user_id, items })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deploy::http::MemStore;

    fn ask(store: &MemStore, req: &Request) -> Result<Cart, ServiceError> {
        let out = handle(&serde_json::to_vec(req).unwrap(), store)?;
        Ok(serde_json::from_slice(&out).unwrap())
    }

    fn add(user: &str, id: &str, quantity: u32) -> Request {
        Request::Add {
            user_id: user.into(),
            item: CartItem {
                product_id: id.into(),
                quantity,
            },
        }
    }

    #[test]
    fn adds_merge_and_empty_clears() {
        let store = MemStore::default();
        ask(&store, &add("u1", "A", 2)).unwrap();
        ask(&store, &add("u1", "B", 1)).unwrap();
        let cart = ask(&store, &add("u1", "A", 3)).unwrap();
        assert_eq!(cart.items.len(), 2);
        assert_eq!(cart.items[0].quantity, 5);
        assert_eq!(cart.size(), 6);
        // Another user's cart is separate.
        let other = ask(
            &store,
            &Request::Get {
                user_id: "u2".into(),
            },
        )
        .unwrap();
        assert!(other.items.is_empty());
        ask(
            &store,
            &Request::Empty {
                user_id: "u1".into(),
            },
        )
        .unwrap();
        let cart = ask(
            &store,
            &Request::Get {
                user_id: "u1".into(),
            },
        )
        .unwrap();
        assert!(cart.items.is_empty());
    }

    #[test]
    fn refuses_bad_input_without_changing_the_cart() {
        let store = MemStore::default();
        assert_eq!(ask(&store, &add("u", "A", 0)).unwrap_err().status, 400);
        ask(&store, &add("u", "A", u32::MAX)).unwrap();
        assert_eq!(ask(&store, &add("u", "A", 1)).unwrap_err().status, 400);
        let cart = ask(
            &store,
            &Request::Get {
                user_id: "u".into(),
            },
        )
        .unwrap();
        assert_eq!(cart.items[0].quantity, u32::MAX);
        let long = "x".repeat(MAX_USER_ID + 1);
        assert_eq!(ask(&store, &add(&long, "A", 1)).unwrap_err().status, 400);
    }
}
