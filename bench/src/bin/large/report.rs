//! The report of the run: ratios of zerohop's figures to each baseline's, and the Markdown.

use serde_json::{json, Value};
use zerohop_bench::report::Table;

use crate::SIZES_MIB;

/// `a / b` of two figures of `points` (zerohop's over a baseline's), as `0.00x`.
fn ratio(points: &[Value], mib: usize, ours: &str, theirs: &str, key: &str) -> Option<f64> {
    let get = |system: &str| {
        points
            .iter()
            .find(|p| p["system"] == system && p["body_mib"].as_f64() == Some(mib as f64))
            .and_then(|p| p[key].as_f64())
    };
    match (get(ours), get(theirs)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

const FIGURES: [&str; 4] = [
    "p50_ms",
    "mib_per_s",
    "cpu_ms_per_request",
    "memory_peak_mib",
];

pub fn ratios(points: &[Value], baselines: &[&str]) -> Value {
    let mut out = Vec::new();
    for mib in SIZES_MIB {
        for base in baselines {
            let mut row = json!({ "body_mib": mib, "over": base });
            for key in FIGURES {
                row[key] = json!(ratio(points, mib, "zerohop", base, key));
            }
            out.push(row);
        }
    }
    Value::Array(out)
}

fn fmt(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

pub fn markdown(r: &Value) -> String {
    let mut s = String::from(
        "# Bodies larger than a slot: zerohop beside the monolith and the HTTP chain\n\n\
         Hello chain (upper, then exclaim), one request at a time, every answer checked.\n\n",
    );
    let mut t = Table::new(&[
        "system",
        "body",
        "requests",
        "p50 latency",
        "MiB/s of body",
        "CPU ms / request",
        "memory before -> peak (MiB)",
    ]);
    for p in r["points"].as_array().into_iter().flatten() {
        let body = format!("{} MiB", fmt(&p["body_mib"], 0));
        let memory = format!(
            "{} -> {}",
            fmt(&p["memory_before_mib"], 1),
            fmt(&p["memory_peak_mib"], 1)
        );
        let name = p["system"].as_str().unwrap_or("?");
        match p["error"].as_str() {
            Some(e) => t.spanning_row(&format!("{name}, {body}"), &format!("failed: {e}")),
            None => t.row(&[
                name.to_owned(),
                body,
                p["requests"].to_string(),
                format!("{} ms", fmt(&p["p50_ms"], 1)),
                fmt(&p["mib_per_s"], 0),
                fmt(&p["cpu_ms_per_request"], 2),
                memory,
            ]),
        }
    }
    s.push_str(&format!("{t}\n"));
    let mut t = Table::new(&[
        "body",
        "zerohop / ...",
        "p50 latency",
        "MiB/s",
        "CPU per request",
        "peak memory",
    ]);
    for row in r["ratios"].as_array().into_iter().flatten() {
        let mut cells = vec![
            format!("{} MiB", row["body_mib"]),
            row["over"].as_str().unwrap_or("?").to_owned(),
        ];
        cells.extend(FIGURES.iter().map(|k| match row[*k].as_f64() {
            Some(x) => format!("{x:.2}x"),
            None => "-".into(),
        }));
        t.row(&cells);
    }
    s.push_str(&format!("{t}\n"));
    let largest = SIZES_MIB[SIZES_MIB.len() - 1];
    let mut t = Table::new(&[
        "system",
        "process",
        "user ms / request",
        "system ms / request",
    ]);
    for p in r["points"].as_array().into_iter().flatten() {
        if p["body_mib"].as_f64() != Some(largest as f64) {
            continue;
        }
        for c in p["cpu_by_process"].as_array().into_iter().flatten() {
            t.row(&[
                p["system"].as_str().unwrap_or("?").to_owned(),
                c["process"].as_str().unwrap_or("?").to_owned(),
                fmt(&c["user_ms_per_request"], 1),
                fmt(&c["system_ms_per_request"], 1),
            ]);
        }
    }
    s.push_str(&format!("Where the CPU goes at {largest} MiB:\n\n{t}\n"));
    let d = &r["disturbance"];
    s.push_str(&format!(
        "Client and sampler on CPU 0, systems on {}. Memory: {}. CPU: utime + stime of the \
         system's processes over the measured requests (10 ms ticks). Load average {} before, \
         {} after; other processes took {} cores and the host {} (steal) while it ran{}.\n\n{}\n",
        r["system_cpus"].as_str().unwrap_or("any CPU (not pinned)"),
        r["memory_method"].as_str().unwrap_or(""),
        r["load_before"].as_str().unwrap_or("?"),
        r["load_after"].as_str().unwrap_or("?"),
        fmt(&d["other_cores"], 2),
        fmt(&d["steal_cores"], 2),
        if r["busy"] == true {
            ": **the machine was busy**, read the ratios, not the absolute numbers"
        } else {
            ""
        },
        r["cannot_show"].as_str().unwrap_or(""),
    ));
    s
}

pub const MEMORY_METHOD: &str = "sampled every 2 ms from /proc while the size's requests ran, \
     sum over the system's processes of VmRSS - RssShmem, plus the resident pages of the \
     memfds they hold counted once (zerohop's pool, mapped by the gateway and both functions)";

pub fn cannot_show(cores: usize) -> String {
    format!(
        "What {cores} CPUs cannot show: every process of a system shares {} here, so the \
         stages of one request never overlap: zerohop's gateway streaming a body in, \
         `upper` and `exclaim` on it, and the answer streaming out run one after another on \
         one core, as do the baselines' read, copy and forward; latency is then the sum of \
         the CPU each stage spends, which is why CPU per request is the figure to read. Nor \
         can it show several large bodies at once (up to `pool.large_slots`, 16) competing \
         for memory bandwidth, or what a function on a core of its own would gain from not \
         copying.",
        if cores > 2 {
            "the CPUs left to it"
        } else {
            "one CPU"
        }
    )
}
