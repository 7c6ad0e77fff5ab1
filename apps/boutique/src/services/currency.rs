//! currency: the supported currencies and conversion between them, with the original
//! demo's EUR-based rates (`data/currency_conversion.json`, embedded in the binary: a
//! confined function may not read the agent's files).
//!
//! A conversion goes through EUR in exact integer arithmetic: rates are fixed-point numbers
//! with six decimals, the amount is `nanos * rate(to) / rate(from)`, truncated toward zero to
//! whole nanos (the original truncates too, after float arithmetic).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::money::Money;
use crate::rpc::{parse, reply, Service, ServiceError};

const RATES_JSON: &str = include_str!("../../data/currency_conversion.json");

/// Decimal places a rate may have.
const RATE_DECIMALS: u32 = 6;

/// What currency is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The supported currency codes: [`Supported`].
    Supported,
    /// `from` in `to_code`: a [`Money`].
    Convert {
        /// The amount.
        from: Money,
        /// The currency wanted.
        to_code: String,
    },
}

/// The answer to [`Request::Supported`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supported {
    /// Codes, sorted.
    pub currency_codes: Vec<String>,
}

/// Units per EUR of each currency, scaled by 10^[`RATE_DECIMALS`].
fn rates() -> &'static BTreeMap<String, i128> {
    static RATES: OnceLock<BTreeMap<String, i128>> = OnceLock::new();
    RATES.get_or_init(|| {
        let raw: BTreeMap<String, String> =
            serde_json::from_str(RATES_JSON).expect("data/currency_conversion.json is valid");
        raw.into_iter()
            .map(|(code, rate)| {
                let scaled = parse_rate(&rate)
                    .unwrap_or_else(|| panic!("rate {rate:?} of {code} is not a decimal"));
                (code, scaled)
            })
            .collect()
    })
}

/// `"1.1305"` -> 1_130_500; `None` for anything but a positive decimal with at most
/// [`RATE_DECIMALS`] decimals.
fn parse_rate(s: &str) -> Option<i128> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || frac.len() > RATE_DECIMALS as usize {
        return None;
    }
    let scale = 10i128.pow(RATE_DECIMALS - frac.len() as u32);
    let v = format!("{int}{frac}").parse::<i128>().ok()? * scale;
    (v > 0).then_some(v)
}

/// The supported codes, sorted.
pub fn supported() -> Vec<String> {
    rates().keys().cloned().collect()
}

/// `from` in `to_code`.
pub fn convert(from: &Money, to_code: &str) -> Result<Money, ServiceError> {
    from.validate()?;
    let rate = |code: &str| {
        rates()
            .get(code)
            .copied()
            .ok_or_else(|| ServiceError::bad_request(format!("unsupported currency {code:?}")))
    };
    let (from_rate, to_rate) = (rate(&from.currency_code)?, rate(to_code)?);
    let scaled = from
        .total_nanos()
        .checked_mul(to_rate)
        .ok_or_else(|| ServiceError::bad_request("amount out of range"))?;
    Ok(Money::from_nanos(to_code, scaled / from_rate)?)
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    match parse(Service::Currency, input)? {
        Request::Supported => reply(&Supported {
            currency_codes: supported(),
        }),
        Request::Convert { from, to_code } => reply(&convert(&from, &to_code)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_loads_with_the_original_currencies() {
        let codes = supported();
        assert_eq!(codes.len(), 33);
        for c in ["EUR", "USD", "JPY", "CAD", "GBP", "TRY"] {
            assert!(codes.iter().any(|x| x == c), "{c}");
        }
        assert_eq!(parse_rate("0.85970"), Some(859_700));
        assert_eq!(parse_rate("15999.40"), Some(15_999_400_000));
        assert_eq!(parse_rate("1.1234567"), None);
        assert_eq!(parse_rate("-1"), None);
    }

    #[test]
    fn converts_through_eur_exactly() {
        let usd = Money::new("USD", 67, 990_000_000);
        // 67.99 / 1.1305 = 60.1415302963...
        assert_eq!(
            convert(&usd, "EUR").unwrap(),
            Money::new("EUR", 60, 141_530_296)
        );
        // Same currency: unchanged.
        assert_eq!(convert(&usd, "USD").unwrap(), usd);
        // 67.99 * 126.40 / 1.1305 = 7601.889429...
        assert_eq!(
            convert(&usd, "JPY").unwrap(),
            Money::new("JPY", 7601, 889_429_455)
        );
        assert_eq!(convert(&usd, "XXX").unwrap_err().status, 400);
    }

    #[test]
    fn speaks_json() {
        let out = handle(br#"{"op":"convert","from":{"currency_code":"EUR","units":2,"nanos":0},"to_code":"USD"}"#).unwrap();
        let m: Money = serde_json::from_slice(&out).unwrap();
        assert_eq!(m, Money::new("USD", 2, 261_000_000));
        let out = handle(br#"{"op":"supported"}"#).unwrap();
        let s: Supported = serde_json::from_slice(&out).unwrap();
        assert_eq!(s.currency_codes.len(), 33);
        assert_eq!(handle(b"{}").unwrap_err().status, 400);
    }
}
