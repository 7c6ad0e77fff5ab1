//! What every bench binary writes: the machine the numbers come from, the report itself as
//! JSON (every figure) beside Markdown tables for people, and where they go.
//!
//! * [`publish`]: `NAME.json` and `NAME.md` in the results folder, the Markdown and a one-line
//!   summary on stdout (`zerohop-bench-languages`, `-activation`, `-apps`);
//! * [`print`]: the JSON then the Markdown on stdout, for a caller that keeps them
//!   (`zerohop-bench-scale`, whose files `cargo xtask bench` writes);
//! * [`Table`]: every Markdown table of the reports;
//! * [`matrix`]: the results of the matrix (`zerohop-bench`), `results.json` and `summary.md`;
//! * [`goals`]: the goals of issue 33 as rows of its targets table.
//!
//! The bytes are what docs, plots and xtask read: a change here changes every report.

pub mod goals;
pub mod matrix;

use std::fmt;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// The machine the numbers come from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    /// CPUs online.
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Memory in KiB.
    pub mem_kib: u64,
    /// Seconds since the epoch when the run started.
    pub started_unix: u64,
}

impl Machine {
    /// Reads this machine.
    pub fn read() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let mem_kib = crate::procstat::memory::meminfo_kib("MemTotal");
        Self {
            cores: crate::procstat::online_cpus(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            mem_kib,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// The load averages over 1, 5 and 15 minutes (`/proc/loadavg`), as `0.12 0.30 0.25`; empty
/// when unreadable. A busy machine lengthens everything, so reports give it.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a report binary leaves: `NAME.json` (every figure of `report`) and `NAME.md` (`md`)
/// in `dir`; then `md` on stdout, and `summary` when given, after a blank line, as the last
/// line of stdout (what a script or CI log reads).
pub fn publish(
    dir: &Path,
    name: &str,
    report: &impl serde::Serialize,
    md: &str,
    summary: Option<&str>,
) -> Result<()> {
    publish_to(
        dir,
        name,
        report,
        md,
        summary,
        &mut std::io::stdout().lock(),
    )
}

/// [`publish`], with `out` for stdout.
fn publish_to(
    dir: &Path,
    name: &str,
    report: &impl serde::Serialize,
    md: &str,
    summary: Option<&str>,
    out: &mut impl Write,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join(format!("{name}.json"));
    std::fs::write(&json, to_json(report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let md_file = dir.join(format!("{name}.md"));
    std::fs::write(&md_file, md).with_context(|| format!("writing {}", md_file.display()))?;
    write!(out, "{md}").context("writing the report to stdout")?;
    if let Some(summary) = summary {
        writeln!(out, "\n{summary}").context("writing the summary to stdout")?;
    }
    Ok(())
}

/// What a report binary whose caller keeps the files prints on stdout: the JSON document of
/// `report` on its own lines, then `md` after a blank line when given. Pretty JSON has no
/// blank line, so the first one separates the two (where `cargo xtask bench` cuts).
pub fn print(report: &impl serde::Serialize, md: Option<&str>) -> Result<()> {
    print_to(&mut std::io::stdout().lock(), report, md)
}

/// [`print`] into `out`.
fn print_to(out: &mut impl Write, report: &impl serde::Serialize, md: Option<&str>) -> Result<()> {
    writeln!(out, "{}", to_json(report)?).context("writing the report to stdout")?;
    if let Some(md) = md {
        writeln!(out, "\n{md}").context("writing the table to stdout")?;
    }
    Ok(())
}

/// `report` as the JSON every results file holds: pretty, two spaces, no final newline.
fn to_json(report: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string_pretty(report).context("serialising the report")
}

/// A Markdown table, built row by row: the header, the `|---|` rule under it, then one
/// `| a | b |` line per row, every line ended by a newline. Shown with `{}`.
#[derive(Clone, Debug)]
pub struct Table {
    columns: usize,
    text: String,
}

impl Table {
    /// A table with these column titles and no rows yet.
    pub fn new(header: &[impl AsRef<str>]) -> Self {
        let mut table = Self {
            columns: header.len(),
            text: String::new(),
        };
        table.line(header);
        table.text.push_str(&"|---".repeat(header.len()));
        table.text.push_str("|\n");
        table
    }

    /// Adds a row, one cell per column.
    ///
    /// # Panics
    ///
    /// When the number of cells is not the number of columns: every later cell would sit
    /// under the wrong title.
    pub fn row(&mut self, cells: &[impl AsRef<str>]) {
        assert_eq!(
            cells.len(),
            self.columns,
            "a row of {} cells in a table of {} columns",
            cells.len(),
            self.columns
        );
        self.line(cells);
    }

    /// Adds a row of `first`, then `rest` spanning the other columns (written as the empty
    /// cells that follow it: `| a | b |||`), for what has no numbers: a line not run, why.
    pub fn spanning_row(&mut self, first: &str, rest: &str) {
        let empty = "|".repeat(self.columns.saturating_sub(2));
        self.text
            .push_str(&format!("| {first} | {rest} |{empty}\n"));
    }

    fn line(&mut self, cells: &[impl AsRef<str>]) {
        self.text.push_str("| ");
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                self.text.push_str(" | ");
            }
            self.text.push_str(cell.as_ref());
        }
        self.text.push_str(" |\n");
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Small {
        name: &'static str,
        value: f64,
        list: Vec<u32>,
        none: Option<u32>,
    }

    const SMALL: Small = Small {
        name: "x",
        value: 1.5,
        list: Vec::new(),
        none: None,
    };

    const SMALL_JSON: &str =
        "{\n  \"name\": \"x\",\n  \"value\": 1.5,\n  \"list\": [],\n  \"none\": null\n}";

    fn small_table() -> Table {
        let mut t = Table::new(&["N", "ready s", "ok"]);
        t.row(&["10", "0.06", "yes"]);
        t.row(&[String::from("20"), format!("{:.2}", 0.175), "**no**".into()]);
        t.spanning_row("C", "not run: no `cc` on PATH");
        t
    }

    #[test]
    fn a_table_is_header_rule_and_rows() {
        assert_eq!(
            small_table().to_string(),
            "| N | ready s | ok |\n\
             |---|---|---|\n\
             | 10 | 0.06 | yes |\n\
             | 20 | 0.17 | **no** |\n\
             | C | not run: no `cc` on PATH ||\n"
        );
        assert_eq!(Table::new(&["a"]).to_string(), "| a |\n|---|\n");
    }

    #[test]
    #[should_panic(expected = "a row of 2 cells in a table of 3 columns")]
    fn a_row_of_the_wrong_width_is_refused() {
        Table::new(&["a", "b", "c"]).row(&["1", "2"]);
    }

    #[test]
    fn publish_writes_json_and_markdown_files_and_the_summary_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out_dir = dir.path().join("results");
        let md = format!("# Small\n\n{}", small_table());
        let mut stdout = Vec::new();
        publish_to(
            &out_dir,
            "small",
            &SMALL,
            &md,
            Some("small: ok"),
            &mut stdout,
        )
        .unwrap();
        let read = |f: &str| std::fs::read_to_string(out_dir.join(f)).expect(f);
        assert_eq!(read("small.json"), SMALL_JSON);
        assert_eq!(read("small.md"), md);
        assert_eq!(
            String::from_utf8(stdout).unwrap(),
            format!("{md}\nsmall: ok\n")
        );
        let mut stdout = Vec::new();
        publish_to(&out_dir, "small", &SMALL, "", None, &mut stdout).unwrap();
        assert!(stdout.is_empty());
        assert_eq!(read("small.md"), "");
    }

    #[test]
    fn print_writes_json_then_markdown_after_one_blank_line() {
        let mut out = Vec::new();
        print_to(&mut out, &SMALL, Some(&small_table().to_string())).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, format!("{SMALL_JSON}\n\n{}\n", small_table()));
        // Where `cargo xtask bench` cuts scale's output: the JSON, then the table.
        let (json, table) = text.split_once("\n\n").unwrap();
        assert_eq!(json, SMALL_JSON);
        assert!(table.starts_with("| N | ready s | ok |\n"));
        let mut out = Vec::new();
        print_to(&mut out, &SMALL, None).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), format!("{SMALL_JSON}\n"));
    }
}
