//! Resident memory of processes: the memory lines of `/proc/PID/status`, the totals of
//! `/proc/PID/smaps_rollup`, every mapping of `/proc/PID/smaps` sorted into kinds (the
//! chain's pool and rings by their memfd names, the program, libraries, heap, ...), the
//! memfds a process holds, and `/proc/meminfo`.
//!
//! Every figure is KiB, as the kernel prints it. A line the kernel does not print (a kernel
//! thread has no `VmRSS`, an old kernel no `Pss_Shmem`) reads as 0; a file that cannot be
//! read (process gone, another user's) as `None`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// The numbers of the `Name:   N kB` lines `names` of `text` (status, smaps_rollup,
/// meminfo) in the order of `names`; `None` for a name absent, or whose value does not start
/// with a number.
fn kib_lines(text: &str, names: &[&str]) -> Vec<Option<u64>> {
    let mut out = vec![None; names.len()];
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if let Some(i) = names.iter().position(|n| *n == key) {
            out[i] = value.split_whitespace().next().and_then(|v| v.parse().ok());
        }
    }
    out
}

/// [`kib_lines`], 0 for a line absent.
fn kib_values(text: &str, names: &[&str]) -> Vec<u64> {
    kib_lines(text, names)
        .into_iter()
        .map(|v| v.unwrap_or(0))
        .collect()
}

/// [`kib_values`] of the file at `path`; `None` when it cannot be read.
fn read_kib_lines(path: &str, names: &[&str]) -> Option<Vec<u64>> {
    Some(kib_values(&std::fs::read_to_string(path).ok()?, names))
}

/// The memory lines of `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// `VmRSS`: resident, all kinds.
    pub vm_rss_kib: u64,
    /// `RssAnon`: of which anonymous.
    pub rss_anon_kib: u64,
    /// `RssFile`: of which file-backed.
    pub rss_file_kib: u64,
    /// `RssShmem`: of which shared memory (the chain's pool and rings).
    pub rss_shmem_kib: u64,
    /// `VmPTE`: page tables, which smaps does not count.
    pub vm_pte_kib: u64,
    /// `Threads` (a count, not KiB).
    pub threads: u64,
}

impl Status {
    const LINES: [&'static str; 6] = [
        "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPTE", "Threads",
    ];

    /// Parses the text of a status file.
    pub fn parse(text: &str) -> Self {
        Self::from_values(kib_values(text, &Self::LINES))
    }

    /// Reads `/proc/PID/status`.
    pub fn read(pid: u32) -> Option<Self> {
        read_kib_lines(&format!("/proc/{pid}/status"), &Self::LINES).map(Self::from_values)
    }

    fn from_values(v: Vec<u64>) -> Self {
        Self {
            vm_rss_kib: v[0],
            rss_anon_kib: v[1],
            rss_file_kib: v[2],
            rss_shmem_kib: v[3],
            vm_pte_kib: v[4],
            threads: v[5],
        }
    }
}

/// Resident memory of `pid`: `(VmRSS, RssShmem)`; `None` when it is gone or has no `VmRSS`
/// (a zombie, a kernel thread).
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    match kib_lines(&status, &["VmRSS", "RssShmem"])[..] {
        [Some(rss), shmem] => Some((rss, shmem.unwrap_or(0))),
        _ => None,
    }
}

/// The totals of `/proc/PID/smaps_rollup`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rollup {
    /// `Rss`.
    pub rss_kib: u64,
    /// `Pss`: each resident page divided by the processes that map it.
    pub pss_kib: u64,
    /// `Private_Clean + Private_Dirty`: what this process alone has resident.
    pub private_kib: u64,
    /// `Pss_Shmem`: the shared-memory part of `Pss` (summed over processes, each resident
    /// page counts once).
    pub pss_shmem_kib: u64,
}

impl Rollup {
    const LINES: [&'static str; 5] = ["Rss", "Pss", "Private_Clean", "Private_Dirty", "Pss_Shmem"];

    /// Parses the text of a smaps_rollup file.
    pub fn parse(text: &str) -> Self {
        Self::from_values(kib_values(text, &Self::LINES))
    }

    /// Reads `/proc/PID/smaps_rollup`.
    pub fn read(pid: u32) -> Option<Self> {
        read_kib_lines(&format!("/proc/{pid}/smaps_rollup"), &Self::LINES).map(Self::from_values)
    }

    fn from_values(v: Vec<u64>) -> Self {
        Self {
            rss_kib: v[0],
            pss_kib: v[1],
            private_kib: v[2] + v[3],
            pss_shmem_kib: v[4],
        }
    }
}

/// The line `name` of `/proc/meminfo` (`Shmem`, `MemTotal`, ...); 0 when absent or
/// unreadable.
pub fn meminfo_kib(name: &str) -> u64 {
    read_kib_lines("/proc/meminfo", &[name]).map_or(0, |v| v[0])
}

/// One mapping of `/proc/PID/smaps`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    /// What is mapped: a path, `[heap]`, `/memfd:NAME (deleted)`, empty for anonymous memory.
    pub name: String,
    /// `rw-s` and the like.
    pub perms: String,
    /// Mapped (virtual) KiB.
    pub size: u64,
    /// Resident KiB.
    pub rss: u64,
    /// Proportional share of the resident KiB.
    pub pss: u64,
    /// `Private_Clean + Private_Dirty`, KiB.
    pub private: u64,
}

/// Every mapping of `pid`; `None` when its smaps cannot be read.
pub fn smaps(pid: u32) -> Option<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(parse_smaps(&text))
}

/// Every mapping of the text of a smaps file: a header line (`START-END PERMS OFFSET DEV
/// INODE NAME`) then its `Key: N kB` lines. Lines before the first header are ignored.
pub fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let header = first.contains('-')
            && !first.ends_with(':')
            && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if header {
            out.push(Mapping {
                name: after_fields(line, 5).to_owned(),
                perms: line.split_whitespace().nth(1).unwrap_or("").to_owned(),
                ..Mapping::default()
            });
            continue;
        }
        let Some(m) = out.last_mut() else { continue };
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kib = || {
            value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match key {
            "Size" => m.size = kib(),
            "Rss" => m.rss = kib(),
            "Pss" => m.pss = kib(),
            "Private_Clean" | "Private_Dirty" => m.private += kib(),
            _ => {}
        }
    }
    out
}

/// What follows the first `n` whitespace-separated fields of `line`, trimmed (a mapping's
/// name may hold spaces).
fn after_fields(line: &str, n: usize) -> &str {
    let mut rest = line.trim_start();
    for _ in 0..n {
        match rest.find(char::is_whitespace) {
            Some(i) => rest = rest[i..].trim_start(),
            None => return "",
        }
    }
    rest.trim_end()
}

/// Kind of a mapping: the chain's memfds by name (`pool`; `outbox-own`, `outbox-peer`,
/// `inbox-own`, `inbox-peer`: a ring region mapped writable or read-only; `memfd-other`),
/// the program `exe` (`binary`), `libs`, `heap`, `stack`, `kernel` (vdso), `anon`, `other`.
pub fn mapping_kind(m: &Mapping, exe: &str) -> &'static str {
    let writable = m.perms.contains('w');
    let n = m.name.as_str();
    if let Some(memfd) = n.strip_prefix("/memfd:") {
        return match () {
            _ if memfd.starts_with("zerohop-pool:") => "pool",
            _ if memfd.starts_with("zerohop-outbox:") && writable => "outbox-own",
            _ if memfd.starts_with("zerohop-outbox:") => "outbox-peer",
            _ if memfd.starts_with("zerohop-inbox:") && writable => "inbox-own",
            _ if memfd.starts_with("zerohop-inbox:") => "inbox-peer",
            _ => "memfd-other",
        };
    }
    match n {
        "" => "anon",
        "[heap]" => "heap",
        "[stack]" => "stack",
        "[vdso]" | "[vvar]" | "[vvar_vclock]" | "[vsyscall]" => "kernel",
        _ if n.starts_with("[anon") => "anon",
        _ if !exe.is_empty() && n.trim_end_matches(" (deleted)") == exe => "binary",
        _ if n.contains(".so") => "libs",
        _ => "other",
    }
}

/// The mappings of one kind together.
#[derive(serde::Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct KindStat {
    /// How many.
    pub mappings: u64,
    /// Mapped KiB.
    pub size_kib: u64,
    /// Resident KiB.
    pub rss_kib: u64,
    /// Proportional KiB.
    pub pss_kib: u64,
    /// Private KiB.
    pub private_kib: u64,
}

/// `maps` summed by [`mapping_kind`] (`exe`: the program they belong to).
pub fn by_kind(maps: &[Mapping], exe: &str) -> BTreeMap<String, KindStat> {
    let mut out: BTreeMap<String, KindStat> = BTreeMap::new();
    for m in maps {
        let k = out.entry(mapping_kind(m, exe).to_owned()).or_default();
        k.mappings += 1;
        k.size_kib += m.size;
        k.rss_kib += m.rss;
        k.pss_kib += m.pss;
        k.private_kib += m.private;
    }
    out
}

/// The memfds a process holds: each region once, however many descriptors it has on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memfds {
    /// `(name, bytes)` of each region, by (device, inode); the name without `/memfd:` and
    /// ` (deleted)`.
    pub regions: Vec<(String, u64)>,
    /// Descriptors on memfds (a region handed out read-only has a read-write and a read-only
    /// one).
    pub fds: usize,
}

impl Memfds {
    /// The memfds `pid` holds (none when its descriptors cannot be read).
    pub fn of(pid: u32) -> Self {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return Self::default();
        };
        Self::from_links(dir.flatten().filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            // stat through the link: the memfd itself (the read-only twin has the same inode).
            let meta = std::fs::metadata(e.path())
                .ok()
                .map(|m| (m.dev(), m.ino(), m.size()));
            Some((target.to_string_lossy().into_owned(), meta))
        }))
    }

    /// From each descriptor's link target and, when it could be stat'ed, its (device,
    /// inode, size); descriptors that are no memfd are left out.
    fn from_links(links: impl IntoIterator<Item = (String, Option<(u64, u64, u64)>)>) -> Self {
        let mut seen = BTreeMap::new();
        let mut fds = 0;
        for (target, meta) in links {
            let Some(name) = target.strip_prefix("/memfd:") else {
                continue;
            };
            fds += 1;
            let Some((dev, ino, size)) = meta else {
                continue;
            };
            seen.entry((dev, ino))
                .or_insert_with(|| (name.trim_end_matches(" (deleted)").to_owned(), size));
        }
        Self {
            regions: seen.into_values().collect(),
            fds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_read_by_name_and_a_missing_one_is_zero() {
        let text = "Name:\tzerohop-bench-p\nState:\tS (sleeping)\nVmPeak:\t  10000 kB\n\
                    VmRSS:\t    3368 kB\nRssAnon:\t     512 kB\nRssFile:\t    2800 kB\n\
                    RssShmem:\t      56 kB\nVmPTE:\t      60 kB\nThreads:\t2\n";
        assert_eq!(
            Status::parse(text),
            Status {
                vm_rss_kib: 3368,
                rss_anon_kib: 512,
                rss_file_kib: 2800,
                rss_shmem_kib: 56,
                vm_pte_kib: 60,
                threads: 2,
            }
        );
        // A kernel thread's status: no memory lines at all.
        let kthread = "Name:\tkthreadd\nState:\tS (sleeping)\nThreads:\t1\n";
        assert_eq!(
            Status::parse(kthread),
            Status {
                threads: 1,
                ..Status::default()
            }
        );
        // A key is matched whole: `VmRSSx` is not `VmRSS`, and a value that is no number is 0.
        assert_eq!(Status::parse("VmRSSx: 5 kB\nVmRSS: lots\n").vm_rss_kib, 0);
    }

    #[test]
    fn rollup_adds_clean_and_dirty_private_memory() {
        let text = "55d0c0a00000-7ffd4f5fe000 ---p 00000000 00:00 0                  [rollup]\n\
                    Rss:                3400 kB\nPss:                 510 kB\n\
                    Pss_Anon:            300 kB\nPss_Shmem:            12 kB\n\
                    Shared_Clean:       3000 kB\nPrivate_Clean:         40 kB\n\
                    Private_Dirty:       248 kB\n";
        assert_eq!(
            Rollup::parse(text),
            Rollup {
                rss_kib: 3400,
                pss_kib: 510,
                private_kib: 288,
                pss_shmem_kib: 12,
            }
        );
        // Before Linux 5.x there is no Pss_Shmem line.
        assert_eq!(Rollup::parse("Rss: 8 kB\nPss: 4 kB\n").pss_shmem_kib, 0);
    }

    #[test]
    fn this_process_has_memory() {
        let me = std::process::id();
        let (rss, _) = rss_kib(me).expect("rss of this process");
        assert!(rss > 100, "rss {rss} KiB");
        let status = Status::read(me).expect("status");
        assert!(status.vm_rss_kib > 100 && status.threads >= 1, "{status:?}");
        assert!(meminfo_kib("MemTotal") > 0);
        assert_eq!(meminfo_kib("NoSuchLine"), 0);
        assert_eq!(rss_kib(u32::MAX), None);
        assert_eq!(Status::read(u32::MAX), None);
    }

    const SMAPS: &str = "\
55d0c0a00000-55d0c0a2c000 r-xp 00001000 fd:01 1234                       /x/pass
Size:                176 kB
KernelPageSize:        4 kB
Rss:                 176 kB
Pss:                  88 kB
Private_Clean:         8 kB
Private_Dirty:         4 kB
VmFlags: rd ex mr mw me dw sd
7f0000000000-7f0000100000 rw-s 00000000 00:01 42   /memfd:zerohop-outbox:scale:3 (deleted)
Size:               1024 kB
Rss:                  12 kB
Pss:                   6 kB
Private_Clean:         0 kB
Private_Dirty:
7f0000200000-7f0000300000 r--s 00000000 00:01 43   /memfd:zerohop-inbox:a b:3 (deleted)
Size:               1024 kB
Rss:                   8 kB
7ffd1000-7ffd2000 rw-p 00000000 00:00 0 
Size:                  4 kB
Rss:                   4 kB
Private_Dirty:         4 kB
THPeligible:    0
";

    #[test]
    fn smaps_mappings_keep_names_with_spaces_and_read_missing_values_as_zero() {
        let maps = parse_smaps(SMAPS);
        let names: Vec<&str> = maps.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "/x/pass",
                "/memfd:zerohop-outbox:scale:3 (deleted)",
                "/memfd:zerohop-inbox:a b:3 (deleted)",
                ""
            ]
        );
        assert_eq!(
            maps[0],
            Mapping {
                name: "/x/pass".into(),
                perms: "r-xp".into(),
                size: 176,
                rss: 176,
                pss: 88,
                private: 12,
            }
        );
        assert_eq!((maps[1].perms.as_str(), maps[1].private), ("rw-s", 0));
        assert_eq!((maps[2].size, maps[2].rss, maps[2].pss), (1024, 8, 0));
        assert_eq!((maps[3].size, maps[3].private), (4, 4));
        assert!(
            parse_smaps("Size: 4 kB\n").is_empty(),
            "no header, no mapping"
        );
        assert_eq!(
            after_fields("7f-80 r--s 00000000 00:01 42   /memfd:a b (deleted)", 5),
            "/memfd:a b (deleted)"
        );
        assert_eq!(after_fields("7f-80 rw-p 00000000 00:00 0 ", 5), "");
    }

    #[test]
    fn mappings_are_sorted_into_kinds() {
        let m = |name: &str, perms: &str| Mapping {
            name: name.into(),
            perms: perms.into(),
            ..Mapping::default()
        };
        let kind = |name: &str, perms: &str, exe: &str| mapping_kind(&m(name, perms), exe);
        let (outbox, inbox) = (
            "/memfd:zerohop-outbox:scale:3 (deleted)",
            "/memfd:zerohop-inbox:scale:3 (deleted)",
        );
        let cases = [
            (outbox, "rw-s", "", "outbox-own"),
            (outbox, "r--s", "", "outbox-peer"),
            (inbox, "rw-s", "", "inbox-own"),
            (inbox, "r--s", "", "inbox-peer"),
            ("/memfd:zerohop-pool:scale (deleted)", "rw-s", "", "pool"),
            ("/memfd:other (deleted)", "rw-s", "", "memfd-other"),
            ("/x/pass", "r-xp", "/x/pass", "binary"),
            ("/x/pass (deleted)", "r-xp", "/x/pass", "binary"),
            ("/x/pass", "r-xp", "", "other"),
            ("/usr/lib/libc.so.6", "r-xp", "/x/pass", "libs"),
            ("", "rw-p", "", "anon"),
            ("[anon:tokio]", "rw-p", "", "anon"),
            ("[heap]", "rw-p", "", "heap"),
            ("[stack]", "rw-p", "", "stack"),
            ("[vdso]", "r-xp", "", "kernel"),
        ];
        for (name, perms, exe, want) in cases {
            assert_eq!(kind(name, perms, exe), want, "{name} {perms}");
        }
        let kinds = by_kind(&parse_smaps(SMAPS), "/x/pass");
        assert_eq!(
            kinds.keys().collect::<Vec<_>>(),
            ["anon", "binary", "inbox-peer", "outbox-own"]
        );
        assert_eq!(
            kinds["binary"],
            KindStat {
                mappings: 1,
                size_kib: 176,
                rss_kib: 176,
                pss_kib: 88,
                private_kib: 12,
            }
        );
    }

    #[test]
    fn memfds_count_each_region_once_and_every_descriptor() {
        let link = |target: &str, meta: Option<(u64, u64, u64)>| (target.to_owned(), meta);
        let m = Memfds::from_links([
            link("/memfd:zerohop-pool:scale (deleted)", Some((1, 10, 65536))),
            // The read-only twin of the same region.
            link("/memfd:zerohop-pool:scale (deleted)", Some((1, 10, 65536))),
            link("/memfd:zerohop-outbox:s:1 (deleted)", Some((1, 11, 4096))),
            // Gone between readlink and stat: counted as a descriptor, not as a region.
            link("/memfd:zerohop-inbox:scale:1 (deleted)", None),
            link("socket:[1234]", Some((0, 5, 0))),
            link("/dev/null", Some((0, 6, 0))),
        ]);
        assert_eq!(
            m,
            Memfds {
                regions: vec![
                    ("zerohop-pool:scale".into(), 65536),
                    ("zerohop-outbox:s:1".into(), 4096)
                ],
                fds: 4,
            }
        );
        assert_eq!(Memfds::of(u32::MAX), Memfds::default());
    }
}
