//! The parking workload (being written).
