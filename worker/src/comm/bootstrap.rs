//! Who am I and where is rank 0: the only module that touches MPI. Decides how the process was
//! started (before MPI_Init, which aborts under `srun --mpi=none`), then under MPI: rank, size
//! and node-local rank from MPI; rank 0 serves a TCPStore on a free port and broadcasts its
//! address. Without MPI: the same from torchrun's or Slurm's variables. Returns plain data.
use crate::comm::pg::{C10dError, Store};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::Duration;
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
    /// The address of this rank on the network that reaches rank 0 (Gloo binds it).
    pub local_addr: String,
}

/// Bootstrapping failed: the rank cannot join the job.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Store(#[from] C10dError),
    #[error(
        "MPI could not be initialized (was this process started by mpirun or srun --mpi=pmix?)"
    )]
    MpiInit,
    #[error("cannot find this rank's address towards {master}: {source}")]
    Route {
        master: String,
        source: std::io::Error,
    },
}

/// A joined rank: its place, the store every group is built on, and the MPI universe (held
/// for the whole run; dropping it finalizes MPI).
pub struct Joined {
    pub info: RankInfo,
    pub store: Store,
    pub universe: Option<mpi::environment::Universe>,
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

/// Rank 0's address for a multi-node job: `TCHRUN_MASTER_ADDR`, else the first non-loopback
/// IPv4 address of this host.
fn advertised_addr() -> String {
    if let Ok(a) = std::env::var(tchrun::env::TCHRUN_MASTER_ADDR) {
        return a;
    }
    nix::ifaddrs::getifaddrs()
        .ok()
        .and_then(|addrs| {
            addrs
                .filter_map(|i| i.address.and_then(|a| a.as_sockaddr_in().map(|s| s.ip())))
                .find(|ip| !ip.is_loopback())
                .map(|ip| ip.to_string())
        })
        .unwrap_or_else(hostname)
}

/// Who this rank is, before it joins the store.
pub struct Identity {
    pub place: Place,
    /// Rank 0's store address when the environment names it (torchrun, Slurm, single).
    master: Option<(String, u16)>,
    universe: Option<mpi::environment::Universe>,
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
    })
}

fn identify_mpi(host: String) -> Result<Identity, BootstrapError> {
    use mpi::traits::*;
    let universe = mpi::initialize().ok_or(BootstrapError::MpiInit)?;
    let world = universe.world();
    let rank = world.rank() as usize;
    let world_size = world.size() as usize;
    let node = world.split_shared(world.rank());
    let local_rank = node.rank() as usize;
    let local_size = node.size() as usize;
    // Node index: how many node leaders (local rank 0) come before this node's leader.
    let mut leader_flags = vec![0i32; world_size];
    world.all_gather_into(
        &(if local_rank == 0 { 1i32 } else { 0 }),
        &mut leader_flags[..],
    );
    let mut first_rank_on_node = rank as i32;
    node.process_at_rank(0)
        .broadcast_into(&mut first_rank_on_node);
    let node_rank = leader_flags[..first_rank_on_node as usize]
        .iter()
        .filter(|&&f| f == 1)
        .count();
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
    })
}

impl Identity {
    /// Under MPI: rank 0 picks a free port (and its address) and every rank learns them.
    /// Otherwise the environment's. `serve` runs on rank 0 with the chosen address and port
    /// and returns the port actually used; a failure there reaches every rank.
    fn agree_on_master<T>(
        &self,
        serve: impl FnOnce(&str, u16) -> Result<(T, u16), BootstrapError>,
    ) -> Result<(String, u16, Option<T>), BootstrapError> {
        use mpi::traits::*;
        let Some(universe) = &self.universe else {
            let (addr, port) = self
                .master
                .clone()
                .unwrap_or_else(|| ("127.0.0.1".into(), 0));
            if self.place.rank == 0 {
                let (v, actual) = serve(&addr, port)?;
                return Ok((addr, actual, Some(v)));
            }
            return Ok((addr, port, None));
        };
        let world = universe.world();
        let mut buf = [0u8; 256];
        let mut served = None;
        let mut failure = None;
        if self.place.rank == 0 {
            let addr = if self.place.local_size == self.place.world_size {
                std::env::var(tchrun::env::TCHRUN_MASTER_ADDR)
                    .unwrap_or_else(|_| "127.0.0.1".into())
            } else {
                advertised_addr()
            };
            match serve(&addr, 0) {
                Ok((v, port)) => {
                    let text = format!("{addr} {port}");
                    let n = text.len().min(buf.len() - 1);
                    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
                    served = Some(v);
                }
                Err(e) => failure = Some(e),
            }
        }
        world.process_at_rank(0).broadcast_into(&mut buf[..]);
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
            Some((addr, port)) => Ok((addr, port, served)),
            None => Err(BootstrapError::Store(C10dError {
                op: "TCPStore serve",
                message: "rank 0 could not start the store (see 70_driver_log_0)".into(),
            })),
        }
    }

    /// Creates (rank 0) or connects to the TCPStore every process group is built on.
    pub fn join(self, timeout: Duration) -> Result<Joined, BootstrapError> {
        let world_size = self.place.world_size;
        let (master_addr, master_port, served) = self.agree_on_master(|addr, port| {
            let s = Store::serve(addr, port, world_size, timeout)?;
            let p = s.port();
            Ok((s, p))
        })?;
        let store = match served {
            Some(s) => s,
            None => Store::connect(&master_addr, master_port, timeout)?,
        };
        let local_addr = local_addr_towards(&master_addr, master_port)?;
        let info = self.info(master_addr, master_port, local_addr);
        Ok(Joined {
            info,
            store,
            universe: self.universe,
        })
    }

    /// For `exec`: agree on rank 0's address and a free port for the program's own store,
    /// then finalize MPI (the program replaces this process).
    pub fn master_for_program(self) -> Result<RankInfo, BootstrapError> {
        let (master_addr, master_port, _) = self.agree_on_master(|_addr, port| {
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
        let local_addr = local_addr_towards(&master_addr, master_port)?;
        Ok(self.info(master_addr, master_port, local_addr))
    }

    fn info(&self, master_addr: String, master_port: u16, local_addr: String) -> RankInfo {
        RankInfo {
            place: self.place.clone(),
            master_addr,
            master_port,
            local_addr,
        }
    }
}
