//! Where the time of a task goes: each phase (packages, fmt, clippy, builds, each test
//! binary, fuzzing) is timed, appended to `target/xtask/phases.tsv` as it ends (so a failed
//! run still shows what it spent), and printed as a table at the end of the task;
//! `cargo xtask phases` prints the whole file (`.ci/run` empties it first and prints it
//! last, for the lints, the tests and the fuzzing together).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The file the phases of every task are appended to: `target/xtask/phases.tsv`, or
/// `XTASK_PHASES_FILE` (xtask's own tests run the task and keep their phases out of the
/// record of the run that runs them).
pub fn file(root: &Path) -> PathBuf {
    std::env::var_os("XTASK_PHASES_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/xtask/phases.tsv"))
}

/// The phases of one task.
pub struct Phases {
    task: &'static str,
    file: PathBuf,
    rows: Vec<(String, Duration, bool)>,
    started: Instant,
}

impl Phases {
    pub fn new(root: &Path, task: &'static str) -> Self {
        Self {
            task,
            file: file(root),
            rows: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Runs `f` as phase `name`, recording how long it took and whether it failed.
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let out = f();
        self.record(name, start.elapsed(), out.is_ok());
        out
    }

    /// Records a phase that ran elsewhere (a test binary, a background build).
    pub fn record(&mut self, name: &str, took: Duration, ok: bool) {
        self.rows.push((name.to_owned(), took, ok));
        let line = format!(
            "{}\t{}\t{:.1}\t{}\n",
            self.task,
            name,
            took.as_secs_f64(),
            if ok { "ok" } else { "FAILED" }
        );
        let appended = self
            .file
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.file)
            })
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            eprintln!(
                "xtask: cannot record phase {name} in {}: {e}",
                self.file.display()
            );
        }
    }

    /// Prints the table of this task's phases.
    pub fn print(&self) {
        let rows: Vec<(String, String, f64, bool)> = self
            .rows
            .iter()
            .map(|(n, d, ok)| (self.task.to_owned(), n.clone(), d.as_secs_f64(), *ok))
            .collect();
        eprint!("{}", table(&rows, Some(self.started.elapsed())));
    }
}

/// The table of `rows` (task, phase, seconds, ok), longest phases marked; `wall`: the
/// task's time from start to end (phases may overlap).
fn table(rows: &[(String, String, f64, bool)], wall: Option<Duration>) -> String {
    let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "\nxtask: where the time went\n  {:<8} {:<width$} {:>9}\n",
        "task", "phase", "seconds"
    );
    for (task, phase, secs, ok) in rows {
        out.push_str(&format!(
            "  {task:<8} {phase:<width$} {secs:>9.1}{}\n",
            if *ok { "" } else { "  FAILED" }
        ));
    }
    let sum: f64 = rows.iter().map(|r| r.2).sum();
    out.push_str(&format!(
        "  {:<8} {:<width$} {sum:>9.1}\n",
        "", "sum of phases"
    ));
    if let Some(w) = wall {
        out.push_str(&format!(
            "  {:<8} {:<width$} {:>9.1}  (phases overlap where they run side by side)\n",
            "",
            "wall clock",
            w.as_secs_f64()
        ));
    }
    out
}

/// `cargo xtask phases`: prints the table of every phase recorded in `target/xtask/phases.tsv`.
pub fn print_file(root: &Path) -> Result<()> {
    let path = file(root);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (no task has run yet?)", path.display()))?;
    let rows: Vec<(String, String, f64, bool)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (task, phase, secs, ok) = (f.next()?, f.next()?, f.next()?, f.next()?);
            Some((
                task.to_owned(),
                phase.to_owned(),
                secs.parse().ok()?,
                ok == "ok",
            ))
        })
        .collect();
    let mut by_task: Vec<(String, f64)> = Vec::new();
    for (task, _, secs, _) in &rows {
        match by_task.iter_mut().find(|(t, _)| t == task) {
            Some((_, s)) => *s += secs,
            None => by_task.push((task.clone(), *secs)),
        }
    }
    print!("{}", table(&rows, None));
    // Last, so that a log cut short in the middle still shows where the time went.
    print!("{}", longest(&rows, 15));
    for (task, secs) in by_task {
        println!("  {task:<8} sum of its phases {secs:>9.1} s");
    }
    Ok(())
}

/// The `n` longest of `rows`, longest first.
fn longest(rows: &[(String, String, f64, bool)], n: usize) -> String {
    let mut sorted: Vec<&(String, String, f64, bool)> = rows.iter().collect();
    sorted.sort_by(|a, b| b.2.total_cmp(&a.2));
    let width = sorted.iter().take(n).map(|r| r.1.len()).max().unwrap_or(5);
    let mut out = format!("xtask: the {} longest phases\n", n.min(rows.len()));
    for (task, phase, secs, _) in sorted.into_iter().take(n) {
        out.push_str(&format!("  {task:<8} {phase:<width$} {secs:>9.1}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_phase_marks_failures_and_sums_them() {
        let rows = vec![
            ("test".to_owned(), "build".to_owned(), 120.0, true),
            (
                "test".to_owned(),
                "zerohop-e2e::http".to_owned(),
                30.5,
                false,
            ),
        ];
        let t = table(&rows, Some(Duration::from_secs(100)));
        assert!(t.contains("build"), "{t}");
        assert!(t.contains("30.5  FAILED"), "{t}");
        assert!(t.contains("150.5"), "{t}");
        assert!(t.contains("100.0"), "{t}");
        let top = longest(&rows, 1);
        assert!(top.contains("build") && !top.contains("http"), "{top}");
    }
}
