//! What a run may hold in memory. A run keeps every record it makes until it writes its artifact
//! (and serialising it briefly holds the records twice more, as a JSON tree and as text), so a
//! count from a manifest or a flag (rounds, requests, tokens) multiplies into memory. Each
//! experiment estimates the bytes its parameters make it hold; this module holds the estimate to
//! what the machine has, before anything runs, with an error that gives the largest count that
//! fits instead of a run that swaps or is killed hours in.

use supply::manifest::Invalid;

/// The share of the memory available now that a run's records may take: the rest is the
/// model's, the engine's and everyone else's on the machine.
const SHARE: f64 = 0.5;

/// Memory available to new allocations now, in bytes (Linux's `MemAvailable`; total memory
/// where the system does not say).
pub fn available_bytes() -> u64 {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()));
    match sys.available_memory() {
        0 => sys.total_memory(),
        n => n,
    }
}

/// Checks that `count` of `field` (rounds, requests, ...), each holding about `each` bytes, plus
/// `base` bytes besides, fit in [`SHARE`] of `available` bytes. The error names the field, the
/// estimate and the largest count that fits.
pub fn fits(field: &str, count: u64, each: u64, base: u64, available: u64) -> Result<(), Invalid> {
    let room = (available as f64 * SHARE) as u128;
    let need = u128::from(count) * u128::from(each) + u128::from(base);
    if need <= room {
        return Ok(());
    }
    let most = room.saturating_sub(u128::from(base)) / u128::from(each.max(1));
    Err(Invalid::new(
        field,
        format!(
            "{count} would hold about {} in memory, more than half of the {} this machine has available; give at most {most}",
            human(need),
            human(u128::from(available))
        ),
    ))
}

/// Bytes as people read them: `28.0 GB`, `512.0 MB`.
pub fn human(bytes: u128) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_that_would_not_fit_names_the_largest_that_does() {
        let gb = 1_000_000_000;
        assert!(fits("rounds", 1000, 7_000, 0, 24 * gb).is_ok());
        let e = fits("parameters.rounds", 4_000_000, 7_000, 1_000_000, 24 * gb).unwrap_err();
        assert_eq!(e.field, "parameters.rounds");
        // 12 GB of room, less the base, over 7 kB each.
        assert!(e.problem.contains("about 28.0 GB") && e.problem.contains("24.0 GB"), "{e}");
        assert!(e.problem.ends_with("give at most 1714142"), "{e}");
        // No overflow at the extremes.
        assert!(fits("x", u64::MAX, u64::MAX, u64::MAX, u64::MAX).is_err());
        assert!(fits("x", 0, u64::MAX, 0, 0).is_ok());
        assert_eq!(human(999), "999 bytes");
        assert_eq!(human(1_500_000), "1.5 MB");
    }
}
