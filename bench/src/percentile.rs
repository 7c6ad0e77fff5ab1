//! Order statistics of measured samples, one definition for every bench: the nearest-rank
//! percentile (exact, no interpolation: a reported p99 is a sample that was measured) and
//! the median of a few rounds.

/// The nearest-rank `q` quantile (`0 < q <= 1`) of `sorted` samples: the smallest sample
/// with at least a fraction `q` of them at or below it. With n samples, p99 is the largest
/// once n < 100. `None` when there are none.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of `values` in any order: the middle one, or the mean of the two middle ones
/// when their number is even; 0 when there are none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_picks_a_measured_sample() {
        let v: Vec<u64> = (1..=200).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(100));
        assert_eq!(nearest_rank(&v, 0.99), Some(198));
        assert_eq!(nearest_rank(&v, 1.0), Some(200));
        // Fewer than 100 samples: p99 is the largest.
        assert_eq!(nearest_rank(&[1.5, 2.5, 7.0], 0.99), Some(7.0));
        assert_eq!(nearest_rank(&[1.5, 2.5, 7.0], 0.5), Some(2.5));
        // q = 0 still names a sample, the smallest.
        assert_eq!(nearest_rank(&[4u64, 9], 0.0), Some(4));
        assert_eq!(nearest_rank::<u64>(&[], 0.5), None);
    }

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[-5.6]), -5.6);
        assert_eq!(median(&[]), 0.0);
    }
}
