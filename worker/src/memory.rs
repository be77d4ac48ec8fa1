//! The rank's memory, published: a thread of its own rewrites `<log_dir>/memory-<rank>.json`
//! (`tchrun::job_record::memory`) about once a second with the rank's resident memory, the
//! limit it runs under (its memory cgroup's, else the node's) and the OOM kills its cgroup had
//! counted at the start, so that the launcher can tell a rank the OOM killer ended, with the
//! memory it used. A leaf: imports nothing of this crate.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tchrun::job_record::memory::{LimitOf, RankMemory};
use tchrun::memory::{self, Cgroup};

static STARTED: AtomicBool = AtomicBool::new(false);
/// How often the thread samples.
const EVERY: Duration = Duration::from_secs(1);

/// What does not change while the rank runs.
struct Fixed {
    log_dir: PathBuf,
    rank: usize,
    host: String,
    cgroup: Option<Cgroup>,
    limit: Option<(u64, LimitOf)>,
    oom_kills_at_start: Option<u64>,
}

fn sample(f: &Fixed) -> Option<RankMemory> {
    let (rss, peak) = memory::rss_bytes()?;
    Some(RankMemory {
        rank: f.rank,
        host: f.host.clone(),
        pid: std::process::id(),
        rss_mib: memory::mib(rss),
        peak_rss_mib: memory::mib(peak),
        limit_mib: f.limit.as_ref().map(|(l, _)| memory::mib(*l)),
        limit_of: f.limit.as_ref().map(|(_, of)| of.clone()),
        cgroup: f.cgroup.clone(),
        oom_kills_at_start: f.oom_kills_at_start,
        time: tchrun::files::timestamp_now(),
    })
}

/// Starts the sampling thread (once a process; later calls do nothing). A record that cannot
/// be written is said once in the driver log; the rank goes on.
pub fn start(log_dir: PathBuf, rank: usize, host: &str) {
    if STARTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let cgroup = Cgroup::of_self();
    let limit = cgroup
        .as_ref()
        .and_then(Cgroup::limit)
        .map(|(l, path)| (l, LimitOf::Cgroup(path)))
        .or_else(|| memory::node_bytes().map(|n| (n, LimitOf::Node)));
    let fixed = Fixed {
        log_dir,
        rank,
        host: host.to_string(),
        oom_kills_at_start: cgroup.as_ref().and_then(Cgroup::oom_kills),
        cgroup,
        limit,
    };
    let spawned = std::thread::Builder::new()
        .name("memory".into())
        .spawn(move || {
            let mut warned = false;
            loop {
                if let Some(m) = sample(&fixed) {
                    if let Err(e) = m.write(&fixed.log_dir) {
                        if !warned {
                            tracing::warn!(
                                "cannot write the memory record in {}: {e} (an OOM kill will be \
                                 reported without this rank's memory)",
                                fixed.log_dir.display()
                            );
                            warned = true;
                        }
                    }
                }
                std::thread::sleep(EVERY);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the memory thread: {e}");
    }
}
