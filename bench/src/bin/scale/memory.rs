//! The chain's memory at one moment: per instance and for the agent, by kind of mapping, and
//! the shared memory the agent holds.

use std::collections::BTreeMap;

use zerohop_bench::procstat::memory::{
    by_kind, meminfo_kib, smaps, Mapping, Memfds, Rollup, Status,
};
use zerohop_bench::procstat::{environ_var, exe_path, ProcessId as Proc};
use zerohop_bench::systems::FUNCTION_ENV;
use zerohop_test_support::open_fds;

use crate::output::{Agent, Memory, Sample, Shared, TopMapping};

/// Memory of the chain now.
pub(crate) fn memory(zerohop: u32, instances: &[Proc], shmem_before: u64, detail: usize) -> Memory {
    let page_tables = |pid: u32| Status::read(pid).unwrap_or_default().vm_pte_kib;
    let mut private = Vec::new();
    let mut pss = Vec::new();
    let mut rss = Vec::new();
    let mut pte = Vec::new();
    let mut fds = Vec::new();
    let mut resident_shmem = 0;
    let mut private_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut rss_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut maps_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut size_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut per_instance = Vec::new();
    for p in instances.iter().filter(|p| p.alive()) {
        let Some(rollup) = Rollup::read(p.pid) else {
            continue;
        };
        let exe = exe_path(p.pid);
        let kinds = by_kind(&smaps(p.pid).unwrap_or_default(), &exe);
        for (k, s) in &kinds {
            *private_by_kind.entry(k.clone()).or_default() += s.private_kib as f64;
            *rss_by_kind.entry(k.clone()).or_default() += s.rss_kib as f64;
            *maps_by_kind.entry(k.clone()).or_default() += s.mappings as f64;
            *size_by_kind.entry(k.clone()).or_default() += s.size_kib as f64;
        }
        private.push(rollup.private_kib);
        pss.push(rollup.pss_kib);
        rss.push(rollup.rss_kib);
        pte.push(page_tables(p.pid));
        fds.push(open_fds(p.pid) as u64);
        resident_shmem += rollup.pss_shmem_kib;
        per_instance.push((*p, exe));
    }
    let found = private.len();
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    for m in [
        &mut private_by_kind,
        &mut rss_by_kind,
        &mut maps_by_kind,
        &mut size_by_kind,
    ] {
        for v in m.values_mut() {
            *v /= found.max(1) as f64;
        }
    }

    // The agent, and the chain's shared memory through it.
    let agent_exe = exe_path(zerohop);
    let agent_maps = smaps(zerohop).unwrap_or_default();
    let agent_kinds = by_kind(&agent_maps, &agent_exe);
    let agent_rollup = Rollup::read(zerohop).unwrap_or_default();
    resident_shmem += agent_rollup.pss_shmem_kib;
    let agent_status = Status::read(zerohop).unwrap_or_default();
    let memfds = Memfds::of(zerohop);
    let mut shared = Shared {
        memfd_fds: memfds.fds,
        resident_shmem_kib: resident_shmem,
        ..Shared::default()
    };
    for (name, bytes) in &memfds.regions {
        let kib = bytes.div_ceil(1024);
        if name.starts_with("zerohop-pool:") {
            shared.pool_memfds += 1;
            shared.pool_kib += kib;
        } else if name.starts_with("zerohop-outbox:") {
            shared.outbox_memfds += 1;
            shared.outbox_kib += kib;
            shared.outbox_kib_max = shared.outbox_kib_max.max(kib);
        } else if name.starts_with("zerohop-inbox:") {
            shared.inbox_memfds += 1;
            shared.inbox_kib += kib;
        } else {
            shared.other_memfds += 1;
            shared.other_kib += kib;
        }
    }
    shared.ring_memfds = shared.outbox_memfds + shared.inbox_memfds;
    shared.ring_kib = shared.outbox_kib + shared.inbox_kib;
    let kind_rss = |k: &str| agent_kinds.get(k).map_or(0, |s| s.rss_kib);
    shared.pool_resident_kib = kind_rss("pool");
    shared.agent_ring_rss_kib = kind_rss("outbox-own")
        + kind_rss("outbox-peer")
        + kind_rss("inbox-own")
        + kind_rss("inbox-peer");
    shared.ring_resident_kib = resident_shmem.saturating_sub(shared.pool_resident_kib);
    shared.meminfo_shmem_delta_kib = meminfo_kib("Shmem") as i64 - shmem_before as i64;

    // Samples: an instance of the first, the middle and the last function.
    let mut samples = Vec::new();
    if detail > 0 && !per_instance.is_empty() {
        let mut named: Vec<(String, Proc, String)> = per_instance
            .into_iter()
            .map(|(p, exe)| (environ_var(p.pid, FUNCTION_ENV).unwrap_or_default(), p, exe))
            .collect();
        let number = |f: &str| {
            f.trim_start_matches("pass")
                .parse::<usize>()
                .unwrap_or(usize::MAX)
        };
        named.sort_by_key(|(f, p, _)| (number(f), p.pid));
        let last = named.len() - 1;
        let mut picks = vec![0, last / 2, last];
        picks.dedup();
        picks.truncate(detail);
        for i in picks {
            let (function, p, exe) = &named[i];
            let Some(maps) = smaps(p.pid) else { continue };
            let rollup = Rollup::read(p.pid).unwrap_or_default();
            let mut top: Vec<&Mapping> = maps.iter().filter(|m| m.private > 0).collect();
            top.sort_by_key(|m| std::cmp::Reverse(m.private));
            samples.push(Sample {
                pid: p.pid,
                function: function.clone(),
                private_kib: rollup.private_kib,
                rss_kib: rollup.rss_kib,
                page_tables_kib: page_tables(p.pid),
                by_kind: by_kind(&maps, exe),
                top_private: top
                    .into_iter()
                    .take(10)
                    .map(|m| TopMapping {
                        name: if m.name.is_empty() {
                            "[anon]".into()
                        } else {
                            m.name.clone()
                        },
                        perms: m.perms.clone(),
                        size_kib: m.size,
                        rss_kib: m.rss,
                        private_kib: m.private,
                    })
                    .collect(),
            });
        }
    }

    Memory {
        instances_found: found,
        private_kib_mean: mean(&private),
        private_kib_max: private.iter().copied().max().unwrap_or(0),
        pss_kib_mean: mean(&pss),
        rss_kib_mean: mean(&rss),
        rss_kib_max: rss.iter().copied().max().unwrap_or(0),
        page_tables_kib_mean: mean(&pte),
        private_by_kind_kib_mean: private_by_kind,
        rss_by_kind_kib_mean: rss_by_kind,
        mappings_by_kind_mean: maps_by_kind,
        mapped_by_kind_kib_mean: size_by_kind,
        fds_mean: mean(&fds),
        agent: Agent {
            pid: zerohop,
            rss_kib: agent_rollup.rss_kib,
            private_kib: agent_rollup.private_kib,
            pss_kib: agent_rollup.pss_kib,
            page_tables_kib: agent_status.vm_pte_kib,
            fds: open_fds(zerohop),
            mappings: agent_maps.len(),
            threads: agent_status.threads,
            by_kind: agent_kinds,
        },
        shared,
        samples,
    }
}
