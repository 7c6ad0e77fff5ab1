//! Core-affine pipelines end to end (`cpus:` in the spec): the real `zerohop agent` daemon
//! runs a two-function chain on CPUs 0 and 1 with two instances of each function. Each
//! gateway thread and each instance runs on its lane's core only (and `zerohop status` says
//! which); a client on a core is
//! served by the gateway thread of that core (the kernel's `SO_INCOMING_CPU` choice among
//! the listening sockets), which picks the instances of the same core, while they have room;
//! a spec naming a CPU the agent may not use is refused with the CPU named.

mod common;

use std::collections::BTreeSet;

use common::daemon::Daemon;
use common::{client, func, post};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

fn spec(name: &str, cpus: &str) -> String {
    format!(
        "name: {name}\ntimeout: 10s\ncpus: \"{cpus}\"\nfunctions:\n{}{}routes:\n  - http: POST /where\n    sequence: [first, second]\n",
        func("first", "where", "", ", instances: 2"),
        func("second", "where", "", ", instances: 2"),
    )
}

/// `Cpus_allowed_list` of a process's or thread's status file.
fn allowed(status_file: &str) -> String {
    std::fs::read_to_string(status_file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

/// Runs `f` on a thread pinned to `cpu`.
fn on_cpu<T: Send>(cpu: usize, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut set = CpuSet::new();
            set.set(cpu).unwrap();
            sched_setaffinity(Pid::from_raw(0), &set).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

#[test]
fn each_core_serves_its_clients_through_its_own_gateway_thread_and_instances() {
    let mine = sched_getaffinity(Pid::from_raw(0)).unwrap();
    if !(mine.is_set(0).unwrap() && mine.is_set(1).unwrap()) {
        // Not a kernel feature that is missing: a machine (or cpuset) with one CPU.
        eprintln!("skipped: this test needs CPUs 0 and 1");
        return;
    }
    let d = Daemon::start();
    let applied = d.apply("lanes", &spec("lanes", "0-1"));
    assert_eq!(applied["applied"], "created", "{applied}");
    let url = applied["status"]["listeners"][0]
        .as_str()
        .expect("an http listener")
        .to_owned();
    let url = format!("{url}/where");

    // Every instance on the core of its lane: instance k of each function on CPU k mod 2.
    let s = d.status("lanes");
    for f in s["functions"].as_array().unwrap() {
        let instances = f["instances"].as_array().unwrap();
        assert_eq!(instances.len(), 2, "{s}");
        for (k, i) in instances.iter().enumerate() {
            let pid = i["pid"].as_u64().expect("a process");
            assert_eq!(
                allowed(&format!("/proc/{pid}/status")),
                k.to_string(),
                "{f}"
            );
            assert_eq!(i["cpu"], k, "status names the CPU: {f}");
        }
    }
    // Gateway thread 1 on CPU 1, the chain's thread (gateway 0) on CPU 0.
    let tasks = format!("/proc/{}/task", d.pid());
    let threads: Vec<(String, String)> = std::fs::read_dir(&tasks)
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?.path();
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            Some((
                comm.trim().to_owned(),
                allowed(&t.join("status").display().to_string()),
            ))
        })
        .collect();
    assert!(
        threads.contains(&("gateway-1".into(), "1".into())),
        "{threads:?}"
    );
    assert!(
        threads.contains(&("chain-lanes".into(), "0".into())),
        "{threads:?}"
    );

    // Clients on each core, three connections each (new ones, in turn, so that no
    // address hash lands them right by chance), ten requests each one after another: all
    // through the two instances of that core.
    for round in 0..3 {
        for cpu in [1usize, 0] {
            let seen: BTreeSet<String> = on_cpu(cpu, || {
                let http = client();
                (0..10)
                    .map(|i| {
                        let a = post(&http, &url, &format!("r{i}"));
                        assert_eq!(a.status, 200, "{}", a.body);
                        let (body, lines) = a.body.split_once('\n').expect("where lines");
                        assert_eq!(body, format!("r{i}"));
                        lines.to_owned()
                    })
                    .collect()
            });
            assert_eq!(seen.len(), 1, "round {round}: one pipeline: {seen:?}");
            let lines = seen.into_iter().next().unwrap();
            for (fname, line) in ["first", "second"].iter().zip(lines.lines()) {
                assert!(line.starts_with(&format!("{fname} pid=")), "{lines}");
                assert!(
                    line.ends_with(&format!("cpus={cpu}")),
                    "round {round}, client on CPU {cpu}: {lines}"
                );
            }
        }
    }

    // A CPU this agent may not run on: refused, naming it.
    let out = d.cli(&[
        "apply",
        d.write("far", &spec("far", "4000")).to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cpus: CPU 4000 is not among the CPUs this agent may run on"),
        "{err}"
    );
    d.stop_cleanly();
}
