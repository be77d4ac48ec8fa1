//! Fuzzing the `.pth` reader on stable Rust (issue 51, item 6): structure-aware generation
//! (pickles from a grammar of the opcodes the reader knows and refuses, state dicts with
//! random views, lying zip archives) and random mutations of real torchvision `.pth` files.
//!
//! Every case is checked for three properties:
//! - **no panic**: the reader returns `Ok` or a typed error (a panic anywhere, even one the
//!   reader catches, fails the run);
//! - **bounded allocation**: a counting global allocator measures the peak bytes live while
//!   the reader runs and the largest single request; both stay under [`peak_bound`] and
//!   [`request_bound`], linear in the file's size and its pickle's;
//! - **no read outside the archive**: generated state dicts are checked against a reference
//!   that gathers each view element by element: a view reaching past its storage is refused,
//!   and every tensor returned equals the reference bit for bit.
//!
//! Time-boxed for CI: `TCHRUN_FUZZ_SECONDS` (default 24) is shared among the stages, each
//! also bounded in cases; `TCHRUN_FUZZ_SEED` replays a run (its seed is printed).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod mutate;
mod pickle;
mod regressions;
mod rng;
mod seeds;
mod statedict;
mod zipw;

/// Counts live bytes, their peak and the largest single request.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The case running (stage tag << 48 | index), named if the allocator must abort.
static CASE: AtomicU64 = AtomicU64::new(0);
/// A request no case may make: the allocator names the case and aborts rather than let the
/// system fail it later.
const HARD_LIMIT: usize = 2 << 30;

fn grow(n: usize) {
    LARGEST.fetch_max(n, Relaxed);
    if n > HARD_LIMIT {
        let case = CASE.load(Relaxed);
        eprintln!(
            "fuzz: a request of {n} bytes in stage {} case {}",
            case >> 48,
            case & 0xffff_ffff_ffff
        );
        std::process::abort();
    }
    let now = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grow(l.size());
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        grow(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // Counted as the new block allocated before the old one is freed.
        grow(new);
        let q = System.realloc(p, l, new);
        if q.is_null() {
            LIVE.fetch_sub(new, Relaxed);
        } else {
            LIVE.fetch_sub(l.size(), Relaxed);
        }
        q
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The bound on the peak bytes live while the reader runs on a file of `file` bytes whose
/// pickle has `pickle` bytes: the pickle's copy, the storages read (their entries cannot hold
/// more than the file), the tensors returned (at most 4 times the file, the reader's
/// `MAX_OUTPUT_FACTOR`, plus 1 MiB), the zip reader's directory (one record per 46-byte
/// central header); the unpickler's values (at most one per pickle byte: a 24-byte stack slot
/// and an 80-byte object, in vectors and hash tables up to twice their length); a constant.
pub fn peak_bound(file: usize, pickle: usize) -> usize {
    16 * file + 256 * pickle + (16 << 20)
}

/// The bound on any single request: a storage, a tensor or the pickle (each at most the
/// file), or one of the unpickler's vectors (at most one value per pickle byte, twice over).
pub fn request_bound(file: usize, pickle: usize) -> usize {
    4 * file + 192 * pickle + (1 << 20)
}

/// What a stage saw: cases run, results, the worst ratios of peak to bound.
#[derive(Default, Debug)]
pub struct Tally {
    pub cases: u64,
    pub ok: u64,
    pub refused: u64,
    pub worst_peak: usize,
    pub worst_request: usize,
    pub worst_time: Duration,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cases ({} read, {} refused); largest peak {} B, largest request {} B, slowest \
             case {:?}",
            self.cases, self.ok, self.refused, self.worst_peak, self.worst_request, self.worst_time
        )
    }
}

/// Cases measure the allocator alone: one at a time in this binary.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    install_panic_counter();
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic, those the reader catches included (its zip layer runs under
/// `catch_unwind`), so none can hide.
fn install_panic_counter() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(mut p) = PANICS.lock() {
                p.push(info.to_string());
            }
            default(info);
        }));
    });
}

/// The run's seed: `TCHRUN_FUZZ_SEED`, or the clock's.
pub fn seed() -> u64 {
    match std::env::var("TCHRUN_FUZZ_SEED") {
        Ok(s) => s.parse().expect("TCHRUN_FUZZ_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// This stage's share of `TCHRUN_FUZZ_SECONDS` (default 24 in all).
pub fn time_box(share: f64) -> Duration {
    let total: f64 = std::env::var("TCHRUN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24.0);
    Duration::from_secs_f64(total * share)
}

/// Runs the reader on one case and checks no panic, the allocation bounds and the time; the
/// result for the caller's own checks. A failing case is saved for replay.
pub fn check(
    stage: u64,
    index: u64,
    seed: u64,
    bytes: &[u8],
    pickle: usize,
    tally: &mut Tally,
) -> Result<tchrun_pth::StateDict, tchrun_pth::PthError> {
    let replay = || {
        let dir = std::env::temp_dir().join("tchrun-fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join(format!("stage{stage}-seed{seed}-case{index}.pth"));
        let _ = std::fs::write(&file, bytes);
        format!(
            "stage {stage} case {index} (TCHRUN_FUZZ_SEED={seed}); its {} bytes are in {}",
            bytes.len(),
            file.display()
        )
    };
    CASE.store(stage << 48 | index, Relaxed);
    let panics_before = PANICS.lock().map(|p| p.len()).unwrap_or(0);
    LARGEST.store(0, Relaxed);
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let t0 = Instant::now();
    let result = std::panic::catch_unwind(|| tchrun_pth::read_bytes(bytes, "fuzz.pth"));
    let took = t0.elapsed();
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    let largest = LARGEST.load(Relaxed);
    let panics: Vec<String> = PANICS
        .lock()
        .map(|p| p[panics_before..].to_vec())
        .unwrap_or_default();
    assert!(panics.is_empty(), "a panic: {panics:?} in {}", replay());
    let Ok(result) = result else {
        panic!("the reader panicked on {}", replay());
    };
    assert!(
        peak <= peak_bound(bytes.len(), pickle),
        "{peak} bytes live at the peak, over the bound {} for {}",
        peak_bound(bytes.len(), pickle),
        replay()
    );
    assert!(
        largest <= request_bound(bytes.len(), pickle),
        "a request of {largest} bytes, over the bound {} for {}",
        request_bound(bytes.len(), pickle),
        replay()
    );
    assert!(took < Duration::from_secs(5), "{took:?} on {}", replay());
    if let Ok(sd) = &result {
        for t in &sd.tensors {
            let numel: usize = t.shape.iter().product();
            let es = t.data.len().checked_div(numel).unwrap_or(0);
            assert!(
                numel == 0 && t.data.is_empty() || [1, 2, 4, 8].contains(&es),
                "tensor {} of shape {:?} has {} bytes: {}",
                t.name,
                t.shape,
                t.data.len(),
                replay()
            );
            assert_eq!(t.data.len(), numel * es, "{}", replay());
        }
    }
    tally.cases += 1;
    if result.is_ok() {
        tally.ok += 1;
    } else {
        tally.refused += 1;
    }
    tally.worst_peak = tally.worst_peak.max(peak);
    tally.worst_request = tally.worst_request.max(largest);
    tally.worst_time = tally.worst_time.max(took);
    result
}

/// Runs `case(index)` until the time box or `max` cases, whichever ends first.
pub fn for_cases(limit: Duration, max: u64, mut case: impl FnMut(u64)) -> u64 {
    let t0 = Instant::now();
    let mut i = 0;
    while i < max && t0.elapsed() < limit {
        case(i);
        i += 1;
    }
    i
}

/// Grammar pickles (opcode soup, and state dicts perturbed op by op) in a valid archive.
#[test]
fn fuzz_generated_pickles() {
    let _one = exclusive();
    let seed = seed();
    let mut tally = Tally::default();
    let n = for_cases(time_box(0.3), 2_000_000, |i| {
        let mut rng = rng::Rng::new(seed, 1, i);
        let ops = if rng.chance(2) {
            let long = rng.chance(10);
            let len = 1 + rng.below(if long { 4000 } else { 60 });
            pickle::soup(&mut rng, len)
        } else {
            let mut ops = statedict::generate(&mut rng).ops();
            pickle::perturb(&mut rng, &mut ops);
            ops
        };
        let pkl = pickle::serialize(&ops);
        let p = pkl.len();
        let n = rng.below(256);
        let file = zipw::write(
            &[
                zipw::Entry::new("archive/data.pkl", pkl),
                zipw::Entry::new("archive/data/0", rng.bytes(n)),
            ],
            zipw::Tail::default(),
        );
        let _ = check(1, i, seed, &file, p, &mut tally);
    });
    eprintln!("fuzz: generated pickles, seed {seed}: {tally}");
    assert_eq!(n, tally.cases);
    assert!(tally.cases >= 100, "too few cases in the time box: {tally}");
}

/// Generated state dicts in archives, checked against the reference; then the same archives
/// with lying entries (sizes, CRCs, methods, names, aliases, counts).
#[test]
fn fuzz_generated_state_dicts() {
    let _one = exclusive();
    let seed = seed();
    let mut tally = Tally::default();
    let mut agreed = 0u64;
    for_cases(time_box(0.3), 1_000_000, |i| {
        let mut rng = rng::Rng::new(seed, 2, i);
        let spec = statedict::generate(&mut rng);
        let pkl = pickle::serialize(&spec.ops());
        let p = pkl.len();
        if rng.chance(4) {
            let mut entries = spec.entries(pkl);
            let tail = mutate::entry_mutations(&mut rng, &mut entries);
            let file = zipw::write(&entries, tail);
            let _ = check(2, i, seed, &file, p, &mut tally);
            return;
        }
        let file = spec.archive(pkl);
        let got = check(2, i, seed, &file, p, &mut tally);
        let want = spec.expected(file.len());
        match (&got, &want) {
            (Err(_), None) => {}
            (Ok(sd), Some(want)) => {
                let got: Vec<_> = sd
                    .tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone(), t.data.clone()))
                    .collect();
                assert!(
                    got == *want,
                    "case {i} (TCHRUN_FUZZ_SEED={seed}): the tensors differ from the reference"
                );
            }
            (Ok(_), None) => panic!(
                "case {i} (TCHRUN_FUZZ_SEED={seed}): read, but the reference refuses it \
                 (a view past its storage, or data the archive does not hold)"
            ),
            (Err(e), Some(_)) => {
                panic!("case {i} (TCHRUN_FUZZ_SEED={seed}): refused a valid file: {e}")
            }
        }
        agreed += 1;
    });
    eprintln!(
        "fuzz: generated state dicts, seed {seed}: {tally}; {agreed} checked against the reference"
    );
    assert!(agreed >= 50, "too few cases in the time box: {tally}");
}

/// Mutants of real torchvision `.pth` files (written by the venv's torch).
#[test]
fn fuzz_mutated_torchvision_files() {
    let _one = exclusive();
    let seeds = seeds::corpus();
    let seed = seed();
    let mut tally = Tally::default();
    for (k, s) in seeds.iter().enumerate() {
        let r = check(
            3,
            u64::MAX >> 16,
            seed,
            &s.bytes,
            s.pickle_len(),
            &mut tally,
        );
        assert_eq!(
            r.is_ok(),
            !s.name.starts_with("complex"),
            "{}: {r:?}",
            s.name
        );
        assert!(s.entries.len() >= 4, "{}: entries found", s.name);
        let _ = k;
    }
    for_cases(time_box(0.4), 1_000_000, |i| {
        let mut rng = rng::Rng::new(seed, 3, i);
        let s = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())];
        let file = mutate::mutant(&mut rng, s, other);
        // A mutation splices at most 8 x 512 bytes into the pickle.
        let _ = check(3, i, seed, &file, s.pickle_len() + 4096, &mut tally);
    });
    eprintln!("fuzz: mutated torchvision files, seed {seed}: {tally}");
    assert!(tally.cases >= 100, "too few cases in the time box: {tally}");
}
