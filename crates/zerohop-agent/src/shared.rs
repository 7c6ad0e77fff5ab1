//! What the tasks of a running chain share, in parts; each module borrows only the parts
//! it uses (its functions take them, not the whole):
//!
//! - [`Parties`]: per party, the pools it maps and the agent's record of its instance.
//!   Written by the supervisors; read by the scaler, the watchdog, the offence enforcer,
//!   relays, updates and the status.
//! - [`Launch`]: what instances are started from (each function's run, the jail, the plan
//!   they are handed, their logs, the state store) and the chain's timeout. The
//!   supervisors' and relays'; updates put new runs in place.
//! - [`Scaling`]: per function, its bounds now and whether an update rolls it, and the
//!   signal that makes the scaler look. The scaler's (and its wakers'); `zerohop scale`,
//!   updates and the status change or read it.
//! - [`Listeners`]: duplicates of the listening sockets, only for a replacing chain.
//! - The gateways (and the plan), the transport (the queues between parties) and the
//!   offence counts, which the modules' signatures name where they are used.
//!
//! [`Shared`] owns the parts; the chain's tasks are started from it ([`crate::chain`]),
//! each borrowing its parts, and the chain's handles ([`Running`](crate::Running),
//! [`ChainView`](crate::ChainView)) answer from it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use zerohop_gateway::Gateways;
use zerohop_transport::Transport;

use crate::offence::Offences;
use crate::parties::Parties;
use crate::spec::ScaleSpec;
use crate::supervise::{Launch, Supervision};

/// Every part of a running chain.
pub(crate) struct Shared {
    pub parties: Parties,
    pub launch: Launch,
    /// Shared with the scaler's waker threads.
    pub scaling: Arc<Scaling>,
    pub listeners: Listeners,
    pub gateways: Gateways,
    pub transport: Box<dyn Transport>,
    /// Invalid descriptors each party sent to the agent's own parties.
    pub offences: Arc<Offences>,
}

impl Shared {
    /// The parts a party's supervisor (or a relay) works with.
    pub fn supervision(&self) -> Supervision<'_> {
        Supervision {
            parties: &self.parties,
            launch: &self.launch,
            transport: self.transport.as_ref(),
            gateways: &self.gateways,
            offences: &self.offences,
        }
    }
}

/// Per function: its scaling bounds now (`zerohop scale` and live updates change them) and
/// whether a live update is rolling its instances (the scaler does not scale it in
/// meanwhile); and the signal that makes the scaler look again.
pub(crate) struct Scaling {
    bounds: Mutex<Vec<ScaleSpec>>,
    /// Told when `bounds` changed, or a function sent to a party with no ready instance.
    rescale: Notify,
    rolling: Vec<AtomicBool>,
}

impl Scaling {
    /// Functions with these `bounds`, none rolling.
    pub fn new(bounds: Vec<ScaleSpec>) -> Self {
        Self {
            rolling: bounds.iter().map(|_| AtomicBool::new(false)).collect(),
            bounds: Mutex::new(bounds),
            rescale: Notify::new(),
        }
    }

    /// Every function's bounds now.
    pub fn bounds(&self) -> Vec<ScaleSpec> {
        self.bounds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets function `f`'s `min` to `n` and makes the scaler look: its bounds now, or
    /// `Err` with them unchanged when `n` is above its `max`.
    pub fn set_min(&self, f: usize, n: u16) -> Result<ScaleSpec, ScaleSpec> {
        let mut all = self.bounds.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut all[f];
        if n > b.max {
            return Err(*b);
        }
        b.min = n;
        let now = *b;
        drop(all);
        self.rescale.notify_one();
        Ok(now)
    }

    /// Puts new bounds in place (in function order) and makes the scaler look.
    pub fn set_all(&self, new: impl IntoIterator<Item = ScaleSpec>) {
        let mut all = self.bounds.lock().unwrap_or_else(|p| p.into_inner());
        for (b, n) in all.iter_mut().zip(new) {
            *b = n;
        }
        drop(all);
        self.rescale.notify_one();
    }

    /// Makes the scaler look again.
    pub fn rescale(&self) {
        self.rescale.notify_one();
    }

    /// Resolves when the scaler is to look again ([`rescale`](Self::rescale)).
    pub fn rescaled(&self) -> Notified<'_> {
        self.rescale.notified()
    }

    /// Whether a live update is rolling function `f`'s instances.
    pub fn rolling(&self, f: usize) -> bool {
        self.rolling[f].load(Ordering::Relaxed)
    }

    /// Marks function `f` as being rolled by a live update, or no longer.
    pub fn set_rolling(&self, f: usize, rolling: bool) {
        self.rolling[f].store(rolling, Ordering::Relaxed);
    }
}

/// Duplicates of the chain's listening HTTP sockets and its CoAP socket, to hand over to a
/// chain replacing this one ([`crate::ChainView::handover`]).
pub(crate) struct Listeners {
    http: Vec<std::net::TcpListener>,
    coap: Option<std::net::UdpSocket>,
}

impl Listeners {
    /// Keeps `http` and `coap`.
    pub fn new(http: Vec<std::net::TcpListener>, coap: Option<std::net::UdpSocket>) -> Self {
        Self { http, coap }
    }

    /// New duplicates of the listening HTTP sockets.
    pub fn dup_http(&self) -> std::io::Result<Vec<std::net::TcpListener>> {
        self.http
            .iter()
            .map(std::net::TcpListener::try_clone)
            .collect()
    }

    /// A new duplicate of the CoAP socket, if the chain has one.
    pub fn dup_coap(&self) -> std::io::Result<Option<std::net::UdpSocket>> {
        self.coap
            .as_ref()
            .map(std::net::UdpSocket::try_clone)
            .transpose()
    }
}
