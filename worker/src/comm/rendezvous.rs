//! The authenticated rendezvous: nobody reaches the job's c10d store without the job's
//! secret. Rank 0's store listens on loopback behind a filter (`loopback::Inner`); its front
//! listens on the address the bootstrap chose and lets a connection through only after a
//! challenge-response over the secret (`tchrun::secret`: HMAC-SHA256 over both sides'
//! nonces, each side proving it). Every other rank's c10d client talks to its own loopback
//! relay, which dials the front, proves the secret and then carries the bytes. Refused
//! connections are logged and disturb nothing. Knows nothing of what the store holds.
use crate::comm::loopback::{self, Inner, PortFilter};
use crate::comm::pg::{C10dError, Store};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tchrun::secret::{self, JobSecret, Side, MAGIC, NONCE_BYTES};

/// How long a stranger may take over its handshake before it is dropped.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// The most handshakes under way at once; more are refused at once (a flood of silent
/// connections costs the front that many threads for `HANDSHAKE_LIMIT` at most).
const MAX_PENDING: usize = 64;
/// Refusals logged one by one; after that, every 1000th (a flood does not fill the log).
const LOGGED_REFUSALS: usize = 20;

/// The rendezvous failed: this rank cannot reach the job's store.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "rendezvous: rank 0's front at {addr} refused this rank's proof of the job's secret \
         (is {} the same on every rank?)",
        tchrun::env::TCHRUN_JOB_SECRET
    )]
    Refused { addr: String },
    #[error("rendezvous: cannot reach rank 0's store at {addr} within {secs} s: {last}")]
    Unreachable {
        addr: String,
        secs: u64,
        last: String,
    },
    #[error(transparent)]
    Store(#[from] C10dError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RendezvousError {
    let what = what.into();
    move |source| RendezvousError::Io { what, source }
}

/// Refusals so far (all fronts and relays of this process).
static REFUSED: AtomicUsize = AtomicUsize::new(0);

fn log_refusal(what: &str, peer: &str, why: &str) {
    let n = REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= LOGGED_REFUSALS || n.rem_euclid(1000) == 0 {
        tracing::warn!("rendezvous: refused an unauthenticated connection from {peer} to {what} ({why}; {n} refused so far)");
    }
}

/// Carries bytes both ways until either side ends, then runs `done` once.
fn pipe(a: TcpStream, b: TcpStream, done: impl FnOnce() + Send + 'static) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        done();
        return;
    };
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let one = move |mut from: TcpStream, mut to: TcpStream| {
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
        let _ = from.shutdown(Shutdown::Read);
    };
    let back = std::thread::spawn(move || one(b2, a2));
    std::thread::spawn(move || {
        one(a, b);
        let _ = back.join();
        done();
    });
}

/// Rank 0's side of a handshake: challenge, check the proof, prove back.
fn answer(stream: &mut TcpStream, secret: &JobSecret) -> Result<(), String> {
    stream
        .set_read_timeout(Some(HANDSHAKE_LIMIT))
        .map_err(|e| e.to_string())?;
    let server_nonce = secret::nonce();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&server_nonce);
    stream.write_all(&hello).map_err(|e| e.to_string())?;
    let mut reply = [0u8; 8 + 2 * NONCE_BYTES];
    stream.read_exact(&mut reply).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no proof within {} s", HANDSHAKE_LIMIT.as_secs())
        }
        io::ErrorKind::UnexpectedEof => "closed before its proof".to_string(),
        _ => e.to_string(),
    })?;
    if &reply[..8] != MAGIC {
        return Err("not tchrun's rendezvous protocol".into());
    }
    let mut client_nonce = [0u8; NONCE_BYTES];
    client_nonce.copy_from_slice(&reply[8..8 + NONCE_BYTES]);
    if !secret.verify(
        Side::Client,
        &server_nonce,
        &client_nonce,
        &reply[8 + NONCE_BYTES..],
    ) {
        return Err("wrong proof of the job's secret".into());
    }
    let proof = secret.prove(Side::Server, &server_nonce, &client_nonce);
    stream.write_all(&proof).map_err(|e| e.to_string())?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())
}

/// What a failed dial means: try again (rank 0 not there yet), or stop (refused).
enum Dial {
    Retry(String),
    Refused,
}

/// A rank's side: read the challenge, prove, check rank 0's proof.
fn prove(stream: &mut TcpStream, secret: &JobSecret, limit: Duration) -> Result<(), Dial> {
    let retry = |e: io::Error| Dial::Retry(e.to_string());
    stream.set_read_timeout(Some(limit)).map_err(retry)?;
    let mut hello = [0u8; 8 + NONCE_BYTES];
    stream.read_exact(&mut hello).map_err(retry)?;
    if &hello[..8] != MAGIC {
        return Err(Dial::Retry(
            "the port does not speak tchrun's rendezvous".into(),
        ));
    }
    let mut server_nonce = [0u8; NONCE_BYTES];
    server_nonce.copy_from_slice(&hello[8..]);
    let client_nonce = secret::nonce();
    let mut reply = MAGIC.to_vec();
    reply.extend_from_slice(&client_nonce);
    reply.extend_from_slice(&secret.prove(Side::Client, &server_nonce, &client_nonce));
    stream.write_all(&reply).map_err(retry)?;
    let mut proof = [0u8; NONCE_BYTES];
    match stream.read_exact(&mut proof) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(Dial::Refused),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(Dial::Refused),
        Err(e) => return Err(retry(e)),
    }
    if !secret.verify(Side::Server, &server_nonce, &client_nonce, &proof) {
        return Err(Dial::Retry(
            "the peer did not prove the job's secret (not rank 0's front)".into(),
        ));
    }
    stream.set_read_timeout(None).map_err(retry)?;
    Ok(())
}

/// An authenticated connection to the front at `addr`, retried until `deadline` while rank
/// 0 is not there yet; a refused proof ends it at once.
fn dial(addr: &str, secret: &JobSecret, deadline: Instant) -> Result<TcpStream, RendezvousError> {
    let mut pause = Duration::from_millis(20);
    let mut last = String::from("no attempt");
    let started = Instant::now();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RendezvousError::Unreachable {
                addr: addr.into(),
                secs: started.elapsed().as_secs(),
                last,
            });
        }
        let attempt = addr
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
            .and_then(|a| {
                TcpStream::connect_timeout(&a, left.min(HANDSHAKE_LIMIT)).map_err(|e| e.to_string())
            });
        match attempt {
            Ok(mut s) => match prove(&mut s, secret, left.min(HANDSHAKE_LIMIT)) {
                Ok(()) => return Ok(s),
                Err(Dial::Refused) => return Err(RendezvousError::Refused { addr: addr.into() }),
                Err(Dial::Retry(e)) => last = e,
            },
            Err(e) => last = e,
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Accepts on `listener` for the life of the process, handing each connection to `handle`.
fn accept_loop(listener: TcpListener, handle: impl Fn(TcpStream, SocketAddr) + Send + 'static) {
    std::thread::spawn(move || loop {
        match listener.accept() {
            Ok((s, peer)) => handle(s, peer),
            // Out of descriptors and the like: the next accept may succeed.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    });
}

/// Forwards an admitted connection to the store (on rank 0).
fn to_store(s: TcpStream, filter: &Arc<PortFilter>, port: u16) {
    match filter.connect(port) {
        Ok((inner, src)) => {
            let filter = Arc::clone(filter);
            pipe(s, inner, move || filter.forbid(src));
        }
        Err(e) => tracing::warn!("rendezvous: cannot reach the store on loopback: {e}"),
    }
}

/// Binds the front on `addr:port` (port 0: a free one); where `addr` is not this host's,
/// every interface, with a warning (as c10d would).
fn bind_front(addr: &str, port: u16) -> Result<TcpListener, RendezvousError> {
    match TcpListener::bind((addr, port)) {
        Ok(l) => Ok(l),
        Err(e) => {
            tracing::warn!(
                "rendezvous: cannot bind {addr}:{port} ({e}); the front listens on every interface"
            );
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
                .map_err(io_err(format!("cannot listen on port {port}")))
        }
    }
}

/// The store's inner socket and the self-client's relay on 127.0.0.1 and the same port
/// (c10d's server connects its own client to the port it serves), retried on a taken port.
fn inner_and_self_relay() -> Result<(Inner, TcpListener), RendezvousError> {
    let mut last = None;
    for _ in 0..20 {
        let inner = Inner::new().map_err(io_err("the store's loopback socket"))?;
        match TcpListener::bind((Ipv4Addr::LOCALHOST, inner.port)) {
            Ok(l) => return Ok((inner, l)),
            Err(e) => last = Some(e),
        }
    }
    Err(RendezvousError::Io {
        what: "no loopback port free on both 127.0.0.1 and 127.0.0.2".into(),
        source: last.unwrap_or_else(|| io::Error::other("no attempt")),
    })
}

/// Rank 0: serves the store on loopback and its front on `addr:port`; returns the store and
/// the front's port (the one every rank is told).
pub fn serve(
    addr: &str,
    port: u16,
    secret: &JobSecret,
    world_size: usize,
    timeout: Duration,
) -> Result<(Store, u16), RendezvousError> {
    let (mut inner, self_relay) = inner_and_self_relay()?;
    let front = bind_front(addr, port)?;
    let front_port = front
        .local_addr()
        .map_err(io_err("the front's address"))?
        .port();
    let store_port = inner.port;
    let filter = Arc::clone(&inner.filter);
    accept_loop(
        self_relay,
        move |s, _peer| match loopback::peer_is_own_user(&s) {
            Ok(()) => to_store(s, &filter, store_port),
            Err(who) => log_refusal("the store's loopback relay", &who, "not this job's user"),
        },
    );
    let filter = Arc::clone(&inner.filter);
    let secret = secret.clone();
    let pending = Arc::new(AtomicUsize::new(0));
    accept_loop(front, move |mut s, peer| {
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            pending.fetch_sub(1, Ordering::SeqCst);
            log_refusal(
                "the front",
                &peer.to_string(),
                "too many handshakes under way",
            );
            return;
        }
        let (filter, secret, pending) = (Arc::clone(&filter), secret.clone(), Arc::clone(&pending));
        std::thread::spawn(move || {
            let r = answer(&mut s, &secret);
            pending.fetch_sub(1, Ordering::SeqCst);
            match r {
                Ok(()) => to_store(s, &filter, store_port),
                Err(why) => log_refusal("the front", &peer.to_string(), &why),
            }
        });
    });
    let fd = inner.take_fd().unwrap_or(-1);
    let store = Store::serve_on(fd, store_port, world_size, timeout)?;
    Ok((store, front_port))
}

/// Any other rank: proves the secret to the front at `master:port` (retrying until
/// `timeout` while rank 0 is not up), then connects its c10d client through a loopback
/// relay that admits only this user's connections.
pub fn connect(
    master: &str,
    port: u16,
    secret: &JobSecret,
    timeout: Duration,
) -> Result<Store, RendezvousError> {
    let addr = if master.contains(':') {
        format!("[{master}]:{port}")
    } else {
        format!("{master}:{port}")
    };
    let first = dial(&addr, secret, Instant::now() + timeout)?;
    let relay = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(io_err("cannot listen on loopback for the relay"))?;
    let relay_port = relay
        .local_addr()
        .map_err(io_err("the relay's address"))?
        .port();
    let first = Mutex::new(Some(first));
    let secret = secret.clone();
    accept_loop(relay, move |s, _peer| {
        if let Err(who) = loopback::peer_is_own_user(&s) {
            log_refusal("this rank's relay", &who, "not this job's user");
            return;
        }
        let taken = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let up = match taken {
            Some(u) => Ok(u),
            None => dial(&addr, &secret, Instant::now() + timeout),
        };
        match up {
            Ok(u) => pipe(s, u, || {}),
            Err(e) => tracing::warn!("{e}"),
        }
    });
    Ok(Store::connect("127.0.0.1", relay_port, timeout)?)
}
