//! What the run reports: the JSON document on stdout (one [`Point`] per instance count) and
//! its Markdown table (`--markdown`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use zerohop_bench::procstat::memory::KindStat;
use zerohop_bench::report::{Machine, Table};

#[derive(Serialize)]
pub(crate) struct Report {
    pub(crate) machine: Machine,
    pub(crate) settings: Settings,
    pub(crate) points: Vec<Point>,
    pub(crate) ok: bool,
}

#[derive(Serialize)]
pub(crate) struct Settings {
    pub(crate) idle_seconds: f64,
    pub(crate) load_seconds: f64,
    pub(crate) concurrency: usize,
    pub(crate) body_bytes: usize,
    pub(crate) gateway_threads: u32,
    pub(crate) pool: &'static str,
}

/// One instance count.
#[derive(Serialize, Default)]
pub(crate) struct Point {
    pub(crate) instances: usize,
    pub(crate) functions: usize,
    /// Instances of each function, in chain order.
    pub(crate) per_function: Vec<usize>,
    pub(crate) ok: bool,
    pub(crate) error: Option<String>,
    /// Spawn to the ready line, seconds.
    pub(crate) ready_s: Option<f64>,
    pub(crate) startup: Option<Startup>,
    pub(crate) memory_at_ready: Option<Memory>,
    pub(crate) memory_after_load: Option<Memory>,
    pub(crate) idle_before_load: Option<Idle>,
    pub(crate) idle_after_load: Option<Idle>,
    pub(crate) load: Option<LoadResult>,
    pub(crate) stop: Option<Stop>,
}

/// When things happened during startup (instance start times from /proc, 10 ms ticks).
#[derive(Serialize)]
pub(crate) struct Startup {
    /// First instance started, seconds after zerohop started.
    pub(crate) first_instance_s: f64,
    /// Last instance started, seconds after zerohop started (the spawn loop's length).
    pub(crate) last_instance_s: f64,
    /// From the last instance's start to the ready line, seconds (attach + wait loop).
    pub(crate) ready_after_last_spawn_s: f64,
    /// CPU the agent used until ready (all its threads), seconds.
    pub(crate) agent_cpu_s: f64,
    /// Of which in the kernel, seconds.
    pub(crate) agent_sys_s: f64,
    /// CPU of all instances until ready (fork child set-up, exec, attach), seconds.
    pub(crate) instances_cpu_s: f64,
    /// Of which in the kernel, seconds.
    pub(crate) instances_sys_s: f64,
}

/// Memory of the instances and of the agent at one moment.
#[derive(Serialize)]
pub(crate) struct Memory {
    pub(crate) instances_found: usize,
    pub(crate) private_kib_mean: f64,
    pub(crate) private_kib_max: u64,
    pub(crate) pss_kib_mean: f64,
    pub(crate) rss_kib_mean: f64,
    pub(crate) rss_kib_max: u64,
    /// Page tables (VmPTE), which smaps does not count.
    pub(crate) page_tables_kib_mean: f64,
    /// Private KiB per instance by kind of mapping (mean over instances).
    pub(crate) private_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Rss KiB per instance by kind of mapping (mean over instances).
    pub(crate) rss_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Mappings per instance by kind (mean over instances): how many ring regions each maps.
    pub(crate) mappings_by_kind_mean: BTreeMap<String, f64>,
    /// Mapped (virtual) KiB per instance by kind (mean over instances).
    pub(crate) mapped_by_kind_kib_mean: BTreeMap<String, f64>,
    /// Open descriptors per instance (mean).
    pub(crate) fds_mean: f64,
    pub(crate) agent: Agent,
    pub(crate) shared: Shared,
    /// A few instances broken down per mapping kind.
    pub(crate) samples: Vec<Sample>,
}

#[derive(Serialize)]
pub(crate) struct Agent {
    pub(crate) pid: u32,
    pub(crate) rss_kib: u64,
    pub(crate) private_kib: u64,
    pub(crate) pss_kib: u64,
    pub(crate) page_tables_kib: u64,
    pub(crate) fds: usize,
    pub(crate) mappings: usize,
    pub(crate) threads: u64,
    pub(crate) by_kind: BTreeMap<String, KindStat>,
}

/// The chain's shared memory: the memfds the agent holds.
#[derive(Serialize, Default)]
pub(crate) struct Shared {
    pub(crate) pool_memfds: usize,
    pub(crate) pool_kib: u64,
    pub(crate) ring_memfds: usize,
    pub(crate) ring_kib: u64,
    pub(crate) outbox_memfds: usize,
    pub(crate) outbox_kib: u64,
    pub(crate) inbox_memfds: usize,
    pub(crate) inbox_kib: u64,
    /// Largest outbox, KiB.
    pub(crate) outbox_kib_max: u64,
    pub(crate) other_memfds: usize,
    pub(crate) other_kib: u64,
    /// Descriptors of memfds the agent holds (each region has a read-write and a read-only
    /// one).
    pub(crate) memfd_fds: usize,
    /// Resident shared memory of the chain: sum of `Pss_Shmem` over the agent and every
    /// instance (each resident page counted once), KiB.
    pub(crate) resident_shmem_kib: u64,
    /// Resident pool memory: the agent maps every pool whole and writes every slot it
    /// hands out, so its Rss of the pool mappings, KiB.
    pub(crate) pool_resident_kib: u64,
    /// `resident_shmem_kib - pool_resident_kib`: the rings' resident memory, KiB.
    pub(crate) ring_resident_kib: u64,
    /// Rss of the ring mappings in the agent alone, KiB.
    pub(crate) agent_ring_rss_kib: u64,
    /// `Shmem` of /proc/meminfo now minus before zerohop started (whole machine), KiB.
    pub(crate) meminfo_shmem_delta_kib: i64,
}

#[derive(Serialize)]
pub(crate) struct Sample {
    pub(crate) pid: u32,
    pub(crate) function: String,
    pub(crate) private_kib: u64,
    pub(crate) rss_kib: u64,
    pub(crate) page_tables_kib: u64,
    pub(crate) by_kind: BTreeMap<String, KindStat>,
    /// The mappings with the most private memory (name, permissions, KiB).
    pub(crate) top_private: Vec<TopMapping>,
}

#[derive(Serialize)]
pub(crate) struct TopMapping {
    pub(crate) name: String,
    pub(crate) perms: String,
    pub(crate) size_kib: u64,
    pub(crate) rss_kib: u64,
    pub(crate) private_kib: u64,
}

#[derive(Serialize)]
pub(crate) struct Idle {
    pub(crate) seconds: f64,
    /// CPU seconds of the agent and every instance together.
    pub(crate) cpu_s: f64,
    pub(crate) agent_cpu_s: f64,
    pub(crate) instances_cpu_s: f64,
    /// Instances that used any CPU in the window.
    pub(crate) busy_instances: usize,
}

#[derive(Serialize)]
pub(crate) struct LoadResult {
    pub(crate) concurrency: usize,
    pub(crate) seconds: f64,
    pub(crate) rps: f64,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) wrong: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) first_error: Option<String>,
    /// CPU seconds of the agent and the instances during the whole load (warm-up included).
    pub(crate) agent_cpu_s: f64,
    pub(crate) instances_cpu_s: f64,
}

#[derive(Serialize)]
pub(crate) struct Stop {
    /// SIGTERM to zerohop's exit, seconds.
    pub(crate) seconds: f64,
    pub(crate) exit: String,
    /// Instances or members of zerohop's process group still there after it exited (killed).
    pub(crate) leftovers: usize,
}

pub(crate) fn markdown(report: &Report) -> String {
    let mut s = String::new();
    let m = &report.machine;
    let _ = writeln!(
        s,
        "Machine: {} CPUs ({}), {:.1} GiB, kernel {}. Chain: F = min(16, N) pass functions, one \
         route, gateway_threads 1, default pool. Load: c={}, {} B bodies, {} s.\n",
        m.cores,
        m.cpu_model,
        m.mem_kib as f64 / (1 << 20) as f64,
        m.kernel,
        report.settings.concurrency,
        report.settings.body_bytes,
        report.settings.load_seconds
    );
    let mut table = Table::new(&[
        "N",
        "F",
        "ready s",
        "last spawn s",
        "private KiB/inst mean (max) ready",
        "after load",
        "Pss KiB/inst",
        "Rss KiB/inst",
        "page tables KiB/inst",
        "ring regions mapped/inst",
        "agent Rss / private MiB",
        "ring memfds: count, MiB",
        "ring resident MiB",
        "pool MiB (resident)",
        "idle CPU s before / after load",
        "RPS",
        "errors",
        "stop s",
        "ok",
    ]);
    let mib = |k: u64| k as f64 / 1024.0;
    for p in &report.points {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let r = p.memory_at_ready.as_ref();
        let l = p.memory_after_load.as_ref();
        let ring_maps = |m: &Memory| {
            ["outbox-own", "outbox-peer", "inbox-own", "inbox-peer"]
                .iter()
                .map(|k| m.mappings_by_kind_mean.get(*k).copied().unwrap_or(0.0))
                .sum::<f64>()
        };
        let idle = |i: &Option<Idle>| opt(i.as_ref().map(|i| format!("{:.2}", i.cpu_s)));
        table.row(&[
            p.instances.to_string(),
            p.functions.to_string(),
            opt(p.ready_s.map(|v| format!("{v:.2}"))),
            opt(p
                .startup
                .as_ref()
                .map(|v| format!("{:.2}", v.last_instance_s))),
            opt(r.map(|m| format!("{:.0} ({})", m.private_kib_mean, m.private_kib_max))),
            opt(l.map(|m| format!("{:.0} ({})", m.private_kib_mean, m.private_kib_max))),
            opt(r.map(|m| format!("{:.0}", m.pss_kib_mean))),
            opt(r.map(|m| format!("{:.0}", m.rss_kib_mean))),
            opt(r.map(|m| format!("{:.0}", m.page_tables_kib_mean))),
            opt(r.map(|m| format!("{:.1}", ring_maps(m)))),
            opt(l.map(|m| {
                format!(
                    "{:.1} / {:.1}",
                    mib(m.agent.rss_kib),
                    mib(m.agent.private_kib)
                )
            })),
            opt(l.map(|m| format!("{}, {:.1}", m.shared.ring_memfds, mib(m.shared.ring_kib)))),
            opt(l.map(|m| format!("{:.1}", mib(m.shared.ring_resident_kib)))),
            opt(l.map(|m| {
                format!(
                    "{:.0} ({:.1})",
                    mib(m.shared.pool_kib),
                    mib(m.shared.pool_resident_kib)
                )
            })),
            format!(
                "{} / {}",
                idle(&p.idle_before_load),
                idle(&p.idle_after_load)
            ),
            opt(p.load.as_ref().map(|v| format!("{:.0}", v.rps))),
            opt(p.load.as_ref().map(|v| format!("{}", v.errors + v.wrong))),
            opt(p.stop.as_ref().map(|v| format!("{:.2}", v.seconds))),
            (if p.ok { "yes" } else { "**no**" }).to_owned(),
        ]);
    }
    let _ = write!(s, "{table}");
    for p in report.points.iter().filter(|p| !p.ok) {
        let _ = writeln!(
            s,
            "\nN={} failed: {}",
            p.instances,
            p.error.as_deref().unwrap_or("?")
        );
    }
    s
}
