//! `restarts.json`: the attempts of a job that restarted (`--max-restarts`), oldest first, each
//! with why it failed, where its logs went and the hosts `--exclude-failed-hosts` left out;
//! written by the launcher after every restart. The same [`Attempt`]s are `failure.json`'s
//! `earlier_attempts` when the last attempt fails too.
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A host left out of the next attempts (`--exclude-failed-hosts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedHost {
    pub host: String,
    /// The attempts its ranks failed in, and why (the first failing rank's cause).
    pub failed_in: Vec<u32>,
    pub causes: Vec<String>,
    /// What the job goes on with.
    pub nodes_left: u32,
    pub ranks_left: u32,
    /// The spare host (a host of the hostfile beyond `--nodes`, or of `--spare-hosts`) that
    /// takes its place in the next attempts; none when the job shrinks instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
}

impl DroppedHost {
    /// `its ranks failed in attempts 1 and 2 (cause)`; for a host that failed the per-node
    /// checks (no attempt): what they said.
    pub fn why(&self) -> String {
        if self.failed_in.is_empty() {
            // Left out by the per-node checks before it ran (a spare, or --preflight doctor).
            return self.causes.join("; ");
        }
        let attempts: Vec<String> = self.failed_in.iter().map(u32::to_string).collect();
        let attempts = match attempts.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => attempts.join(""),
        };
        let mut causes = self.causes.clone();
        causes.dedup();
        let plural = if self.failed_in.len() == 1 { "" } else { "s" };
        format!(
            "its ranks failed in attempt{plural} {attempts} ({})",
            causes.join("; ")
        )
    }

    /// The console line of the drop.
    pub fn line(&self) -> String {
        let spare = match &self.replaced_by {
            Some(s) => format!("; spare host {s} takes its place"),
            None => String::new(),
        };
        format!(
            "dropping host {}: {}{spare}; continuing on {} node(s), {} rank(s)",
            self.host,
            self.why(),
            self.nodes_left,
            self.ranks_left
        )
    }
}

/// One attempt that failed and was restarted, as `restarts.json` and `failure.json` record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The first failing rank, its host, and why it failed.
    pub rank: Option<usize>,
    pub host: Option<String>,
    pub classification: super::classification::Classification,
    pub cause: String,
    /// tchrun's exit status had it not restarted.
    pub exit_status: i32,
    /// The optimizer step of the checkpoint the next attempt resumed from.
    pub resumed_from_step: Option<u64>,
    /// Where this attempt's logs were moved.
    pub logs: PathBuf,
    /// `--exclude-failed-hosts`: the host(s) this failure counts against, and those left out
    /// of the next attempts after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_hosts: Vec<DroppedHost>,
}

impl Attempt {
    /// One line for the console and the run report.
    pub fn line(&self) -> String {
        let who = match (self.rank, &self.host) {
            (Some(r), Some(h)) => format!("rank {r} ({h})"),
            (Some(r), None) => format!("rank {r}"),
            _ => "the job".to_string(),
        };
        let mut line = format!(
            "attempt {}: {who} failed: {} ({})",
            self.attempt, self.cause, self.classification
        );
        for d in &self.dropped_hosts {
            line.push_str(&format!("; host {} dropped", d.host));
            if let Some(spare) = &d.replaced_by {
                line.push_str(&format!(" (spare {spare} in its place)"));
            }
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_record::Record;

    fn attempt() -> Attempt {
        Attempt {
            attempt: 1,
            rank: Some(1),
            host: Some("vm".into()),
            classification: "killed by signal".into(),
            cause: "killed by signal 9".into(),
            exit_status: 4,
            resumed_from_step: Some(12),
            logs: PathBuf::from("/o/logs/attempt-1"),
            failed_hosts: Vec::new(),
            dropped_hosts: Vec::new(),
        }
    }

    #[test]
    fn an_attempt_reads_as_one_line() {
        assert_eq!(
            attempt().line(),
            "attempt 1: rank 1 (vm) failed: killed by signal 9 (killed by signal)"
        );
    }

    #[test]
    fn the_history_reads_back_and_leaves_out_empty_host_lists() {
        let t = tempfile::tempdir().unwrap();
        assert!(Vec::<Attempt>::read(t.path()).unwrap().is_none());
        let mut second = attempt();
        second.attempt = 2;
        second.failed_hosts = vec!["vm".into()];
        second.dropped_hosts = vec![DroppedHost {
            host: "vm".into(),
            failed_in: vec![1, 2],
            causes: vec!["x".into(), "x".into()],
            nodes_left: 1,
            ranks_left: 2,
            replaced_by: None,
        }];
        let mut third = second.clone();
        third.attempt = 3;
        third.dropped_hosts[0].replaced_by = Some("spare1".into());
        assert!(third.dropped_hosts[0]
            .line()
            .contains("(x); spare host spare1 takes its place; continuing on 1 node(s)"));
        assert!(third
            .line()
            .ends_with("; host vm dropped (spare spare1 in its place)"));
        let history = vec![attempt(), second, third];
        history.write(t.path()).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(Vec::<Attempt>::path(t.path())).unwrap())
                .unwrap();
        assert!(v[0].get("failed_hosts").is_none() && v[0].get("dropped_hosts").is_none());
        assert_eq!(v[1]["dropped_hosts"][0]["ranks_left"], 2);
        assert!(v[1]["dropped_hosts"][0].get("replaced_by").is_none());
        assert_eq!(v[2]["dropped_hosts"][0]["replaced_by"], "spare1");
        assert_eq!(Vec::<Attempt>::read(t.path()).unwrap(), Some(history));
    }
}
