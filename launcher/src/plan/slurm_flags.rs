//! Slurm's own flags as tchrun passes them: `srun`'s options for the ranks' step
//! ([`SrunOptions`]) and the batch script's `#SBATCH` lines ([`SbatchDirectives`]). Each is a
//! clap group whose command line is derived (`tchrun::argv`), so a flag's spelling is its
//! `#[arg]` alone; tchrun never parses them (Slurm does), a test parses them back.
use clap::Args;
use serde::Serialize;

/// `srun`'s options for the job step that starts the ranks.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct SrunOptions {
    #[arg(long)]
    pub nodes: u32,
    #[arg(long)]
    pub ntasks: u32,
    #[arg(long)]
    pub ntasks_per_node: u32,
    /// The PMI the ranks bootstrap through (`pmix`).
    #[arg(long)]
    pub mpi: String,
    /// 1: a rank that exits non-zero ends the step.
    #[arg(long)]
    pub kill_on_bad_exit: u32,
    /// Which of the caller's variables the ranks get (`ALL`).
    #[arg(long)]
    pub export: String,
    /// More ranks than CPUs allowed (`--oversubscribe`).
    #[arg(long)]
    pub overcommit: bool,
}

/// The batch script's `#SBATCH` options, in the order the script lists them.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct SbatchDirectives {
    #[arg(long)]
    pub job_name: String,
    /// A job array's index list (`0-3%2`).
    #[arg(long)]
    pub array: Option<String>,
    #[arg(long)]
    pub nodes: u32,
    #[arg(long)]
    pub ntasks_per_node: u32,
    #[arg(long)]
    pub cpus_per_task: Option<u32>,
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    #[arg(long)]
    pub partition: Option<String>,
    #[arg(long)]
    pub time: Option<String>,
    #[arg(long)]
    pub account: Option<String>,
    #[arg(long)]
    pub qos: Option<String>,
    #[arg(long)]
    pub constraint: Option<String>,
    #[arg(long)]
    pub mem: Option<String>,
    /// The job's stdout file (`70_mpi_log`; a job array's: per task).
    #[arg(long)]
    pub output: String,
    /// The job's stderr file (the same).
    #[arg(long)]
    pub error: String,
    /// `append`: a requeued run keeps the first one's output.
    #[arg(long)]
    pub open_mode: String,
    /// The signal sent before the time limit (`B:USR1@120`).
    #[arg(long)]
    pub signal: String,
    #[arg(long)]
    pub requeue: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Command, FromArgMatches};

    fn parsed<T: Args + FromArgMatches>(argv: Vec<String>) -> T {
        let m = T::augment_args(Command::new("x"))
            .try_get_matches_from(std::iter::once("x".to_string()).chain(argv))
            .expect("parses");
        T::from_arg_matches(&m).expect("from matches")
    }

    #[test]
    fn srun_options_round_trip() {
        let x = SrunOptions {
            nodes: 2,
            ntasks: 8,
            ntasks_per_node: 4,
            mpi: "pmix".into(),
            kill_on_bad_exit: 1,
            export: "ALL".into(),
            overcommit: true,
        };
        let argv = tchrun::argv::argv(&x).expect("argv");
        assert_eq!(
            argv[..3],
            ["--nodes=2", "--ntasks=8", "--ntasks-per-node=4"]
        );
        assert_eq!(parsed::<SrunOptions>(argv), x);
    }

    #[test]
    fn sbatch_directives_round_trip() {
        let mut x = SbatchDirectives {
            job_name: "j".into(),
            array: Some("0-3%2".into()),
            nodes: 2,
            ntasks_per_node: 4,
            cpus_per_task: Some(8),
            gpus_per_node: None,
            partition: Some("gpu".into()),
            time: Some("1:00:00".into()),
            account: None,
            qos: None,
            constraint: Some("a100&ib".into()),
            mem: None,
            output: "/l/70_mpi_log".into(),
            error: "/l/70_mpi_log".into(),
            open_mode: "append".into(),
            signal: "B:USR1@120".into(),
            requeue: true,
        };
        assert_eq!(
            parsed::<SbatchDirectives>(tchrun::argv::argv(&x).expect("argv")),
            x
        );
        x.array = None;
        x.requeue = false;
        assert_eq!(
            parsed::<SbatchDirectives>(tchrun::argv::argv(&x).expect("argv")),
            x
        );
    }
}
