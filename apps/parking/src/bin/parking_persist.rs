//! `parking-persist`: registers a plate the store did not know (its tariff by
//! `tariff_for`, first seen now, at this spot) and forwards the request to charge
//! (`next: [charge]` in the spec).

#![forbid(unsafe_code)]

use std::sync::Mutex;

use zerohop_app_parking::plates::{Plate, PlateStore};
use zerohop_app_parking::record::{tariff_for, Record};
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let store = PlateStore::open_from_env().unwrap_or_else(|e| {
        eprintln!("parking-persist: {e}");
        std::process::exit(2)
    });
    let store = Mutex::new(store);
    run(move |req: &mut Request<'_>| {
        let mut record =
            Record::decode(req.body()).map_err(|e| HandlerError::internal(e.to_string()))?;
        let (stored, _registered) = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(&Plate {
                plate: record.plate.clone(),
                tariff_cents: tariff_for(&record.plate),
                first_seen_ms: record.t_ms,
                first_spot: record.spot,
            })
            .map_err(|e| HandlerError::new(503, e.to_string()))?;
        record.passed("persist");
        record.tariff_cents = Some(stored.tariff_cents);
        req.set_body(&record.encode())?;
        Ok(Next::Forward("charge".into()))
    })
}
