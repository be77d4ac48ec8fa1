//! The metrics plot (the seed's "Metrics" tab): loss, accuracy, images/s and LR per epoch.
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

/// Draws four panels (loss, accuracy, images/s, LR) against the epoch into a PNG.
pub fn metrics_png(history: &[EpochMetrics], path: &Path) -> Result<(), String> {
    register_font()?;
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((2, 2));
    let epochs = history.len().max(1) as f64;
    let x_max = epochs.max(1.0) + 0.5;
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
    for (area, (title, series)) in panels.iter().zip(specs) {
        let values: Vec<f64> = series
            .iter()
            .flat_map(|(_, _, f)| history.iter().map(f))
            .filter(|v| v.is_finite())
            .collect();
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
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.5f64..x_max, lo..hi)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .draw()
            .map_err(|e| e.to_string())?;
        for (name, color, f) in series {
            let pts: Vec<(f64, f64)> = history.iter().map(|m| (m.epoch as f64, f(m))).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
