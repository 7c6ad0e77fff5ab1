//! Starting programs from the workspace's root: where that root is, which cargo, and running
//! one step (said first, its failure an error that names it), its output passed on or also
//! kept.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub fn run(step: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {step}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` as [`run`] does, its standard output echoed as it comes and returned.
pub fn run_echoed(step: &str, cmd: &mut Command) -> Result<String> {
    use std::io::BufRead;
    eprintln!("xtask: {step}");
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut out = String::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = Vec::new();
    while lines
        .read_until(b'\n', &mut line)
        .context("reading its output")?
        > 0
    {
        let text = String::from_utf8_lossy(&line);
        print!("{text}");
        out.push_str(&text);
        line.clear();
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(out)
}
