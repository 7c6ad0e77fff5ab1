//! Amounts of money as the boutique's services exchange them: a currency code, whole units
//! and nanos (billionths of a unit), as in the original demo's `Money` message.
//!
//! Invariants of a valid amount: `-999_999_999 <= nanos <= 999_999_999`, and `units` and
//! `nanos` never have opposite signs. Arithmetic works on the amount in nanos (`i128`, no
//! rounding) and fails on a currency mismatch or an amount beyond `i64` units instead of
//! wrapping.

use serde::{Deserialize, Serialize};

/// Nanos per unit.
pub const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// An amount in one currency.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Money {
    /// ISO 4217 code, e.g. `EUR`. The catalog file spells it `currencyCode`.
    #[serde(alias = "currencyCode")]
    pub currency_code: String,
    /// Whole units.
    #[serde(default)]
    pub units: i64,
    /// Billionths of a unit, same sign as `units`.
    #[serde(default)]
    pub nanos: i32,
}

/// Why an amount could not be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// Two amounts in different currencies were combined.
    #[error("cannot add {left} and {right} amounts")]
    CurrencyMismatch {
        /// Currency of the left operand.
        left: String,
        /// Currency of the right operand.
        right: String,
    },
    /// The result does not fit `i64` units.
    #[error("amount out of range")]
    Overflow,
    /// `nanos` out of range or of the wrong sign.
    #[error("invalid amount {units} units {nanos} nanos")]
    Invalid {
        /// The units given.
        units: i64,
        /// The nanos given.
        nanos: i32,
    },
}

impl Money {
    /// An amount of `units` and `nanos` in `currency_code`.
    pub fn new(currency_code: impl Into<String>, units: i64, nanos: i32) -> Self {
        Self {
            currency_code: currency_code.into(),
            units,
            nanos,
        }
    }

    /// Nothing, in `currency_code`.
    pub fn zero(currency_code: impl Into<String>) -> Self {
        Self::new(currency_code, 0, 0)
    }

    /// Checks the invariants of the module docs.
    pub fn validate(&self) -> Result<(), MoneyError> {
        let in_range = (-999_999_999..=999_999_999).contains(&self.nanos);
        let signs_agree = !(self.units > 0 && self.nanos < 0 || self.units < 0 && self.nanos > 0);
        if in_range && signs_agree {
            Ok(())
        } else {
            Err(MoneyError::Invalid {
                units: self.units,
                nanos: self.nanos,
            })
        }
    }

    /// The amount in nanos.
    pub fn total_nanos(&self) -> i128 {
        i128::from(self.units) * NANOS_PER_UNIT + i128::from(self.nanos)
    }

    /// The amount of `nanos` in `currency_code` (units and nanos with the same sign).
    pub fn from_nanos(currency_code: impl Into<String>, nanos: i128) -> Result<Self, MoneyError> {
        let units = i64::try_from(nanos / NANOS_PER_UNIT).map_err(|_| MoneyError::Overflow)?;
        // The remainder has the dividend's sign and |r| < 1e9: it fits and agrees with units.
        let nanos = (nanos % NANOS_PER_UNIT) as i32;
        Ok(Self::new(currency_code, units, nanos))
    }

    /// `self + other`, both in the same currency.
    pub fn checked_add(&self, other: &Money) -> Result<Money, MoneyError> {
        if self.currency_code != other.currency_code {
            return Err(MoneyError::CurrencyMismatch {
                left: self.currency_code.clone(),
                right: other.currency_code.clone(),
            });
        }
        Self::from_nanos(
            self.currency_code.clone(),
            self.total_nanos() + other.total_nanos(),
        )
    }

    /// `self * quantity`.
    pub fn times(&self, quantity: u32) -> Result<Money, MoneyError> {
        let n = self
            .total_nanos()
            .checked_mul(i128::from(quantity))
            .ok_or(MoneyError::Overflow)?;
        Self::from_nanos(self.currency_code.clone(), n)
    }

    /// The sum of `amounts`, all in `currency_code`.
    pub fn sum<'a>(
        currency_code: &str,
        amounts: impl IntoIterator<Item = &'a Money>,
    ) -> Result<Money, MoneyError> {
        amounts
            .into_iter()
            .try_fold(Money::zero(currency_code), |acc, m| acc.checked_add(m))
    }
}

impl std::fmt::Display for Money {
    /// `12.34 EUR`: cents, truncated (how the confirmation e-mail shows amounts).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cents = self.total_nanos() / 10_000_000;
        let sign = if cents < 0 { "-" } else { "" };
        let cents = cents.abs();
        write!(
            f,
            "{sign}{}.{:02} {}",
            cents / 100,
            cents % 100,
            self.currency_code
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_with_carry_and_multiplies() {
        let a = Money::new("USD", 12, 600_000_000);
        let b = Money::new("USD", 0, 700_000_000);
        assert_eq!(
            a.checked_add(&b).unwrap(),
            Money::new("USD", 13, 300_000_000)
        );
        assert_eq!(a.times(3).unwrap(), Money::new("USD", 37, 800_000_000));
        assert_eq!(a.times(0).unwrap(), Money::zero("USD"));
        let total = Money::sum("USD", [&a, &b, &a]).unwrap();
        assert_eq!(total, Money::new("USD", 25, 900_000_000));
    }

    #[test]
    fn refuses_mixed_currencies_and_overflow() {
        let a = Money::new("USD", 1, 0);
        let b = Money::new("EUR", 1, 0);
        assert!(matches!(
            a.checked_add(&b),
            Err(MoneyError::CurrencyMismatch { .. })
        ));
        assert_eq!(
            Money::new("USD", i64::MAX, 0).times(2),
            Err(MoneyError::Overflow)
        );
    }

    #[test]
    fn negative_amounts_keep_one_sign() {
        let m = Money::from_nanos("EUR", -1_500_000_000).unwrap();
        assert_eq!(m, Money::new("EUR", -1, -500_000_000));
        assert!(m.validate().is_ok());
        assert!(Money::new("EUR", 1, -5).validate().is_err());
        assert!(Money::new("EUR", 0, 1_000_000_000).validate().is_err());
        assert_eq!(m.to_string(), "-1.50 EUR");
    }

    #[test]
    fn reads_the_catalog_spelling() {
        let m: Money = serde_json::from_str(r#"{"currencyCode":"USD","units":124}"#).unwrap();
        assert_eq!(m, Money::new("USD", 124, 0));
        assert_eq!(m.to_string(), "124.00 USD");
    }
}
