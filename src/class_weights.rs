//! `--class-weights auto|FILE`: per-class weights of the training loss (torch's
//! `F.cross_entropy(weight=...)`) for imbalanced training sets. `auto` is scikit-learn's
//! "balanced" rule over the training set's class counts; a file names classes and weights.
//! Resolved the same way by the launcher's pre-flight (bad files refused before any rank starts)
//! and by every rank; recorded in the run record and `model.json` (`ClassWeightsRecord`).
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where the weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ClassWeights {
    /// `n / (classes × n_c)` from the training set's counts.
    Auto,
    /// A JSON object `{"class": weight}` (`.json`) or CSV lines `class,weight`.
    File(PathBuf),
}

impl ClassWeights {
    /// The flag's value as the record keeps it: `auto` or the file's path.
    pub fn text(&self) -> String {
        match self {
            ClassWeights::Auto => "auto".into(),
            ClassWeights::File(p) => p.display().to_string(),
        }
    }
}

/// The flag's text (`text`), as the ranks' argv takes it.
impl Serialize for ClassWeights {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

fn parse(s: &str) -> Result<ClassWeights, String> {
    match s.trim() {
        "" => Err("give auto or a file of class weights (JSON or CSV)".into()),
        "auto" => Ok(ClassWeights::Auto),
        path => Ok(ClassWeights::File(PathBuf::from(path))),
    }
}

/// `--class-weights` (help heading "Training").
#[derive(Args, Debug, Clone, PartialEq, Default, Serialize)]
pub struct ClassWeightsFlags {
    /// Weigh each class in the training loss (torch's cross_entropy weight=; each micro-batch's
    /// loss is the weighted mean): auto: images / (classes × the class's images), from the
    /// training set (scikit-learn's "balanced"); or FILE: JSON {"class": weight, ...} or CSV
    /// lines class,weight; classes left out weigh 1. The validation loss stays unweighted.
    #[arg(help_heading = "Training", long, env = "TCHRUN_CLASS_WEIGHTS", value_parser = parse, value_name = "auto|FILE")]
    pub class_weights: Option<ClassWeights>,
}

impl ClassWeightsFlags {
    /// The flag for a rank: a file's path made absolute (ranks may start elsewhere).
    pub fn absolute(&self) -> ClassWeightsFlags {
        let class_weights = self.class_weights.clone().map(|w| match w {
            ClassWeights::File(p) => {
                ClassWeights::File(std::path::absolute(&p).unwrap_or_else(|_| p.clone()))
            }
            auto => auto,
        });
        ClassWeightsFlags { class_weights }
    }

    /// The weights of `classes` (in their label order) for a training set whose samples have
    /// `labels`; `None` without the flag. A file that cannot be read, names a class that is not
    /// one of `classes`, or gives a weight that is not a finite number > 0 is an error naming
    /// the flag, the file and the fix.
    pub fn resolve(
        &self,
        classes: &[String],
        labels: impl Iterator<Item = usize>,
    ) -> Result<Option<Vec<f64>>, String> {
        match &self.class_weights {
            None => Ok(None),
            Some(ClassWeights::Auto) => {
                let mut counts = vec![0usize; classes.len()];
                for l in labels {
                    if let Some(c) = counts.get_mut(l) {
                        *c += 1;
                    }
                }
                Ok(Some(balanced(&counts)))
            }
            Some(ClassWeights::File(p)) => read_file(p, classes)
                .map(Some)
                .map_err(|e| format!("--class-weights {}: {e}", p.display())),
        }
    }

    /// What the run record keeps (the weights are filled in by whoever resolved them).
    pub fn record(&self) -> ClassWeightsRecord {
        ClassWeightsRecord {
            class_weights: self.class_weights.as_ref().map(ClassWeights::text),
            class_weight_values: None,
        }
    }
}

/// scikit-learn's `compute_class_weight("balanced")`: `n / (classes × n_c)`; a class without
/// images (it adds nothing to the loss) weighs 1.
pub fn balanced(counts: &[usize]) -> Vec<f64> {
    let n: usize = counts.iter().sum();
    let c = counts.len() as f64;
    counts
        .iter()
        .map(|&k| {
            if k == 0 {
                1.0
            } else {
                n as f64 / (c * k as f64)
            }
        })
        .collect()
}

/// The weights a file gives `classes`: a JSON object (a `.json` name) or CSV rows
/// `class,weight` (a first row whose weight is not a number is a header).
pub fn read_file(path: &Path, classes: &[String]) -> Result<Vec<f64>, String> {
    let text = crate::files::read_bounded_string(path, crate::files::caps::CLASS_WEIGHTS)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let pairs: Vec<(String, String)> = if is_json {
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
            .map_err(|e| format!("not a JSON object of class names to weights: {e}"))?;
        map.into_iter().map(|(k, v)| (k, v.to_string())).collect()
    } else {
        let mut rows = csv::ReaderBuilder::new()
            .has_headers(false)
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let mut out = Vec::new();
        for (i, row) in rows.records().enumerate() {
            let row = row.map_err(|e| format!("CSV row {}: {e}", i + 1))?;
            let (Some(name), Some(w), None) = (row.get(0), row.get(1), row.get(2)) else {
                return Err(format!("CSV row {}: want two fields, class,weight", i + 1));
            };
            if i == 0 && w.parse::<f64>().is_err() {
                continue; // a header
            }
            out.push((name.to_string(), w.to_string()));
        }
        out
    };
    if pairs.is_empty() {
        return Err(
            "names no class; give JSON {\"class\": weight, ...} or CSV lines class,weight, or \
             leave --class-weights out"
                .into(),
        );
    }
    let mut weights = vec![1.0; classes.len()];
    let mut seen = vec![false; classes.len()];
    for (name, w) in pairs {
        let Some(i) = classes.iter().position(|c| *c == name) else {
            return Err(format!(
                "class {name:?} is not a class of the training set ({}); name the training \
                 folder's sub-folders",
                list(classes)
            ));
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!(
                "class {name:?} is given twice; give each class once"
            ));
        }
        weights[i] = weight(&name, &w)?;
    }
    Ok(weights)
}

/// A class's weight: a finite number > 0 that stays one in the f32 the loss computes in (1e308
/// is finite in f64 but infinite in f32; 1e-50 rounds to 0 there), so that a weight never
/// reaches the loss as an infinity or a zero, and a bad one is named here, not as "training
/// diverged".
fn weight(name: &str, w: &str) -> Result<f64, String> {
    const F32_RANGE: &str = "between 1.2e-38 and 3.4e38 (the loss computes in 32-bit floats)";
    match w.trim_matches('"').parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => {
            let single = v as f32;
            if single.is_infinite() {
                Err(format!(
                    "class {name:?}: weight {w} is infinite in 32-bit floats; give a weight \
                     {F32_RANGE}"
                ))
            } else if !single.is_normal() {
                Err(format!(
                    "class {name:?}: weight {w} rounds to 0 in 32-bit floats; give a weight \
                     {F32_RANGE}"
                ))
            } else {
                Ok(v)
            }
        }
        _ => Err(format!(
            "class {name:?}: weight {w} is not a finite number > 0"
        )),
    }
}

fn list(classes: &[String]) -> String {
    let shown: Vec<&str> = classes.iter().take(8).map(String::as_str).collect();
    let more = classes.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{}, and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// `--class-weights` in the run record and `model.json`'s `training`: the flag as given and the
/// weights it resolved to, per class in label order. A resume compares the flag.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassWeightsRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_weights: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_weight_values: Option<Vec<f64>>,
}

impl ClassWeightsRecord {
    /// The flag's difference between `self` (the checkpoint's) and `now`, as
    /// `RecipeRecord::differences` gives it: (flag, was, is, the flag that gives it back).
    pub fn difference(&self, now: &ClassWeightsRecord) -> Option<(String, String, String, String)> {
        if self.class_weights == now.class_weights {
            return None;
        }
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        let fix = match &self.class_weights {
            Some(v) => format!("--class-weights {v}"),
            None => "no --class-weights".into(),
        };
        Some((
            "--class-weights".into(),
            show(&self.class_weights),
            show(&now.class_weights),
            fix,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    /// scikit-learn's "balanced": 6 images of 3 classes counted 3, 2, 1 weigh 2/3, 1, 2.
    #[test]
    fn auto_is_scikit_learns_balanced() {
        let f = ClassWeightsFlags {
            class_weights: Some(ClassWeights::Auto),
        };
        let w = f
            .resolve(&names(3), [0, 0, 0, 1, 1, 2].into_iter())
            .expect("auto");
        assert_eq!(w, Some(vec![6.0 / 9.0, 1.0, 2.0]));
        assert_eq!(balanced(&[4, 0]), vec![0.5, 1.0]);
    }

    /// Files: JSON and CSV (with or without a header), classes left out weigh 1; an unknown
    /// class, a weight of 0 or not a number are refused naming the class.
    #[test]
    fn files_name_classes_and_bad_ones_are_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let put = |name: &str, text: &str| {
            let p = t.path().join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let c = names(3);
        let json = put("w.json", r#"{"c2": 4, "c0": 0.5}"#);
        assert_eq!(read_file(&json, &c), Ok(vec![0.5, 1.0, 4.0]));
        let csv = put("w.csv", "class,weight\nc1, 3\n");
        assert_eq!(read_file(&csv, &c), Ok(vec![1.0, 3.0, 1.0]));
        let bare = put("w.txt", "c0,2\n");
        assert_eq!(read_file(&bare, &c), Ok(vec![2.0, 1.0, 1.0]));
        let e = read_file(&put("u.json", r#"{"cat": 2}"#), &c).expect_err("unknown");
        assert!(
            e.contains("\"cat\" is not a class") && e.contains("c0, c1, c2"),
            "{e}"
        );
        let e = read_file(&put("z.csv", "c1,0\n"), &c).expect_err("zero");
        assert!(e.contains("\"c1\": weight 0"), "{e}");
        let e = read_file(&put("n.json", r#"{"c1": "x"}"#), &c).expect_err("text");
        assert!(e.contains("\"c1\""), "{e}");
        let e = read_file(&put("three.csv", "c1,1,2\n"), &c).expect_err("fields");
        assert!(e.contains("two fields"), "{e}");
        let f = ClassWeightsFlags {
            class_weights: Some(ClassWeights::File(t.path().join("missing.json"))),
        };
        let e = f.resolve(&c, std::iter::empty()).expect_err("missing");
        assert!(
            e.starts_with("--class-weights ") && e.contains("cannot read"),
            "{e}"
        );
        assert!(parse(" ").is_err());
    }

    /// Issue 52 item 6: an empty file, a class given twice, a weight infinite in f32 (1e308,
    /// finite in f64) or rounding to 0 in f32 (1e-50) are refused with the reason, not trained
    /// into "training diverged" or a class that counts for nothing; a FIFO is refused at once.
    #[test]
    fn weights_the_loss_cannot_use_are_refused_with_the_reason() {
        let t = tempfile::tempdir().expect("tmp");
        let put = |name: &str, text: &str| {
            let p = t.path().join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let c = names(3);
        for (file, text, want) in [
            ("empty.csv", "", "names no class"),
            ("header.csv", "class,weight\n", "names no class"),
            ("empty.json", "{}", "names no class"),
            ("twice.csv", "c1,2\nc1,3\n", "\"c1\" is given twice"),
            ("huge.json", r#"{"c0": 1e308}"#, "infinite in 32-bit floats"),
            ("tiny.csv", "c2,1e-50\n", "rounds to 0 in 32-bit floats"),
        ] {
            let e = read_file(&put(file, text), &c).expect_err(file);
            assert!(e.contains(want), "{file}: {e}");
        }
        assert_eq!(
            read_file(&put("edge.csv", "c0,3e38\nc1,1.2e-38\n"), &c),
            Ok(vec![3e38, 1.2e-38, 1.0])
        );
        let fifo = t.path().join("fifo.csv");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = read_file(&fifo, &c).expect_err("a FIFO");
        assert!(e.contains("FIFO"), "{e}");
    }

    #[test]
    fn a_resume_compares_the_flag() {
        let auto = ClassWeightsRecord {
            class_weights: Some("auto".into()),
            class_weight_values: Some(vec![1.0]),
        };
        let none = ClassWeightsRecord::default();
        let d = auto.difference(&none).expect("differs");
        assert_eq!(
            (d.0.as_str(), d.3.as_str()),
            ("--class-weights", "--class-weights auto")
        );
        assert_eq!(
            none.difference(&auto).map(|d| d.3),
            Some("no --class-weights".into())
        );
        assert!(auto.difference(&auto.clone()).is_none());
    }
}
