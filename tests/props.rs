//! Property tests (issue 7, item 8): the parsers of untrusted input never panic and keep their
//! invariants. `model.json`, hostfiles, the rank environment contracts (torchrun, Slurm), image
//! headers and decoding, the CLI flags, the LR schedule, and the evidence of a failure (kernel
//! log, cgroup files, libtorch/Gloo/NCCL/Slurm words).
//!
//! Default case counts keep the file under a minute on 2 cores. `PROPTEST_CASES=N` sets the
//! count of every property (the image ones run N/10, at least 16); e.g. a long run:
//! `PROPTEST_CASES=5000 cargo test --release --test props`.
//! Crashers found by these properties are kept below as plain named tests.

use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::Path;

use tchrun::env::{first_host, from_slurm, from_torchrun, tasks_per_node};
use tchrun::model::{self, Arch, ModelConfig, Normalization, TrainingRecord};
use tchrun::schedule::LrSchedule;
use tchrun_data::{self as data, Augment, ImageFolder, LoaderConfig, TrainAugment};
use tchrun_launcher::hostfile::{parse_hostfile, Host};
use tchrun_launcher::recognise::Recognise;

/// `PROPTEST_CASES` (divided by `div`, at least 16) or `default`.
fn cases(default: u32, div: u32) -> Config {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map(|n| (n / div).max(16))
        .unwrap_or(default);
    Config {
        cases: n,
        // Crashers are kept as named tests below, not in files beside the sources.
        failure_persistence: None,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------------
// model.json
// ---------------------------------------------------------------------------------------------

fn load_text(
    text: &[u8],
) -> (
    tempfile::TempDir,
    Result<ModelConfig, model::InvalidModelDirectory>,
) {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::write(d.path().join("model.json"), text).expect("write");
    let r = model::load(d.path(), false);
    (d, r)
}

/// A loaded configuration written back with `to_json` loads to the same configuration and the
/// same text.
///
/// Floats inside `training`/`metrics` are compared to 4 ulp: serde_json without its
/// `float_roundtrip` feature may read a printed f64 back 1 ulp off (see
/// `model_json_float_round_trip_is_exact`). Everything else must be exact.
fn assert_round_trip(cfg: &ModelConfig) {
    let text = model::to_json(cfg);
    let (_d, again) = load_text(text.as_bytes());
    let again = again.unwrap_or_else(|e| panic!("to_json output does not load: {e}\n{text}"));
    let same = again.format_version == cfg.format_version
        && again.arch == cfg.arch
        && again.input_size == cfg.input_size
        && again.normalization == cfg.normalization
        && again.class_names == cfg.class_names
        && opt_value_close(&record_value(&again.training), &record_value(&cfg.training))
        && opt_value_close(&again.metrics, &cfg.metrics);
    assert!(
        same,
        "round trip changed the configuration:\n{text}\n{again:?}\n!=\n{cfg:?}"
    );
}

/// `training` as the JSON it is written as (compared as JSON, like `metrics`).
fn record_value(r: &Option<TrainingRecord>) -> Option<serde_json::Value> {
    r.as_ref()
        .map(|r| serde_json::to_value(r).expect("a training record is JSON"))
}

fn opt_value_close(a: &Option<serde_json::Value>, b: &Option<serde_json::Value>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => value_close(a, b),
        _ => false,
    }
}

fn value_close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x.signum() == y.signum() && x.to_bits().abs_diff(y.to_bits()) <= 4)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| value_close(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| value_close(v, w)))
        }
        _ => a == b,
    }
}

/// Found by `model_json_valid_round_trips`: serde_json (default features) reads
/// `-9.642717173693765e226`, which it printed itself, back as `-9.642717173693763e226`, so
/// numbers in a model.json's `training`/`metrics` can change in the last digit on every
/// write/read. Fix: `serde_json = { version = "1", features = ["float_roundtrip"] }` in the
/// workspace dependencies.
#[test]
fn model_json_float_round_trip_is_exact() {
    let x = -9.642717173693765e226f64;
    let mut cfg = ModelConfig::untrained(Arch::Resnet18, 32, Normalization::default());
    cfg.training = Some(TrainingRecord {
        lr: x,
        ..record(
            (1, 1, 1, 1, 1, 1, 1, 1, 1),
            (0.1, 0.1, 0.9, 0.0, 2.0, 1.0, 1, false),
        )
    });
    let (_d, again) = load_text(model::to_json(&cfg).as_bytes());
    assert_eq!(again.expect("loads"), cfg);
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = serde_json::Value> {
    prop::collection::btree_map("[a-z_]{1,10}", json_value(), 0..6)
        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
}

fn finite_f32() -> impl Strategy<Value = f32> {
    use prop::num::f32::*;
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO
}

fn positive_f32() -> impl Strategy<Value = f32> {
    use prop::num::f32::*;
    POSITIVE | NORMAL | SUBNORMAL
}

type Counts = (u32, usize, u32, u32, u32, usize, u32, u64, usize);
type Rest = (f64, f64, f64, f64, f64, f64, i64, bool);

fn record(c: Counts, r: Rest) -> TrainingRecord {
    let (epochs, epochs_run, best_epoch, batch_size, warmup_epochs, world_size, patience, steps, n) =
        c;
    let (lr, effective_lr, momentum, weight_decay, lr_power, backbone_lr_scale, seed, frozen) = r;
    TrainingRecord {
        epochs,
        epochs_run,
        best_epoch,
        batch_size,
        warmup_epochs,
        lr,
        effective_lr,
        world_size,
        seed,
        patience,
        momentum,
        weight_decay,
        lr_power,
        steps,
        train_images: n,
        valid_images: n / 2,
        freeze_backbone: frozen,
        backbone_lr_scale,
        global_batch_size: (n % 3 == 0).then_some(n as u32),
        lr_scaling: tchrun::flags::LrScaling::Linear,
        lr_reference_batch: None,
        threads: None,
        mlflow_run_id: (n % 2 == 0).then(|| format!("run{n}")),
        recipe: Default::default(),
        augment: Default::default(),
        class_weights: Default::default(),
    }
}

fn training_record() -> impl Strategy<Value = TrainingRecord> {
    let f = || {
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .boxed()
    };
    (
        (
            any::<u32>(),
            any::<u32>().prop_map(|n| n as usize),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>().prop_map(|n| n as usize),
            any::<u32>(),
            any::<u64>(),
            any::<u32>().prop_map(|n| n as usize),
        ),
        (f(), f(), f(), f(), f(), f(), any::<i64>(), any::<bool>()),
    )
        .prop_map(|(c, r)| record(c, r))
}

fn model_config() -> impl Strategy<Value = ModelConfig> {
    (
        0..Arch::ALL.len(),
        model::MIN_INPUT_SIZE..=model::MAX_INPUT_SIZE,
        prop::array::uniform3(finite_f32()),
        prop::array::uniform3(positive_f32()),
        prop::collection::vec(".{0,12}", 0..12),
        prop::option::of(training_record()),
        prop::option::of(json_object()),
    )
        .prop_map(|(a, size, mean, std, classes, training, metrics)| {
            // Every architecture has its own smallest input size (DenseNet: 29); a ViT takes
            // whole patches only.
            let size = size.max(Arch::ALL[a].min_input_size());
            let size = Arch::ALL[a].patch_size().map_or(size, |p| size / p * p);
            let mut c = ModelConfig::untrained(Arch::ALL[a], size, Normalization { mean, std });
            c.class_names = classes;
            c.training = training;
            c.metrics = metrics;
            c
        })
}

/// An edit of a text: (position fraction, kind, byte).
fn mutations() -> impl Strategy<Value = Vec<(f64, u8, u8)>> {
    prop::collection::vec((0.0f64..1.0, 0u8..4, any::<u8>()), 1..8)
}

fn mutate(mut bytes: Vec<u8>, edits: &[(f64, u8, u8)]) -> Vec<u8> {
    const TOKENS: [&[u8]; 12] = [
        b"\"",
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"null",
        b"-1",
        b"1e999",
        b"\"resnet18\"",
        b"4294967296",
    ];
    for &(at, kind, b) in edits {
        let i = ((bytes.len() as f64) * at) as usize;
        let i = i.min(bytes.len());
        match kind {
            0 if i < bytes.len() => bytes[i] = b,
            1 if i < bytes.len() => {
                bytes.remove(i);
            }
            2 => bytes.insert(i, b),
            _ => {
                let t = TOKENS[b as usize % TOKENS.len()];
                bytes.splice(i..i, t.iter().copied());
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// Any bytes as model.json: an error or a configuration, never a panic.
    #[test]
    fn model_json_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let (_d, r) = load_text(&bytes);
        if let Ok(cfg) = r {
            assert_round_trip(&cfg);
        }
    }

    /// Arbitrary text shaped like JSON objects with the schema's keys.
    #[test]
    fn model_json_schema_shaped(
        fv in prop_oneof![Just("1".to_string()), "-?[0-9]{1,12}", Just("1.0".into()), Just("null".into())],
        arch in prop_oneof![Just("\"resnet18\"".to_string()), Just("\"densenet201\"".into()), "\"[a-zA-Z0-9]{0,12}\"", Just("7".into())],
        size in prop_oneof!["-?[0-9]{1,11}", Just("224".to_string()), Just("1e3".into()), Just("16".into()), Just("1024".into())],
        norm in prop_oneof![
            Just("".to_string()),
            "\"normalization\": \\{\"mean\": \\[[0-9.e-]{1,6}, [0-9.e-]{1,6}, [0-9.e-]{1,6}\\], \"std\": \\[[0-9.e-]{1,6}, [0-9.e-]{1,6}, [0-9.e-]{1,6}\\]\\},",
            Just("\"normalization\": null,".to_string()),
            Just("\"normalization\": {\"mean\": [0,0], \"std\": [1,1,1]},".to_string()),
        ],
        classes in prop_oneof![Just("".to_string()), "\"class_names\": \\[(\"[a-z]{0,3}\", ){0,3}\"x\"\\],", Just("\"class_names\": \"abc\",".to_string())],
    ) {
        let text = format!("{{{norm} {classes} \"format_version\": {fv}, \"arch\": {arch}, \"input_size\": {size}}}");
        let (_d, r) = load_text(text.as_bytes());
        if let Ok(cfg) = r {
            prop_assert_eq!(cfg.format_version, model::FORMAT_VERSION);
            prop_assert!(model::check_arch_input_size(cfg.arch, cfg.input_size).is_ok());
            assert_round_trip(&cfg);
        }
    }

    /// Every valid configuration round-trips through to_json and load.
    #[test]
    fn model_json_valid_round_trips(cfg in model_config()) {
        assert_round_trip(&cfg);
    }

    /// Valid model.json texts with random edits: never a panic; what still loads round-trips.
    #[test]
    fn model_json_mutated(cfg in model_config(), edits in mutations()) {
        let text = mutate(model::to_json(&cfg).into_bytes(), &edits);
        let (_d, r) = load_text(&text);
        if let Ok(cfg) = r {
            assert_round_trip(&cfg);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostfiles
// ---------------------------------------------------------------------------------------------

fn hostfile_token() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9.-]{1,8}",
        "slots=[0-9]{0,11}",
        "max_slots=[0-9]{0,11}",
        "max-slots=-?[0-9]{0,4}",
        Just("slots=4294967295".to_string()),
        Just("slots=".to_string()),
        Just("=".to_string()),
        Just("#".to_string()),
        "[ \t]{1,3}",
        Just("\n".to_string()),
        Just("\r\n".to_string()),
        ".{0,6}",
    ]
}

fn check_hosts(hosts: &[Host]) {
    for h in hosts {
        assert!(!h.name.is_empty(), "empty host name in {hosts:?}");
        assert!(
            !h.name.contains(char::is_whitespace) && !h.name.contains('#') && !h.name.contains('='),
            "bad host name {:?}",
            h.name
        );
        if let Some(s) = h.slots {
            assert!(s > 0, "host {} with {s} slots", h.name);
        }
    }
    let mut names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), hosts.len(), "repeated host names: {hosts:?}");
}

/// A `--console` token: numbers, ranges, `all`, `host:`, separators and noise.
fn console_token() -> impl Strategy<Value = String> {
    prop_oneof![
        (0usize..100_000).prop_map(|n| n.to_string()),
        Just("-".to_string()),
        Just(",".to_string()),
        Just("all".to_string()),
        Just("host:".to_string()),
        "[a-z0-9.]{1,6}",
        ".{0,3}",
    ]
}

proptest! {
    #![proptest_config(cases(1000, 1))]

    /// `--console` never panics, never names more ranks than a job has, and what it accepts
    /// reads back from its text (the launcher hands the ranks `--console=<that text>`).
    #[test]
    fn console_selection_round_trips(tokens in prop::collection::vec(console_token(), 0..12)) {
        use tchrun::console::Selection;
        let text = tokens.concat();
        match Selection::parse(&text) {
            Ok(sel) => {
                if let Selection::Ranks(r) = &sel {
                    prop_assert!(r.len() <= tchrun::counts::MAX_WORLD_SIZE as usize, "{text}");
                    prop_assert!(r.windows(2).all(|w| w[0] < w[1]), "{text}: {r:?}");
                }
                prop_assert_eq!(Selection::parse(&sel.to_string()), Ok(sel.clone()), "{}", text);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

proptest! {
    #![proptest_config(cases(1000, 1))]

    #[test]
    fn hostfile_arbitrary_text(text in ".{0,200}") {
        if let Ok(h) = parse_hostfile(Path::new("hf"), &text) {
            check_hosts(&h);
        }
    }

    #[test]
    fn hostfile_token_soup(tokens in prop::collection::vec(hostfile_token(), 0..30)) {
        let text = tokens.join(" ");
        match parse_hostfile(Path::new("hf"), &text) {
            Ok(h) => check_hosts(&h),
            Err(e) => {
                prop_assert!(e.line >= 1 && e.line <= text.lines().count().max(1), "{e}");
                prop_assert!(e.to_string().starts_with("hf:"), "{e}");
            }
        }
    }

    /// A generated valid hostfile parses to its hosts (repeated hosts add up, as in OpenMPI).
    #[test]
    fn hostfile_valid_round_trips(
        lines in prop::collection::vec(
            ("[a-z][a-z0-9.-]{0,10}", prop::option::of(1u32..100_000), prop::option::of(1u32..100_000), any::<bool>(), any::<bool>()),
            0..12,
        ),
    ) {
        let mut text = String::new();
        let mut expected: Vec<Host> = Vec::new();
        for (name, slots, max, comment, blank) in &lines {
            if *blank {
                text.push_str("   \n# a comment line\n");
            }
            text.push_str(name);
            if let Some(s) = slots {
                text.push_str(&format!(" slots={s}"));
            }
            if let Some(m) = max {
                text.push_str(&format!("\tmax_slots={m}"));
            }
            if *comment {
                text.push_str(" # slots=0 ignored");
            }
            text.push('\n');
            match expected.iter_mut().find(|h| &h.name == name) {
                Some(h) => h.slots = Some(h.slots.unwrap_or(1) + slots.unwrap_or(1)),
                None => expected.push(Host { name: name.clone(), slots: *slots }),
            }
        }
        let parsed = parse_hostfile(Path::new("hf"), &text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&parsed, &expected, "{}", text);
        check_hosts(&parsed);
    }
}

/// Crasher (found by `hostfile_token_soup`): repeated hosts whose slots add up past u32::MAX
/// overflowed (a panic in debug builds, 0 or a wrapped count in release builds).
#[test]
fn hostfile_repeated_host_slot_overflow() {
    let text = "a slots=4294967295\na slots=1\n";
    match parse_hostfile(Path::new("hf"), text) {
        Ok(h) => check_hosts(&h),
        Err(e) => assert!(e.to_string().contains("slots"), "{e}"),
    }
    let text = "a slots=4294967295\na\na\n";
    match parse_hostfile(Path::new("hf"), text) {
        Ok(h) => check_hosts(&h),
        Err(e) => assert!(e.to_string().contains("slots"), "{e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Rank environment (torchrun, Slurm)
// ---------------------------------------------------------------------------------------------

fn env_value() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        "[0-9]{1,3}",
        " ?-?[0-9]{1,22} ?",
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("65535".to_string()),
        Just("65536".to_string()),
        Just("".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        "[0-9]{1,2}(\\(x[0-9]{1,20}\\))?(,[0-9]{1,2}(\\(x[0-9]{1,20}\\))?){0,3}",
        "[a-z]{0,4}(\\[[0-9,\\-]{0,8}\\]?)?(,[a-z0-9\\[\\]]{0,5}){0,2}",
        ".{0,10}",
    ])
}

const ENV_NAMES: [&str; 17] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
];

fn check_rank_env(e: &tchrun::env::RankEnv) {
    assert!(e.rank < e.world_size, "{e:?}");
    assert!(e.local_rank < e.local_size, "{e:?}");
}

/// Node counts and the expected answer of `tasks_per_node` for a generated spec.
fn tasks_spec() -> impl Strategy<Value = (String, Vec<(usize, u64)>)> {
    prop::collection::vec(
        (
            0usize..100,
            prop_oneof![Just(1u64), 1u64..10, any::<u64>(), Just(u64::MAX)],
        ),
        1..5,
    )
    .prop_map(|parts| {
        let spec = parts
            .iter()
            .map(|(c, r)| {
                if *r == 1 {
                    c.to_string()
                } else {
                    format!("{c}(x{r})")
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        (spec, parts)
    })
}

proptest! {
    #![proptest_config(cases(1000, 1))]

    #[test]
    fn torchrun_env_never_panics(values in prop::collection::vec(env_value(), ENV_NAMES.len())) {
        let get = |k: &str| ENV_NAMES.iter().position(|n| *n == k).and_then(|i| values[i].clone());
        if let Ok(e) = from_torchrun(&get) {
            check_rank_env(&e);
            prop_assert!(e.master_port.is_some() && e.master_addr.is_some());
        }
    }

    #[test]
    fn slurm_env_never_panics(values in prop::collection::vec(env_value(), ENV_NAMES.len())) {
        let get = |k: &str| ENV_NAMES.iter().position(|n| *n == k).and_then(|i| values[i].clone());
        if let Ok(e) = from_slurm(&get) {
            check_rank_env(&e);
            let addr = e.master_addr.clone().unwrap_or_default();
            // A host derived from the node list is never empty (MASTER_ADDR is taken as given).
            if values[5].is_none() {
                prop_assert!(!addr.is_empty(), "empty master address from {:?}", values);
            }
        }
    }

    #[test]
    fn first_host_never_panics(list in prop_oneof![".{0,30}", "[a-z]{0,5}(\\[[0-9,\\-]{0,8}\\]?)?[a-z0-9]{0,3}(,[a-z0-9\\[\\]\\-]{0,6}){0,3}"]) {
        if let Some(h) = first_host(&list) {
            prop_assert!(!h.is_empty(), "first_host({:?}) = Some(\"\")", list);
            prop_assert!(!h.contains(','), "first_host({:?}) = {:?}", list, h);
        }
    }

    #[test]
    fn tasks_per_node_arbitrary(spec in ".{0,30}", node in any::<usize>()) {
        let _ = tasks_per_node(&spec, node);
        let _ = tasks_per_node(&spec, node % 8);
    }

    /// For a valid spec the answer is the count of the part holding the node, None past the end.
    #[test]
    fn tasks_per_node_valid((spec, parts) in tasks_spec(), node in prop_oneof![0usize..40, any::<usize>(), Just(usize::MAX)]) {
        let mut seen: u128 = 0;
        let mut expected = None;
        for (c, r) in &parts {
            if (node as u128) < seen + *r as u128 {
                expected = Some(*c);
                break;
            }
            seen += *r as u128;
        }
        prop_assert_eq!(tasks_per_node(&spec, node), expected, "spec {} node {}", spec, node);
    }
}

/// Crasher (found by `tasks_per_node_valid`): node counts adding up past usize::MAX overflowed
/// (a panic in debug builds, a wrong answer in release builds).
#[test]
fn tasks_per_node_repeat_overflow() {
    let max = u64::MAX;
    assert_eq!(tasks_per_node(&format!("2(x{max}),3"), usize::MAX), Some(3));
    assert_eq!(
        tasks_per_node(&format!("2(x{max}),3"), usize::MAX - 1),
        Some(2)
    );
    assert_eq!(tasks_per_node("0,0(x18446744073709551615)", 1), Some(0));
    assert_eq!(tasks_per_node(&format!("2(x{max}),3(x5)"), 7), Some(2));
    assert_eq!(
        tasks_per_node(&format!("2(x{}),3(x5)", max - 1), usize::MAX - 1),
        Some(3)
    );
}

/// Crasher (found by `first_host_never_panics`): a node list with an empty bracket gave an
/// empty host name, which `from_slurm` took as the master address.
#[test]
fn first_host_of_empty_bracket_is_none() {
    for list in ["[]", "[,]", "[-]", ",node1"] {
        let h = first_host(list);
        assert!(h.as_deref() != Some(""), "first_host({list:?}) = {h:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Images: header checks and decoding
// ---------------------------------------------------------------------------------------------

/// Small valid images to mutate (PNG gray/RGB/RGBA/16-bit, JPEG RGB/gray).
fn seeds() -> &'static Vec<(&'static str, Vec<u8>)> {
    static S: std::sync::OnceLock<Vec<(&'static str, Vec<u8>)>> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        use image::{DynamicImage, ImageFormat};
        let rgb = image::RgbImage::from_fn(24, 17, |x, y| {
            image::Rgb([(x * 10) as u8, (y * 15) as u8, ((x ^ y) * 7) as u8])
        });
        let enc = |img: DynamicImage, f: ImageFormat| {
            let mut b = Vec::new();
            img.write_to(&mut std::io::Cursor::new(&mut b), f)
                .expect("encode");
            b
        };
        let d = DynamicImage::ImageRgb8(rgb);
        vec![
            ("png", enc(d.clone(), ImageFormat::Png)),
            (
                "png",
                enc(DynamicImage::ImageLuma8(d.to_luma8()), ImageFormat::Png),
            ),
            (
                "png",
                enc(DynamicImage::ImageRgba8(d.to_rgba8()), ImageFormat::Png),
            ),
            (
                "png",
                enc(DynamicImage::ImageRgb16(d.to_rgb16()), ImageFormat::Png),
            ),
            ("jpg", enc(d.clone(), ImageFormat::Jpeg)),
            (
                "jpg",
                enc(DynamicImage::ImageLuma8(d.to_luma8()), ImageFormat::Jpeg),
            ),
        ]
    })
}

/// One class folder `c/` holding the given files; returns the dataset root.
fn image_dir(files: &[(String, Vec<u8>)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    let c = d.path().join("c");
    std::fs::create_dir_all(&c).expect("mkdir");
    for (name, bytes) in files {
        std::fs::write(c.join(name), bytes).expect("write");
    }
    d
}

/// Scans, verifies (both modes) and loads what survives, as the trainer does. Never panics;
/// returns (samples, skipped, batches ok, batch errors).
fn exercise(root: &Path, max_pixels: u64, threads: usize) -> (usize, usize, usize, usize) {
    let Ok(folder) = ImageFolder::scan(root) else {
        return (0, 0, 0, 0);
    };
    let n = folder.samples.len();
    let strict = folder.clone().verify(false, max_pixels);
    let mut kept = folder.clone();
    let skipped = match kept.verify(true, max_pixels) {
        Ok(s) => s,
        Err(e) => {
            assert!(
                strict.is_err(),
                "strict verify passed, skipping verify failed: {e}"
            );
            return (n, n, 0, 0);
        }
    };
    assert_eq!(skipped.len() + kept.samples.len(), n);
    assert_eq!(strict.is_err(), !skipped.is_empty());
    let (mut ok, mut bad) = (0, 0);
    for augment in [
        Augment::Eval,
        Augment::Train(TrainAugment {
            min_scale: 0.08,
            hflip: true,
            ..TrainAugment::default()
        }),
    ] {
        let cfg = LoaderConfig {
            size: 16,
            batch_size: 2,
            threads,
            prefetch: 1,
            augment,
            norm: Normalization::default(),
            seed: 3,
            epoch: 0,
            rank: 0,
            first_position: 0,
            skip_bad: false,
            max_pixels: data::DEFAULT_MAX_IMAGE_PIXELS,
            global: None,
        };
        let indices: Vec<usize> = (0..kept.samples.len()).collect();
        for b in data::load_batches(&kept, indices, cfg) {
            match b {
                Ok(b) => {
                    assert_eq!(b.images.len(), b.len * 3 * 16 * 16);
                    assert!(b.images.iter().all(|v| v.is_finite()));
                    ok += 1;
                }
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains("/c/"), "a data error names the file: {m}");
                    bad += 1;
                }
            }
        }
    }
    (n, skipped.len(), ok, bad)
}

/// Pixel limit of the property runs: small, so a mutated header cannot make a test allocate
/// hundreds of MB on a shared 2-core machine (the limit logic is the same at any value).
const FUZZ_MAX_PIXELS: u64 = 1 << 20;

proptest! {
    #![proptest_config(cases(48, 10))]

    /// Arbitrary bytes named .png / .jpg / .JPEG.
    #[test]
    fn images_arbitrary_bytes(
        files in prop::collection::vec((prop_oneof![Just("png"), Just("jpg"), Just("JPEG")], prop::collection::vec(any::<u8>(), 0..600)), 1..4),
        threads in 0usize..3,
    ) {
        let files: Vec<(String, Vec<u8>)> = files.into_iter().enumerate().map(|(i, (ext, b))| (format!("{i}.{ext}"), b)).collect();
        let d = image_dir(&files);
        exercise(d.path(), FUZZ_MAX_PIXELS, threads);
    }

    /// Valid PNGs and JPEGs with random edits (header fields, chunk bytes, truncation), under
    /// their own or the other format's extension.
    #[test]
    fn images_mutated(
        picks in prop::collection::vec((0usize..6, mutations(), prop::option::of(0.0f64..1.0), any::<bool>()), 1..4),
        threads in 0usize..3,
        max_pixels in prop_oneof![Just(FUZZ_MAX_PIXELS), 1u64..1000],
    ) {
        let s = seeds();
        let files: Vec<(String, Vec<u8>)> = picks
            .into_iter()
            .enumerate()
            .map(|(i, (k, edits, cut, swap))| {
                let (ext, bytes) = &s[k];
                let mut b = mutate(bytes.clone(), &edits);
                if let Some(at) = cut {
                    b.truncate((b.len() as f64 * at) as usize);
                }
                let ext: &str = if swap { if *ext == "png" { "jpg" } else { "png" } } else { ext };
                (format!("{i}.{ext}"), b)
            })
            .collect();
        let d = image_dir(&files);
        exercise(d.path(), max_pixels, threads);
    }

    /// Header-only edits of PNGs (IHDR fields with correct CRCs): dimensions, bit depth,
    /// colour type, interlace.
    #[test]
    fn png_header_fields(
        w in prop_oneof![0u32..64, any::<u32>()],
        h in prop_oneof![0u32..64, any::<u32>()],
        depth in prop_oneof![Just(8u8), Just(16u8), any::<u8>()],
        color in prop_oneof![Just(0u8), Just(2u8), Just(6u8), any::<u8>()],
        interlace in 0u8..3,
        seed in 0usize..4,
        threads in 0usize..2,
    ) {
        let mut png = seeds()[seed].1.clone();
        assert_eq!(&png[12..16], b"IHDR");
        png[16..20].copy_from_slice(&w.to_be_bytes());
        png[20..24].copy_from_slice(&h.to_be_bytes());
        png[24] = depth;
        png[25] = color;
        png[28] = interlace;
        let crc = crc32fast::hash(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let d = image_dir(&[("x.png".into(), png)]);
        let (n, skipped, _, _) = exercise(d.path(), FUZZ_MAX_PIXELS, threads);
        prop_assert_eq!(n, 1);
        if w as u64 * h as u64 > FUZZ_MAX_PIXELS || w == 0 || h == 0 {
            prop_assert_eq!(skipped, 1, "{}x{} must be refused from its header", w, h);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CLI flags
// ---------------------------------------------------------------------------------------------

#[derive(clap::Parser, Debug)]
#[command(name = "x")]
struct Cli {
    #[command(flatten)]
    job: tchrun::flags::TrainJob,
    #[command(flatten)]
    rank: tchrun::flags::RankFlags,
}

fn flag_arg() -> impl Strategy<Value = String> {
    const FLAGS: [&str; 25] = [
        "--model",
        "--train",
        "--valid",
        "--output",
        "--epochs",
        "--batch-size",
        "--warmup-epochs",
        "--lr",
        "--seed",
        "--patience",
        "--print-freq",
        "--momentum",
        "--weight-decay",
        "--lr-power",
        "--min-crop-scale",
        "--no-hflip",
        "--skip-bad-images",
        "--max-image-pixels",
        "--loader-threads",
        "--amp",
        "--resume",
        "--device",
        "--backend",
        "--log-dir",
        "--timeout",
    ];
    const VALUES: [&str; 24] = [
        "0",
        "1",
        "-1",
        "1e-3",
        "1e-400",
        "nan",
        "inf",
        "-0",
        "4294967296",
        "18446744073709551616",
        "0.5",
        "2",
        "gloo",
        "cuda",
        "bf16",
        "",
        " ",
        "--",
        "-",
        "=",
        "/tmp/x",
        "-x",
        "1.5e308",
        "9223372036854775808",
    ];
    prop_oneof![
        (0..FLAGS.len()).prop_map(|i| FLAGS[i].to_string()),
        (0..VALUES.len()).prop_map(|i| VALUES[i].to_string()),
        (0..FLAGS.len(), 0..VALUES.len()).prop_map(|(f, v)| format!("{}={}", FLAGS[f], VALUES[v])),
        (0..FLAGS.len(), ".{0,8}").prop_map(|(f, v)| format!("{}={v}", FLAGS[f])),
        ".{0,12}",
    ]
}

fn required() -> Vec<String> {
    ["--model=/m", "--train=/t", "--valid=/v", "--output=/o"]
        .map(String::from)
        .to_vec()
}

proptest! {
    #![proptest_config(cases(1000, 1))]

    /// Any argument list: parsed or a clap error, never a panic; what parses round-trips
    /// through `to_args` (what the launcher hands the ranks).
    #[test]
    fn flags_never_panic(args in prop::collection::vec(flag_arg(), 0..12), with_required in any::<bool>()) {
        use clap::Parser;
        let mut argv = vec!["x".to_string()];
        if with_required {
            argv.extend(required());
        }
        argv.extend(args);
        if let Ok(cli) = Cli::try_parse_from(&argv) {
            let mut again = vec!["x".to_string()];
            again.extend(cli.job.to_args().expect("flags parsed from UTF-8 argv become argv"));
            again.extend(cli.rank.to_args().expect("flags parsed from UTF-8 argv become argv"));
            match Cli::try_parse_from(&again) {
                Ok(c2) => {
                    prop_assert_eq!(&c2.job, &cli.job, "{:?} -> {:?}", argv, again);
                    prop_assert_eq!(&c2.rank, &cli.rank, "{:?} -> {:?}", argv, again);
                }
                Err(e) => {
                    // Known: RankFlags::to_args passes `--log-dir VALUE` as two words, so a
                    // relative log dir starting with '-' does not re-parse (the launcher makes
                    // it absolute first, so it never happens there).
                    let log_dir_dash = cli.rank.log_dir.as_ref().is_some_and(|d| d.to_string_lossy().starts_with('-'));
                    prop_assert!(log_dir_dash, "{:?} parsed but its to_args {:?} does not: {}", argv, again, e);
                }
            }
        }
    }

    /// Arbitrary strings, no structure at all.
    #[test]
    fn flags_arbitrary_strings(args in prop::collection::vec(".{0,20}", 0..8)) {
        use clap::Parser;
        let mut argv = vec!["x".to_string()];
        argv.extend(required());
        argv.extend(args);
        let _ = Cli::try_parse_from(&argv);
    }
}

// ---------------------------------------------------------------------------------------------
// LR schedule
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(1000, 1))]

    #[test]
    fn lr_schedule_invariants(
        lr in prop_oneof![f64::EPSILON..1.0, 1.0f64..100.0, Just(f64::EPSILON)],
        world in 1usize..4097,
        warmup in 0u32..20,
        epochs in 1u32..200,
        steps_per_epoch in prop_oneof![0u64..5, 1u64..2000, Just(1_000_000u64)],
        power in prop_oneof![0.01f64..10.0, Just(1.0), Just(2.0)],
        probes in prop::collection::vec(0.0f64..1.2, 0..40),
    ) {
        let s = LrSchedule::new(lr, world, warmup, epochs, steps_per_epoch, power);
        prop_assert!(s.peak.is_finite() && s.peak > 0.0);
        prop_assert!(s.warmup_steps <= s.total_steps && s.total_steps >= 1);
        let total = s.total_steps;
        let mut steps: Vec<u64> = probes.iter().map(|p| (p * total as f64) as u64).collect();
        steps.extend([0, 1, total.saturating_sub(1), total, total + 1, s.warmup_steps.saturating_sub(1), s.warmup_steps, s.warmup_steps + 1]);
        if total <= 300 {
            steps.extend(0..=total);
        }
        for &st in &steps {
            let v = s.lr(st);
            prop_assert!(v.is_finite(), "lr({}) = {} ({:?})", st, v, s);
            // 1 ulp of slack at the top: see `lr_at_end_of_warmup_is_at_most_peak`.
            let top = s.peak * (1.0 + 2.0 * f64::EPSILON);
            prop_assert!(v >= 0.0 && v <= top, "lr({}) = {} outside [0, {}] ({:?})", st, v, s.peak, s);
            if st >= s.warmup_steps {
                let next = s.lr(st + 1);
                prop_assert!(next <= v, "lr rises after warmup: lr({}) = {} < lr({}) = {} ({:?})", st, v, st + 1, next, s);
            }
            if st > 0 && st < s.warmup_steps {
                prop_assert!(s.lr(st - 1) <= v, "warmup must not decrease ({:?})", s);
            }
        }
        prop_assert_eq!(s.lr(total), 0.0f64.max(if s.warmup_steps == total { s.peak } else { 0.0 }));
    }
}

/// Found by `lr_schedule_invariants`: the last warmup step computes `peak * (step + 1) / warmup`
/// left to right, which can land 1 ulp above the peak (43.01495859129348 > 43.01495859129347).
/// Harmless for training, but the documented bound is `lr <= peak`. Fix in src/schedule.rs:
/// `self.peak * ((step + 1) as f64 / self.warmup_steps as f64)` (the ratio is <= 1 exactly).
#[test]
fn lr_at_end_of_warmup_is_at_most_peak() {
    let s = LrSchedule::new(0.028734107275413142, 1497, 15, 15, 113, 0.01);
    assert_eq!(s.warmup_steps, 1695);
    assert!(s.lr(1694) <= s.peak, "{} > {}", s.lr(1694), s.peak);
}

// Issue 25 item 12: every product of user counts is exact or refused naming the flags, never
// wrapped or saturated (checked against 128-bit arithmetic).
proptest! {
    #![proptest_config(cases(1000, 1))]

    #[test]
    fn count_products_are_exact_or_refused(
        nodes in any::<u32>(),
        ppn in any::<u32>(),
        batch in any::<u32>(),
        size in any::<u32>(),
        epochs in any::<u32>(),
        warmup in any::<u32>(),
        steps in any::<u64>(),
    ) {
        use tchrun::counts::{self, MAX_BATCH_BYTES, MAX_TOTAL_STEPS, MAX_WORLD_SIZE};
        let w = u128::from(nodes) * u128::from(ppn);
        match counts::world_size(nodes, ppn) {
            Ok(v) => prop_assert_eq!(u128::from(v), w),
            Err(e) => {
                prop_assert!(w > u128::from(MAX_WORLD_SIZE));
                prop_assert!(e.0.contains("--nodes") && e.0.contains("--procs-per-node"));
            }
        }
        let b = u128::from(batch) * 12 * u128::from(size) * u128::from(size);
        match counts::batch_bytes("--batch-size", batch, size) {
            Ok(v) => prop_assert_eq!(u128::from(v), b),
            Err(e) => {
                prop_assert!(b > u128::from(MAX_BATCH_BYTES));
                prop_assert!(e.0.starts_with("--batch-size"));
            }
        }
        let t = u128::from(epochs) * u128::from(steps);
        let wt = u128::from(warmup) * u128::from(steps);
        match counts::total_steps(epochs, warmup, steps) {
            Ok(v) => {
                prop_assert_eq!(u128::from(v), t);
                prop_assert!(wt <= u128::from(MAX_TOTAL_STEPS));
            }
            Err(e) => {
                prop_assert!(t > u128::from(MAX_TOTAL_STEPS) || wt > u128::from(MAX_TOTAL_STEPS));
                prop_assert!(e.0.contains("-epochs"));
            }
        }
    }

    /// `--global-batch-size` against any world size and batch: a count or a message, no panic.
    #[test]
    fn accumulation_steps_never_panics(g in 1u32.., b in 1u32.., world in 1usize..=65_536) {
        if let Ok(a) = tchrun::schedule::accumulation_steps(g, b, world) {
            prop_assert_eq!(u128::from(a) * u128::from(b) * world as u128, u128::from(g));
        }
    }
}

// Issue 28: the parsers of a failure's evidence (kernel log lines, `/proc/<pid>/cgroup`, the
// cgroup counters and limits, libtorch's, Gloo's, NCCL's and Slurm's words) never panic on any
// text, and the OOM killer's line gives back its pid and memory.
proptest! {
    #![proptest_config(cases(1000, 1))]

    #[test]
    fn failure_evidence_parsers_never_panic(text in "\\PC{0,200}", bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        use tchrun::driver_log::FailureKind;
        use tchrun::job_record::Cause;
        let lossy = String::from_utf8_lossy(&bytes).into_owned();
        for t in [text.as_str(), lossy.as_str()] {
            let _ = tchrun_launcher::kernel_log::parse(t);
            let _ = tchrun_launcher::kernel_log::sequence(t);
            let _ = tchrun::memory::Cgroup::parse_proc(t);
            let _ = tchrun::memory::oom_kill_count(t);
            let _ = tchrun::memory::parse_limit(t);
            let _ = tchrun::memory::status_kb(t, "VmRSS:");
            for kind in [FailureKind::Communication, FailureKind::Data, FailureKind::Interrupted, FailureKind::Cuda] {
                if let Some(c) = Cause::from_record(kind, t, Some("cuda:0")) {
                    prop_assert!(!c.detail().is_empty() && !c.advice().is_empty());
                }
            }
            let _ = Cause::slurm(&[t.to_string()], Some(15));
        }
    }

    #[test]
    fn the_oom_killers_line_gives_its_pid_and_memory(pid in any::<u32>(), anon in 0u64..(1 << 40), file in 0u64..(1 << 40), name in "[a-z-]{1,15}") {
        let line = format!(
            "[ 1.5] Memory cgroup out of memory: Killed process {pid} ({name}) total-vm:1kB, anon-rss:{anon}kB, file-rss:{file}kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0"
        );
        match tchrun_launcher::kernel_log::parse(&line) {
            Some(tchrun_launcher::kernel_log::KernelEvent::OomKill { pid: p, name: n, rss_kib, cgroup, .. }) => {
                prop_assert_eq!(p, pid);
                prop_assert_eq!(n, name);
                prop_assert_eq!(rss_kib, Some(anon + file));
                prop_assert!(cgroup);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
