//! Asking a candidate interpreter about itself: running it (bounded in time) with the
//! runtime's probe, reading its answer, and finding what of it others cannot reach.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::access::{first_obstacle, Need, Obstacle};
use super::runtime::Runtime;

/// What a candidate interpreter said about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Facts {
    /// The executable to name in `chain.yaml` (`sys.executable`, `process.execPath`).
    pub(super) executable: PathBuf,
    pub(super) version: (u32, u32),
    /// What else it needs to reach: Python's `sys.prefix`, `sys.base_prefix` and standard
    /// library.
    pub(super) installation: Vec<(PathBuf, Need)>,
}

/// Reads the output of [`Runtime::probe_args`].
pub(super) fn parse_probe(rt: Runtime, out: &str) -> Result<Facts, String> {
    let mut lines = out.lines();
    let bad = || format!("unexpected answer to the probe: {:?}", out.trim());
    let executable = lines
        .next()
        .filter(|l| l.starts_with('/'))
        .ok_or_else(bad)?;
    let version = lines.next().ok_or_else(bad)?;
    let version = match version
        .split_whitespace()
        .map(str::parse::<u32>)
        .collect::<Result<Vec<_>, _>>()
        .as_deref()
    {
        Ok([major, minor]) => (*major, *minor),
        _ => return Err(bad()),
    };
    let mut installation = Vec::new();
    if rt == Runtime::Python {
        for need in [Need::Enter, Need::Enter, Need::List] {
            let dir = lines
                .next()
                .filter(|l| l.starts_with('/'))
                .ok_or_else(bad)?;
            installation.push((PathBuf::from(dir), need));
        }
    }
    Ok(Facts {
        executable: PathBuf::from(executable),
        version,
        installation,
    })
}

/// One interpreter considered, and what was found out about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Candidate {
    /// Where it was found: the path on PATH, a fixed path, or as given to --interpreter.
    pub(super) name: String,
    /// What it said about itself, or why it could not be asked.
    pub(super) facts: Result<Facts, String>,
    /// The first thing of it others cannot reach, if any.
    pub(super) obstacle: Option<Obstacle>,
    /// Python: whether `-m pip --version` works (`None`: not asked, or Node.js).
    pub(super) pip: Option<bool>,
}

impl Candidate {
    /// How it is named in messages: `NAME`, or `NAME -> EXECUTABLE` when they differ.
    pub(super) fn shown(&self) -> String {
        match &self.facts {
            Ok(f) if Path::new(&self.name) != f.executable => {
                format!("{} -> {}", self.name, f.executable.display())
            }
            _ => self.name.clone(),
        }
    }
}

/// Runs the candidate at `place` to learn its executable, version and installation, and
/// finds what of them others cannot reach.
pub(super) fn ask(rt: Runtime, place: &Path, name: String) -> Candidate {
    let facts = bounded(
        Command::new(place).args(rt.probe_args()),
        Duration::from_secs(20),
    )
    .and_then(|out| parse_probe(rt, &out));
    let obstacle = facts.as_ref().ok().and_then(|f| {
        let mut needs = vec![(f.executable.clone(), Need::Run)];
        if let Ok(real) = std::fs::canonicalize(&f.executable) {
            needs.push((real, Need::Run));
        }
        needs.extend(f.installation.iter().cloned());
        first_obstacle(&needs, &|p| std::fs::metadata(p).ok().map(|m| m.mode()))
    });
    Candidate {
        name,
        facts,
        obstacle,
        pip: None,
    }
}

/// The first executable file called `name` in a folder on PATH.
pub(super) fn on_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Runs `cmd` (stdin closed) for at most `limit`; its standard output when it succeeds, or
/// why not.
pub(super) fn bounded(cmd: &mut Command, limit: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    // Read on threads: a chatty child must not block on a full pipe, and a grandchild
    // that keeps a pipe open must not hold this up.
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, mut pipe) in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .enumerate()
    .filter_map(|(i, p)| Some((i, p?)))
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send((i, buf));
        });
    }
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {limit:?}"));
            }
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    };
    let mut out = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok((i, buf)) => out[i] = buf,
            Err(_) => break,
        }
    }
    if status.success() {
        Ok(String::from_utf8_lossy(&out[0]).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out[1]);
        match err.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => Err(format!("{status}: {}", last.trim())),
            None => Err(status.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_read() {
        let py = "/usr/bin/python3\n3 11\n/usr\n/usr\n/usr/lib/python3.11\n";
        assert_eq!(
            parse_probe(Runtime::Python, py),
            Ok(Facts {
                executable: "/usr/bin/python3".into(),
                version: (3, 11),
                installation: vec![
                    ("/usr".into(), Need::Enter),
                    ("/usr".into(), Need::Enter),
                    ("/usr/lib/python3.11".into(), Need::List),
                ],
            })
        );
        assert_eq!(
            parse_probe(Runtime::Node, "/usr/bin/node\n20 20\n"),
            Ok(Facts {
                executable: "/usr/bin/node".into(),
                version: (20, 20),
                installation: Vec::new(),
            })
        );
        for bad in [
            "",
            "\n3 11\n/usr\n/usr\n/usr/lib",
            "/usr/bin/python3\n3.11\n",
            "/x\n3 11\n",
        ] {
            assert!(parse_probe(Runtime::Python, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn probes_are_bounded() {
        let e = bounded(
            Command::new("sh").args(["-c", "sleep 5"]),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert_eq!(e, "no answer within 200ms");
        let e = bounded(
            Command::new("sh").args(["-c", "echo out; echo oops >&2; exit 3"]),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e, "exit status: 3: oops");
        assert_eq!(
            bounded(
                Command::new("sh").args(["-c", "echo hi"]),
                Duration::from_secs(5)
            ),
            Ok("hi\n".into())
        );
    }
}
