//! A KV budget as a user gives it, in one syntax wherever it is given (the server's
//! `--kv-budget`, the benchmark's `--server-kv-budget` and its manifests): a count of positions
//! (`65536`), or bytes with a unit (`4GB`, `512MiB`, `1.5GiB`).

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

/// A KV budget: positions, or bytes of the pool ([`super::Qwen2::budget_positions`] turns
/// either into this model's positions). Recorded as given: positions as a number, bytes as a
/// string of whole bytes (`"536870912B"`), which parses back to the same budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    Positions(u64),
    Bytes(u64),
}

/// A budget that is neither a count of positions nor bytes with a unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a KV budget: give positions (65536) or bytes with a unit (4GB, 512MiB, 1.5GiB)")]
pub struct KvBudgetError(String);

/// The most bytes a budget may name: a petabyte, far beyond any machine, and exact in `f64`.
const MAX_BYTES: f64 = 1e15;

impl KvBudget {
    /// Parses positions (`65536`, above 0) or bytes with a decimal or binary unit
    /// (`B`, `kB`..`TB`, `KiB`..`TiB`, any case; `1.5GiB`), at least one byte.
    pub fn parse(s: &str) -> Result<KvBudget, KvBudgetError> {
        let bad = || KvBudgetError(s.to_string());
        let t = s.trim();
        if let Ok(n) = t.parse::<u64>() {
            return (n > 0).then_some(KvBudget::Positions(n)).ok_or_else(bad);
        }
        let split = t.find(|c: char| c.is_ascii_alphabetic()).ok_or_else(bad)?;
        let (number, unit) = t.split_at(split);
        let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "b" => 1.0,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0f64.powi(3),
            "tib" => 1024.0f64.powi(4),
            _ => return Err(bad()),
        };
        let bytes = number.trim().parse::<f64>().map_err(|_| bad())? * scale;
        if !(bytes.is_finite() && (1.0..=MAX_BYTES).contains(&bytes)) {
            return Err(bad());
        }
        // In range and finite, so the cast is exact up to the fraction it drops.
        Ok(KvBudget::Bytes(bytes as u64))
    }
}

impl std::str::FromStr for KvBudget {
    type Err = KvBudgetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvBudget::parse(s)
    }
}

impl std::fmt::Display for KvBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvBudget::Positions(n) => write!(f, "{n}"),
            KvBudget::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

impl Serialize for KvBudget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvBudget::Positions(n) => s.serialize_u64(*n),
            KvBudget::Bytes(_) => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for KvBudget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Positions(u64),
            Text(String),
        }
        let text = match Given::deserialize(d)? {
            Given::Positions(n) => n.to_string(),
            Given::Text(t) => t,
        };
        KvBudget::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for KvBudget {
    fn schema_name() -> Cow<'static, str> {
        "KvBudget".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A KV budget: positions (a number above 0), or bytes with a unit (`512MiB`, `4GB`; recorded as whole bytes, `536870912B`).",
            "oneOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": "^\\s*[0-9.]+\\s*[A-Za-z]+\\s*$"}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_bytes_parse_and_what_is_recorded_parses_back_the_same() {
        assert_eq!(KvBudget::parse("65536"), Ok(KvBudget::Positions(65536)));
        assert_eq!(KvBudget::parse(" 512MiB "), Ok(KvBudget::Bytes(512 << 20)));
        assert_eq!(KvBudget::parse("1.5GiB"), Ok(KvBudget::Bytes(3 << 29)));
        assert_eq!(KvBudget::parse("4gb"), Ok(KvBudget::Bytes(4_000_000_000)));
        for budget in [KvBudget::Positions(4096), KvBudget::Bytes(3 << 29)] {
            let recorded = serde_json::to_value(budget).unwrap();
            assert_eq!(serde_json::from_value::<KvBudget>(recorded).unwrap(), budget);
            assert_eq!(KvBudget::parse(&budget.to_string()), Ok(budget));
        }
        assert_eq!(serde_json::to_value(KvBudget::Positions(7)).unwrap(), serde_json::json!(7));
        assert_eq!(serde_json::to_value(KvBudget::Bytes(7)).unwrap(), serde_json::json!("7B"));
    }

    #[test]
    fn anything_else_is_refused_naming_what_was_given() {
        for bad in ["0", "-5", "", "GiB", "12XB", "1e3", "0.1B", "nanGiB", "infGiB", "2000TB", "1.5", "12 parsecs"] {
            let e = KvBudget::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with(&format!("`{bad}` is not a KV budget")), "{bad}: {e}");
        }
        assert!(serde_json::from_value::<KvBudget>(serde_json::json!(0)).is_err());
        assert!(serde_json::from_value::<KvBudget>(serde_json::json!(-3)).is_err());
        assert!(serde_json::from_value::<KvBudget>(serde_json::json!(1.5)).is_err());
    }
}
