//! The system programs each task needs, in one table, and what to do when some are missing.
//!
//! `cargo xtask test` (and `lint`, whose clippy build compiles the eBPF programs) checks the
//! table before it builds anything. As root on a machine with apt, it installs exactly the
//! packages of what is missing (`apt-get update` once, then one `apt-get install`), saying
//! what and why. Otherwise it prints one line per missing program, with the command that
//! installs it, and exits 1 before spending minutes on a build.
//!
//! A program is looked for on `PATH` only (as the tests start it), a header or a library at
//! its path. The decision ([`plan`]) is a pure function of what was found, so it is tested
//! with tables (and, as part of each task's whole plan, in `crate::plan`); [`missing`] and
//! [`this_machine`] gather the facts, [`carry_out`] carries the decision out.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// How to tell that a requirement is met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A program of this name on `PATH`.
    Program(&'static str),
    /// A file at this path (a header; an interpreter the chains' uids must be able to run
    /// from where every user can reach it; a program a test starts by its full path).
    File(&'static str),
    /// `python3 -m pip` runs with the interpreter at this path.
    Pip(&'static str),
}

/// Who needs a requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The build: without it the sockmap transport is built without its eBPF programs, which
    /// `cargo xtask test` and `lint` do not accept.
    Build,
    /// Some test (or a build step of the test command: the SDKs, the control plane, the image).
    Tests,
}

/// One system requirement.
#[derive(Clone, Copy, Debug)]
pub struct Requirement {
    pub probe: Probe,
    /// The Debian package that provides it; `None` when apt cannot (a toolchain of its own).
    pub package: Option<&'static str>,
    /// What needs it, said to the user.
    pub why: &'static str,
    pub need: Need,
}

const fn req(probe: Probe, package: &'static str, why: &'static str, need: Need) -> Requirement {
    Requirement {
        probe,
        package: Some(package),
        why,
        need,
    }
}

/// Every system program the build and the tests use, and the package that provides it. The
/// base toolchains (Rust, Go, Node.js, Python) come with the machine; apt provides the rest.
pub const REQUIREMENTS: &[Requirement] = &[
    req(
        Probe::Program("clang"),
        "clang",
        "compiles the sockmap transport's eBPF programs",
        Need::Build,
    ),
    req(
        Probe::File("/usr/include/bpf/bpf_helpers.h"),
        "libbpf-dev",
        "libbpf's headers for the eBPF programs",
        Need::Build,
    ),
    req(
        Probe::File("/usr/include/linux/bpf.h"),
        "linux-libc-dev",
        "the kernel's uapi headers for the eBPF programs",
        Need::Build,
    ),
    req(
        Probe::Program("cc"),
        "gcc",
        "the C SDK's tests, the C starter and the native SDKs",
        Need::Tests,
    ),
    req(
        Probe::File("/usr/include/stdio.h"),
        "libc6-dev",
        "the C library's headers for the C SDK's tests",
        Need::Tests,
    ),
    req(
        Probe::Program("pkg-config"),
        "pkg-config",
        "finds the C SDK for the C and Go functions",
        Need::Tests,
    ),
    req(
        Probe::Program("make"),
        "make",
        "builds the C starter",
        Need::Tests,
    ),
    req(
        Probe::File("/usr/bin/python3"),
        "python3",
        "runs the Python functions under the chains' own uids (an interpreter every user can run)",
        Need::Tests,
    ),
    req(
        Probe::Pip("/usr/bin/python3"),
        "python3-pip",
        "installs the Python SDK and pytest",
        Need::Tests,
    ),
    req(
        Probe::File("/usr/lib/python3.11/ensurepip/__init__.py"),
        "python3-venv",
        "`python3 -m venv` for the Locust and grpcio clients' environments",
        Need::Tests,
    ),
    req(
        Probe::Program("npm"),
        "npm",
        "builds the Node.js SDK's addon",
        Need::Tests,
    ),
    // The benchmark starts this path, not whatever `nginx` is first on PATH (bench/src/
    // systems.rs `NGINX`): another nginx on PATH must not stop the install.
    req(
        Probe::File("/usr/sbin/nginx"),
        "nginx-light",
        "the benchmark's broker baseline (its smoke and systems tests)",
        Need::Tests,
    ),
    req(
        Probe::Program("wrk"),
        "wrk",
        "the benchmark's multi-core load generator, for its cores test",
        Need::Tests,
    ),
    req(
        Probe::Program("mosquitto"),
        "mosquitto",
        "the MQTT tests' broker",
        Need::Tests,
    ),
    req(
        Probe::Program("mosquitto_pub"),
        "mosquitto-clients",
        "the MQTT tests' clients",
        Need::Tests,
    ),
    req(
        Probe::Program("coap-client-notls"),
        "libcoap3-bin",
        "the CoAP tests' client",
        Need::Tests,
    ),
    req(
        Probe::Program("promtool"),
        "prometheus",
        "checks the daemon's metrics",
        Need::Tests,
    ),
    req(
        Probe::Program("etcd"),
        "etcd-server",
        "the Kubernetes tests' store",
        Need::Tests,
    ),
    req(
        Probe::Program("openssl"),
        "openssl",
        "the Kubernetes tests' service-account key, the TLS tests' certificates",
        Need::Tests,
    ),
    req(
        Probe::Program("curl"),
        "curl",
        "the TLS and HTTP/2 tests' client (HTTP/1.1 and h2 over TLS, h2c)",
        Need::Tests,
    ),
    req(
        Probe::Program("h2load"),
        "nghttp2-client",
        "the HTTP/2 tests' stream flood",
        Need::Tests,
    ),
    req(
        Probe::Program("ip"),
        "iproute2",
        "network namespaces as nodes",
        Need::Tests,
    ),
    req(
        Probe::Program("nsenter"),
        "util-linux",
        "runs a node's daemon in its network namespace",
        Need::Tests,
    ),
    req(
        Probe::Program("strip"),
        "binutils",
        "strips the container image's binaries",
        Need::Tests,
    ),
    req(
        Probe::Program("runc"),
        "runc",
        "runs the container image in its test",
        Need::Tests,
    ),
    Requirement {
        probe: Probe::Program("go"),
        package: None,
        why: "Go 1.24 or newer (https://go.dev/dl): the Go SDK, kube-apiserver",
        need: Need::Tests,
    },
    Requirement {
        probe: Probe::Program("node"),
        package: None,
        why: "Node.js 18 or newer (https://nodejs.org): the Node.js SDK",
        need: Need::Tests,
    },
];

/// Services Debian starts when their package is installed; the tests and benchmarks start
/// their own, so a packaged one would only hold their ports.
const SERVICES: [&str; 4] = ["nginx", "mosquitto", "prometheus", "etcd"];

/// The machine, as far as the plan depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    pub root: bool,
    pub apt: bool,
}

/// What to do about the requirements that are not met.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Everything is there.
    Ready,
    /// Install these packages with apt (root, apt present, every missing thing packaged).
    Install(Vec<&'static str>),
    /// Stop before building: one line per missing requirement.
    Refuse(Vec<String>),
}

/// The plan for the requirements `missing` on `machine`.
pub fn plan(missing: &[&Requirement], machine: Machine) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    let mut packages: Vec<&'static str> = missing.iter().filter_map(|r| r.package).collect();
    packages.sort_unstable();
    packages.dedup();
    let unpackaged = missing.iter().any(|r| r.package.is_none());
    if machine.root && machine.apt && !unpackaged {
        return Plan::Install(packages);
    }
    let sudo = if machine.root { "" } else { "sudo " };
    let lines = missing
        .iter()
        .map(|r| match r.package {
            Some(p) => format!(
                "missing {} ({}): install it with `{sudo}apt-get install {p}`",
                r.probe, r.why
            ),
            None => format!("missing {}: install {}", r.probe, r.why),
        })
        .collect();
    Plan::Refuse(lines)
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Program(p) => write!(f, "{p}"),
            Probe::File(p) => write!(f, "{p}"),
            Probe::Pip(python) => write!(f, "`{python} -m pip`"),
        }
    }
}

/// Whether `probe` is met on this machine, programs looked for in `path` (a `PATH` value).
fn met(probe: Probe, path: &std::ffi::OsStr) -> bool {
    match probe {
        Probe::Program(name) => find_program(name, path).is_some(),
        Probe::File(file) => Path::new(file).exists(),
        Probe::Pip(python) => Command::new(python)
            .args(["-m", "pip", "--version"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
    }
}

/// The executable file `name` in the folders of `path`.
pub fn find_program(name: &str, path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path).map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The requirements of `needs` that this machine does not meet.
pub fn missing(needs: &[Need]) -> Vec<&'static Requirement> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    REQUIREMENTS
        .iter()
        .filter(|r| needs.contains(&r.need) && !met(r.probe, &path))
        .collect()
}

/// Whether this process runs as root and apt-get is on `PATH`.
pub fn this_machine() -> Machine {
    let path = std::env::var_os("PATH").unwrap_or_default();
    Machine {
        root: is_root(),
        apt: find_program("apt-get", &path).is_some(),
    }
}

/// The effective uid, from `/proc/self/status` (`Uid: real effective saved fs`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// Carries out `plan`, the plan for the requirements `missing`: installs them (root with
/// apt) or stops with one line per missing program. `task` names the command for the messages.
pub fn carry_out(task: &str, plan: &Plan, missing: &[&Requirement]) -> Result<()> {
    match plan {
        Plan::Ready => Ok(()),
        Plan::Refuse(lines) => {
            for l in lines {
                eprintln!("xtask: {l}");
            }
            bail!(
                "{task} needs {} more system program(s), listed above; nothing was built",
                lines.len()
            )
        }
        Plan::Install(packages) => install(packages, missing),
    }
}

/// `apt-get update`, then `apt-get install` of `packages`, with apt's progress.
fn install(packages: &[&str], missing: &[&Requirement]) -> Result<()> {
    eprintln!(
        "xtask: installing {} Debian package(s) the build and the tests need:",
        packages.len()
    );
    for r in missing {
        eprintln!(
            "xtask:   {:<18} for {} ({})",
            r.package.unwrap_or("-"),
            r.probe,
            r.why
        );
    }
    let apt = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get")?;
        if !status.success() {
            bail!("`apt-get {}` failed ({status})", args.join(" "));
        }
        Ok(())
    };
    eprintln!("xtask: apt-get update");
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "-o", "Dpkg::Use-Pty=0"];
    args.extend_from_slice(packages);
    eprintln!("xtask: apt-get install -y {}", packages.join(" "));
    apt(&args)?;
    // Debian starts some of them as services; the tests run their own.
    for svc in SERVICES {
        let quiet = |c: &mut Command| {
            c.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !quiet(Command::new("systemctl").args(["stop", svc])) {
            quiet(Command::new("service").args([svc, "stop"]));
        }
    }
    // Only what was missing is looked at again.
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(r) = missing.iter().find(|r| !met(r.probe, &path)) {
        bail!(
            "apt-get installed {} but {} is still missing",
            r.package.unwrap_or("its package"),
            r.probe
        );
    }
    eprintln!("xtask: installed {}", packages.join(" "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(probes: &[&str]) -> Vec<&'static Requirement> {
        probes
            .iter()
            .map(|p| {
                REQUIREMENTS
                    .iter()
                    .find(|r| r.probe.to_string() == *p)
                    .unwrap_or_else(|| panic!("no requirement {p}"))
            })
            .collect()
    }

    const ROOT_APT: Machine = Machine {
        root: true,
        apt: true,
    };

    #[test]
    fn nothing_missing_is_ready_everywhere() {
        for root in [false, true] {
            for apt in [false, true] {
                assert_eq!(plan(&[], Machine { root, apt }), Plan::Ready);
            }
        }
    }

    #[test]
    fn root_with_apt_installs_each_package_once_sorted() {
        let m = named(&["mosquitto", "clang", "mosquitto_pub", "/usr/bin/python3"]);
        assert_eq!(
            plan(&m, ROOT_APT),
            Plan::Install(vec!["clang", "mosquitto", "mosquitto-clients", "python3"])
        );
    }

    #[test]
    fn without_root_or_apt_each_missing_program_gets_one_line_with_its_command() {
        let m = named(&["mosquitto", "clang"]);
        let Plan::Refuse(lines) = plan(
            &m,
            Machine {
                root: false,
                apt: true,
            },
        ) else {
            panic!("not refused")
        };
        assert_eq!(
            lines,
            [
                "missing mosquitto (the MQTT tests' broker): install it with `sudo apt-get \
                 install mosquitto`",
                "missing clang (compiles the sockmap transport's eBPF programs): install it \
                 with `sudo apt-get install clang`",
            ]
        );
        let Plan::Refuse(lines) = plan(
            &m,
            Machine {
                root: true,
                apt: false,
            },
        ) else {
            panic!("not refused")
        };
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].ends_with("`apt-get install mosquitto`"),
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_toolchain_apt_cannot_give_is_refused_even_as_root() {
        let m = named(&["go", "/usr/sbin/nginx"]);
        let Plan::Refuse(lines) = plan(&m, ROOT_APT) else {
            panic!("not refused")
        };
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("missing go: install Go 1.24"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("apt-get install nginx-light"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn every_requirement_names_a_package_or_a_toolchain_once() {
        let mut probes: Vec<String> = REQUIREMENTS.iter().map(|r| r.probe.to_string()).collect();
        probes.sort();
        let n = probes.len();
        probes.dedup();
        assert_eq!(probes.len(), n, "a probe is listed twice");
        for r in REQUIREMENTS {
            assert!(!r.why.is_empty());
            assert!(
                r.package.is_some() || r.why.contains("https://"),
                "{}",
                r.probe
            );
        }
    }

    /// The benchmark's tests start `/usr/sbin/nginx` and fail without it: an `nginx`
    /// elsewhere on PATH must not count as installed.
    #[test]
    fn nginx_is_the_file_the_benchmark_starts_not_any_on_path() {
        let nginx: Vec<_> = REQUIREMENTS
            .iter()
            .filter(|r| r.package == Some("nginx-light"))
            .collect();
        assert_eq!(nginx.len(), 1);
        assert_eq!(nginx[0].probe, Probe::File("/usr/sbin/nginx"));
    }

    #[test]
    fn programs_are_found_on_the_given_path_only() {
        let dir = std::env::temp_dir().join(format!("xtask-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("zz-tool");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        assert_eq!(
            find_program("zz-tool", dir.as_os_str()),
            None,
            "not executable"
        );
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(find_program("zz-tool", dir.as_os_str()), Some(exe));
        assert_eq!(
            find_program("zz-tool", std::ffi::OsStr::new("/nonexistent")),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
