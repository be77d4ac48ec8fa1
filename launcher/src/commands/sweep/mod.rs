//! `tchrun sweep`: one training run per point of a grid (`--param NAME=V1,V2`, `--param-file`),
//! each into `DIR/<name>/`, named in `DIR/sweep.json`; locally (or inside an allocation) the
//! runs in turn as `tchrun train`, under Slurm one job array (`--sbatch`) from `tchrun
//! sbatch`'s script; a re-run continues (finished kept, interrupted resumed, failed retried
//! once); `tchrun sweep results`. Every point is checked by the real `train`/`sbatch` parser
//! (main's, passed in) before anything starts. Knows nothing of how a run trains.
pub mod arch;
mod args;
mod array;
pub mod grid;
mod local;
pub mod record;
pub mod results;
mod row;

use crate::commands::sbatch::SbatchArgs;
use crate::error::JobError;
use crate::plan::preflight::absolute;
use args::SweepArgs;
use clap::Parser;
use grid::{Param, Point};
use record::{RunRecord, RunState, SweepRecord};
use std::path::Path;
use tchrun::argv;
use tchrun::flags::TrainJob;

/// What main's parser made of one run's command line.
pub enum Parsed {
    Train,
    Sbatch(Box<SbatchArgs>),
}

/// Main's parser of `tchrun train ...` / `tchrun sbatch ...` (argv without the program name).
pub type Parse<'a> = &'a dyn Fn(&[String]) -> Result<Parsed, clap::Error>;

/// Sweep's own flags that take a value, and its switches.
const OWN_VALUED: &[&str] = &["--param", "--param-file", "--output", "--max-parallel"];
const OWN_SWITCHES: &[&str] = &["--sbatch", "--submit", "--extend", "--help", "-h"];

/// The command line after `sweep`: (sweep's own flags with `--` and the train flags, the
/// launch flags).
fn split(raw: &[String]) -> (Vec<String>, Vec<String>) {
    let end = raw.iter().position(|a| a == "--").unwrap_or(raw.len());
    let (mut own, mut launch) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < end {
        let a = &raw[i];
        let name = a.split('=').next().unwrap_or(a);
        if OWN_VALUED.contains(&name) {
            own.push(a.clone());
            if !a.contains('=') && i + 1 < end {
                own.push(raw[i + 1].clone());
                i += 1;
            }
        } else if OWN_SWITCHES.contains(&a.as_str()) {
            own.push(a.clone());
        } else {
            launch.push(a.clone());
        }
        i += 1;
    }
    own.extend(raw[end..].iter().cloned());
    (own, launch)
}

/// `tchrun sweep ...` and `tchrun sweep results ...`, from the words after `sweep`.
pub fn run(raw: &[String], parse: Parse) -> Result<i32, JobError> {
    if raw.first().map(String::as_str) == Some("results") {
        let argv =
            std::iter::once("tchrun sweep results".to_string()).chain(raw[1..].iter().cloned());
        return match results::ResultsArgs::try_parse_from(argv) {
            Ok(a) => results::run(&a),
            Err(e) => clap_exit(e),
        };
    }
    let (own, launch) = split(raw);
    let argv = std::iter::once("tchrun sweep".to_string()).chain(own);
    let mut a = match SweepArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return clap_exit(e),
    };
    a.launch = launch;
    sweep(&a, parse)
}

/// clap's help (exit 0) or its error, as the invalid-input error.
fn clap_exit(e: clap::Error) -> Result<i32, JobError> {
    if e.use_stderr() {
        Err(JobError::invalid(first_error_line(&e)))
    } else {
        let _ = e.print();
        Ok(0)
    }
}

/// clap's message without its `error: ` prefix, usage and tips.
fn first_error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    line.trim_start_matches("error: ").trim().to_string()
}

/// The points of the command line, their names unique.
fn points(a: &SweepArgs) -> Result<(Vec<Param>, Vec<Point>), JobError> {
    let mut params: Vec<Param> = Vec::new();
    for p in &a.params {
        let p = grid::parse_param(p).map_err(JobError::invalid)?;
        if params.iter().any(|q| q.name == p.name) {
            return Err(JobError::invalid(format!(
                "--param {}: given twice; list all its values in one --param {}=V1,V2,...",
                p.name, p.name
            )));
        }
        params.push(p);
    }
    let file = match &a.param_file {
        Some(f) => {
            let text = tchrun::files::read_bounded_string(f, tchrun::files::caps::RECORD)
                .map_err(|e| JobError::invalid(format!("--param-file {}: {e}", f.display())))?;
            Some(grid::file_points(&f.display().to_string(), &text).map_err(JobError::invalid)?)
        }
        None => None,
    };
    if params.is_empty() && file.is_none() {
        return Err(JobError::invalid(
            "give the grid: --param NAME=V1,V2 (repeatable) or --param-file FILE",
        ));
    }
    let mut pts = grid::combine(file, grid::grid(&params));
    grid::unique_names(&mut pts, &[]);
    Ok((params, pts))
}

/// The flags every run gets (launch and train flags) hold none the sweep sets itself.
fn check_common(a: &SweepArgs) -> Result<(), JobError> {
    for (words, place) in [(&a.launch, "before --"), (&a.run_flags, "after --")] {
        for (name, _) in grid::flag_pairs(words) {
            if let Some(why) = grid::fixed(&name) {
                return Err(JobError::invalid(format!(
                    "--{name} ({place}): a sweep sets it for each run: {why}"
                )));
            }
        }
    }
    Ok(())
}

/// The runs of the sweep in `dir`: the recorded ones, the new grid's checked against them.
fn runs(
    a: &SweepArgs,
    dir: &Path,
    params: Vec<Param>,
    pts: Vec<Point>,
) -> Result<SweepRecord, JobError> {
    let old = SweepRecord::read(dir).map_err(|e| JobError::invalid(e.to_string()))?;
    let fresh = |pts: Vec<Point>, first: usize| -> Vec<RunRecord> {
        pts.into_iter()
            .enumerate()
            .map(|(i, point)| RunRecord {
                index: first + i,
                output: dir.join(&point.name),
                point,
                retries: 0,
            })
            .collect()
    };
    let Some(mut rec) = old else {
        if dir.is_dir()
            && std::fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(true)
        {
            return Err(JobError::invalid(format!(
                "--output {}: not empty and not a sweep (no {}); choose a new or empty directory",
                dir.display(),
                record::SWEEP_JSON
            )));
        }
        return Ok(SweepRecord {
            format_version: record::FORMAT_VERSION,
            run_flags: a.run_flags.clone(),
            launch_flags: a.launch.clone(),
            params,
            param_file: a.param_file.clone().map(absolute),
            runs: fresh(pts, 0),
            arrays: Vec::new(),
            results: None,
        });
    };
    let path = SweepRecord::path(dir);
    if rec.run_flags != a.run_flags {
        return Err(JobError::invalid(format!(
            "{}: this sweep's runs were started with the train flags `{}`, this command gives `{}`; \
             re-run the sweep with its own flags after --, or start another sweep in a new --output",
            path.display(),
            rec.run_flags.join(" "),
            a.run_flags.join(" ")
        )));
    }
    let known: Vec<&Vec<String>> = rec.runs.iter().map(|r| &r.point.flags).collect();
    let new: Vec<Point> = pts
        .into_iter()
        .filter(|p| !known.contains(&&p.flags))
        .collect();
    if !new.is_empty() && !a.extend {
        return Err(JobError::invalid(format!(
            "{}: the grid changed: {} new point(s) ({}{}); add them to this sweep with --extend \
             (its {} run(s) are kept), re-run the sweep's own command, or use a new --output",
            path.display(),
            new.len(),
            new[0].origin,
            if new.len() > 1 { ", ..." } else { "" },
            rec.runs.len()
        )));
    }
    let taken: Vec<String> = rec.runs.iter().map(|r| r.point.name.clone()).collect();
    let mut new = new;
    for p in &mut new {
        p.name = grid::name_of(&p.flags);
    }
    grid::unique_names(&mut new, &taken);
    let first = rec.runs.len();
    rec.runs.extend(fresh(new, first));
    for p in params {
        match rec.params.iter_mut().find(|q| q.name == p.name) {
            Some(q) => {
                for v in p.values {
                    if !q.values.contains(&v) {
                        q.values.push(v);
                    }
                }
            }
            None => rec.params.push(p),
        }
    }
    rec.launch_flags = a.launch.clone();
    Ok(rec)
}

/// `train|sbatch`, the launch flags and the train flags every run gets.
fn base_argv(a: &SweepArgs) -> Vec<String> {
    let mut v = vec![if a.sbatch { "sbatch" } else { "train" }.to_string()];
    if a.sbatch {
        v.push("--job-name=tchrun-sweep".into());
    }
    v.extend(a.launch.iter().cloned());
    v.extend(a.run_flags.iter().cloned());
    v
}

/// One run's command line for main's parser: the common flags, the point's flags (or only
/// `only`), its `--output`, and `--resume` when it has a checkpoint.
fn run_argv(a: &SweepArgs, run: &RunRecord, only: Option<&str>) -> Result<Vec<String>, JobError> {
    let mut v = base_argv(a);
    let dir = run.output.parent().unwrap_or(Path::new("."));
    match only {
        Some(f) => v.extend(arch::translate(&[f.to_string()], dir)?),
        None => v.extend(arch::translate(&run.point.flags, dir)?),
    }
    v.extend(argv::flag::<TrainJob, _>("output", &run.output)?);
    if only.is_none() && record::has_checkpoint(&run.output) {
        v.extend(argv::flag::<TrainJob, _>("resume", &true)?);
    }
    Ok(v)
}

/// Every run's command line through main's parser; the first refused names its parameter.
fn validate(a: &SweepArgs, rec: &SweepRecord, parse: Parse) -> Result<Vec<Parsed>, JobError> {
    if let Some(first) = rec.runs.first() {
        let mut common = base_argv(a);
        common.extend(argv::flag::<TrainJob, _>("output", &first.output)?);
        if let Err(e) = parse(&common) {
            return Err(JobError::invalid(format!(
                "the flags every run gets (before and after --): {}",
                first_error_line(&e)
            )));
        }
    }
    let mut parsed = Vec::with_capacity(rec.runs.len());
    for run in &rec.runs {
        match parse(&run_argv(a, run, None)?) {
            Ok(p) => parsed.push(p),
            Err(e) => return Err(JobError::invalid(blame(a, run, &e, parse))),
        }
    }
    Ok(parsed)
}

/// The message of a point the parser refused, naming the `--param` (or file line) at fault.
fn blame(a: &SweepArgs, run: &RunRecord, e: &clap::Error, parse: Parse) -> String {
    let why = first_error_line(e);
    for f in &run.point.flags {
        let refused = run_argv(a, run, Some(f)).map_or(true, |v| parse(&v).is_err());
        if f.starts_with("--") && refused {
            let name = f.trim_start_matches('-').split('=').next().unwrap_or(f);
            if run.point.origin.starts_with("--param ") {
                return format!(
                    "--param {name}: {f} (run {}) is refused: {why}",
                    run.point.name
                );
            }
            return format!("{}: {f} is refused: {why}", run.point.origin);
        }
    }
    format!("{} (run {}): {why}", run.point.origin, run.point.name)
}

/// What a re-run does with each run: (runs to start, what to say of the others).
fn plan(rec: &mut SweepRecord) -> (Vec<usize>, Vec<String>) {
    let (mut todo, mut notes) = (Vec::new(), Vec::new());
    for (i, run) in rec.runs.iter_mut().enumerate() {
        match record::run_state(&run.output) {
            RunState::Finished => notes.push(format!("{}: finished, kept", run.point.name)),
            RunState::Running => notes.push(format!(
                "{}: running now (its status.json is fresh), left to it",
                run.point.name
            )),
            RunState::Failed { cause } if run.retries >= 1 => notes.push(format!(
                "{}: failed again after its retry, not retried: {cause}",
                run.point.name
            )),
            RunState::Failed { cause } => {
                notes.push(format!(
                    "{}: failed ({cause}); retrying it once",
                    run.point.name
                ));
                run.retries += 1;
                todo.push(i);
            }
            RunState::Interrupted { epoch, step } => {
                notes.push(format!(
                    "{}: interrupted at epoch {epoch}, step {step}; resuming it",
                    run.point.name
                ));
                todo.push(i);
            }
            RunState::NoCheckpoint | RunState::NotStarted => todo.push(i),
        }
    }
    (todo, notes)
}

/// `tchrun sweep` (not `results`).
fn sweep(a: &SweepArgs, parse: Parse) -> Result<i32, JobError> {
    let dir = absolute(a.output.clone());
    check_common(a)?;
    let (params, pts) = points(a)?;
    let mut rec = runs(a, &dir, params, pts)?;
    let common: Vec<String> = a.launch.iter().chain(&a.run_flags).cloned().collect();
    let points: Vec<Point> = rec.runs.iter().map(|r| r.point.clone()).collect();
    let archs = arch::check(&points, &common)?;
    let parsed = validate(a, &rec, parse)?;
    let (todo, notes) = plan(&mut rec);
    for n in &notes {
        outln!("tchrun sweep: {n}");
    }
    std::fs::create_dir_all(&dir).map_err(|e| {
        JobError::invalid(format!("--output {}: cannot create it: {e}", dir.display()))
    })?;
    arch::write_models(&dir, &archs, &common)?;
    if a.sbatch {
        let jobs: Vec<(usize, Box<SbatchArgs>)> = parsed
            .into_iter()
            .enumerate()
            .filter(|(i, _)| todo.contains(i))
            .filter_map(|(i, p)| match p {
                Parsed::Sbatch(s) => Some((i, s)),
                Parsed::Train => None,
            })
            .collect();
        return array::run(a, &dir, &mut rec, &jobs);
    }
    rec.write(&dir)
        .map_err(|e| JobError::invalid(e.to_string()))?;
    run_in_turn(a, &dir, &mut rec, &todo)
}

/// The local form: the runs to do, one after the other, then the results.
fn run_in_turn(
    a: &SweepArgs,
    dir: &Path,
    rec: &mut SweepRecord,
    todo: &[usize],
) -> Result<i32, JobError> {
    for (k, &i) in todo.iter().enumerate() {
        let run = &rec.runs[i];
        outln!(
            "tchrun sweep: run {}/{}: {} ({}) into {}",
            k + 1,
            todo.len(),
            run.point.name,
            run.point.flags.join(" "),
            run.output.display()
        );
        match local::run_one(&run_argv(a, run, None)?)? {
            local::Ended::Code(0) => {}
            local::Ended::Code(c) => outln!(
                "tchrun sweep: {} failed (exit {c}); going on with the next run",
                run.point.name
            ),
            local::Ended::Stopped { code } => {
                outln!(
                    "tchrun sweep: stopped during {}; re-run the same command to resume it",
                    run.point.name
                );
                let _ = results::collect(dir, rec, None);
                return Ok(code);
            }
        }
    }
    let rows = results::collect(dir, rec, None)?;
    outln!("{}", results::table(&rows).trim_end());
    let failed: Vec<&results::Row> = rows.iter().filter(|r| r.state != "finished").collect();
    if failed.is_empty() {
        outln!(
            "tchrun sweep: {} run(s) finished; results in {}",
            rows.len(),
            dir.join("results.csv").display()
        );
        return Ok(0);
    }
    Err(JobError::RankFailed {
        kind: tchrun::exit::ErrorKind::RankFailed,
        report: format!(
            "tchrun: error: {} of {} run(s) did not finish: {}; re-run the same command to retry each failed run once and resume the interrupted ones\n",
            failed.len(),
            rows.len(),
            failed.iter().map(|r| format!("{} ({})", r.point, r.state)).collect::<Vec<_>>().join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_splits_into_own_launch_and_train_flags() {
        let raw: Vec<String> = [
            "--param",
            "lr=0.1,0.2",
            "--procs-per-node",
            "2",
            "--output=/s",
            "--sbatch",
            "--partition",
            "gpu",
            "--",
            "--epochs",
            "1",
        ]
        .map(String::from)
        .to_vec();
        let (own, launch) = split(&raw);
        assert_eq!(
            own,
            [
                "--param",
                "lr=0.1,0.2",
                "--output=/s",
                "--sbatch",
                "--",
                "--epochs",
                "1"
            ]
        );
        assert_eq!(launch, ["--procs-per-node", "2", "--partition", "gpu"]);
    }
}
