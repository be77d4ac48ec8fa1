//! The loopback half of the rendezvous (`rendezvous`): rank 0's c10d store listens on a
//! loopback socket that accepts only connections coming from ports this process bound
//! (`Inner`, a classic BPF filter on the source port, attached before the socket listens), and
//! a loopback listener accepts only connections made by a process of this user
//! (`peer_is_own_user`, from `/proc/self/net/tcp`). Knows nothing of the secret.
use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// The loopback address rank 0's store listens on; its clients reach it only through this
/// process (the self-client through a relay on 127.0.0.1 and the same port).
pub const INNER_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The most connections the inner socket admits at once (two instructions each in the
/// filter, whose limit is 4096).
const MAX_ALLOWED: usize = 2000;

/// The store's listening socket: bound, filtered, not yet listening (c10d listens on it).
pub struct Inner {
    /// The socket, until `take_fd` hands it to c10d.
    fd: Option<OwnedFd>,
    pub port: u16,
    pub filter: Arc<PortFilter>,
}

/// Which source ports the inner socket admits: those of this process's own connections.
pub struct PortFilter {
    /// A duplicate of the listening socket's descriptor (a filter set on it is the socket's).
    fd: OwnedFd,
    ports: Mutex<BTreeSet<u16>>,
    /// Whether the kernel took the filter: where it refuses socket filters to unprivileged
    /// users (`kernel.unprivileged_bpf_disabled` = 2, Ubuntu's default) the store goes on
    /// unfiltered, reachable by other users of this host but not from other hosts (it listens
    /// on loopback only), and the rank says so.
    active: std::sync::atomic::AtomicBool,
}

fn last_error<T>(what: &str) -> io::Result<T> {
    let e = io::Error::last_os_error();
    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn tcp_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return last_error("socket");
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

fn bind(fd: RawFd, a: SocketAddrV4) -> io::Result<u16> {
    let sa = sockaddr(a);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sa` is a valid sockaddr_in of `len` bytes.
    if unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) } != 0 {
        return last_error(&format!("bind {a}"));
    }
    let mut out: libc::sockaddr_in = sockaddr(a);
    let mut len = len;
    // SAFETY: `out` has room for a sockaddr_in.
    if unsafe { libc::getsockname(fd, &mut out as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return last_error("getsockname");
    }
    Ok(u16::from_be(out.sin_port))
}

impl Inner {
    /// A socket on `INNER_ADDR` (a free port) that admits nobody until `PortFilter::allow`.
    pub fn new() -> io::Result<Inner> {
        let fd = tcp_socket()?;
        // SAFETY: a valid descriptor; dup(2) returns a new one or -1.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return last_error("dup");
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let filter = Arc::new(PortFilter {
            fd: unsafe { OwnedFd::from_raw_fd(dup) },
            ports: Mutex::new(BTreeSet::new()),
            active: std::sync::atomic::AtomicBool::new(true),
        });
        match filter.attach(&BTreeSet::new()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                filter
                    .active
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                tracing::warn!(
                    "rendezvous: this kernel refuses socket filters to unprivileged users \
                     (kernel.unprivileged_bpf_disabled: {e}); the job's store on {INNER_ADDR} \
                     is then reachable by other users of this host, not from other hosts \
                     (SECURITY.md)"
                );
            }
            Err(e) => return Err(e),
        }
        let port = bind(fd.as_raw_fd(), SocketAddrV4::new(INNER_ADDR, 0))?;
        Ok(Inner {
            fd: Some(fd),
            port,
            filter,
        })
    }

    /// The descriptor, for c10d to listen on (it owns it from then on).
    pub fn take_fd(&mut self) -> Option<RawFd> {
        self.fd.take().map(IntoRawFd::into_raw_fd)
    }
}

impl PortFilter {
    /// Sets the filter: a SYN or segment whose TCP source port is not in `ports` is dropped
    /// (the filter sees the segment from its TCP header; the source port is its first field).
    fn attach(&self, ports: &BTreeSet<u16>) -> io::Result<()> {
        const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
        const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
        const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
        let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
        let mut prog = vec![ins(LD_H_ABS, 0, 0, 0)];
        for &p in ports {
            prog.push(ins(JEQ_K, 0, 1, u32::from(p)));
            prog.push(ins(RET_K, 0, 0, u32::MAX));
        }
        prog.push(ins(RET_K, 0, 0, 0));
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies it.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                &fprog as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return last_error("SO_ATTACH_FILTER");
        }
        Ok(())
    }

    /// Admits connections from `port` (one this process has bound).
    fn allow(&self, port: u16) -> io::Result<()> {
        if !self.active.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        if ports.len() >= MAX_ALLOWED {
            return Err(io::Error::other(format!(
                "more than {MAX_ALLOWED} connections to the store at once"
            )));
        }
        ports.insert(port);
        self.attach(&ports)
    }

    /// Stops admitting `port` (its connection has ended).
    pub fn forbid(&self, port: u16) {
        if !self.active.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        if ports.remove(&port) {
            if let Err(e) = self.attach(&ports) {
                tracing::warn!("rendezvous: cannot narrow the store's filter: {e}");
            }
        }
    }

    /// A connection to the store at `INNER_ADDR:port`, from a port bound and admitted first.
    /// Returns the stream and its source port (to `forbid` when it ends).
    pub fn connect(&self, port: u16) -> io::Result<(TcpStream, u16)> {
        let fd = tcp_socket()?;
        let src = bind(fd.as_raw_fd(), SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        self.allow(src)?;
        let sa = sockaddr(SocketAddrV4::new(INNER_ADDR, port));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `sa` is a valid sockaddr_in of `len` bytes.
        if unsafe {
            libc::connect(
                fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                len,
            )
        } != 0
        {
            let e = last_error(&format!("connect {INNER_ADDR}:{port}"));
            self.forbid(src);
            return e;
        }
        Ok((TcpStream::from(fd), src))
    }
}

/// An address of a `/proc/net/tcp{,6}` row (`HEX:PORT`, the address as the kernel's u32
/// words in host order); a v4-mapped IPv6 address as its IPv4 address.
fn proc_addr(field: &str) -> Option<SocketAddrV4> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]),
        16 => {
            let b: [u8; 16] = bytes.try_into().ok()?;
            std::net::Ipv6Addr::from(b).to_ipv4_mapped()?
        }
        _ => return None,
    };
    Some(SocketAddrV4::new(ip, port))
}

/// The owner (uid) of the loopback socket at `peer` connected to `local`, from this network
/// namespace's `/proc/self/net/tcp` and `tcp6` (c10d's client is a dual-stack IPv6 socket);
/// None when no row matches.
fn loopback_peer_uid(peer: SocketAddrV4, local: SocketAddrV4) -> io::Result<Option<u32>> {
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 8 && proc_addr(f[1]) == Some(peer) && proc_addr(f[2]) == Some(local) {
                return Ok(f[7].parse().ok());
            }
        }
    }
    Ok(None)
}

/// Whether the process at the other end of `stream` (a loopback connection accepted here)
/// runs as this process's user. Other users are refused: they could otherwise ride this
/// rank's authenticated relay into the store.
pub fn peer_is_own_user(stream: &TcpStream) -> Result<(), String> {
    let (Ok(std::net::SocketAddr::V4(peer)), Ok(std::net::SocketAddr::V4(local))) =
        (stream.peer_addr(), stream.local_addr())
    else {
        return Err("not an IPv4 loopback connection".into());
    };
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    match loopback_peer_uid(peer, local) {
        Ok(Some(uid)) if uid == me => Ok(()),
        Ok(Some(uid)) => Err(format!("{peer} (user {uid})")),
        Ok(None) => Err(format!("{peer} (its owner is not in /proc/self/net/tcp)")),
        Err(e) => Err(format!("{peer} (cannot read /proc/self/net/tcp: {e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn the_inner_socket_admits_only_allowed_ports() {
        let mut inner = Inner::new().unwrap();
        let fd = inner.take_fd().unwrap();
        // SAFETY: the descriptor was just handed over.
        let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        // SAFETY: listen(2) on a bound socket.
        assert_eq!(unsafe { libc::listen(fd, 8) }, 0);
        let stranger = TcpStream::connect_timeout(
            &SocketAddrV4::new(INNER_ADDR, inner.port).into(),
            std::time::Duration::from_millis(300),
        );
        assert!(stranger.is_err(), "a port not allowed is dropped");
        let (mut ours, src) = inner.filter.connect(inner.port).unwrap();
        let (mut accepted, from) = listener.accept().unwrap();
        assert_eq!(from.port(), src);
        ours.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        accepted.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        assert!(peer_is_own_user(&accepted).is_ok());
        assert_eq!(
            proc_addr("0000000000000000FFFF00000100007F:ECCC"),
            Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0xECCC))
        );
        inner.filter.forbid(src);
        assert!(inner.filter.ports.lock().unwrap().is_empty());
    }
}
