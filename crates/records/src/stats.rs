//! Summary statistics with the conventions of our metric definitions: percentiles by linear
//! interpolation between order statistics (numpy's default), and every summary carries its
//! sample count so that a p99 of five samples is visibly what it is.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub n: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// The `p`-th percentile (0..=100) of already sorted values; `None` when empty.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Summarises finite values; NaN and infinities are left out (and so not counted in `n`).
pub fn summarize(values: &[f64]) -> Summary {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Summary {
        n,
        mean: (n > 0).then(|| sorted.iter().sum::<f64>() / n as f64),
        p50: percentile_sorted(&sorted, 50.0),
        p95: percentile_sorted(&sorted, 95.0),
        p99: percentile_sorted(&sorted, 99.0),
        min: sorted.first().copied(),
        max: sorted.last().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_hand_computed_values() {
        // [1, 2, 3, 4, 10]: rank for p95 = 0.95 * 4 = 3.8 -> 4 + 0.8 * (10 - 4) = 8.8.
        let s = summarize(&[10.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.n, 5);
        assert_eq!(s.mean, Some(4.0));
        assert_eq!(s.p50, Some(3.0));
        assert!((s.p95.unwrap() - 8.8).abs() < 1e-12);
        // p99: rank 3.96 -> 4 + 0.96 * 6 = 9.76.
        assert!((s.p99.unwrap() - 9.76).abs() < 1e-12);
        assert_eq!((s.min, s.max), (Some(1.0), Some(10.0)));
    }

    #[test]
    fn even_count_median_interpolates_and_empty_is_none() {
        assert_eq!(summarize(&[1.0, 2.0, 3.0, 4.0]).p50, Some(2.5));
        let e = summarize(&[]);
        assert_eq!((e.n, e.mean, e.p50), (0, None, None));
        assert_eq!(summarize(&[f64::NAN, 7.0]).n, 1);
        assert_eq!(summarize(&[7.0]).p99, Some(7.0));
    }

    #[test]
    fn p95_of_five_samples_interpolates_between_the_top_two() {
        // rank 0.95 * 4 = 3.8 -> 0.4 + 0.8 * (0.5 - 0.4) = 0.48.
        let xs = [0.1, 0.2, 0.3, 0.4, 0.5];
        let s = summarize(&xs);
        assert!((s.p95.unwrap() - 0.48).abs() < 1e-12);
        assert!((s.mean.unwrap() - 0.3).abs() < 1e-12);
    }
}
