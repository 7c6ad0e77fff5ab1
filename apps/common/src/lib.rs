//! What the workloads of `apps/` share.
//!
//! [`work`]: busy CPU work standing in for a function's real processing (SPRIGHT's motion
//! functions take 1 ms of CPU each, the parking detection model 435 ms per snapshot).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod work;
