//! The motion workload: SPRIGHT's "indoor motion detection for automated lighting" on
//! zerohop, with the HTTP-microservice baseline it is compared against and a generator that
//! replays a synthesised motion trace.
//!
//! * [`event`]: the messages (sensor event, reading, light command) and topics.
//! * [`sensor`], [`actuator`]: the two functions' logic, shared by the zerohop functions
//!   (`motion-sensor`, `motion-actuator`) and the baseline servers ([`baseline`],
//!   `motion-http`); [`work`] is their stand-in CPU work.
//! * [`trace`]: the synthesised trace and the commands a correct actuator answers to it.
//! * [`replay`], [`procstat`]: the generator `motion-gen` (response times per second, CPU of
//!   the deployment from /proc).
//!
//! No `unsafe`. See `apps/motion/README.md` for the chain spec and how to run it.

#![forbid(unsafe_code)]

pub mod actuator;
pub mod baseline;
pub mod event;
pub mod procstat;
pub mod replay;
pub mod sensor;
pub mod trace;
pub use zerohop_app_common::work;
