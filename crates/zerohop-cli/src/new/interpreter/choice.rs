//! The choice among the candidates asked, in order of preference: a pure function of what
//! they said and what others can reach of them, tested with tables.

use super::probe::Candidate;
use super::runtime::Runtime;

/// Whether `c` can run the function: `Err` says why not, in one line.
pub(super) fn verdict(c: &Candidate, rt: Runtime, as_root: bool) -> Result<(), String> {
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
pub(super) struct Choice {
    /// The index of the chosen one.
    pub(super) index: usize,
    /// Why each candidate before it was passed over, one line each.
    pub(super) passed_over: Vec<String>,
}

/// Chooses among `candidates` (in order of preference): the first that can run the
/// function ([`verdict`]) and, for Python, has pip; failing that, the first that can run
/// it. `Err`: why each was refused, one line each.
pub(super) fn choose(
    candidates: &[Candidate],
    rt: Runtime,
    as_root: bool,
) -> Result<Choice, Vec<String>> {
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

#[cfg(test)]
mod tests {
    use super::super::access::{Lack, Obstacle};
    use super::super::probe::Facts;
    use super::*;

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
}
