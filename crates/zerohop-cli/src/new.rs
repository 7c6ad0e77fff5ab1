//! `zerohop new --lang LANG NAME`: a starter function in a folder of its own, from the
//! templates in `templates/LANG` (built into the binary): the handler, its build file, a
//! `chain.yaml` that runs it on one route, and a README with the commands.
//!
//! Placeholders in paths and contents: `{{name}}` (the folder's name, also the function's,
//! the chain's and the route's), `{{sdk}}` (the zerohop checkout the SDKs are taken from),
//! `{{dir}}` (the new folder, absolute) and, for Python and Node.js, the interpreter chosen
//! for the function: `{{interpreter}}` as a shell word (README, printed commands) and
//! `{{interpreter_yaml}}` as a quoted YAML string (`chain.yaml`).
//!
//! The interpreter is chosen so that the commands work as printed: as root, `zerohop up`
//! runs every instance under a uid of its own, which can only run an interpreter whose
//! executable and installation others can reach (not pyenv's, conda's or a virtualenv's
//! under `/root`); see [`choose`].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

mod interpreter;

use self::interpreter::{
    effective_uid_is_root, first_obstacle, pick_interpreter, unreadable_starter, Need, Runtime,
};

/// The languages there is a template for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    C,
    Go,
    Python,
    Node,
}

/// One template: files as (path, contents), and the commands that build and run it.
struct Template {
    files: &'static [(&'static str, &'static str)],
    build: &'static [&'static str],
}

macro_rules! files {
    ($lang:literal: $($path:literal),+ $(,)?) => {
        &[$(($path, include_str!(concat!("../templates/", $lang, "/", $path)))),+]
    };
}

fn template(lang: Lang) -> Template {
    match lang {
        Lang::Rust => Template {
            files: files!("rust": "Cargo.toml", "src/main.rs", "chain.yaml", "README.md"),
            build: &["cargo build --release"],
        },
        Lang::C => Template {
            files: files!("c": "{{name}}.c", "Makefile", "chain.yaml", "README.md"),
            build: &["(cd {{sdk}} && cargo xtask c-sdk)   # once", "make"],
        },
        Lang::Go => Template {
            files: files!("go": "go.mod", "main.go", "chain.yaml", "README.md"),
            build: &[
                "(cd {{sdk}} && cargo xtask c-sdk)   # once",
                "PKG_CONFIG_PATH={{sdk}}/target/c-sdk/lib/pkgconfig go build -o {{name}} .",
            ],
        },
        Lang::Python => Template {
            files: files!("python": "handler.py", "chain.yaml", "README.md"),
            build: &["{{interpreter}} -m pip install --target .packages {{sdk}}/sdk/python"],
        },
        Lang::Node => Template {
            files: files!("node": "handler.js", "package.json", "chain.yaml", "README.md"),
            build: &[
                "(cd {{sdk}}/sdk/node && npm run build)   # once",
                "npm install",
            ],
        },
    }
}

/// The zerohop checkout this binary was built from, if it is still there.
fn default_sdk() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.parent()?;
    root.join("crates/zerohop-runtime/Cargo.toml")
        .is_file()
        .then(|| root.to_owned())
}

/// Writes the starter of `lang` into the new folder `path` and prints the next steps.
/// `interpreter` (Python and Node.js only) overrides the choice of the interpreter; it is
/// checked the same way.
pub fn new(
    lang: Lang,
    path: &Path,
    sdk: Option<PathBuf>,
    interpreter: Option<PathBuf>,
) -> Result<()> {
    let runtime = Runtime::of(lang);
    if interpreter.is_some() && runtime.is_none() {
        bail!(
            "--interpreter is for --lang python or node only (a {lang:?} starter builds a \
             program of its own)"
        );
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("NAME must end in a folder name")?;
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit() || c == '-')
    {
        bail!(
            "`{name}` cannot name a function: use 1 to 64 letters, digits, `-` or `_`, \
             starting with a letter or `_` (it names the function, the chain and the route)"
        );
    }
    let sdk = match sdk.or_else(default_sdk) {
        Some(s) => std::path::absolute(&s)?,
        None => bail!(
            "no zerohop checkout to take the SDK from: pass --sdk DIR (the folder holding \
             crates/, sdk/ and xtask/)"
        ),
    };
    if !sdk.join("crates/zerohop-runtime/Cargo.toml").is_file() {
        bail!(
            "{} is not a zerohop checkout (no crates/zerohop-runtime/Cargo.toml)",
            sdk.display()
        );
    }
    if path.exists() && std::fs::read_dir(path)?.next().is_some() {
        bail!("{} exists and is not empty", path.display());
    }
    let as_root = effective_uid_is_root();
    // Before anything is written: with no interpreter to run it, there is no starter.
    let chosen = match runtime {
        Some(rt) => Some(pick_interpreter(rt, as_root, interpreter.as_deref())?),
        None => None,
    };
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    let dir = std::path::absolute(path)?;
    let (shell, yaml) = match &chosen {
        Some(c) => {
            let p = c.executable.display().to_string();
            (shell_word(&p), serde_json::to_string(&p)?)
        }
        None => Default::default(),
    };
    let fill = |s: &str| {
        s.replace("{{name}}", name)
            .replace("{{sdk}}", &sdk.display().to_string())
            .replace("{{dir}}", &dir.display().to_string())
            .replace("{{interpreter_yaml}}", &yaml)
            .replace("{{interpreter}}", &shell)
    };
    let t = template(lang);
    let mut written = Vec::new();
    for (file, contents) in t.files {
        let to = dir.join(fill(file));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&to, fill(contents)).with_context(|| format!("writing {}", to.display()))?;
        written.push(to);
    }
    if let (Some(rt), Some(c)) = (runtime, &chosen) {
        for note in &c.notes {
            eprintln!("zerohop: note: {note}");
        }
        if as_root {
            let mode_of = |p: &Path| std::fs::metadata(p).ok().map(|m| m.mode());
            let mut needs = vec![(dir.clone(), Need::List)];
            needs.extend(written.iter().map(|f| (f.clone(), Need::Read)));
            if rt == Runtime::Node {
                // `npm install` links the package to the checkout's folder.
                needs.push((sdk.join("sdk/node"), Need::List));
            }
            if let Some(o) = first_obstacle(&needs, &mode_of) {
                eprintln!("zerohop: warning: {}", unreadable_starter(&o, &dir));
            }
        }
    }
    match &chosen {
        Some(c) => println!(
            "created {} ({lang:?} function `{name}`, run by {}); next:",
            path.display(),
            c.executable.display()
        ),
        None => println!(
            "created {} ({lang:?} function `{name}`); next:",
            path.display()
        ),
    }
    println!("  cd {}", path.display());
    for step in t.build {
        println!("  {}", fill(step));
    }
    println!("  zerohop up chain.yaml");
    println!("  curl -d 'hello' http://127.0.0.1:8080/{name}");
    Ok(())
}

/// `s` as one word of a POSIX shell line: as is when it needs no quoting, else in single
/// quotes.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_is_filled_and_its_chain_is_valid() {
        let sdk = default_sdk().expect("tests run in the checkout");
        let base = std::env::temp_dir().join(format!("zerohop-new-{}", std::process::id()));
        for lang in Lang::value_variants() {
            let dir = base.join(format!("{lang:?}").to_lowercase()).join("my_fn");
            new(*lang, &dir, None, None).unwrap();
            let mut seen = 0;
            for entry in walk(&dir) {
                let text = std::fs::read_to_string(&entry).unwrap();
                assert!(
                    !text.contains("{{"),
                    "{}: a placeholder is left",
                    entry.display()
                );
                assert!(!entry.display().to_string().contains("{{"));
                seen += 1;
            }
            assert_eq!(seen, template(*lang).files.len());
            let spec = dir.join("chain.yaml");
            let text = std::fs::read_to_string(&spec).unwrap();
            let chain =
                zerohop_spec::parse(&spec, &text).unwrap_or_else(|e| panic!("{lang:?}: {e}"));
            assert_eq!(chain.name, "my_fn");
            assert_eq!(chain.functions[0].name, "my_fn");
            assert!(text.contains("/my_fn"));
            if Runtime::of(*lang).is_some() {
                // An absolute interpreter, chosen by `zerohop new`.
                assert!(text.contains("interpreter: \"/"), "{lang:?}: {text}");
            }
            // A second time into the same folder: refused, nothing overwritten.
            let e = new(*lang, &dir, Some(sdk.clone()), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("exists and is not empty"), "{e}");
        }
        for bad in ["9lives", "has space", "-dash"] {
            let e = new(Lang::Rust, &base.join(bad), None, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("cannot name a function"), "{bad}: {e}");
        }
        let e = new(Lang::C, &base.join("x"), Some(base.clone()), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a zerohop checkout"), "{e}");
        // --interpreter: for Python and Node.js only, and checked.
        let e = new(
            Lang::Go,
            &base.join("g"),
            None,
            Some("/usr/bin/python3".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--interpreter is for --lang python or node"),
            "{e}"
        );
        let missing = base.join("no/such/python3");
        let e = new(Lang::Python, &base.join("p"), None, Some(missing.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "--interpreter {} cannot run the function:\n  {}: not found",
                missing.display(),
                missing.display()
            )),
            "{e}"
        );
        assert!(!base.join("p").exists(), "nothing is written when it fails");
        std::fs::remove_dir_all(&base).unwrap();
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(
            shell_word("/opt/my python/bin/python3"),
            "'/opt/my python/bin/python3'"
        );
        assert_eq!(shell_word("/o'k"), r"'/o'\''k'");
    }
}
