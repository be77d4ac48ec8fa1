//! This host's network interfaces (nix's `getifaddrs`) and what the user says about them:
//! `--ifname`/`TCHRUN_IFNAME`, `GLOO_SOCKET_IFNAME` and `NCCL_SOCKET_IFNAME`, each checked
//! against the interfaces that exist here before anything waits on a peer; the addresses rank 0
//! offers; the Gloo device a rank binds and the variables it sets for NCCL and for a program.
use std::net::Ipv4Addr;
use tchrun::env::{GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME};

/// One interface of this host with its IPv4 addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct Iface {
    pub name: String,
    pub v4: Vec<Ipv4Addr>,
    pub up: bool,
}

/// Every interface of this host, in the kernel's order (empty when they cannot be read).
pub fn interfaces() -> Vec<Iface> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<Iface> = Vec::new();
    for a in addrs {
        let ip = a
            .address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| Ipv4Addr::from(s.ip()));
        let up = a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
        let i = match out.iter().position(|i| i.name == a.interface_name) {
            Some(i) => i,
            None => {
                out.push(Iface {
                    name: a.interface_name.clone(),
                    v4: Vec::new(),
                    up,
                });
                out.len() - 1
            }
        };
        if let Some(ip) = ip {
            out[i].v4.push(ip);
        }
    }
    out
}

/// `lo 127.0.0.1, eth0 10.0.0.1, ib0 (no IPv4)`: interfaces as a message names them.
pub fn describe(ifaces: &[Iface]) -> String {
    ifaces
        .iter()
        .map(|i| match i.v4.as_slice() {
            [] => format!("{} (no IPv4)", i.name),
            v => format!(
                "{} {}",
                i.name,
                v.iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A user's interface setting names no interface of this host.
#[derive(Debug, thiserror::Error)]
#[error("{what}: no such network interface on {host} (its interfaces: {names}); {fix}")]
pub struct NoSuchInterface {
    pub what: String,
    pub host: String,
    pub names: String,
    pub fix: String,
}

/// Bridges and tunnels of containers and overlays: offered last.
fn is_virtual(name: &str) -> bool {
    [
        "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "vxlan", "tun", "tap", "lxc",
        "podman",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Whether NCCL's `NCCL_SOCKET_IFNAME` (`^` excludes, `=` exact, else prefixes) selects `name`.
pub fn nccl_selects(spec: &str, name: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest
        .split(',')
        .map(|e| e.split(':').next().unwrap_or("").trim())
        .filter(|e| !e.is_empty())
        .any(|e| {
            if exact {
                name == e
            } else {
                name.starts_with(e)
            }
        });
    hit != exclude
}

/// An address rank 0 offers, with the interface that holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub addr: String,
    pub iface: String,
}

/// What this rank's user said about interfaces, checked against this host's.
#[derive(Debug, Clone)]
pub struct Network {
    /// `--ifname`/`TCHRUN_IFNAME`.
    pub ifname: Option<String>,
    /// The user's `GLOO_SOCKET_IFNAME`, split at commas (when the rank uses Gloo).
    pub gloo_env: Option<Vec<String>>,
    /// The user's `NCCL_SOCKET_IFNAME` (when the rank uses NCCL).
    pub nccl_env: Option<String>,
    pub ifaces: Vec<Iface>,
}

fn user_var(name: &str) -> Option<String> {
    // PyTorch ignores a value of one character or less; so does this.
    std::env::var(name).ok().filter(|v| v.trim().len() > 1)
}

impl Network {
    /// This host's interfaces, nothing forced and no variable read (until `check`).
    pub fn unchecked() -> Network {
        Network {
            ifname: None,
            gloo_env: None,
            nccl_env: None,
            ifaces: interfaces(),
        }
    }

    /// Reads and checks the settings on this host: a name that is no interface here is refused
    /// at once. `gloo`/`nccl`: whether the rank (or its program) uses that backend.
    pub fn check(
        host: &str,
        ifname: Option<&str>,
        gloo: bool,
        nccl: bool,
    ) -> Result<Network, NoSuchInterface> {
        let ifaces = interfaces();
        let names = || {
            ifaces
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        // A name that differs from an interface's only in case ("LO", "Eth0") is named with
        // the interface it almost is: Linux's names are case-sensitive.
        let missing = |what: String, asked: &str, fix: &str| NoSuchInterface {
            what,
            host: host.to_string(),
            names: names(),
            fix: match ifaces.iter().find(|i| i.name.eq_ignore_ascii_case(asked)) {
                Some(i) => format!(
                    "interface names are case-sensitive: did you mean {}? {fix}",
                    i.name
                ),
                None => fix.to_string(),
            },
        };
        let has = |n: &str| ifaces.iter().any(|i| i.name == n);
        let ifname = ifname.map(str::trim).filter(|n| !n.is_empty());
        if let Some(n) = ifname.filter(|n| !has(n)) {
            return Err(missing(
                format!("--ifname {n} (TCHRUN_IFNAME)"),
                n,
                "pass one of them or leave --ifname out",
            ));
        }
        let gloo_env = user_var(GLOO_SOCKET_IFNAME).filter(|_| gloo).map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        });
        for n in gloo_env.iter().flatten() {
            if !has(n) {
                return Err(missing(
                    format!("{GLOO_SOCKET_IFNAME}={n}"),
                    n,
                    "set it to one of them or unset it",
                ));
            }
        }
        let nccl_env = user_var(NCCL_SOCKET_IFNAME).filter(|_| nccl);
        if let Some(spec) = &nccl_env {
            if !ifaces.iter().any(|i| nccl_selects(spec, &i.name)) {
                return Err(missing(
                    format!("{NCCL_SOCKET_IFNAME}={spec}"),
                    spec.trim_start_matches(['=', '^']),
                    "set it to one of them (a prefix, =exact or ^excluded) or unset it",
                ));
            }
        }
        Ok(Network {
            ifname: ifname.map(str::to_string),
            gloo_env,
            nccl_env,
            ifaces,
        })
    }

    /// The interfaces the user forced, and which setting forced them.
    pub fn forced(&self) -> Option<(String, Vec<&Iface>)> {
        let named = |names: &[String]| {
            self.ifaces
                .iter()
                .filter(|i| names.contains(&i.name))
                .collect::<Vec<_>>()
        };
        if let Some(n) = &self.ifname {
            return Some((format!("--ifname {n}"), named(std::slice::from_ref(n))));
        }
        if let Some(g) = &self.gloo_env {
            return Some((format!("{GLOO_SOCKET_IFNAME}={}", g.join(",")), named(g)));
        }
        let spec = self.nccl_env.as_ref()?;
        let hit = self
            .ifaces
            .iter()
            .filter(|i| nccl_selects(spec, &i.name))
            .collect();
        Some((format!("{NCCL_SOCKET_IFNAME}={spec}"), hit))
    }

    /// The addresses rank 0 offers, best first: the forced interfaces' addresses; else
    /// loopback when the whole job is on this host; else every non-loopback IPv4 address of an
    /// interface that is up, container and overlay bridges last.
    pub fn candidates(&self, one_host: bool) -> Vec<Candidate> {
        let of = |i: &Iface| {
            i.v4.iter()
                .map(|a| Candidate {
                    addr: a.to_string(),
                    iface: i.name.clone(),
                })
                .collect::<Vec<_>>()
        };
        if let Some((_, forced)) = self.forced() {
            return forced.into_iter().flat_map(of).collect();
        }
        if one_host {
            return vec![Candidate {
                addr: "127.0.0.1".into(),
                iface: self.iface_of("127.0.0.1").unwrap_or("lo").to_string(),
            }];
        }
        let usable = |virt: bool| {
            self.ifaces
                .iter()
                .filter(move |i| i.up && is_virtual(&i.name) == virt)
                .flat_map(move |i| {
                    of(i)
                        .into_iter()
                        .filter(|c| c.addr.parse::<Ipv4Addr>().is_ok_and(|a| !a.is_loopback()))
                })
        };
        usable(false).chain(usable(true)).collect()
    }

    /// The interface of this host that holds `addr`.
    pub fn iface_of(&self, addr: &str) -> Option<&str> {
        let a: Ipv4Addr = addr.parse().ok()?;
        self.ifaces
            .iter()
            .find(|i| i.v4.contains(&a))
            .map(|i| i.name.as_str())
    }

    /// What this rank's Gloo device binds: the user's `GLOO_SOCKET_IFNAME` (one device per
    /// interface, as PyTorch), else `--ifname`, else the address on the route to rank 0.
    pub fn gloo_device(&self, local_addr: &str) -> GlooDevice {
        if let Some(g) = &self.gloo_env {
            return GlooDevice::Interfaces(g.clone());
        }
        if let Some(n) = &self.ifname {
            return GlooDevice::Interfaces(vec![n.clone()]);
        }
        GlooDevice::Address(local_addr.to_string())
    }

    /// Sets `GLOO_SOCKET_IFNAME` and `NCCL_SOCKET_IFNAME` for this process (NCCL and an exec'd
    /// program read them) to `--ifname` or the interface `iface` holding this rank's address,
    /// each unless the user set it.
    pub fn export(&self, iface: Option<&str>) {
        let Some(name) = self.ifname.as_deref().or(iface) else {
            return;
        };
        if std::env::var_os(GLOO_SOCKET_IFNAME).is_none() {
            std::env::set_var(GLOO_SOCKET_IFNAME, name);
        }
        if std::env::var_os(NCCL_SOCKET_IFNAME).is_none() {
            std::env::set_var(NCCL_SOCKET_IFNAME, format!("={name}"));
        }
    }
}

/// What a rank's Gloo device binds.
#[derive(Debug, Clone, PartialEq)]
pub enum GlooDevice {
    /// One device on this address.
    Address(String),
    /// One device per interface (`createDeviceForInterface`).
    Interfaces(Vec<String>),
}

impl std::fmt::Display for GlooDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlooDevice::Address(a) => write!(f, "{a}"),
            GlooDevice::Interfaces(n) => write!(f, "interface {}", n.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_syntax() {
        assert!(nccl_selects("eth", "eth0"));
        assert!(!nccl_selects("=eth", "eth0"));
        assert!(nccl_selects("=eth0", "eth0"));
        assert!(!nccl_selects("^lo,docker", "lo"));
        assert!(nccl_selects("^lo,docker", "eth0"));
        assert!(nccl_selects("ib,eth0", "eth0"));
    }

    fn net(ifaces: Vec<(&str, &[&str])>) -> Network {
        Network {
            ifname: None,
            gloo_env: None,
            nccl_env: None,
            ifaces: ifaces
                .into_iter()
                .map(|(n, a)| Iface {
                    name: n.into(),
                    v4: a.iter().map(|a| a.parse().unwrap()).collect(),
                    up: true,
                })
                .collect(),
        }
    }

    #[test]
    fn candidates_put_bridges_last_and_loopback_only_on_one_host() {
        let n = net(vec![
            ("lo", &["127.0.0.1"]),
            ("docker0", &["172.17.0.1"]),
            ("eth0", &["10.0.0.1"]),
        ]);
        let addrs = |c: Vec<Candidate>| c.into_iter().map(|c| c.addr).collect::<Vec<_>>();
        assert_eq!(addrs(n.candidates(false)), ["10.0.0.1", "172.17.0.1"]);
        assert_eq!(addrs(n.candidates(true)), ["127.0.0.1"]);
        let forced = Network {
            ifname: Some("docker0".into()),
            ..n
        };
        assert_eq!(addrs(forced.candidates(false)), ["172.17.0.1"]);
        assert_eq!(
            forced.gloo_device("10.0.0.1"),
            GlooDevice::Interfaces(vec!["docker0".into()])
        );
    }
}
