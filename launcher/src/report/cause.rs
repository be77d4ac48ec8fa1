//! Why the first failing rank failed, as a typed `Cause` for `failure.json` and the summary:
//! Slurm's words in the launcher's output, the rank's own failure record (libtorch's words),
//! or, for a rank killed by a signal without a word, the evidence on this host: the kernel log
//! since the attempt started, the OOM kills of the rank's memory cgroup, its last known memory
//! (`memory-<rank>.json`). The decisions are `tchrun::job_record::Cause`'s; this gathers.
use super::RankLog;
use std::path::Path;
use tchrun::driver_log::FailureKind;
use tchrun::job_record::memory::RankMemory;
use tchrun::job_record::Cause;
use tchrun_launcher::recognise::Recognise;

/// What the launcher knows of an attempt beside the driver logs.
pub struct Evidence<'a> {
    pub log_dir: &'a Path,
    /// The kernel log's newest record when the attempt started (`tchrun_launcher::kernel_log::mark`).
    pub kernel_mark: Option<u64>,
    /// The launcher's output (mpirun's or srun's), last lines.
    pub launcher_tail: &'a [String],
}

/// This host's name.
fn this_host() -> Option<String> {
    hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
}

/// Whether `host` (a driver log's) is this one (a short name matches a full one).
fn is_here(host: &str) -> bool {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
    this_host().is_some_and(|h| short(&h) == short(host))
}

/// The cause of the failure of `culprit` (the first failing rank), which ended with `code`
/// (or `signal`); `logs` are every rank's.
pub fn diagnose(
    culprit: Option<&RankLog>,
    code: i32,
    signal: Option<i32>,
    logs: &[RankLog],
    ev: &Evidence,
) -> Option<Cause> {
    let signal = signal.or((code > 128 && code < 128 + 65).then(|| code - 128));
    if let Some(c) = Cause::slurm(ev.launcher_tail, signal) {
        return Some(c);
    }
    let culprit = culprit?;
    if let Some(r) = &culprit.failure {
        let cause = Cause::from_record(r.kind, &r.message, culprit.device.as_deref());
        if !cause.as_ref().is_some_and(Cause::is_hardware) {
            if let Some(hw) = kernel_hardware(culprit, ev) {
                return Some(hw);
            }
        }
        return match cause {
            Some(Cause::Peer { address, .. }) => Some(Cause::Peer {
                peer: silent_peer(culprit, logs),
                address,
            }),
            other => other,
        };
    }
    if let Some(sig) = signal {
        return Some(killed(culprit, sig, ev));
    }
    let (_, msg) = culprit.first_error.as_ref()?;
    Cause::from_record(FailureKind::Internal, msg, culprit.device.as_deref())
}

/// A hardware error in this host's kernel log since the attempt started (an Xid of a hardware
/// kind, an uncorrectable ECC error, a machine check), when `culprit` ran here: it outranks the
/// rank's own words (a CUDA error is often how a failing GPU shows).
fn kernel_hardware(culprit: &RankLog, ev: &Evidence) -> Option<Cause> {
    if !is_here(&culprit.host) {
        return None;
    }
    let events = tchrun_launcher::kernel_log::events_after(ev.kernel_mark).ok()?;
    events.into_iter().find_map(|e| match e {
        tchrun_launcher::kernel_log::KernelEvent::Hardware { device, line } => {
            Some(Cause::Hardware {
                device,
                evidence: format!("kernel log: {line}"),
            })
        }
        _ => None,
    })
}

/// A rank other than `culprit` that ended without a word (no failure record, no exit line):
/// the peer that was lost, when there is exactly one.
fn silent_peer(culprit: &RankLog, logs: &[RankLog]) -> Option<String> {
    let silent: Vec<&RankLog> = logs
        .iter()
        .filter(|l| l.rank != culprit.rank && l.failure.is_none() && l.exit_code.is_none())
        .collect();
    match silent.as_slice() {
        [one] => Some(format!("rank {} ({})", one.rank, one.host)),
        _ => None,
    }
}

/// A rank killed by `signal` without a record: the OOM killer's (kernel log, cgroup, memory)
/// or someone else's.
fn killed(culprit: &RankLog, signal: i32, ev: &Evidence) -> Cause {
    let memory = RankMemory::read(ev.log_dir, culprit.rank);
    let host = memory
        .as_ref()
        .map(|m| m.host.as_str())
        .unwrap_or(culprit.host.as_str());
    let (kernel, oom_kills_now) = if is_here(host) {
        let kernel = tchrun_launcher::kernel_log::events_after(ev.kernel_mark);
        let kills = memory
            .as_ref()
            .and_then(|m| m.cgroup.as_ref())
            .and_then(|c| c.oom_kills());
        (kernel, kills)
    } else {
        (
            Err(format!(
                "the rank ran on {host}; tchrun reads this host's kernel log only"
            )),
            None,
        )
    };
    let pid = culprit.pid.or(memory.as_ref().map(|m| m.pid));
    match Cause::killed(signal, pid, &kernel, oom_kills_now, memory.as_ref()) {
        // A rank that exited at once on a signal said who sent it in its last lines.
        Cause::Signal {
            signal,
            sender: None,
        } => Cause::Signal {
            signal,
            sender: logged_sender(&culprit.tail),
        },
        other => other,
    }
}

/// The sender of the signal a rank logged on its way out ("received SIGTERM from pid 4242
/// (bash, uid 0): stopping this rank now"), unless it was the rank's own launcher.
fn logged_sender(tail: &[String]) -> Option<String> {
    tail.iter().rev().find_map(|l| {
        let rest = l.split("received SIG").nth(1)?;
        let from = rest.split_once(" from ")?.1;
        let sender = &from[..=from.find(')')?];
        (!sender.contains("its launcher")).then(|| sender.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_a_rank_logged_is_found_unless_it_was_its_launcher() {
        let lines = |l: &str| vec!["epoch 1/3 iter 1/25 loss 2.6".to_string(), l.to_string()];
        let other = "2026-11-25T00:00:00Z  WARN received SIGTERM from pid 4242 (bash, uid 0): stopping this rank now";
        assert_eq!(
            logged_sender(&lines(other)).as_deref(),
            Some("pid 4242 (bash, uid 0)")
        );
        let own = "2026-11-25T00:00:00Z  WARN received SIGTERM from pid 7 (tchrun, uid 0, the rank's parent: its launcher): stopping this rank now";
        assert_eq!(logged_sender(&lines(own)), None);
        assert_eq!(
            logged_sender(&lines("received SIGTERM: stopping this rank now")),
            None
        );
    }
}
