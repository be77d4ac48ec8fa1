//! What a stack capture leaves in the log directory: `capture-request.json`
//! ([`CaptureRequest`], written by the launcher's hang watch or `tchrun stacks`, read by every
//! rank's heartbeat thread) and `stacks-<rank>.json` ([`RankStacks`]: the rank's native stack of
//! every thread, its collective trace, its loader threads' files and its heartbeat, written by
//! the rank itself, by a peer rank on its host when it cannot answer (stopped), or by the
//! launcher); and [`StackGroup`], identical stacks of many ranks shown once.
//! Owns the JSON shapes; knows nothing of how stacks are taken (the machinery module `stacks`) or judged.
use super::heartbeat::{Heartbeat, Phase};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `<log_dir>/capture-request.json`.
pub const REQUEST_FILE: &str = "capture-request.json";

/// A request that every rank of the job write its stacks now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureRequest {
    /// Unique per request; an answer carries it.
    pub id: u64,
    /// Why ("hang", "tchrun stacks").
    pub reason: String,
    /// When it was asked (RFC 3339 UTC).
    pub time: String,
}

impl CaptureRequest {
    pub fn path(log_dir: &Path) -> PathBuf {
        log_dir.join(REQUEST_FILE)
    }

    /// Writes the request atomically (a rank never reads half of it).
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::files::write_atomic(&Self::path(log_dir), &text).map_err(std::io::Error::other)
    }

    /// The request in `log_dir`, if any (an unreadable one is none). Only a plain file of
    /// this process's own user counts: in a log directory others can write, a request (or a
    /// link) planted by another user starts no capture.
    pub fn read(log_dir: &Path) -> Option<CaptureRequest> {
        use std::os::unix::fs::MetadataExt;
        let path = Self::path(log_dir);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.file_type().is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return None;
        }
        let text = super::per_rank::read_small(&path)?;
        serde_json::from_slice(&text).ok()
    }

    /// Removes the request (done, or left over from an earlier attempt).
    pub fn remove(log_dir: &Path) {
        let _ = std::fs::remove_file(Self::path(log_dir));
    }
}

/// One collective of a rank's trace (its last few hundred are kept in a ring).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// The rank's collective sequence number (the heartbeat's `seq`).
    pub seq: u64,
    pub op: Phase,
    /// The gradient bucket (gradient all-reduces only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    pub bytes: u64,
    /// Optimizer steps done when it was entered.
    pub step: u64,
    /// Entered and completed (RFC 3339 UTC, the rank's clock); `completed` is none while the
    /// rank waits in it.
    pub entered: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<String>,
}

impl TraceEntry {
    /// "gradient all-reduce #1204 (bucket 3, 25.0 MiB, step 300)".
    pub fn describe(&self) -> String {
        let bucket = self
            .bucket
            .map(|b| format!("bucket {b}, "))
            .unwrap_or_default();
        format!(
            "{} #{} ({bucket}{:.1} MiB, step {})",
            self.op.label(),
            self.seq,
            self.bytes as f64 / (1024.0 * 1024.0),
            self.step
        )
    }
}

/// A loader thread at work on one file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderWork {
    /// The thread's name (`data-loader-3`).
    pub thread: String,
    pub file: PathBuf,
    /// Since when (RFC 3339 UTC).
    pub since: String,
}

/// One thread of a rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadStack {
    pub tid: u32,
    /// The thread's name (`/proc/<pid>/task/<tid>/comm`): `tchrun-worker` for the main thread.
    pub name: String,
    /// Its scheduler state: R running, S sleeping, D in the kernel (uninterruptible), T stopped.
    pub state: String,
    /// Where in the kernel it sleeps, when it does (`/proc/.../wchan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Innermost first, demangled function names (`0x7f...` where none is known).
    pub frames: Vec<String>,
}

/// One rank's answer to a capture request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankStacks {
    /// The request answered.
    pub id: u64,
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    /// Who took the stacks: "self", "rank N" (a peer on the host: this rank could not answer)
    /// or "launcher".
    pub captured_by: String,
    /// The process's state when taken (R, S, D, T; "gone" when it no longer ran).
    pub state: String,
    /// The tool that unwound the stacks (`eu-stack`, `gdb`), if one could.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// What went wrong taking them (no tool, a time-out, a refused ptrace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The rank's heartbeat when taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<Heartbeat>,
    /// The rank's last collectives, oldest first (empty when a peer took the stacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<TraceEntry>,
    /// Its loader threads' files in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaders: Vec<LoaderWork>,
    pub threads: Vec<ThreadStack>,
    /// When taken (RFC 3339 UTC) and how long it took.
    pub time: String,
    pub took_ms: u64,
}

/// `<log_dir>/stacks-<rank>.json`.
pub fn path(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("stacks-{rank}.json"))
}

/// Whether `file_name` is a capture's file (`stacks-<rank>.json`, `capture-request.json`):
/// cleared before a job and moved with an attempt's logs.
pub fn is_capture_file(file_name: &str) -> bool {
    file_name == REQUEST_FILE || super::per_rank::rank_of_file(file_name, "stacks-").is_some()
}

impl RankStacks {
    /// Writes `stacks-<rank>.json` atomically.
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::files::write_atomic(&path(log_dir, self.rank), &text).map_err(std::io::Error::other)
    }

    /// The rank's answer in `log_dir`, if it answered request `id`.
    pub fn read(log_dir: &Path, rank: usize, id: u64) -> Option<RankStacks> {
        let text = super::per_rank::read_small(&path(log_dir, rank))?;
        serde_json::from_slice::<RankStacks>(&text)
            .ok()
            .filter(|s| s.id == id)
    }

    /// The main thread (its tid is the pid), else the first.
    pub fn main_thread(&self) -> Option<&ThreadStack> {
        self.threads
            .iter()
            .find(|t| t.tid == self.pid)
            .or_else(|| self.threads.first())
    }

    /// The trace entry the rank is waiting in (entered, not completed), the newest.
    pub fn waiting_in(&self) -> Option<&TraceEntry> {
        self.trace.iter().rev().find(|e| e.completed.is_none())
    }
}

/// How a capture went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureSummary {
    pub id: u64,
    /// From the request to the last answer (or the bound).
    pub took_ms: u64,
    /// Ranks whose stacks were taken (by themselves, a peer or the launcher).
    pub taken: Vec<usize>,
    /// Ranks with no stacks (no answer within the bound, no tool): why, by rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<(usize, String)>,
}

/// Stack groups for the terminal: the groups with a rank of `at_fault` whole (up to `frames`
/// frames) and marked, the others' innermost few (all `frames` when none is at fault).
pub fn groups_text(groups: &[StackGroup], at_fault: &[usize], frames: usize) -> String {
    let mut out = String::new();
    for g in groups {
        let culprit = g.ranks.iter().any(|r| at_fault.contains(r));
        let n = if culprit || at_fault.is_empty() {
            frames
        } else {
            frames.min(6)
        };
        let ranks = if g.ranks.len() == 1 { "rank" } else { "ranks" };
        out.push_str(&format!(
            "  {ranks} {} ({} thread{}):\n",
            rank_list(&g.ranks),
            g.thread,
            if culprit { ", at fault" } else { "" }
        ));
        for (i, f) in g.frames.iter().take(n).enumerate() {
            out.push_str(&format!("    #{i:<2} {}\n", short_frame(f)));
        }
        if g.frames.len() > n {
            out.push_str(&format!("    ... {} more\n", g.frames.len() - n));
        }
    }
    out
}

/// A frame for the terminal: template arguments folded (`wrap_kernel_functor_unboxed_<…>::call`),
/// at most 200 characters (`stacks-<rank>.json` keeps the whole name).
pub fn short_frame(frame: &str) -> String {
    let mut out = String::with_capacity(frame.len().min(200));
    // `<Type as Trait>::method` (Rust): the outer brackets stay, what is inside them folds.
    let mut base = usize::from(frame.starts_with('<'));
    let mut depth = 0usize;
    for (i, c) in frame.char_indices() {
        match c {
            '<' if i == 0 => {
                out.push(c);
                depth = 1;
            }
            '<' if depth == base
                && (frame[..i].ends_with("operator") || frame[..i].ends_with("operator<")) =>
            {
                out.push(c)
            }
            '<' => {
                if depth == base {
                    out.push_str("<…>");
                }
                depth += 1;
            }
            '>' if depth > 0 => {
                depth -= 1;
                if depth == 0 && base == 1 {
                    out.push(c);
                    base = 0;
                }
            }
            _ if depth <= base => out.push(c),
            _ => {}
        }
    }
    if depth != 0 {
        out = frame.to_string();
    }
    if out.chars().count() > 200 {
        out = out.chars().take(199).collect::<String>() + "…";
    }
    out
}

/// Identical stacks of many ranks, shown once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackGroup {
    pub ranks: Vec<usize>,
    /// The thread's name.
    pub thread: String,
    pub frames: Vec<String>,
}

/// The ranks' main-thread stacks grouped: identical frames once, with their ranks (in the
/// order of the lowest rank of each group).
pub fn group_main_threads(stacks: &[RankStacks]) -> Vec<StackGroup> {
    let mut groups: Vec<StackGroup> = Vec::new();
    let mut sorted: Vec<&RankStacks> = stacks.iter().collect();
    sorted.sort_by_key(|s| s.rank);
    for s in sorted {
        let Some(t) = s.main_thread() else { continue };
        if t.frames.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|g| g.frames == t.frames) {
            Some(g) => g.ranks.push(s.rank),
            None => groups.push(StackGroup {
                ranks: vec![s.rank],
                thread: t.name.clone(),
                frames: t.frames.clone(),
            }),
        }
    }
    groups
}

/// "0-6,8" for ranks 0..=6 and 8.
pub fn rank_list(ranks: &[usize]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stacks(rank: usize, frames: &[&str]) -> RankStacks {
        RankStacks {
            id: 7,
            rank,
            host: "vm".into(),
            pid: 100 + rank as u32,
            captured_by: "self".into(),
            state: "S".into(),
            tool: Some("eu-stack".into()),
            error: None,
            heartbeat: None,
            trace: Vec::new(),
            loaders: Vec::new(),
            threads: vec![
                ThreadStack {
                    tid: 900 + rank as u32,
                    name: "heartbeat".into(),
                    state: "S".into(),
                    wchan: None,
                    frames: vec!["clock_nanosleep".into()],
                },
                ThreadStack {
                    tid: 100 + rank as u32,
                    name: "tchrun-worker".into(),
                    state: "S".into(),
                    wchan: Some("futex_wait_queue".into()),
                    frames: frames.iter().map(|f| f.to_string()).collect(),
                },
            ],
            time: "2026-11-25T14:02:11.000Z".into(),
            took_ms: 40,
        }
    }

    #[test]
    fn identical_main_stacks_are_grouped_with_their_ranks() {
        let wait = [
            "futex_wait",
            "c10d::ProcessGroupGloo::wait",
            "tchrun_reducer_finish",
        ];
        let all = [
            stacks(2, &wait),
            stacks(0, &wait),
            stacks(3, &["tchrun_worker::train::step::spin"]),
            stacks(1, &wait),
        ];
        let g = group_main_threads(&all);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].ranks.clone(), g[0].thread.as_str()),
            (vec![0, 1, 2], "tchrun-worker")
        );
        assert_eq!(g[1].ranks, vec![3]);
        assert_eq!(rank_list(&[6, 0, 1, 2, 3, 4, 5, 8]), "0-6,8");
        assert_eq!(rank_list(&[3]), "3");
        assert!(is_capture_file("stacks-12.json") && is_capture_file(REQUEST_FILE));
        assert_eq!(
            short_frame("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::W<c10::F<at::Tensor (at::Tensor const&)>, at::Tensor>, at::Tensor (at::Tensor const&)>::call"),
            "c10::impl::wrap_kernel_functor_unboxed_<…>::call"
        );
        assert_eq!(short_frame("std::operator<< <char>"), "std::operator<< <…>");
        assert_eq!(
            short_frame(
                "<tchrun::data::loader::BatchIter as core::iter::traits::iterator::Iterator>::next"
            ),
            "<tchrun::data::loader::BatchIter as core::iter::traits::iterator::Iterator>::next"
        );
        assert_eq!(
            short_frame("<alloc::vec::Vec<T> as core::ops::Drop>::drop"),
            "<alloc::vec::Vec<…> as core::ops::Drop>::drop"
        );
        assert_eq!(
            short_frame("tchrun_worker::train::step::train_step"),
            "tchrun_worker::train::step::train_step"
        );
        assert!(!is_capture_file("stacks-x.json") && !is_capture_file("heartbeat-1.json"));
        let t = tempfile::tempdir().unwrap();
        all[0].write(t.path()).unwrap();
        assert_eq!(RankStacks::read(t.path(), 2, 7), Some(all[0].clone()));
        assert_eq!(RankStacks::read(t.path(), 2, 8), None);
        let req = CaptureRequest {
            id: 7,
            reason: "hang".into(),
            time: "now".into(),
        };
        req.write(t.path()).unwrap();
        assert_eq!(CaptureRequest::read(t.path()), Some(req));
        CaptureRequest::remove(t.path());
        assert_eq!(CaptureRequest::read(t.path()), None);
    }
}
