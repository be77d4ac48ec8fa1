//! A program's stdout and stderr (`exec`), read as it prints them by the rank, which runs the
//! program as its child and stays until it ended: every byte into the driver log as the program
//! wrote it, each line on the rank's console behind its `host:rank ` prefix when `--console`
//! selects the rank, and its stderr warnings and errors (`tchrun::console::StderrWarnings`)
//! whatever it selects. The rank exits only after the program's last line went out (a launcher
//! that aborts the job when the program fails has its traceback), with the program's exit
//! status: its exit code, or the signal that ended it. The stop signals the rank receives are
//! passed on to the program (`signals::forward_to`); the program dies with the rank
//! (`PR_SET_PDEATHSIG`) and shares its process group.
//! Must not know what the program is or how the rank was started.
use crate::rank::driver_log::Console;
use std::io::{Read, Write};
use std::os::fd::{AsFd, RawFd};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tchrun::console::StderrWarnings;

/// A line longer than this without a newline is shown in pieces of this size.
const LONGEST_LINE: usize = 64 * 1024;

/// How long the program's output is still read after it ended, while something it started
/// keeps its stdout or stderr open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Signals passed on to the program beside the stop signals (`signals` handles those).
const FORWARDED: [i32; 3] = [libc::SIGHUP, libc::SIGUSR2, libc::SIGQUIT];

/// Runs `cmd` as the rank's child, its output read into the driver log and the console until
/// it ended and its output closed; returns how it ended. Err: it could not be started.
pub fn run(mut cmd: Command, console: &Console) -> std::io::Result<ExitStatus> {
    use std::os::unix::process::CommandExt;
    // The program inherits none of the rank's descriptors but its stdin and the two pipes: the
    // console's and the driver log's stay the rank's (a daemon the program leaves behind does
    // not hold the launcher's output open).
    close_on_exec_above(2);
    cmd.stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The program leads a process group of its own: what it starts in the background is in it,
    // gets the stop signals the rank passes on, and is ended with the program (`end_group`),
    // under mpirun and srun as under the local launcher (which ends each rank's group), as
    // torchrun's agent ends its workers' sessions.
    // SAFETY: `prctl` and `setpgid` are async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let group = EndGroup(child.id());
    crate::rank::signals::forward_to(child.id());
    forward_others(child.id());
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return child.wait();
    };
    let mut lines = Lines::new(console);
    let mut open: Vec<(bool, Box<dyn ReadFd>)> =
        vec![(false, Box::new(out)), (true, Box::new(err))];
    let mut buf = vec![0u8; LONGEST_LINE];
    let mut ended: Option<(ExitStatus, Instant)> = None;
    while !open.is_empty() {
        if ended.is_none() {
            if let Some(status) = child.try_wait()? {
                ended = Some((status, Instant::now()));
                group.end();
            }
        }
        if let Some((_, at)) = ended {
            if at.elapsed() >= DRAIN_AFTER_EXIT {
                tracing::warn!(
                    "the program ended but something it started still holds its output open; \
                     its lines after this one are not read"
                );
                break;
            }
        }
        let ready = {
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let mut polled: Vec<PollFd> = open
                .iter()
                .map(|(_, f)| PollFd::new(f.fd(), PollFlags::POLLIN))
                .collect();
            match poll(&mut polled, PollTimeout::from(100u8)) {
                Ok(_) => polled
                    .iter()
                    .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                    .collect::<Vec<bool>>(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => vec![true; open.len()],
            }
        };
        let mut closed = Vec::new();
        for (k, ((stderr, file), ready)) in open.iter_mut().zip(ready).enumerate() {
            if !ready {
                continue;
            }
            match file.read(&mut buf) {
                Ok(0) => closed.push(k),
                Ok(n) => lines.bytes(*stderr, &buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => closed.push(k),
            }
        }
        for k in closed.into_iter().rev() {
            let (stderr, _) = open.remove(k);
            lines.end(stderr);
        }
    }
    for (stderr, _) in &open {
        lines.end(*stderr);
    }
    match ended {
        Some((status, _)) => Ok(status),
        None => child.wait(),
    }
}

/// The program's process group, ended (SIGKILL to what is left of it) when the program ended
/// or the rank leaves `run`.
struct EndGroup(u32);

impl EndGroup {
    fn end(&self) {
        let group = nix::unistd::Pid::from_raw(self.0 as i32);
        // ESRCH (nothing left) is the usual answer.
        if nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).is_ok() {
            tracing::debug!("ended what the program left in its process group");
        }
    }
}

impl Drop for EndGroup {
    fn drop(&mut self) {
        self.end();
    }
}

/// A pipe end the loop polls and reads.
trait ReadFd: Read {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_>;
}
impl<T: Read + AsFd> ReadFd for T {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.as_fd()
    }
}

/// SIGHUP, SIGUSR2 and SIGQUIT reach the program as if it were the rank (a watcher thread).
fn forward_others(pid: u32) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new(FORWARDED) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("forward".into())
        .spawn(move || {
            for sig in signals.forever() {
                // SAFETY: `kill` sends a signal; the program is this rank's child and leads
                // its process group (a negative pid: the whole group).
                unsafe { libc::kill(-(pid as libc::pid_t), sig) };
            }
        });
}

/// Marks every descriptor of this process above `last` close-on-exec.
fn close_on_exec_above(last: RawFd) {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open.into_iter().filter(|&fd| fd > last) {
        // Only the flag changes; a descriptor closed since makes `fcntl` fail, which is ignored.
        if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFD) {
            let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
            let _ = fcntl(fd, FcntlArg::F_SETFD(flags));
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
        let mut log = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(2)
        });
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
