//! recommendation: up to five products the user is not looking at, in random order; asks
//! productcatalog for the list every time, as the original does.

use serde::{Deserialize, Serialize};

use super::productcatalog;
use crate::rng::Rng;
use crate::rpc::{call, parse, reply, Peers, Service, ServiceError};

/// Most products recommended at once.
pub const MAX_RECOMMENDATIONS: usize = 5;

/// Products to recommend around.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Who asks (unused, as in the original).
    #[serde(default)]
    pub user_id: String,
    /// Products the user is looking at: never recommended.
    #[serde(default)]
    pub product_ids: Vec<String>,
}

/// Recommended products.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommendations {
    /// Product ids.
    pub product_ids: Vec<String>,
}

/// Serves one call.
pub async fn handle<P: Peers>(input: &[u8], peers: &mut P) -> Result<Vec<u8>, ServiceError> {
    let req: Request = parse(Service::Recommendation, input)?;
    let all: productcatalog::Products = call(
        peers,
        Service::ProductCatalog,
        &productcatalog::Request::List,
    )
    .await?;
    let mut ids: Vec<String> = all
        .products
        .into_iter()
        .map(|p| p.id)
        .filter(|id| !req.product_ids.contains(id))
        .collect();
    Rng::from_entropy().shuffle(&mut ids);
    ids.truncate(MAX_RECOMMENDATIONS);
    reply(&Recommendations { product_ids: ids })
}
