//! productcatalog: the original demo's products (`data/products.json`, embedded in the
//! binary), listed, looked up by id and searched by name or description.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::money::Money;
use crate::rpc::{parse, reply, Service, ServiceError};

const PRODUCTS_JSON: &str = include_str!("../../data/products.json");

/// One product.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    /// Ten characters, e.g. `OLJCESPC7Z`.
    pub id: String,
    /// Display name.
    pub name: String,
    /// One sentence.
    pub description: String,
    /// Picture path in the original demo's static files.
    pub picture: String,
    /// Price in US dollars (the catalog file spells it `priceUsd`).
    #[serde(alias = "priceUsd")]
    pub price_usd: Money,
    /// Categories, used to pick ads.
    pub categories: Vec<String>,
}

/// What productcatalog is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Every product: [`Products`].
    List,
    /// One product: a [`Product`], 404 when there is none with that id.
    Get {
        /// The product's id.
        id: String,
    },
    /// Products whose name or description contains `query` (case-insensitive): [`Products`].
    Search {
        /// Text to look for.
        query: String,
    },
}

/// A list of products.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Products {
    /// In catalog order.
    pub products: Vec<Product>,
}

#[derive(Deserialize)]
struct CatalogFile {
    products: Vec<Product>,
}

/// The catalog, in file order.
pub fn products() -> &'static [Product] {
    static CATALOG: OnceLock<Vec<Product>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let file: CatalogFile =
            serde_json::from_str(PRODUCTS_JSON).expect("data/products.json is valid");
        file.products
    })
}

/// The product with `id`.
pub fn product(id: &str) -> Result<&'static Product, ServiceError> {
    products()
        .iter()
        .find(|p| p.id == id)
        .ok_or_else(|| ServiceError::not_found(format!("no product with id {id:?}")))
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    match parse(Service::ProductCatalog, input)? {
        Request::List => reply(&Products {
            products: products().to_vec(),
        }),
        Request::Get { id } => reply(product(&id)?),
        Request::Search { query } => {
            let q = query.to_lowercase();
            let products = products()
                .iter()
                .filter(|p| {
                    p.name.to_lowercase().contains(&q) || p.description.to_lowercase().contains(&q)
                })
                .cloned()
                .collect();
            reply(&Products { products })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_loads_the_original_nine_products() {
        let all = products();
        assert_eq!(all.len(), 9);
        for p in all {
            assert_eq!(p.id.len(), 10);
            assert_eq!(p.price_usd.currency_code, "USD");
            assert!(p.price_usd.validate().is_ok());
            assert!(!p.categories.is_empty());
        }
        let kit = product("1YMWWN1N4O").unwrap();
        assert_eq!(kit.price_usd, Money::new("USD", 124, 0));
        assert_eq!(product("nope").unwrap_err().status, 404);
    }

    #[test]
    fn searches_names_and_descriptions() {
        let out = handle(br#"{"op":"search","query":"CAMERA"}"#).unwrap();
        let found: Products = serde_json::from_slice(&out).unwrap();
        let ids: Vec<_> = found.products.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["66VCHSJNUP", "2ZYFJ3GM2N"]);
        let out = handle(br#"{"op":"get","id":"OLJCESPC7Z"}"#).unwrap();
        let p: Product = serde_json::from_slice(&out).unwrap();
        assert_eq!(p.name, "Vintage Typewriter");
    }
}
