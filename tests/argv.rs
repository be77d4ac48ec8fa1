//! The ranks' argv is derived from the flag groups (`tchrun::argv`): for each group,
//! `parse(to_args(x)) == x` over generated command lines (defaults, `None`, switches, enums,
//! repeated flags), each built from clap's own list of the group's flags.
use clap::{ArgAction, Args, Command, FromArgMatches};
use proptest::prelude::*;
use std::fmt::Debug;
use tchrun::augment_flags::AugmentFlags;
use tchrun::doctor::DoctorRank;
use tchrun::export::TraceArgs;
use tchrun::flags::{RankFlags, TrainHandoff, TrainJob};
use tchrun::inference_flags::InferenceJob;
use tchrun::mlflow::MlflowFlags;
use tchrun::recipe::RecipeFlags;
use tchrun::transform_flags::TransformFlags;
use tchrun::worker_flags::{ExecRank, SelftestRank};

/// Values tried for a flag without possible values, from the pick on: the first that clap
/// takes (with the flags chosen so far) is used.
const CANDIDATES: &[&str] = &[
    "1",
    "2",
    "3",
    "0",
    "0.5",
    "0.25",
    "1e-3",
    "-3",
    "7",
    "64",
    "224",
    "/tmp/a b",
    "auto",
    "0,3",
    "10,0.1,0.9,1.1,5",
    "0.5,0.5",
    "0.4,0.4,0.4,0.1",
    "4,reflect",
    "http://127.0.0.1:5000",
    "exp",
    "eth0",
];

fn command<T: Args>() -> Command {
    T::augment_args(Command::new("x")).mut_args(|a| a.env(None::<&str>))
}

/// A command line of group `T` chosen by `picks` (a third of the flags left at their
/// default), and what it parses to.
fn generated<T: Args + FromArgMatches>(picks: &[u16]) -> (Vec<String>, T) {
    let cmd = command::<T>();
    let mut argv = vec!["x".to_string()];
    for arg in cmd.get_arguments().filter(|a| a.is_required_set()) {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let value = match arg.get_possible_values().first() {
            Some(p) => p.get_name().to_string(),
            None => "/tmp/required".to_string(),
        };
        argv.push(format!("--{long}={value}"));
    }
    for (i, arg) in cmd.get_arguments().enumerate() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let pick = usize::from(picks[i % picks.len()]);
        if arg.is_required_set() || pick % 3 == 0 {
            continue;
        }
        let values: Vec<String> = match arg.get_action() {
            ArgAction::SetTrue => vec![String::new()],
            _ if !arg.get_possible_values().is_empty() => arg
                .get_possible_values()
                .iter()
                .map(|p| p.get_name().to_string())
                .collect(),
            _ => CANDIDATES.iter().map(|c| c.to_string()).collect(),
        };
        let times = if matches!(arg.get_action(), ArgAction::Append) {
            1 + pick % 2
        } else {
            1
        };
        for k in 0..values.len() {
            let v = &values[(pick + k) % values.len()];
            let flag = if v.is_empty() {
                format!("--{long}")
            } else {
                format!("--{long}={v}")
            };
            let mut tried = argv.clone();
            tried.extend(std::iter::repeat(flag).take(times));
            if cmd.clone().try_get_matches_from(&tried).is_ok() {
                argv = tried;
                break;
            }
        }
    }
    // A trailing program (`exec`'s): its own flags stay its own.
    if cmd.get_arguments().any(|a| a.is_last_set()) {
        let n = 1 + usize::from(picks[0]) % 3;
        argv.push("--".into());
        argv.extend(
            ["/bin/prog", "--lr=1", "a b", "-x"]
                .iter()
                .take(n + 1)
                .map(|s| s.to_string()),
        );
    }
    (argv.clone(), parse(&cmd, argv))
}

fn parse<T: FromArgMatches>(cmd: &Command, argv: Vec<String>) -> T {
    let m = cmd
        .clone()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    T::from_arg_matches(&m).expect("from matches")
}

/// `x` parsed again from `derived` (its argv) is `x`.
fn round_trip<T: Args + FromArgMatches + PartialEq + Debug>(
    given: &[String],
    x: &T,
    derived: Vec<String>,
) {
    let again: T = parse(
        &command::<T>(),
        std::iter::once("x".into()).chain(derived.clone()).collect(),
    );
    assert_eq!(&again, x, "given {given:?}, derived {derived:?}");
}

fn picks() -> impl Strategy<Value = Vec<u16>> {
    prop::collection::vec(any::<u16>(), 1..48)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn train_job(p in picks()) {
        let (given, mut x) = generated::<TrainJob>(&p);
        // The ranks get a class-weights file's absolute path, and what --recipe expanded to.
        x.options.class_weights = x.options.class_weights.absolute();
        x.options.preset = Default::default();
        round_trip(&given, &x, x.to_args().expect("argv"));
    }

    #[test]
    fn rank_flags(p in picks()) {
        let (given, x) = generated::<RankFlags>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
    }

    #[test]
    fn handoff_and_inference(p in picks()) {
        let (given, x) = generated::<TrainHandoff>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<InferenceJob>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
    }

    #[test]
    fn recipe_augment_transforms_mlflow(p in picks()) {
        let (given, x) = generated::<RecipeFlags>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<AugmentFlags>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<TransformFlags>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<MlflowFlags>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
    }

    #[test]
    fn doctor_selftest_exec_export(p in picks()) {
        let (given, x) = generated::<DoctorRank>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<SelftestRank>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<ExecRank>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
        let (given, x) = generated::<TraceArgs>(&p);
        round_trip(&given, &x, x.to_args().expect("argv"));
    }
}

/// Defaults: a group parsed from nothing gives the argv of today's ranks (the switches off,
/// `None`s and the recipe's defaults left out).
#[test]
fn defaults_round_trip_and_leave_defaulted_groups_out() {
    let x: RecipeFlags = parse(&command::<RecipeFlags>(), vec!["x".into()]);
    assert!(x.to_args().expect("argv").is_empty());
    let x: AugmentFlags = parse(&command::<AugmentFlags>(), vec!["x".into()]);
    assert!(x.to_args().expect("argv").is_empty());
    let x: RankFlags = parse(&command::<RankFlags>(), vec!["x".into()]);
    assert_eq!(
        x.to_args().expect("argv"),
        [
            "--device=auto",
            "--backend=auto",
            "--timeout=300",
            "--console=0"
        ]
    );
}

/// `--no-channels-last` reaches the ranks alone (`--channels-last` conflicts with it).
#[test]
fn a_conflicting_default_is_left_out() {
    let cmd = command::<TrainJob>();
    let base = ["x", "--model=m", "--train=t", "--valid=v", "--output=o"].map(String::from);
    let mut argv = base.to_vec();
    argv.push("--no-channels-last".into());
    let x: TrainJob = parse(&cmd, argv.clone());
    let derived = x.to_args().expect("argv");
    assert!(
        derived.contains(&"--no-channels-last".to_string()),
        "{derived:?}"
    );
    assert!(
        !derived.iter().any(|a| a.starts_with("--channels-last")),
        "{derived:?}"
    );
    round_trip(&argv, &x, derived);
}

/// Records keep a flag's enum as its command-line name (`value_enum_serde!`): every value of
/// `--lr-scaling` and `--amp` is written and read back as the string files on disk hold.
#[test]
fn record_enums_are_the_flag_names() {
    use clap::ValueEnum;
    use tchrun::flags::{Amp, LrScaling};
    for v in LrScaling::value_variants() {
        let json = serde_json::to_string(v).expect("json");
        assert_eq!(json, format!("\"{}\"", v.as_str()));
        assert_eq!(&serde_json::from_str::<LrScaling>(&json).expect("back"), v);
    }
    for v in Amp::value_variants() {
        let json = serde_json::to_string(v).expect("json");
        assert_eq!(json, format!("\"{}\"", v.as_str()));
        assert_eq!(&serde_json::from_str::<Amp>(&json).expect("back"), v);
    }
    assert!(serde_json::from_str::<Amp>("\"fp8\"").is_err());
}

/// `exec`'s program follows `--` after the flags (its own flags stay its own); `selftest`'s
/// checks at their defaults are left out, as the ranks got them before.
#[test]
fn exec_program_follows_the_flags_and_selftest_defaults_are_left_out() {
    let argv = ["x", "--log-dir=/l", "--", "python", "--lr=1", "-x"].map(String::from);
    let x: ExecRank = parse(&command::<ExecRank>(), argv.to_vec());
    assert_eq!(
        x.to_args().expect("argv"),
        [
            "--log-dir=/l",
            "--console=0",
            "--",
            "python",
            "--lr=1",
            "-x"
        ]
    );
    let x: SelftestRank = parse(&command::<SelftestRank>(), vec!["x".into()]);
    let derived = x.to_args().expect("argv");
    assert!(
        !derived
            .iter()
            .any(|a| a.starts_with("--sizes") || a.starts_with("--iters")),
        "{derived:?}"
    );
    let x: SelftestRank = parse(
        &command::<SelftestRank>(),
        vec!["x".into(), "--iters=3".into()],
    );
    assert!(x
        .to_args()
        .expect("argv")
        .contains(&"--iters=3".to_string()));
}
