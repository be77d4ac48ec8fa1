//! Native stacks of every thread of a process, taken from outside it: `eu-stack` (elfutils:
//! fast, works on a stopped process and leaves it stopped) or else `gdb`, run with a time
//! limit; each thread's name, state and kernel wait channel from `/proc`; function names
//! demangled (Rust and C++). Used by a rank on itself (from a thread of its own: a process
//! cannot ptrace itself, its child can), by a rank for a stopped peer on its host, and by the
//! launcher for a local rank that did not answer. Machinery: agrees on nothing by itself (the
//! record is `job_record::stacks`).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tchrun::job_record::heartbeat::Heartbeat;
use tchrun::job_record::stacks::{RankStacks, ThreadStack};

/// `TCHRUN_STACK_TOOL`: `eu-stack`, `gdb` or `none` (default: the first of eu-stack and gdb
/// found on PATH).
pub const TOOL_VAR: &str = "TCHRUN_STACK_TOOL";

/// Frames kept per thread (the innermost).
pub const MAX_FRAMES: usize = 64;

/// Why no stacks could be unwound (the threads' names and states are still known).
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(
        "no stack tool: neither eu-stack nor gdb is on PATH (install elfutils, the Debian \
         package that has eu-stack)"
    )]
    NoTool,
    #[error("{tool} did not finish within {secs} s (a thread in the kernel, state D?)")]
    TimedOut { tool: &'static str, secs: u64 },
    #[error("{tool} found no stack: {detail}")]
    Failed { tool: &'static str, detail: String },
    #[error("cannot run {tool}: {source}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The stacks of `pid`: every thread's name and state, with frames when a tool could unwind
/// them; the tool's name; its error, if any (the threads are still returned).
pub fn capture(
    pid: u32,
    limit: Duration,
) -> (Vec<ThreadStack>, Option<&'static str>, Option<StackError>) {
    // The capture's own threads (this one, the tool's pipes) are not the process's work.
    let me = nix::unistd::gettid().as_raw() as u32;
    let own = |t: &ThreadStack| pid == std::process::id() && t.tid == me;
    let tool = match tool() {
        Ok(t) => t,
        Err(e) => {
            let mut threads = threads_of(pid);
            threads.retain(|t| !own(t));
            return (threads, None, Some(e));
        }
    };
    let unwound = unwind(tool, pid, limit);
    // Looked at after the tool ended: its pipe threads are gone.
    let mut threads = threads_of(pid);
    threads.retain(|t| !own(t));
    match unwound {
        Ok(frames) => {
            let maps = Maps::of(pid);
            let stopped = matches!(process_state(pid), Some('T' | 't'));
            for t in &mut threads {
                if let Some(f) = frames.get(&t.tid) {
                    t.frames = f.iter().map(|f| maps.name(f)).collect();
                }
                // Unwinding ends in JIT-compiled code (oneDNN's kernels): scan past it, when
                // the process is stopped (a running stack changes under the scan).
                if stopped && t.frames.last().is_some_and(|f| f.contains(JIT)) {
                    if let Some(more) = scan(pid, t.tid, &maps) {
                        t.frames.push(SCANNED.to_string());
                        t.frames.extend(more);
                    }
                }
            }
            (threads, Some(tool), None)
        }
        Err(e) => (threads, Some(tool), Some(e)),
    }
}

/// The executable mappings of a process (`/proc/<pid>/maps`): a frame the tool could not
/// name is named by where it is ("libgomp.so.1+0x1d2e0", or JIT-compiled code, which has no
/// unwind information: the tool cannot go past it).
struct Maps(Vec<(u64, u64, u64, String)>);

impl Maps {
    fn of(pid: u32) -> Maps {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        Maps(text.lines().filter_map(parse_map_line).collect())
    }

    fn name(&self, frame: &str) -> String {
        let Some(addr) = frame
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            return frame.to_string();
        };
        match self
            .0
            .iter()
            .find(|(lo, hi, _, _)| (*lo..*hi).contains(&addr))
        {
            Some((lo, _, off, file)) if !file.is_empty() && !file.starts_with('[') => {
                let base = file.rsplit('/').next().unwrap_or(file);
                format!("{base}+{:#x}", addr - lo + off)
            }
            _ => format!("{frame} ({JIT})"),
        }
    }

    /// Whether `addr` is in an executable mapping of a file (code with symbols).
    fn in_file_code(&self, addr: u64) -> bool {
        self.0
            .iter()
            .any(|(lo, hi, _, f)| (*lo..*hi).contains(&addr) && f.starts_with('/'))
    }
}

const JIT: &str = "JIT-compiled code: no unwind information past it";
/// The line before the frames a scan found.
pub const SCANNED: &str =
    "-- scanned past it (return addresses found on the stack; may hold stale frames) --";
/// Stack bytes a scan reads, and the candidates it names.
const SCAN_BYTES: u64 = 128 * 1024;
const SCAN_CANDIDATES: usize = 256;

/// The return addresses on a stopped thread's stack (breakpad's stack scanning): words that
/// point into a file's code just after a call instruction, named by `eu-addr2line`. For a
/// thread whose unwinding ends in code without unwind information; none for a running thread.
fn scan(pid: u32, tid: u32, maps: &Maps) -> Option<Vec<String>> {
    use std::os::unix::fs::FileExt;
    // "-1 SP PC" for a thread stopped outside a system call; "running" for a running one.
    let sys = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let words: Vec<&str> = sys.split_whitespace().collect();
    if words.len() < 3 {
        return None;
    }
    let sp = u64::from_str_radix(words[words.len() - 2].trim_start_matches("0x"), 16).ok()?;
    let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let end = maps_text.lines().find_map(|l| {
        let (lo, hi) = l.split_whitespace().next()?.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        (lo..hi).contains(&sp).then_some(hi)
    })?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut stack = vec![0u8; (end - sp).min(SCAN_BYTES) as usize];
    let n = mem.read_at(&mut stack, sp).ok()?;
    let mut found: Vec<u64> = Vec::new();
    for w in stack[..n].chunks_exact(8) {
        let addr = u64::from_le_bytes(w.try_into().ok()?);
        if addr < 8 || !maps.in_file_code(addr) {
            continue;
        }
        let mut code = [0u8; 7];
        if mem.read_exact_at(&mut code, addr - 7).is_ok() && after_call(&code) {
            found.push(addr);
            if found.len() == SCAN_CANDIDATES {
                break;
            }
        }
    }
    if found.is_empty() {
        return None;
    }
    let names = addr2line(pid, &found).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for (i, addr) in found.iter().enumerate() {
        let name = names
            .get(i)
            .filter(|n| !n.starts_with("??"))
            .map(|n| demangle(n))
            .unwrap_or_else(|| maps.name(&format!("{addr:#x}")));
        if out.last() != Some(&name) {
            out.push(name);
        }
        if out.len() == MAX_FRAMES {
            break;
        }
    }
    Some(out)
}

/// Whether the 7 bytes before a return address end with an x86-64 call: `E8 rel32`, or
/// `FF /2` through a register, `[reg+disp8]`, `[SIB+disp8]` or `[rip/reg+disp32]`.
fn after_call(b: &[u8; 7]) -> bool {
    let call_ff = |op: u8, modrm: u8, len: u8| {
        op == 0xFF && (modrm >> 3) & 7 == 2 && {
            let (md, rm) = (modrm >> 6, modrm & 7);
            match len {
                2 => md == 3,
                3 => md == 1 && rm != 4,
                4 => md == 1 && rm == 4,
                6 => md == 2 || (md == 0 && rm == 5),
                _ => false,
            }
        }
    };
    b[2] == 0xE8
        || call_ff(b[5], b[6], 2)
        || call_ff(b[4], b[5], 3)
        || call_ff(b[3], b[4], 4)
        || call_ff(b[1], b[2], 6)
}

/// `eu-addr2line -p PID -f ADDR...`: a function name per address ("??" when none).
fn addr2line(pid: u32, addrs: &[u64]) -> Option<Vec<String>> {
    let out = Command::new("eu-addr2line")
        .args(["-p", &pid.to_string(), "-f"])
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Two lines an address: the function ("f inlined at FILE:LINE in g" for an inlined
    // one: f), then file:line.
    Some(
        text.lines()
            .step_by(2)
            .map(|l| l.split(" inlined at ").next().unwrap_or(l).to_string())
            .collect(),
    )
}

/// `lo-hi perms offset dev inode path` of an executable mapping.
fn parse_map_line(line: &str) -> Option<(u64, u64, u64, String)> {
    let mut f = line.split_whitespace();
    let (range, perms, off) = (f.next()?, f.next()?, f.next()?);
    if !perms.contains('x') {
        return None;
    }
    let (lo, hi) = range.split_once('-')?;
    let path = f.nth(2).unwrap_or("").to_string();
    Some((
        u64::from_str_radix(lo, 16).ok()?,
        u64::from_str_radix(hi, 16).ok()?,
        u64::from_str_radix(off, 16).ok()?,
        path,
    ))
}

/// The stacks of another rank (from its heartbeat: pid, host), taken from outside within
/// `limit` for capture request `id` by `captured_by` ("rank N", "launcher"): no trace and no
/// loader files (those only a rank knows of itself).
pub fn of_other_rank(b: &Heartbeat, id: u64, captured_by: String, limit: Duration) -> RankStacks {
    let t0 = Instant::now();
    let (threads, tool, err) = capture(b.pid, limit);
    RankStacks {
        id,
        rank: b.rank,
        host: b.host.clone(),
        pid: b.pid,
        captured_by,
        state: process_state(b.pid).map_or_else(|| "gone".into(), String::from),
        tool: tool.map(String::from),
        error: err.map(|e| e.to_string()),
        heartbeat: Some(b.clone()),
        trace: Vec::new(),
        loaders: Vec::new(),
        threads,
        time: tchrun::files::timestamp_now(),
        took_ms: t0.elapsed().as_millis() as u64,
    }
}

/// The process's state letter (`R`, `S`, `D`, `T`, `t`, `Z`), none when it is gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    state_of_stat(&stat)
}

fn state_of_stat(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether `pid` is a tchrun-worker (not a process that reused its number).
pub fn is_worker(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|b| *b == 0)
                .next()
                .is_some_and(|arg0| String::from_utf8_lossy(arg0).ends_with("tchrun-worker"))
        })
        .unwrap_or(false)
}

/// Every thread of `pid`, from `/proc/<pid>/task`: tid, name, state, wait channel; no frames.
pub fn threads_of(pid: u32) -> Vec<ThreadStack> {
    let task = PathBuf::from(format!("/proc/{pid}/task"));
    let Ok(rd) = std::fs::read_dir(&task) else {
        return Vec::new();
    };
    let mut out: Vec<ThreadStack> = rd
        .flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_string_lossy().parse().ok()?;
            let dir = e.path();
            let read = |f: &str| {
                std::fs::read_to_string(dir.join(f))
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            let state = read("stat")
                .and_then(|s| state_of_stat(&s))
                .map(String::from)
                .unwrap_or_default();
            Some(ThreadStack {
                tid,
                name: read("comm").unwrap_or_default(),
                wchan: read("wchan").filter(|w| !w.is_empty() && w != "0"),
                state,
                frames: Vec::new(),
            })
        })
        .collect();
    out.sort_by_key(|t| (t.tid != pid, t.tid));
    out
}

/// The tool to use: `TCHRUN_STACK_TOOL`, else eu-stack, else gdb.
fn tool() -> Result<&'static str, StackError> {
    match std::env::var(TOOL_VAR).ok().as_deref().map(str::trim) {
        Some("none") => Err(StackError::NoTool),
        Some("gdb") => Ok("gdb"),
        Some("eu-stack") => Ok("eu-stack"),
        _ if on_path("eu-stack") => Ok("eu-stack"),
        _ if on_path("gdb") => Ok("gdb"),
        _ => Err(StackError::NoTool),
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| tchrun::files::is_executable(&d.join(name)))
    })
}

/// Runs the tool on `pid` within `limit`; frames by thread.
fn unwind(
    tool: &'static str,
    pid: u32,
    limit: Duration,
) -> Result<BTreeMap<u32, Vec<String>>, StackError> {
    let pid_s = pid.to_string();
    let args: Vec<&str> = if tool == "gdb" {
        let bt = ["-ex", "set pagination off", "-ex", "thread apply all bt"];
        ["-nx", "-batch", "-p", &pid_s]
            .into_iter()
            .chain(bt)
            .collect()
    } else {
        // Raw names: demangled here, Rust's too (eu-stack knows only C++'s).
        vec!["-r", "-p", &pid_s]
    };
    let own = pid == std::process::id();
    // Unwinding this process: only the tool may trace it, only while it runs (Yama's
    // PR_SET_PTRACER with the tool's pid). The tool is started by a shell that waits for a
    // line on its stdin and then becomes the tool (same pid): the line is sent once allowed.
    let _self_capture = own.then(|| SELF_CAPTURE.lock().unwrap_or_else(|p| p.into_inner()));
    let mut cmd = if own {
        let mut c = Command::new("sh");
        c.args(["-c", "read _ && exec \"$0\" \"$@\"", tool])
            .args(&args)
            .stdin(Stdio::piped());
        c
    } else {
        let mut c = Command::new(tool);
        c.args(&args).stdin(Stdio::null());
        c
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|source| StackError::Spawn { tool, source })?;
    let _allowed = child
        .stdin
        .take()
        .map(|stdin| allow_tracer(child.id(), stdin));
    // Drain the pipes from threads of their own: a tool that fills one would never exit.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StackError::TimedOut {
                    tool,
                    secs: limit.as_secs(),
                });
            }
        }
    }
    let text = out.join().unwrap_or_default();
    let frames = if tool == "gdb" {
        parse_gdb(&text)
    } else {
        parse_eu_stack(&text)
    };
    if frames.is_empty() {
        let detail = err.join().unwrap_or_default();
        let detail = detail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(StackError::Failed {
            tool,
            detail: detail.trim().to_string(),
        });
    }
    Ok(frames)
}

/// One capture of this process at a time: Yama keeps one allowed tracer per process.
static SELF_CAPTURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The tool's allowance; dropping it withdraws it (the tool has ended or was killed).
struct Allowed;

/// Allows `tracer` (and only it) to trace this process, then lets it start (a line on its
/// stdin, which is then closed).
fn allow_tracer(tracer: u32, mut stdin: std::process::ChildStdin) -> Allowed {
    use std::io::Write;
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        nix::libc::prctl(
            nix::libc::PR_SET_PTRACER,
            tracer as nix::libc::c_ulong,
            0,
            0,
            0,
        )
    };
    // Without Yama the call fails (EINVAL) and nothing needs allowing: ptrace then follows
    // the plain same-user rule.
    let _ = rc;
    let _ = stdin.write_all(b"go\n");
    Allowed
}

impl Drop for Allowed {
    fn drop(&mut self) {
        // SAFETY: prctl with integer arguments only; 0 withdraws the allowance.
        unsafe { nix::libc::prctl(nix::libc::PR_SET_PTRACER, 0 as nix::libc::c_ulong, 0, 0, 0) };
    }
}

fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let mut buf = Vec::new();
            let _ = p.read_to_end(&mut buf);
            s = String::from_utf8_lossy(&buf).into_owned();
        }
        s
    })
}

/// eu-stack's output: `TID 354:` then `#0  0x00007fcb582b6f21 free` lines.
pub fn parse_eu_stack(text: &str) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut cur: Option<u32> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("TID ") {
            cur = rest.trim_end_matches(':').trim().parse().ok();
            if let Some(t) = cur {
                out.entry(t).or_default();
            }
            continue;
        }
        let (Some(t), Some(rest)) = (cur, line.strip_prefix('#')) else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let _n = parts.next();
        let Some(addr) = parts.next() else { continue };
        let name: Vec<&str> = parts.collect();
        let frame = if name.is_empty() {
            addr.to_string()
        } else {
            demangle(&name.join(" "))
        };
        let frames = out.entry(t).or_default();
        if frames.len() < MAX_FRAMES {
            frames.push(frame);
        }
    }
    out
}

/// gdb's `thread apply all bt`: `Thread 2 (Thread 0x7f.. (LWP 1235) "heartbeat"):` then
/// `#0  0x00007f.. in clock_nanosleep () from /lib/..` or `#1  std::thread::sleep (..) at ..`.
pub fn parse_gdb(text: &str) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut cur: Option<u32> = None;
    for line in text.lines() {
        if line.starts_with("Thread ") {
            cur = line
                .split_once("(LWP ")
                .and_then(|(_, r)| r.split(')').next())
                .and_then(|n| n.trim().parse().ok());
            if let Some(t) = cur {
                out.entry(t).or_default();
            }
            continue;
        }
        let (Some(t), Some(rest)) = (cur, line.strip_prefix('#')) else {
            continue;
        };
        let rest = rest
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start();
        let rest = match rest.split_once(" in ") {
            Some((addr, r)) if addr.starts_with("0x") => r,
            _ => rest,
        };
        let name = rest.split(" (").next().unwrap_or(rest).trim();
        let name = name.split("@@").next().unwrap_or(name);
        let frames = out.entry(t).or_default();
        if !name.is_empty() && frames.len() < MAX_FRAMES {
            frames.push(name.to_string());
        }
    }
    out
}

/// A symbol demangled: Rust's (legacy and v0, without the hash), else C++'s, else as it is.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    // Versioned C symbols ("__libc_start_main@@GLIBC_2.34") and C++ ones with a suffix.
    let (base, _) = name.split_once('@').unwrap_or((name, ""));
    if base.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(base) {
            if let Ok(d) = sym.demangle(&cpp_demangle::DemangleOptions::new().no_params()) {
                return d;
            }
        }
    }
    base.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real eu-stack -r output of a training rank (elfutils 0.188), cut short.
    const EU_STACK: &str = "PID 354 - process
TID 354:
#0  0x00007fcb582b6f21 free
#1  0x00007fcb7f0c5872 dnnl_memory_desc_destroy
#2  0x00007fcb71f303d9 _ZNK5ideep6tensor20reorder_if_differ_inERKNS0_4descERKNS_6attr_tE
#3  0x000055867fe334ab atg_conv2d
#4  0x000055867fceb9cc _ZN13tchrun_worker5train4step10train_step17hcfc69b4cf17e8293E
#5  0x00005586803f34d4 _RNvNtCsjrHSEGnQ3l9_3std2rt19lang_start_internal
#6  0x00007fcb5822b305 __libc_start_main@@GLIBC_2.34
TID 365:
#0  0x00007fcb58326f36 epoll_wait
#1  0x00007fcb79227b6d _ZN4gloo9transport3tcp4Loop3runEv
#2  0x00007fcb85ad44a3
";

    /// gdb 13's `thread apply all bt`, cut short.
    const GDB: &str = "[Thread debugging using libthread_db enabled]
0x00007f3c1e2a3f16 in __futex_abstimed_wait_common () from /lib/x86_64-linux-gnu/libc.so.6

Thread 2 (Thread 0x7f3c1a5ff6c0 (LWP 1235) \"heartbeat\"):
#0  0x00007f3c1e2ed545 in clock_nanosleep () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x000055d1c2f7f07 in std::thread::sleep (dur=...) at library/std/src/thread/mod.rs:873
#2  tchrun_worker::heartbeat::start::{closure#0} () at worker/src/heartbeat/mod.rs:120

Thread 1 (Thread 0x7f3c1d8a1b80 (LWP 1234) \"tchrun-worker\"):
#0  0x00007f3c1e2a3f16 in __futex_abstimed_wait_common () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f3c1e2a65d8 in pthread_cond_wait@@GLIBC_2.3.2 () from /lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn eu_stack_and_gdb_output_become_frames_by_thread_with_names_demangled() {
        let f = parse_eu_stack(EU_STACK);
        assert_eq!(f.keys().copied().collect::<Vec<_>>(), [354, 365]);
        assert_eq!(
            f[&354],
            [
                "free",
                "dnnl_memory_desc_destroy",
                "ideep::tensor::reorder_if_differ_in",
                "atg_conv2d",
                "tchrun_worker::train::step::train_step",
                "std::rt::lang_start_internal",
                "__libc_start_main",
            ]
        );
        assert_eq!(
            f[&365],
            [
                "epoll_wait",
                "gloo::transport::tcp::Loop::run",
                "0x00007fcb85ad44a3"
            ]
        );
        let g = parse_gdb(GDB);
        assert_eq!(g.keys().copied().collect::<Vec<_>>(), [1234, 1235]);
        assert_eq!(
            g[&1235],
            [
                "clock_nanosleep",
                "std::thread::sleep",
                "tchrun_worker::heartbeat::start::{closure#0}"
            ]
        );
        assert_eq!(g[&1234][1], "pthread_cond_wait");
        assert_eq!(state_of_stat("354 (tchrun (worker)) T 1 2 3"), Some('T'));
        let maps = Maps(
            [
                "7f00000000-7f00001000 r-xp 00002000 fe:01 42 /usr/lib/libgomp.so.1",
                "7f10000000-7f10001000 rwxp 00000000 00:00 0 ",
            ]
            .iter()
            .filter_map(|l| parse_map_line(l))
            .collect(),
        );
        assert_eq!(maps.name("0x7f00000010"), "libgomp.so.1+0x2010");
        assert!(maps.name("0x7f10000010").contains("JIT-compiled"));
        assert_eq!(maps.name("free"), "free");
        // call rel32; call *%rax; call *0x10(%rbx); call *0x8(%rsp); call *0x1234(%rip)
        assert!(after_call(&[0, 0, 0xE8, 1, 2, 3, 4]));
        assert!(after_call(&[0, 0, 0, 0, 0, 0xFF, 0xD0]));
        assert!(after_call(&[0, 0, 0, 0, 0xFF, 0x53, 0x10]));
        assert!(after_call(&[0, 0, 0, 0xFF, 0x54, 0x24, 0x08]));
        assert!(after_call(&[0, 0xFF, 0x15, 0x34, 0x12, 0, 0]));
        assert!(!after_call(&[0x90; 7]) && !after_call(&[0, 0, 0, 0, 0, 0xFF, 0xE0]));
    }

    #[test]
    fn a_child_process_is_unwound_and_its_threads_named() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let threads = threads_of(pid);
        assert_eq!(threads.len(), 1);
        assert_eq!((threads[0].tid, threads[0].name.as_str()), (pid, "sleep"));
        assert!(!is_worker(pid));
        let (threads, tool, err) = capture(pid, Duration::from_secs(20));
        let _ = child.kill();
        let _ = child.wait();
        if tool.is_none() {
            // No eu-stack or gdb on this machine: said as such.
            assert!(matches!(err, Some(StackError::NoTool)), "{err:?}");
            assert!(
                std::env::var("TCHRUN_REQUIRE_PRIVILEGED").is_err(),
                "setup installs elfutils"
            );
            return;
        }
        assert!(err.is_none(), "{err:?}");
        let frames = &threads[0].frames;
        assert!(
            frames
                .iter()
                .any(|f| f.contains("nanosleep") || f.contains("sleep")),
            "{frames:?}"
        );
    }
}
