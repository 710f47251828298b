//! Charts as plain data: an experiment describes what to draw from its artifact, and the report
//! (the one crate that links a plotting library) draws it. So an experiment's report section is
//! its own code without it linking plotters, and the report knows no experiment.

/// A chart to draw, with the file stem it is written under.
#[derive(Debug, Clone)]
pub enum Chart {
    Timeline(Timeline),
    Grouped(Grouped),
    Lines(Lines),
    Forest(Forest),
}

/// One artifact's part of a report page: Markdown that embeds its charts as `![alt](<dir>/<stem>.svg)`
/// (see [`Section::image`]), and the charts themselves.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub markdown: String,
    /// (file stem, chart)
    pub charts: Vec<(String, Chart)>,
    /// The folder the charts are written to, relative to the page (the artifact's stem).
    pub dir: String,
}

impl Section {
    pub fn new(dir: &str) -> Self {
        Section { dir: dir.to_string(), ..Default::default() }
    }

    /// Adds a chart and the Markdown line that shows it.
    pub fn image(&mut self, stem: &str, alt: &str, chart: Chart) {
        self.markdown.push_str(&format!("![{alt}]({}/{stem}.svg)\n\n", self.dir));
        self.charts.push((stem.to_string(), chart));
    }
}

/// One line of a side-by-side comparison of two artifacts: what, A's value, B's value.
pub type CompareRow = (String, Option<f64>, Option<f64>);

/// A number as a table cell: `digits` decimals, `-` when absent or not finite (so every section
/// shows a missing value the same way).
pub fn cell(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

/// One lane per request; prefill and decode steps as bars on a shared millisecond axis, with
/// each request's first token and completion marked.
#[derive(Debug, Clone)]
pub struct Timeline {
    pub title: String,
    pub lanes: Vec<String>,
    /// (lane, prefill?, start, end)
    pub steps: Vec<(usize, bool, f64, f64)>,
    /// (lane, ttft, completion)
    pub marks: Vec<(usize, f64, f64)>,
    pub end: f64,
}

/// One bar: its value and an optional (low, high) whisker.
pub type Bar = (f64, Option<(f64, f64)>);

/// Grouped bars: one group per category, one bar per series, optional min-max whiskers.
#[derive(Debug, Clone)]
pub struct Grouped {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (series name, per category: (value, optional (low, high)))
    pub series: Vec<(String, Vec<Bar>)>,
}

/// Lines through points, one per series, on axes spanning the points (e.g. latency against
/// percentile, step time against context length).
#[derive(Debug, Clone)]
pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// (series, points (x, y))
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// Claims as a forest plot: one row per claim and pair of runs, the median paired ratio with its
/// interval on a logarithmic axis, the expected range shaded behind it, coloured by verdict.
#[derive(Debug, Clone)]
pub struct Forest {
    pub title: String,
    pub rows: Vec<ForestRow>,
}

#[derive(Debug, Clone)]
pub struct ForestRow {
    pub label: String,
    pub estimate: f64,
    pub interval: Option<(f64, f64)>,
    pub at_least: Option<f64>,
    pub at_most: Option<f64>,
    pub verdict: crate::evidence::Verdict,
}

impl Forest {
    /// The rows of `results` (each labelled with its claim, scope and pair of runs, after
    /// `prefix`), leaving out pairs without an estimate.
    pub fn of(title: &str, results: &[(String, &crate::evidence::ClaimResult)]) -> Forest {
        let mut rows = Vec::new();
        for (prefix, r) in results {
            let bounds = r.claim.expect.bounds();
            for pair in &r.pairs {
                let Some(estimate) = pair.estimate else { continue };
                let scope = r.scope.as_deref().map(|s| format!(" [{s}]")).unwrap_or_default();
                let runs = if r.pairs.len() > 1 { format!(" {}/{}", pair.later, pair.earlier) } else { String::new() };
                rows.push(ForestRow {
                    label: format!("{prefix}{}{scope}{runs}", r.claim.id),
                    estimate,
                    interval: pair.low.zip(pair.high),
                    at_least: bounds.at_least,
                    at_most: bounds.at_most,
                    verdict: pair.verdict,
                });
            }
        }
        Forest { title: title.to_string(), rows }
    }
}
