//! `confusion_matrix.png` of `tchrun evaluate`: rows are true classes, columns predicted ones,
//! in the model's class order. Each cell is shaded by its share of the row (the class's
//! recall on the diagonal), so a small class reads as clearly as a large one; with up to 30
//! classes the cells also carry their counts. The cell size and fonts follow the class count,
//! so that 10 and 100 classes both stay readable.
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// Most classes whose cells still carry their counts.
const MAX_COUNTED: usize = 30;

/// Cell side in pixels for `n` classes.
fn cell_px(n: usize) -> u32 {
    (900 / n.max(1) as u32).clamp(12, 64)
}

/// White to dark blue by `share` in [0, 1] (a "Blues" ramp).
fn shade(share: f64) -> RGBColor {
    let t = share.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(lerp(247.0, 8.0), lerp(251.0, 48.0), lerp(255.0, 107.0))
}

fn short(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        name.to_string()
    } else {
        let head: String = name.chars().take(max.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

/// Draws the matrix (`m[true][predicted]`) into an RGB buffer of the returned size.
fn draw(classes: &[String], m: &[Vec<u64>]) -> Result<(Vec<u8>, u32, u32), String> {
    crate::plot::register_font()?;
    let n = classes.len().max(1);
    let cell = cell_px(n);
    let label_font = (cell as f64 * 0.8).clamp(9.0, 16.0);
    let label_chars = 24;
    let longest = classes
        .iter()
        .map(|c| short(c, label_chars).chars().count())
        .max()
        .unwrap_or(1) as f64;
    // Room for the longest class name at ~0.6 em per character, plus the axis title.
    let names_px = (longest * label_font * 0.62).ceil() as u32 + 8;
    let (left, top) = (names_px + 34, 56u32);
    let bottom = names_px + 34;
    let right = 24u32;
    let side = cell * n as u32;
    let (w, h) = (left + side + right, top + side + bottom);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        root.draw(&Text::new(
            format!(
                "Confusion matrix ({} images; shading: share of the true class's row)",
                m.iter().flatten().sum::<u64>()
            ),
            (left as i32, 16),
            ("sans-serif", 18).into_font(),
        ))
        .map_err(e)?;
        let small = ("sans-serif", label_font).into_font();
        let counted = n <= MAX_COUNTED;
        let count_font = (cell as f64 * 0.34).clamp(8.0, 16.0);
        for (t, row) in m.iter().enumerate() {
            let total: u64 = row.iter().sum();
            for (p, &v) in row.iter().enumerate() {
                let share = if total == 0 {
                    0.0
                } else {
                    v as f64 / total as f64
                };
                let x0 = (left + p as u32 * cell) as i32;
                let y0 = (top + t as u32 * cell) as i32;
                let rect = [(x0, y0), (x0 + cell as i32, y0 + cell as i32)];
                root.draw(&Rectangle::new(rect, shade(share).filled()))
                    .map_err(e)?;
                if counted && v > 0 {
                    let color = if share > 0.5 { WHITE } else { BLACK };
                    let style = ("sans-serif", count_font)
                        .into_font()
                        .color(&color)
                        .pos(Pos::new(HPos::Center, VPos::Center));
                    root.draw(&Text::new(
                        v.to_string(),
                        (x0 + cell as i32 / 2, y0 + cell as i32 / 2),
                        style,
                    ))
                    .map_err(e)?;
                }
            }
        }
        // Grid lines between cells, and the frame.
        let grid = RGBColor(200, 200, 200);
        for i in 0..=n as u32 {
            let c = if i == 0 || i == n as u32 { BLACK } else { grid };
            let a = (left + i * cell) as i32;
            root.draw(&PathElement::new(
                vec![(a, top as i32), (a, (top + side) as i32)],
                c,
            ))
            .map_err(e)?;
            let b = (top + i * cell) as i32;
            root.draw(&PathElement::new(
                vec![(left as i32, b), ((left + side) as i32, b)],
                c,
            ))
            .map_err(e)?;
        }
        for (i, name) in classes.iter().enumerate() {
            let name = short(name, label_chars);
            let mid = (i as u32 * cell + cell / 2) as i32;
            // True classes left of their rows, right-aligned.
            root.draw(&Text::new(
                name.clone(),
                (left as i32 - 6, top as i32 + mid),
                TextStyle::from(small.clone()).pos(Pos::new(HPos::Right, VPos::Center)),
            ))
            .map_err(e)?;
            // Predicted classes below their columns, written downwards.
            root.draw(&Text::new(
                name,
                (left as i32 + mid, (top + side) as i32 + 6),
                TextStyle::from(small.clone().transform(FontTransform::Rotate90))
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(e)?;
        }
        let axis = ("sans-serif", 15).into_font();
        root.draw(&Text::new(
            "predicted class",
            ((left + side / 2) as i32, (h - 20) as i32),
            TextStyle::from(axis.clone()).pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(e)?;
        root.draw(&Text::new(
            "true class",
            (12, (top + side / 2) as i32),
            TextStyle::from(axis.transform(FontTransform::Rotate270))
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(e)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok((buf, w, h))
}

/// Writes the PNG atomically (nothing at `path` unless complete).
pub fn png(classes: &[String], m: &[Vec<u64>], path: &Path) -> Result<(), String> {
    let (buf, w, h) = draw(classes, m)?;
    let img = image::RgbImage::from_raw(w, h, buf).ok_or("image buffer size")?;
    let mut bytes = std::io::Cursor::new(Vec::new());
    img.write_to(&mut bytes, image::ImageFormat::Png)
        .map_err(|e| e.to_string())?;
    tchrun::files::write_atomic(path, bytes.get_ref()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_grows_with_the_classes_and_shades_the_diagonal() {
        for n in [2usize, 10, 100] {
            let classes: Vec<String> = (0..n).map(|i| format!("class-{i}")).collect();
            let m: Vec<Vec<u64>> = (0..n)
                .map(|t| {
                    (0..n)
                        .map(|p| if t == p { 9 } else { (t + p) as u64 % 2 })
                        .collect()
                })
                .collect();
            let (buf, w, h) = draw(&classes, &m).unwrap();
            assert_eq!(buf.len(), (w * h * 3) as usize);
            assert!(w >= cell_px(n) * n as u32 && h >= cell_px(n) * n as u32);
            assert!(cell_px(n) >= 12, "cells readable at {n} classes");
        }
        assert_eq!(shade(0.0), RGBColor(247, 251, 255));
        assert_eq!(shade(1.0), RGBColor(8, 48, 107));
    }
}
