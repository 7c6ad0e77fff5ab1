//! ad: text ads by product category, the original demo's fixed list (`data/ads.json`,
//! embedded); without context, or with none matching, two at random.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::rpc::{parse, reply, Service, ServiceError};

const ADS_JSON: &str = include_str!("../../data/ads.json");

/// Ads served when the context matches none.
pub const RANDOM_ADS: usize = 2;

/// One ad.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ad {
    /// Where it leads (a product page of the original's site).
    pub redirect_url: String,
    /// What it says.
    pub text: String,
}

/// Ads for a context.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Categories (of the product on the page); empty for random ads.
    #[serde(default)]
    pub context_keys: Vec<String>,
}

/// The ads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ads {
    /// At least one.
    pub ads: Vec<Ad>,
}

fn by_category() -> &'static BTreeMap<String, Vec<Ad>> {
    static ADS: OnceLock<BTreeMap<String, Vec<Ad>>> = OnceLock::new();
    ADS.get_or_init(|| serde_json::from_str(ADS_JSON).expect("data/ads.json is valid"))
}

/// The ads for `context_keys`.
pub fn ads_for(context_keys: &[String]) -> Vec<Ad> {
    let mut ads: Vec<Ad> = context_keys
        .iter()
        .filter_map(|k| by_category().get(k))
        .flatten()
        .cloned()
        .collect();
    if ads.is_empty() {
        let all: Vec<&Ad> = by_category().values().flatten().collect();
        let mut rng = Rng::from_entropy();
        ads = (0..RANDOM_ADS).map(|_| (*rng.pick(&all)).clone()).collect();
    }
    ads
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    let req: Request = parse(Service::Ad, input)?;
    reply(&Ads {
        ads: ads_for(&req.context_keys),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ads_follow_the_context() {
        let ads = ads_for(&["cycling".into()]);
        assert_eq!(ads.len(), 1);
        assert_eq!(ads[0].redirect_url, "/product/9SIQT8TOJO");
        assert_eq!(ads_for(&["photography".into(), "vintage".into()]).len(), 5);
        assert_eq!(ads_for(&[]).len(), RANDOM_ADS);
        assert_eq!(ads_for(&["socks".into()]).len(), RANDOM_ADS);
    }
}
