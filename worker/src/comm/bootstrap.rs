//! Who am I and where is rank 0: the only module that touches MPI. Decides how the process was
//! started (before MPI_Init, which aborts under `srun --mpi=none`), then under MPI: rank, size
//! and node-local rank from MPI; rank 0 serves a TCPStore on a free port and broadcasts its
//! address, after a probe (`probe`) that every rank reaches it: rank 0 offers all its candidate
//! addresses (`netif`) and the first one every rank reached is used. Without MPI: the same
//! from torchrun's or Slurm's variables, no probe. Returns plain data.
use crate::comm::mpi::{Comm, MpiError, Universe};
use crate::comm::netif::{self, Candidate, GlooDevice, Network, NoSuchInterface};
use crate::comm::pg::{C10dError, Store};
use crate::comm::probe;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::Duration;
use tchrun::driver_log::BOOTSTRAP_PREFIX;
use tchrun::env::{self as contract, EnvError, StartedBy};

/// Where this rank sits: known before any store exists (so the driver log can be opened
/// first), and part of every joined rank's `RankInfo`.
#[derive(Debug, Clone)]
pub struct Place {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub node_rank: usize,
    pub host: String,
    pub started_by: StartedBy,
}

/// Where this rank sits and how it reaches rank 0.
#[derive(Debug, Clone)]
pub struct RankInfo {
    pub place: Place,
    pub master_addr: String,
    pub master_port: u16,
    /// The address of this rank on the network that reaches rank 0.
    pub local_addr: String,
    /// What this rank's Gloo device binds.
    pub gloo: GlooDevice,
    /// How rank 0's address was chosen (`bootstrap: ...`, the driver log's and `ranks.json`'s).
    pub bootstrap: String,
}

/// Bootstrapping failed: the rank cannot join the job.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Store(#[from] C10dError),
    #[error(transparent)]
    Mpi(#[from] MpiError),
    /// A user's interface setting names no interface of this host (exit 3).
    #[error(transparent)]
    Interface(#[from] NoSuchInterface),
    /// No address of rank 0 was reached by every rank (exit 3).
    #[error("{0}")]
    Unreachable(String),
    #[error("cannot find this rank's address towards {master}: {source}")]
    Route {
        master: String,
        source: std::io::Error,
    },
}

impl BootstrapError {
    /// Whether this is the network's fault (exit 3: the launch failed), not the rank's.
    pub fn is_network(&self) -> bool {
        matches!(
            self,
            BootstrapError::Interface(_) | BootstrapError::Unreachable(_)
        )
    }
}

/// A joined rank: its place, the store every group is built on, and the MPI universe (held
/// for the whole run; dropping it finalizes MPI).
pub struct Joined {
    pub info: RankInfo,
    pub store: Store,
    pub universe: Option<Universe>,
}

fn hostname() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".into())
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<IpAddr>()
            .map(|a| a.is_loopback())
            .unwrap_or(false)
}

/// This host's address on the route to `master` (a UDP connect sends nothing).
fn local_addr_towards(master: &str, port: u16) -> Result<String, BootstrapError> {
    if is_loopback(master) {
        return Ok("127.0.0.1".into());
    }
    let route = || -> std::io::Result<String> {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        s.connect((master, port))?;
        Ok(s.local_addr()?.ip().to_string())
    };
    route().map_err(|source| BootstrapError::Route {
        master: master.into(),
        source,
    })
}

/// Who this rank is, before it joins the store.
pub struct Identity {
    pub place: Place,
    /// Rank 0's store address when the environment names it (torchrun, Slurm, single).
    master: Option<(String, u16)>,
    universe: Option<Universe>,
    /// This host's interfaces and the user's settings (`check_network`).
    net: Network,
}

/// Learns rank, world size and local rank however the process was started.
pub fn identify() -> Result<Identity, BootstrapError> {
    let get = |k: &str| std::env::var(k).ok();
    let started_by = contract::started_by(&get);
    let host = hostname();
    let env = match started_by {
        StartedBy::Mpi => return identify_mpi(host),
        StartedBy::Torchrun => contract::from_torchrun(&get)?,
        StartedBy::Slurm => contract::from_slurm(&get)?,
        StartedBy::Single => contract::RankEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_size: 1,
            node_rank: 0,
            master_addr: Some("127.0.0.1".into()),
            master_port: Some(0),
        },
    };
    let master = Some((
        env.master_addr
            .clone()
            .unwrap_or_else(|| "127.0.0.1".into()),
        env.master_port.unwrap_or(0),
    ));
    Ok(Identity {
        place: Place {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            local_size: env.local_size,
            node_rank: env.node_rank,
            host,
            started_by,
        },
        master,
        universe: None,
        net: Network::unchecked(),
    })
}

fn identify_mpi(host: String) -> Result<Identity, BootstrapError> {
    let universe = Universe::initialize()?;
    let world = universe.world();
    let rank = world.rank()?;
    let world_size = world.size()?;
    let node = world.split_shared(rank)?;
    let local_rank = node.rank()?;
    let local_size = node.size()?;
    // Node index: how many node leaders (local rank 0) come before this node's leader.
    let mut leader_flags = vec![0u8; world_size];
    world.all_gather(&[u8::from(local_rank == 0)], &mut leader_flags)?;
    let mut first_rank_on_node = (rank as u64).to_le_bytes();
    node.broadcast(0, &mut first_rank_on_node)?;
    let first_rank_on_node = (u64::from_le_bytes(first_rank_on_node) as usize).min(world_size);
    let node_rank = leader_flags[..first_rank_on_node]
        .iter()
        .filter(|&&f| f == 1)
        .count();
    drop(node);
    drop(world);
    Ok(Identity {
        place: Place {
            rank,
            world_size,
            local_rank,
            local_size,
            node_rank,
            host,
            started_by: StartedBy::Mpi,
        },
        master: None,
        universe: Some(universe),
        net: Network::unchecked(),
    })
}

impl Identity {
    /// Reads and checks the user's interface settings on this host (`--ifname`, and
    /// `GLOO_SOCKET_IFNAME`/`NCCL_SOCKET_IFNAME` for the backends the rank uses): a name that
    /// is no interface here is refused now, before anything waits on a peer.
    pub fn check_network(
        &mut self,
        ifname: Option<&str>,
        gloo: bool,
        nccl: bool,
    ) -> Result<(), BootstrapError> {
        self.net = Network::check(&self.place.host, ifname, gloo, nccl)?;
        Ok(())
    }

    /// Under MPI: rank 0 offers its addresses, every rank probes them, rank 0 serves on the
    /// first one every rank reached (a free port) and every rank learns it. Otherwise the
    /// environment's. `serve` runs on rank 0 with the chosen address and port and returns
    /// the port actually used; a failure there reaches every rank. Also returns how the
    /// address was chosen.
    fn agree_on_master<T>(
        &self,
        serve: impl FnOnce(&str, u16) -> Result<(T, u16), BootstrapError>,
    ) -> Result<(String, u16, Option<T>, String), BootstrapError> {
        let Some(universe) = &self.universe else {
            let (addr, port) = self
                .master
                .clone()
                .unwrap_or_else(|| ("127.0.0.1".into(), 0));
            let how = match self.place.started_by {
                StartedBy::Single => format!("{BOOTSTRAP_PREFIX}{addr} (one rank)"),
                by => format!("{BOOTSTRAP_PREFIX}{addr} from the environment ({by:?}), not probed"),
            };
            if self.place.rank == 0 {
                let (v, actual) = serve(&addr, port)?;
                return Ok((addr, actual, Some(v), how));
            }
            return Ok((addr, port, None, how));
        };
        let world = universe.world();
        let chosen = self.probe_master(&world)?;
        let mut buf = [0u8; 256];
        let mut served = None;
        let mut failure = None;
        if self.place.rank == 0 {
            match serve(&chosen.0, 0) {
                Ok((v, port)) => {
                    let text = format!("{} {port}", chosen.0);
                    let n = text.len().min(buf.len() - 1);
                    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
                    served = Some(v);
                }
                Err(e) => failure = Some(e),
            }
        }
        world.broadcast(0, &mut buf)?;
        if let Some(e) = failure {
            return Err(e);
        }
        let text = String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string();
        match text
            .rsplit_once(' ')
            .and_then(|(a, p)| p.parse::<u16>().ok().map(|p| (a.to_string(), p)))
        {
            Some((addr, port)) => Ok((addr, port, served, chosen.1)),
            None => Err(BootstrapError::Store(C10dError {
                op: "TCPStore serve",
                message: "rank 0 could not start the store (see 70_driver_log_0)".into(),
            })),
        }
    }

    /// The probe (every rank, collectively): rank 0 broadcasts its interfaces, what forced
    /// them and the addresses it listens on; every rank tries each within `probe::BUDGET`;
    /// the results are all-gathered and the first address every rank reached is chosen (the
    /// same on every rank), with its `bootstrap: ...` line. None: every rank fails alike.
    fn probe_master(&self, world: &Comm<'_>) -> Result<(String, String), BootstrapError> {
        let place = &self.place;
        let mut offer = [0u8; 4096];
        let mut listening = None;
        if place.rank == 0 {
            let text = self.offer(&mut listening);
            let n = text.len().min(offer.len());
            offer[..n].copy_from_slice(&text.as_bytes()[..n]);
        }
        world.broadcast(0, &mut offer)?;
        let text = String::from_utf8_lossy(&offer)
            .trim_end_matches('\0')
            .to_string();
        let mut lines = text.lines();
        let ifaces0 = lines.next().unwrap_or("").to_string();
        let forced = lines.next().unwrap_or("").to_string();
        let cands: Vec<(Candidate, u16)> = lines
            .filter_map(|l| {
                let mut p = l.split(' ');
                let addr = p.next()?.to_string();
                let port = p.next()?.parse().ok()?;
                let iface = p.next().unwrap_or("?").to_string();
                Some((Candidate { addr, iface }, port))
            })
            .take(probe::MAX_CANDIDATES)
            .collect();
        let targets: Vec<_> = cands.iter().map(|(c, p)| (c.addr.clone(), *p)).collect();
        let results = probe::reach(&targets);
        let mask = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .fold(0u64, |m, (i, _)| m | (1u64 << i));
        const HOST_BYTES: usize = 64;
        let mut mine = [0u8; 8 + HOST_BYTES];
        mine[..8].copy_from_slice(&mask.to_le_bytes());
        let h = place.host.as_bytes();
        let n = h.len().min(HOST_BYTES);
        mine[8..8 + n].copy_from_slice(&h[..n]);
        let mut all = vec![0u8; mine.len() * place.world_size];
        world.all_gather(&mine, &mut all)?;
        drop(listening);
        let ranks: Vec<(u64, String)> = all
            .chunks(mine.len())
            .map(|c| {
                let mut m = [0u8; 8];
                m.copy_from_slice(&c[..8]);
                let host = String::from_utf8_lossy(&c[8..]);
                (
                    u64::from_le_bytes(m),
                    host.trim_end_matches('\0').to_string(),
                )
            })
            .collect();
        let cands: Vec<Candidate> = cands.into_iter().map(|(c, _)| c).collect();
        let reached_by_all = |i: usize| ranks.iter().all(|(m, _)| m & (1u64 << i) != 0);
        let Some(i) = (0..cands.len()).find(|&i| reached_by_all(i)) else {
            let mine: Vec<String> = cands
                .iter()
                .zip(&results)
                .filter_map(|(c, r)| r.as_ref().err().map(|e| format!("{}: {e}", c.addr)))
                .collect();
            return Err(BootstrapError::Unreachable(unreachable_message(
                &cands, &ranks, &ifaces0, &forced, &mine,
            )));
        };
        let c = &cands[i];
        let mut line = format!(
            "{BOOTSTRAP_PREFIX}{} ({}), reached by all {}",
            c.addr,
            c.iface,
            tchrun::counts::ranks(place.world_size)
        );
        if !forced.is_empty() {
            line.push_str(&format!(", chosen by {forced}"));
        }
        if i > 0 {
            let skipped: Vec<String> = cands[..i]
                .iter()
                .map(|c| format!("{} ({})", c.addr, c.iface))
                .collect();
            line.push_str(&format!(
                "; not reached by every rank: {}",
                skipped.join(", ")
            ));
        }
        Ok((c.addr.clone(), line))
    }

    /// Rank 0's offer: its interfaces, what forced the choice (or an empty line), then one
    /// `address port interface` line per open probe listener.
    fn offer(&self, listening: &mut Option<probe::Listening>) -> String {
        let one_host = self.place.local_size == self.place.world_size;
        let (cands, forced) = match std::env::var(tchrun::env::TCHRUN_MASTER_ADDR) {
            Ok(a) => (
                vec![Candidate {
                    iface: self.net.iface_of(&a).unwrap_or("?").to_string(),
                    addr: a.clone(),
                }],
                Some(format!("{}={a}", tchrun::env::TCHRUN_MASTER_ADDR)),
            ),
            Err(_) => (
                self.net.candidates(one_host),
                self.net.forced().map(|f| f.0),
            ),
        };
        let (open, failed, l) = probe::listen(&cands);
        *listening = Some(l);
        for (c, e) in failed {
            tracing::warn!(
                "cannot listen on {} ({}) for the probe: {e}",
                c.addr,
                c.iface
            );
        }
        let mut text = format!(
            "{}\n{}\n",
            netif::describe(&self.net.ifaces),
            forced.unwrap_or_default()
        );
        for (c, port) in open {
            let line = format!("{} {port} {}\n", c.addr, c.iface);
            if text.len() + line.len() < 4096 {
                text.push_str(&line);
            }
        }
        text
    }

    /// Creates (rank 0) or connects to the TCPStore every process group is built on.
    pub fn join(self, timeout: Duration) -> Result<Joined, BootstrapError> {
        let world_size = self.place.world_size;
        let (master_addr, master_port, served, how) = self.agree_on_master(|addr, port| {
            let s = Store::serve(addr, port, world_size, timeout)?;
            let p = s.port();
            Ok((s, p))
        })?;
        let store = match served {
            Some(s) => s,
            None => Store::connect(&master_addr, master_port, timeout)?,
        };
        let info = self.info(master_addr, master_port, how)?;
        Ok(Joined {
            info,
            store,
            universe: self.universe,
        })
    }

    /// For `exec`: agree on rank 0's address and a free port for the program's own store,
    /// then finalize MPI (the program replaces this process).
    pub fn master_for_program(self) -> Result<RankInfo, BootstrapError> {
        let (master_addr, master_port, _, how) = self.agree_on_master(|_addr, port| {
            if port != 0 {
                return Ok(((), port));
            }
            let l = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|source| {
                BootstrapError::Route {
                    master: "0.0.0.0:0".into(),
                    source,
                }
            })?;
            let p = l
                .local_addr()
                .map_err(|source| BootstrapError::Route {
                    master: "0.0.0.0:0".into(),
                    source,
                })?
                .port();
            Ok(((), p))
        })?;
        self.info(master_addr, master_port, how)
    }

    /// This rank's side of the choice: its address towards rank 0, the interface that holds
    /// it (exported as `GLOO_SOCKET_IFNAME`/`NCCL_SOCKET_IFNAME` unless the user set them)
    /// and its Gloo device.
    fn info(
        &self,
        master_addr: String,
        master_port: u16,
        how: String,
    ) -> Result<RankInfo, BootstrapError> {
        let local_addr = local_addr_towards(&master_addr, master_port)?;
        let iface = self.net.iface_of(&local_addr).map(str::to_string);
        self.net.export(iface.as_deref());
        let gloo = self.net.gloo_device(&local_addr);
        let bootstrap = format!(
            "{how}; this rank: {local_addr} ({}), Gloo binds {gloo}",
            iface.as_deref().unwrap_or("?")
        );
        Ok(RankInfo {
            place: self.place.clone(),
            master_addr,
            master_port,
            local_addr,
            gloo,
            bootstrap,
        })
    }
}

/// Every rank's message when no address of rank 0 was reached by all: each rank that missed
/// one, with its host; what was tried; this rank's own reasons; the fix.
fn unreachable_message(
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
        probe::BUDGET.as_secs()
    )
}
