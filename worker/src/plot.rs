//! The metrics plot (the seed's "Metrics" tab): loss (per epoch and per step), accuracy,
//! images/s and LR per epoch; legends beside the plots, never over a curve.
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

/// Draws four panels (loss, accuracy, images/s, LR) against the epoch into a PNG. The loss
/// panel also draws the per-step training loss (`steps`: (optimizer step, loss) at each
/// `--print-freq`), placed on the epoch axis by `steps_per_epoch`.
pub fn metrics_png(
    history: &[EpochMetrics],
    steps: &[(u64, f64)],
    steps_per_epoch: u64,
    path: &Path,
) -> Result<(), String> {
    register_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&root, history, steps, steps_per_epoch)?;
    root.present().map_err(|e| e.to_string())
}

/// Image size in pixels.
const SIZE: (u32, u32) = (1400, 800);
/// Colour of the per-step loss curve.
const STEP_COLOR: RGBColor = RGBColor(120, 170, 230);

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    history: &[EpochMetrics],
    steps: &[(u64, f64)],
    steps_per_epoch: u64,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((2, 2));
    let per_epoch = steps_per_epoch.max(1) as f64;
    let step_pts: Vec<(f64, f64)> = steps
        .iter()
        .map(|(s, l)| (*s as f64 / per_epoch, *l))
        .filter(|(_, l)| l.is_finite())
        .collect();
    let last_step_x = step_pts.iter().map(|p| p.0).fold(0.0f64, f64::max);
    let x_max = (history.len().max(1) as f64).max(last_step_x) + 0.5;
    let x_min = if step_pts.is_empty() { 0.5 } else { 0.0 };
    type Series<'a> = (&'a str, RGBColor, Box<dyn Fn(&EpochMetrics) -> f64 + 'a>);
    let specs: Vec<(&str, Vec<Series>)> = vec![
        (
            "Loss",
            vec![
                ("train loss", BLUE, Box::new(|m| m.train_loss)),
                ("valid loss", RED, Box::new(|m| m.val_loss)),
            ],
        ),
        (
            "Accuracy (%)",
            vec![
                ("top-1", BLUE, Box::new(|m| 100.0 * m.top1)),
                ("top-5", GREEN, Box::new(|m| 100.0 * m.top5)),
            ],
        ),
        (
            "Train images per second",
            vec![("images/s", MAGENTA, Box::new(|m| m.train_images_per_sec))],
        ),
        (
            "Learning rate (effective)",
            vec![("lr", BLACK, Box::new(|m| m.lr))],
        ),
    ];
    let step_color = STEP_COLOR;
    for (i, (area, (title, series))) in panels.iter().zip(specs).enumerate() {
        let with_steps = i == 0 && !step_pts.is_empty();
        let (w, _) = area.dim_in_pixel();
        let (plot_area, legend_area) = area.split_horizontally(w.saturating_sub(LEGEND_W));
        let mut values: Vec<f64> = series
            .iter()
            .flat_map(|(_, _, f)| history.iter().map(f))
            .filter(|v| v.is_finite())
            .collect();
        if with_steps {
            values.extend(step_pts.iter().map(|p| p.1));
        }
        let (lo, hi) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        let (lo, hi) = if values.is_empty() {
            (0.0, 1.0)
        } else if (hi - lo).abs() < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo.min(0.0), hi * 1.05)
        };
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..x_max, lo..hi)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .draw()
            .map_err(|e| e.to_string())?;
        let mut legend: Vec<(String, RGBColor)> = Vec::new();
        if with_steps {
            chart
                .draw_series(LineSeries::new(
                    step_pts.clone(),
                    step_color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?;
            legend.push(("train loss (per step)".into(), step_color));
        }
        for (name, color, f) in series {
            let pts: Vec<(f64, f64)> = history.iter().map(|m| (m.epoch as f64, f(m))).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
            let label = if with_steps && name == "train loss" {
                "train loss (epoch)".to_string()
            } else {
                name.to_string()
            };
            legend.push((label, color));
        }
        // The legend in its own column, level with the plot's top.
        for (k, (label, color)) in legend.iter().enumerate() {
            let y = 50 + 22 * k as i32;
            legend_area
                .draw(&PathElement::new(
                    vec![(4, y), (24, y)],
                    color.stroke_width(3),
                ))
                .map_err(|e| e.to_string())?;
            legend_area
                .draw(&Text::new(
                    label.clone(),
                    (30, y - 8),
                    ("sans-serif", 15).into_font(),
                ))
                .map_err(|e| e.to_string())?;
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

    #[test]
    fn per_step_loss_is_drawn_and_legends_stay_beside_the_plots() {
        if register_font().is_err() {
            eprintln!("SKIP: no font (install fonts-dejavu-core)");
            return;
        }
        let history = [row(1, 2.0), row(2, 1.0)];
        // The per-step losses peak above the epoch means: the plot's range includes them.
        let steps: Vec<(u64, f64)> = (1..=20).map(|s| (s, 3.0 - 0.1 * s as f64)).collect();
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, &history, &steps, 10).expect("draw");
            root.present().expect("present");
        }
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
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, &history, &[], 10).expect("draw");
            root.present().expect("present");
        }
        assert!(pixels(&buf, STEP_COLOR).is_empty());
    }
}
