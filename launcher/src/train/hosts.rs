//! `--exclude-failed-hosts` (with `--hostfile`): each failure counts against the host(s) it
//! happened on; a host that failed in [`FAILURES_TO_DROP`] attempts is left out of the next
//! one (a hardware error, `Cause::is_hardware`, counts at once), which runs on the remaining hosts (a rewritten hostfile in the log directory, fewer
//! ranks), as long as `--min-nodes` remain.
use crate::error::JobError;
use crate::plan::launch::{LaunchArgs, Plan};
use crate::report::{FailureSummary, RankLog};
use std::collections::BTreeMap;
use std::path::Path;
use tchrun::files;
use tchrun::job_record::DroppedHost;

/// Attempts a host's ranks failed in before `--exclude-failed-hosts` leaves it out.
pub const FAILURES_TO_DROP: usize = 2;

/// `--hostfile` with the hosts of `--spare-hosts` after its own (in the log directory).
pub const WITH_SPARES_HOSTFILE: &str = "hostfile.with-spares";

/// `--spare-hosts FILE`, read and checked before anything is written: the hosts of
/// `--hostfile`, then the spares. None without spares. Refused (exit 2): no `--hostfile`, an
/// unreadable or empty spare file, a spare that is also a host of the job.
pub fn read_spares(
    launch: &LaunchArgs,
    spares: Option<&Path>,
) -> Result<Option<Vec<crate::plan::launch::Host>>, JobError> {
    use crate::plan::launch::parse_hostfile;
    let Some(spares) = spares else {
        return Ok(None);
    };
    let Some(hostfile) = &launch.hostfile else {
        return Err(JobError::invalid(format!(
            "--spare-hosts {} needs --hostfile FILE: the spares wait behind the job's hosts",
            spares.display()
        )));
    };
    let read = |flag: &str, f: &Path| {
        let text = std::fs::read_to_string(f)
            .map_err(|e| JobError::input_io(format!("{flag} {}", f.display()), e))?;
        parse_hostfile(f, &text).map_err(|e| JobError::invalid(format!("{flag} {e}")))
    };
    let (mut hosts, extra) = (
        read("--hostfile", hostfile)?,
        read("--spare-hosts", spares)?,
    );
    if extra.is_empty() {
        return Err(JobError::invalid(format!(
            "--spare-hosts {}: no hosts in it",
            spares.display()
        )));
    }
    if let Some(h) = extra
        .iter()
        .find(|s| hosts.iter().any(|h| h.name == s.name))
    {
        return Err(JobError::invalid(format!(
            "--spare-hosts {}: {} is also in --hostfile {}; a spare must be another host",
            spares.display(),
            h.name,
            hostfile.display()
        )));
    }
    hosts.extend(extra);
    Ok(Some(hosts))
}

/// `plan` and the launch (returned) on a hostfile of `all` (`read_spares`): written to
/// `<log-dir>/hostfile.with-spares`, except by a dry run, whose command names it.
pub fn with_spares(
    launch: &LaunchArgs,
    all: &[crate::plan::launch::Host],
    plan: &mut Plan,
) -> Result<LaunchArgs, JobError> {
    let mut text = String::from("# --hostfile and --spare-hosts (tchrun): the spares last\n");
    for h in all {
        text.push_str(&h.line());
        text.push('\n');
    }
    let path = plan.log_dir.join(WITH_SPARES_HOSTFILE);
    if !launch.dry_run {
        std::fs::create_dir_all(&plan.log_dir)
            .and_then(|_| files::write_atomic(&path, text.as_bytes()).map_err(|e| e.source))
            .map_err(|e| JobError::input_io(format!("{}", path.display()), e))?;
    }
    plan.node_names = all.iter().map(|h| h.name.clone()).collect();
    plan.hostfile = Some(path.clone());
    let mut with = launch.clone();
    with.hostfile = Some(path);
    Ok(with)
}

/// The hostfile of the hosts left after `--exclude-failed-hosts` dropped some (in the log
/// directory; the next attempts' mpirun reads it instead of `--hostfile`).
pub const REMAINING_HOSTFILE: &str = "hostfile.remaining";

/// The failures counted against each host across attempts (`--exclude-failed-hosts`).
#[derive(Debug, Default)]
pub struct HostFailures {
    /// Per host: the attempt, its cause, and whether that was a hardware error.
    by_host: BTreeMap<String, Vec<(u32, String, bool)>>,
    /// Hosts that failed the per-node checks (`doctor`) before an attempt, and what they
    /// said: left out at once.
    unfit: BTreeMap<String, String>,
}

/// What to do with the hosts after a failed attempt.
#[derive(Debug, PartialEq)]
pub enum HostDecision {
    /// Every host stays.
    Keep,
    /// The next attempt runs without these hosts.
    Drop(Vec<DroppedHost>),
    /// Dropping these would leave fewer than `--min-nodes`: the job stops (the message says
    /// why).
    Stop(String),
}

impl HostFailures {
    /// Counts attempt `attempt`'s failure (`cause`) against `hosts`; a `hardware` one (a CUDA
    /// error naming the GPU, an Xid or ECC line in the kernel log) drops them at once.
    pub fn record(&mut self, attempt: u32, hosts: &[String], cause: &str, hardware: bool) {
        for h in hosts {
            self.by_host
                .entry(h.clone())
                .or_default()
                .push((attempt, cause.to_string(), hardware));
        }
    }

    /// `host` failed the per-node checks before attempt `attempt`: it is left out at once.
    pub fn unfit(&mut self, attempt: u32, host: &str, reasons: &[String]) {
        self.unfit.insert(
            host.to_string(),
            format!(
                "it failed the per-node checks before attempt {attempt} ({})",
                reasons.join("; ")
            ),
        );
    }

    /// Whether `host` failed often enough to be left out.
    fn failing(&self, host: &str) -> bool {
        self.unfit.contains_key(host)
            || self
                .by_host
                .get(host)
                .is_some_and(|f| f.len() >= FAILURES_TO_DROP || f.iter().any(|x| x.2))
    }

    /// The hosts `plan`'s next attempt runs on once the failing ones are left out: the first
    /// `--nodes` of those left (mpirun fills the hostfile's hosts in order; the rest are
    /// spares).
    pub fn next_hosts(&self, plan: &Plan) -> Vec<String> {
        let left = plan.node_names.iter().filter(|h| !self.failing(h));
        left.take(plan.nodes as usize).cloned().collect()
    }

    /// The hosts of `plan` that failed in [`FAILURES_TO_DROP`] attempts, and whether at least
    /// `min_nodes` nodes remain without them.
    pub fn decide(&self, plan: &Plan, min_nodes: u32) -> HostDecision {
        let failing: Vec<&String> = plan.node_names.iter().filter(|h| self.failing(h)).collect();
        if failing.is_empty() {
            return HostDecision::Keep;
        }
        let left = plan.node_names.len() - failing.len();
        let nodes_left = plan.nodes.min(left as u32);
        // The spares that come in, in hostfile order, each in the place of a dropped host
        // that ran in this attempt.
        let active = active_hosts(plan);
        let next = self.next_hosts(plan);
        let mut incoming = next.iter().filter(|h| !active.contains(h));
        let dropped: Vec<DroppedHost> = failing
            .iter()
            .map(|h| {
                let f = self.by_host.get(*h).map(Vec::as_slice).unwrap_or_default();
                let mut causes: Vec<String> = f.iter().map(|x| x.1.clone()).collect();
                causes.extend(self.unfit.get(*h).cloned());
                DroppedHost {
                    host: h.to_string(),
                    failed_in: f.iter().map(|x| x.0).collect(),
                    causes,
                    nodes_left,
                    ranks_left: nodes_left * plan.procs_per_node,
                    replaced_by: if active.contains(*h) {
                        incoming.next().cloned()
                    } else {
                        None
                    },
                }
            })
            .collect();
        if nodes_left < min_nodes {
            let which: Vec<String> = dropped
                .iter()
                .map(|d| format!("host {}: {}", d.host, d.why()))
                .collect();
            return HostDecision::Stop(format!(
                "{}; leaving it out would leave {nodes_left} node(s), fewer than --min-nodes {min_nodes}",
                which.join("; ")
            ));
        }
        HostDecision::Drop(dropped)
    }
}

/// The hosts `plan`'s attempt runs on: the first `--nodes` of its hostfile (the rest are
/// spares).
pub fn active_hosts(plan: &Plan) -> &[String] {
    &plan.node_names[..plan.node_names.len().min(plan.nodes as usize)]
}

/// The plan's node that `rank` ran on: the host its driver log names when that is one of the
/// plan's nodes (also as a short name of a full one, or the other way round), else the node
/// mpirun placed it on (ranks fill the hosts in order, `procs_per_node` each).
pub fn node_of(
    rank: usize,
    reported: Option<&str>,
    nodes: &[String],
    procs_per_node: u32,
) -> Option<String> {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
    reported
        .and_then(|r| {
            nodes
                .iter()
                .find(|n| *n == r)
                .or_else(|| nodes.iter().find(|n| short(n) == short(r)))
        })
        .or_else(|| nodes.get(rank / procs_per_node.max(1) as usize))
        .cloned()
}

/// The hosts an attempt's failure counts against: the first failing rank's, and every host on
/// which two or more ranks failed by themselves (their own failure record, not a lost peer or
/// an interrupt).
pub fn failed_hosts(
    summary: Option<&FailureSummary>,
    logs: &[RankLog],
    nodes: &[String],
    procs_per_node: u32,
) -> Vec<String> {
    use tchrun::driver_log::FailureKind;
    let mut hosts = Vec::new();
    if let Some(r) = summary.and_then(|s| s.rank) {
        let host = summary.and_then(|s| s.host.as_deref());
        hosts.extend(node_of(r, host, nodes, procs_per_node));
    }
    let mut own: BTreeMap<String, usize> = BTreeMap::new();
    for l in logs {
        let by_itself = l.failure.as_ref().is_some_and(|f| {
            !matches!(
                f.kind,
                FailureKind::Communication | FailureKind::Interrupted
            )
        });
        if by_itself {
            if let Some(h) = node_of(l.rank, Some(&l.host), nodes, procs_per_node) {
                *own.entry(h).or_default() += 1;
            }
        }
    }
    for (h, n) in own {
        if n >= 2 && !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    hosts
}

/// `--straggler-action exclude`: when the attempt's ranks stopped to leave out a straggler
/// (their failure records' kind), the hosts rank 0 named in `status.json` (`exclude_hosts`)
/// that are hosts of the plan; empty otherwise.
pub fn straggler_hosts(
    logs: &[RankLog],
    log_dir: &std::path::Path,
    nodes: &[String],
) -> Vec<String> {
    use tchrun::driver_log::FailureKind;
    use tchrun::job_record::{JobStatus, Record};
    let stopped_for_one = logs.iter().any(|l| {
        l.failure
            .as_ref()
            .is_some_and(|f| f.kind == FailureKind::Straggler)
    });
    if !stopped_for_one {
        return Vec::new();
    }
    let named = JobStatus::read(log_dir)
        .ok()
        .flatten()
        .map(|s| s.exclude_hosts)
        .unwrap_or_default();
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
    nodes
        .iter()
        .filter(|n| named.iter().any(|h| h == *n || short(h) == short(n)))
        .cloned()
        .collect()
}

/// The hosts an attempt's end counts against: the stragglers left out on purpose, else those
/// of its failure (`failed_hosts`).
pub fn counted(
    stragglers: Vec<String>,
    summary: Option<&FailureSummary>,
    logs: &[RankLog],
    plan: &Plan,
) -> Vec<String> {
    if !stragglers.is_empty() {
        return stragglers;
    }
    failed_hosts(summary, logs, &plan.node_names, plan.procs_per_node)
}

/// `plan` without the `dropped` hosts: their lines left out of the hostfile (written to
/// `<log-dir>/hostfile.remaining`, slots kept), `--nodes` lowered to the hosts left.
pub fn without_hosts(plan: &Plan, dropped: &[DroppedHost]) -> Result<Plan, JobError> {
    let Some(hostfile) = &plan.hostfile else {
        return Err(JobError::invalid(
            "--exclude-failed-hosts needs --hostfile FILE",
        ));
    };
    let text = std::fs::read_to_string(hostfile)
        .map_err(|e| JobError::input_io(format!("--hostfile {}", hostfile.display()), e))?;
    let hosts = crate::plan::launch::parse_hostfile(hostfile, &text)
        .map_err(|e| JobError::invalid(format!("--hostfile {e}")))?;
    let gone = |h: &str| dropped.iter().any(|d| d.host == h);
    let mut out = format!(
        "# {} without the host(s) tchrun --exclude-failed-hosts left out: {}\n",
        hostfile.display(),
        dropped
            .iter()
            .map(|d| d.host.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut names = Vec::new();
    for h in hosts.iter().filter(|h| !gone(&h.name)) {
        out.push_str(&h.line());
        out.push('\n');
        names.push(h.name.clone());
    }
    let path = plan.log_dir.join(REMAINING_HOSTFILE);
    files::write_atomic(&path, out.as_bytes())
        .map_err(|e| JobError::input_io(format!("{}", path.display()), e.source))?;
    let mut next = plan.clone();
    next.nodes = plan.nodes.min(names.len() as u32);
    next.node_names = names;
    next.hostfile = Some(path);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn plan(log_dir: &Path, hostfile: Option<PathBuf>, names: &[&str], nodes: u32) -> Plan {
        Plan {
            kind: crate::plan::launch::LauncherKind::Mpirun,
            node_names: names.iter().map(|n| n.to_string()).collect(),
            nodes,
            procs_per_node: 2,
            hosts: Vec::new(),
            hostfile,
            oversubscribe: false,
            worker: PathBuf::from("/opt/tchrun-worker"),
            log_dir: log_dir.to_path_buf(),
            mpirun_args: Vec::new(),
            as_root: false,
            console: Default::default(),
        }
    }

    #[test]
    fn a_rank_is_placed_on_a_plan_node_by_name_or_by_position() {
        let nodes: Vec<String> = ["n1.cluster", "n2.cluster", "n3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            node_of(0, Some("n2.cluster"), &nodes, 2).as_deref(),
            Some("n2.cluster")
        );
        // A short hostname matches the hostfile's full one.
        assert_eq!(
            node_of(0, Some("n2"), &nodes, 2).as_deref(),
            Some("n2.cluster")
        );
        // An unknown name (an address in the hostfile, say): where mpirun placed the rank.
        assert_eq!(
            node_of(3, Some("10.0.0.7"), &nodes, 2).as_deref(),
            Some("n2.cluster")
        );
        assert_eq!(node_of(5, None, &nodes, 2).as_deref(), Some("n3"));
        assert_eq!(node_of(6, None, &nodes, 2), None);
    }

    #[test]
    fn a_failure_counts_against_the_first_failing_host_and_a_host_with_two_own_failures() {
        use tchrun::driver_log::{FailureKind, FailureRecord};
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let log = |rank: usize, host: &str, kind: Option<FailureKind>| RankLog {
            rank,
            path: PathBuf::new(),
            host: host.into(),
            local_rank: None,
            pid: None,
            device: None,
            exit_code: None,
            summary: None,
            first_error: None,
            failure: kind.map(|kind| FailureRecord {
                rank,
                host: host.into(),
                pid: 1,
                time: "t".into(),
                kind,
                message: "m".into(),
                location: None,
                exit_code: Some(4),
            }),
            lr: None,
            bootstrap: None,
            tail: Vec::new(),
        };
        let logs = vec![
            log(0, "a", Some(FailureKind::Communication)),
            log(1, "a", Some(FailureKind::Communication)),
            log(2, "b", None),
            log(3, "b", Some(FailureKind::Communication)),
            log(4, "c", Some(FailureKind::OutOfMemory)),
            log(5, "c", Some(FailureKind::Panic)),
        ];
        let mut summary = FailureSummary::hang("x".into(), None);
        summary.rank = Some(2);
        summary.host = Some("b".into());
        assert_eq!(
            failed_hosts(Some(&summary), &logs, &nodes, 2),
            vec!["b", "c"]
        );
        // Peers that only lost a connection are not counted; no first failing rank, no host.
        assert_eq!(
            failed_hosts(None, &logs[..4], &nodes, 2),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_host_is_dropped_after_two_failed_attempts_unless_too_few_nodes_remain() {
        let t = tempfile::tempdir().unwrap();
        let p = plan(t.path(), None, &["a", "b"], 2);
        let mut f = HostFailures::default();
        f.record(1, &["b".into()], "killed by signal 9", false);
        assert_eq!(f.decide(&p, 1), HostDecision::Keep);
        f.record(2, &["b".into()], "killed by signal 9", false);
        let HostDecision::Drop(d) = f.decide(&p, 1) else {
            panic!("b failed twice")
        };
        assert_eq!(
            d[0].line(),
            "dropping host b: its ranks failed in attempts 1 and 2 (killed by signal 9); continuing on 1 node(s), 2 rank(s)"
        );
        let HostDecision::Stop(why) = f.decide(&p, 2) else {
            panic!("--min-nodes 2")
        };
        assert!(
            why.contains("host b: its ranks failed in attempts 1 and 2")
                && why.contains("leave 1 node(s), fewer than --min-nodes 2"),
            "{why}"
        );
        // A spare host in the hostfile keeps the job at --nodes 2.
        let spare = plan(t.path(), None, &["a", "b", "c"], 2);
        let HostDecision::Drop(d) = f.decide(&spare, 2) else {
            panic!("c takes b's place")
        };
        assert_eq!((d[0].nodes_left, d[0].ranks_left), (2, 4));
        assert_eq!(d[0].replaced_by.as_deref(), Some("c"));
        assert_eq!(f.next_hosts(&spare), vec!["a", "c"]);
        assert!(d[0]
            .line()
            .contains("(killed by signal 9); spare host c takes its place; continuing on 2 node(s), 4 rank(s)"));
        // A spare that fails the per-node checks is left out too: the next one comes in.
        let spares = plan(t.path(), None, &["a", "b", "c", "d"], 2);
        f.unfit(3, "c", &["the output is not writable".into()]);
        let HostDecision::Drop(d) = f.decide(&spares, 2) else {
            panic!("d takes b's place")
        };
        assert_eq!(f.next_hosts(&spares), vec!["a", "d"]);
        let b = d.iter().find(|x| x.host == "b").expect("b");
        assert_eq!(b.replaced_by.as_deref(), Some("d"));
        let c = d.iter().find(|x| x.host == "c").expect("c");
        assert_eq!((c.replaced_by.as_deref(), c.failed_in.len()), (None, 0));
        assert_eq!(
            c.line(),
            "dropping host c: it failed the per-node checks before attempt 3 (the output is not writable); continuing on 2 node(s), 4 rank(s)"
        );
    }

    #[test]
    fn a_hardware_error_drops_its_host_after_one_attempt() {
        let t = tempfile::tempdir().unwrap();
        let p = plan(t.path(), None, &["a", "b"], 2);
        let mut f = HostFailures::default();
        f.record(1, &["a".into()], "killed by signal 9", false);
        let xid = "hardware error: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.";
        f.record(1, &["b".into()], xid, true);
        let HostDecision::Drop(d) = f.decide(&p, 1) else {
            panic!("b's GPU failed")
        };
        assert_eq!(d.len(), 1, "a failed once, not by hardware: {d:?}");
        assert_eq!(
            d[0].line(),
            format!("dropping host b: its ranks failed in attempt 1 ({xid}); continuing on 1 node(s), 2 rank(s)")
        );
    }

    #[test]
    fn the_plan_without_a_host_gets_a_hostfile_of_the_others() {
        let t = tempfile::tempdir().unwrap();
        let hf = t.path().join("hosts");
        std::fs::write(&hf, "# ours\na slots=2\nb slots=2\nc\n").unwrap();
        let p = plan(t.path(), Some(hf), &["a", "b", "c"], 3);
        let dropped = DroppedHost {
            host: "b".into(),
            failed_in: vec![1, 2],
            causes: vec!["x".into(), "x".into()],
            nodes_left: 2,
            ranks_left: 4,
            replaced_by: None,
        };
        let next = without_hosts(&p, &[dropped]).unwrap();
        assert_eq!(next.nodes, 2);
        assert_eq!(next.node_names, vec!["a", "c"]);
        let path = t.path().join(REMAINING_HOSTFILE);
        assert_eq!(next.hostfile.as_deref(), Some(path.as_path()));
        let text = std::fs::read_to_string(&path).unwrap();
        let hosts = crate::plan::launch::parse_hostfile(&path, &text).unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, vec!["a", "c"]);
        assert_eq!(hosts[0].slots, Some(2));
    }
}
