//! `motion-sensor`: the chain's first function. Reads the event and its topic
//! (`mqtt-topic`), does the sensor's CPU work (`SENSOR_WORK_US`, default 1000) and passes
//! the reading on to the actuator.

#![forbid(unsafe_code)]

use zerohop_app_motion::sensor::Sensor;
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let sensor = Sensor::from_env().unwrap_or_else(|e| {
        eprintln!("motion-sensor: {e}");
        std::process::exit(2)
    });
    run(move |req: &mut Request<'_>| {
        let reading = sensor
            .sense(req.header("mqtt-topic"), req.body())
            .map_err(|e| HandlerError::bad_request(e.to_string()))?;
        req.set_body(&reading)?;
        Ok(Next::Continue)
    })
}
