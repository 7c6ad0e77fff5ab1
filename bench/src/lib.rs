//! `zerohop-bench`: zerohop measured side by side with what users would pick instead.
//!
//! Every system serves the same functions ([`Step`]) behind HTTP on loopback and is driven
//! by the same load generator ([`loadgen`]) in the same run; CPU and memory are read from
//! `/proc` per component ([`procstat`]); the physical floors of this machine (cache-line
//! ping-pong, futex, eventfd, unix socket, memcpy) and the transports' descriptor hops are
//! measured next to them ([`floors`]). The report ([`report::matrix`]) is `results.json`,
//! `summary.md` (ratios against the baselines) and PNG plots.
//!
//! The other bench binaries (`src/bin/`) share the same pieces: one `/proc` sampler
//! ([`procstat`]), one report writer ([`report`]: JSON, Markdown tables, where they go), one
//! definition of percentiles ([`percentile`]).
//!
//! Systems ([`systems`]):
//! * `zerohop-ring`, `zerohop-socket`: the real `zerohop up` with each transport;
//! * `monolith`: one hyper server running every function in-process (the upper bound);
//! * `http-chain`: each function its own hyper server, calling the next over loopback HTTP
//!   with keep-alive (SPRIGHT's "serverful" baseline);
//! * `nginx-broker`: every hop through an nginx front proxy (SPRIGHT's Knative-like broker).
//! * in the multi-core point only: `hyper-monolith` (the monolith on N worker threads),
//!   `go-monolith` and `go-http-chain` (the same in Go's `net/http`, `bench/go`).
//!
//! The multi-core point ([`cores`], issue 33) runs zerohop beside a hyper monolith on as many
//! cores and Go `net/http` baselines, every system on N cores and [`wrk`] on others, and
//! judges the goals ([`report::goals`]).
//!
//! The HTTPS and HTTP/2 rows ([`protocols`]) run zerohop's gateway over HTTP/1.1, h2c, HTTPS
//! and h2 and `nginx-tls` (nginx terminating TLS in front of the monolith), driven by
//! [`h2load`].
//!
//! `unsafe` only for syscalls: in [`floors`] (shared mappings, futex, affinity) and
//! [`procstat`] (affinity, sysconf).

pub mod cores;
pub mod floors;
pub mod h2load;
pub mod loadgen;
pub mod percentile;
pub mod procstat;
pub mod protocols;
pub mod report;
pub mod systems;
pub mod wrk;

use anyhow::Context;

/// The folder of the built binaries: `given`, else the folder of the running executable.
pub fn bin_dir(given: Option<&std::path::Path>) -> anyhow::Result<std::path::PathBuf> {
    match given {
        Some(d) => Ok(d.to_path_buf()),
        None => Ok(std::env::current_exe()
            .context("current_exe")?
            .parent()
            .context("binary folder")?
            .to_path_buf()),
    }
}

/// A report binary's `--quick` and `--out DIR` (default `results`), from `args`.
pub fn report_args(args: &[String]) -> (bool, std::path::PathBuf) {
    let quick = args.iter().any(|a| a == "--quick");
    let out = args.windows(2).find(|w| w[0] == "--out").map_or_else(
        || std::path::PathBuf::from("results"),
        |w| w[1].clone().into(),
    );
    (quick, out)
}

/// The checkout the binaries in `bin` (its `target/release/`) were built from: the nearest
/// folder above holding `marker`.
pub fn checkout(bin: &std::path::Path, marker: &str) -> anyhow::Result<std::path::PathBuf> {
    bin.ancestors()
        .find(|p| p.join(marker).is_file())
        .map(std::path::Path::to_owned)
        .with_context(|| format!("the checkout ({marker} above {})", bin.display()))
}

/// The built binary `name` in `dir`, or an error that says how to build it.
pub fn need_bin(dir: &std::path::Path, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let p = dir.join(name);
    anyhow::ensure!(
        p.is_file(),
        "{} is missing; build with `cargo build --release --workspace --bins`",
        p.display()
    );
    Ok(p)
}

/// Stops a child this benchmark started: SIGTERM, up to 15 s to exit, then SIGKILL; always
/// reaped. `what` names it in the message when it has to be killed.
pub fn stop_child(child: &mut std::process::Child, what: &str) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    // Not reaped yet, so the pid is still the child's.
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("{what} did not stop; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits at most `timeout` for the first line of a child's `stdout` that contains `marker`
/// (`""`: its first line). A thread reads, and keeps draining the rest so that the child never
/// blocks on a full pipe. `Disconnected` when stdout closed first (the child exited).
pub fn wait_line(
    stdout: std::process::ChildStdout,
    marker: &str,
    timeout: std::time::Duration,
) -> Result<String, std::sync::mpsc::RecvTimeoutError> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_owned();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        // A line that is not UTF-8 is skipped, not taken for the end.
        if let Some(line) = lines
            .by_ref()
            .filter_map(Result::ok)
            .find(|l| l.contains(&marker))
        {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    rx.recv_timeout(timeout)
}

/// One function of a benchmark chain; every system implements exactly these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// ASCII upper-case the body in place.
    Upper,
    /// Append `!`.
    Exclaim,
    /// Pass the body on unchanged.
    Pass,
}

impl Step {
    /// Name used for binaries, functions and paths.
    pub fn name(self) -> &'static str {
        match self {
            Step::Upper => "upper",
            Step::Exclaim => "exclaim",
            Step::Pass => "pass",
        }
    }

    /// Parses [`Step::name`].
    pub fn parse(s: &str) -> Option<Step> {
        match s {
            "upper" => Some(Step::Upper),
            "exclaim" => Some(Step::Exclaim),
            "pass" => Some(Step::Pass),
            _ => None,
        }
    }

    /// Applies the step to a body held in memory (the baselines' way).
    pub fn apply(self, body: &mut Vec<u8>) {
        match self {
            Step::Upper => body.make_ascii_uppercase(),
            Step::Exclaim => body.push(b'!'),
            Step::Pass => {}
        }
    }

    /// The expected answer of a chain of `steps` to `body`.
    pub fn expected(steps: &[Step], body: &[u8]) -> Vec<u8> {
        let mut b = body.to_vec();
        for s in steps {
            s.apply(&mut b);
        }
        b
    }
}

/// The hello chain: upper, then exclaim.
pub const HELLO: [Step; 2] = [Step::Upper, Step::Exclaim];

/// A chain of `n` pass-through functions.
pub fn passes(n: usize) -> Vec<Step> {
    vec![Step::Pass; n]
}

/// One process of a running system, for CPU and memory accounting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Component {
    /// What it is: `gateway`, `fn:upper`, `fn:pass#3`, `nginx`, `monolith`, ...
    pub name: String,
    /// Its pid (threads are counted through it).
    pub pid: u32,
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Duration;

    /// `sh -c script` with its stdout piped, and that stdout.
    fn sh(script: &str) -> (std::process::Child, std::process::ChildStdout) {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let out = child.stdout.take().expect("piped");
        (child, out)
    }

    #[test]
    fn wait_line_finds_the_marker_or_says_why_not() {
        let wait = Duration::from_secs(10);
        let (mut c, out) = sh("echo starting; echo 'ready at http://x'; echo 'ready at y'");
        assert_eq!(
            super::wait_line(out, "ready at ", wait),
            Ok("ready at http://x".into())
        );
        let (mut d, out) = sh("echo first; echo second");
        assert_eq!(super::wait_line(out, "", wait), Ok("first".into()));
        let (mut e, out) = sh("echo no marker here");
        assert_eq!(
            super::wait_line(out, "ready at ", wait),
            Err(RecvTimeoutError::Disconnected)
        );
        let (mut f, out) = sh("sleep 10");
        assert_eq!(
            super::wait_line(out, "", Duration::from_millis(100)),
            Err(RecvTimeoutError::Timeout)
        );
        super::stop_child(&mut f, "sleep");
        for c in [&mut c, &mut d, &mut e] {
            c.wait().expect("reaped");
        }
    }
}
