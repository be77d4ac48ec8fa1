//! `tchrun evaluate --model A --model B` ("Evaluate Model" with two scored inputs): both models
//! scored on the same labeled images, side by side. `comparison.json` holds each model's
//! `metrics.json` figures and confusion matrix, the images they disagree on and McNemar's
//! exact test of the difference in top-1 (`mcnemar`), so "is B really better?" has an answer;
//! `disagreements.csv` lists those images. Pure: the worker's rank 0 writes what this computes.
use crate::evaluation::{self, EvalMetrics, Scored};
use crate::mcnemar::McNemar;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Version of the `comparison.json` layout.
pub const SCHEMA_VERSION: u32 = 1;

/// File names in a two-model evaluation directory (each model's one-model outputs are in
/// `MODEL_DIRS`' sub-folders).
pub const COMPARISON_JSON: &str = "comparison.json";
pub const DISAGREEMENTS_CSV: &str = "disagreements.csv";

/// The names of the two models, in `--model` order: their sub-folders of the evaluation
/// directory and their columns in the table and the CSV.
pub const MODEL_DIRS: [&str; 2] = ["a", "b"];

/// The significance level of the verdict.
pub const ALPHA: f64 = 0.05;

/// One model of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparedModel {
    /// `a` or `b` (`MODEL_DIRS`).
    pub name: String,
    /// The model directory as given to `--model` (absolute).
    pub path: String,
    /// The figures of its `metrics.json`.
    pub metrics: EvalMetrics,
    /// Its confusion matrix, `[true][predicted]` in the classes' order.
    pub confusion_matrix: Vec<Vec<u64>>,
}

/// `comparison.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub schema: u32,
    pub images: u64,
    /// The classes of both models (the same list, in the models' order).
    pub classes: Vec<String>,
    /// `a` then `b`.
    pub models: Vec<ComparedModel>,
    /// b's top-1 minus a's (a fraction: 0.02 is two percentage points).
    pub top1_difference: f64,
    /// McNemar's exact test of the difference in top-1.
    pub mcnemar: McNemar,
    /// Images whose top-1 predictions differ (the rows of `disagreements.csv`).
    pub disagreements: u64,
    /// The answer in words: which model is better at the 5% level, or that neither is.
    pub verdict: String,
}

fn correct(scored: &[Scored]) -> Vec<bool> {
    scored
        .iter()
        .map(|s| s.predicted() == Some(s.truth))
        .collect()
}

/// A p-value as the table and the verdict show it.
pub fn format_p(p: f64) -> String {
    if p >= 1e-4 || p == 0.0 {
        format!("{p:.4}")
    } else {
        format!("{p:.2e}")
    }
}

/// The verdict of `m` at `ALPHA`.
pub fn verdict(m: &McNemar) -> String {
    let (a, b) = (m.only_a_correct, m.only_b_correct);
    if m.discordant() == 0 {
        return "no difference in top-1: both models are right on the same images (p = 1)".into();
    }
    let counts = format!(
        "of the {} image(s) exactly one model got right, a got {a} and b {b}",
        m.discordant()
    );
    let p = format_p(m.p_value);
    if m.p_value < ALPHA {
        let better = if a > b { "a" } else { "b" };
        format!("{better} is better in top-1 at the 5% level: {counts} (McNemar's exact p = {p})")
    } else {
        format!(
            "no significant difference in top-1 at the 5% level: {counts} (McNemar's exact \
             p = {p})"
        )
    }
}

/// The comparison of the two models' scores of the same images (`scored[m][i]`: model `m`'s
/// result for image `i`), with `classes` of both and `paths` their directories.
pub fn compare(classes: &[String], paths: [&Path; 2], scored: [&[Scored]; 2]) -> Comparison {
    let models: Vec<ComparedModel> = (0..2)
        .map(|m| ComparedModel {
            name: MODEL_DIRS[m].to_string(),
            path: paths[m].display().to_string(),
            metrics: evaluation::compute(classes, scored[m]),
            confusion_matrix: evaluation::confusion_matrix(classes.len(), scored[m]),
        })
        .collect();
    let mcnemar = McNemar::of(&correct(scored[0]), &correct(scored[1]));
    let disagreements = scored[0]
        .iter()
        .zip(scored[1])
        .filter(|(a, b)| a.predicted() != b.predicted())
        .count() as u64;
    Comparison {
        schema: SCHEMA_VERSION,
        images: scored[0].len() as u64,
        classes: classes.to_vec(),
        top1_difference: models[1].metrics.top1 - models[0].metrics.top1,
        verdict: verdict(&mcnemar),
        models,
        mcnemar,
        disagreements,
    }
}

/// The console's side-by-side table of `c` (one string per line).
pub fn table(c: &Comparison) -> Vec<String> {
    let [a, b] = [&c.models[0].metrics, &c.models[1].metrics];
    let pct = |x: f64| format!("{:.2}%", 100.0 * x);
    let pts = |x: f64| format!("{:+.2} pt", 100.0 * x);
    let num = |x: f64| format!("{x:.4}");
    let signed = |x: f64| format!("{x:+.4}");
    type Row<'a> = (
        &'a str,
        f64,
        f64,
        &'a dyn Fn(f64) -> String,
        &'a dyn Fn(f64) -> String,
    );
    let rows: [Row; 7] = [
        ("top-1", a.top1, b.top1, &pct, &pts),
        ("top-5", a.top5, b.top5, &pct, &pts),
        ("log loss", a.log_loss, b.log_loss, &num, &signed),
        (
            "macro precision",
            a.macro_avg.precision,
            b.macro_avg.precision,
            &num,
            &signed,
        ),
        (
            "macro recall",
            a.macro_avg.recall,
            b.macro_avg.recall,
            &num,
            &signed,
        ),
        ("macro F1", a.macro_avg.f1, b.macro_avg.f1, &num, &signed),
        (
            "weighted F1",
            a.weighted_avg.f1,
            b.weighted_avg.f1,
            &num,
            &signed,
        ),
    ];
    let mut out = vec![
        format!("a: {}", c.models[0].path),
        format!("b: {}", c.models[1].path),
        format!("{:<16} {:>10} {:>10} {:>10}", "", "a", "b", "b - a"),
    ];
    for (name, x, y, show, diff) in rows {
        out.push(format!(
            "{name:<16} {:>10} {:>10} {:>10}",
            show(x),
            show(y),
            diff(y - x)
        ));
    }
    let m = &c.mcnemar;
    out.push(format!(
        "McNemar's exact test: both right {}, only a {}, only b {}, both wrong {}; p = {}",
        m.both_correct,
        m.only_a_correct,
        m.only_b_correct,
        m.both_wrong,
        format_p(m.p_value)
    ));
    out.push(c.verdict.clone());
    out
}

/// `disagreements.csv`'s header.
pub const DISAGREEMENTS_HEADER: [&str; 8] = [
    "file",
    "true_class",
    "a_predicted",
    "a_probability",
    "b_predicted",
    "b_probability",
    "a_correct",
    "b_correct",
];

/// `disagreements.csv`'s rows: each image whose top-1 predictions differ, in `files`' order
/// (`files[i]`: image `i`'s path relative to the images' folder).
pub fn disagreement_rows(
    classes: &[String],
    files: &[String],
    scored: [&[Scored]; 2],
) -> Vec<Vec<String>> {
    let cell = tchrun::csv_out::cell;
    let name = |c: Option<usize>| cell(c.and_then(|c| classes.get(c)).map_or("?", String::as_str));
    let top = |s: &Scored| s.top.first().map_or(0.0, |&(_, p)| p);
    files
        .iter()
        .zip(scored[0].iter().zip(scored[1]))
        .filter(|(_, (a, b))| a.predicted() != b.predicted())
        .map(|(f, (a, b))| {
            vec![
                cell(f),
                name(Some(a.truth)),
                name(a.predicted()),
                format!("{:.6}", top(a)),
                name(b.predicted()),
                format!("{:.6}", top(b)),
                (a.predicted() == Some(a.truth)).to_string(),
                (b.predicted() == Some(b.truth)).to_string(),
            ]
        })
        .collect()
}

/// Both models must have the same classes in the same order; otherwise the message names
/// both directories and how their lists differ.
pub fn check_same_classes(a: (&Path, &[String]), b: (&Path, &[String])) -> Result<(), String> {
    if a.1 == b.1 {
        return Ok(());
    }
    let only = |x: &[String], y: &[String]| -> Vec<String> {
        x.iter()
            .filter(|c| !y.contains(c))
            .take(10)
            .cloned()
            .collect()
    };
    let (only_a, only_b) = (only(a.1, b.1), only(b.1, a.1));
    let how = if only_a.is_empty() && only_b.is_empty() && a.1.len() == b.1.len() {
        "the same classes in a different order".to_string()
    } else {
        format!(
            "{} class(es) against {}; only in the first: [{}], only in the second: [{}]",
            a.1.len(),
            b.1.len(),
            only_a.join(", "),
            only_b.join(", ")
        )
    };
    Err(format!(
        "--model {} and --model {} have different class lists ({how}); two models are \
         compared on the same classes: evaluate each alone, or compare models trained on the \
         same class folders",
        a.0.display(),
        b.0.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(truth: usize, pred: usize) -> Scored {
        Scored {
            truth,
            top: vec![(pred, 0.75), ((pred + 1) % 3, 0.25)],
            p_true: if truth == pred { 0.75 } else { 0.1 },
        }
    }

    fn names() -> Vec<String> {
        vec!["x".into(), "y".into(), "=z".into()]
    }

    #[test]
    fn counts_disagreements_and_the_verdict() {
        // truth 0 1 2 0 1; a right on 0,1,3; b right on 0,2,3,4.
        let a = [s(0, 0), s(1, 1), s(2, 0), s(0, 0), s(1, 2)];
        let b = [s(0, 0), s(1, 0), s(2, 2), s(0, 0), s(1, 1)];
        let c = compare(&names(), [Path::new("/A"), Path::new("/B")], [&a, &b]);
        let m = &c.mcnemar;
        assert_eq!(
            (
                m.both_correct,
                m.only_a_correct,
                m.only_b_correct,
                m.both_wrong
            ),
            (2, 1, 2, 0)
        );
        assert_eq!(c.disagreements, 3);
        assert!((c.top1_difference - 0.2).abs() < 1e-15);
        assert!(
            c.verdict.starts_with("no significant difference"),
            "{}",
            c.verdict
        );
        let files: Vec<String> = (0..5).map(|i| format!("f{i}.png")).collect();
        let rows = disagreement_rows(&c.classes, &files, [&a, &b]);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[1],
            ["f2.png", "'=z", "x", "0.750000", "'=z", "0.750000", "false", "true"]
        );
        let t = table(&c);
        assert_eq!(t[0], "a: /A");
        assert!(
            t[3].starts_with("top-1") && t[3].ends_with("+20.00 pt"),
            "{}",
            t[3]
        );
    }

    #[test]
    fn a_clear_winner_is_named() {
        let a: Vec<Scored> = (0..20).map(|_| s(0, 1)).collect();
        let b: Vec<Scored> = (0..20).map(|_| s(0, 0)).collect();
        let c = compare(&names(), [Path::new("/A"), Path::new("/B")], [&a, &b]);
        assert!(c.verdict.starts_with("b is better"), "{}", c.verdict);
        assert!(c.verdict.contains("p = 1.91e-6"), "{}", c.verdict);
        let same = compare(&names(), [Path::new("/A"), Path::new("/B")], [&a, &a]);
        assert!(
            same.verdict.starts_with("no difference"),
            "{}",
            same.verdict
        );
    }

    #[test]
    fn different_class_lists_name_both_models() {
        let (x, y) = (names(), vec!["y".to_string(), "x".into(), "=z".into()]);
        assert!(check_same_classes((Path::new("/A"), &x), (Path::new("/A2"), &x)).is_ok());
        let e = check_same_classes((Path::new("/A"), &x), (Path::new("/B"), &y)).unwrap_err();
        assert!(
            e.contains("--model /A and --model /B") && e.contains("different order"),
            "{e}"
        );
        let e = check_same_classes((Path::new("/A"), &x), (Path::new("/B"), &x[..2])).unwrap_err();
        assert!(
            e.contains("only in the first: [=z], only in the second: []"),
            "{e}"
        );
    }
}
