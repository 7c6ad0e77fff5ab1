//! `motion-actuator`: the chain's last function. Does its CPU work (`ACTUATOR_WORK_US`,
//! default 1000), applies the reading to the room's state in chain state (one atomic
//! `update` per reading) and answers the room's light command. `OFF_AFTER_MS` (default
//! 60000) is the quiet time after which a heartbeat turns the light off.

#![forbid(unsafe_code)]

use zerohop_app_motion::actuator::{state_key, Actuator, RoomState};
use zerohop_app_motion::event::encode;
use zerohop_runtime::{run, HandlerError, Next, Request};

fn main() {
    let actuator = Actuator::from_env().unwrap_or_else(|e| {
        eprintln!("motion-actuator: {e}");
        std::process::exit(2)
    });
    run(move |req: &mut Request<'_>| {
        let reading = actuator
            .read(req.body())
            .map_err(|e| HandlerError::bad_request(e.to_string()))?;
        let mut command = None;
        req.state()?.update(&state_key(&reading.room), |old| {
            let (next, c) = actuator.decide(old.and_then(RoomState::decode), &reading);
            command = Some(c);
            Some(next.encode().to_vec())
        })?;
        let command = command.ok_or_else(|| HandlerError::internal("state update did not run"))?;
        req.set_body(&encode(&command))?;
        Ok(Next::Continue)
    })
}
