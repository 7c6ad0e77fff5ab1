//! What the chain's uid can reach of a path, as one of "others": the first obstacle on the
//! way to what an interpreter or a starter needs, and the `chmod` that removes it.

use std::path::{Path, PathBuf};

use super::super::shell_word;

/// What the chain's uid needs of a path, as one of "others" (it has a uid and gid of its
/// own and no supplementary groups, so it owns nothing and is in no file's group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::new) enum Need {
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
pub(in crate::new) struct Obstacle {
    pub(super) path: PathBuf,
    pub(super) kind: Lack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lack {
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
pub(in crate::new) fn first_obstacle(
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
pub(in crate::new) fn unreadable_starter(o: &Obstacle, dir: &Path) -> String {
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
}
