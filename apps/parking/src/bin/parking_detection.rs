//! `parking-detection`: the chain's first function. Reads the plate off the snapshot (a
//! stand-in for the detection model: `DETECT_WORK_MS` of CPU per snapshot, default SPRIGHT's
//! 435) and replaces the ~3 KB image with the small record the rest of the chain works on.

#![forbid(unsafe_code)]

use zerohop_app_parking::record::Record;
use zerohop_app_parking::snapshot::{Snapshot, SnapshotError};
use zerohop_app_parking::work;
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let model = work::millis_from_env("DETECT_WORK_MS", 435).unwrap_or_else(|e| {
        eprintln!("parking-detection: {e}");
        std::process::exit(2)
    });
    run(move |req: &mut Request<'_>| {
        let snap = Snapshot::decode(req.body()).map_err(|e| match e {
            SnapshotError::NoPlate(_) => HandlerError::new(422, e.to_string()),
            _ => HandlerError::bad_request(e.to_string()),
        })?;
        // The model looks at every pixel: fold the image in, then the rest of its time.
        let pixels = req
            .body()
            .iter()
            .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
        work::burn(model, pixels);
        let mut record = Record {
            camera: snap.camera,
            spot: snap.spot,
            plate: snap.plate,
            t_ms: snap.t_ms,
            path: Vec::new(),
            known: None,
            tariff_cents: None,
            charge_cents: None,
        };
        record.passed("detection");
        req.set_body(&record.encode())?;
        Ok(Next::Continue)
    })
}
