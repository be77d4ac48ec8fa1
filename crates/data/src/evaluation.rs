//! "Evaluate Model" for a multi-class classifier: the figures of `tchrun evaluate`
//! (`metrics.json`, `confusion_matrix.csv`) from each image's true class, top-5 prediction and
//! true-class probability. Pure arithmetic, defined as scikit-learn defines it
//! (`confusion_matrix`, `precision_recall_fscore_support(zero_division=0)`, `log_loss`), so a
//! user can recompute every figure from `scores.csv`.
use crate::DatasetError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// Version of the `metrics.json` layout.
pub const SCHEMA_VERSION: u32 = 1;

/// File names in an evaluation directory.
pub const SCORES_CSV: &str = "scores.csv";
pub const METRICS_JSON: &str = "metrics.json";
pub const CONFUSION_CSV: &str = "confusion_matrix.csv";
pub const CONFUSION_PNG: &str = "confusion_matrix.png";

/// One scored image of a labeled set.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Index of the true class in the model's class list.
    pub truth: usize,
    /// Up to five (class index, probability), most probable first.
    pub top: Vec<(usize, f32)>,
    /// The model's probability of the true class.
    pub p_true: f32,
}

impl Scored {
    pub fn predicted(&self) -> Option<usize> {
        self.top.first().map(|&(c, _)| c)
    }
}

/// Precision, recall, F1 and support of one class, or their average.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassFigures {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Images whose true class this is (for an average: all images counted).
    pub support: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerClass {
    pub class: String,
    #[serde(flatten)]
    pub figures: ClassFigures,
}

/// `metrics.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    pub schema: u32,
    pub images: u64,
    /// Fraction of images whose most probable class is the true one.
    pub top1: f64,
    /// Fraction whose true class is among the five most probable (all of them with < 5 classes).
    pub top5: f64,
    /// Mean of -ln p(true class), p clipped to [eps, 1 - eps] with eps = f64::EPSILON
    /// (scikit-learn's `log_loss` on float64 probabilities).
    pub log_loss: f64,
    /// Every class of the model, in the model's order (classes without images have support 0).
    pub per_class: Vec<PerClass>,
    /// Unweighted mean over the classes that occur as truth or prediction (scikit-learn's
    /// default label set).
    pub macro_avg: ClassFigures,
    /// Mean over the same classes weighted by support.
    pub weighted_avg: ClassFigures,
}

/// Counts: `m[true][predicted]`, classes in the model's order.
pub fn confusion_matrix(classes: usize, scored: &[Scored]) -> Vec<Vec<u64>> {
    let mut m = vec![vec![0u64; classes]; classes];
    for s in scored {
        if let Some(p) = s.predicted() {
            if s.truth < classes && p < classes {
                m[s.truth][p] += 1;
            }
        }
    }
    m
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

fn figures(tp: u64, predicted: u64, support: u64) -> ClassFigures {
    let precision = ratio(tp, predicted);
    let recall = ratio(tp, support);
    // F1 as scikit-learn computes it: 2·tp / (2·tp + fp + fn), 0 when that is 0/0.
    let f1 = ratio(2 * tp, predicted + support);
    ClassFigures {
        precision,
        recall,
        f1,
        support,
    }
}

/// The evaluation figures of `scored` for a model with `classes`.
pub fn compute(classes: &[String], scored: &[Scored]) -> EvalMetrics {
    let k = classes.len();
    let m = confusion_matrix(k, scored);
    let n = scored.len() as u64;
    let support: Vec<u64> = m.iter().map(|row| row.iter().sum()).collect();
    let predicted: Vec<u64> = (0..k).map(|c| m.iter().map(|row| row[c]).sum()).collect();
    let per: Vec<ClassFigures> = (0..k)
        .map(|c| figures(m[c][c], predicted[c], support[c]))
        .collect();
    let present: Vec<usize> = (0..k)
        .filter(|&c| support[c] > 0 || predicted[c] > 0)
        .collect();
    let mean = |f: &dyn Fn(&ClassFigures) -> f64, weighted: bool| -> f64 {
        let (mut num, mut den) = (0.0, 0.0);
        for &c in &present {
            let w = if weighted { per[c].support as f64 } else { 1.0 };
            num += w * f(&per[c]);
            den += w;
        }
        if den == 0.0 {
            0.0
        } else {
            num / den
        }
    };
    let avg = |weighted: bool| ClassFigures {
        precision: mean(&|x| x.precision, weighted),
        recall: mean(&|x| x.recall, weighted),
        f1: mean(&|x| x.f1, weighted),
        support: n,
    };
    let (macro_avg, weighted_avg) = (avg(false), avg(true));
    let top1 = scored
        .iter()
        .filter(|s| s.predicted() == Some(s.truth))
        .count() as u64;
    let top5 = scored
        .iter()
        .filter(|s| s.top.iter().take(5).any(|&(c, _)| c == s.truth))
        .count() as u64;
    let eps = f64::EPSILON;
    let log_loss = if scored.is_empty() {
        0.0
    } else {
        scored
            .iter()
            .map(|s| -(f64::from(s.p_true).clamp(eps, 1.0 - eps)).ln())
            .sum::<f64>()
            / n as f64
    };
    EvalMetrics {
        schema: SCHEMA_VERSION,
        images: n,
        top1: ratio(top1, n),
        top5: ratio(top5, n),
        log_loss,
        per_class: classes
            .iter()
            .zip(per)
            .map(|(c, figures)| PerClass {
                class: c.clone(),
                figures,
            })
            .collect(),
        macro_avg,
        weighted_avg,
    }
}

/// `confusion_matrix.csv`: a header row of predicted classes, then one row per true class.
pub fn confusion_csv(classes: &[String], m: &[Vec<u64>]) -> String {
    let (header, rows) = confusion_table(classes, m);
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    // Writing into memory cannot fail.
    String::from_utf8_lossy(&tchrun::csv_out::to_bytes(&header, rows).unwrap_or_default())
        .into_owned()
}

/// `confusion_matrix.csv` as a header and rows for `csv_out` (class names made safe cells).
pub fn confusion_table(classes: &[String], m: &[Vec<u64>]) -> (Vec<String>, Vec<Vec<String>>) {
    let cell = tchrun::csv_out::cell;
    let mut header = vec!["true\\predicted".to_string()];
    header.extend(classes.iter().map(|c| cell(c)));
    let rows = classes
        .iter()
        .zip(m)
        .map(|(c, row)| {
            let mut r = vec![cell(c)];
            r.extend(row.iter().map(u64::to_string));
            r
        })
        .collect();
    (header, rows)
}

/// For each class folder of a labeled set, its index among the model's classes. A folder that
/// names no class of the model is an `InvalidDatasetError` naming every such folder.
pub fn map_classes(
    root: &Path,
    folders: &[String],
    model_classes: &[String],
) -> Result<Vec<usize>, DatasetError> {
    let mut unknown = Vec::new();
    let mut map = Vec::with_capacity(folders.len());
    for f in folders {
        match model_classes.iter().position(|c| c == f) {
            Some(i) => map.push(i),
            None => unknown.push(f.as_str()),
        }
    }
    if unknown.is_empty() {
        return Ok(map);
    }
    let known: BTreeSet<&str> = model_classes.iter().map(String::as_str).collect();
    let shown: Vec<&str> = known.iter().take(20).copied().collect();
    Err(DatasetError::InvalidDataset {
        detail: format!(
            "{}: class folder(s) [{}] are not classes of the model (its {} classes: {}{}); \
             remove or rename them, or evaluate with the model trained on these classes",
            root.display(),
            unknown.join(", "),
            model_classes.len(),
            shown.join(", "),
            if known.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(truth: usize, top: &[usize], p_true: f32) -> Scored {
        Scored {
            truth,
            top: top.iter().map(|&c| (c, 0.5)).collect(),
            p_true,
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn figures_match_a_hand_computed_example() {
        // truth:     0 0 0 1 1 2
        // predicted: 0 0 1 1 0 0   (class 3 never occurs)
        let scored = vec![
            s(0, &[0, 1], 0.9),
            s(0, &[0, 2], 0.8),
            s(0, &[1, 0], 0.3),
            s(1, &[1, 0], 0.6),
            s(1, &[0, 3], 0.1),
            s(2, &[0, 1], 0.05),
        ];
        let m = compute(&names(4), &scored);
        assert_eq!(
            confusion_matrix(4, &scored),
            vec![
                vec![2, 1, 0, 0],
                vec![1, 1, 0, 0],
                vec![1, 0, 0, 0],
                vec![0, 0, 0, 0]
            ]
        );
        assert_eq!(m.images, 6);
        assert!((m.top1 - 3.0 / 6.0).abs() < 1e-15);
        // top-2 lists: the truth is missing only for image 5 (1 not in [0,3]) and 6.
        assert!((m.top5 - 4.0 / 6.0).abs() < 1e-15);
        let c0 = &m.per_class[0].figures;
        assert!((c0.precision - 0.5).abs() < 1e-15 && (c0.recall - 2.0 / 3.0).abs() < 1e-15);
        assert!((c0.f1 - 4.0 / 7.0).abs() < 1e-15);
        let c2 = &m.per_class[2].figures;
        assert_eq!(
            (c2.precision, c2.recall, c2.f1, c2.support),
            (0.0, 0.0, 0.0, 1)
        );
        // Class 3 neither occurs nor is predicted: it is listed but not averaged.
        assert_eq!(m.per_class[3].figures.support, 0);
        let macro_p = (0.5 + 0.5 + 0.0) / 3.0;
        assert!((m.macro_avg.precision - macro_p).abs() < 1e-15);
        let weighted_r = (3.0 * (2.0 / 3.0) + 2.0 * 0.5 + 0.0) / 6.0;
        assert!((m.weighted_avg.recall - weighted_r).abs() < 1e-15);
        let ll = -[0.9f32, 0.8, 0.3, 0.6, 0.1, 0.05]
            .iter()
            .map(|&p| f64::from(p).ln())
            .sum::<f64>()
            / 6.0;
        assert!((m.log_loss - ll).abs() < 1e-12);
    }

    #[test]
    fn a_zero_probability_is_clipped_like_scikit_learn() {
        let m = compute(&names(2), &[s(0, &[1, 0], 0.0)]);
        assert!(
            (m.log_loss + f64::EPSILON.ln()).abs() < 1e-9,
            "{}",
            m.log_loss
        );
    }

    #[test]
    fn the_csv_has_classes_in_model_order_and_quotes_commas() {
        let classes = vec!["b".to_string(), "a,x".to_string()];
        let text = confusion_csv(&classes, &[vec![1, 2], vec![3, 4]]);
        assert_eq!(text, "true\\predicted,b,\"a,x\"\nb,1,2\n\"a,x\",3,4\n");
    }

    #[test]
    fn unknown_class_folders_are_named() {
        let model = vec!["cat".to_string(), "dog".to_string()];
        let got = map_classes(Path::new("/d"), &["dog".into(), "cat".into()], &model).unwrap();
        assert_eq!(got, vec![1, 0]);
        let e = map_classes(
            Path::new("/d"),
            &["cow".into(), "dog".into(), "emu".into()],
            &model,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("InvalidDatasetError: /d: class folder(s) [cow, emu]"),
            "{e}"
        );
    }
}
