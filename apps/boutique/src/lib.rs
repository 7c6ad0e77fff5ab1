//! The boutique workload (being written).
