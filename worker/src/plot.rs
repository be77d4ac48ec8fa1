//! The metrics plot (the seed's "Metrics" tab): loss (per epoch and per step), accuracy,
//! images/s and the learning rate (per step, so a warmup shows, with each epoch's end marked);
//! legends beside the plots, never over a curve. The loss panel's axis turns logarithmic when
//! its values span a factor of `LOG_RATIO` or more, so one outlier (a first validation loss of
//! 80 beside 0.3) does not flatten every other curve to the floor.
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::path::Path;
use tchrun::metrics::EpochMetrics;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

pub(crate) fn register_font() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let bytes = FONT_PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!(
                    "no font found (install fonts-dejavu-core; looked in {})",
                    FONT_PATHS.join(", ")
                )
            })?;
        let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
            .map_err(|_| "invalid font file".to_string())
    })
    .clone()
}

/// Width of the legend column right of each panel's plot area: the legend never covers a
/// curve, as it is not drawn inside the plot.
const LEGEND_W: u32 = 170;
/// Image size in pixels.
const SIZE: (u32, u32) = (1400, 800);
/// Colour of the per-step loss curve.
const STEP_COLOR: RGBColor = RGBColor(120, 170, 230);
/// Colour of the per-step learning-rate curve.
const STEP_LR_COLOR: RGBColor = RGBColor(230, 120, 20);
/// The loss axis is logarithmic when its largest value is this many times its smallest.
const LOG_RATIO: f64 = 10.0;

/// The per-step scalars of the progress lines (TensorBoard's `train/loss` and `train/lr`):
/// (optimizer step, value), placed on the epoch axis by `per_epoch` steps per epoch.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepSeries<'a> {
    pub loss: &'a [(u64, f64)],
    pub lr: &'a [(u64, f64)],
    pub per_epoch: u64,
}

impl StepSeries<'_> {
    /// `values` on the epoch axis (step 10 of 20 per epoch is epoch 0.5), finite ones only.
    fn points(&self, values: &[(u64, f64)]) -> Vec<(f64, f64)> {
        let per_epoch = self.per_epoch.max(1) as f64;
        values
            .iter()
            .map(|(s, v)| (*s as f64 / per_epoch, *v))
            .filter(|(_, v)| v.is_finite())
            .collect()
    }
}

/// Draws four panels (loss, accuracy, images/s, LR) against the epoch into a PNG; the loss
/// and LR panels also draw their per-step series.
pub fn metrics_png(
    history: &[EpochMetrics],
    steps: &StepSeries,
    path: &Path,
) -> Result<(), String> {
    register_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&root, history, steps)?;
    root.present().map_err(|e| e.to_string())
}

/// A panel's value axis.
#[derive(Debug, Clone, Copy, PartialEq)]
enum YAxis {
    Linear { lo: f64, hi: f64 },
    Log { lo: f64, hi: f64 },
}

impl YAxis {
    /// From zero (or the smallest value, when negative) to a little above the largest.
    fn linear(values: &[f64]) -> YAxis {
        let (lo, hi) = values
            .iter()
            .filter(|v| v.is_finite())
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        let (lo, hi) = if lo > hi {
            (0.0, 1.0)
        } else if (hi - lo).abs() < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo.min(0.0), hi * 1.05)
        };
        YAxis::Linear { lo, hi }
    }

    /// The loss axis: logarithmic when every value is positive and they span a factor of
    /// `LOG_RATIO` or more (each curve keeps its shape beside an outlier), else linear.
    fn for_loss(values: &[f64]) -> YAxis {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let lo = finite.iter().copied().fold(f64::MAX, f64::min);
        let hi = finite.iter().copied().fold(f64::MIN, f64::max);
        if !finite.is_empty() && lo > 0.0 && hi >= LOG_RATIO * lo {
            YAxis::Log {
                lo: lo / 1.25,
                hi: hi * 1.25,
            }
        } else {
            YAxis::linear(&finite)
        }
    }

    /// Whether `v` lies on the axis (a log axis has no place for zero or below).
    fn shows(&self, v: f64) -> bool {
        let (YAxis::Linear { lo, hi } | YAxis::Log { lo, hi }) = *self;
        v.is_finite() && lo <= v && v <= hi
    }
}

/// A tick label with three significant digits and no trailing zeros (0.001, 0.35, 81.7).
fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// One curve of a panel: its legend label, colour and (epoch, value) points.
struct Curve {
    label: &'static str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
    /// A dot on each point (the per-epoch values).
    markers: bool,
}

struct Panel {
    title: &'static str,
    axis: YAxis,
    curves: Vec<Curve>,
}

/// The four panels' curves and axes, in drawing order (top left, top right, bottom left,
/// bottom right).
fn panels(history: &[EpochMetrics], steps: &StepSeries) -> Vec<Panel> {
    let epoch = |f: fn(&EpochMetrics) -> f64| -> Vec<(f64, f64)> {
        history.iter().map(|m| (m.epoch as f64, f(m))).collect()
    };
    let curve = |label, color, points| Curve {
        label,
        color,
        points,
        markers: true,
    };
    let per_step = |label, color, points| Curve {
        label,
        color,
        points,
        markers: false,
    };
    let (step_loss, step_lr) = (steps.points(steps.loss), steps.points(steps.lr));
    let mut loss = Vec::new();
    let mut lr = Vec::new();
    let (train_label, lr_label) = match (step_loss.is_empty(), step_lr.is_empty()) {
        (true, true) => ("train loss", "lr"),
        (false, true) => ("train loss (epoch)", "lr"),
        (true, false) => ("train loss", "lr (epoch end)"),
        (false, false) => ("train loss (epoch)", "lr (epoch end)"),
    };
    if !step_loss.is_empty() {
        loss.push(per_step("train loss (per step)", STEP_COLOR, step_loss));
    }
    loss.push(curve(train_label, BLUE, epoch(|m| m.train_loss)));
    loss.push(curve("valid loss", RED, epoch(|m| m.val_loss)));
    if !step_lr.is_empty() {
        lr.push(per_step("lr (per step)", STEP_LR_COLOR, step_lr));
    }
    lr.push(curve(lr_label, BLACK, epoch(|m| m.lr)));
    let values = |curves: &[Curve]| -> Vec<f64> {
        curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.1))
            .collect()
    };
    let loss_axis = YAxis::for_loss(&values(&loss));
    let panel = |title, curves: Vec<Curve>| Panel {
        title,
        axis: YAxis::linear(&values(&curves)),
        curves,
    };
    vec![
        Panel {
            title: match loss_axis {
                YAxis::Log { .. } => "Loss (log scale)",
                YAxis::Linear { .. } => "Loss",
            },
            axis: loss_axis,
            curves: loss,
        },
        panel(
            "Accuracy (%)",
            vec![
                curve("top-1", BLUE, epoch(|m| 100.0 * m.top1)),
                curve("top-5", GREEN, epoch(|m| 100.0 * m.top5)),
            ],
        ),
        panel(
            "Train images per second",
            vec![curve(
                "images/s",
                MAGENTA,
                epoch(|m| m.train_images_per_sec),
            )],
        ),
        panel("Learning rate (effective)", lr),
    ]
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    history: &[EpochMetrics],
    steps: &StepSeries,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = panels(history, steps);
    let xs = || {
        panels
            .iter()
            .flat_map(|p| p.curves.iter().flat_map(|c| c.points.iter().map(|p| p.0)))
    };
    let x_max = (history.len().max(1) as f64).max(xs().fold(0.0, f64::max)) + 0.5;
    // Per-step points start within the first epoch: the axis starts at 0 for them.
    let x_min = if xs().any(|x| x < 1.0) { 0.0 } else { 0.5 };
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&panels) {
        let (w, _) = area.dim_in_pixel();
        let (plot_area, legend_area) = area.split_horizontally(w.saturating_sub(LEGEND_W));
        match panel.axis {
            YAxis::Linear { lo, hi } => chart(&plot_area, panel, x_min..x_max, lo..hi)?,
            YAxis::Log { lo, hi } => chart(&plot_area, panel, x_min..x_max, (lo..hi).log_scale())?,
        }
        // The legend in its own column, level with the plot's top.
        for (k, c) in panel.curves.iter().enumerate() {
            let y = 50 + 22 * k as i32;
            legend_area
                .draw(&PathElement::new(
                    vec![(4, y), (24, y)],
                    c.color.stroke_width(3),
                ))
                .map_err(|e| e.to_string())?;
            legend_area
                .draw(&Text::new(
                    c.label,
                    (30, y - 8),
                    ("sans-serif", 15).into_font(),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// One panel's plot on `y` (a linear or a log range).
fn chart<DB, Y>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    x: std::ops::Range<f64>,
    y: Y,
) -> Result<(), String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(e)?;
    for c in &panel.curves {
        let pts: Vec<(f64, f64)> = c
            .points
            .iter()
            .copied()
            .filter(|p| panel.axis.shows(p.1))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.color.stroke_width(2)))
            .map_err(e)?;
        if c.markers {
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.color.filled())))
                .map_err(e)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: u32, loss: f64) -> EpochMetrics {
        let mut m: EpochMetrics = serde_json::from_str(
            r#"{"schema":1,"epoch":1,"train_loss":1,"train_images_per_sec":10,"val_loss":1,
                "top1":0.5,"top5":0.9,"lr":0.1,"epoch_time_s":1,"time":"t"}"#,
        )
        .expect("row");
        m.epoch = epoch;
        m.train_loss = loss;
        m.val_loss = loss;
        m
    }

    /// Pixels of `color` in an RGB buffer, as (x, y).
    fn pixels(buf: &[u8], color: RGBColor) -> Vec<(u32, u32)> {
        buf.chunks(3)
            .enumerate()
            .filter(|(_, p)| p == &[color.0, color.1, color.2])
            .map(|(i, _)| ((i as u32) % SIZE.0, (i as u32) / SIZE.0))
            .collect()
    }

    /// The plot drawn into an RGB buffer, or None without a font.
    fn render(history: &[EpochMetrics], steps: &StepSeries) -> Option<Vec<u8>> {
        if register_font().is_err() {
            eprintln!("SKIP: no font (install fonts-dejavu-core)");
            return None;
        }
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, history, steps).expect("draw");
            root.present().expect("present");
        }
        Some(buf)
    }

    /// The pixels of `color` inside a panel's plot column (left of its legend), as (x, y).
    fn in_plot(
        buf: &[u8],
        color: RGBColor,
        right_half: bool,
        bottom_half: bool,
    ) -> Vec<(u32, u32)> {
        let (w, h) = (SIZE.0 / 2, SIZE.1 / 2);
        let x0 = if right_half { w } else { 0 };
        let y0 = if bottom_half { h } else { 0 };
        pixels(buf, color)
            .into_iter()
            .filter(|(x, y)| *x >= x0 && *x < x0 + w - LEGEND_W && *y >= y0 && *y < y0 + h)
            .collect()
    }

    fn y_span(px: &[(u32, u32)]) -> u32 {
        let lo = px.iter().map(|p| p.1).min().unwrap_or(0);
        let hi = px.iter().map(|p| p.1).max().unwrap_or(0);
        hi - lo
    }

    #[test]
    fn per_step_loss_is_drawn_and_legends_stay_beside_the_plots() {
        let history = [row(1, 2.0), row(2, 1.0)];
        // The per-step losses peak above the epoch means: the plot's range includes them.
        let loss: Vec<(u64, f64)> = (1..=20).map(|s| (s, 3.0 - 0.1 * s as f64)).collect();
        let steps = StepSeries {
            loss: &loss,
            lr: &[],
            per_epoch: 10,
        };
        let Some(buf) = render(&history, &steps) else {
            return;
        };
        let drawn = pixels(&buf, STEP_COLOR);
        let legend_x = SIZE.0 / 2 - LEGEND_W;
        // In the loss panel (top left): the curve left of the legend column, the swatch in it.
        let (curve, swatch): (Vec<_>, Vec<_>) = drawn.iter().partition(|(x, _)| *x < legend_x);
        assert!(curve.len() > 50, "per-step curve: {} pixels", curve.len());
        assert!(!swatch.is_empty(), "no legend swatch for the per-step loss");
        assert!(
            swatch.iter().all(|(x, y)| *x < legend_x + 30 && *y < 80),
            "the per-step colour outside the plot and its swatch: {swatch:?}"
        );
        assert!(drawn
            .iter()
            .all(|(x, y)| *x < SIZE.0 / 2 && *y < SIZE.1 / 2));
        // Without per-step losses, no such curve.
        let Some(buf) = render(&history, &StepSeries::default()) else {
            return;
        };
        assert!(pixels(&buf, STEP_COLOR).is_empty());
    }

    #[test]
    fn an_outlier_loss_gives_a_log_axis_that_shows_every_value() {
        let values = [81.7, 0.5, 0.4, 0.31, 0.9, 0.6, 0.45, 0.3];
        let axis = YAxis::for_loss(&values);
        let YAxis::Log { lo, hi } = axis else {
            panic!("linear axis for an 81.7 outlier beside 0.3: {axis:?}");
        };
        assert!(lo < 0.3 && lo > 0.1 && hi > 81.7 && hi < 200.0, "{axis:?}");
        assert!(values.iter().all(|v| axis.shows(*v)));
        // Values within a factor of ten: linear from zero, as before.
        assert_eq!(
            YAxis::for_loss(&[2.0, 1.0, 0.5]),
            YAxis::Linear { lo: 0.0, hi: 2.1 }
        );
        // A zero (or a negative) has no place on a log axis: linear.
        assert!(matches!(
            YAxis::for_loss(&[0.0, 50.0, 0.3]),
            YAxis::Linear { .. }
        ));
        assert!(matches!(YAxis::for_loss(&[]), YAxis::Linear { .. }));
        assert!(matches!(
            YAxis::for_loss(&[f64::NAN, 3.0]),
            YAxis::Linear { .. }
        ));
        assert_eq!(tick(0.001), "0.001");
        assert_eq!(tick(0.35), "0.35");
        assert_eq!(tick(81.7), "81.7");
        assert_eq!(tick(1000.0), "1000");
    }

    #[test]
    fn the_outlier_does_not_flatten_the_train_loss_curve() {
        // Epoch 1's validation loss is 81.7; the training loss falls from 0.9 to 0.4.
        let mut history: Vec<EpochMetrics> = [0.9, 0.6, 0.45, 0.4]
            .iter()
            .enumerate()
            .map(|(i, l)| row(i as u32 + 1, *l))
            .collect();
        for (m, v) in history.iter_mut().zip([81.7, 0.5, 0.4, 0.35]) {
            m.val_loss = v;
        }
        let Some(buf) = render(&history, &StepSeries::default()) else {
            return;
        };
        let train = in_plot(&buf, BLUE, false, false);
        // On a linear axis up to 86 the fall from 0.9 to 0.4 is 2 pixels of the ~330 high plot
        // (8 with the dots); on the log axis a third of a decade of 2.6, some 45.
        let span = y_span(&train);
        assert!(span > 30, "train loss spans {span} pixels: flattened");
    }

    #[test]
    fn the_lr_panel_draws_the_per_step_warmup() {
        // Warmup over the first 2 epochs (10 steps each) to 0.4, then constant; logged every
        // 2 steps and at each epoch's end.
        let lr: Vec<(u64, f64)> = (1..=40)
            .filter(|s| s % 2 == 0 || s % 10 == 0)
            .map(|s| (s, 0.4 * (s.min(20) as f64) / 20.0))
            .collect();
        let mut history: Vec<EpochMetrics> = (1..=4).map(|e| row(e, 1.0)).collect();
        for m in &mut history {
            m.lr = 0.4 * (m.epoch.min(2) * 10) as f64 / 20.0;
        }
        let steps = StepSeries {
            loss: &[],
            lr: &lr,
            per_epoch: 10,
        };
        let lr_panel = panels(&history, &steps).remove(3);
        let per_step = &lr_panel.curves[0];
        assert_eq!(per_step.label, "lr (per step)");
        // The warmup's points lie inside the first epoch, rising.
        let warm: Vec<&(f64, f64)> = per_step.points.iter().filter(|p| p.0 < 1.0).collect();
        assert!(warm.len() >= 4, "{warm:?}");
        assert!(warm.windows(2).all(|w| w[1].1 > w[0].1), "{warm:?}");
        assert_eq!(lr_panel.curves[1].label, "lr (epoch end)");
        let Some(buf) = render(&history, &steps) else {
            return;
        };
        // Bottom right: the orange per-step line climbs from near the floor to the top.
        let px = in_plot(&buf, STEP_LR_COLOR, true, true);
        assert!(px.len() > 100, "{} pixels", px.len());
        assert!(y_span(&px) > 150, "the warmup spans {} pixels", y_span(&px));
        let left = px.iter().min_by_key(|p| p.0).copied().unwrap_or_default();
        let right = px.iter().max_by_key(|p| p.0).copied().unwrap_or_default();
        assert!(left.1 > right.1 + 150, "start {left:?}, end {right:?}");
    }
}
