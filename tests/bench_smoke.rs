//! CI smoke of the benchmark runner (issue 6): `scripts/bench.sh --smoke` runs tchrun and the
//! PyTorch reference on a tiny generated dataset and writes its table. No timing assertions:
//! performance is measured by the benchmark itself, never by tests.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(8 * 60);

const ROWS: [&str; 9] = [
    "Training throughput, 1 rank",
    "Training throughput, 2 ranks",
    "Time to first step",
    "Training step alone, synthetic tensors",
    "Input pipeline, 224x224",
    "Peak RSS per rank (VmHWM), 1 rank",
    "Peak RSS per rank (VmHWM), 2 ranks",
    "Peak PSS per rank incl. loader processes",
    "All-reduce busbw, 2 ranks",
];

#[test]
fn bench_smoke_produces_the_table() {
    let _ = bin_dir(); // the runner uses target/release: fail early with the build hint
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let t = tempdir();
    let out = t.path().join("bench");
    let r = run(
        Command::new("bash")
            .arg(root.join("scripts/bench.sh"))
            .arg("--smoke")
            .arg("--out")
            .arg(&out)
            .current_dir(root),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let table = read(&out.join("BENCHMARKS.md"));
    for row in ROWS {
        assert!(
            table.contains(&format!("| {row}")),
            "table lacks row '{row}':\n{table}"
        );
    }
    assert!(
        table.contains("| benchmark | unit | tchrun | reference | tchrun / reference |"),
        "{table}"
    );
    assert!(table.contains("Machine: `nproc` = "), "{table}");
    // The smoke never touches the repository's BENCHMARKS.md.
    assert!(
        r.stdout
            .contains(&out.join("BENCHMARKS.md").display().to_string()),
        "{}",
        r.explain()
    );
}
