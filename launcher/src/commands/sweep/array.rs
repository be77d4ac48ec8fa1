//! The Slurm form of a sweep: the runs to do as one job array, `DIR/sweep.sbatch`, each task
//! `tchrun sbatch`'s script for its run (`SbatchArgs` → `batch_job`: the same pre-flight,
//! preemption, requeue with `--resume` and `--max-restarts`), and with `--submit` its
//! submission, recorded in `sweep.json`.
use super::args::SweepArgs;
use super::record::{ArrayJob, SweepRecord};
use crate::commands::sbatch::script::{array_script, BatchJob};
use crate::commands::sbatch::{batch_job, submit, write_script, SbatchArgs};
use crate::error::JobError;
use std::path::Path;

/// `#SBATCH --array=`'s value: the indices as ranges (`0-3`, `1,3,5-7`), then `%N`.
pub fn array_spec(indices: &[usize], max_parallel: Option<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let mut j = i;
        while j + 1 < indices.len() && indices[j + 1] == indices[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", indices[i], indices[j])
        } else {
            indices[i].to_string()
        });
        i = j + 1;
    }
    let mut s = parts.join(",");
    if let Some(n) = max_parallel {
        s.push_str(&format!("%{n}"));
    }
    s
}

/// What must be the same in every task of one array (its `#SBATCH` header).
fn header_of(b: &BatchJob) -> String {
    format!(
        "--job-name={} --nodes={} --ntasks-per-node={} --gpus-per-node={} {:?}",
        b.job_name, b.nodes, b.procs_per_node, b.gpus_per_node, b.directives
    )
}

/// The sweep's arrays still queued or running (`squeue`), if Slurm answers.
fn active_arrays(rec: &SweepRecord) -> Vec<u64> {
    if rec.arrays.is_empty() {
        return Vec::new();
    }
    let Ok(out) = std::process::Command::new("squeue")
        .args(["-h", "-o", "%F"])
        .stdin(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    rec.arrays
        .iter()
        .map(|a| a.job_id)
        .filter(|id| listed.lines().any(|l| l.trim() == id.to_string()))
        .collect()
}

/// Writes (and with `--submit` submits) the array of `jobs` (run index, its sbatch flags).
pub fn run(
    a: &SweepArgs,
    dir: &Path,
    rec: &mut SweepRecord,
    jobs: &[(usize, Box<SbatchArgs>)],
) -> Result<i32, JobError> {
    let write_rec =
        |rec: &SweepRecord| rec.write(dir).map_err(|e| JobError::invalid(e.to_string()));
    if a.submit {
        let active = active_arrays(rec);
        if !active.is_empty() {
            return Err(JobError::invalid(format!(
                "the sweep's job array {} is still queued or running (squeue); wait for it to end \
                 (or scancel it), then re-run this command to continue the sweep",
                active
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    if jobs.is_empty() {
        write_rec(rec)?;
        outln!(
            "tchrun sweep: every run is finished or reported; `tchrun sweep results {}` shows them",
            dir.display()
        );
        return Ok(0);
    }
    let mut tasks: Vec<(usize, BatchJob)> = Vec::with_capacity(jobs.len());
    for (i, s) in jobs {
        let b = batch_job(s)?;
        if let Some((j, first)) = tasks.first() {
            if header_of(first) != header_of(&b) {
                return Err(JobError::invalid(format!(
                    "--sbatch: run {} asks Slurm for other resources than run {} ({} vs {}); the \
                     tasks of one job array share its #SBATCH lines: vary those flags in separate \
                     sweeps",
                    rec.runs[*i].point.name,
                    rec.runs[*j].point.name,
                    header_of(&b),
                    header_of(first)
                )));
            }
        }
        tasks.push((*i, b));
    }
    let indices: Vec<usize> = tasks.iter().map(|(i, _)| *i).collect();
    let spec = array_spec(&indices, a.max_parallel);
    let task_logs = dir.join("slurm");
    std::fs::create_dir_all(&task_logs).map_err(|e| {
        JobError::invalid(format!(
            "--output: cannot create {}: {e}",
            task_logs.display()
        ))
    })?;
    let text = array_script(
        &tasks,
        &spec,
        &task_logs.join("%A_%a.out").display().to_string(),
    );
    let path = dir.join("sweep.sbatch");
    write_script(&path, &text)?;
    write_rec(rec)?;
    outln!(
        "tchrun sweep: wrote job array {} ({} run(s), --array={spec})",
        path.display(),
        tasks.len()
    );
    if !a.submit {
        outln!("tchrun sweep: submit it with: sbatch {}", path.display());
        return Ok(0);
    }
    let id = submit(&path, &tasks[0].1)?;
    rec.arrays.push(ArrayJob {
        job_id: id,
        tasks: spec,
        submitted: tchrun::files::timestamp_now(),
    });
    write_rec(rec)?;
    outln!("Submitted batch job {id}");
    outln!(
        "tchrun sweep: each run's logs in {}/<run>/logs; follow with `squeue -j {id}`, stop with `scancel {id}`; then `tchrun sweep results {}`",
        dir.display(),
        dir.display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_specs_are_ranges_with_the_limit() {
        assert_eq!(array_spec(&[0, 1, 2, 3], Some(2)), "0-3%2");
        assert_eq!(array_spec(&[1, 3, 4, 5, 7], None), "1,3-5,7");
        assert_eq!(array_spec(&[2], Some(1)), "2%1");
    }
}
