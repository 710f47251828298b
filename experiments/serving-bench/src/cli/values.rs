//! The parsers of flag values a clap type cannot say alone: seconds within the run's bounds, a
//! scrape interval, an SLO, an open-loop rate. Each error names the value and what is allowed.

use crate::serving;

/// A flag's value that is not a positive number of seconds up to [`serving::MAX_TIMEOUT_S`].
#[derive(Debug, thiserror::Error)]
pub enum SecondsError {
    #[error("`{0}` is not a number of seconds")]
    NotANumber(String),
    #[error("{0}: must be above 0 and at most {max} seconds", max = serving::MAX_TIMEOUT_S)]
    OutOfRange(f64),
}

/// A positive number of seconds, at most a week.
pub fn seconds(s: &str) -> Result<f64, SecondsError> {
    let v: f64 = s.parse().map_err(|_| SecondsError::NotANumber(s.to_string()))?;
    if v.is_finite() && v > 0.0 && v <= serving::MAX_TIMEOUT_S {
        Ok(v)
    } else {
        Err(SecondsError::OutOfRange(v))
    }
}

/// A `--scrape-metrics` interval: seconds within [`serving::SCRAPE_INTERVAL_S`].
pub(super) fn scrape_interval(s: &str) -> Result<f64, String> {
    let (low, high) = serving::SCRAPE_INTERVAL_S;
    match s.parse::<f64>() {
        Ok(v) if (low..=high).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from {low} to {high}")),
    }
}

/// An `--slo` value that is not METRIC=MS.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not METRIC=MS, e.g. ttft_ms=500")]
pub struct SloError(String);

/// `METRIC=MS`; the metric's name is checked with the other parameters.
pub fn slo(s: &str) -> Result<(String, f64), SloError> {
    let (metric, ms) = s.split_once('=').ok_or_else(|| SloError(s.to_string()))?;
    let ms: f64 = ms.trim().parse().map_err(|_| SloError(s.to_string()))?;
    Ok((metric.trim().to_string(), ms))
}

/// An open-loop rate: requests per second, or `None` for unbounded (`inf`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub Option<f64>);

/// A `--request-rate` value that is neither a positive number nor `inf`.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a rate: give requests per second above 0 and at most {max}, or inf", max = serving::MAX_RATE)]
pub struct RateError(String);

/// A positive number of requests per second up to [`serving::MAX_RATE`], or `inf`.
pub fn rate(s: &str) -> Result<Rate, RateError> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(Rate(None));
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= serving::MAX_RATE => Ok(Rate(Some(v))),
        _ => Err(RateError(s.to_string())),
    }
}
