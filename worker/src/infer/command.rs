//! `tchrun-worker score` and `evaluate` as ranks: outputs checked against the model and the
//! images, the rank started, the store carrying each rank's rows to rank 0.
use super::evaluate::{self, Evaluated};
use super::score;
use crate::rank::start::{command_line, leave, start_rank, Fatal, Rank, RankResult};
use clap::Args;
use std::path::PathBuf;
use tchrun::exit::ErrorKind;
use tchrun::flags::RankFlags;
use tchrun::inference_flags::Inference;

#[derive(Args, Debug)]
#[command(
    mut_arg("model", |a| a.help(Inference::Score.model_help())),
    mut_arg("images", |a| a.help(Inference::Score.images_help())),
    mut_arg("output", |a| a.help(Inference::Score.output_help()))
)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub job: tchrun::inference_flags::InferenceJob,
    #[command(flatten)]
    pub rank: RankFlags,
}

#[derive(Args, Debug)]
#[command(
    mut_arg("model", |a| a.help(Inference::Evaluate.model_help())),
    mut_arg("images", |a| a.help(Inference::Evaluate.images_help())),
    mut_arg("output", |a| a.help(Inference::Evaluate.output_help()))
)]
pub struct EvaluateArgs {
    #[command(flatten)]
    pub job: tchrun::inference_flags::InferenceJob,
    #[command(flatten)]
    pub rank: RankFlags,
}

/// Runs `body` (scoring or evaluation) as one rank of the job: the store carries each
/// rank's rows to rank 0.
fn run_inference(
    flags: &RankFlags,
    default_logs: PathBuf,
    output_dir: Option<&std::path::Path>,
    batch_size: u32,
    body: impl FnOnce(&score::Compute, &score::Ranks, &dyn Fn(&str)) -> Result<(), score::ScoreError>,
) -> RankResult {
    let log_dir = flags
        .log_dir
        .clone()
        .unwrap_or_else(|| default_logs.clone());
    let lock_dirs = tchrun::lock::job_dirs(output_dir, &log_dir);
    let rank = start_rank(flags, default_logs, &command_line(), &lock_dirs)?;
    let Rank {
        joined,
        pg,
        device,
        console,
        ..
    } = rank;
    let store = &joined.store;
    let set = |k: &str, v: &[u8]| store.set(k, v).map_err(|e| e.to_string());
    let get = |k: &str| store.get(k).map_err(|e| e.to_string());
    let ranks = score::Ranks {
        rank: pg.rank(),
        world: pg.size(),
        set: &set,
        get: &get,
    };
    let compute = score::Compute {
        batch_size: batch_size as usize,
        device,
        threads: tchrun::env::threads_per_rank(joined.info.place.local_size),
    };
    let say = |line: &str| {
        tracing::info!("{line}");
        console.out(line);
    };
    let r = body(&compute, &ranks, &say);
    leave(pg, joined, r.is_ok());
    r.map_err(|e| {
        let kind = if e.is_input_error() {
            ErrorKind::InvalidInput
        } else {
            ErrorKind::RankFailed
        };
        (
            Some(console),
            Fatal {
                kind,
                err: e.into(),
            },
        )
    })
}

/// `score`/`evaluate` started by hand: the count of `--model` as `kind` takes it, and outputs
/// that would overwrite a model or the images refused (as `tchrun` refuses them) before
/// anything is written.
fn check_inference_paths(
    kind: Inference,
    output: (&str, &std::path::Path),
    log_dir: &std::path::Path,
    job: &tchrun::inference_flags::InferenceJob,
) -> RankResult {
    use tchrun::overlap::Named;
    let models = job
        .models(kind)
        .map_err(|e| (None, Fatal::invalid(anyhow::anyhow!(e))))?;
    let mut inputs: Vec<Named> = models
        .iter()
        .map(|m| Named::new("--model", "the trained model directory", m))
        .collect();
    inputs.push(Named::new("--images", "the images", &job.images));
    tchrun::overlap::check_disjoint(
        &[
            Named::new("--output", output.0, output.1),
            Named::new("--log-dir", "the job's logs", log_dir),
        ],
        &inputs,
    )
    .map_err(|e| (None, Fatal::invalid(e.into())))
}

/// Scores the images as this rank.
pub fn run_score(ScoreArgs { job: a, rank }: ScoreArgs) -> RankResult {
    check_inference_paths(
        Inference::Score,
        ("the scores CSV", &a.output),
        &rank
            .log_dir
            .clone()
            .unwrap_or_else(|| a.default_log_dir(Inference::Score)),
        &a,
    )?;
    run_inference(
        &rank,
        a.default_log_dir(Inference::Score),
        None,
        a.batch_size,
        |compute, ranks, say| {
            let n = score::score(a.first_model(), &a.images, &a.output, compute, ranks)?;
            if ranks.rank == 0 {
                say(&format!(
                    "scored {n} image(s) on {} into {}",
                    tchrun::counts::ranks(ranks.world),
                    a.output.display()
                ));
            }
            Ok(())
        },
    )
}

/// Evaluates the model as this rank.
pub fn run_evaluate(EvaluateArgs { job: a, rank }: EvaluateArgs) -> RankResult {
    check_inference_paths(
        Inference::Evaluate,
        ("the evaluation directory", &a.output),
        &rank
            .log_dir
            .clone()
            .unwrap_or_else(|| a.default_log_dir(Inference::Evaluate)),
        &a,
    )?;
    run_inference(
        &rank,
        a.default_log_dir(Inference::Evaluate),
        Some(&a.output),
        a.batch_size,
        |compute, ranks, say| {
            let found = evaluate::evaluate(&a.model, &a.images, &a.output, compute, ranks)?;
            if let Some(e) = found {
                report_evaluated(&e, ranks.world, &a.output, say);
            }
            Ok(())
        },
    )
}

/// `evaluate`'s report on rank 0's console: one model's figures on one line; two models' side
/// by side (`tchrun_data::comparison::table`) with the verdict.
fn report_evaluated(e: &Evaluated, world: usize, output: &std::path::Path, say: &dyn Fn(&str)) {
    match e {
        Evaluated::One { images, metrics: m } => say(&format!(
            "evaluated {images} image(s) on {}: top-1 {:.2}%, top-5 {:.2}%, log loss {:.4}, \
             macro F1 {:.4}; scores.csv, metrics.json and confusion_matrix.csv/.png in {}",
            tchrun::counts::ranks(world),
            100.0 * m.top1,
            100.0 * m.top5,
            m.log_loss,
            m.macro_avg.f1,
            output.display()
        )),
        Evaluated::Two { images, comparison } => {
            say(&format!(
                "evaluated {images} image(s) with 2 models on {}:",
                tchrun::counts::ranks(world)
            ));
            for line in tchrun_data::comparison::table(comparison) {
                say(&line);
            }
            say(&format!(
                "{} image(s) where the predictions differ in disagreements.csv; comparison.json, \
                 and each model's scores.csv, metrics.json and confusion_matrix.csv/.png in a/ \
                 and b/, in {}",
                comparison.disagreements,
                output.display()
            ));
        }
    }
}
