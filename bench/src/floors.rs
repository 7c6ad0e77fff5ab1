//! Physical floors of this machine and the transports' descriptor hops, measured in the same
//! run as the end-to-end benchmarks (numbers on this VM vary by about ±50% from run to run, so
//! a report compares against floors taken minutes apart, never against constants).
//!
//! Every `*_rtt` is a round trip between **two processes**: this one (the timed side, on a
//! thread of its own) and a peer made by re-running this executable with
//! `ZEROHOP_BENCH_FLOOR_PEER` set and its file descriptors mapped to 3, 4, ... (see
//! [`maybe_run_echo_role`], which every binary or test calling [`measure`] must call first).
//! With two or more CPUs online the timed thread runs on CPU 0 and the peer on CPU 1. Each
//! round trip is timed on its own with [`std::time::Instant`] (vDSO `clock_gettime`; an empty
//! timed region reads ~30 ns here, included in every sample), after a warm-up; p50 and p99
//! are exact nearest-rank percentiles of the samples.
//!
//! | floor | how |
//! |---|---|
//! | `cacheline_rtt` | a counter on one 64-byte line of a shared memfd, both sides busy-polling |
//! | `futex_rtt` | two futex words in a shared memfd, `FUTEX_WAIT`/`FUTEX_WAKE` (shared), both sides sleep |
//! | `eventfd_rtt` | two eventfds, blocking `read`s |
//! | `unix_socket_rtt` | a unix `SOCK_SEQPACKET` socketpair, 16-byte messages, blocking |
//! | `memcpy_64KiB`, `memcpy_1MiB` | one thread copying between two warm buffers |
//! | `hop_ring_busy_rtt` | the `ring` transport, receivers spinning (never sleep) |
//! | `hop_ring_asleep_rtt` | the `ring` transport with no spin: every receive sleeps on the futex |
//! | `hop_socket_busy_rtt` | the `socket` transport, back-to-back round trips |
//! | `hop_socket_asleep_rtt` | the `socket` transport, receivers blocked in `poll` |
//!
//! The sleeping floors (futex, eventfd, unix socket, `*_asleep`) pause [`PAUSE`] before each
//! round trip (not timed), so that both sides are really asleep, their CPUs idle, when the
//! message arrives: that is the cost an idle chain pays, and the pause makes them comparable.
//!
//! Limits: a peer that does not answer for 5 s is killed and the measurement fails; every
//! peer is killed and reaped on every path (module `peer`). `unsafe` (in module `sys` only):
//! `sched_setaffinity`, futex, eventfd, socketpair, `prctl`, inherited fds, atomics in a
//! shared mapping.

mod cacheline;
mod eventfd;
mod futex;
mod hop;
mod memcpy;
mod peer;
mod sys;
mod unix_socket;

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use zerohop_transport::Backend;

use crate::percentile::nearest_rank;

/// One measured floor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Floor {
    /// Stable name, e.g. `cacheline_rtt`, `memcpy_64KiB`, `hop_ring_busy_rtt`.
    pub name: String,
    /// One line: what was measured, between what (processes, pinned CPUs).
    pub what: String,
    /// Median, nanoseconds (per round trip, or per copy).
    pub p50_ns: f64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: f64,
    /// Timed samples (warm-up excluded).
    pub samples: u64,
    /// Copy bandwidth from the median (memcpy floors only), GB/s (10^9 bytes per second).
    pub gb_per_s: Option<f64>,
}

impl Floor {
    /// A floor from raw nanosecond samples; `bytes` per sample gives `gb_per_s`.
    fn from_samples(name: &str, what: String, samples: &mut [u64], bytes: Option<usize>) -> Self {
        samples.sort_unstable();
        let p50_ns = ns(nearest_rank(samples, 0.5));
        Floor {
            name: name.to_owned(),
            what,
            p50_ns,
            p99_ns: ns(nearest_rank(samples, 0.99)),
            samples: samples.len() as u64,
            // bytes per nanosecond = GB/s.
            gb_per_s: bytes.map(|b| b as f64 / p50_ns.max(1.0)),
        }
    }
}

/// A percentile of nanosecond samples as reported (0 when there were none).
fn ns(sample: Option<u64>) -> f64 {
    sample.map_or(0.0, |v| v as f64)
}

/// Pause before each round trip of the sleeping floors (not timed).
pub const PAUSE: Duration = Duration::from_micros(200);

/// How many round trips (or copies) one floor times.
#[derive(Clone, Copy, Debug)]
struct Counts {
    /// Untimed, first: peer start-up, page faults, caches, frequency.
    warmup: usize,
    /// Timed.
    samples: usize,
}

/// Sample counts of one run.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Polling floors and back-to-back hops.
    busy: Counts,
    /// Floors with a [`PAUSE`] before each round trip.
    asleep: Counts,
    /// `memcpy_64KiB`.
    copy_small: Counts,
    /// `memcpy_1MiB`.
    copy_large: Counts,
}

impl Plan {
    fn new(quick: bool) -> Self {
        // Quick: ~4 s in all on this machine; full: ~21 s (10x the busy samples, 5x the
        // sleeping ones, whose ~250 us each are dominated by the pause).
        let k = if quick { 1 } else { 10 };
        let a = if quick { 1 } else { 5 };
        Plan {
            busy: Counts {
                warmup: 2_000 * k,
                samples: 20_000 * k,
            },
            asleep: Counts {
                warmup: 100 * a,
                samples: 2_000 * a,
            },
            copy_small: Counts {
                warmup: 200,
                samples: 20_000 * k,
            },
            copy_large: Counts {
                warmup: 20,
                samples: 2_000 * k,
            },
        }
    }
}

/// Where the two sides of a round trip run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pinning {
    /// The timed thread on `parent`, the peer process on `peer`.
    Cpus { parent: usize, peer: usize },
    /// Not pinned: fewer than two CPUs online.
    Unpinned { online: usize },
}

impl Pinning {
    fn detect() -> Self {
        match sys::online_cpus() {
            n if n >= 2 => Pinning::Cpus { parent: 0, peer: 1 },
            n => Pinning::Unpinned { online: n },
        }
    }

    /// For the peer's environment.
    fn encode(self) -> String {
        match self {
            Pinning::Cpus { parent, peer } => format!("{parent},{peer}"),
            Pinning::Unpinned { online } => format!("-{online}"),
        }
    }

    fn decode(s: &str) -> Result<Self> {
        let bad = || anyhow!("bad pinning {s:?}");
        if let Some(online) = s.strip_prefix('-') {
            return Ok(Pinning::Unpinned {
                online: online.parse().map_err(|_| bad())?,
            });
        }
        let (a, b) = s.split_once(',').ok_or_else(bad)?;
        Ok(Pinning::Cpus {
            parent: a.parse().map_err(|_| bad())?,
            peer: b.parse().map_err(|_| bad())?,
        })
    }

    /// Lets the calling thread run on both CPUs: a ring receiver created on a thread that
    /// may run on one CPU only never spins (it would keep its sender off that CPU), and a
    /// peer started from it would begin life on the parent's CPU.
    fn widen(self) -> Result<()> {
        match self {
            Pinning::Cpus { parent, peer } => sys::set_affinity(&[parent, peer])
                .with_context(|| format!("allowing this thread CPUs {parent} and {peer}")),
            Pinning::Unpinned { .. } => Ok(()),
        }
    }

    /// Pins the calling (timed) thread.
    fn pin_parent(self) -> Result<()> {
        match self {
            Pinning::Cpus { parent, .. } => sys::set_affinity(&[parent])
                .with_context(|| format!("pinning the timed thread to CPU {parent}")),
            Pinning::Unpinned { .. } => Ok(()),
        }
    }

    /// Pins the calling peer thread.
    fn pin_peer(self) -> Result<()> {
        match self {
            Pinning::Cpus { peer, .. } => sys::set_affinity(&[peer])
                .with_context(|| format!("pinning the peer to CPU {peer}")),
            Pinning::Unpinned { .. } => Ok(()),
        }
    }

    /// For `what`: where the two processes ran.
    fn two_processes(self) -> String {
        match self {
            Pinning::Cpus { parent, peer } => {
                format!("two processes pinned to CPU {parent} and CPU {peer}")
            }
            Pinning::Unpinned { online } => {
                format!("two processes, not pinned ({online} CPU online)")
            }
        }
    }

    /// For `what`: where the single-threaded floors ran.
    fn one_thread(self) -> String {
        match self {
            Pinning::Cpus { parent, .. } => format!("one thread pinned to CPU {parent}"),
            Pinning::Unpinned { online } => {
                format!("one thread, not pinned ({online} CPU online)")
            }
        }
    }
}

/// Which floor, in report order.
/// Names of every floor [`measure`] reports, in order.
pub fn names() -> Vec<String> {
    Which::ALL.iter().map(|&w| w.name()).collect()
}

#[derive(Clone, Copy, Debug)]
enum Which {
    Cacheline,
    Futex,
    Eventfd,
    UnixSocket,
    Memcpy { bytes: usize, name: &'static str },
    Hop { backend: Backend, busy: bool },
}

impl Which {
    const ALL: [Which; 13] = [
        Which::Cacheline,
        Which::Futex,
        Which::Eventfd,
        Which::UnixSocket,
        Which::Memcpy {
            bytes: 64 << 10,
            name: "memcpy_64KiB",
        },
        Which::Memcpy {
            bytes: 1 << 20,
            name: "memcpy_1MiB",
        },
        Which::Hop {
            backend: Backend::Ring,
            busy: true,
        },
        Which::Hop {
            backend: Backend::Ring,
            busy: false,
        },
        Which::Hop {
            backend: Backend::Socket,
            busy: true,
        },
        Which::Hop {
            backend: Backend::Socket,
            busy: false,
        },
        Which::Hop {
            backend: Backend::Poll,
            busy: true,
        },
        Which::Hop {
            backend: Backend::Sockmap,
            busy: true,
        },
        Which::Hop {
            backend: Backend::Sockmap,
            busy: false,
        },
    ];

    fn name(self) -> String {
        match self {
            Which::Cacheline => "cacheline_rtt".into(),
            Which::Futex => "futex_rtt".into(),
            Which::Eventfd => "eventfd_rtt".into(),
            Which::UnixSocket => "unix_socket_rtt".into(),
            Which::Memcpy { name, .. } => name.into(),
            Which::Hop { backend, busy } => {
                format!("hop_{backend}_{}_rtt", if busy { "busy" } else { "asleep" })
            }
        }
    }

    fn measure(self, plan: &Plan, pinning: Pinning) -> Result<Floor> {
        let name = self.name();
        match self {
            Which::Cacheline => cacheline::measure(&name, plan, pinning),
            Which::Futex => futex::measure(&name, plan, pinning),
            Which::Eventfd => eventfd::measure(&name, plan, pinning),
            Which::UnixSocket => unix_socket::measure(&name, plan, pinning),
            Which::Memcpy { bytes, .. } => {
                let counts = if bytes > 256 << 10 {
                    plan.copy_large
                } else {
                    plan.copy_small
                };
                memcpy::measure(&name, bytes, counts, pinning)
            }
            Which::Hop { backend, busy } => hop::measure(&name, plan, pinning, backend, busy),
        }
    }
}

/// Measures every floor, in a fixed order, calling `progress("floors: NAME")` before each.
/// `quick` takes ~4 s here (20k busy and 2k sleeping round trips per floor), the full run
/// ~21 s. Fails on the first floor that cannot be measured (peer not answering, pinning
/// refused), with no peer process left behind.
///
/// Each floor runs on a fresh thread of its own, so the caller's thread keeps its CPU
/// affinity.
pub fn measure(quick: bool, progress: &mut dyn FnMut(&str)) -> Result<Vec<Floor>> {
    let plan = Plan::new(quick);
    let pinning = Pinning::detect();
    let mut floors = Vec::with_capacity(Which::ALL.len());
    for which in Which::ALL {
        let name = which.name();
        progress(&format!("floors: {name}"));
        let floor = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("zerohop-floors".into())
                .spawn_scoped(s, || {
                    pinning.widen()?;
                    which.measure(&plan, pinning)
                })
                .context("starting the measuring thread")?
                .join()
                .map_err(|_| anyhow!("the measuring thread panicked"))?
        })
        .with_context(|| format!("measuring {name}"))?;
        floors.push(floor);
    }
    Ok(floors)
}

/// Call this first thing in `main` (and first in every test of a binary that calls
/// [`measure`]): when this process is a floor peer (`ZEROHOP_BENCH_FLOOR_PEER` is set) it runs
/// the echo side of one measurement and exits the process (0 when told to quit, 2 with a
/// message on stderr on error). Otherwise it returns at once.
pub fn maybe_run_echo_role() {
    if let Some(code) = peer::run_if_peer() {
        std::process::exit(code);
    }
}
