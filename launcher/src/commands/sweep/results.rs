//! `tchrun sweep results DIR [--sort METRIC]`: one row per run of a sweep (its point, best
//! epoch, top-1/top-5 and validation loss of that epoch, training images/s, state, model
//! path, and for an unfinished run its cause), read from each run's own `model.json`,
//! `metrics.jsonl` and records; printed as a table, written to `DIR/results.csv` and into
//! `DIR/sweep.json`.
use super::record::{run_state, RunRecord, RunState, SweepRecord};
pub use super::row::Row;
use crate::error::JobError;
use clap::{Parser, ValueEnum};
use std::path::{Path, PathBuf};
use tchrun::files;
use tchrun::metrics::EpochMetrics;

/// `tchrun sweep results` flags.
#[derive(Parser, Debug)]
#[command(
    name = "tchrun sweep results",
    about = "One table of a sweep's runs (best epoch, top-1/top-5, validation loss, images/s, state, model); also DIR/results.csv and DIR/sweep.json's results"
)]
pub struct ResultsArgs {
    /// The sweep's directory (its --output, holding sweep.json).
    pub dir: PathBuf,
    /// The column to sort by (best first; runs without it last). Default: the sweep's order.
    #[arg(long, value_enum)]
    pub sort: Option<SortBy>,
}

/// What `--sort` orders by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    /// Highest validation top-1 first.
    Top1,
    /// Highest validation top-5 first.
    Top5,
    /// Lowest validation loss first.
    #[value(alias = "val-loss")]
    Loss,
    /// Most training images per second first.
    #[value(name = "images-per-sec")]
    Speed,
    /// The point's name.
    Name,
}

fn metrics_rows(output: &Path) -> Vec<EpochMetrics> {
    let path = output.join(files::METRICS_JSONL);
    let Ok(text) = files::read_bounded_string(&path, files::caps::RECORD) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The row of one run, from its folder.
pub fn row(run: &RunRecord) -> Row {
    let state = run_state(&run.output);
    let rows = metrics_rows(&run.output);
    let finished = state == RunState::Finished;
    let model = finished
        .then(|| tchrun::model::load(&run.output, true).ok())
        .flatten();
    let best_epoch = model
        .as_ref()
        .and_then(|m| m.training.as_ref())
        .map(|t| t.best_epoch)
        .or_else(|| {
            rows.iter()
                .min_by(|a, b| a.val_loss.total_cmp(&b.val_loss))
                .map(|r| r.epoch)
        });
    let best = best_epoch.and_then(|e| rows.iter().find(|r| r.epoch == e));
    let speed = (!rows.is_empty())
        .then(|| rows.iter().map(|r| r.train_images_per_sec).sum::<f64>() / rows.len() as f64);
    Row {
        index: run.index,
        point: run.point.name.clone(),
        flags: run.point.flags.clone(),
        best_epoch,
        top1: best.map(|r| r.top1),
        top5: best.map(|r| r.top5),
        val_loss: best.map(|r| r.val_loss),
        images_per_sec: speed,
        state: state.word().to_string(),
        model: model.map(|_| run.output.clone()),
        cause: state.detail(),
    }
}

/// Sorts rows best first by `by`; rows without the value last, in the sweep's order.
pub fn sort(rows: &mut [Row], by: Option<SortBy>) {
    let key = |r: &Row| -> Option<f64> {
        match by? {
            SortBy::Top1 => r.top1.map(|v| -v),
            SortBy::Top5 => r.top5.map(|v| -v),
            SortBy::Loss => r.val_loss,
            SortBy::Speed => r.images_per_sec.map(|v| -v),
            SortBy::Name => None,
        }
    };
    rows.sort_by(|a, b| match (key(a), key(b)) {
        (Some(x), Some(y)) => x.total_cmp(&y).then(a.index.cmp(&b.index)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) if by == Some(SortBy::Name) => a.point.cmp(&b.point),
        (None, None) => a.index.cmp(&b.index),
    });
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2}%", v * 100.0))
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The printed table: aligned columns, then one line per unfinished run with its cause.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "point",
        "best epoch",
        "top-1",
        "top-5",
        "valid loss",
        "images/s",
        "state",
        "model",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.point.clone(),
                r.best_epoch.map_or("-".into(), |e| e.to_string()),
                pct(r.top1),
                pct(r.top5),
                num(r.val_loss, 4),
                num(r.images_per_sec, 1),
                r.state.clone(),
                r.model
                    .as_ref()
                    .map_or("-".into(), |m| m.display().to_string()),
            ]
        })
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for c in &cells {
        for (w, v) in width.iter_mut().zip(c) {
            *w = (*w).max(v.chars().count());
        }
    }
    let line = |c: &[String]| -> String {
        let mut s = String::new();
        for (i, (v, w)) in c.iter().zip(&width).enumerate() {
            // Text left, numbers right.
            if (1..=5).contains(&i) {
                s.push_str(&format!("{v:>w$}  "));
            } else {
                s.push_str(&format!("{v:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&header.map(String::from));
    for c in &cells {
        out.push_str(&line(c));
    }
    for r in rows.iter().filter(|r| !r.cause.is_empty()) {
        out.push_str(&format!("{} ({}): {}\n", r.point, r.state, r.cause));
    }
    out
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// `DIR/results.csv`.
fn write_csv(dir: &Path, rows: &[Row]) -> Result<(), JobError> {
    use tchrun::csv_out::{cell, path_cell};
    let header = [
        "point",
        "flags",
        "best_epoch",
        "top1",
        "top5",
        "val_loss",
        "images_per_sec",
        "state",
        "model",
        "cause",
    ];
    let body = rows.iter().map(|r| {
        vec![
            cell(&r.point),
            // `lr=0.1 batch-size=16`: without the dashes a spreadsheet would quote away.
            cell(
                &r.flags
                    .iter()
                    .map(|f| f.trim_start_matches("--"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            r.best_epoch.map_or(String::new(), |e| e.to_string()),
            opt(r.top1),
            opt(r.top5),
            opt(r.val_loss),
            opt(r.images_per_sec),
            cell(&r.state),
            r.model.as_deref().map_or(String::new(), path_cell),
            cell(&r.cause),
        ]
    });
    tchrun::csv_out::write(&dir.join("results.csv"), &header, body)
        .map_err(|e| JobError::invalid(format!("cannot write the results: {e}")))
}

/// The rows of the sweep in `dir` (sorted), written to `results.csv` and `sweep.json`.
pub fn collect(
    dir: &Path,
    rec: &mut SweepRecord,
    by: Option<SortBy>,
) -> Result<Vec<Row>, JobError> {
    let mut rows: Vec<Row> = rec.runs.iter().map(row).collect();
    sort(&mut rows, by);
    write_csv(dir, &rows)?;
    rec.results = Some(rows.clone());
    rec.write(dir)
        .map_err(|e| JobError::invalid(e.to_string()))?;
    Ok(rows)
}

/// `tchrun sweep results DIR`.
pub fn run(a: &ResultsArgs) -> Result<i32, JobError> {
    let dir = crate::plan::preflight::absolute(a.dir.clone());
    let Some(mut rec) = SweepRecord::read(&dir).map_err(|e| JobError::invalid(e.to_string()))?
    else {
        return Err(JobError::invalid(format!(
            "{}: no {} there; give the --output of a `tchrun sweep`",
            dir.display(),
            super::record::SWEEP_JSON
        )));
    };
    let rows = collect(&dir, &mut rec, a.sort)?;
    outln!("{}", table(&rows).trim_end());
    outln!(
        "tchrun sweep: {} run(s); also in {} and {}",
        rows.len(),
        dir.join("results.csv").display(),
        SweepRecord::path(&dir).display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(index: usize, top1: Option<f64>) -> Row {
        Row {
            index,
            point: format!("p{index}"),
            flags: vec![],
            best_epoch: top1.map(|_| 1),
            top1,
            top5: top1,
            val_loss: top1.map(|v| 1.0 - v),
            images_per_sec: Some(10.0 * index as f64),
            state: if top1.is_some() { "finished" } else { "failed" }.into(),
            model: top1.map(|_| PathBuf::from(format!("/s/p{index}"))),
            cause: if top1.is_some() {
                String::new()
            } else {
                "rank_failed: boom".into()
            },
        }
    }

    #[test]
    fn sorted_best_first_unfinished_last() {
        let mut rows = vec![
            r(0, Some(0.5)),
            r(1, None),
            r(2, Some(0.9)),
            r(3, Some(0.7)),
        ];
        sort(&mut rows, Some(SortBy::Top1));
        let order: Vec<usize> = rows.iter().map(|r| r.index).collect();
        assert_eq!(order, [2, 3, 0, 1]);
        sort(&mut rows, Some(SortBy::Loss));
        assert_eq!(rows[0].index, 2);
        sort(&mut rows, None);
        assert_eq!(rows[0].index, 0);
        sort(&mut rows, Some(SortBy::Speed));
        assert_eq!(rows[0].index, 3);
    }

    #[test]
    fn the_table_names_every_column_and_each_failure_cause() {
        let t = table(&[r(0, Some(0.5)), r(1, None)]);
        let lines: Vec<&str> = t.lines().collect();
        let header: Vec<&str> = lines[0].split("  ").filter(|c| !c.is_empty()).collect();
        let header: Vec<&str> = header.iter().map(|c| c.trim()).collect();
        assert_eq!(
            header,
            [
                "point",
                "best epoch",
                "top-1",
                "top-5",
                "valid loss",
                "images/s",
                "state",
                "model"
            ],
            "{t}"
        );
        assert!(
            lines[1].contains("50.00%") && lines[1].contains("/s/p0"),
            "{t}"
        );
        assert!(
            lines[2].contains("failed") && lines[2].ends_with('-'),
            "{t}"
        );
        assert_eq!(lines[3], "p1 (failed): rank_failed: boom");
    }
}
