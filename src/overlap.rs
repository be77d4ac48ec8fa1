//! Outputs that would overwrite inputs. Every command that writes (`train`, `score`,
//! `evaluate`, `model init`, `data split`, `data pack`, `data index`, `sbatch`) names its
//! outputs (`--output`, `--log-dir` and its default, `--script`, ...) and its inputs (dataset
//! folders and archives, `--model`, `--weights`, the source of `data split`/`data pack`) and
//! calls [`check_disjoint`] before it writes anything: an output that is, contains or lies
//! inside an input is refused (exit 2), the message naming both paths, the input it would
//! overwrite and the fix. Paths are compared resolved ([`resolve`]): absolute, symbolic links
//! followed, `.` and `..` removed, also for an output that does not exist yet.
use std::path::{Component, Path, PathBuf};

/// A path a command reads or writes: the flag that named it, and what it is for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// `--output`, `--model`, `SRC`, ...
    pub flag: String,
    /// What it is ("the model directory", "the training data", ...).
    pub what: String,
    pub path: PathBuf,
}

impl Named {
    pub fn new(
        flag: impl Into<String>,
        what: impl Into<String>,
        path: impl Into<PathBuf>,
    ) -> Named {
        Named {
            flag: flag.into(),
            what: what.into(),
            path: path.into(),
        }
    }
}

/// How an output lies against an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// The same path.
    Same,
    /// The output lies inside the input.
    Inside,
    /// The output contains the input.
    Contains,
}

/// An output that would overwrite (or write into, or around) an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct OverlapError {
    pub output: Named,
    pub input: Named,
    pub relation: Relation,
    /// The two paths as compared (resolved).
    pub resolved: (PathBuf, PathBuf),
}

impl OverlapError {
    fn message(&self) -> String {
        let (o, i) = (&self.output, &self.input);
        let shown = |n: &Named, r: &Path| {
            if n.path == r {
                format!("{} {}", n.flag, n.path.display())
            } else {
                format!("{} {} (that is {})", n.flag, n.path.display(), r.display())
            }
        };
        let (out, inp) = (shown(o, &self.resolved.0), shown(i, &self.resolved.1));
        let (relation, harm) = match self.relation {
            Relation::Same => ("is", "overwrite"),
            Relation::Inside => ("lies inside", "write into"),
            Relation::Contains => ("contains", "write its files around"),
        };
        format!(
            "{out} {relation} {inp}: the job would {harm} its input ({}) with its output ({}); \
             nothing was written. Choose {} outside {} and not containing it (e.g. a new folder \
             beside it)",
            i.what,
            o.what,
            o.flag,
            self.resolved.1.display()
        )
    }
}

/// `p` absolute, its nearest existing ancestor canonicalized (symbolic links followed) and
/// the rest appended (`.` dropped, `..` taking off the last part): the path as the file system
/// will resolve it once the missing part is created.
pub fn resolve(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let comps: Vec<Component> = abs.components().collect();
    for i in (1..=comps.len()).rev() {
        let head: PathBuf = comps[..i].iter().collect();
        if let Ok(mut out) = head.canonicalize() {
            for c in &comps[i..] {
                match c {
                    Component::Normal(n) => out.push(n),
                    Component::ParentDir => {
                        out.pop();
                    }
                    _ => {}
                }
            }
            return out;
        }
    }
    abs
}

/// How `output` lies against `input` (both resolved), if they overlap.
pub fn relation(output: &Path, input: &Path) -> Option<Relation> {
    if output == input {
        Some(Relation::Same)
    } else if output.starts_with(input) {
        Some(Relation::Inside)
    } else if input.starts_with(output) {
        Some(Relation::Contains)
    } else {
        None
    }
}

/// Refuses the first output that is, contains or lies inside an input. Empty paths are
/// ignored (a flag not given).
pub fn check_disjoint(outputs: &[Named], inputs: &[Named]) -> Result<(), Box<OverlapError>> {
    let resolved_inputs: Vec<(&Named, PathBuf)> = inputs
        .iter()
        .filter(|n| !n.path.as_os_str().is_empty())
        .map(|n| (n, resolve(&n.path)))
        .collect();
    for o in outputs.iter().filter(|n| !n.path.as_os_str().is_empty()) {
        let ro = resolve(&o.path);
        for (i, ri) in &resolved_inputs {
            if let Some(relation) = relation(&ro, ri) {
                return Err(Box::new(OverlapError {
                    output: o.clone(),
                    input: (*i).clone(),
                    relation,
                    resolved: (ro, ri.clone()),
                }));
            }
        }
    }
    Ok(())
}

/// A training job's outputs (`--output`, the log directory) and inputs (`--model`, `--train`,
/// `--valid`), for `tchrun train`, `tchrun sbatch` and `tchrun-worker train`. An archive's
/// extraction in the data cache (`archives/`, where `tchrun train` puts it and then gives the
/// ranks the extracted folder) is tchrun's own copy, not an input to protect.
pub fn train_job(job: &crate::flags::TrainJob, log_dir: &Path) -> (Vec<Named>, Vec<Named>) {
    let cache = resolve(&crate::files::cache_root());
    let data = [
        ("--train", "the training data", &job.train),
        ("--valid", "the validation data", &job.valid),
    ];
    let mut inputs = vec![Named::new(
        "--model",
        "the model directory training starts from, with its weights",
        &job.model,
    )];
    for (flag, what, path) in data {
        if !resolve(path).starts_with(&cache) {
            inputs.push(Named::new(flag, what, path));
        }
    }
    (
        vec![
            Named::new("--output", "the trained model", &job.output),
            Named::new("--log-dir", "the job's logs", log_dir),
        ],
        inputs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archives_extraction_in_the_data_cache_is_not_an_input() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            job: crate::flags::TrainJob,
        }
        // A data cache inside the output (TCHRUN_DATA_CACHE set so) holds no input either.
        let cache = crate::files::data_cache();
        let cli = Cli::parse_from([
            "t".to_string(),
            "--model=/m".into(),
            format!("--train={}/archives/train-1/digits", cache.display()),
            "--valid=/v".into(),
            format!("--output={}", cache.display()),
        ]);
        let (outputs, inputs) = train_job(&cli.job, &cache.join("logs"));
        let flags: Vec<&str> = inputs.iter().map(|n| n.flag.as_str()).collect();
        assert_eq!(flags, ["--model", "--valid"]);
        assert!(check_disjoint(&outputs, &inputs).is_ok());
    }

    #[test]
    fn resolve_follows_links_and_appends_the_missing_part() {
        let t = tempfile::tempdir().expect("tempdir");
        let real = t.path().canonicalize().expect("canon").join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        assert_eq!(resolve(&link), real);
        assert_eq!(resolve(&link.join("new/./x/../y")), real.join("new/y"));
        assert_eq!(resolve(&link.join("..").join("real")), real);
    }

    #[test]
    fn same_inside_and_containing_outputs_are_refused_and_named() {
        let t = tempfile::tempdir().expect("tempdir");
        let m = t.path().join("model");
        std::fs::create_dir(&m).expect("mkdir");
        let input = [Named::new("--model", "the model directory", &m)];
        let out = |p: PathBuf| [Named::new("--output", "the scores CSV", p)];
        let e = check_disjoint(&out(m.join("model.safetensors")), &input).expect_err("inside");
        assert_eq!(e.relation, Relation::Inside);
        let msg = e.to_string();
        for part in [
            "--output",
            "model.safetensors",
            "--model",
            "lies inside",
            "the model directory",
            "Choose --output outside",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
        let e = check_disjoint(&out(m.clone()), &input).expect_err("same");
        assert_eq!(e.relation, Relation::Same);
        let e = check_disjoint(&out(t.path().to_path_buf()), &input).expect_err("contains");
        assert_eq!(e.relation, Relation::Contains);
        check_disjoint(&out(t.path().join("model-scores.csv")), &input).expect("beside");
        check_disjoint(&out(t.path().join("modelx")), &input).expect("a prefix of the name only");
        check_disjoint(&out(PathBuf::new()), &input).expect("unset");
    }
}
