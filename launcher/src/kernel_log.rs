//! The kernel log as evidence of why a rank died: the OOM killer's "Killed process PID" lines,
//! NVIDIA's Xid lines and ECC/machine-check errors. Read from `/dev/kmsg` (what `dmesg` reads:
//! one record per `read`, each with a sequence number, so the launcher reads only what came
//! after a mark it took when the attempt started); unreadable without privilege on most
//! systems (`kernel.dmesg_restrict`), which is an answer too. Parsers accept both `/dev/kmsg`
//! records and `dmesg`'s `[seconds] message` lines.
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// The kernel log's device.
pub const KMSG: &str = "/dev/kmsg";
/// Records read at most (the kernel's ring holds far fewer).
const MAX_RECORDS: usize = 200_000;

/// Xid codes that mean the GPU or its memory failed, not the program (NVIDIA's Xid catalogue:
/// 48 double-bit ECC, 61/62 internal micro-controller, 63/64 ECC page retirement or row
/// remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained
/// and uncontained ECC, 119/120 GSP, 140 unrecovered ECC).
pub const HARDWARE_XIDS: &[u32] = &[48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140];

/// What a kernel log line says, of what tchrun looks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum KernelEvent {
    /// The OOM killer killed a process: its pid, name and resident memory at that moment;
    /// `cgroup` when a memory cgroup's limit was reached (else the node ran out).
    OomKill {
        pid: u32,
        name: String,
        rss_kib: Option<u64>,
        cgroup: bool,
        line: String,
    },
    /// A hardware error: an NVIDIA Xid of `HARDWARE_XIDS`, an uncorrectable ECC error, a
    /// machine check.
    Hardware {
        /// The GPU's PCI address for an Xid.
        device: Option<String>,
        line: String,
    },
}

/// The message of a `/dev/kmsg` record (`6,1234,5678901,-;message`) or a `dmesg` line
/// (`[ 123.456] message`); other text unchanged.
pub fn message(record: &str) -> &str {
    let first = record.lines().next().unwrap_or("");
    if let Some((head, msg)) = first.split_once(';') {
        if head.split(',').count() >= 3 && head.split(',').all(|f| !f.is_empty()) {
            return msg;
        }
    }
    let t = first.trim_start();
    if let Some(rest) = t.strip_prefix('[') {
        if let Some((_, msg)) = rest.split_once("] ") {
            return msg;
        }
    }
    first
}

/// The sequence number of a `/dev/kmsg` record.
pub fn sequence(record: &str) -> Option<u64> {
    record.split(',').nth(1)?.parse().ok()
}

/// What one kernel log line says (`None`: nothing tchrun looks for).
pub fn parse(line: &str) -> Option<KernelEvent> {
    let m = message(line).trim();
    if let Some(at) = m.find("Killed process ") {
        // "Memory cgroup out of memory: Killed process 4242 (tchrun-worker) total-vm:...kB,
        // anon-rss:3145728kB, file-rss:...kB, shmem-rss:0kB, UID:0 pgtables:...kB oom_score_adj:0"
        let rest = &m[at + "Killed process ".len()..];
        let (pid, rest) = rest.split_once(' ')?;
        let pid: u32 = pid.parse().ok()?;
        let name = rest
            .strip_prefix('(')
            .and_then(|r| r.split_once(')'))
            .map(|(n, _)| n.to_string())
            .unwrap_or_default();
        let kib = |key: &str| -> Option<u64> {
            let v = rest.split(key).nth(1)?;
            v.split("kB").next()?.trim().parse().ok()
        };
        let rss_kib = match (kib("anon-rss:"), kib("file-rss:"), kib("shmem-rss:")) {
            (Some(a), f, s) => Some(a + f.unwrap_or(0) + s.unwrap_or(0)),
            _ => None,
        };
        return Some(KernelEvent::OomKill {
            pid,
            name,
            rss_kib,
            cgroup: m.starts_with("Memory cgroup out of memory"),
            line: m.to_string(),
        });
    }
    if let Some(at) = m.find("NVRM: Xid (") {
        // "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
        let rest = &m[at + "NVRM: Xid (".len()..];
        let (device, rest) = rest.split_once("):")?;
        let code: u32 = rest.trim_start().split(',').next()?.trim().parse().ok()?;
        return HARDWARE_XIDS
            .contains(&code)
            .then(|| KernelEvent::Hardware {
                device: Some(device.to_string()),
                line: m.to_string(),
            });
    }
    let ecc = m.starts_with("EDAC ") && (m.contains(" UE ") || m.contains("Uncorrected"));
    if ecc || m.contains("[Hardware Error]") && m.contains("Machine check") {
        return Some(KernelEvent::Hardware {
            device: None,
            line: m.to_string(),
        });
    }
    None
}

/// The kernel log's records with a sequence number above `after` (all with `None`): an error
/// when it cannot be read (no privilege, no `/dev/kmsg`).
pub fn read_after(after: Option<u64>) -> std::io::Result<Vec<(u64, String)>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(KMSG)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    while out.len() < MAX_RECORDS {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
                if let Some(seq) = sequence(&rec) {
                    let newer = match after {
                        Some(a) => seq > a,
                        None => true,
                    };
                    if newer {
                        out.push((seq, rec));
                    }
                }
            }
            // EPIPE: records were overwritten while reading; the next read goes on.
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The newest record's sequence number now (the mark an attempt reads after).
pub fn mark() -> Option<u64> {
    read_after(None).ok()?.last().map(|(s, _)| *s)
}

/// The events of the kernel log after `mark`, or why it could not be read.
pub fn events_after(mark: Option<u64>) -> Result<Vec<KernelEvent>, String> {
    match read_after(mark) {
        Ok(records) => Ok(records.iter().filter_map(|(_, r)| parse(r)).collect()),
        Err(e) => Err(format!("{KMSG}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_killer_lines_give_the_pid_and_its_memory() {
        // A memory cgroup's limit (Linux 6.x, as `dmesg` prints it).
        let cg = "[20310.123456] Memory cgroup out of memory: Killed process 4242 (tchrun-worker) \
                  total-vm:5242880kB, anon-rss:3072000kB, file-rss:51200kB, shmem-rss:0kB, \
                  UID:0 pgtables:6500kB oom_score_adj:0";
        match parse(cg) {
            Some(KernelEvent::OomKill {
                pid,
                name,
                rss_kib,
                cgroup,
                ..
            }) => {
                assert_eq!((pid, name.as_str(), cgroup), (4242, "tchrun-worker", true));
                assert_eq!(rss_kib, Some(3072000 + 51200));
            }
            other => panic!("{other:?}"),
        }
        // The node ran out, as a `/dev/kmsg` record (Linux 4.x wording without shmem).
        let node = "3,8812,20310123456,-;Out of memory: Killed process 77 (python) \
                    total-vm:100kB, anon-rss:64kB, file-rss:0kB";
        match parse(node) {
            Some(KernelEvent::OomKill {
                pid,
                rss_kib,
                cgroup,
                ..
            }) => assert_eq!((pid, rss_kib, cgroup), (77, Some(64), false)),
            other => panic!("{other:?}"),
        }
        assert_eq!(sequence(node), Some(8812));
        assert_eq!(
            parse("[1.0] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null)"),
            None
        );
    }

    #[test]
    fn hardware_xids_and_uncorrectable_ecc_are_hardware_others_not() {
        let fell = "[ 8123.9] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.";
        assert_eq!(
            parse(fell),
            Some(KernelEvent::Hardware {
                device: Some("PCI:0000:3b:00".into()),
                line: message(fell).to_string()
            })
        );
        let dbe = "4,1001,99,-;NVRM: Xid (PCI:0000:00:1e): 48, pid=2211, name=tchrun-worker, \
                   An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 1.";
        assert!(matches!(parse(dbe), Some(KernelEvent::Hardware { .. })));
        // Xid 13 and 31 are the program's own faults (an illegal address): not the host's.
        let app = "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python, Ch 00000008, intr 10000000. MMU Fault";
        assert_eq!(parse(app), None);
        let ue = "[ 77.1] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x12345 offset:0x0 grain:32)";
        assert!(matches!(
            parse(ue),
            Some(KernelEvent::Hardware { device: None, .. })
        ));
        let ce = "[ 77.1] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0";
        assert_eq!(parse(ce), None, "a corrected error is not a failure");
        let mce = "[ 90.0] mce: [Hardware Error]: Machine check events logged";
        assert!(matches!(parse(mce), Some(KernelEvent::Hardware { .. })));
    }

    #[test]
    fn messages_come_out_of_both_formats() {
        assert_eq!(message("6,1,2,-;hello; world"), "hello; world");
        assert_eq!(message("[    1.000000] hello"), "hello");
        assert_eq!(message("plain"), "plain");
        assert_eq!(message("6,1,2,-;first\n SUBSYSTEM=pci"), "first");
    }
}
