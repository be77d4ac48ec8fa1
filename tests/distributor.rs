//! `import tchrun` (issue 49, item 1): `tchrun.TorchDistributor(...).run(fn, *args)` runs a
//! Python function (or `.run("file.py", *argv)` a file) on ranks started by this build's
//! `tchrun exec`, and gives the caller rank 0's return value, a rank's exception with its rank,
//! host and traceback (`failure.json` attached), a refusal of an oversized value, and Ctrl-C
//! passed on to every rank. Each test is one case of `tests/python/distributor_check.py`, run by
//! the venv's Python with real ranks (no mocks).
mod common;

use common::*;
use std::sync::Mutex;
use std::time::Duration;

/// Two ranks that import torch start in seconds; a case runs one to three jobs.
const LIMIT: Duration = Duration::from_secs(240);

/// One case at a time: each starts two Python ranks, and the CI machine is small.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `distributor_check.py CASE` in a temp folder with this build's `tchrun` and the
/// checkout's package; the case passed when it printed `ok: CASE`.
fn check(case: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempdir();
    let r = run(
        python()
            .arg(repo().join("tests/python/distributor_check.py"))
            .arg(case)
            .current_dir(t.path())
            .env("TCHRUN_BIN", bin_dir().join("tchrun"))
            .env("PYTHONPATH", repo().join("python"))
            .env_remove("TCHRUN_LOG_DIR")
            .env_remove("TCHRUN_LAUNCHER")
            .env_remove("TCHRUN_CONSOLE"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(&format!("ok: {case} (")),
        "{}",
        r.explain()
    );
}

/// The seed's example (SimpleModel, DataLoader, SGD), unchanged but for the import line, on 2
/// local ranks: returns None, every rank's driver log written, no failure.
#[test]
fn the_seeds_example_runs_on_two_local_ranks() {
    check("seed-local");
}

/// The same under `--launcher mpirun`.
#[test]
fn the_seeds_example_runs_on_two_ranks_under_mpirun() {
    check("seed-mpirun");
}

/// A function that calls `init_process_group()` with no arguments and all-reduces: rank 0's
/// dict (its rank, the sum over both ranks, a keyword argument, torchrun's variables) comes
/// back to the caller.
#[test]
fn rank_0s_dict_comes_back_from_two_local_ranks() {
    check("dict-local");
}

/// The same under `--launcher mpirun`.
#[test]
fn rank_0s_dict_comes_back_under_mpirun() {
    check("dict-mpirun");
}

/// Rank 1 raises while rank 0 waits in a barrier: the caller gets `tchrun.RankError` naming rank
/// 1, its host, the exception and the traceback from the caller's own file, with `failure.json`
/// (rank 1) attached and tchrun's exit code 4.
#[test]
fn an_exception_on_rank_1_is_raised_in_the_caller_naming_rank_1_with_its_traceback() {
    check("rank-error");
}

/// A value under `max_result_bytes` comes back; one over it is refused with
/// `tchrun.ResultTooLarge`, whose message says to return a path.
#[test]
fn a_return_value_over_the_bound_is_refused_saying_to_return_a_path() {
    check("too-large");
}

/// `.run("train.py", *argv)`: the file runs on every rank with its argv and the process group;
/// a file that raises on rank 1 gives a `RankError` naming the file.
#[test]
fn a_python_file_runs_on_every_rank() {
    check("script");
}

/// SIGINT to a caller whose ranks sleep: it raises KeyboardInterrupt, and no rank (nor its
/// tchrun-worker, nor tchrun) is alive within 15 s; no private folder is left.
#[test]
fn ctrl_c_in_the_caller_leaves_no_rank_alive() {
    check("ctrl-c");
}

/// SIGKILL to that caller (a notebook's kernel killed): tchrun gets SIGTERM as its parent dies
/// (PDEATHSIG) and stops the ranks; none (nor its tchrun-worker, nor tchrun) is alive within
/// 15 s.
#[test]
fn a_killed_caller_leaves_no_rank_alive() {
    check("caller-killed");
}
