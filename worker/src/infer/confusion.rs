//! `confusion_matrix.png` of `tchrun evaluate`: rows are true classes, columns predicted ones,
//! in the model's class order. Each cell's colour comes from its share of the row, so a small
//! class reads as clearly as a large one: the diagonal (the class's recall) in blues, the
//! errors in reds on a scale of their own (the worst error is the darkest, and any error at
//! all is clearly tinted), so that one error in 33 images does not vanish beside a 97 %
//! diagonal. With up to 30 classes the cells also carry their counts. The cell size and fonts
//! follow the class count, so that 10 and 100 classes both stay readable.
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
    ramp((247.0, 251.0, 255.0), (8.0, 48.0, 107.0), share)
}

/// Light to dark red by `t` in [0, 1] (a "Reds" ramp).
fn error_shade(t: f64) -> RGBColor {
    ramp((254.0, 224.0, 210.0), (165.0, 15.0, 21.0), t)
}

fn ramp(from: (f64, f64, f64), to: (f64, f64, f64), t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(lerp(from.0, to.0), lerp(from.1, to.1), lerp(from.2, to.2))
}

/// Where the lightest error starts on the reds' ramp: any error is clearly tinted.
const ERROR_FLOOR: f64 = 0.4;

/// A cell's colour: the diagonal by its share of the row (blues); an off-diagonal cell with
/// errors by its share against `worst_error`, the largest off-diagonal share of any row
/// (reds, from `ERROR_FLOOR` up); an empty off-diagonal cell as the diagonal's zero.
fn cell_color(diagonal: bool, share: f64, worst_error: f64) -> RGBColor {
    if diagonal || share <= 0.0 {
        return shade(share);
    }
    let rel = if worst_error > 0.0 {
        share / worst_error
    } else {
        1.0
    };
    error_shade(ERROR_FLOOR + (1.0 - ERROR_FLOOR) * rel)
}

/// Black or white, whichever reads on `c`.
fn text_on(c: RGBColor) -> RGBColor {
    let luma = 0.299 * c.0 as f64 + 0.587 * c.1 as f64 + 0.114 * c.2 as f64;
    if luma < 140.0 {
        WHITE
    } else {
        BLACK
    }
}

/// Each cell's share of its row (0 in an empty row).
fn shares(m: &[Vec<u64>]) -> Vec<Vec<f64>> {
    m.iter()
        .map(|row| {
            let total: u64 = row.iter().sum();
            row.iter()
                .map(|&v| {
                    if total == 0 {
                        0.0
                    } else {
                        v as f64 / total as f64
                    }
                })
                .collect()
        })
        .collect()
}

/// The largest off-diagonal share of any row (0 without errors).
fn worst_error(shares: &[Vec<f64>]) -> f64 {
    shares
        .iter()
        .enumerate()
        .flat_map(|(t, row)| row.iter().enumerate().filter(move |(p, _)| *p != t))
        .map(|(_, s)| *s)
        .fold(0.0, f64::max)
}

/// Pixel geometry: (cell side, left margin, top margin) for these class names.
fn layout(classes: &[String]) -> (u32, u32, u32) {
    let n = classes.len().max(1);
    let cell = cell_px(n);
    let longest = classes
        .iter()
        .map(|c| short(c, LABEL_CHARS).chars().count())
        .max()
        .unwrap_or(1) as f64;
    // Room for the longest class name at ~0.6 em per character, plus the axis title.
    let names_px = (longest * label_font(cell) * 0.62).ceil() as u32 + 8;
    (cell, names_px + 34, 76)
}

/// Class names are cut to this many characters.
const LABEL_CHARS: usize = 24;

fn label_font(cell: u32) -> f64 {
    (cell as f64 * 0.8).clamp(9.0, 16.0)
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
    let (cell, left, top) = layout(classes);
    let label_font = label_font(cell);
    let bottom = left;
    let right = 24u32;
    let side = cell * n as u32;
    let (w, h) = (left + side + right, top + side + bottom);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        let shares = shares(m);
        let worst = worst_error(&shares);
        root.draw(&Text::new(
            format!(
                "Confusion matrix ({} images)",
                m.iter().flatten().sum::<u64>()
            ),
            (left as i32, 12),
            ("sans-serif", 18).into_font(),
        ))
        .map_err(e)?;
        let key = if worst > 0.0 {
            format!(
                "blue: share of the true class's row; red: errors, darkest = {:.1} % of a row",
                100.0 * worst
            )
        } else {
            "blue: share of the true class's row; no errors".to_string()
        };
        root.draw(&Text::new(
            key,
            (left as i32, 38),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(e)?;
        let small = ("sans-serif", label_font).into_font();
        let counted = n <= MAX_COUNTED;
        let count_font = (cell as f64 * 0.34).clamp(8.0, 16.0);
        for (t, row) in m.iter().enumerate() {
            for (p, &v) in row.iter().enumerate() {
                let share = shares[t][p];
                let fill = cell_color(t == p, share, worst);
                let x0 = (left + p as u32 * cell) as i32;
                let y0 = (top + t as u32 * cell) as i32;
                let rect = [(x0, y0), (x0 + cell as i32, y0 + cell as i32)];
                root.draw(&Rectangle::new(rect, fill.filled())).map_err(e)?;
                if counted && v > 0 {
                    let color = text_on(fill);
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
            let name = short(name, LABEL_CHARS);
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

    /// How far a colour is from white, in its most changed channel.
    fn from_white(c: RGBColor) -> u8 {
        255 - c.0.min(c.1).min(c.2)
    }

    #[test]
    fn errors_are_coloured_on_their_own_scale() {
        // One error in 33 images, the only one: the darkest red, not a 3 % tint of blue.
        let m = vec![vec![32, 1], vec![0, 33]];
        let s = shares(&m);
        let worst = worst_error(&s);
        assert!((worst - 1.0 / 33.0).abs() < 1e-12);
        let one = cell_color(false, s[0][1], worst);
        assert_eq!(one, error_shade(1.0));
        assert!(from_white(one) >= 200, "{one:?}");
        assert!(
            from_white(shade(1.0 / 33.0)) < 20,
            "the old tint, for contrast"
        );
        // Beside a worse error (10 in 33), one in 33 is lighter but still clearly red.
        let lighter = cell_color(false, 1.0 / 33.0, 10.0 / 33.0);
        assert!(from_white(lighter) >= 80, "{lighter:?}");
        assert!(lighter.0 > lighter.1 + 60, "red, not grey: {lighter:?}");
        // The diagonal stays blue by recall; an empty cell stays (nearly) white.
        assert_eq!(cell_color(true, 32.0 / 33.0, worst), shade(32.0 / 33.0));
        assert_eq!(cell_color(false, 0.0, worst), shade(0.0));
        // Counts stay readable on either end of both ramps.
        assert_eq!(text_on(error_shade(1.0)), WHITE);
        assert_eq!(text_on(error_shade(ERROR_FLOOR)), BLACK);
        assert_eq!(text_on(shade(1.0)), WHITE);
        assert_eq!(text_on(shade(0.0)), BLACK);
    }

    #[test]
    fn the_picture_shows_a_single_error_in_red() {
        let classes: Vec<String> = vec!["cat".into(), "dog".into(), "fox".into()];
        let m = vec![vec![32, 1, 0], vec![0, 33, 0], vec![0, 0, 33]];
        let (buf, w, _) = match draw(&classes, &m) {
            Ok(d) => d,
            Err(e) if e.contains("no font") => {
                eprintln!("SKIP: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let (cell, left, top) = layout(&classes);
        // A pixel near a cell's top-left corner (inside the grid, away from its count).
        let at = |t: u32, p: u32| {
            let (x, y) = (left + p * cell + 4, top + t * cell + 4);
            let i = ((y * w + x) * 3) as usize;
            (buf[i], buf[i + 1], buf[i + 2])
        };
        let err = at(0, 1);
        assert!(
            err.0 > 120 && err.1 < 60 && err.2 < 60,
            "the cat→dog error cell: {err:?}"
        );
        let diag = at(1, 1);
        assert!(diag.2 > diag.0 + 60, "the diagonal is blue: {diag:?}");
        let empty = at(0, 2);
        assert!(empty.0 > 240 && empty.1 > 240, "an empty cell: {empty:?}");
    }
}
