//! A summary row, typed: one struct per kind of column (the group's spreads, throughput, SLOs,
//! the open loop's, the stall probe's, the server's), stored under the seed's flat
//! `<metric>_<stat>` names. One walk over the columns ([`SummaryRow::visit`]) writes a row, reads
//! it back and describes it in the schema, so the three cannot disagree on a name.

use loadgen::metrics::ServerColumns;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// One metric over a group: mean, the population's standard deviation, p50/p95/p99 (`null`
/// where no value was finite) and how many values there were.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spread {
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub n: usize,
}

/// A [`Spread`] and its largest value (`<metric>_max`): the lateness columns, whose tail a reader
/// looks at first.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tail {
    pub spread: Spread,
    pub max: Option<f64>,
}

/// A conversation run's TTFT of first turns beside that of later turns (`ttft_s_first_turn_*`,
/// `ttft_s_later_turns_*`), whose histories the server has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Turns {
    pub first: Spread,
    pub later: Spread,
}

/// Throughput over the group's window (see `summary::throughput_columns`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Throughput {
    pub request_throughput_rps: Option<f64>,
    pub output_throughput_tps: Option<f64>,
    pub total_token_throughput_tps: Option<f64>,
    /// How many successful requests had a prompt-token count.
    pub total_token_throughput_counted: usize,
}

/// The SLO columns, where the run set SLOs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    pub slo_met: usize,
    pub slo_met_share: Option<f64>,
    /// An open loop's only: the requests within every bound per second of the window (`null`
    /// without a window).
    pub goodput_rps: Option<Option<f64>>,
}

/// An open-loop group's columns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpenLoop {
    /// The offered rate; `None` is `inf` (as fast as the cap allows).
    pub request_rate: Option<f64>,
    pub achieved_request_rate: Option<f64>,
    pub send_lateness_s: Tail,
    /// The client's own part, where admissions were recorded.
    pub client_lateness_s: Option<Tail>,
    /// That part's two pieces, where the pacer's wakes were recorded too.
    pub pacer_lateness_s: Option<Tail>,
    pub send_delay_s: Option<Tail>,
}

/// A probed group's columns: each send delay's part the machine held and the client's own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stalls {
    pub send_held_s: Tail,
    pub send_own_s: Tail,
    pub machine_stalls: usize,
    pub machine_stalled_s: f64,
    pub stall_probe_cpu_s: f64,
}

/// The summary of one (target, load) group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummaryRow {
    pub runtime: String,
    pub model: String,
    pub concurrency: usize,
    pub requests: usize,
    pub successes: usize,
    pub failures: usize,
    pub failures_by_class: BTreeMap<String, usize>,
    pub ttft_s: Spread,
    pub turns: Option<Turns>,
    pub total_s: Spread,
    pub prompt_tps: Spread,
    /// Why `prompt_tps` is `null` when it is.
    pub prompt_tps_note: Option<String>,
    pub decode_tps: Spread,
    pub tpot_s: Spread,
    pub request_tps: Spread,
    pub chunk_gap_s: Spread,
    pub itl_s: Spread,
    /// `usage` (per token) or `chunks` (per chunk).
    pub itl_source: String,
    pub aggregate_output_tps: Spread,
    pub throughput: Throughput,
    pub output_token_sources: Vec<String>,
    /// In a run whose answers carry digests.
    pub inconsistent_outputs: Option<usize>,
    /// `<metric>_p<P>`: each percentile asked beyond p50, p95 and p99.
    pub percentiles: BTreeMap<String, Option<f64>>,
    pub slo: Option<Slo>,
    pub open_loop: Option<OpenLoop>,
    pub stalls: Option<Stalls>,
    /// The server's view, where its `/metrics` were scraped.
    pub server: Option<ServerColumns>,
    /// Columns this version does not write (an older or newer artifact's), kept as read.
    pub other: BTreeMap<String, Value>,
}

/// The metrics whose extra percentiles a row may hold (`summary::extra_percentiles`).
pub(crate) const PERCENTILE_METRICS: [&str; 4] = ["ttft_s", "tpot_s", "total_s", "chunk_gap_s"];

impl SummaryRow {
    /// The row as its stored columns, in the artifact's (sorted) order.
    pub fn columns(&self) -> BTreeMap<String, Value> {
        let mut writer = Writer::default();
        self.clone().visit(&mut writer);
        writer.0
    }

    /// A row from its stored columns; a column of the wrong type is named.
    pub fn from_columns(columns: BTreeMap<String, Value>) -> Result<SummaryRow, String> {
        let mut reader = Reader { columns, error: None };
        let mut row = SummaryRow::default();
        row.visit(&mut reader);
        if let Some(error) = reader.error {
            return Err(error);
        }
        let extra = |name: &str| {
            PERCENTILE_METRICS.iter().any(|m| {
                name.strip_prefix(m)
                    .and_then(|rest| rest.strip_prefix("_p"))
                    .is_some_and(|p| p.parse::<f64>().is_ok_and(f64::is_finite))
            })
        };
        for (name, value) in std::mem::take(&mut reader.columns) {
            match value {
                Value::Number(_) | Value::Null if extra(&name) => {
                    row.percentiles.insert(name, value.as_f64());
                }
                value => {
                    row.other.insert(name, value);
                }
            }
        }
        Ok(row)
    }

    /// Every column, in one walk: what [`Writer`] writes, [`Reader`] reads and [`Describer`]
    /// puts in the schema.
    fn visit(&mut self, v: &mut impl Visit) {
        v.field("runtime", &mut self.runtime);
        v.field("model", &mut self.model);
        v.field("concurrency", &mut self.concurrency);
        v.field("requests", &mut self.requests);
        v.field("successes", &mut self.successes);
        v.field("failures", &mut self.failures);
        v.field("failures_by_class", &mut self.failures_by_class);
        spread(v, "ttft_s", &mut self.ttft_s);
        kind(v, "ttft_s_first_turn_n", &mut self.turns, |v, turns| {
            spread(v, "ttft_s_first_turn", &mut turns.first);
            spread(v, "ttft_s_later_turns", &mut turns.later);
        });
        spread(v, "total_s", &mut self.total_s);
        spread(v, "prompt_tps", &mut self.prompt_tps);
        v.field("prompt_tps_note", &mut self.prompt_tps_note);
        spread(v, "decode_tps", &mut self.decode_tps);
        spread(v, "tpot_s", &mut self.tpot_s);
        spread(v, "request_tps", &mut self.request_tps);
        spread(v, "chunk_gap_s", &mut self.chunk_gap_s);
        spread(v, "itl_s", &mut self.itl_s);
        v.field("itl_source", &mut self.itl_source);
        spread(v, "aggregate_output_tps", &mut self.aggregate_output_tps);
        let t = &mut self.throughput;
        v.field("request_throughput_rps", &mut t.request_throughput_rps);
        v.field("output_throughput_tps", &mut t.output_throughput_tps);
        v.field("total_token_throughput_tps", &mut t.total_token_throughput_tps);
        v.field("total_token_throughput_counted", &mut t.total_token_throughput_counted);
        v.field("output_token_sources", &mut self.output_token_sources);
        v.optional("inconsistent_outputs", &mut self.inconsistent_outputs);
        v.extra(&mut self.percentiles);
        kind(v, "slo_met", &mut self.slo, |v, slo| {
            v.field("slo_met", &mut slo.slo_met);
            v.field("slo_met_share", &mut slo.slo_met_share);
            v.optional("goodput_rps", &mut slo.goodput_rps);
        });
        kind(v, "request_rate", &mut self.open_loop, |v, open| {
            let mut rate = Rate(open.request_rate);
            v.field("request_rate", &mut rate);
            open.request_rate = rate.0;
            v.field("achieved_request_rate", &mut open.achieved_request_rate);
            tail(v, "send_lateness_s", &mut open.send_lateness_s);
            for (name, part) in [
                ("client_lateness_s", &mut open.client_lateness_s),
                ("pacer_lateness_s", &mut open.pacer_lateness_s),
                ("send_delay_s", &mut open.send_delay_s),
            ] {
                kind(v, &format!("{name}_n"), part, |v, part| tail(v, name, part));
            }
        });
        kind(v, "machine_stalls", &mut self.stalls, |v, stalls| {
            tail(v, "send_held_s", &mut stalls.send_held_s);
            tail(v, "send_own_s", &mut stalls.send_own_s);
            v.field("machine_stalls", &mut stalls.machine_stalls);
            v.field("machine_stalled_s", &mut stalls.machine_stalled_s);
            v.field("stall_probe_cpu_s", &mut stalls.stall_probe_cpu_s);
        });
        v.server(&mut self.server);
        v.other(&mut self.other);
    }
}

/// A kind of columns that only some rows have, marked by its column `marker`: walked where the
/// row has it (the writer), where `marker` is stored (the reader), always (the schema, which
/// requires none of it).
fn kind<V: Visit, G: Default>(v: &mut V, marker: &str, group: &mut Option<G>, columns: impl FnOnce(&mut V, &mut G)) {
    if v.has(marker, group.is_some()) {
        columns(v, group.get_or_insert_with(G::default));
        v.done();
    }
}

/// `<name>_mean`, `_std`, `_p50`, `_p95`, `_p99` and `_n`.
fn spread(v: &mut impl Visit, name: &str, s: &mut Spread) {
    for (stat, value) in
        [("mean", &mut s.mean), ("std", &mut s.std), ("p50", &mut s.p50), ("p95", &mut s.p95), ("p99", &mut s.p99)]
    {
        v.field(&format!("{name}_{stat}"), value);
    }
    v.field(&format!("{name}_n"), &mut s.n);
}

/// [`spread`] and `<name>_max`.
fn tail(v: &mut impl Visit, name: &str, t: &mut Tail) {
    spread(v, name, &mut t.spread);
    v.field(&format!("{name}_max"), &mut t.max);
}

/// What walks a row's columns.
trait Visit {
    /// A column every row of its kind has.
    fn field<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut T);
    /// A column written only when it has a value, and `None` when absent.
    fn optional<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut Option<T>);
    /// Whether a kind of columns is there: the writer's `present`, the reader's `name` found.
    fn has(&mut self, name: &str, present: bool) -> bool;
    /// The end of the kind [`Visit::has`] began.
    fn done(&mut self) {}
    /// The extra percentiles, under names the row chose.
    fn extra(&mut self, percentiles: &mut BTreeMap<String, Option<f64>>);
    /// The server's columns, `server_*`.
    fn server(&mut self, server: &mut Option<ServerColumns>);
    /// The columns no kind claimed.
    fn other(&mut self, other: &mut BTreeMap<String, Value>);
}

#[derive(Default)]
struct Writer(BTreeMap<String, Value>);

impl Visit for Writer {
    fn field<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut T) {
        // Plain numbers, strings and maps of them: serialising cannot fail (a non-finite
        // number is written as `null`, as `json!` writes it).
        self.0.insert(name.to_string(), serde_json::to_value(&*value).unwrap_or(Value::Null));
    }
    fn optional<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut Option<T>) {
        if let Some(value) = value {
            self.field(name, value);
        }
    }
    fn has(&mut self, _: &str, present: bool) -> bool {
        present
    }
    fn extra(&mut self, percentiles: &mut BTreeMap<String, Option<f64>>) {
        for (name, value) in percentiles {
            self.field(name, value);
        }
    }
    fn server(&mut self, server: &mut Option<ServerColumns>) {
        if let Some(Value::Object(columns)) = server.as_ref().and_then(|s| serde_json::to_value(s).ok()) {
            self.0.extend(columns);
        }
    }
    fn other(&mut self, other: &mut BTreeMap<String, Value>) {
        self.0.extend(other.clone());
    }
}

/// Reads what it knows out of `columns`; what is left is the row's extra percentiles and others.
struct Reader {
    columns: BTreeMap<String, Value>,
    error: Option<String>,
}

impl Reader {
    fn take<T: DeserializeOwned>(&mut self, name: &str) -> Option<T> {
        let value = self.columns.remove(name)?;
        match T::deserialize(value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(format!("{name}: {e}"));
                None
            }
        }
    }
}

impl Visit for Reader {
    // A column an older artifact lacks keeps its default; the audit's recomputed row then
    // differs from it by that column.
    fn field<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut T) {
        if let Some(v) = self.take(name) {
            *value = v;
        }
    }
    fn optional<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, value: &mut Option<T>) {
        *value = self.take(name);
    }
    fn has(&mut self, name: &str, _: bool) -> bool {
        self.columns.contains_key(name)
    }
    fn extra(&mut self, _: &mut BTreeMap<String, Option<f64>>) {} // read from what is left
    fn server(&mut self, server: &mut Option<ServerColumns>) {
        let names: Vec<String> = self.columns.keys().filter(|k| k.starts_with("server_")).cloned().collect();
        if names.is_empty() {
            return;
        }
        let columns: serde_json::Map<String, Value> =
            names.into_iter().filter_map(|k| self.columns.remove(&k).map(|v| (k, v))).collect();
        match ServerColumns::deserialize(Value::Object(columns)) {
            Ok(s) => *server = Some(s),
            Err(e) => {
                self.error.get_or_insert(format!("server columns: {e}"));
            }
        }
    }
    fn other(&mut self, _: &mut BTreeMap<String, Value>) {} // read from what is left
}

/// The schema's properties: every column a row can have, and which every row has.
struct Describer<'g> {
    generator: &'g mut SchemaGenerator,
    properties: serde_json::Map<String, Value>,
    required: Vec<String>,
    optional_depth: usize,
}

impl Visit for Describer<'_> {
    fn field<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, _: &mut T) {
        self.properties.insert(name.to_string(), self.generator.subschema_for::<T>().to_value());
        if self.optional_depth == 0 {
            self.required.push(name.to_string());
        }
    }
    fn optional<T: Serialize + DeserializeOwned + JsonSchema>(&mut self, name: &str, _: &mut Option<T>) {
        self.properties.insert(name.to_string(), self.generator.subschema_for::<T>().to_value());
    }
    fn has(&mut self, _: &str, _: bool) -> bool {
        // Every kind is described; its columns are not required of every row.
        self.optional_depth += 1;
        true
    }
    fn done(&mut self) {
        self.optional_depth -= 1;
    }
    fn extra(&mut self, _: &mut BTreeMap<String, Option<f64>>) {}
    fn server(&mut self, _: &mut Option<ServerColumns>) {
        let schema = self.generator.root_schema_for::<ServerColumns>().to_value();
        if let Some(Value::Object(properties)) = schema.get("properties") {
            self.properties.extend(properties.clone());
        }
    }
    fn other(&mut self, _: &mut BTreeMap<String, Value>) {}
}

impl Serialize for SummaryRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.columns().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SummaryRow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let columns = BTreeMap::<String, Value>::deserialize(deserializer)?;
        SummaryRow::from_columns(columns).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for SummaryRow {
    fn schema_name() -> Cow<'static, str> {
        "SummaryRow".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut describer =
            Describer { generator, properties: Default::default(), required: Vec::new(), optional_depth: 0 };
        SummaryRow::default().visit(&mut describer);
        let percentiles = format!("^({})_p[0-9.]+$", PERCENTILE_METRICS.join("|"));
        schemars::json_schema!({
            "description": "One (target, load) group's summary, under the seed's flat `<metric>_<stat>` names. Columns of a kind the group lacks (conversation turns, SLOs, the open loop's, the stall probe's, the server's) are absent; `<metric>_p<P>` columns hold each percentile asked beyond p50, p95 and p99.",
            "type": "object",
            "properties": describer.properties,
            "required": describer.required,
            "patternProperties": { percentiles: { "type": ["number", "null"] } },
        })
    }
}

/// An open loop's offered rate: a number, or `"inf"` for as fast as the cap allows.
struct Rate(Option<f64>);

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(rate) => serializer.serialize_f64(rate),
            None => serializer.serialize_str("inf"),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) if s == "inf" => Ok(Rate(None)),
            Value::Number(n) => Ok(Rate(n.as_f64())),
            other => Err(serde::de::Error::custom(format!("{other} is neither a rate nor \"inf\""))),
        }
    }
}

impl JsonSchema for Rate {
    fn schema_name() -> Cow<'static, str> {
        "RequestRate".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({ "anyOf": [{ "type": "number" }, { "const": "inf" }] })
    }
}
