//! `tchrun-worker evaluate` ("Evaluate Model"): a labeled ImageFolder scored by one model
//! (`scores.csv`, `metrics.json`, `confusion_matrix.csv` and `.png` in `--output`), or by two
//! compared (each model's four files in `a/` and `b/`, and `comparison.json` and
//! `disagreements.csv` of `tchrun_data::comparison`). Every rank scores its batches with each
//! model; rank 0 gathers the rows and writes.
use super::score::{
    gather, infer, out_err, relative, shard, top_cells, write_csv, Compute, Ranks, Row, ScoreError,
};
use std::path::{Path, PathBuf};
use tchrun::csv_out::cell;
use tchrun::model::{self, ModelConfig};
use tchrun_data::comparison::{self, Comparison};
use tchrun_data::evaluation::{self, EvalMetrics, Scored};
use tchrun_data::ImageFolder;

/// What `evaluate` found, for the console.
pub enum Evaluated {
    One {
        images: usize,
        metrics: EvalMetrics,
    },
    Two {
        images: usize,
        comparison: Box<Comparison>,
    },
}

/// The images of a labeled folder, their labels mapped to the model's classes.
fn labeled(images: &Path, cfg: &ModelConfig) -> Result<ImageFolder, ScoreError> {
    let mut folder = ImageFolder::scan(images)?;
    let map = evaluation::map_classes(images, &folder.classes, &cfg.class_names)?;
    for s in &mut folder.samples {
        s.label = map[s.label];
    }
    folder.classes = cfg.class_names.clone();
    Ok(folder)
}

fn scored(folder: &ImageFolder, rows: &[Row]) -> Vec<Scored> {
    folder
        .samples
        .iter()
        .zip(rows)
        .map(|(s, r)| Scored {
            truth: s.label,
            top: r.top.clone(),
            p_true: r.p_label,
        })
        .collect()
}

/// `evaluate` of the labeled folder `images` by one model, or by two compared (`models`: one
/// or two directories; two must have the same class list). Rank 0 writes the outputs and
/// returns what it found; the other ranks return `None`.
pub fn evaluate(
    models: &[PathBuf],
    images: &Path,
    output: &Path,
    compute: &Compute,
    ranks: &Ranks,
) -> Result<Option<Evaluated>, ScoreError> {
    let cfgs = models
        .iter()
        .map(|m| model::load(m, true))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(cfg) = cfgs.first() else {
        return Err(ScoreError::Models(
            "--model: give the trained model directory".into(),
        ));
    };
    if let [a, b] = &cfgs[..] {
        comparison::check_same_classes((&models[0], &a.class_names), (&models[1], &b.class_names))
            .map_err(ScoreError::Models)?;
    }
    let folder = labeled(images, cfg)?;
    let n = folder.samples.len();
    let mine = shard(n, compute.batch_size, ranks.rank, ranks.world);
    tracing::info!(images = n, this_rank = mine.len(), "evaluating");
    let mut all = Vec::with_capacity(models.len());
    for (m, (dir, cfg)) in models.iter().zip(&cfgs).enumerate() {
        let rows = infer(dir, cfg, &folder, mine.clone(), compute)?;
        all.extend(gather(ranks, m, rows, n)?);
    }
    if all.len() != models.len() {
        return Ok(None);
    }
    let scores: Vec<Vec<Scored>> = all.iter().map(|rows| scored(&folder, rows)).collect();
    if let [a, b] = &scores[..] {
        for (m, dir) in comparison::MODEL_DIRS.iter().enumerate() {
            write_one(
                &output.join(dir),
                cfg,
                (&folder, images),
                &all[m],
                &scores[m],
            )?;
        }
        let c = comparison::compare(&cfg.class_names, [&models[0], &models[1]], [a, b]);
        write_comparison(output, (&folder, images), &c, [a, b])?;
        return Ok(Some(Evaluated::Two {
            images: n,
            comparison: Box::new(c),
        }));
    }
    let metrics = write_one(output, cfg, (&folder, images), &all[0], &scores[0])?;
    Ok(Some(Evaluated::One { images: n, metrics }))
}

/// One model's evaluation of `folder` (read from `images`, its files named from there) into
/// `output`: `scores.csv`, `metrics.json`, `confusion_matrix.csv`
/// and `confusion_matrix.png`. Returns the metrics.
fn write_one(
    output: &Path,
    cfg: &ModelConfig,
    (folder, images): (&ImageFolder, &Path),
    all: &[Row],
    scored: &[Scored],
) -> Result<EvalMetrics, ScoreError> {
    let metrics = evaluation::compute(&cfg.class_names, scored);
    let matrix = evaluation::confusion_matrix(cfg.class_names.len(), scored);
    std::fs::create_dir_all(output).map_err(|e| out_err(output)(&e))?;
    let png = output.join(evaluation::CONFUSION_PNG);
    crate::infer::confusion::png(&cfg.class_names, &matrix, &png).map_err(|e| out_err(&png)(&e))?;
    let csv = output.join(evaluation::CONFUSION_CSV);
    let (header, rows) = evaluation::confusion_table(&cfg.class_names, &matrix);
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    write_csv(&csv, &header, rows.into_iter())?;
    let scores = output.join(evaluation::SCORES_CSV);
    write_csv(
        &scores,
        &[
            "file",
            "true_class",
            "predicted_class",
            "probability",
            "true_class_probability",
            "top5_classes",
            "top5_probabilities",
        ],
        folder.samples.iter().zip(all).map(|(s, r)| {
            let [pred, p, top_c, top_p] = top_cells(cfg, &r.top);
            // The true class's probability in full (shortest round-trip f32): the log loss in
            // metrics.json is recomputable from this column exactly.
            vec![
                cell(&relative(&s.path, images)),
                cell(&cfg.class_names[s.label]),
                pred,
                p,
                format!("{}", r.p_label),
                top_c,
                top_p,
            ]
        }),
    )?;
    let json = output.join(evaluation::METRICS_JSON);
    let text = serde_json::to_string_pretty(&metrics).map_err(|e| out_err(&json)(&e))?;
    tchrun::files::write_atomic(&json, text.as_bytes()).map_err(|e| out_err(&json)(&e))?;
    Ok(metrics)
}

/// `disagreements.csv` and `comparison.json` of two models in `output`.
fn write_comparison(
    output: &Path,
    (folder, images): (&ImageFolder, &Path),
    c: &Comparison,
    scored: [&[Scored]; 2],
) -> Result<(), ScoreError> {
    let files: Vec<String> = folder
        .samples
        .iter()
        .map(|s| relative(&s.path, images))
        .collect();
    write_csv(
        &output.join(comparison::DISAGREEMENTS_CSV),
        &comparison::DISAGREEMENTS_HEADER,
        comparison::disagreement_rows(&c.classes, &files, scored).into_iter(),
    )?;
    let json = output.join(comparison::COMPARISON_JSON);
    let text = serde_json::to_string_pretty(c).map_err(|e| out_err(&json)(&e))?;
    tchrun::files::write_atomic(&json, text.as_bytes()).map_err(|e| out_err(&json)(&e))
}
