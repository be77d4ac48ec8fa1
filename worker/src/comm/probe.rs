//! The reachability probe before the store exists: rank 0 listens on each address it offers;
//! every rank connects to each, all at once, within `BUDGET`. Only sockets: the exchange of
//! offers and results is MPI's, in `bootstrap`.
use crate::comm::netif::Candidate;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a rank tries to reach rank 0's addresses, all of them together.
pub const BUDGET: Duration = Duration::from_secs(3);
/// The most addresses rank 0 offers (one bit each in the gathered results).
pub const MAX_CANDIDATES: usize = 32;
/// The longest a probe listener stays open (the job gathers the results well before).
const LISTEN_MAX: Duration = Duration::from_secs(120);

/// Rank 0's open probe listeners; dropping them closes them.
pub struct Listening {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Opens a listener on a free port of each candidate (those that cannot be bound are left
/// out, with the reason) and accepts (and drops) connections until dropped.
pub fn listen(cands: &[Candidate]) -> (Vec<(Candidate, u16)>, Vec<(Candidate, String)>, Listening) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut open = Vec::new();
    let mut failed = Vec::new();
    let mut threads = Vec::new();
    for c in cands.iter().take(MAX_CANDIDATES) {
        let bound = TcpListener::bind((c.addr.as_str(), 0)).and_then(|l| {
            l.set_nonblocking(true)?;
            let port = l.local_addr()?.port();
            Ok((l, port))
        });
        let (l, port) = match bound {
            Ok(b) => b,
            Err(e) => {
                failed.push((c.clone(), e.to_string()));
                continue;
            }
        };
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < LISTEN_MAX {
                match l.accept() {
                    Ok((s, _)) => drop(s),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
        open.push((c.clone(), port));
    }
    (open, failed, Listening { stop, threads })
}

/// Connects to every `(address, port)` at once; each result within `BUDGET`: `Ok` when it
/// connected, else why not.
pub fn reach(targets: &[(String, u16)]) -> Vec<Result<(), String>> {
    let threads: Vec<_> = targets
        .iter()
        .take(MAX_CANDIDATES)
        .cloned()
        .map(|(addr, port)| {
            std::thread::spawn(move || -> Result<(), String> {
                let sa = (addr.as_str(), port)
                    .to_socket_addrs()
                    .map_err(|e| e.to_string())?
                    .next()
                    .ok_or_else(|| "no address".to_string())?;
                TcpStream::connect_timeout(&sa, BUDGET)
                    .map(drop)
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                            format!("no answer within {} s", BUDGET.as_secs())
                        }
                        _ => e.to_string(),
                    })
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap_or_else(|_| Err("the probe thread panicked".into()))
        })
        .collect()
}

/// Every rank's message when no address of rank 0 was reached by all: each rank that missed
/// one, with its host; what was tried; this rank's own reasons; the fix.
pub(crate) fn unreachable_message(
    cands: &[Candidate],
    ranks: &[(u64, String)],
    ifaces0: &str,
    forced: &str,
    mine: &[String],
) -> String {
    let host0 = ranks
        .first()
        .map(|r| r.1.as_str())
        .unwrap_or("rank 0's host");
    let all = if cands.len() >= 64 {
        u64::MAX
    } else {
        (1u64 << cands.len()) - 1
    };
    let tried = if cands.is_empty() {
        "it offered no address".to_string()
    } else {
        let list: Vec<String> = cands
            .iter()
            .map(|c| format!("{} ({})", c.addr, c.iface))
            .collect();
        format!("tried {}", list.join(", "))
    };
    let chosen_by = if forced.is_empty() {
        String::new()
    } else {
        format!(", chosen by {forced}")
    };
    const SHOWN: usize = 8;
    let failing: Vec<String> = ranks
        .iter()
        .enumerate()
        .filter(|(_, (m, _))| m & all != all)
        .map(|(r, (m, host))| {
            let got: Vec<&str> = cands
                .iter()
                .enumerate()
                .filter(|(i, _)| m & (1u64 << i) != 0)
                .map(|(_, c)| c.addr.as_str())
                .collect();
            match got.as_slice() {
                [] => format!("rank {r} ({host}) reached none"),
                g => format!("rank {r} ({host}) reached only {}", g.join(", ")),
            }
        })
        .collect();
    let more = failing.len().saturating_sub(SHOWN);
    let mut named = failing
        .into_iter()
        .take(SHOWN)
        .collect::<Vec<_>>()
        .join("; ");
    if more > 0 {
        named.push_str(&format!("; and {more} more"));
    }
    let this = if mine.is_empty() {
        String::new()
    } else {
        format!(" [this rank: {}]", mine.join("; "))
    };
    let fix = if forced.starts_with("--ifname") {
        format!("pass --ifname (or TCHRUN_IFNAME) naming another interface of {host0} that every node reaches, or leave it out")
    } else if let Some((var, _)) = forced.split_once('=') {
        format!("set {var} to an interface (or address) of {host0} that every node reaches, or unset it")
    } else {
        format!(
            "pass --ifname NAME (or set TCHRUN_IFNAME) naming the interface of {host0} on the network every node \
             reaches (for a program of your own: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME), and check firewalls"
        )
    };
    format!(
        "no address of rank 0 ({host0}) was reached by every rank within {} s: {tried}{chosen_by}; \
         {named}{this}; {host0}'s interfaces: {ifaces0}; fix: {fix}",
        BUDGET.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_reached_and_a_closed_port_is_not() {
        let c = Candidate {
            addr: "127.0.0.1".into(),
            iface: "lo".into(),
        };
        let (open, failed, l) = listen(&[c]);
        assert!(failed.is_empty());
        let port = open[0].1;
        let r = reach(&[("127.0.0.1".into(), port)]);
        assert!(r[0].is_ok(), "{r:?}");
        drop(l);
        let r = reach(&[("127.0.0.1".into(), port)]);
        assert!(r[0].is_err(), "{r:?}");
    }
}
