//! The parking workload: SPRIGHT's "image detection & charging" on zerohop. A camera's
//! snapshot of a spot runs through detection (the plate; a stand-in for the model), plate
//! search (an SQLite store) and charge; a plate the store does not know takes a detour through
//! persist, by dynamic routing:
//!
//! ```text
//! known plate:    detection -> search -------------> charge
//! new plate:      detection -> search -> persist -> charge
//! ```
//!
//! * [`snapshot`]: the synthesised ~3 KB snapshots; [`lot`]: the synthesised parking lot
//!   (which cars stay between bursts).
//! * [`record`]: what travels after detection and what the camera gets back; the tariffs.
//! * [`plates`]: the SQLite plate store; [`work`]: stand-in CPU work.
//! * [`cam`], [`coap`]: the camera generator `parking-cam` (HTTP keep-alive, CoAP block-wise).
//!
//! No `unsafe`. See `apps/parking/README.md` for the chain spec and how to run it.

#![forbid(unsafe_code)]

pub mod cam;
pub mod coap;
pub mod lot;
pub mod plates;
pub mod record;
pub mod snapshot;
pub use zerohop_app_common::work;
