//! `parking-search`: looks the plate up in the plate store (`PARKING_DB`). A known plate
//! goes on along the route to charge with its stored tariff; an unknown one is forwarded to
//! persist (dynamic routing: `next: [persist]` in the spec).

#![forbid(unsafe_code)]

use std::sync::Mutex;

use zerohop_app_parking::plates::PlateStore;
use zerohop_app_parking::record::Record;
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let store = PlateStore::open_from_env().unwrap_or_else(|e| {
        eprintln!("parking-search: {e}");
        std::process::exit(2)
    });
    // One connection per instance; with `concurrency` above 1 the threads take turns.
    let store = Mutex::new(store);
    run(move |req: &mut Request<'_>| {
        let mut record =
            Record::decode(req.body()).map_err(|e| HandlerError::internal(e.to_string()))?;
        let found = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .find(&record.plate)
            .map_err(|e| HandlerError::new(503, e.to_string()))?;
        record.passed("search");
        record.known = Some(found.is_some());
        record.tariff_cents = found.as_ref().map(|p| p.tariff_cents);
        req.set_body(&record.encode())?;
        Ok(match found {
            Some(_) => Next::Continue,
            None => Next::Forward("persist".into()),
        })
    })
}
