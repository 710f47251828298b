//! The charts, each drawn once per backend (SVG and PNG) from the same code. Nothing in them
//! depends on the clock, so the same artifact always renders to the same bytes.

use common::chart::{Chart, Forest, Grouped, Lines, Timeline};
use common::evidence::Verdict;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// DejaVu Sans, bundled so that text renders the same on every machine.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Why a chart was not drawn: plotters' message (its error type differs per backend).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DrawError(String);

/// Registers the bundled font under the family every chart uses. Call once before drawing.
pub fn init_font() -> Result<(), DrawError> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| DrawError("the bundled font does not parse".to_string()))
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Something that can draw itself on any plotters backend.
pub(crate) trait Draw {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), DrawError>;
}

/// Writes `<stem>.svg` and `<stem>.png` of any chart an experiment describes.
pub fn render(chart: &Chart, stem: &Path) -> Result<(), DrawError> {
    match chart {
        Chart::Timeline(c) => render_one(c, stem),
        Chart::Grouped(c) => render_one(c, stem),
        Chart::Lines(c) => render_one(c, stem),
        Chart::Forest(c) => render_one(c, stem),
    }
}

fn render_one(chart: &impl Draw, stem: &Path) -> Result<(), DrawError> {
    let size = chart.size();
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    {
        let area = SVGBackend::new(&svg, size).into_drawing_area();
        chart.draw(&area)?;
        area.present().map_err(err)?;
    }
    let area = BitMapBackend::new(&png, size).into_drawing_area();
    chart.draw(&area)?;
    area.present().map_err(err)
}

/// A white canvas with the title and the label areas every chart here uses (`y_labels` wide).
fn frame<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    y_labels: u32,
) -> Result<ChartBuilder<'a, 'static, DB>, DrawError> {
    area.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(area);
    builder.caption(title, ("sans-serif", 20)).margin(12).x_label_area_size(40).y_label_area_size(y_labels);
    Ok(builder)
}

/// The top of a value axis: the largest finite value (never zero, so the range is not empty).
fn axis_top(values: impl Iterator<Item = f64>) -> f64 {
    values.filter(|v| v.is_finite()).fold(0f64, f64::max).max(1e-9)
}

fn err(e: impl std::fmt::Display) -> DrawError {
    DrawError(e.to_string())
}

/// The legend box every chart draws, in one style.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    position: SeriesLabelPosition,
) -> Result<(), DrawError> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)
}

impl Draw for Timeline {
    fn size(&self) -> (u32, u32) {
        (1000, 140 + 60 * self.lanes.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), DrawError> {
        let n = self.lanes.len().max(1) as f64;
        let mut chart = frame(area, &self.title, 130)?
            .build_cartesian_2d(0f64..(self.end * 1.02).max(1e-3), 0f64..n)
            .map_err(err)?;
        let lanes = self.lanes.clone();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(self.lanes.len() * 2 + 1)
            .y_label_formatter(&move |y| {
                let i = y.floor() as usize;
                if (y - y.floor() - 0.5).abs() < 1e-6 {
                    lanes.get(i).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_desc("milliseconds since the scheduler started")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        for (prefill, label, color) in [(true, "prefill", PALETTE[0]), (false, "decode", PALETTE[1])] {
            chart
                .draw_series(self.steps.iter().filter(|s| s.1 == prefill).map(|&(lane, _, start, end)| {
                    let y = lane as f64;
                    Rectangle::new([(start, y + 0.2), (end.max(start), y + 0.8)], color.filled())
                }))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        for (which, label, color) in [(0, "first token", BLACK), (1, "completion", PALETTE[3])] {
            chart
                .draw_series(self.marks.iter().map(|&(lane, ttft, done)| {
                    let x = if which == 0 { ttft } else { done };
                    let y = lane as f64;
                    PathElement::new(vec![(x, y + 0.05), (x, y + 0.95)], color.stroke_width(2))
                }))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x + 6, y - 6), (x + 6, y + 6)], color.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

impl Draw for Grouped {
    fn size(&self) -> (u32, u32) {
        (1000, 460)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), DrawError> {
        let top = axis_top(
            self.series
                .iter()
                .flat_map(|(_, vs)| vs.iter().map(|(v, spread)| spread.map(|s| s.1).unwrap_or(*v).max(*v))),
        );
        let n = self.categories.len().max(1) as f64;
        // Category names go in the legend, not under the axis.
        let mut chart = frame(area, &self.title, 70)?
            .x_label_area_size(10)
            .build_cartesian_2d(0f64..n, (-0.12 * top)..(top * 1.15))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(&self.y_label)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(self.categories.iter().enumerate().map(|(i, c)| {
                Text::new(
                    c.clone(),
                    (i as f64 + 0.5, -0.04 * top),
                    ("sans-serif", 14).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Center,
                        plotters::style::text_anchor::VPos::Top,
                    )),
                )
            }))
            .map_err(err)?;
        let k = self.series.len().max(1) as f64;
        let width = 0.8 / k;
        for (j, (name, values)) in self.series.iter().enumerate() {
            let color = PALETTE[j % PALETTE.len()];
            let x0 = |i: usize| i as f64 + 0.1 + j as f64 * width;
            chart
                .draw_series(
                    values
                        .iter()
                        .enumerate()
                        .filter(|(_, (v, _))| v.is_finite())
                        .map(|(i, (v, _))| Rectangle::new([(x0(i), 0.0), (x0(i) + width * 0.9, *v)], color.filled())),
                )
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
            chart
                .draw_series(values.iter().enumerate().filter_map(|(i, (_, spread))| {
                    let (lo, hi) = (*spread)?;
                    let x = x0(i) + width * 0.45;
                    Some(PathElement::new(vec![(x, lo), (x, hi)], BLACK.stroke_width(2)))
                }))
                .map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

impl Draw for Lines {
    fn size(&self) -> (u32, u32) {
        (1000, 460)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), DrawError> {
        let top = axis_top(self.lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)));
        let xs = || self.lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).filter(|x| x.is_finite());
        let (left, right) = (xs().fold(f64::INFINITY, f64::min), xs().fold(f64::NEG_INFINITY, f64::max));
        let (left, right) = if left < right { (left, right) } else { (0.0, left.max(0.0) + 1.0) };
        let mut chart = frame(area, &self.title, 70)?.build_cartesian_2d(left..right, 0f64..top * 1.1).map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        for (j, (name, points)) in self.lines.iter().enumerate() {
            let color = PALETTE[j % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

/// Room for a forest plot's longest row label (with its verdict) left of the axis.
fn label_width(forest: &Forest) -> u32 {
    let longest = forest.rows.iter().map(|r| r.label.chars().count() + r.verdict.name().len() + 4).max().unwrap_or(0);
    (longest as u32 * 7 + 30).clamp(200, 640)
}

impl Draw for Forest {
    fn size(&self) -> (u32, u32) {
        (680 + label_width(self), 110 + 34 * self.rows.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), DrawError> {
        // Ratios on a log10 axis, spanning every estimate, interval and bound, and 1.
        let log = |x: f64| x.max(1e-12).log10();
        let values = self.rows.iter().flat_map(|r| {
            let (lo, hi) = r.interval.unwrap_or((r.estimate, r.estimate));
            [Some(r.estimate), Some(lo), Some(hi), r.at_least, r.at_most]
        });
        let logs: Vec<f64> = values.flatten().filter(|v| v.is_finite() && *v > 0.0).map(log).chain([0.0]).collect();
        let (lo, hi) = (
            logs.iter().copied().fold(f64::INFINITY, f64::min),
            logs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        let pad = ((hi - lo) * 0.08).max(0.05);
        let (left, right) = (lo - pad, hi + pad);
        let n = self.rows.len().max(1) as f64;
        let labels: Vec<String> = self.rows.iter().map(|r| r.label.clone()).collect();
        let mut chart =
            frame(area, &self.title, label_width(self))?.build_cartesian_2d(left..right, 0f64..n).map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .max_light_lines(0)
            .y_labels(0)
            .x_desc("ratio, later run / earlier run (log scale); shaded: the expected range")
            .x_label_formatter(&|x| format!("{:.3}", 10f64.powf(*x)))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        // Row i sits at the band (n - i - 1 .. n - i), the first row on top.
        let y = |i: usize| n - i as f64 - 0.5;
        chart
            .draw_series(self.rows.iter().enumerate().map(|(i, r)| {
                let from = r.at_least.map(log).unwrap_or(left).max(left);
                let to = r.at_most.map(log).unwrap_or(right).min(right);
                Rectangle::new([(from, y(i) - 0.4), (to, y(i) + 0.4)], RGBColor(44, 160, 44).mix(0.12).filled())
            }))
            .map_err(err)?;
        chart
            .draw_series([PathElement::new(vec![(0.0, 0.0), (0.0, n)], BLACK.mix(0.5).stroke_width(1))])
            .map_err(err)?;
        for (i, r) in self.rows.iter().enumerate() {
            let color = match r.verdict {
                Verdict::Holds => PALETTE[2],
                Verdict::Fails => PALETTE[3],
                Verdict::Inconclusive => PALETTE[7],
            };
            if let Some((lo, hi)) = r.interval {
                chart
                    .draw_series([PathElement::new(vec![(log(lo), y(i)), (log(hi), y(i))], color.stroke_width(3))])
                    .map_err(err)?;
            }
            chart.draw_series([Circle::new((log(r.estimate), y(i)), 5, color.filled())]).map_err(err)?;
            chart
                .draw_series([Text::new(
                    format!("{}  ({})", labels[i], r.verdict.name()),
                    (left, y(i)),
                    ("sans-serif", 13).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Right,
                        plotters::style::text_anchor::VPos::Center,
                    )),
                )])
                .map_err(err)?;
        }
        Ok(())
    }
}
