//! The motion workload (being written).
