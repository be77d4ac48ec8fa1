//! The CPU other processes of this host keep busy now, from `/proc/PID/stat` at both ends of a
//! short window: what the oversubscription warning measures (not the load average, whose
//! minute-long memory still holds a build that just finished). Knows only the names of the
//! job's own processes, which it leaves out.

/// Processes whose CPU is the job's own, not another user's load: tchrun, its ranks and the
/// launchers that start them (`/proc/PID/comm`, 15 characters at most).
const JOB_PROCESSES: &[&str] = &[
    "tchrun",
    "tchrun-worker",
    "mpirun",
    "orterun",
    "orted",
    "prterun",
    "prted",
    "srun",
    "slurmstepd",
];

/// How many cores the other processes of this host keep busy now: their CPU time over
/// `window` (every process but this one and the job's own, `JOB_PROCESSES`; read from
/// `/proc/PID/stat` at both ends of the window) divided by the window. Not the load average:
/// its minute-long memory still holds a build that just finished. `None` where `/proc` cannot
/// be read.
pub fn busy_cores(window: std::time::Duration) -> Option<f64> {
    let before = cpu_ticks_of_others()?;
    let start = std::time::Instant::now();
    std::thread::sleep(window);
    let after = cpu_ticks_of_others()?;
    let secs = start.elapsed().as_secs_f64();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|hz| *hz > 0)?;
    if secs <= 0.0 {
        return None;
    }
    let ticks: u64 = after
        .iter()
        .filter_map(|(pid, t)| before.get(pid).map(|b| t.saturating_sub(*b)))
        .sum();
    Some(ticks as f64 / hz as f64 / secs)
}

/// Every other process's user + system CPU ticks, by pid.
fn cpu_ticks_of_others() -> Option<std::collections::HashMap<u32, u64>> {
    let me = std::process::id();
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "PID (comm) state ppid ...": utime and stime are the 12th and 13th fields after
        // the comm's closing parenthesis (the comm may hold spaces and parentheses).
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |x| x.1);
        if JOB_PROCESSES.contains(&comm) {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(u), Some(s)) = (f.get(11), f.get(12)) else {
            continue;
        };
        if let (Ok(u), Ok(s)) = (u.parse::<u64>(), s.parse::<u64>()) {
            out.insert(pid, u + s);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that spins on a core is counted (while tchrun's own processes are not).
    #[test]
    fn busy_cores_sees_a_process_spinning_now() {
        let mut spin = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("sh");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let busy = busy_cores(std::time::Duration::from_millis(500));
        let _ = spin.kill();
        let _ = spin.wait();
        let busy = busy.expect("/proc");
        assert!(busy >= 0.6, "{busy}");
    }
}
