//! Live update: `apply` of a changed spec to a running chain, with no request failed.
//!
//! What can change in place is what no other party sees: a function's program (a new
//! binary, also at the same path), arguments, environment, system calls and resource limits,
//! and its scaling bounds within the parties the chain reserved (`scale.max` may shrink, or
//! grow up to what it was). Everything else (routes, functions added or removed, the pool,
//! timeouts, listeners, a `scale.max` beyond the reserved parties) is part of the plan every
//! instance was handed: the chain is **replaced** (blue-green). A new chain comes up beside
//! the old one, in a security domain of its own (pool, uid, cgroup), taking over the old
//! one's listening sockets (the same sockets, so a connection waiting to be accepted is
//! accepted by one or the other, never lost) and its state store; then the old one stops
//! accepting, answers what its open connections still send with `Connection: close`, and
//! shuts down once they are closed (see [`crate::Running::wind_down`]). Chains with MQTT
//! ingress are not replaced (an MQTT session lives in its gateway; see [`replaceable`]).
//!
//! A function whose instances must change is rolled one instance at a time, surge first:
//! a new instance is activated on a spare party (a parked one of the new version, else one
//! with no process: the plan reserves one party beyond `scale.max` for this), and only once
//! it is ready is the old one drained and stopped. Senders prefer ready instances, so the
//! old one gets no new requests, finishes what it has, and stops; whatever reached it
//! after all stays in its queue, which the scaler hands to a new instance. If the new version
//! does not come up, the old one goes back in place and `apply` says why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zerohop_pool::PartyState;
use zerohop_transport::Plan as RoutingPlan;

use crate::confine::{ConfineError, Program};
use crate::parties::{Parties, PartyControl, Want};
use crate::spec::{ChainSpec, FunctionSpec};
use crate::status::ChainView;
use crate::supervise::{Fingerprint, FunctionRun, Launch};

/// How long a new instance gets to become ready during an update.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a changed spec cannot be applied to a running chain, or was not: the chain can
/// neither change in place nor be replaced, a new program cannot be opened, or a new version
/// did not come up (the old one keeps running).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpdateError {
    /// The chain has MQTT ingress, whose sessions live in the gateway.
    #[error(
        "the chain has MQTT ingress, and its clients' sessions (subscriptions, packets in \
         flight) live in the gateway that would be replaced"
    )]
    MqttIngress,
    /// The state store's shape would change.
    #[error(
        "its state store would change from {entries} entries of {value_size} bytes to \
         {new_entries} of {new_value_size}, which loses what it holds"
    )]
    StateShape {
        /// Entries now.
        entries: u32,
        /// Value size now.
        value_size: u32,
        /// Entries the new spec asks for.
        new_entries: u32,
        /// Value size the new spec asks for.
        new_value_size: u32,
    },
    /// A function's new program could not be opened.
    #[error("function '{function}': {source}")]
    Program {
        /// The function.
        function: String,
        /// Why.
        source: ConfineError,
    },
    /// A function's new version exited before it was ready; the old one was put back.
    #[error(
        "function '{function}': the new version exited before it was ready (see `zerohop \
         logs {chain} {function}`); the old version keeps running"
    )]
    Exited {
        /// The chain.
        chain: String,
        /// The function.
        function: String,
    },
    /// A function's new version was not ready in time; the old one was put back.
    #[error(
        "function '{function}': the new version was not ready within {timeout:?} (see \
         `zerohop logs {chain} {function}`); the old version keeps running"
    )]
    NotReady {
        /// The chain.
        chain: String,
        /// The function.
        function: String,
        /// How long it had.
        timeout: Duration,
    },
}

/// What differs between two specs of one chain: the lines to report, and the functions to
/// roll (with their new programs opened).
pub(crate) struct Plan {
    pub changes: Vec<String>,
    roll: Vec<(usize, Program, Option<Fingerprint>)>,
    rescale: bool,
}

impl Plan {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// How a changed spec is applied.
pub(crate) enum Change {
    /// To the running chain ([`ChainView::update`]).
    InPlace(Plan),
    /// By a new chain replacing it; says why.
    Replace(String),
}

/// Whether a chain running `old` can be replaced by one running `new`; `Err` says why not.
pub(crate) fn replaceable(old: &ChainSpec, new: &ChainSpec) -> Result<(), UpdateError> {
    if old.mqtt.is_some() || new.mqtt.is_some() {
        return Err(UpdateError::MqttIngress);
    }
    if let (Some(a), Some(b)) = (old.state, new.state) {
        if (a.entries, a.value_size) != (b.entries, b.value_size) {
            return Err(UpdateError::StateShape {
                entries: a.entries,
                value_size: a.value_size,
                new_entries: b.entries,
                new_value_size: b.value_size,
            });
        }
    }
    Ok(())
}

/// A function spec with everything that may change in place set aside.
fn fixed_part(f: &FunctionSpec) -> FunctionSpec {
    FunctionSpec {
        command: Vec::new(),
        env: Vec::new(),
        syscalls: Vec::new(),
        resources: Default::default(),
        instances: 0,
        scale: crate::spec::ScaleSpec::fixed(0, 0),
        line: 0,
        ..f.clone()
    }
}

/// Names the first part of the chain that differs and cannot change in place.
fn structural(old: &ChainSpec, new: &ChainSpec) -> Option<String> {
    let names = |s: &ChainSpec| {
        s.functions
            .iter()
            .map(|f| f.name.clone())
            .collect::<Vec<_>>()
    };
    if names(old) != names(new) {
        return Some(format!(
            "its functions change ({} -> {})",
            names(old).join(", "),
            names(new).join(", ")
        ));
    }
    if old.routes != new.routes {
        return Some("its routes change".into());
    }
    for (a, b) in old.functions.iter().zip(&new.functions) {
        if fixed_part(a) != fixed_part(b) {
            return Some(format!(
                "function '{}' changes more than its program, arguments, environment, system \
                 calls, resources or scaling (next, calls, headers, state, concurrency or \
                 fan-out are in every instance's plan)",
                a.name
            ));
        }
    }
    let mut what = Vec::new();
    let mut differs = |name: &'static str, changed: bool| {
        if changed {
            what.push(name);
        }
    };
    differs("transport", old.transport != new.transport);
    differs("pool", old.pool != new.pool);
    differs("max_body", old.max_body != new.max_body);
    differs("timeout", old.timeout != new.timeout);
    differs("body_timeout", old.body_timeout != new.body_timeout);
    differs(
        "max_connections",
        old.max_connections != new.max_connections,
    );
    differs(
        "gateway_threads",
        old.gateway_threads != new.gateway_threads,
    );
    differs("mqtt", old.mqtt != new.mqtt || old.mqtt_tls != new.mqtt_tls);
    // New contents of the same files are the running chain's to reload; other files or
    // none are a new chain's.
    differs("tls", old.tls != new.tls);
    differs("coap", old.coap != new.coap);
    differs("state", old.state != new.state);
    differs("listen", old.listen != new.listen);
    if !what.is_empty() {
        let verb = if what.len() == 1 { "changes" } else { "change" };
        return Some(format!("its {} {verb}", what.join(", ")));
    }
    None
}

/// The decision [`ChainView::plan_update`] makes, before any program is opened.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// In place: the lines to report, the functions (by index) whose instances are rolled,
    /// and whether scaling bounds change.
    InPlace {
        changes: Vec<String>,
        roll: Vec<usize>,
        rescale: bool,
    },
    /// By a new chain replacing this one; says why.
    Replace(String),
}

/// Decides how `new` is applied over `old`, given the parties the running chain reserved
/// for each function (`reserved[i]`, one more than its most instances) and whether each
/// function's program file is another build than the one running (`rebuilt[i]`). `Err`:
/// it cannot be applied at all (see [`replaceable`]). A pure function of its arguments.
pub(crate) fn decide(
    old: &ChainSpec,
    new: &ChainSpec,
    reserved: &[usize],
    rebuilt: &[bool],
) -> Result<Decision, UpdateError> {
    let replace = |why: String| replaceable(old, new).map(|()| Decision::Replace(why));
    if let Some(why) = structural(old, new) {
        return replace(why);
    }
    let mut changes = Vec::new();
    let mut roll = Vec::new();
    let mut rescale = false;
    for (i, (a, b)) in old.functions.iter().zip(&new.functions).enumerate() {
        let reserved = reserved.get(i).copied().unwrap_or(0);
        if usize::from(b.scale.max.max(b.instances)) + 1 > reserved {
            return replace(format!(
                "function '{}' would run up to {} instances, beyond the {} the chain \
                 reserved parties for when it came up",
                b.name,
                b.scale.max.max(b.instances),
                reserved.saturating_sub(1)
            ));
        }
        let mut what = Vec::new();
        if a.command != b.command {
            what.push("command");
        }
        if rebuilt.get(i).copied().unwrap_or(false) && a.command.first() == b.command.first() {
            what.push("binary");
        }
        if a.env != b.env {
            what.push("environment");
        }
        if a.syscalls != b.syscalls {
            what.push("system calls");
        }
        if a.resources != b.resources {
            what.push("resources");
        }
        if !what.is_empty() {
            changes.push(format!(
                "function '{}': new {}; rolling its instances",
                b.name,
                what.join(", ")
            ));
            roll.push(i);
        }
        if a.scale != b.scale {
            let (x, y) = (a.scale, b.scale);
            let mut what = Vec::new();
            let mut field = |name: &str, from: String, to: String| {
                if from != to {
                    what.push(format!("{name} {from} -> {to}"));
                }
            };
            field("min", x.min.to_string(), y.min.to_string());
            field("max", x.max.to_string(), y.max.to_string());
            field("target", x.target.to_string(), y.target.to_string());
            field("parked", x.parked.to_string(), y.parked.to_string());
            field(
                "cooldown",
                format!("{:?}", x.cooldown),
                format!("{:?}", y.cooldown),
            );
            field(
                "zero_after",
                format!("{:?}", x.zero_after),
                format!("{:?}", y.zero_after),
            );
            changes.push(format!("function '{}': scale {}", b.name, what.join(", ")));
            rescale = true;
        }
    }
    Ok(Decision::InPlace {
        changes,
        roll,
        rescale,
    })
}

impl ChainView {
    /// What applying `new` over `old` (the spec this chain runs) would do: in place, with
    /// the new programs opened and checked, or by replacing the chain (and why); `Err` says
    /// why it cannot be done at all. The choice is [`decide`]'s.
    pub(crate) fn plan_update(
        &self,
        old: &ChainSpec,
        new: &ChainSpec,
        paths: &[std::path::PathBuf],
    ) -> Result<Change, UpdateError> {
        let s = &self.shared;
        let plan = s.gateways.plan();
        let reserved: Vec<usize> = (0..old.functions.len())
            .map(|i| plan.parties_of(i as u8).len())
            .collect();
        let prints: Vec<Option<Fingerprint>> = paths.iter().map(|p| Fingerprint::of(p)).collect();
        let rebuilt: Vec<bool> = (0..old.functions.len().min(prints.len()))
            .map(|i| prints[i] != s.launch.run(i).fingerprint)
            .collect();
        let (changes, to_roll, rescale) = match decide(old, new, &reserved, &rebuilt)? {
            Decision::Replace(why) => return Ok(Change::Replace(why)),
            Decision::InPlace {
                changes,
                roll,
                rescale,
            } => (changes, roll, rescale),
        };
        let mut roll = Vec::new();
        for i in to_roll {
            let b = &new.functions[i];
            let jail = s.launch.jail();
            let program = Program::open(&paths[i], &b.syscalls, jail).map_err(|source| {
                UpdateError::Program {
                    function: b.name.clone(),
                    source,
                }
            })?;
            roll.push((i, program, prints[i]));
        }
        Ok(Change::InPlace(Plan {
            changes,
            roll,
            rescale,
        }))
    }

    /// What this chain hands over to one replacing it that runs `new` on `listen` (the
    /// address asked for, if any): duplicates of its listening HTTP sockets when the address
    /// stays (none asked for, or the one it listens on, or the one its spec asked for), of
    /// its CoAP socket when the spec's stays, and its state store when `new` has one.
    pub(crate) fn handover(
        &self,
        old: &ChainSpec,
        new: &ChainSpec,
        listen: Option<std::net::SocketAddr>,
    ) -> std::io::Result<crate::Inherit> {
        let s = &self.shared;
        let mut http = s.listeners.dup_http()?;
        let bound = http.first().map(|l| l.local_addr()).transpose()?;
        let same = match listen {
            None => true,
            Some(a) => Some(a) == bound || Some(a) == old.listen,
        };
        if !same {
            http.clear();
        }
        let coap = if old.coap == new.coap {
            s.listeners.dup_coap()?
        } else {
            None
        };
        Ok(crate::Inherit {
            http,
            coap,
            state: if new.state.is_some() {
                s.launch.state().cloned()
            } else {
                None
            },
            data: s.launch.jail().keep_data(),
        })
    }

    /// Carries `plan` out for `new`: scaling bounds first, then each function's instances
    /// rolled one at a time. Returns once every instance runs the new version.
    pub(crate) async fn update(&self, new: &ChainSpec, plan: Plan) -> Result<(), UpdateError> {
        let s = &self.shared;
        if plan.rescale {
            s.scaling.set_all(new.functions.iter().map(|f| f.scale));
        }
        for (i, program, print) in plan.roll {
            let f = &new.functions[i];
            s.scaling.set_rolling(i, true);
            let plan = s.gateways.plan();
            let result = roll(&s.parties, &s.launch, plan, i, f, program, print).await;
            s.scaling.set_rolling(i, false);
            result?;
        }
        Ok(())
    }
}

/// Rolls function `i` of `plan` to a new run (as `f` says, running `program`, whose file
/// has `print`), one serving instance at a time, on the parties the plan reserves for it.
async fn roll(
    parties: &Parties,
    launch: &Launch,
    plan: &RoutingPlan,
    i: usize,
    f: &FunctionSpec,
    program: Program,
    print: Option<Fingerprint>,
) -> Result<(), UpdateError> {
    let old = launch.run(i);
    let generation = old.generation + 1;
    let run = Arc::new(FunctionRun {
        generation,
        program,
        command: f.command.clone(),
        env: f.env.clone(),
        resources: f.resources,
        fingerprint: print,
    });
    launch.set_run(i, run);
    let reserved = plan.parties_of(i as u8);
    let generation_of = |p: u16| parties.get(p).map_or(0, PartyControl::generation);
    // Parked instances are replaced at once (their supervisors look again).
    for &p in &reserved {
        if parties.want_of(p) == Want::Park {
            parties.poke(p);
        }
    }
    let old_serving: Vec<u16> = reserved
        .iter()
        .copied()
        .filter(|&p| parties.want_of(p) == Want::Run && generation_of(p) != generation)
        .collect();
    for p in old_serving {
        if parties.want_of(p) != Want::Run || generation_of(p) == generation {
            continue;
        }
        // The surge instance: a parked one of the new version, else a party with no process.
        let spare = reserved
            .iter()
            .copied()
            .find(|&q| {
                parties.want_of(q) == Want::Park
                    && generation_of(q) == generation
                    && parties.state(q) == PartyState::Parked
            })
            .or_else(|| {
                reserved
                    .iter()
                    .copied()
                    .find(|&q| parties.want_of(q) == Want::Stop && parties.pgid(q) == 0)
            });
        let spare = match spare {
            Some(q) => q,
            None => {
                // Every party serves (the scaler used the spare): this one is replaced in
                // place, drained first; what is sent to it meanwhile waits in its queue.
                parties.set_want(p, Want::Stop);
                wait_stopped(parties, launch.timeout(), p).await;
                p
            }
        };
        let restarts = |q: u16| parties.get(q).map_or(0, PartyControl::restarts);
        let before = restarts(spare);
        crate::scale::activate(parties, spare);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if parties.ready(spare)
                && generation_of(spare) == generation
                && parties.pgid(spare) != 0
            {
                break;
            }
            let failed = restarts(spare) > before;
            if failed || Instant::now() > deadline {
                // Back to the old version: the spare stops, the old instances stay.
                parties.set_want(spare, Want::Stop);
                launch.set_run(i, old.clone());
                for &q in &reserved {
                    if parties.want_of(q) == Want::Park {
                        parties.poke(q);
                    }
                }
                let (chain, function) = (plan.chain.clone(), f.name.clone());
                return Err(if failed {
                    UpdateError::Exited { chain, function }
                } else {
                    UpdateError::NotReady {
                        chain,
                        function,
                        timeout: READY_TIMEOUT,
                    }
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if spare != p {
            // The old instance drains (senders now prefer the new one) and stops.
            parties.set_want(p, Want::Stop);
            wait_stopped(parties, launch.timeout(), p).await;
        }
    }
    Ok(())
}

/// Waits until `party`'s instance is gone (its drain ends within the chain's `timeout` and a
/// second, its stop within a few more).
async fn wait_stopped(parties: &Parties, timeout: Duration, party: u16) {
    let deadline = Instant::now() + timeout + Duration::from_secs(5);
    while parties.pgid(party) != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name: c\nfunctions:\n  upper: { command: [/bin/upper] }\n  \
                        exclaim: { command: [/bin/exclaim], scale: { min: 1, max: 2 } }\n\
                        routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n";

    fn spec(text: &str) -> ChainSpec {
        crate::spec::parse(std::path::Path::new("/tmp/c.yaml"), text).expect("valid spec")
    }

    /// What applying `new` over [`BASE`] decides, with `exclaim` rebuilt or not; the running
    /// chain reserved 2 parties for `upper` (1 instance) and 3 for `exclaim` (max 2).
    /// (Every such change can be applied one way or the other: an `Err` fails the test.)
    fn over_base(new: &str, rebuilt: bool) -> Decision {
        decide(&spec(BASE), &spec(new), &[2, 3], &[false, rebuilt])
            .unwrap_or_else(|e| panic!("cannot be applied: {e}"))
    }

    fn in_place(changes: &[&str], roll: &[usize], rescale: bool) -> Decision {
        Decision::InPlace {
            changes: changes.iter().map(|c| c.to_string()).collect(),
            roll: roll.to_vec(),
            rescale,
        }
    }

    #[test]
    fn what_no_other_party_sees_changes_in_place() {
        assert_eq!(over_base(BASE, false), in_place(&[], &[], false), "nothing");
        assert_eq!(
            over_base(BASE, true),
            in_place(
                &["function 'exclaim': new binary; rolling its instances"],
                &[1],
                false
            ),
            "a rebuilt program at the same path"
        );
        let env = BASE.replace("[/bin/upper] }", "[/bin/upper], env: { K: v } }");
        assert_eq!(
            over_base(&env, false),
            in_place(
                &["function 'upper': new environment; rolling its instances"],
                &[0],
                false
            )
        );
        let cmd = BASE.replace("[/bin/exclaim]", "[/bin/exclaim, -v]");
        assert_eq!(
            over_base(&cmd, true),
            in_place(
                &["function 'exclaim': new command, binary; rolling its instances"],
                &[1],
                false
            ),
            "same program path: a new build is named too"
        );
        let other = BASE.replace("[/bin/exclaim]", "[/bin/shout]");
        assert_eq!(
            over_base(&other, true),
            in_place(
                &["function 'exclaim': new command; rolling its instances"],
                &[1],
                false
            ),
            "another program: its build is no news"
        );
        let scale = BASE.replace("max: 2", "max: 1");
        assert_eq!(
            over_base(&scale, false),
            in_place(
                &["function 'exclaim': scale max 2 -> 1, parked 1 -> 0"],
                &[],
                true
            ),
            "scaling alone rolls nothing"
        );
    }

    #[test]
    fn what_is_in_every_instances_plan_replaces_the_chain() {
        let routes = BASE.replace("POST /hello", "POST /hi");
        assert_eq!(
            over_base(&routes, false),
            Decision::Replace("its routes change".into())
        );
        let timeout = format!("{BASE}timeout: 3s\n");
        assert_eq!(
            over_base(&timeout, false),
            Decision::Replace("its timeout changes".into())
        );
        let renamed = BASE.replace("upper", "lower");
        assert!(matches!(
            over_base(&renamed, false),
            Decision::Replace(why) if why.starts_with("its functions change")
        ));
        let beyond = BASE.replace("max: 2", "max: 3");
        assert!(matches!(
            over_base(&beyond, false),
            Decision::Replace(why) if why.contains("beyond the 2 the chain reserved")
        ));
        // HTTPS from now on (the files are read by the new chain; new contents of the same
        // files are reloaded by the running one, with no spec change).
        let tls = format!("{BASE}tls: {{ cert: a.pem, key: a.key }}\n");
        assert_eq!(
            over_base(&tls, false),
            Decision::Replace("its tls changes".into())
        );
    }

    #[test]
    fn a_chain_that_cannot_be_replaced_says_why() {
        let mqtt = BASE.replace(
            "  - http: POST /hello\n",
            "  - http: POST /hello\n    mqtt: a/b\n",
        ) + "mqtt: { listen: \"127.0.0.1:0\" }\n";
        let with_mqtt = spec(&mqtt);
        let routes = mqtt.replace("POST /hello", "POST /hi");
        let got = decide(&with_mqtt, &spec(&routes), &[2, 3], &[false, false]);
        assert!(
            matches!(&got, Err(why @ UpdateError::MqttIngress)
                if why.to_string().contains("MQTT ingress")),
            "{got:?}"
        );
    }
}
