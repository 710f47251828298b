//! Compact artifacts: long arrays of records are stored as columns.
//!
//! A serving artifact holds thousands of per-request records with the same two dozen fields;
//! written as rows, the field names, the repeated values and the indentation are most of its
//! bytes. [`pack`] turns every array of at least [`MIN_ROWS`] objects into a table,
//!
//! ```json
//! {"@rows": 3, "@columns": {"id": {"values": [0, 1, 2]}, "api": {"runs": [["openai", 3]]},
//!  "error": {"present": [0, 1, 2], "values": ["timeout"]}}}
//! ```
//!
//! where each column keeps the smallest of three encodings of its values (as they are, as runs
//! of equal values, or as a dictionary and codes), `present` gives the run lengths of rows
//! that have the field and rows that lack it (alternating, starting with rows that have it), and
//! a column whose every value is an object becomes a nested `@columns` group. [`unpack`] gives
//! back exactly the value that was packed, key order included; the schemas, the audit's checks
//! and every reader see only that unpacked form, so the records and their meaning do not change.
//!
//! Packing is lossless by construction: a value that holds any key starting with `@` is left as
//! it is (our records have none), and an array whose rows do not share one field order stays
//! rows. A packed artifact says so with [`FORMAT_KEY`] at its top level; a value without it
//! (an artifact written before this format, or anyone else's JSON) is read as it is.

use serde_json::{Map, Value};
use std::collections::HashMap;

/// The top-level key that marks a packed value, and the format it names.
pub const FORMAT_KEY: &str = "@format";
pub const FORMAT: &str = "columns/1";

/// Arrays shorter than this stay rows: a table's column names cost about what a few rows' keys
/// do, and short arrays (claims, rounds) read better as rows.
pub const MIN_ROWS: usize = 16;

const ROWS: &str = "@rows";
pub(crate) const COLUMNS: &str = "@columns";

/// Why a packed value cannot be unpacked.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum UnpackError {
    #[error("`{FORMAT_KEY}` is {0}, a format this build does not read (it reads \"{FORMAT}\"); read it with the version that wrote it")]
    UnknownFormat(String),
    #[error("`{path}`: {message}; the file is not a table this project writes, re-make the artifact")]
    Malformed { path: String, message: String },
    #[error("`{path}`: unpacking would take about {}, more than half of the {} this machine has available", crate::budget::human(*need as u128), crate::budget::human(*available as u128))]
    TooLarge { path: String, need: u64, available: u64 },
}

impl UnpackError {
    /// The field of the stored artifact at fault, for a finding.
    pub fn field(&self) -> String {
        match self {
            UnpackError::UnknownFormat(_) => FORMAT_KEY.to_string(),
            UnpackError::Malformed { path, .. } | UnpackError::TooLarge { path, .. } => path.clone(),
        }
    }
}

/// Packs `value` (see the module's documentation). Values that are not objects, and values
/// holding a key that starts with `@`, are returned as they are.
pub fn pack(value: Value) -> Value {
    if !value.is_object() || has_at_key(&value) {
        return value;
    }
    let Value::Object(mut map) = pack_value(value) else { unreachable!("an object packs to an object") };
    map.insert(FORMAT_KEY.into(), Value::String(FORMAT.into()));
    Value::Object(map)
}

/// Unpacks a value written by [`pack`]; a value without [`FORMAT_KEY`] is returned as it is.
/// Nothing in the input is trusted: counts are checked against each other and the memory the
/// result would take is held to what the machine has before anything is expanded.
pub fn unpack(value: Value) -> Result<Value, UnpackError> {
    let Value::Object(mut map) = value else { return Ok(value) };
    let Some(format) = map.shift_remove(FORMAT_KEY) else { return Ok(Value::Object(map)) };
    if format != Value::String(FORMAT.into()) {
        return Err(UnpackError::UnknownFormat(format.to_string()));
    }
    let available = crate::budget::available_bytes();
    let mut budget = Budget { left: available / 2, available };
    unpack_value(Value::Object(map), String::new(), &mut budget)
}

fn has_at_key(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| k.starts_with('@') || has_at_key(v)),
        Value::Array(items) => items.iter().any(has_at_key),
        _ => false,
    }
}

/// Bottom-up, so rows holding arrays of records hold them packed.
fn pack_value(value: Value) -> Value {
    match value {
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().map(pack_value).collect();
            if items.len() < MIN_ROWS || !items.iter().all(Value::is_object) {
                return Value::Array(items);
            }
            let rows: Vec<Map<String, Value>> =
                items.into_iter().map(|v| if let Value::Object(m) = v { m } else { unreachable!() }).collect();
            match columns(rows) {
                Ok((count, columns)) => {
                    let mut table = Map::new();
                    table.insert(ROWS.into(), Value::from(count));
                    table.insert(COLUMNS.into(), Value::Object(columns));
                    Value::Object(table)
                }
                Err(rows) => Value::Array(rows.into_iter().map(Value::Object).collect()),
            }
        }
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, pack_value(v))).collect()),
        other => other,
    }
}

/// The field order of all `rows` together: each row's fields in its own order, a field first met
/// in a later row placed after the field it follows there. `None` when two rows disagree.
fn field_order(rows: &[Map<String, Value>]) -> Option<Vec<String>> {
    let mut order: Vec<String> = Vec::new();
    for row in rows {
        let mut after = 0;
        for key in row.keys() {
            match order.iter().position(|k| k == key) {
                Some(at) if at < after => return None,
                Some(at) => after = at + 1,
                None => {
                    order.insert(after, key.clone());
                    after += 1;
                }
            }
        }
    }
    Some(order)
}

/// The columns of `rows`, or the rows back when their fields have no common order.
#[allow(clippy::type_complexity)]
fn columns(mut rows: Vec<Map<String, Value>>) -> Result<(usize, Map<String, Value>), Vec<Map<String, Value>>> {
    let Some(order) = field_order(&rows) else { return Err(rows) };
    let mut out = Map::new();
    for key in order {
        let cells: Vec<Option<Value>> = rows.iter_mut().map(|row| row.swap_remove(&key)).collect();
        let column = column(cells);
        out.insert(key, column);
    }
    Ok((rows.len(), out))
}

fn column(cells: Vec<Option<Value>>) -> Value {
    let mut column = Map::new();
    if cells.iter().any(Option::is_none) {
        let mut lengths: Vec<u64> = vec![0];
        let mut have = true;
        for cell in &cells {
            if cell.is_some() != have {
                have = !have;
                lengths.push(0);
            }
            *lengths.last_mut().expect("never empty") += 1;
        }
        column.insert("present".into(), Value::from(lengths));
    }
    let values: Vec<Value> = cells.into_iter().flatten().collect();
    let groupable = !values.is_empty() && values.iter().all(|v| v.as_object().is_some_and(|m| !m.is_empty()));
    if groupable {
        let maps: Vec<Map<String, Value>> =
            values.into_iter().map(|v| if let Value::Object(m) = v { m } else { unreachable!() }).collect();
        match columns(maps) {
            Ok((_, group)) => {
                column.insert(COLUMNS.into(), Value::Object(group));
                return Value::Object(column);
            }
            Err(maps) => return encoded(column, maps.into_iter().map(Value::Object).collect()),
        }
    }
    encoded(column, values)
}

/// Adds the smallest encoding of `values` to `column`: as they are, as runs, or as a dictionary.
fn encoded(mut column: Map<String, Value>, values: Vec<Value>) -> Value {
    let texts: Vec<String> = values.iter().map(Value::to_string).collect();
    let digits = |n: usize| n.to_string().len();
    let plain: usize = texts.iter().map(|t| t.len() + 1).sum();
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (first index, length)
    for (i, t) in texts.iter().enumerate() {
        match runs.last_mut() {
            Some((first, len)) if texts[*first] == *t => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    let as_runs: usize = runs.iter().map(|&(first, len)| texts[first].len() + digits(len) + 4).sum();
    let mut codes_of: HashMap<&str, usize> = HashMap::new();
    let mut dict: Vec<usize> = Vec::new(); // index of each entry's first value
    let mut codes: Vec<usize> = Vec::with_capacity(values.len());
    for (i, t) in texts.iter().enumerate() {
        let next = codes_of.len();
        let code = *codes_of.entry(t.as_str()).or_insert_with(|| {
            dict.push(i);
            next
        });
        codes.push(code);
    }
    let as_dict: usize =
        dict.iter().map(|&i| texts[i].len() + 1).sum::<usize>() + codes.iter().map(|&c| digits(c) + 1).sum::<usize>();
    if plain <= as_runs && plain <= as_dict {
        column.insert("values".into(), Value::Array(values));
    } else if as_runs <= as_dict {
        let runs = runs.iter().map(|&(first, len)| Value::Array(vec![values[first].clone(), Value::from(len)]));
        column.insert("runs".into(), Value::Array(runs.collect()));
    } else {
        column.insert("dict".into(), Value::Array(dict.iter().map(|&i| values[i].clone()).collect()));
        column.insert("codes".into(), Value::from(codes));
    }
    Value::Object(column)
}

/// Memory left for the unpacked value; every expansion is charged before it is made.
struct Budget {
    left: u64,
    available: u64,
}

/// What one unpacked cell costs besides its own text: the tree node and its map slot.
const CELL_BYTES: u64 = 96;

impl Budget {
    fn charge(&mut self, path: &str, count: u64, each: u64) -> Result<(), UnpackError> {
        let need = count.saturating_mul(each.saturating_add(CELL_BYTES));
        self.left = self.left.checked_sub(need).ok_or_else(|| UnpackError::TooLarge {
            path: path.to_string(),
            need,
            available: self.available,
        })?;
        Ok(())
    }
}

fn malformed(path: &str, message: impl Into<String>) -> UnpackError {
    UnpackError::Malformed { path: path.to_string(), message: message.into() }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn unpack_value(value: Value, path: String, budget: &mut Budget) -> Result<Value, UnpackError> {
    match value {
        Value::Object(map) if map.contains_key(ROWS) || map.contains_key(COLUMNS) => {
            let rows = table(map, &path, budget)?;
            let rows = rows
                .into_iter()
                .enumerate()
                .map(|(i, row)| unpack_value(Value::Object(row), format!("{path}[{i}]"), budget))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Array(rows))
        }
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                let v = unpack_value(v, child(&path, &k), budget)?;
                out.insert(k, v);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| unpack_value(v, format!("{path}[{i}]"), budget))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other),
    }
}

/// The rows of a `{"@rows", "@columns"}` table.
fn table(mut map: Map<String, Value>, path: &str, budget: &mut Budget) -> Result<Vec<Map<String, Value>>, UnpackError> {
    let count = match map.shift_remove(ROWS) {
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| malformed(path, "`@rows` is not a count"))?,
        _ => return Err(malformed(path, "a table needs `@rows`, a count")),
    };
    let Some(Value::Object(columns)) = map.shift_remove(COLUMNS) else {
        return Err(malformed(path, "a table needs `@columns`, an object"));
    };
    if let Some(extra) = map.keys().next() {
        return Err(malformed(path, format!("a table has only `@rows` and `@columns`, not `{extra}`")));
    }
    group(columns, count, &child(path, COLUMNS), budget)
}

/// Rebuilds `count` rows from `columns`.
fn group(
    columns: Map<String, Value>,
    count: u64,
    path: &str,
    budget: &mut Budget,
) -> Result<Vec<Map<String, Value>>, UnpackError> {
    budget.charge(path, count, columns.len() as u64 * CELL_BYTES)?;
    let count_usize = usize::try_from(count).map_err(|_| malformed(path, "`@rows` does not fit this machine"))?;
    let mut rows: Vec<Map<String, Value>> = (0..count_usize).map(|_| Map::with_capacity(columns.len())).collect();
    for (key, column) in columns {
        let at = child(path, &key);
        for (row, cell) in rows.iter_mut().zip(cells(column, count, &at, budget)?) {
            if let Some(cell) = cell {
                row.insert(key.clone(), cell);
            }
        }
    }
    Ok(rows)
}

fn counts(value: Value, path: &str, what: &str) -> Result<Vec<u64>, UnpackError> {
    let Value::Array(items) = value else { return Err(malformed(path, format!("`{what}` is not an array"))) };
    items
        .iter()
        .map(|v| v.as_u64().ok_or_else(|| malformed(path, format!("`{what}` holds {v}, not a count"))))
        .collect()
}

/// The `count` cells of one column, `None` where a row lacks the field.
fn cells(column: Value, count: u64, path: &str, budget: &mut Budget) -> Result<Vec<Option<Value>>, UnpackError> {
    let Value::Object(mut column) = column else { return Err(malformed(path, "a column is an object")) };
    let present = match column.shift_remove("present") {
        None => vec![count],
        Some(v) => counts(v, path, "present")?,
    };
    if present.iter().try_fold(0u64, |sum, n| sum.checked_add(*n)) != Some(count) {
        return Err(malformed(path, format!("`present` does not add up to the table's {count} rows")));
    }
    let have: u64 = present.iter().step_by(2).sum();
    let values = values(column, have, path, budget)?;
    let mut values = values.into_iter();
    let mut out = Vec::with_capacity(count as usize);
    for (i, &n) in present.iter().enumerate() {
        for _ in 0..n {
            out.push(if i % 2 == 0 { values.next() } else { None });
        }
    }
    Ok(out)
}

/// The `have` values of a column, from whichever encoding it holds.
fn values(
    mut column: Map<String, Value>,
    have: u64,
    path: &str,
    budget: &mut Budget,
) -> Result<Vec<Value>, UnpackError> {
    let encoding = column.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
    let out = match (
        column.shift_remove("values"),
        column.shift_remove("runs"),
        column.shift_remove("dict"),
        column.shift_remove(COLUMNS),
    ) {
        (Some(Value::Array(values)), None, None, None) if column.is_empty() => values,
        (None, Some(Value::Array(runs)), None, None) if column.is_empty() => {
            let mut out = Vec::new();
            let mut total = 0u64;
            for run in runs {
                let pair = run.as_array().filter(|p| p.len() == 2);
                let Some((value, Some(len))) = pair.map(|p| (&p[0], p[1].as_u64())) else {
                    return Err(malformed(path, "each run is a [value, length] pair"));
                };
                total = total
                    .checked_add(len)
                    .filter(|t| *t <= have)
                    .ok_or_else(|| malformed(path, format!("the runs hold more than the column's {have} values")))?;
                budget.charge(path, len, value.to_string().len() as u64)?;
                out.extend(std::iter::repeat_n(value.clone(), len as usize));
            }
            out
        }
        (None, None, Some(Value::Array(dict)), None) => {
            let codes = counts(column.shift_remove("codes").unwrap_or(Value::Null), path, "codes")?;
            if !column.is_empty() {
                return Err(malformed(path, format!("a column holds one encoding, not {encoding}")));
            }
            let sizes: Vec<u64> = dict.iter().map(|v| v.to_string().len() as u64).collect();
            let mut out = Vec::with_capacity(codes.len());
            for code in codes {
                let entry = usize::try_from(code).ok().filter(|c| *c < dict.len()).ok_or_else(|| {
                    malformed(path, format!("code {code} is past the dictionary's {} entries", dict.len()))
                })?;
                budget.charge(path, 1, sizes[entry])?;
                out.push(dict[entry].clone());
            }
            out
        }
        (None, None, None, Some(Value::Object(group_columns))) if column.is_empty() => {
            group(group_columns, have, &child(path, COLUMNS), budget)?.into_iter().map(Value::Object).collect()
        }
        _ => {
            return Err(malformed(
                path,
                format!("a column holds one of `values`, `runs`, `dict` with `codes`, or `@columns`, not {encoding}"),
            ))
        }
    };
    if out.len() as u64 != have {
        return Err(malformed(path, format!("{} values for the column's {have} rows", out.len())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(n: usize) -> Value {
        let rows: Vec<Value> = (0..n)
            .map(|i| {
                let mut r = json!({"id": i, "api": "openai", "ttft_s": 0.01 * i as f64 + 1e-9, "target": (["a", "b", "c"][i % 3])});
                if i % 5 == 0 {
                    r["error"] = json!(null);
                }
                if i % 7 == 3 {
                    r["arrival"] = json!({"at_s": i as f64 / 3.0, "shape": "poisson"});
                } else {
                    r["arrival"] = json!({"at_s": i as f64 / 3.0, "shape": "poisson", "seed": i});
                }
                r["chunks"] = json!((0..(i % 20)).map(|j| json!({"t": j, "n": 1})).collect::<Vec<_>>());
                r
            })
            .collect();
        json!({"runs": [{"requests": rows, "name": "r"}], "provenance": {"host": "h"}})
    }

    #[test]
    fn packing_round_trips_exactly_key_order_included() {
        for n in [0, 1, 15, 16, 17, 200] {
            let original = rows(n);
            let packed = pack(original.clone());
            assert_eq!(packed[FORMAT_KEY], FORMAT);
            let back = unpack(packed.clone()).unwrap();
            // Same text, so the same key order, numbers and absent-versus-null.
            assert_eq!(back.to_string(), original.to_string(), "{n} rows");
            if n >= MIN_ROWS {
                assert_eq!(packed["runs"][0]["requests"]["@rows"], n);
                assert!(packed.to_string().len() < original.to_string().len(), "{n} rows grow");
                assert!(n < 200 || packed.to_string().len() < original.to_string().len() / 2, "{n} rows hardly shrink");
            } else {
                assert!(packed["runs"][0]["requests"].is_array());
            }
        }
    }

    #[test]
    fn each_column_takes_its_smallest_encoding() {
        let rows: Vec<Value> = (0..100)
            .map(|i| json!({"same": "x", "few": (["alpha-long-label", "beta-long-label"][i * 7 % 2]), "each": i}))
            .collect();
        let packed = pack(json!({ "rows": rows }));
        let cols = &packed["rows"]["@columns"];
        assert_eq!(cols["same"], json!({"runs": [["x", 100]]}));
        assert!(cols["few"]["dict"].is_array() && cols["few"]["codes"].is_array(), "{}", cols["few"]);
        assert!(cols["each"]["values"].is_array());
        assert!(cols.get("missing").is_none());
    }

    #[test]
    fn values_it_cannot_pack_losslessly_stay_as_they_are() {
        let with_at = json!({"rows": (0..20).map(|i| json!({"@x": i})).collect::<Vec<_>>()});
        assert_eq!(pack(with_at.clone()), with_at);
        // Two field orders: the rows stay rows (and the rest is still packed).
        let mut mixed: Vec<Value> = (0..20).map(|i| json!({"a": i, "b": i})).collect();
        mixed.push(serde_json::from_str(r#"{"b": 1, "a": 2}"#).unwrap());
        let v = json!({"mixed": mixed, "fine": (0..20).map(|i| json!({"a": i})).collect::<Vec<_>>()});
        let packed = pack(v.clone());
        assert!(packed["mixed"].is_array() && packed["fine"]["@rows"] == 20);
        assert_eq!(unpack(packed).unwrap().to_string(), v.to_string());
        // Anything without the marker reads as it is, even a look-alike.
        let foreign = json!({"t": {"@rows": 1, "@columns": {}}});
        assert_eq!(unpack(foreign.clone()).unwrap(), foreign);
        assert_eq!(pack(json!([1, 2])), json!([1, 2]));
    }

    #[test]
    fn forged_tables_get_an_error_naming_the_place_never_a_panic() {
        let forged = |requests: Value| json!({"@format": FORMAT, "runs": [{"requests": requests}]});
        let cases = [
            (json!({"@rows": 2, "@columns": {"a": {"values": [1]}}}), "1 values for the column's 2 rows"),
            (json!({"@rows": 2, "@columns": {"a": {"runs": [[1, 5]]}}}), "more than the column's 2 values"),
            (json!({"@rows": 2, "@columns": {"a": {"dict": [1], "codes": [0, 3]}}}), "code 3 is past"),
            (json!({"@rows": 2, "@columns": {"a": {"present": [1, 5], "values": [1]}}}), "does not add up"),
            (json!({"@rows": 2, "@columns": {"a": {"values": [1, 2], "runs": []}}}), "one of `values`"),
            (json!({"@rows": -1, "@columns": {}}), "not a count"),
            (json!({"@rows": 1}), "needs `@columns`"),
            (json!({"@rows": 1, "@columns": {}, "x": 1}), "not `x`"),
            (json!({"@rows": 1, "@columns": {"a": 7}}), "a column is an object"),
            (json!({"@rows": 1, "@columns": {"a": {"runs": [[1]]}}}), "[value, length] pair"),
        ];
        for (requests, expected) in cases {
            let err = unpack(forged(requests.clone())).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("runs[0].requests"), "{requests}: {err}");
        }
        let huge = forged(json!({"@rows": u64::MAX, "@columns": {"a": {"runs": [["x", u64::MAX]]}}}));
        assert!(matches!(unpack(huge), Err(UnpackError::TooLarge { .. })));
        let amplified = forged(json!({"@rows": 1u64 << 40, "@columns": {}}));
        assert!(matches!(unpack(amplified), Err(UnpackError::TooLarge { .. })));
        let newer = json!({"@format": "columns/2"});
        assert!(unpack(newer).unwrap_err().to_string().contains("columns/2"));
    }
}
