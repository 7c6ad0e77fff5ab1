//! A chain's cores (`cpus:`): where its gateway threads and instances run, one pipeline per
//! core. Written as the kernel writes CPU lists (`0-3,8,10-11`, as `taskset -c` and
//! cgroups' `cpuset.cpus` take them), or as a list of numbers.
//!
//! With `cpus: C` (n cores), gateway thread `g` runs on `C[g mod n]`, and instance `k` of each
//! function (its `k`-th party, [`lane`]) on `C[k mod n]`; each sender picks the instance of
//! its own lane first (`zerohop_transport::pick`), so a request runs to its answer on one
//! core while that core's instances have room, and spills to the others only under
//! imbalance.

/// The highest CPU number a list may name (the kernel's `NR_CPUS` is 8,192 at most; lists
/// past a few hundred cores are not what a chain is for).
pub const MAX_CPU: u16 = 4095;

/// Why a CPU list was refused: a message for the spec error.
pub type ListError = String;

/// The CPUs of a list in the kernel's format (`0-3,8`), ascending and each once.
pub fn parse_list(text: &str) -> Result<Vec<u16>, ListError> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "{text:?} has an empty entry; write CPUs as `0-3,8`"
            ));
        }
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (cpu(a.trim())?, cpu(b.trim())?),
            None => {
                let c = cpu(part)?;
                (c, c)
            }
        };
        if from > to {
            return Err(format!(
                "the range `{part}` runs backwards; write `{to}-{from}`"
            ));
        }
        cpus.extend(from..=to);
    }
    Ok(normal(cpus))
}

/// The CPUs given as numbers, ascending and each once.
pub fn from_numbers(numbers: impl IntoIterator<Item = i64>) -> Result<Vec<u16>, ListError> {
    let cpus = numbers
        .into_iter()
        .map(|n| {
            u16::try_from(n)
                .ok()
                .filter(|&c| c <= MAX_CPU)
                .ok_or_else(|| format!("CPU {n} is out of range; use 0 to {MAX_CPU}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(normal(cpus))
}

fn cpu(text: &str) -> Result<u16, ListError> {
    text.parse::<u16>()
        .ok()
        .filter(|&c| c <= MAX_CPU)
        .ok_or_else(|| format!("`{text}` is not a CPU number from 0 to {MAX_CPU}"))
}

fn normal(mut cpus: Vec<u16>) -> Vec<u16> {
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// A CPU list in the kernel's format, ranges folded (`[0, 1, 2, 5]` -> `0-2,5`).
pub fn format_list(cpus: &[u16]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The lane of each party of `party_function` over `n` cores: a function's `k`-th party is
/// in lane `k mod n`, and so is gateway party `k` (the gateway's parties are one function).
/// `None` for every party when `n` is 0 (no `cpus`).
pub fn lanes(party_function: &[u8], n: usize) -> Vec<Option<usize>> {
    if n == 0 {
        return vec![None; party_function.len()];
    }
    let mut seen = [0usize; 256];
    party_function
        .iter()
        .map(|&f| {
            let k = &mut seen[usize::from(f)];
            let lane = *k % n;
            *k += 1;
            Some(lane)
        })
        .collect()
}

/// The lane of party `p` (see [`lanes`]), computed alone.
pub fn lane(party_function: &[u8], p: usize, n: usize) -> Option<usize> {
    let f = *party_function.get(p)?;
    if n == 0 {
        return None;
    }
    let k = party_function[..p].iter().filter(|&&g| g == f).count();
    Some(k % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_the_kernel_writes_them() {
        for (text, want) in [
            ("0", vec![0]),
            ("0-3", vec![0, 1, 2, 3]),
            ("0-1,4,6-7", vec![0, 1, 4, 6, 7]),
            (" 3 , 1-2 ", vec![1, 2, 3]),
            ("2,2,1-2", vec![1, 2]),
            ("4095", vec![4095]),
        ] {
            assert_eq!(parse_list(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty entry"),
            ("0,,1", "empty entry"),
            ("3-1", "runs backwards"),
            ("a", "not a CPU number"),
            ("-1", "not a CPU number"),
            ("4096", "not a CPU number"),
            ("0-", "not a CPU number"),
        ] {
            let e = parse_list(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(from_numbers([0, -1])
            .unwrap_err()
            .contains("-1 is out of range"));
        assert_eq!(from_numbers([3, 1, 3]).unwrap(), vec![1, 3]);
    }

    #[test]
    fn lists_fold_back_into_ranges() {
        for text in ["0", "0-3", "0-1,4,6-7", "1,3,5"] {
            assert_eq!(format_list(&parse_list(text).unwrap()), text);
        }
        assert_eq!(format_list(&[]), "");
    }

    #[test]
    fn each_function_deals_its_parties_over_the_lanes() {
        const G: u8 = 255;
        // Two gateway threads, function 0 with three parties, function 1 with two.
        let pf = [G, G, 0, 0, 0, 1, 1];
        let want = [0, 1, 0, 1, 0, 0, 1].map(Some).to_vec();
        assert_eq!(lanes(&pf, 2), want);
        for (p, w) in want.iter().enumerate() {
            assert_eq!(lane(&pf, p, 2), *w, "party {p}");
        }
        assert_eq!(lanes(&pf, 0), vec![None; 7]);
        assert_eq!(lane(&pf, 9, 2), None);
        assert_eq!(lanes(&pf, 1), vec![Some(0); 7]);
    }
}
