//! Which interpreter runs a Python or Node.js starter: one the chain's uid can run (as root,
//! every instance runs under a uid of its own, which cannot enter a folder such as `/root`).
//! The facts come from running each candidate ([`pick_interpreter`], [`probe`]); the choice
//! is a pure function of them ([`choice::choose`]), tested with tables; what others can reach
//! of a path is [`access`], and what differs between Python and Node.js is [`runtime`].

mod access;
mod choice;
mod probe;
mod runtime;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

pub(super) use self::access::{first_obstacle, unreadable_starter, Need};
use self::choice::{choose, verdict};
use self::probe::{ask, bounded, on_path, Candidate};
pub(super) use self::runtime::Runtime;

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
