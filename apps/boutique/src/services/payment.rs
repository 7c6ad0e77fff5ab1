//! payment: charges a card, as the original does: the number must pass the Luhn check and
//! be a VISA or MasterCard number, the card must not have expired, and the amount must be
//! positive. Nothing is charged for real; the answer is a transaction id.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::money::Money;
use crate::rng;
use crate::rpc::{parse, reply, Service, ServiceError};

/// A card.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditCard {
    /// Digits, spaces and dashes allowed (`4432-8015-6152-0454`).
    pub credit_card_number: String,
    /// Security code.
    pub credit_card_cvv: String,
    /// Four-digit year.
    pub credit_card_expiration_year: i32,
    /// 1 to 12.
    pub credit_card_expiration_month: u32,
}

/// A charge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// How much.
    pub amount: Money,
    /// Which card.
    pub credit_card: CreditCard,
}

/// A charge that went through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charged {
    /// Id of the transaction.
    pub transaction_id: String,
}

/// Card networks accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CardType {
    /// Numbers starting with 4.
    Visa,
    /// Numbers starting with 51-55 or 2221-2720.
    MasterCard,
}

/// Whether `digits` (ASCII digits only) pass the Luhn check.
pub fn luhn_ok(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(d - b'0');
            match (i % 2 == 1, d * 2) {
                (false, _) => d,
                (true, dd) if dd > 9 => dd - 9,
                (true, dd) => dd,
            }
        })
        .sum();
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// The card's network, or why the number is refused.
pub fn card_type(number: &str) -> Result<CardType, ServiceError> {
    let digits: Vec<u8> = number
        .bytes()
        .filter(|b| !matches!(b, b' ' | b'-'))
        .collect();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ServiceError::bad_request(
            "credit card number must be digits",
        ));
    }
    if !(13..=19).contains(&digits.len()) || !luhn_ok(&digits) {
        return Err(ServiceError::bad_request("credit card number is invalid"));
    }
    let prefix = |n: usize| {
        std::str::from_utf8(&digits[..n])
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0)
    };
    if digits[0] == b'4' && matches!(digits.len(), 13 | 16 | 19) {
        Ok(CardType::Visa)
    } else if digits.len() == 16
        && ((51..=55).contains(&prefix(2)) || (2221..=2720).contains(&prefix(4)))
    {
        Ok(CardType::MasterCard)
    } else {
        Err(ServiceError::bad_request(
            "only VISA or MasterCard cards are accepted",
        ))
    }
}

/// This year and month (UTC), from the system clock.
pub fn current_year_month() -> (i32, u32) {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (y, m, _) = civil_from_days(days);
    (y, m)
}

/// Year, month, day of the day `days` after 1970-01-01 (proleptic Gregorian; the
/// era-based algorithm of H. Hinnant's "chrono-compatible low-level date algorithms").
fn civil_from_days(days: i64) -> (i32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y as i32, m, d)
}

/// Checks the card and the amount at `now` (year, month).
pub fn check(req: &Request, now: (i32, u32)) -> Result<CardType, ServiceError> {
    req.amount.validate()?;
    if req.amount.total_nanos() <= 0 {
        return Err(ServiceError::bad_request("amount must be positive"));
    }
    let kind = card_type(&req.credit_card.credit_card_number)?;
    let (year, month) = (
        req.credit_card.credit_card_expiration_year,
        req.credit_card.credit_card_expiration_month,
    );
    if !(1..=12).contains(&month) {
        return Err(ServiceError::bad_request(
            "expiration month must be 1 to 12",
        ));
    }
    if i64::from(year) * 12 + i64::from(month) < i64::from(now.0) * 12 + i64::from(now.1) {
        return Err(ServiceError::bad_request(format!(
            "the card expired in {month:02}/{year}"
        )));
    }
    Ok(kind)
}

/// Serves one call.
pub fn handle(input: &[u8]) -> Result<Vec<u8>, ServiceError> {
    let req: Request = parse(Service::Payment, input)?;
    check(&req, current_year_month())?;
    reply(&Charged {
        transaction_id: rng::uuid(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(number: &str, year: i32, month: u32) -> Request {
        Request {
            amount: Money::new("EUR", 10, 0),
            credit_card: CreditCard {
                credit_card_number: number.into(),
                credit_card_cvv: "672".into(),
                credit_card_expiration_year: year,
                credit_card_expiration_month: month,
            },
        }
    }

    #[test]
    fn luhn_and_networks() {
        assert!(luhn_ok(b"4432801561520454"));
        assert!(!luhn_ok(b"4432801561520455"));
        assert_eq!(card_type("4432-8015-6152-0454"), Ok(CardType::Visa));
        assert_eq!(card_type("5555 5555 5555 4444"), Ok(CardType::MasterCard));
        assert_eq!(card_type("2221000000000009"), Ok(CardType::MasterCard));
        // A valid American Express number: Luhn passes, the network is refused.
        assert!(card_type("378282246310005")
            .unwrap_err()
            .message
            .contains("VISA"));
        assert!(card_type("4432-8015-6152-0455").is_err());
        assert!(card_type("abcd").is_err());
    }

    #[test]
    fn expiry_is_checked_against_the_month() {
        let now = (2030, 6);
        assert!(check(&charge("4432801561520454", 2030, 6), now).is_ok());
        assert!(check(&charge("4432801561520454", 2031, 1), now).is_ok());
        assert!(check(&charge("4432801561520454", 2030, 5), now).is_err());
        assert!(check(&charge("4432801561520454", 2031, 13), now).is_err());
        let mut free = charge("4432801561520454", 2031, 1);
        free.amount = Money::zero("EUR");
        assert!(check(&free, now).is_err());
    }

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        let (y, m) = current_year_month();
        assert!(y >= 2024 && (1..=12).contains(&m));
    }
}
