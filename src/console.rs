//! `--console`: whose lines reach the launcher's terminal. A rank decides with [`Selection`]
//! whether it prints its own lines there (its warnings and errors always go); the launcher
//! folds identical lines of several ranks into one. The driver logs keep everything either way.
//! A program's stderr lines (`tchrun exec`) that look like warnings or errors count as a rank's
//! warnings and errors ([`StderrWarnings`]).
use std::fmt;

/// The ranks whose lines reach the console (`--console`): `all`, rank numbers (`0,3`, `0-3`) or
/// hosts (`host:node2`, `host:a,b`). The default is rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    /// Sorted and without duplicates.
    Ranks(Vec<usize>),
    /// Host names as the ranks give them in their console prefix (`<host>:<rank> `).
    Hosts(Vec<String>),
}

impl Default for Selection {
    fn default() -> Self {
        Selection::Ranks(vec![0])
    }
}

/// A `--console` value that names no ranks, or ranks the job does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsoleError {
    #[error(
        "'{part}' is not a rank, a range of ranks or 'all'; give all, rank numbers (0,3 or 0-3) \
         or host:NAME[,NAME]"
    )]
    NotARank { part: String },
    #[error("'{part}': a range goes from the lower rank to the higher (e.g. 0-3)")]
    BackwardRange { part: String },
    #[error(
        "host: names no host; give host:NAME[,NAME] (the names before ':' in the console's lines)"
    )]
    NoHost,
    #[error(
        "'{part}': more ranks than a job can have ({}); use all",
        crate::counts::MAX_WORLD_SIZE
    )]
    TooMany { part: String },
    #[error("--console {value}: the job runs on {} only; name it (host:{}) or give ranks (0,3 or all)", hosts.join(", "), hosts.first().map(String::as_str).unwrap_or_default())]
    UnknownHost { value: String, hosts: Vec<String> },
    #[error("--console {value}: the job has {world} rank(s) (0-{last}); pick among them or use all", last = world.saturating_sub(1))]
    OutOfRange { value: String, world: usize },
}

/// The most ranks a `--console` list may name: those of the largest job (a typo like
/// `0-99999999999` must not allocate the world).
const MAX_LISTED: usize = crate::counts::MAX_WORLD_SIZE as usize;

impl Selection {
    /// Parses a `--console` value (clap's `value_parser`; its error names the flag).
    pub fn parse(s: &str) -> Result<Selection, ConsoleError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(Selection::All);
        }
        if let Some(hosts) = s.strip_prefix("host:") {
            let names: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(String::from)
                .collect();
            if names.is_empty() {
                return Err(ConsoleError::NoHost);
            }
            return Ok(Selection::Hosts(names));
        }
        let mut ranks = Vec::new();
        for part in s.split(',').map(str::trim) {
            let not_a_rank = || ConsoleError::NotARank {
                part: part.to_string(),
            };
            let number = |t: &str| t.trim().parse::<usize>().map_err(|_| not_a_rank());
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b {
                        return Err(ConsoleError::BackwardRange {
                            part: part.to_string(),
                        });
                    }
                    if b - a >= MAX_LISTED {
                        return Err(ConsoleError::TooMany {
                            part: part.to_string(),
                        });
                    }
                    ranks.extend(a..=b);
                }
                None => ranks.push(number(part)?),
            }
            if ranks.len() > MAX_LISTED {
                return Err(ConsoleError::TooMany {
                    part: part.to_string(),
                });
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        Ok(Selection::Ranks(ranks))
    }

    /// Whether the rank `rank` on `host` prints its lines (warnings and errors aside).
    pub fn selects(&self, host: &str, rank: usize) -> bool {
        match self {
            Selection::All => true,
            Selection::Ranks(r) => r.binary_search(&rank).is_ok(),
            Selection::Hosts(names) => names
                .iter()
                .any(|n| n == host || host.split('.').next() == Some(n.as_str())),
        }
    }

    /// How many ranks of a job of `world` print their lines; `None` when that depends on where
    /// the ranks run (hosts).
    pub fn count(&self, world: usize) -> Option<usize> {
        match self {
            Selection::All => Some(world),
            Selection::Ranks(r) => Some(r.iter().filter(|&&r| r < world).count()),
            Selection::Hosts(_) => None,
        }
    }

    /// A selection of ranks the job does not have is refused before any rank starts.
    pub fn check(&self, world: usize) -> Result<(), ConsoleError> {
        match self {
            Selection::Ranks(r) if r.iter().any(|&r| r >= world) => Err(ConsoleError::OutOfRange {
                value: self.to_string(),
                world,
            }),
            _ => Ok(()),
        }
    }

    /// A host selection naming a host the job does not run on is refused, when the job's
    /// hosts are known (`--launcher local`: this host); before, `host:nope` showed nothing and
    /// said nothing.
    pub fn check_hosts(&self, hosts: &[String]) -> Result<(), ConsoleError> {
        match self {
            Selection::Hosts(names)
                if !hosts.is_empty()
                    && names.iter().any(|n| {
                        !hosts
                            .iter()
                            .any(|h| Selection::Hosts(vec![n.clone()]).selects(h, 0))
                    }) =>
            {
                Err(ConsoleError::UnknownHost {
                    value: self.to_string(),
                    hosts: hosts.to_vec(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// The value `parse` reads back (`--console` as the launcher hands it to the ranks).
/// As `--console` takes it (`Display`).
impl serde::Serialize for Selection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selection::All => f.write_str("all"),
            Selection::Ranks(r) => f.write_str(&crate::job_record::stacks::rank_list(r)),
            Selection::Hosts(h) => write!(f, "host:{}", h.join(",")),
        }
    }
}

/// Which of a program's stderr lines (`tchrun exec`) are its warnings and errors, shown on the
/// console from every rank whatever `--console` selects (the rank's other lines follow the
/// selection). A line counts when it holds one of [`StderrWarnings::WORDS`] in any case
/// (`warning`, `UserWarning`, `RuntimeError`, `Traceback`, `FATAL`, `panicked`), and so do the
/// lines that continue one: the indented lines right after it (a warning's source line, a
/// traceback's frames) and everything from a Python `Traceback` line to its exception's line,
/// the first line after it that is not indented (`KeyboardInterrupt`, `ValueError: bad`).
/// stdout lines never count. One per stream of a rank: the state is the lines before.
#[derive(Debug, Default, Clone)]
pub struct StderrWarnings {
    /// The previous line counted: an indented line continues it.
    previous: bool,
    /// Inside a Python traceback: up to its first line that is not indented.
    traceback: bool,
}

impl StderrWarnings {
    /// The words (matched in any case) that make a line a warning or an error.
    pub const WORDS: [&'static str; 6] =
        ["warn", "error", "exception", "traceback", "fatal", "panic"];

    /// Whether `line`, the next line of the stream, is a warning or an error.
    pub fn counts(&mut self, line: &str) -> bool {
        let indented = line.starts_with([' ', '\t']);
        let lower = line.to_ascii_lowercase();
        let counts = if self.traceback {
            // The frames and the source lines are indented; the exception's line ends it.
            self.traceback = indented || line.is_empty();
            true
        } else {
            (self.previous && indented) || Self::WORDS.iter().any(|w| lower.contains(w))
        };
        if lower.starts_with("traceback (most recent call last)") {
            self.traceback = true;
        }
        self.previous = counts;
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 52 item 6: `host:nope` on a job of known hosts is refused naming them.
    #[test]
    fn a_host_the_job_does_not_run_on_is_refused() {
        let here = vec!["vm.example".to_string()];
        let sel = |s: &str| Selection::parse(s).expect(s);
        assert!(sel("host:vm").check_hosts(&here).is_ok());
        assert!(sel("host:vm.example").check_hosts(&here).is_ok());
        assert!(sel("0").check_hosts(&here).is_ok());
        assert!(sel("host:nope").check_hosts(&[]).is_ok(), "hosts unknown");
        let e = sel("host:vm,nope").check_hosts(&here).expect_err("nope");
        assert_eq!(
            e.to_string(),
            "--console host:vm,nope: the job runs on vm.example only; name it (host:vm.example) \
             or give ranks (0,3 or all)"
        );
    }

    #[test]
    fn every_form_parses_and_reads_back() {
        for (text, sel) in [
            ("all", Selection::All),
            ("0", Selection::Ranks(vec![0])),
            ("3,0", Selection::Ranks(vec![0, 3])),
            ("0-2,5", Selection::Ranks(vec![0, 1, 2, 5])),
            ("host:node2", Selection::Hosts(vec!["node2".into()])),
            ("host:a,b", Selection::Hosts(vec!["a".into(), "b".into()])),
        ] {
            let parsed = Selection::parse(text).expect(text);
            assert_eq!(parsed, sel, "{text}");
            assert_eq!(Selection::parse(&parsed.to_string()), Ok(sel), "{text}");
        }
        assert_eq!(Selection::default().to_string(), "0");
    }

    #[test]
    fn bad_values_say_what_to_give() {
        let e = Selection::parse("0,x")
            .expect_err("x is no rank")
            .to_string();
        assert!(e.contains("'x'") && e.contains("host:NAME"), "{e}");
        let many = ["0-65535"; 2].join(",");
        let e = Selection::parse(&many).expect_err("too many").to_string();
        assert!(e.contains("more ranks than a job can have"), "{e}");
        for bad in [
            "",
            "-1",
            "3-1",
            "host:",
            "0-99999999999",
            "1.5",
            "al",
            &many,
        ] {
            assert!(Selection::parse(bad).is_err(), "{bad:?}");
        }
        let e = Selection::parse("0,4").expect("parses").check(4);
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("--console 0,4: the job has 4 rank(s) (0-3); pick among them or use all".into())
        );
        assert_eq!(Selection::All.check(1), Ok(()));
    }

    #[test]
    fn a_rank_is_selected_by_number_or_host() {
        let s = Selection::parse("0,3").expect("parses");
        assert!(s.selects("a", 0) && s.selects("b", 3) && !s.selects("a", 1));
        assert_eq!(s.count(2), Some(1));
        assert_eq!(Selection::All.count(4), Some(4));
        let h = Selection::parse("host:node2").expect("parses");
        assert!(h.selects("node2", 5) && h.selects("node2.cluster", 1) && !h.selects("node1", 0));
        assert_eq!(h.count(4), None);
    }

    #[test]
    fn a_programs_warnings_and_tracebacks_count_and_its_other_lines_do_not() {
        let mut w = StderrWarnings::default();
        let lines = [
            ("loading shards", false),
            (
                "/x/train.py:3: UserWarning: TypedStorage is deprecated",
                true,
            ),
            ("  return _C._get_float32_matmul_precision()", true),
            ("epoch 1 done", false),
            ("    indented after a plain line", false),
            ("Traceback (most recent call last):", true),
            ("  File \"/x/train.py\", line 9, in <module>", true),
            ("    main()", true),
            ("KeyboardInterrupt", true),
            ("epoch 2 starts", false),
            (
                "[rank1]: torch.distributed.DistBackendError: NCCL error",
                true,
            ),
            ("E1124 12:00:00 FATAL something", true),
            ("thread 'main' panicked at src/main.rs:2:5:", true),
            ("WARNING:root:low disk", true),
        ];
        for (line, counts) in lines {
            assert_eq!(w.counts(line), counts, "{line:?}");
        }
    }
}
