//! Which interpreter runs a Python or Node.js starter: one the chain's uid can run (as root,
//! every instance runs under a uid of its own, which cannot enter a folder such as `/root`).
//! The facts come from running each candidate ([`pick_interpreter`]); the choice is a pure
//! function of them ([`choose`]), tested with tables.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{shell_word, Lang};

/// Whether this process runs with effective uid 0 (from `/proc/self/status`; not root when
/// it cannot be read).
pub(super) fn effective_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The runtime of a starter that runs under an interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Runtime {
    Python,
    Node,
}

impl Runtime {
    pub(super) fn of(lang: Lang) -> Option<Runtime> {
        match lang {
            Lang::Python => Some(Runtime::Python),
            Lang::Node => Some(Runtime::Node),
            Lang::Rust | Lang::C | Lang::Go => None,
        }
    }

    /// The command looked for on PATH, then in /usr/bin and /usr/local/bin.
    fn command(self) -> &'static str {
        match self {
            Runtime::Python => "python3",
            Runtime::Node => "node",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Runtime::Python => "Python",
            Runtime::Node => "Node.js",
        }
    }

    /// The SDK's minimum version (sdk/python/pyproject.toml, sdk/node/package.json).
    fn minimum(self) -> (u32, u32) {
        match self {
            Runtime::Python => (3, 11),
            Runtime::Node => (18, 0),
        }
    }

    fn show_version(self, (major, minor): (u32, u32)) -> String {
        match self {
            Runtime::Python => format!("{major}.{minor}"),
            Runtime::Node if minor == 0 => format!("{major}"),
            Runtime::Node => format!("{major}.{minor}"),
        }
    }

    /// The Debian packages that give one.
    fn debian(self) -> &'static str {
        match self {
            Runtime::Python => "apt-get install python3 python3-pip",
            Runtime::Node => "apt-get install nodejs npm",
        }
    }

    /// The arguments that make it print what [`parse_probe`] reads.
    fn probe_args(self) -> [&'static str; 2] {
        match self {
            Runtime::Python => [
                "-c",
                "import os, sys\n\
                 print(sys.executable)\n\
                 print(sys.version_info[0], sys.version_info[1])\n\
                 print(sys.prefix)\n\
                 print(sys.base_prefix)\n\
                 print(os.path.dirname(os.__file__))",
            ],
            Runtime::Node => [
                "-p",
                "[process.execPath, process.versions.node.split('.').slice(0, 2).join(' ')]\
                 .join('\\n')",
            ],
        }
    }
}

/// What a candidate interpreter said about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Facts {
    /// The executable to name in `chain.yaml` (`sys.executable`, `process.execPath`).
    executable: PathBuf,
    version: (u32, u32),
    /// What else it needs to reach: Python's `sys.prefix`, `sys.base_prefix` and standard
    /// library.
    installation: Vec<(PathBuf, Need)>,
}

/// Reads the output of [`Runtime::probe_args`].
fn parse_probe(rt: Runtime, out: &str) -> Result<Facts, String> {
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
struct Candidate {
    /// Where it was found: the path on PATH, a fixed path, or as given to --interpreter.
    name: String,
    /// What it said about itself, or why it could not be asked.
    facts: Result<Facts, String>,
    /// The first thing of it others cannot reach, if any.
    obstacle: Option<Obstacle>,
    /// Python: whether `-m pip --version` works (`None`: not asked, or Node.js).
    pip: Option<bool>,
}

impl Candidate {
    /// How it is named in messages: `NAME`, or `NAME -> EXECUTABLE` when they differ.
    fn shown(&self) -> String {
        match &self.facts {
            Ok(f) if Path::new(&self.name) != f.executable => {
                format!("{} -> {}", self.name, f.executable.display())
            }
            _ => self.name.clone(),
        }
    }
}

/// Whether `c` can run the function: `Err` says why not, in one line.
fn verdict(c: &Candidate, rt: Runtime, as_root: bool) -> Result<(), String> {
    let facts = c.facts.as_ref().map_err(|e| format!("{}: {e}", c.name))?;
    if facts.version < rt.minimum() {
        return Err(format!(
            "{}: {} {} is older than {}, the SDK's minimum",
            c.shown(),
            rt.title(),
            rt.show_version(facts.version),
            rt.show_version(rt.minimum())
        ));
    }
    match &c.obstacle {
        Some(o) if as_root => Err(format!("{}: {o}", c.shown())),
        _ => Ok(()),
    }
}

/// The decision among candidates considered in order.
#[derive(Debug, PartialEq, Eq)]
struct Choice {
    /// The index of the chosen one.
    index: usize,
    /// Why each candidate before it was passed over, one line each.
    passed_over: Vec<String>,
}

/// Chooses among `candidates` (in order of preference): the first that can run the
/// function ([`verdict`]) and, for Python, has pip; failing that, the first that can run
/// it. `Err`: why each was refused, one line each.
fn choose(candidates: &[Candidate], rt: Runtime, as_root: bool) -> Result<Choice, Vec<String>> {
    let verdicts: Vec<_> = candidates.iter().map(|c| verdict(c, rt, as_root)).collect();
    let usable = |i: &usize| verdicts[*i].is_ok();
    let index = (0..candidates.len())
        .filter(usable)
        .find(|&i| candidates[i].pip != Some(false))
        .or_else(|| (0..candidates.len()).find(usable));
    match index {
        Some(index) => Ok(Choice {
            index,
            passed_over: verdicts[..index]
                .iter()
                .zip(candidates)
                .map(|(v, c)| match v {
                    Err(why) => why.clone(),
                    Ok(()) => format!("{}: has no pip", c.shown()),
                })
                .collect(),
        }),
        None => Err(verdicts.into_iter().filter_map(Result::err).collect()),
    }
}

/// The interpreter a starter is written for.
#[derive(Debug)]
pub(super) struct Chosen {
    pub(super) executable: PathBuf,
    /// Lines to show the user (on stderr): what was passed over, a missing pip.
    pub(super) notes: Vec<String>,
}

/// Finds, asks and chooses the interpreter of a `rt` starter: `given`, or the command on
/// PATH, /usr/bin's, /usr/local/bin's; fails with why each was refused.
pub(super) fn pick_interpreter(rt: Runtime, as_root: bool, given: Option<&Path>) -> Result<Chosen> {
    let places: Vec<(String, Option<PathBuf>)> = match given {
        Some(g) if g.as_os_str().as_encoded_bytes().contains(&b'/') => {
            let p = std::path::absolute(g)?;
            vec![(p.display().to_string(), Some(p))]
        }
        Some(g) => vec![(format!("{} on PATH", g.display()), on_path(g))],
        None => {
            let mut places = vec![(
                format!("{} on PATH", rt.command()),
                on_path(Path::new(rt.command())),
            )];
            for dir in ["/usr/bin", "/usr/local/bin"] {
                let p = Path::new(dir).join(rt.command());
                places.push((p.display().to_string(), Some(p)));
            }
            places
        }
    };
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for (label, place) in places {
        let Some(place) = place else {
            candidates.push(Candidate {
                name: label,
                facts: Err("not found".into()),
                obstacle: None,
                pip: None,
            });
            continue;
        };
        if seen.contains(&place) {
            continue; // PATH's is /usr/bin's
        }
        seen.push(place.clone());
        let name = place.display().to_string();
        if !place.exists() {
            candidates.push(Candidate {
                name,
                facts: Err("not found".into()),
                obstacle: None,
                pip: None,
            });
            continue;
        }
        let mut c = ask(rt, &place, name);
        let same = |e: &Candidate| matches!((&e.facts, &c.facts), (Ok(a), Ok(b)) if a == b);
        if candidates.iter().any(same) {
            continue; // another name of one before: the same answer
        }
        if verdict(&c, rt, as_root).is_ok() {
            if rt == Runtime::Python {
                let exe = &c.facts.as_ref().expect("it can run").executable;
                c.pip = Some(
                    bounded(
                        Command::new(exe).args(["-m", "pip", "--version"]),
                        Duration::from_secs(30),
                    )
                    .is_ok(),
                );
            }
            let done = c.pip != Some(false);
            candidates.push(c);
            if done {
                break;
            }
        } else {
            candidates.push(c);
        }
    }
    let choice = choose(&candidates, rt, as_root).map_err(|why| {
        let what = format!("{} {} or newer", rt.title(), rt.show_version(rt.minimum()));
        let (head, hint) = match (given, as_root) {
            (Some(g), true) => (
                format!("--interpreter {} cannot run the function", g.display()),
                format!(
                    "as root, `zerohop up` runs each instance under a uid of its own, which \
                     can only run an interpreter that others can reach: pass one that is, \
                     such as Debian's /usr/bin/{} ({})",
                    rt.command(),
                    rt.debian()
                ),
            ),
            (Some(g), false) => (
                format!("--interpreter {} cannot run the function", g.display()),
                format!("pass {what}"),
            ),
            (None, true) => (
                format!("no {what} that the chain's uid can run"),
                format!(
                    "as root, `zerohop up` runs each instance under a uid of its own, which \
                     can only run an interpreter that others can reach (not one under \
                     /root): install Debian's ({}), or pass --interpreter PATH",
                    rt.debian()
                ),
            ),
            (None, false) => (
                format!("no {what} to run the function"),
                format!(
                    "install one (Debian: {}), or pass --interpreter PATH",
                    rt.debian()
                ),
            ),
        };
        anyhow::anyhow!(
            "{head}:\n{}\n{hint}",
            why.iter()
                .map(|w| format!("  {w}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let c = &candidates[choice.index];
    let executable = c.facts.as_ref().expect("chosen").executable.clone();
    let mut notes: Vec<String> = choice
        .passed_over
        .iter()
        .map(|why| format!("not using {why}"))
        .collect();
    if c.pip == Some(false) {
        notes.push(format!(
            "{} has no pip (`-m pip --version` fails), which the pip step below needs: \
             install it first (Debian: apt-get install python3-pip)",
            executable.display()
        ));
    }
    Ok(Chosen { executable, notes })
}

/// Runs the candidate at `place` to learn its executable, version and installation, and
/// finds what of them others cannot reach.
fn ask(rt: Runtime, place: &Path, name: String) -> Candidate {
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
fn on_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Runs `cmd` (stdin closed) for at most `limit`; its standard output when it succeeds, or
/// why not.
fn bounded(cmd: &mut Command, limit: Duration) -> Result<String, String> {
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

/// What the chain's uid needs of a path, as one of "others" (it has a uid and gid of its
/// own and no supplementary groups, so it owns nothing and is in no file's group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Execute a file.
    Run,
    /// Pass through a folder.
    Enter,
    /// Look a folder's entries up and list them (Python's import system lists folders).
    List,
    /// Read a file.
    Read,
}

/// Something others cannot reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Obstacle {
    path: PathBuf,
    kind: Lack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lack {
    Missing,
    /// A folder on the way without o+x.
    Search,
    /// The file without o+x.
    Exec,
    /// The folder without o+r or o+x.
    List,
    /// The file without o+r.
    Read,
}

impl std::fmt::Display for Obstacle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.path.display();
        match self.kind {
            Lack::Missing => write!(f, "{p} does not exist"),
            Lack::Search => write!(
                f,
                "{p} is not searchable by others (o+x), and the chain's uid cannot enter it"
            ),
            Lack::Exec => write!(f, "{p} is not executable by others (o+x)"),
            Lack::List => write!(f, "{p} is not readable by others (o+rx)"),
            Lack::Read => write!(f, "{p} is not readable by others (o+r)"),
        }
    }
}

impl Obstacle {
    /// The command that removes it, if there is one.
    fn chmod(&self) -> Option<String> {
        let bits = match self.kind {
            Lack::Missing => return None,
            Lack::Search | Lack::Exec => "o+x",
            Lack::List => "o+rx",
            Lack::Read => "o+r",
        };
        Some(format!(
            "chmod {bits} {}",
            shell_word(&self.path.display().to_string())
        ))
    }
}

/// The first obstacle for others to `needs`, each checked from `/` down: every folder on
/// the way must be searchable (o+x), then the path itself as its [`Need`] says. `mode_of`
/// gives a path's `st_mode` following symbolic links (`None`: it does not exist).
pub(super) fn first_obstacle(
    needs: &[(PathBuf, Need)],
    mode_of: &dyn Fn(&Path) -> Option<u32>,
) -> Option<Obstacle> {
    needs.iter().find_map(|(path, need)| {
        let on_the_way: Vec<&Path> = path.ancestors().skip(1).collect();
        let blocked = on_the_way.into_iter().rev().find_map(|dir| {
            match mode_of(dir) {
                None => Some(Lack::Missing),
                Some(m) if m & 0o001 == 0 => Some(Lack::Search),
                Some(_) => None,
            }
            .map(|kind| Obstacle {
                path: dir.to_owned(),
                kind,
            })
        });
        blocked.or_else(|| {
            let kind = match (mode_of(path), need) {
                (None, _) => Some(Lack::Missing),
                (Some(m), Need::Run) if m & 0o001 == 0 => Some(Lack::Exec),
                (Some(m), Need::Enter) if m & 0o001 == 0 => Some(Lack::Search),
                (Some(m), Need::List) if m & 0o005 != 0o005 => Some(Lack::List),
                (Some(m), Need::Read) if m & 0o004 == 0 => Some(Lack::Read),
                _ => None,
            };
            kind.map(|kind| Obstacle {
                path: path.clone(),
                kind,
            })
        })
    })
}

/// The warning for a starter the chain's uid cannot read (as root), one line.
pub(super) fn unreadable_starter(o: &Obstacle, dir: &Path) -> String {
    let fix = match o.chmod() {
        Some(c) => format!("run `{c}` or create"),
        None => "create".to_owned(),
    };
    format!(
        "{o}: as root, `zerohop up` runs each instance under a uid of its own, which could \
         not read the function in {}; {fix} the starter in a folder others can enter (e.g. \
         under /srv)",
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A file system of modes: a root's home closed to others, pyenv in it, Debian's python
    /// in /usr, a private /opt/team.
    fn fake_fs() -> impl Fn(&Path) -> Option<u32> {
        let modes: HashMap<&str, u32> = [
            ("/", 0o40755),
            ("/root", 0o40700),
            ("/root/.pyenv", 0o40755),
            ("/root/.pyenv/versions", 0o40755),
            ("/root/.pyenv/versions/3.11.7", 0o40755),
            ("/root/.pyenv/versions/3.11.7/bin", 0o40755),
            ("/root/.pyenv/versions/3.11.7/bin/python3.11", 0o100755),
            ("/usr", 0o40755),
            ("/usr/bin", 0o40755),
            ("/usr/bin/python3.11", 0o100755),
            ("/usr/bin/secret", 0o100750),
            ("/usr/lib", 0o40755),
            ("/usr/lib/python3.11", 0o40755),
            ("/usr/lib/hidden", 0o40711),
            ("/usr/lib/notes.txt", 0o100640),
            ("/opt", 0o40755),
            ("/opt/team", 0o40750),
            ("/opt/team/python3", 0o100755),
        ]
        .into_iter()
        .collect();
        move |p: &Path| modes.get(p.to_str().unwrap()).copied()
    }

    #[test]
    fn obstacles_are_found_from_the_root_down() {
        let fs = fake_fs();
        let one = |path: &str, need| {
            first_obstacle(&[(PathBuf::from(path), need)], &fs).map(|o| o.to_string())
        };
        let table: &[(&str, Need, Option<&str>)] = &[
            ("/usr/bin/python3.11", Need::Run, None),
            ("/usr", Need::Enter, None),
            ("/usr/lib/python3.11", Need::List, None),
            (
                // The outermost folder is named, not the one that holds the file.
                "/root/.pyenv/versions/3.11.7/bin/python3.11",
                Need::Run,
                Some("/root is not searchable by others (o+x), and the chain's uid cannot enter it"),
            ),
            (
                "/root",
                Need::Enter,
                Some("/root is not searchable by others (o+x), and the chain's uid cannot enter it"),
            ),
            (
                "/opt/team/python3",
                Need::Run,
                Some("/opt/team is not searchable by others (o+x), and the chain's uid cannot enter it"),
            ),
            ("/usr/bin/secret", Need::Run, Some("/usr/bin/secret is not executable by others (o+x)")),
            ("/usr/lib/hidden", Need::Enter, None),
            ("/usr/lib/hidden", Need::List, Some("/usr/lib/hidden is not readable by others (o+rx)")),
            ("/usr/lib/notes.txt", Need::Read, Some("/usr/lib/notes.txt is not readable by others (o+r)")),
            ("/usr/bin/python9", Need::Run, Some("/usr/bin/python9 does not exist")),
            ("/nowhere/python3", Need::Run, Some("/nowhere does not exist")),
        ];
        for (path, need, want) in table {
            assert_eq!(one(path, *need).as_deref(), *want, "{path} {need:?}");
        }
        // Several needs: the first that fails.
        let needs = [
            (PathBuf::from("/usr/bin/python3.11"), Need::Run),
            (PathBuf::from("/usr/lib/hidden"), Need::List),
            (PathBuf::from("/root"), Need::Enter),
        ];
        let o = first_obstacle(&needs, &fs).unwrap();
        assert_eq!(o.path, Path::new("/usr/lib/hidden"));
        assert_eq!(o.chmod().as_deref(), Some("chmod o+rx /usr/lib/hidden"));
        let o = first_obstacle(&[(PathBuf::from("/root/my fn"), Need::List)], &fs).unwrap();
        assert_eq!(o.chmod().as_deref(), Some("chmod o+x /root"));
        assert_eq!(
            unreadable_starter(&o, Path::new("/root/my fn")),
            "/root is not searchable by others (o+x), and the chain's uid cannot enter it: as \
             root, `zerohop up` runs each instance under a uid of its own, which could not read \
             the function in /root/my fn; run `chmod o+x /root` or create the starter in a \
             folder others can enter (e.g. under /srv)"
        );
    }

    fn python(name: &str, exe: &str, version: (u32, u32)) -> Candidate {
        Candidate {
            name: name.into(),
            facts: Ok(Facts {
                executable: exe.into(),
                version,
                installation: Vec::new(),
            }),
            obstacle: None,
            pip: Some(true),
        }
    }

    fn closed(c: Candidate) -> Candidate {
        Candidate {
            obstacle: Some(Obstacle {
                path: "/root".into(),
                kind: Lack::Search,
            }),
            ..c
        }
    }

    fn no_pip(c: Candidate) -> Candidate {
        Candidate {
            pip: Some(false),
            ..c
        }
    }

    fn missing(name: &str) -> Candidate {
        Candidate {
            name: name.into(),
            facts: Err("not found".into()),
            obstacle: None,
            pip: None,
        }
    }

    #[test]
    fn the_interpreter_is_one_the_chains_uid_can_run() {
        let pyenv = || {
            python(
                "/root/.pyenv/shims/python3",
                "/root/.pyenv/versions/3.11.7/bin/python3.11",
                (3, 11),
            )
        };
        let debian = || python("/usr/bin/python3", "/usr/bin/python3", (3, 11));
        let local = || {
            python(
                "/usr/local/bin/python3",
                "/usr/local/bin/python3.12",
                (3, 12),
            )
        };
        let refused_pyenv = "/root/.pyenv/shims/python3 -> \
            /root/.pyenv/versions/3.11.7/bin/python3.11: /root is not searchable by others \
            (o+x), and the chain's uid cannot enter it";
        type Want = Result<(usize, Vec<String>), Vec<String>>;
        let ok = |i: usize, why: &[&str]| -> Want {
            Ok((i, why.iter().map(|s| s.to_string()).collect()))
        };
        let refused = |why: &[&str]| -> Want { Err(why.iter().map(|s| s.to_string()).collect()) };
        let table: Vec<(&str, Runtime, bool, Vec<Candidate>, Want)> = vec![
            (
                "as root, pyenv's is passed over for Debian's",
                Runtime::Python,
                true,
                vec![closed(pyenv()), debian()],
                ok(1, &[refused_pyenv]),
            ),
            (
                "not as root, PATH's is used wherever it lives",
                Runtime::Python,
                false,
                vec![closed(pyenv()), debian()],
                ok(0, &[]),
            ),
            (
                "one with pip is preferred",
                Runtime::Python,
                true,
                vec![no_pip(debian()), local()],
                ok(1, &["/usr/bin/python3: has no pip"]),
            ),
            (
                "without pip when none has it",
                Runtime::Python,
                true,
                vec![
                    closed(pyenv()),
                    no_pip(debian()),
                    missing("/usr/local/bin/python3"),
                ],
                ok(1, &[refused_pyenv]),
            ),
            (
                "too old, unreachable, missing: refused, each says why",
                Runtime::Python,
                true,
                vec![
                    closed(pyenv()),
                    python("/usr/bin/python3", "/usr/bin/python3", (3, 9)),
                    missing("/usr/local/bin/python3"),
                ],
                refused(&[
                    refused_pyenv,
                    "/usr/bin/python3: Python 3.9 is older than 3.11, the SDK's minimum",
                    "/usr/local/bin/python3: not found",
                ]),
            ),
            (
                "a probe that failed",
                Runtime::Python,
                false,
                vec![Candidate {
                    facts: Err("exit status: 1: SyntaxError: invalid syntax".into()),
                    ..python("/usr/bin/python2", "", (0, 0))
                }],
                refused(&["/usr/bin/python2: exit status: 1: SyntaxError: invalid syntax"]),
            ),
            (
                "Node.js: not on PATH, too old, then a good one",
                Runtime::Node,
                true,
                vec![
                    missing("node on PATH"),
                    Candidate {
                        pip: None,
                        ..python("/usr/bin/node", "/usr/bin/node", (16, 20))
                    },
                    Candidate {
                        pip: None,
                        ..python("/usr/local/bin/node", "/opt/node/bin/node", (20, 11))
                    },
                ],
                ok(
                    2,
                    &[
                        "node on PATH: not found",
                        "/usr/bin/node: Node.js 16.20 is older than 18, the SDK's minimum",
                    ],
                ),
            ),
            (
                "Node.js under /root, as root",
                Runtime::Node,
                true,
                vec![Candidate {
                    pip: None,
                    ..closed(python(
                        "/root/.nvm/node",
                        "/root/.nvm/v20/bin/node",
                        (20, 0),
                    ))
                }],
                refused(&[
                    "/root/.nvm/node -> /root/.nvm/v20/bin/node: /root is not searchable \
                           by others (o+x), and the chain's uid cannot enter it",
                ]),
            ),
        ];
        for (what, rt, as_root, candidates, want) in table {
            let got = choose(&candidates, rt, as_root).map(|c| (c.index, c.passed_over));
            assert_eq!(got, want, "{what}");
        }
    }

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
