//! `parking-charge`: charges the period's fee from the plate's tariff (as the store has it,
//! carried in the record by search or persist) and answers the camera with the record.

#![forbid(unsafe_code)]

use zerohop_app_parking::record::Record;
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    run(move |req: &mut Request<'_>| {
        let mut record =
            Record::decode(req.body()).map_err(|e| HandlerError::internal(e.to_string()))?;
        let tariff = record.tariff_cents.ok_or_else(|| {
            HandlerError::internal(format!(
                "no tariff for {} from search or persist",
                record.plate
            ))
        })?;
        record.charge_cents = Some(tariff);
        record.passed("charge");
        req.set_body(&record.encode())?;
        Ok(Next::Continue)
    })
}
