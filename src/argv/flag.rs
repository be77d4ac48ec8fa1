//! One argument of a rank's command line as `argv` derives it (`Flag`), before it becomes
//! text: the launcher writes it (`--name=value`), the worker's MLflow run logs it (name and
//! value).

/// One argument as a rank gets it.
#[derive(Debug, Clone, PartialEq)]
pub enum Flag {
    /// A flag: its long name and its value (`None`: a switch turned on).
    Named { name: String, value: Option<String> },
    /// A positional argument, or the `--` before a trailing list.
    Plain(String),
}

impl Flag {
    /// The flag as one argument: `--name=value` (a switch: `--name`; a positional: itself).
    pub fn arg(&self) -> String {
        match self {
            Flag::Named {
                name,
                value: Some(v),
            } => format!("--{name}={v}"),
            Flag::Named { name, value: None } => format!("--{name}"),
            Flag::Plain(s) => s.clone(),
        }
    }
}

/// The flags as arguments (`Flag::arg`).
pub fn args(flags: &[Flag]) -> Vec<String> {
    flags.iter().map(Flag::arg).collect()
}
