//! The test fault plan: every fault-injection hook a rank obeys (`TCHRUN_TEST_*`, see
//! `tchrun::env`), read from the environment in one place into one value. The training loop
//! asks the plan ("die before this step?") instead of reading variables itself. Never set any
//! of these in a real job.
use std::time::Duration;
use tchrun::env::{self, EnvError};

/// What this rank is told to do wrong, and when.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    /// `TCHRUN_TEST_KILL_AT_STEP` (this rank, first attempt only): SIGKILL just before this
    /// optimizer step, counted over the whole run.
    pub kill_at_step: Option<u64>,
    /// `TCHRUN_TEST_KILL_ON_HOST` (this host, every attempt): SIGKILL after this many optimizer
    /// steps of the attempt.
    pub kill_after_steps: Option<u64>,
    /// `TCHRUN_TEST_TORCH_PANIC` (this rank): a real libtorch exception before the first step.
    pub torch_panic: bool,
    /// `TCHRUN_TEST_CHECKPOINT_DELAY_S`: every background checkpoint write pauses this long.
    pub checkpoint_delay: Option<Duration>,
    /// `TCHRUN_TEST_STALL_AT_STEP` (this rank): the main thread sleeps this long before this
    /// optimizer step.
    pub stall: Option<(u64, Duration)>,
    /// `TCHRUN_TEST_ALLOCATE_AT_STEP` (this rank): the main thread allocates and touches this
    /// many MiB before this optimizer step.
    pub allocate: Option<(u64, u64)>,
    /// `TCHRUN_TEST_SLOW_STEP` (this rank or host): every optimizer step sleeps this long.
    pub slow_step: Option<Duration>,
    /// `TCHRUN_TEST_NAN_AT_STEP` (this rank): the input of this optimizer step is NaN.
    pub nan_at_step: Option<u64>,
    /// `TCHRUN_TEST_LOSS_SCALE` (every rank): the fp16 loss scaler runs on any device, from
    /// this initial scale.
    pub loss_scale: Option<f64>,
}

/// Why a rank kills itself now (a fault of the plan that is due).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// `TCHRUN_TEST_KILL_AT_STEP`, at this step.
    AtStep(u64),
    /// `TCHRUN_TEST_KILL_ON_HOST`, this many steps into the attempt.
    OnHost { step: u64, into_attempt: u64 },
}

impl Kill {
    /// The driver-log line said before the signal.
    pub fn line(&self) -> String {
        match self {
            Kill::AtStep(step) => {
                format!("{}: SIGKILL at step {step}", env::TCHRUN_TEST_KILL_AT_STEP)
            }
            Kill::OnHost { step, into_attempt } => format!(
                "{}: SIGKILL at step {step}, {into_attempt} step(s) into this attempt",
                env::TCHRUN_TEST_KILL_ON_HOST
            ),
        }
    }
}

impl FaultPlan {
    /// The plan for `rank` on `host`, from the variables `get` reads (the process environment
    /// in a rank; a table in tests). A malformed variable is an error naming it.
    pub fn read(
        get: &dyn Fn(&str) -> Option<String>,
        rank: usize,
        host: Option<&str>,
    ) -> Result<FaultPlan, EnvError> {
        let kill_at_step = env::test_kill_at_step(get)?.and_then(|(r, k)| (r == rank).then_some(k));
        let kill_after_steps = env::test_kill_on_host(get)?
            .and_then(|(h, n)| host.is_some_and(|here| here == h).then_some(n));
        let torch_panic =
            get(env::TCHRUN_TEST_TORCH_PANIC).is_some_and(|v| v.trim() == rank.to_string());
        Ok(FaultPlan {
            kill_at_step,
            kill_after_steps,
            torch_panic,
            checkpoint_delay: env::test_checkpoint_delay(get)?,
            stall: stall(get, rank)?,
            allocate: allocate(get, rank)?,
            slow_step: slow_for(get, env::TCHRUN_TEST_SLOW_STEP, rank, host)?,
            nan_at_step: nan_at_step(get, rank)?,
            loss_scale: loss_scale(get)?,
        })
    }

    /// The stall due before optimizer step `step`.
    pub fn stall_before(&self, step: u64) -> Option<Duration> {
        self.stall.filter(|(s, _)| *s == step).map(|(_, d)| d)
    }

    /// The MiB to allocate before optimizer step `step`.
    pub fn allocate_before(&self, step: u64) -> Option<u64> {
        self.allocate.filter(|(s, _)| *s == step).map(|(_, m)| m)
    }

    /// The kill due before optimizer step `step` of an attempt that started at `first_step`.
    pub fn kill_before(&self, step: u64, first_step: u64) -> Option<Kill> {
        if self.kill_at_step == Some(step) {
            return Some(Kill::AtStep(step));
        }
        self.kill_after_steps
            .filter(|n| step == first_step + n)
            .map(|n| Kill::OnHost {
                step,
                into_attempt: n,
            })
    }
}

/// `TCHRUN_TEST_NAN_AT_STEP=RANK:STEP`, for `rank`.
fn nan_at_step(get: &dyn Fn(&str) -> Option<String>, rank: usize) -> Result<Option<u64>, EnvError> {
    let Some(v) = get(env::TCHRUN_TEST_NAN_AT_STEP).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let parsed = v
        .trim()
        .split_once(':')
        .and_then(|(r, s)| Some((r.parse::<usize>().ok()?, s.parse::<u64>().ok()?)));
    match parsed {
        Some((r, step)) => Ok((r == rank).then_some(step)),
        None => Err(EnvError::Invalid {
            name: env::TCHRUN_TEST_NAN_AT_STEP,
            value: v.clone(),
            why: "expected RANK:STEP".into(),
        }),
    }
}

/// `TCHRUN_TEST_LOSS_SCALE=SCALE`: a finite scale > 0.
fn loss_scale(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<f64>, EnvError> {
    let Some(v) = get(env::TCHRUN_TEST_LOSS_SCALE).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(Some(s)),
        _ => Err(EnvError::Invalid {
            name: env::TCHRUN_TEST_LOSS_SCALE,
            value: v.clone(),
            why: "expected a finite scale > 0".into(),
        }),
    }
}

/// `TCHRUN_TEST_STALL_AT_STEP=RANK:STEP:SECONDS`, for `rank`.
fn stall(
    get: &dyn Fn(&str) -> Option<String>,
    rank: usize,
) -> Result<Option<(u64, Duration)>, EnvError> {
    let Some(v) = get(env::TCHRUN_TEST_STALL_AT_STEP).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let Some((r, step, d)) = parse_triple(&v) else {
        return Err(EnvError::Invalid {
            name: env::TCHRUN_TEST_STALL_AT_STEP,
            value: v.clone(),
            why: "expected RANK:STEP:SECONDS".into(),
        });
    };
    Ok((r == rank).then_some((step, d)))
}

/// `TCHRUN_TEST_STALL_DECODE=RANK:IMAGE:SECONDS`: called by the loader before each image it
/// decodes; on rank RANK, the IMAGE-th blocks for SECONDS. A malformed value is said once on
/// standard error and ignored (the loader has no error path for a test hook).
pub fn maybe_stall_decode(rank: usize) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PLAN: std::sync::OnceLock<Option<(usize, u64, Duration)>> = std::sync::OnceLock::new();
    static DECODED: AtomicU64 = AtomicU64::new(0);
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var(env::TCHRUN_TEST_STALL_DECODE).ok()?;
        let parsed = parse_triple(&v);
        if parsed.is_none() {
            eprintln!(
                "{}={v}: expected RANK:IMAGE:SECONDS; ignored",
                env::TCHRUN_TEST_STALL_DECODE
            );
        }
        parsed
    });
    if let Some((r, image, d)) = *plan {
        if r == rank && DECODED.fetch_add(1, Ordering::Relaxed) + 1 == image {
            std::thread::sleep(d);
        }
    }
}

/// `TCHRUN_TEST_SLOW_VALIDATION=SECONDS`: called before each validation batch; every rank
/// sleeps SECONDS there (a slow but progressing validation). Malformed: said once, ignored.
pub fn maybe_slow_validation_batch() {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let v = std::env::var(env::TCHRUN_TEST_SLOW_VALIDATION).ok()?;
        let d = v
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|x| Duration::try_from_secs_f64(x).ok());
        if d.is_none() {
            eprintln!(
                "{}={v}: expected SECONDS; ignored",
                env::TCHRUN_TEST_SLOW_VALIDATION
            );
        }
        d
    });
    if let Some(d) = delay {
        std::thread::sleep(*d);
    }
}

/// `WHO:SECONDS` of `name` (`TCHRUN_TEST_SLOW_STEP`, `TCHRUN_TEST_SLOW_LOADER`): the delay
/// when WHO is `rank` or `host`.
fn slow_for(
    get: &dyn Fn(&str) -> Option<String>,
    name: &'static str,
    rank: usize,
    host: Option<&str>,
) -> Result<Option<Duration>, EnvError> {
    let Some(v) = get(name).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let parsed = v.trim().rsplit_once(':').and_then(|(who, secs)| {
        let d = secs
            .parse::<f64>()
            .ok()
            .and_then(|x| Duration::try_from_secs_f64(x).ok())?;
        Some((who.to_string(), d))
    });
    let Some((who, d)) = parsed else {
        return Err(EnvError::Invalid {
            name,
            value: v.clone(),
            why: "expected RANK:SECONDS or HOST:SECONDS".into(),
        });
    };
    let here = who.parse::<usize>().is_ok_and(|r| r == rank) || host == Some(who.as_str());
    Ok(here.then_some(d))
}

/// `TCHRUN_TEST_SLOW_LOADER=WHO:SECONDS`: called by the loader before each image it decodes;
/// on rank or host WHO every decode sleeps SECONDS. Malformed: said once, ignored.
pub fn maybe_slow_decode(rank: usize) {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let host = nix::unistd::gethostname()
            .ok()
            .map(|h| h.to_string_lossy().to_string());
        let get = |k: &str| std::env::var(k).ok();
        match slow_for(&get, env::TCHRUN_TEST_SLOW_LOADER, rank, host.as_deref()) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{e}; ignored");
                None
            }
        }
    });
    if let Some(d) = delay {
        std::thread::sleep(*d);
    }
}

/// `A:B:SECONDS`.
fn parse_triple(v: &str) -> Option<(usize, u64, Duration)> {
    let parts: Vec<&str> = v.trim().split(':').collect();
    let [a, b, secs] = parts.as_slice() else {
        return None;
    };
    let d = secs
        .parse::<f64>()
        .ok()
        .and_then(|x| Duration::try_from_secs_f64(x).ok())?;
    Some((a.parse().ok()?, b.parse().ok()?, d))
}

/// Spins (busy, on this thread) for `d`: `TCHRUN_TEST_STALL_AT_STEP`'s rank in an endless
/// loop, as its stack shows it.
#[inline(never)]
pub fn spin_for(d: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// `TCHRUN_TEST_ALLOCATE_AT_STEP=RANK:STEP:MIB`, for `rank`.
fn allocate(
    get: &dyn Fn(&str) -> Option<String>,
    rank: usize,
) -> Result<Option<(u64, u64)>, EnvError> {
    let Some(v) = get(env::TCHRUN_TEST_ALLOCATE_AT_STEP).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let parts: Vec<&str> = v.trim().split(':').collect();
    let parsed = match parts.as_slice() {
        [r, s, m] => r
            .parse::<usize>()
            .ok()
            .zip(s.parse::<u64>().ok())
            .zip(m.parse::<u64>().ok()),
        _ => None,
    };
    let Some(((r, step), mib)) = parsed else {
        return Err(EnvError::Invalid {
            name: env::TCHRUN_TEST_ALLOCATE_AT_STEP,
            value: v.clone(),
            why: "expected RANK:STEP:MIB".into(),
        });
    };
    Ok((r == rank).then_some((step, mib)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn plan(vars: &[(&str, &str)], rank: usize, host: &str) -> Result<FaultPlan, EnvError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FaultPlan::read(&|k| m.get(k).cloned(), rank, Some(host))
    }

    #[test]
    fn nothing_set_is_no_fault() {
        let p = plan(&[], 0, "h").expect("plan");
        assert_eq!(p, FaultPlan::default());
        assert_eq!(p.kill_before(0, 0), None);
        assert_eq!(p.stall_before(0), None);
    }

    #[test]
    fn the_stall_is_for_its_rank_and_step() {
        let v = [(env::TCHRUN_TEST_STALL_AT_STEP, "1:3:2.5")];
        assert_eq!(plan(&v, 0, "h").unwrap().stall_before(3), None);
        let p = plan(&v, 1, "h").unwrap();
        assert_eq!(p.stall_before(3), Some(Duration::from_millis(2500)));
        assert_eq!(p.stall_before(2), None);
        assert!(plan(&[(env::TCHRUN_TEST_STALL_AT_STEP, "1:3")], 1, "h").is_err());
    }

    #[test]
    fn a_slow_step_is_for_its_rank_or_host() {
        let v = [(env::TCHRUN_TEST_SLOW_STEP, "1:0.25")];
        assert_eq!(plan(&v, 0, "h").unwrap().slow_step, None);
        assert_eq!(
            plan(&v, 1, "h").unwrap().slow_step,
            Some(Duration::from_millis(250))
        );
        let v = [(env::TCHRUN_TEST_SLOW_STEP, "tchrun-node2:0.1")];
        assert_eq!(plan(&v, 0, "tchrun-node1").unwrap().slow_step, None);
        assert_eq!(
            plan(&v, 3, "tchrun-node2").unwrap().slow_step,
            Some(Duration::from_millis(100))
        );
        let v = [(env::TCHRUN_TEST_SLOW_STEP, "1")];
        assert!(plan(&v, 1, "h")
            .unwrap_err()
            .to_string()
            .contains("RANK:SECONDS or HOST:SECONDS"));
    }

    #[test]
    fn the_allocation_is_for_its_rank_and_step() {
        let v = [(env::TCHRUN_TEST_ALLOCATE_AT_STEP, "1:4:2048")];
        assert_eq!(plan(&v, 0, "h").unwrap().allocate_before(4), None);
        let p = plan(&v, 1, "h").unwrap();
        assert_eq!(p.allocate_before(4), Some(2048));
        assert_eq!(p.allocate_before(3), None);
        assert!(plan(&[(env::TCHRUN_TEST_ALLOCATE_AT_STEP, "1:4")], 1, "h").is_err());
    }

    #[test]
    fn kill_at_step_is_for_its_rank_and_the_first_attempt() {
        let vars = [(env::TCHRUN_TEST_KILL_AT_STEP, "1:5")];
        assert_eq!(plan(&vars, 0, "h").expect("rank 0").kill_at_step, None);
        let p = plan(&vars, 1, "h").expect("rank 1");
        assert_eq!(p.kill_before(4, 0), None);
        assert_eq!(p.kill_before(5, 0), Some(Kill::AtStep(5)));
        let second = [
            (env::TCHRUN_TEST_KILL_AT_STEP, "1:5"),
            (env::TCHRUN_ATTEMPT, "2"),
        ];
        assert_eq!(plan(&second, 1, "h").expect("attempt 2").kill_at_step, None);
        assert!(plan(&[(env::TCHRUN_TEST_KILL_AT_STEP, "x")], 0, "h").is_err());
    }

    #[test]
    fn kill_on_host_counts_from_the_attempts_first_step() {
        let vars = [(env::TCHRUN_TEST_KILL_ON_HOST, "node2:3")];
        assert_eq!(
            plan(&vars, 0, "node1")
                .expect("other host")
                .kill_after_steps,
            None
        );
        let p = plan(&vars, 0, "node2").expect("node2");
        assert_eq!(p.kill_before(12, 10), None);
        let k = p.kill_before(13, 10).expect("due");
        assert_eq!(
            k,
            Kill::OnHost {
                step: 13,
                into_attempt: 3
            }
        );
        assert!(k.line().contains("3 step(s) into this attempt"));
    }

    #[test]
    fn torch_panic_and_checkpoint_delay() {
        let vars = [
            (env::TCHRUN_TEST_TORCH_PANIC, "1"),
            (env::TCHRUN_TEST_CHECKPOINT_DELAY_S, "0.5"),
        ];
        assert!(!plan(&vars, 0, "h").expect("rank 0").torch_panic);
        let p = plan(&vars, 1, "h").expect("rank 1");
        assert!(p.torch_panic);
        assert_eq!(p.checkpoint_delay, Some(Duration::from_millis(500)));
    }
}
