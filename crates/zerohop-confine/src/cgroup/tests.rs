//! The cgroup tests: the layout read from `/proc` text, and on this host, the chain's and
//! an instance's groups made with every mode it has, limits written, usage read, and
//! everything removed again.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use procfs::process::MountInfos;
use procfs::{FromBufRead, ProcessCGroups};
use zerohop_spec::ResourceSpec;

use super::chain::ChainCgroup;
use super::error::CgroupError;
use super::instance::InstanceCgroup;
use super::layout::Layout;
use super::version::CgroupMode;
use crate::limits::{self, Controller, Usage};

/// This machine's shape: v1 hierarchies (cpu and cpuacct apart, the agent in a memory
/// group of its own), and cgroup2 at /sys/fs/cgroup/unified.
const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n\
                             2:cpuacct:/\n1:cpu:/\n0::/\n";
const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

fn layout(cgroup: &str, mounts: &str) -> Layout {
    let own = ProcessCGroups::from_buf_read(Cursor::new(cgroup)).unwrap();
    let mounts = MountInfos::from_buf_read(Cursor::new(mounts)).unwrap();
    Layout::of(&own.0, &mounts.0)
}

#[test]
fn hybrid_layout() {
    let l = layout(HYBRID_CGROUP, HYBRID_MOUNTS);
    assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
    assert_eq!(
        l.v1_with("memory").map(|(_, d)| d.clone()),
        Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
    );
    assert_eq!(
        l.v1_with("cpu").map(|(_, d)| d.clone()),
        Some(PathBuf::from("/sys/fs/cgroup/cpu"))
    );
    assert!(l.v1_with("cpuacct").is_some());
    assert!(l.v1_with("freezer").is_none());
    assert!(
        l.v1_with("name=systemd").is_none(),
        "named hierarchies hold no controller"
    );
}

#[test]
fn unified_layout_and_co_mounted_v1() {
    let l = layout(
        "0::/user.slice/agent.service\n",
        "24 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
    );
    assert_eq!(
        l.v2,
        Some(PathBuf::from("/sys/fs/cgroup/user.slice/agent.service"))
    );
    assert!(l.v1.is_empty());
    let l = layout(
        "3:cpu,cpuacct:/a\n",
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
    );
    let (ctl, dir) = l.v1_with("cpuacct").unwrap();
    assert_eq!(ctl, &["cpu", "cpuacct"]);
    assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu,cpuacct/a"));
}

#[test]
fn a_mount_of_a_subtree_shows_only_what_is_beneath_its_root() {
    // In a container: the hierarchy's /docker/x mounted at /sys/fs/cgroup.
    let mounts = "41 31 0:38 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let l = layout("0::/docker/x/sub\n", mounts);
    assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/sub")));
    let l = layout("0::/docker/xy\n", mounts);
    assert_eq!(
        l.v2, None,
        "a sibling with a common prefix is not beneath the root"
    );
    let l = layout("0::/elsewhere\n", mounts);
    assert_eq!(l.v2, None);
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A chain's groups as this process would make them, or why not (printed: a host that
/// has no cgroup for us is told apart from a bug by the assertions as root).
fn chain(tag: &str, mode: CgroupMode) -> Option<ChainCgroup> {
    match ChainCgroup::create(&format!("unit-{tag}"), mode) {
        Ok(c) => Some(c),
        Err(e) => {
            assert!(!is_root(), "{mode:?}: as root a cgroup can be made: {e}");
            eprintln!("{mode:?}: no cgroup here ({e}); nothing to check");
            None
        }
    }
}

/// A shell spinning the CPU, moved into `g`'s groups by this test (which started it).
fn spinner(g: &InstanceCgroup) -> Child {
    let child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    for dir in g.dirs() {
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    }
    child
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
        .trim()
        .to_owned()
}

/// Every mode this host has: limits land in the files `limits` names, usage reads
/// back, and every folder goes with the chain. A mode the host refuses is skipped with
/// its reason printed; as root at least one mode must have been checked.
#[test]
fn limits_are_written_and_usage_read_on_this_host() {
    let limits = ResourceSpec {
        cpu_millis: Some(100),
        memory: Some(64 << 20),
        pids: Some(8),
    };
    let mut checked = Vec::new();
    let mut skipped = Vec::new();
    for mode in [CgroupMode::Auto, CgroupMode::V1, CgroupMode::V2] {
        let Some(c) = chain(&format!("{mode:?}"), mode) else {
            skipped.push((mode, "no cgroup for this user (why: above)".to_owned()));
            continue;
        };
        let chain_dirs: Vec<PathBuf> = c.groups.iter().map(|g| g.dir.clone()).collect();
        let g = match c.instance("f", 1, &limits) {
            Ok(g) => g,
            Err(e) => {
                // Only a host without the controllers may refuse, and it must say which.
                let msg = e.to_string();
                assert!(
                    matches!(e, CgroupError::Unavailable { .. }),
                    "{mode:?}: {msg}"
                );
                assert!(msg.starts_with("resources.cpu 100m needs the cpu"), "{msg}");
                skipped.push((mode, msg));
                continue;
            }
        };
        for c2 in [Controller::Cpu, Controller::Memory, Controller::Pids] {
            let i = *c.placement[c2.index()].as_ref().unwrap();
            let dir = c.groups[i].dir.join(g.groups[0].dir.file_name().unwrap());
            assert!(
                g.dirs().any(|d| d == dir),
                "{mode:?}: joins {}",
                dir.display()
            );
            for f in limits::files(c.groups[i].version, &limits) {
                if f.controller == c2 {
                    assert_eq!(read(&dir, f.file), f.value, "{mode:?}: {}", f.file);
                }
            }
        }
        let mut child = spinner(&g);
        // Bounded: a 100m quota over a few periods throttles within a second.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut u = g.usage.read();
        while u.nr_throttled.unwrap_or(0) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            u = g.usage.read();
        }
        assert!(u.cpu_ns.unwrap_or(0) > 0, "{mode:?}: {u:?}");
        assert!(u.memory_bytes.is_some(), "{mode:?}: {u:?}");
        assert!(u.nr_throttled.unwrap_or(0) > 0, "{mode:?}: {u:?}");
        let probe = g.usage_probe();
        drop(g);
        let _ = child.wait();
        assert_eq!(probe.read(), Usage::default(), "the groups are gone");
        drop(c);
        for d in chain_dirs {
            assert!(!d.exists(), "{mode:?}: {} left behind", d.display());
        }
        checked.push(mode);
    }
    eprintln!("checked: {checked:?}");
    for (mode, why) in &skipped {
        eprintln!("skipped {mode:?}: {why}");
    }
    if is_root() {
        assert!(
            !checked.is_empty(),
            "as root no cgroup mode could be checked on this host: {skipped:?}"
        );
    }
}

#[test]
fn without_limits_an_instance_is_still_grouped_and_measured() {
    let Some(c) = chain("nolimits", CgroupMode::Auto) else {
        return;
    };
    let g = c.instance("f", 1, &ResourceSpec::default()).unwrap();
    assert_eq!(g.procs_fds().len(), g.dirs().count());
    let mut child = spinner(&g);
    assert!(
        wait(|| g.usage.read().cpu_ns.unwrap_or(0) > 0),
        "{:?}",
        g.usage.read()
    );
    drop(g);
    let _ = child.wait();
}

fn wait(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn off_and_missing_controllers_say_why() {
    let e = ChainCgroup::create("x", CgroupMode::Off).unwrap_err();
    assert!(matches!(e, CgroupError::Off), "{e}");
    let e = e.to_string();
    assert!(e.contains("off"), "{e}");
    // No hierarchy at all.
    let e =
        ChainCgroup::create_in(&Layout::default(), "zerohop-none", CgroupMode::Auto).unwrap_err();
    assert!(matches!(e, CgroupError::NoGroup(_)), "{e}");
    let e = e.to_string();
    assert!(e.contains("no cgroup2 mount"), "{e}");
    assert!(e.contains("no cgroup v1 hierarchy"), "{e}");
}
