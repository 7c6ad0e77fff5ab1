//! The Go baselines of the multi-core point: `bench/go/fn` (standard library only), built
//! with `go build` into `target/bench-go/zerohop-bench-go` beside the release folder, with no
//! module download (`GOPROXY=off`, `GOTOOLCHAIN=local`: the installed toolchain or nothing).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The built program's name.
pub const PROGRAM: &str = "zerohop-bench-go";
/// Bound on one `go build` (a first build compiles the standard library's net/http).
const BUILD_WAIT: Duration = Duration::from_secs(300);

/// Where the Go function server is for binaries in `bin_dir` (`target/release`):
/// `target/bench-go/zerohop-bench-go`.
pub fn path(bin_dir: &Path) -> PathBuf {
    bin_dir
        .parent()
        .unwrap_or(bin_dir)
        .join("bench-go")
        .join(PROGRAM)
}

/// The built Go function server, or an error that says how to get it.
pub fn binary(bin_dir: &Path) -> Result<PathBuf> {
    let p = path(bin_dir);
    if !p.is_file() {
        bail!(
            "{} is missing: zerohop-bench builds it with `go build` (bench/go) before the \
             multi-core point; Go must be on PATH",
            p.display()
        );
    }
    Ok(p)
}

/// Builds `bench/go/fn` of the checkout above `bin_dir` into [`path`] (go's cache makes a
/// second build cheap); returns the binary.
pub fn build(bin_dir: &Path) -> Result<PathBuf> {
    let root = crate::checkout(bin_dir, "bench/go/go.mod")?;
    let out = path(bin_dir);
    let mut child = Command::new("go")
        .args(["build", "-buildvcs=false", "-trimpath", "-o"])
        .arg(&out)
        .arg("./fn")
        .current_dir(root.join("bench/go"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting `go build` for the Go baselines (is Go on PATH?)")?;
    let deadline = Instant::now() + BUILD_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for go build")? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`go build` of bench/go took over {BUILD_WAIT:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!("`go build` of bench/go failed ({status}): {}", err.trim());
    }
    Ok(out)
}
