//! A program's stdout and stderr (`exec`), read as it prints them by a reader process of their
//! own: every byte into the driver log as the program wrote it, each line on the rank's console
//! behind its `host:rank ` prefix when `--console` selects the rank, and its stderr warnings
//! and errors (`tchrun::console::StderrWarnings`) whatever it selects. The program stays the
//! rank's process (its pid, signals and exit status are the rank's, as with a plain exec); the
//! reader is forked before the exec and detached (a grandchild in a session of its own: the
//! program has no child it did not start, and a kill of the rank's process group spares it),
//! ignores the stop signals so that it keeps reading the program's last words, and ends when the
//! program and everything it started have closed their output.
//! Must not know what the program is or how the rank was started.
use crate::rank::driver_log::Console;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tchrun::console::StderrWarnings;

/// A line longer than this without a newline is shown in pieces of this size.
const LONGEST_LINE: usize = 64 * 1024;

/// The program's end of the reader's pipes, and the driver log to go back to.
pub struct Streams {
    out: OwnedFd,
    err: OwnedFd,
    /// The driver log (fd 2 until `redirect`), close-on-exec.
    log: OwnedFd,
}

/// Starts the reader of the program's output (call after the driver log is open, right before
/// the exec); fds 1 and 2 still write to the driver log until [`Streams::redirect`].
pub fn start(console: &Console) -> std::io::Result<Streams> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::unistd::{fork, pipe2, ForkResult};
    let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC)?;
    let log = fcntl(2, FcntlArg::F_DUPFD_CLOEXEC(3))?;
    // SAFETY: `log` is a fresh descriptor that we own.
    let log = unsafe { OwnedFd::from_raw_fd(log) };
    // SAFETY: the first child forks once more and `_exit`s. The grandchild runs `read` alone:
    // it reads, writes and allocates (glibc's malloc is reset for the child of a fork), and
    // takes no lock but the console's, which only this thread uses; it never returns.
    match unsafe { fork() }? {
        ForkResult::Child => {
            let code = match unsafe { fork() } {
                Ok(ForkResult::Child) => read([out_r.as_raw_fd(), err_r.as_raw_fd()], console),
                Ok(ForkResult::Parent { .. }) => 0,
                Err(_) => 1,
            };
            // SAFETY: ends this child at once; nothing of the parent's state is touched.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            use nix::sys::wait::{waitpid, WaitStatus};
            if !matches!(waitpid(child, None)?, WaitStatus::Exited(_, 0)) {
                return Err(std::io::Error::other(
                    "cannot fork the reader of the program's output",
                ));
            }
        }
    }
    drop((out_r, err_r));
    Ok(Streams {
        out: out_w,
        err: err_w,
        log,
    })
}

impl Streams {
    /// The program's fds 1 and 2 become the reader's pipes (they stay open across the exec).
    pub fn redirect(&self) -> std::io::Result<()> {
        nix::unistd::dup2(self.out.as_raw_fd(), 1)?;
        nix::unistd::dup2(self.err.as_raw_fd(), 2)?;
        Ok(())
    }

    /// The program could not be started: fds 1 and 2 write to the driver log again, and the
    /// reader ends (its pipes close).
    pub fn restore(self) {
        let _ = nix::unistd::dup2(self.log.as_raw_fd(), 1);
        let _ = nix::unistd::dup2(self.log.as_raw_fd(), 2);
    }
}

/// The reader process: reads the two pipes `fds` (stdout, stderr) until both are closed, then
/// `_exit`s. Its fds 1 and 2 are the driver log.
fn read(fds: [RawFd; 2], console: &Console) -> ! {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGUSR1,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN installs no handler.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    // A session of its own: a launcher that kills the rank's process group at once (mpirun's
    // SIGKILL after a failure elsewhere) does not kill the reader before it passed on the
    // lines the program wrote last; it ends when their pipes close.
    let _ = nix::unistd::setsid();
    close_all_but(&[1, 2, fds[0], fds[1], console.fds()[0], console.fds()[1]]);
    let mut lines = Lines::new(console);
    // SAFETY: the pipes' read ends, owned by this process alone from here on.
    let mut open: Vec<(usize, File)> = fds
        .iter()
        .enumerate()
        .map(|(i, &fd)| (i, unsafe { File::from_raw_fd(fd) }))
        .collect();
    let mut buf = vec![0u8; LONGEST_LINE];
    while !open.is_empty() {
        let ready = {
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let mut polled: Vec<PollFd> = open
                .iter()
                .map(|(_, f)| PollFd::new(std::os::fd::AsFd::as_fd(f), PollFlags::POLLIN))
                .collect();
            match poll(&mut polled, PollTimeout::NONE) {
                Ok(_) => polled
                    .iter()
                    .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                    .collect::<Vec<bool>>(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => vec![true; open.len()],
            }
        };
        let mut closed = Vec::new();
        for (k, ((stream, file), ready)) in open.iter_mut().zip(ready).enumerate() {
            if !ready {
                continue;
            }
            match file.read(&mut buf) {
                Ok(0) => closed.push(k),
                Ok(n) => lines.bytes(*stream == 1, &buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => closed.push(k),
            }
        }
        for k in closed.into_iter().rev() {
            let (stream, _) = open.remove(k);
            lines.end(stream == 1);
        }
    }
    // SAFETY: ends the reader; everything it wrote went out unbuffered.
    unsafe { libc::_exit(0) }
}

/// Closes every descriptor of this process but `keep` (the reader holds no socket, lock or
/// pipe end of the rank's: the program's port and the ranks' pipes are the program's alone).
fn close_all_but(keep: &[RawFd]) {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open {
        if !keep.contains(&fd) {
            let _ = nix::unistd::close(fd);
        }
    }
}

/// The bytes of both streams: into the driver log as they come, and as lines to the console.
struct Lines<'a> {
    console: &'a Console,
    /// The unfinished line of stdout and of stderr.
    partial: [Vec<u8>; 2],
    warnings: StderrWarnings,
    /// A write to the driver log failed (said once on the console).
    log_failed: bool,
}

impl<'a> Lines<'a> {
    fn new(console: &'a Console) -> Lines<'a> {
        Lines {
            console,
            partial: [Vec::new(), Vec::new()],
            warnings: StderrWarnings::default(),
            log_failed: false,
        }
    }

    /// Bytes the program wrote to stdout (`stderr` false) or stderr.
    fn bytes(&mut self, stderr: bool, bytes: &[u8]) {
        // SAFETY: fd 2 is the driver log; `ManuallyDrop` leaves it open.
        let mut log = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(2) });
        if let Err(e) = log.write_all(bytes) {
            if !self.log_failed {
                self.log_failed = true;
                self.console.err(&format!(
                    "warning: the driver log could not be written ({e}); it lacks the program's \
                     output from here on (free space in --log-dir)"
                ));
            }
        }
        let partial = &mut self.partial[stderr as usize];
        partial.extend_from_slice(bytes);
        let mut done = Vec::new();
        while let Some(i) = partial.iter().position(|&b| b == b'\n') {
            done.push(partial.drain(..=i).collect::<Vec<u8>>());
        }
        while partial.len() >= LONGEST_LINE {
            done.push(partial.drain(..LONGEST_LINE).collect());
        }
        for line in done {
            self.line(stderr, &line);
        }
    }

    /// The stream ended: its last line, if it had no newline.
    fn end(&mut self, stderr: bool) {
        let rest = std::mem::take(&mut self.partial[stderr as usize]);
        if !rest.is_empty() {
            self.line(stderr, &rest);
        }
    }

    fn line(&mut self, stderr: bool, raw: &[u8]) {
        let text = console_text(raw);
        if !stderr {
            self.console.out(&text);
        } else if self.warnings.counts(&text) || self.console.selected() {
            self.console.err(&text);
        }
    }
}

/// A line as the console shows it: without its newline, and of a line rewritten with `\r` (a
/// progress bar) its last state, as a terminal would show it.
fn console_text(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    text.rsplit('\r').next().unwrap_or(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_shown_as_a_terminal_would_show_it() {
        assert_eq!(console_text(b"hello\n"), "hello");
        assert_eq!(console_text(b"dos\r\n"), "dos");
        assert_eq!(console_text(b" 10%\r 50%\r100% done\n"), "100% done");
        assert_eq!(console_text(b"no newline"), "no newline");
        assert_eq!(console_text(b"bad \xff byte\n"), "bad \u{fffd} byte");
    }
}
