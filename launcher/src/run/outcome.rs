//! The outcome of a supervised attempt: success (the run report), interrupted, hung, a launch
//! that failed (no rank started: mpirun's own words say why), or a rank that failed (the first
//! one, from the driver logs and mpirun's output). What the attempt came to is a value
//! (`AttemptOutcome`): the result, the failure summary and the ranks' logs; the summary is
//! written to `failure.json` from it (`finish`), and `main` prints the failure.
use crate::error::JobError;
use crate::plan::launch::{LaunchArgs, LauncherKind, Plan};
use crate::report::{self, FailureSummary, RankLog};
use crate::run::hang::Hang;
use crate::run::supervise::{Ended, Ending, Outcome};
use std::path::Path;
use std::time::Duration;
use tchrun::exit::ErrorKind;
use tchrun::job_record::Heartbeat;
use tchrun_launcher::recognise::Recognise;

/// What one attempt came to.
#[derive(Debug)]
pub struct AttemptOutcome {
    /// tchrun's exit code (0, or 130/143 after a stop), or why the attempt failed.
    pub result: Result<i32, JobError>,
    /// `failure.json`'s content when the attempt failed with one (a rank failed, the job hung,
    /// the ranks could not start); not written yet.
    pub summary: Option<FailureSummary>,
    /// The ranks' driver logs as the attempt left them.
    pub logs: Vec<RankLog>,
}

impl AttemptOutcome {
    /// An attempt that ended with `code` and left nothing to report.
    pub fn ended(code: i32) -> AttemptOutcome {
        AttemptOutcome {
            result: Ok(code),
            summary: None,
            logs: Vec::new(),
        }
    }

    fn failed(error: JobError, summary: Option<FailureSummary>, logs: Vec<RankLog>) -> Self {
        AttemptOutcome {
            result: Err(error),
            summary,
            logs,
        }
    }

    /// Whether a restart could recover it: a rank failed or the job hung (not a refused input,
    /// a launch that failed, a stop).
    pub fn restartable(&self) -> bool {
        matches!(
            self.result,
            Err(JobError::RankFailed { .. } | JobError::Hung(_))
        )
    }

    /// The end of the job: the failure summary written to `<log_dir>/failure.json` (best
    /// effort: it is also printed), then the exit code or the failure.
    pub fn finish(self, log_dir: &Path) -> Result<i32, JobError> {
        if let Some(s) = &self.summary {
            report::write_summary(log_dir, s);
        }
        report::reserve::release(log_dir);
        self.result
    }
}

/// What an attempt that ran comes to: its exit code, or the failure with its summary.
pub fn conclude(
    args: &LaunchArgs,
    plan: &Plan,
    outcome: &Outcome,
    logs: Vec<RankLog>,
    mpi_log_path: &Path,
    hang: Option<(Hang, Vec<Heartbeat>)>,
    kernel_mark: Option<u64>,
) -> AttemptOutcome {
    let first = match &outcome.ending {
        Ending::Succeeded => {
            report::run_report(&logs);
            return AttemptOutcome::ended(0);
        }
        Ending::Failed(first) => first.clone(),
        Ending::Interrupted(sig) => {
            let kind = if *sig == signal_hook::consts::SIGINT {
                ErrorKind::InterruptedInt
            } else {
                ErrorKind::InterruptedTerm
            };
            if let Some(c) = tchrun::job_record::Cause::slurm(&outcome.tail, Some(*sig)) {
                errln!(
                    "tchrun: {}: {}\n  fix: {}",
                    c.class(),
                    c.detail(),
                    c.advice()
                );
            }
            // mpirun's or srun's own messages are in 70_mpi_log; the local launcher has none.
            let launcher_log = match plan.kind {
                LauncherKind::Local => String::new(),
                LauncherKind::Mpirun | LauncherKind::Auto => {
                    format!("; mpirun's messages in {}", mpi_log_path.display())
                }
                LauncherKind::Srun => format!("; srun's messages in {}", mpi_log_path.display()),
            };
            errln!(
                "tchrun: interrupted ({}); all ranks stopped (logs in {}{launcher_log})",
                if *sig == signal_hook::consts::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                },
                plan.log_dir.display(),
            );
            return AttemptOutcome::ended(kind.exit_code());
        }
        Ending::Hung => {
            if let Some((Hang::Found(v), beats)) = &hang {
                if v.kind == tchrun::job_record::hang::HangKind::Lingered {
                    // Every rank finished its work: the job succeeded; the ranks that did not
                    // leave were ended, and the user is told which and where they were.
                    errln!(
                        "tchrun: warning: {}.\nStacks (main threads; every thread in \
                         stacks-<rank>.json):\n{}",
                        v.line(beats),
                        v.stacks_text(STACK_FRAMES).trim_end()
                    );
                    report::run_report(&logs);
                    return AttemptOutcome::ended(0);
                }
            }
            if let Some((Hang::NeverStarted { allowed }, _)) = &hang {
                let message = never_started(plan, *allowed, args.hang_timeout, &outcome.tail);
                let code = ErrorKind::LaunchFailed.exit_code();
                let summary = FailureSummary::launch_failure(message.clone(), code, &outcome.tail);
                let error = JobError::launch(format!(
                    "{message}\n  launcher output: {}",
                    mpi_log_path.display()
                ));
                return AttemptOutcome::failed(error, Some(summary), logs);
            }
            let (error, summary) = hung(args, &logs, hang);
            return AttemptOutcome::failed(error, Some(summary), logs);
        }
    };
    let (hint_rank, hint_code) = match plan.kind {
        LauncherKind::Local => (Some(first.index), Some(first.ended.as_code())),
        _ => mpirun_first_failure(&outcome.tail),
    };
    let code = hint_code.unwrap_or(first.ended.as_code());
    // A rank that refused its input exits 2 before it opens a driver log: its message is
    // already on the terminal; that is invalid input, not a failed launch.
    if logs.is_empty() && code == ErrorKind::InvalidInput.exit_code() {
        let error = JobError::invalid(format!(
            "the ranks refused the input (see their message above and {})",
            mpi_log_path.display()
        ));
        return AttemptOutcome::failed(error, None, logs);
    }
    if logs.is_empty() {
        let message = launch_failure_message(plan, &outcome.tail);
        let summary =
            FailureSummary::launch_failure(message.clone(), first.ended.as_code(), &outcome.tail);
        let error = JobError::launch(format!(
            "{message}\n  launcher output: {}",
            mpi_log_path.display()
        ));
        return AttemptOutcome::failed(error, Some(summary), logs);
    }
    // Which rank: local ranks are one process each; mpirun names the first one.
    let culprit = report::first_failing(&logs, hint_rank);
    // A rank that recorded exit 3 itself found the network unusable at bootstrap (no such
    // interface, rank 0 unreachable): the launch failed. A program's own 3 is a failed rank.
    let recorded = culprit
        .and_then(|c| c.failure.as_ref())
        .and_then(|f| f.exit_code);
    let kind = match ErrorKind::from_worker_exit(code) {
        _ if code == ErrorKind::LaunchFailed.exit_code() && recorded == Some(code) => {
            ErrorKind::LaunchFailed
        }
        k => k.unwrap_or(ErrorKind::RankFailed),
    };
    let signal = match first.ended {
        Ended::Signal(s) => Some(s),
        Ended::Code(_) => None,
    };
    let mut summary = report::rank_failure(culprit, code, signal, first.at, kind.exit_code());
    // Nothing in the logs (a rank that could not write its own): what the ranks said on the
    // console, rather than "exited with code 4". Not for a rank a signal ended (mpirun reports
    // it as 128 + the signal): it said nothing, and an error line there is another rank's (the
    // peer that lost it), which would hide "killed by signal 9".
    let ended_by_signal = signal.is_some() || code > 128;
    if !ended_by_signal && culprit.and_then(report::classify).is_none() {
        if let Some(m) = report::console_error(&outcome.tail) {
            summary.classification = tchrun::job_record::Classification::parse(report::guess(&m));
            summary.message = m;
        }
    }
    let evidence = report::cause::Evidence {
        log_dir: &plan.log_dir,
        kernel_mark,
        launcher_tail: &outcome.tail,
    };
    summary.cause = report::cause::diagnose(culprit, code, signal, &logs, &evidence);
    let error = JobError::RankFailed {
        kind,
        report: report::render(&summary, &plan.log_dir),
    };
    AttemptOutcome::failed(error, Some(summary), logs)
}

/// The frames of a culprit's stack shown on the terminal.
const STACK_FRAMES: usize = 30;

/// The hang watch stopped the job: its verdict (or, for ranks that do not beat, the silence)
/// and the last line of each rank, for `failure.json`.
fn hung(
    args: &LaunchArgs,
    logs: &[RankLog],
    hang: Option<(Hang, Vec<Heartbeat>)>,
) -> (JobError, FailureSummary) {
    let (mut msg, verdict) = match hang {
        Some((Hang::Found(v), beats)) => (
            format!(
                "{}; the job was stopped.\nStacks (main threads; every thread in \
                 stacks-<rank>.json):\n{}Last line of each rank:",
                v.line(&beats),
                v.stacks_text(STACK_FRAMES)
            ),
            Some(v),
        ),
        _ => (
            format!(
                "no rank made progress for {} s (--hang-timeout); the job was stopped. Last line of each rank:",
                args.hang_timeout.unwrap_or(0)
            ),
            None,
        ),
    };
    for l in logs {
        msg.push_str(&format!(
            "\n  rank {} ({}): {}",
            l.rank,
            l.host,
            l.tail.last().map(String::as_str).unwrap_or("")
        ));
    }
    let summary = FailureSummary::hang(msg.clone(), verdict);
    (JobError::Hung(msg), summary)
}

/// The launch started no rank within `allowed`: which launcher, the flag that bounds it, and
/// what its output shows. Open MPI's out-of-band layer prints `[HOST:PID]
/// tcp_peer_recv_connect_ack: invalid header type: N` for bytes that are not its own on the
/// port its daemons wire up on (measured: a stranger's random bytes there wedge the launch of
/// a multi-node job for good); it names the host that received them, never the sender.
fn never_started(plan: &Plan, allowed: Duration, flag: Option<u64>, tail: &[String]) -> String {
    let launcher = match plan.kind {
        LauncherKind::Srun => "srun",
        LauncherKind::Local => "the local launcher",
        LauncherKind::Mpirun | LauncherKind::Auto => "mpirun",
    };
    let bound = match flag {
        Some(_) => "--hang-timeout".to_string(),
        None => "the default while --hang-timeout is unset".to_string(),
    };
    let mut hosts: Vec<&str> = tail
        .iter()
        .filter(|l| l.contains("tcp_peer_recv_connect_ack: invalid header type"))
        .filter_map(|l| {
            let inner = l.trim().strip_prefix('[')?.split(']').next()?;
            Some(inner.rsplit_once(':').map_or(inner, |(h, _)| h))
        })
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    let cause = if hosts.is_empty() {
        "; its own words, if any, are in 70_mpi_log".to_string()
    } else {
        format!(
            ": Open MPI's out-of-band listener on {} received bytes that are not Open MPI's \
             (something else on the network connected to the port its daemons wire up on, a port \
             scanner or a stranger; Open MPI does not name the sender) and its launch never \
             recovered. Open MPI's daemons listen on every interface: keep other machines off \
             the nodes' network (SECURITY.md)",
            hosts.join(", ")
        )
    };
    format!(
        "no rank started within {} s ({bound}): {launcher} never started them{cause}",
        allowed.as_secs()
    )
}

/// mpirun's "Process name: [[job,1],R] ... Exit code: C" of the first failing rank.
fn mpirun_first_failure(tail: &[String]) -> (Option<usize>, Option<i32>) {
    let mut rank = None;
    let mut code = None;
    for l in tail {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("Process name:") {
            rank = rest
                .trim()
                .trim_end_matches(']')
                .rsplit(',')
                .next()
                .and_then(|r| r.trim().parse().ok());
        } else if let Some(rest) = t.strip_prefix("Exit code:") {
            code = rest.trim().parse().ok();
        } else if let Some(rest) = t.strip_prefix("mpirun noticed that process rank ") {
            // "... rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
            if rank.is_none() {
                rank = rest.split_whitespace().next().and_then(|r| r.parse().ok());
                code = rest
                    .split("on signal ")
                    .nth(1)
                    .and_then(|x| x.split_whitespace().next())
                    .and_then(|n| n.parse::<i32>().ok())
                    .map(|sig| 128 + sig);
            }
        }
    }
    (rank, code)
}

fn launch_failure_message(plan: &Plan, tail: &[String]) -> String {
    let text = tail.join("\n");
    if text.contains("not enough slots") {
        format!(
            "mpirun refused {} rank(s): not enough slots. Lower --procs-per-node ({}) or --nodes ({}), \
             raise slots= in the --hostfile, or pass --oversubscribe",
            plan.world_size(),
            plan.procs_per_node,
            plan.nodes
        )
    } else if text.contains("unable to reliably start")
        || text.contains("ORTE does not know how to route")
    {
        "mpirun could not start its daemons on the hosts (ssh failed or a host is unreachable); check --hostfile/--hosts and passwordless ssh".into()
    } else if text.contains("can not load PMIx library")
        || text.contains("Couldn't load specified plugin name for mpi/pmix")
    {
        // Debian's and Ubuntu's Slurm (mpi/pmix_v4) dlopens the unversioned libpmix.so, which
        // only their libpmix-dev ships (cluster-facts: every `srun --mpi=pmix` fails without).
        "srun could not load Slurm's PMIx plugin (mpi/pmix: \"can not load PMIx library\"), which \
         tchrun's ranks start through: the nodes need the PMIx library their Slurm was built with \
         (on Debian and Ubuntu the package libpmix-dev, which holds the libpmix.so Slurm loads); \
         ask the cluster's administrators, or start the ranks with `srun --mpi=none` yourself"
            .into()
    } else if text.contains("was unable to find the specified executable")
        || text.contains("No such file")
    {
        format!("the worker {} was not found on every node; install it at the same path or pass --worker", plan.worker.display())
    } else {
        "the ranks could not be started".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    /// An mpirun plan of 2 nodes × `procs_per_node`.
    fn mpirun_plan(procs_per_node: u32) -> Plan {
        Plan {
            kind: LauncherKind::Mpirun,
            node_names: Vec::new(),
            nodes: 2,
            procs_per_node,
            hosts: Vec::new(),
            hostfile: None,
            oversubscribe: false,
            worker: PathBuf::from("/opt/tchrun-worker"),
            log_dir: PathBuf::from("/tmp/logs"),
            mpirun_args: Vec::new(),
            as_root: false,
            console: Default::default(),
        }
    }

    /// mpirun's own words (OpenMPI 4.1, as printed here) name the first failing rank.
    #[test]
    fn mpirun_output_names_the_first_failing_rank() {
        let exited = lines(
            "--------------------------------------------------------------------------\n\
             mpirun detected that one or more processes exited with non-zero status, thus causing\n\
             the job to be terminated. The first process to do so was:\n\
             \n\
             \x20 Process name: [[27021,1],1]\n\
             \x20 Exit code:    3\n\
             --------------------------------------------------------------------------",
        );
        assert_eq!(mpirun_first_failure(&exited), (Some(1), Some(3)));
        let killed = lines(
            "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).",
        );
        assert_eq!(mpirun_first_failure(&killed), (Some(2), Some(128 + 9)));
        assert_eq!(
            mpirun_first_failure(&lines("hello\nExit code: not a number")),
            (None, None)
        );
        assert_eq!(mpirun_first_failure(&[]), (None, None));
    }

    #[test]
    fn launch_failures_say_what_to_change() {
        let plan = mpirun_plan(3);
        let slots = launch_failure_message(
            &plan,
            &lines("There are not enough slots available in the system to satisfy the 6"),
        );
        assert!(
            slots.contains("6 rank(s)")
                && slots.contains("--procs-per-node (3)")
                && slots.contains("--oversubscribe"),
            "{slots}"
        );
        let daemons = launch_failure_message(
            &plan,
            &lines("ORTE was unable to reliably start one or more daemons."),
        );
        assert!(daemons.contains("passwordless ssh"), "{daemons}");
        let pmix = launch_failure_message(
            &plan,
            &lines(
                "srun: error:  mpi/pmix_v4: init: (null) [0]: mpi_pmix.c:195: pmi/pmix: can not \
                 load PMIx library",
            ),
        );
        assert!(
            pmix.contains("libpmix-dev") && pmix.contains("srun --mpi=none"),
            "{pmix}"
        );
        let missing = launch_failure_message(
            &plan,
            &lines("mpirun was unable to find the specified executable file"),
        );
        assert!(
            missing.contains("/opt/tchrun-worker") && missing.contains("--worker"),
            "{missing}"
        );
        assert_eq!(
            launch_failure_message(&plan, &lines("something else")),
            "the ranks could not be started"
        );
    }

    /// A launch that started no rank: the bound named, and Open MPI's words for a stranger's
    /// bytes on its out-of-band port turned into the hosts that received them.
    #[test]
    fn a_launch_that_never_started_names_the_bound_and_the_garbled_hosts() {
        let plan = mpirun_plan(1);
        let tail = lines(
            "[vm:28640] plm:rsh: Warning: setpgid(28647,28647) failed\n\
             [vm:28640] tcp_peer_recv_connect_ack: invalid header type: 245\n\
             [tchrun-node1:28655] tcp_peer_recv_connect_ack: invalid header type: 222\n\
             [tchrun-node1:28655] tcp_peer_recv_connect_ack: invalid header type: 18",
        );
        let m = never_started(&plan, Duration::from_secs(30), Some(30), &tail);
        assert!(
            m.starts_with(
                "no rank started within 30 s (--hang-timeout): mpirun never started them"
            ) && m.contains("listener on tchrun-node1, vm received bytes")
                && m.contains("SECURITY.md"),
            "{m}"
        );
        let quiet = never_started(&plan, Duration::from_secs(300), None, &[]);
        assert_eq!(
            quiet,
            "no rank started within 300 s (the default while --hang-timeout is unset): mpirun \
             never started them; its own words, if any, are in 70_mpi_log"
        );
    }
}
