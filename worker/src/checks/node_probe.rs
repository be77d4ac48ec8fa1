//! What `tchrun-worker doctor` finds on its own node, without the other ranks: the paths it
//! must see and write, free disk and memory, the GPUs (torch's count, `nvidia-smi`'s driver
//! and health when it is there).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tchrun::doctor::{DoctorChecks, GpuHealth, Gpus, PathCheck};

/// How long `nvidia-smi` may take before its answer is given up.
const SMI_LIMIT: Duration = Duration::from_secs(15);

/// The `--data` paths (visible and readable) and the `--output` (created when missing, a file
/// created and removed in it).
pub fn paths(c: &DoctorChecks) -> Vec<PathCheck> {
    let mut out: Vec<PathCheck> = c.data.iter().map(|d| data_path(d)).collect();
    if let Some(o) = &c.output {
        out.push(output_path(o));
    }
    out
}

fn data_path(d: &Path) -> PathCheck {
    let error = match std::fs::metadata(d) {
        Ok(m) if m.is_dir() => std::fs::read_dir(d)
            .err()
            .map(|e| format!("cannot list it here: {e}")),
        Ok(_) => std::fs::File::open(d)
            .err()
            .map(|e| format!("cannot open it here: {e}")),
        Err(e) => Some(format!("not visible here: {e}")),
    };
    PathCheck {
        flag: "--data".into(),
        path: d.to_path_buf(),
        visible: error.is_none(),
        writable: None,
        error,
    }
}

fn output_path(o: &Path) -> PathCheck {
    let mut check = PathCheck {
        flag: "--output".into(),
        path: o.to_path_buf(),
        visible: false,
        writable: Some(false),
        error: None,
    };
    if o.exists() && !o.is_dir() {
        check.error = Some("exists and is not a directory".into());
        return check;
    }
    if let Err(e) = std::fs::create_dir_all(o) {
        check.error = Some(format!("cannot create it here: {e}"));
        return check;
    }
    check.visible = true;
    let probe = o.join(format!(".tchrun-doctor-write-{}", std::process::id()));
    match std::fs::write(&probe, b"tchrun doctor\n") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            check.writable = Some(true);
        }
        Err(e) => check.error = Some(format!("not writable here: {e}")),
    }
    check
}

/// The directory of the shared-file-system test: a usable `--output`, else the log directory.
pub fn shared_dir(checks: &[PathCheck], log_dir: &Path) -> PathBuf {
    checks
        .iter()
        .find(|c| c.flag == "--output" && c.writable == Some(true))
        .map_or_else(|| log_dir.to_path_buf(), |c| c.path.clone())
}

/// `MemAvailable`, in bytes.
pub fn memory_available() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The node's GPUs: torch's count (`cuda_count`), and when `nvidia-smi` is on PATH, the
/// driver and each GPU's health; a note says what was skipped and why.
pub fn gpus(cuda_count: usize) -> Gpus {
    let mut g = Gpus {
        count: cuda_count,
        ..Gpus::default()
    };
    let Some(smi) = on_path("nvidia-smi") else {
        g.note = Some(if cuda_count == 0 {
            "no GPU and no nvidia-smi on this node: GPU checks skipped".into()
        } else {
            "nvidia-smi is not on PATH: GPU health (ECC, retired pages, throttling) not checked"
                .into()
        });
        return g;
    };
    let query = "--query-gpu=index,name,driver_version,ecc.errors.uncorrected.volatile.total,\
                 retired_pages.pending,clocks_throttle_reasons.active";
    match run_bounded(&smi, &[query, "--format=csv,noheader,nounits"]) {
        Ok(text) => {
            let (driver, health) = parse_smi(&text);
            g.driver = driver;
            g.health = health;
            if g.health.is_empty() && cuda_count == 0 {
                g.note =
                    Some("no GPU on this node (nvidia-smi lists none): GPU checks skipped".into());
            }
        }
        Err(e) => {
            g.note = Some(format!(
                "{} failed: {e}; GPU health not checked",
                smi.display()
            ))
        }
    }
    g
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| tchrun::files::is_executable(p))
}

/// A command's stdout, or why not, within `SMI_LIMIT`.
fn run_bounded(program: &Path, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > SMI_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", SMI_LIMIT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "{} ({})",
            out.status,
            err.lines()
                .chain(text.lines())
                .next()
                .unwrap_or("no output")
        ))
    }
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The GPUs of `nvidia-smi --query-gpu=index,name,driver_version,ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks_throttle_reasons.active --format=csv,noheader,nounits`.
pub fn parse_smi(text: &str) -> (Option<String>, Vec<GpuHealth>) {
    let mut driver = None;
    let mut gpus = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some(index) = f.first().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        if driver.is_none() {
            driver = f.get(2).map(|s| s.to_string());
        }
        let throttle = f.get(5).and_then(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).ok()
        });
        gpus.push(GpuHealth {
            index,
            name: f.get(1).unwrap_or(&"").to_string(),
            ecc_uncorrected: num(3),
            retired_pending: f
                .get(4)
                .and_then(|s| match s.to_ascii_lowercase().as_str() {
                    "yes" => Some(true),
                    "no" => Some(false),
                    _ => None,
                }),
            // Bit 0 is "GPU idle": not a throttle.
            throttle_reasons: throttle.map(|t| t & !1),
        });
    }
    (driver, gpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun::doctor::gpu_problems;

    #[test]
    fn meminfo_and_smi_are_read() {
        let m = "MemTotal: 100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(m), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let smi = "0, NVIDIA H200, 550.54.15, 0, No, 0x0000000000000001\n\
                   1, NVIDIA H200, 550.54.15, 3, Yes, 0x0000000000000004\n";
        let (driver, gpus) = parse_smi(smi);
        assert_eq!(driver.as_deref(), Some("550.54.15"));
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].throttle_reasons, Some(0));
        assert!(gpu_problems(&gpus[0]).is_empty());
        let p = gpu_problems(&gpus[1]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("GPU 1 has 3 uncorrected ECC"), "{p:?}");
        let (_, na) = parse_smi("0, T4, 535.1, [N/A], [N/A], [N/A]\n");
        assert_eq!(na[0].ecc_uncorrected, None);
        assert!(gpu_problems(&na[0]).is_empty());
    }
}
