//! End-to-end tests of zerohop live in `tests/`; `zerohop-testfn` is the configurable
//! function they run (its behaviour comes from `TESTFN_MODE` in the spec's `env`).

#![forbid(unsafe_code)]
