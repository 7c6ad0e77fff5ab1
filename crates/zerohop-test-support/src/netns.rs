//! Hosts for tests that cross a network: network namespaces on one machine, each joined by a
//! veth pair to a bridge in the test's own namespace, on a /24 of their own.
//!
//! ```text
//!   test's namespace: bridge zhbNNN  10.X.Y.1/24
//!      |-- veth --> namespace zh-NNN-0: eth0 10.X.Y.11/24 (default route via .1)
//!      |-- veth --> namespace zh-NNN-1: eth0 10.X.Y.12/24
//! ```
//!
//! Everything is removed when the [`Network`] drops (the namespaces take their veth ends with
//! them), also when the test panics. Needs root and `ip` (iproute2).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Networks made by this process (they number their names and subnets).
static MADE: AtomicU32 = AtomicU32::new(0);

/// A bridge and its hosts.
pub struct Network {
    bridge: String,
    prefix: String,
    hosts: Vec<Host>,
}

/// One host: a network namespace with one interface on the bridge.
#[derive(Clone, Debug)]
pub struct Host {
    /// The namespace's name (`ip netns`).
    pub netns: String,
    /// Its address on the bridge.
    pub ip: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e} (install iproute2)"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Network {
    /// Makes a bridge and `n` hosts on it.
    pub fn create(n: usize) -> Self {
        // Relaxed: only a number no other network of this process has; it orders nothing.
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // A subnet per network of this process: 10.(200+k%50).(pid%250).0/24.
        let prefix = format!("10.{}.{}", 200 + k % 50, pid % 250);
        let tag = format!("{}{}", pid % 100_000, k);
        let bridge = format!("zhb{tag}");
        let mut net = Self {
            bridge: bridge.clone(),
            prefix: prefix.clone(),
            hosts: Vec::new(),
        };
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{prefix}.1/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 0..n {
            let netns = format!("zh-{tag}-{i}");
            let outside = format!("zhv{tag}{i}");
            ip(&["netns", "add", &netns]);
            // Pushed before the rest, so that a failure below still removes it.
            let host = Host {
                netns: netns.clone(),
                ip: format!("{prefix}.{}", 11 + i),
            };
            net.hosts.push(host.clone());
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ]);
            ip(&["link", "set", &outside, "master", &bridge]);
            ip(&["link", "set", &outside, "up"]);
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{}/24", host.ip),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &netns, "link", "set", "eth0", "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                &netns,
                "route",
                "add",
                "default",
                "via",
                &format!("{prefix}.1"),
            ]);
        }
        net
    }

    /// The bridge's own address: the test's namespace as the hosts see it.
    pub fn gateway_ip(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// The hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
}

impl Host {
    /// A command that runs `program` in this host's network namespace (only the network
    /// namespace changes: files, cgroups and users are the test's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", &h.netns]).status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}
