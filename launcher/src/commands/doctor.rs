//! `tchrun doctor`: the cluster's health before a job, with `train`'s launch flags. First one
//! rank per node (`tchrun-worker doctor --phase nodes`: versions, paths, shared file system,
//! disk, memory, clock, GPUs), then the job's layout on the hosts that passed (`--phase links`:
//! pairwise bandwidth in log2(N) rounds). Writes `doctor.json` and `hostfile.healthy` into its
//! log directory and prints the table; the verdict is `tchrun_launcher::verdict`'s.
use crate::error::JobError;
use crate::plan::{gpus, launch, preflight};
use crate::run;
use clap::Args;
use std::path::{Path, PathBuf};
use tchrun::doctor::{self, DoctorChecks, DoctorReport, FailedHost, Network, NodeReport, Phase};
use tchrun::exit::ErrorKind;
use tchrun::flags::RankFlags;
use tchrun_launcher::verdict;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub launch: launch::LaunchArgs,
    #[command(flatten)]
    pub rank: RankFlags,
    #[command(flatten)]
    pub checks: DoctorChecks,
}

/// What the doctor came to.
pub struct Diagnosis {
    pub report: DoctorReport,
    /// `hostfile.healthy`, written beside `doctor.json`.
    pub healthy_hostfile: PathBuf,
    pub report_path: PathBuf,
}

/// `tchrun doctor`: 0 healthy, 4 a host or a link failed (named), 2 bad input.
pub fn run(a: &DoctorArgs) -> Result<i32, JobError> {
    let (log_dir, _new) = preflight::own_log_dir(
        a.rank.log_dir.clone(),
        PathBuf::from(tchrun::flags::DEFAULT_LOG_DIR),
        "doctor",
        a.launch.dry_run,
    )?;
    // The doctor writes its test files into --output and its logs: neither may be or lie in
    // a --data input (as every other command refuses an output inside an input).
    let mut outputs = vec![tchrun::overlap::Named::new(
        "--log-dir",
        "the doctor's logs",
        &log_dir,
    )];
    if let Some(o) = &a.checks.output {
        outputs.push(tchrun::overlap::Named::new(
            "--output",
            "the doctor's write test",
            o,
        ));
    }
    let inputs: Vec<_> = (a.checks.data.iter())
        .map(|d| tchrun::overlap::Named::new("--data", "a dataset every node must see", d))
        .collect();
    tchrun::overlap::check_disjoint(&outputs, &inputs)?;
    let Some(d) = diagnose(&a.launch, &a.rank, &a.checks, &log_dir)? else {
        return Ok(0);
    };
    outln!("{}", verdict::table(&d.report).trim_end());
    outln!(
        "doctor: {} and {}",
        d.report_path.display(),
        d.healthy_hostfile.display()
    );
    if d.report.healthy {
        Ok(0)
    } else {
        for f in &d.report.failed_hosts {
            errln!("doctor: {} FAILED: {}", f.host, f.reasons.join("; "));
        }
        for l in &d.report.bad_links {
            errln!("doctor: {l}");
        }
        Ok(ErrorKind::RankFailed.exit_code())
    }
}

/// The hosts the launch names (`--hostfile`, `--hosts`), in order; empty when Slurm or this
/// host decides.
fn listed_hosts(l: &launch::LaunchArgs) -> Result<Vec<launch::Host>, JobError> {
    if let Some(f) = &l.hostfile {
        let text = tchrun::files::read_bounded_string(f, tchrun::files::caps::TEXT)
            .map_err(|e| JobError::input_io(format!("--hostfile {}", f.display()), e.into_io()))?;
        return launch::parse_hostfile(f, &text)
            .map_err(|e| JobError::invalid(format!("--hostfile {e}")));
    }
    Ok(l.hosts
        .iter()
        .map(|h| launch::Host {
            name: h.clone(),
            slots: None,
        })
        .collect())
}

fn worker_args(
    rank: &RankFlags,
    checks: &DoctorChecks,
    phase: Phase,
    dir: &Path,
    json: &Path,
) -> Result<Vec<String>, JobError> {
    let mut r = rank.clone();
    r.log_dir = Some(dir.to_path_buf());
    let flags = doctor::DoctorRank {
        rank: r,
        checks: checks.clone(),
        phase,
        json: json.to_path_buf(),
    };
    let mut args = vec!["doctor".to_string()];
    args.extend(flags.to_args()?);
    Ok(args)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, JobError> {
    let text = tchrun::files::read_bounded(path, tchrun::files::caps::RECORD).map_err(|e| {
        failed(format!(
            "the doctor's ranks ended without {}: {e}",
            path.display()
        ))
    })?;
    serde_json::from_slice(&text).map_err(|e| failed(format!("{}: {e}", path.display())))
}

/// Runs both phases under `log_dir` and writes `doctor.json` and `hostfile.healthy` there.
/// None after a dry run. A phase whose ranks failed is an error (its summary printed).
pub fn diagnose(
    launch: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    log_dir: &Path,
) -> Result<Option<Diagnosis>, JobError> {
    let hosts = listed_hosts(launch)?;
    // One rank on every listed host (spares too), else on each of --nodes.
    let mut per_node = launch.clone();
    per_node.procs_per_node = 1;
    if !hosts.is_empty() {
        per_node.nodes = hosts.len() as u32;
    }
    let (nodes, unstarted) = match nodes_phase(&per_node, rank, checks, &log_dir.join("nodes")) {
        Ok(Some(nodes)) => (nodes, Vec::new()),
        Ok(None) => return Ok(None),
        // One host mpirun cannot start fails the whole phase: find it, check the rest.
        Err(e) if hosts.len() > 1 => {
            let first_line = e.to_string();
            let first_line = first_line.lines().next().unwrap_or_default();
            errln!(
                "tchrun: warning: doctor: {}; checking each host alone",
                first_line.trim_start_matches("tchrun: error: ")
            );
            match without_unstarted(&hosts, &per_node, rank, checks, log_dir)? {
                Some(found) => found,
                None => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let mut first = verdict::report(nodes.clone(), None, None, checks);
    add_failed(&mut first, &unstarted);
    let healthy_hostfile = log_dir.join(doctor::HEALTHY_HOSTFILE);
    let procs = launch.procs_per_node;
    write(
        &healthy_hostfile,
        &verdict::healthy_hostfile(&first, &hosts, procs),
    )?;
    let (network, note) = links(launch, rank, checks, log_dir, &first, &healthy_hostfile)?;
    let mut report = verdict::report(nodes, network, note, checks);
    add_failed(&mut report, &unstarted);
    write(
        &healthy_hostfile,
        &verdict::healthy_hostfile(&report, &hosts, procs),
    )?;
    let report_path = log_dir.join(doctor::REPORT_JSON);
    let text =
        serde_json::to_string_pretty(&report).map_err(|e| failed(format!("doctor.json: {e}")))?;
    write(&report_path, &text)?;
    Ok(Some(Diagnosis {
        report,
        healthy_hostfile,
        report_path,
    }))
}

/// When the per-node phase could not run on `hosts` together: each host alone, to find those
/// where no rank starts; then the others together again (the shared file system and the clocks
/// are checked across hosts). The reports and the hosts that did not start; None when every
/// host starts alone (the failure is not a host's).
fn without_unstarted(
    hosts: &[launch::Host],
    per_node: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    log_dir: &Path,
) -> Result<Option<(Vec<NodeReport>, Vec<FailedHost>)>, JobError> {
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    let alone = check_each(&names, per_node, rank, checks, &log_dir.join("nodes-alone"))?;
    let unstarted: Vec<FailedHost> = alone
        .into_iter()
        .filter(|f| f.reasons.iter().any(|r| r.starts_with(DID_NOT_RUN)))
        .collect();
    if unstarted.is_empty() {
        return Ok(None);
    }
    let rest: Vec<String> = names
        .into_iter()
        .filter(|h| !unstarted.iter().any(|f| &f.host == h))
        .collect();
    if rest.is_empty() {
        return Ok(Some((Vec::new(), unstarted)));
    }
    let mut again = per_node.clone();
    (again.hostfile, again.nodes) = (None, rest.len() as u32);
    again.hosts = rest;
    let dir = log_dir.join("nodes-started");
    let nodes = nodes_phase(&again, rank, checks, &dir)?.unwrap_or_default();
    Ok(Some((nodes, unstarted)))
}

/// `failed` joins `report`'s failed hosts (the hosts where the check did not run).
fn add_failed(report: &mut DoctorReport, failed: &[FailedHost]) {
    if !failed.is_empty() {
        report.failed_hosts.extend(failed.iter().cloned());
        report.healthy = false;
    }
}

/// The reason of a host where the per-node check could not run at all.
const DID_NOT_RUN: &str = "its per-node check did not run";

/// The per-node phase with `per_node`'s launch (one rank per node) in `dir`: the nodes'
/// reports, or None after a dry run.
fn nodes_phase(
    per_node: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    dir: &Path,
) -> Result<Option<Vec<NodeReport>>, JobError> {
    let json = dir.join(doctor::NODES_JSON);
    let args = worker_args(rank, checks, Phase::Nodes, dir, &json)?;
    let usage = gpus::GpuUse::Ranks(rank.device);
    let code = run::run_job(per_node, dir.to_path_buf(), args, usage, &rank.console)?;
    if per_node.dry_run {
        return Ok(None);
    }
    if code != 0 {
        return Err(failed(format!(
            "the per-node checks ended with exit {code} (see {})",
            dir.display()
        )));
    }
    Ok(Some(read_json(&json)?))
}

/// The per-node checks alone (no network phase) on `hosts`, one rank each, in `dir`: the
/// hosts that failed, each with its reasons (`train --preflight doctor` at a restart, and a
/// spare host before it joins). A host where the check could not run fails too: when the
/// hosts checked together could not run, each is checked alone, so one unreachable host does
/// not fail the others.
pub fn check_hosts(
    hosts: &[String],
    launch: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    dir: &Path,
) -> Result<Vec<FailedHost>, JobError> {
    let mut per_node = launch.clone();
    (per_node.hostfile, per_node.hosts) = (None, hosts.to_vec());
    (per_node.nodes, per_node.procs_per_node) = (hosts.len().max(1) as u32, 1);
    per_node.dry_run = false;
    let nodes = match nodes_phase(&per_node, rank, checks, dir) {
        Ok(nodes) => nodes.unwrap_or_default(),
        Err(_) if hosts.len() > 1 => return check_each(hosts, launch, rank, checks, dir),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            return Ok(hosts
                .iter()
                .map(|h| FailedHost {
                    host: h.clone(),
                    reasons: vec![format!(
                        "{DID_NOT_RUN}: {}",
                        first.strip_prefix("tchrun: error: ").unwrap_or(first)
                    )],
                })
                .collect());
        }
    };
    let report = verdict::report(nodes, None, None, checks);
    // Named as the caller listed them (a node reports its own hostname).
    let mut failed: Vec<FailedHost> = report
        .failed_hosts
        .iter()
        .map(|f| FailedHost {
            host: hosts
                .iter()
                .find(|h| verdict::same_host(&f.host, h))
                .unwrap_or(&f.host)
                .clone(),
            reasons: f.reasons.clone(),
        })
        .collect();
    for h in hosts {
        let seen = report.nodes.iter().any(|n| verdict::same_host(&n.host, h));
        if !seen {
            failed.push(FailedHost {
                host: h.clone(),
                reasons: vec!["no rank reported from it".into()],
            });
        }
    }
    Ok(failed)
}

/// `check_hosts` on each of `hosts` alone (in `dir/host-<n>`, n from 1): for when the hosts
/// together could not be checked, so that a host mpirun cannot start is the one named.
fn check_each(
    hosts: &[String],
    launch: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    dir: &Path,
) -> Result<Vec<FailedHost>, JobError> {
    let mut failed = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let sub = dir.join(format!("host-{}", i + 1));
        failed.extend(check_hosts(
            std::slice::from_ref(h),
            launch,
            rank,
            checks,
            &sub,
        )?);
    }
    Ok(failed)
}

/// A doctor phase that ran but did not come to a result (exit 4).
fn failed(message: String) -> JobError {
    JobError::RankFailed {
        kind: ErrorKind::RankFailed,
        report: format!("tchrun: error: {message}\n"),
    }
}

fn write(path: &Path, text: &str) -> Result<(), JobError> {
    tchrun::files::write_atomic(path, text.as_bytes())
        .map_err(|e| JobError::invalid(format!("cannot write {}: {e}", path.display())))
}

/// The network phase on the hosts that passed the per-node checks (all of them, or those of
/// `hostfile.healthy` when the launch listed hosts); or why it did not run.
fn links(
    launch: &launch::LaunchArgs,
    rank: &RankFlags,
    checks: &DoctorChecks,
    log_dir: &Path,
    first: &DoctorReport,
    healthy_hostfile: &Path,
) -> Result<(Option<Network>, Option<String>), JobError> {
    let healthy = first.healthy_hosts.len() as u32;
    let mut job = launch.clone();
    if !first.failed_hosts.is_empty() {
        if launch.hostfile.is_none() && launch.hosts.is_empty() {
            return Ok((
                None,
                Some(
                    "a node failed its checks and the launch names no hosts to leave it out".into(),
                ),
            ));
        }
        job.hostfile = Some(healthy_hostfile.to_path_buf());
        job.hosts = Vec::new();
        job.nodes = healthy;
    } else if !launch.hosts.is_empty() || launch.hostfile.is_some() {
        job.nodes = healthy.max(1);
    }
    if healthy == 0 {
        return Ok((None, Some("no host passed its checks".into())));
    }
    if job.nodes * job.procs_per_node < 2 {
        return Ok((None, Some("one rank: no link to measure".into())));
    }
    let dir = log_dir.join("links");
    let json = dir.join(doctor::LINKS_JSON);
    let args = worker_args(rank, checks, Phase::Links, &dir, &json)?;
    let usage = gpus::GpuUse::Ranks(rank.device);
    let code = match run::run_job(&job, dir.clone(), args, usage, &rank.console) {
        Ok(code) => code,
        // The ranks ran and failed: the network is what failed (its summary is printed).
        Err(e) if e.kind() == ErrorKind::RankFailed => ErrorKind::RankFailed.exit_code(),
        Err(e) => return Err(e),
    };
    if code != 0 {
        return Ok((
            None,
            Some(format!(
                "the link test ended with exit {code}: a link is broken (see {})",
                dir.display()
            )),
        ));
    }
    Ok((Some(read_json(&json)?), None))
}
