//! Units a spec writes: sizes (`64KiB`), CPU (`500m`, `1.5`) and durations (`30s`).

use std::time::Duration;

/// Parses `65536`, `64KiB`, `64K`, `1MiB`, `2GB`, `100B` (powers of two for every unit).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" | "k" | "kB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// A CPU amount in thousandths of a core: `0.5`, `2` (cores) or `500m`; between 10m and
/// 1024 cores.
pub fn parse_cpu(s: &str) -> Option<u32> {
    let s = s.trim();
    let millis = match s.strip_suffix('m') {
        Some(m) => m.trim().parse::<u64>().ok()?,
        None => {
            let cores: f64 = s.parse().ok()?;
            if !cores.is_finite() || cores <= 0.0 {
                return None;
            }
            (cores * 1000.0).round() as u64
        }
    };
    (10..=1024 * 1000)
        .contains(&millis)
        .then_some(millis as u32)
}

/// Parses `500ms`, `10s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    Some(match unit.trim() {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}
