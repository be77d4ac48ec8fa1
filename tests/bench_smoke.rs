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

/// `scripts/bench.sh --matrix --smoke`: one cell of each part (the step alone, the whole trainer
/// on 2 ranks, the whole small job), each measured on both sides and written as a ratio; never
/// into the repository's BENCHMARKS.md.
#[test]
fn bench_matrix_smoke_measures_each_part_against_pytorch() {
    let _ = bin_dir();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let t = tempdir();
    let out = t.path().join("matrix");
    let r = run(
        Command::new("bash")
            .arg(root.join("scripts/bench.sh"))
            .args(["--matrix", "--smoke", "--out"])
            .arg(&out)
            .current_dir(root),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let table = read(&out.join("MATRIX.md"));
    assert!(
        table.contains(
            "| part | cell | unit | tchrun | PyTorch | tchrun / PyTorch | target | met |"
        ),
        "{table}"
    );
    for (part, cell) in [
        ("step", "32 px, batch 4, 1 process"),
        ("train", "32 px, batch 4, 2 rank(s)"),
        ("job", "digits, 32 px, batch 16, 2 ranks, 2 epochs"),
    ] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {part} | {cell} |")))
            .unwrap_or_else(|| panic!("no {part} row for {cell}:\n{table}"));
        // Both sides measured: positive numbers, and a ratio.
        let cols: Vec<&str> = row.split('|').map(str::trim).collect();
        for v in &cols[4..6] {
            let x: f64 = v
                .parse()
                .unwrap_or_else(|_| panic!("not a number '{v}' in {row}"));
            assert!(x > 0.0, "{row}");
        }
        assert!(cols[6].ends_with('x'), "{row}");
    }
    assert!(
        r.stdout
            .contains(&out.join("MATRIX.md").display().to_string()),
        "{}",
        r.explain()
    );
}
