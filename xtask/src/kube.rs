//! `cargo xtask kube`: kube-apiserver, the Kubernetes tests' control plane, built from the Go
//! module proxy into `target/kube/bin` at the version `xtask/kube` pins (skipped, saying so,
//! when that version is there already). No kubectl: the tests speak the API server's REST API
//! (`zerohop_test_support::kube`), which spares the build of a second large Go program beside
//! the workspace's.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::cmd::{run, workspace_root};

/// The Kubernetes release the tests run against: `xtask/kube/go.mod` pins the same.
const KUBE_VERSION: &str = "v1.34.4";
/// Its major and minor version, as the binaries report them.
const KUBE_MAJOR_MINOR: (&str, &str) = ("1", "34");
/// The program built.
const APISERVER: &str = "kube-apiserver";

/// Builds kube-apiserver from the Go module proxy (`xtask/kube`, k8s.io/kubernetes at
/// [`KUBE_VERSION`]) into `target/kube/bin`, unless it is there already in that version.
/// The Go caches (about 3 GB, in `target/kube` while it builds) are removed once it built; a
/// failed build keeps them for the next try.
pub fn kube(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("cargo xtask kube takes no arguments (got `{a}`)");
    }
    let root = workspace_root();
    let dir = root.join("target/kube");
    let bin = dir.join("bin");
    let stamp = bin.join("VERSION");
    let have = std::fs::read_to_string(&stamp).unwrap_or_default();
    if have.trim() == KUBE_VERSION && bin.join(APISERVER).is_file() {
        eprintln!("xtask: kube-apiserver {KUBE_VERSION} is built (target/kube/bin)");
        return Ok(());
    }
    let (major, minor) = KUBE_MAJOR_MINOR;
    // Go with its caches in target/kube, in the module that pins Kubernetes.
    let go = || {
        let mut c = Command::new("go");
        c.current_dir(root.join("xtask/kube"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOCACHE", dir.join("go-cache"))
            .env("GOMODCACHE", dir.join("go-mod"));
        c
    };
    let ldflags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={KUBE_VERSION} \
         -X k8s.io/component-base/version.gitMajor={major} \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/client-go/pkg/version.gitVersion={KUBE_VERSION} \
         -X k8s.io/client-go/pkg/version.gitMajor={major} \
         -X k8s.io/client-go/pkg/version.gitMinor={minor}"
    );
    let started = Instant::now();
    run(
        &format!(
            "building {APISERVER} {KUBE_VERSION} from the Go module proxy into target/kube/bin \
             (about 5 minutes the first time)"
        ),
        go().args(["build", "-p", "2", "-o"])
            .arg(bin.join(APISERVER))
            .args(["-ldflags", &ldflags])
            .arg(format!("k8s.io/kubernetes/cmd/{APISERVER}")),
    )
    .with_context(|| {
        format!(
            "building {APISERVER} with `go` (it needs Go 1.24 or newer on PATH and the Go module \
             proxy reachable; see the output above)"
        )
    })?;
    eprintln!("xtask: {APISERVER} built in {:.0?}", started.elapsed());
    std::fs::write(&stamp, format!("{KUBE_VERSION}\n"))
        .context("writing target/kube/bin/VERSION")?;
    // The stamp makes a rebuild rare; the Go caches (about 3 GB) are not worth their disk.
    // The module cache is read-only, which only `go clean` removes; the build cache is a
    // plain folder.
    let cleaned = go().args(["clean", "-modcache"]).status();
    let cache = std::fs::remove_dir_all(dir.join("go-cache"));
    if !matches!(cleaned, Ok(s) if s.success()) || cache.is_err() {
        eprintln!("xtask: warning: could not remove the Go caches under target/kube");
    }
    Ok(())
}
