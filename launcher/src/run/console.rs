//! The launcher's terminal: the ranks' lines as the user reads them. A line that several ranks
//! print alike is shown once as `[ranks 0-3] text`, after it waited a bounded time for the
//! others (`Fold`); a line of one rank keeps its `host:rank ` prefix; the progress line of the
//! lowest rank shown is rewritten in place on a terminal (`Redraw`). Which ranks print is the
//! ranks' own decision (`--console`, `tchrun::console`); this module only learns how many to
//! expect. Must not know where else the lines go (`supervise.rs` tees them to `70_mpi_log`
//! unchanged).
use std::collections::VecDeque;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tchrun::console::Selection;
use tchrun::driver_log::{split_console_line, Progress};

/// The longest a line waits for its like from other ranks before it is shown.
pub const FOLD_WINDOW: Duration = Duration::from_millis(500);

/// A line as the terminal shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub text: String,
    pub to_stderr: bool,
    /// The progress line of the lowest rank shown (rewritten in place on a terminal).
    pub progress: bool,
}

/// A line waiting for the same line from other ranks.
#[derive(Debug)]
struct Pending {
    to_stderr: bool,
    /// The line as the first rank printed it (all of it for a line that is no rank's).
    raw: String,
    /// The text after the rank's prefix; `None` for a line of no rank (mpirun's own words),
    /// shown as it is.
    text: Option<String>,
    ranks: Vec<usize>,
    since: Instant,
}

/// Identical lines of several ranks folded into one, in the order their first line came. A
/// line is shown when every rank expected to print it did, or after `FOLD_WINDOW`; the lines
/// behind it wait for it, so that no rank's lines are reordered.
#[derive(Debug)]
pub struct Fold {
    pending: VecDeque<Pending>,
    /// How many ranks print their lines on stdout (those `--console` selects); `None` when
    /// that depends on where they run (hosts): such lines wait the whole window.
    out_ranks: Option<usize>,
    /// How many ranks print warnings and errors (on stderr): every one.
    err_ranks: usize,
    window: Duration,
    /// The lowest rank whose progress line was shown: its progress is the one rewritten in
    /// place (rank 0's by default, rank 1's with `--console 1`).
    lead: Option<usize>,
}

impl Fold {
    pub fn new(selection: &Selection, world_size: usize, window: Duration) -> Fold {
        Fold {
            pending: VecDeque::new(),
            out_ranks: selection.count(world_size),
            err_ranks: world_size,
            window,
            lead: None,
        }
    }

    /// A line one of the processes printed; returns the lines now due.
    pub fn push(&mut self, line: &str, to_stderr: bool, now: Instant) -> Vec<Shown> {
        match split_console_line(line) {
            Some((_, rank, text)) => {
                let joined = self.pending.iter_mut().find(|p| {
                    p.to_stderr == to_stderr
                        && p.text.as_deref() == Some(text)
                        && !p.ranks.contains(&rank)
                });
                match joined {
                    Some(p) => p.ranks.push(rank),
                    None => self.pending.push_back(Pending {
                        to_stderr,
                        raw: line.to_string(),
                        text: Some(text.to_string()),
                        ranks: vec![rank],
                        since: now,
                    }),
                }
            }
            None => self.pending.push_back(Pending {
                to_stderr,
                raw: line.to_string(),
                text: None,
                ranks: Vec::new(),
                since: now,
            }),
        }
        self.due(now)
    }

    /// The lines at the front that are complete or waited long enough.
    pub fn due(&mut self, now: Instant) -> Vec<Shown> {
        let mut shown = Vec::new();
        while let Some(p) = self.pending.front() {
            let expected = if p.to_stderr {
                Some(self.err_ranks)
            } else {
                self.out_ranks
            };
            let complete = expected.is_some_and(|n| p.ranks.len() >= n);
            if p.text.is_some() && !complete && now.duration_since(p.since) < self.window {
                break;
            }
            if let Some(p) = self.pending.pop_front() {
                shown.push(p.shown(&mut self.lead));
            }
        }
        shown
    }

    /// Every line still waiting (the run is over).
    pub fn drain(&mut self) -> Vec<Shown> {
        let lead = &mut self.lead;
        self.pending.drain(..).map(|p| p.shown(lead)).collect()
    }
}

impl Pending {
    /// The line as shown; a progress line is the one rewritten in place when it holds the
    /// lowest rank whose progress came so far (`lead`).
    fn shown(self, lead: &mut Option<usize>) -> Shown {
        let is_progress = !self.to_stderr
            && self
                .text
                .as_deref()
                .is_some_and(|t| Progress::parse(t).is_some());
        let progress = match self.ranks.iter().min() {
            Some(&low) if is_progress => {
                let l = lead.map_or(low, |l| l.min(low));
                *lead = Some(l);
                self.ranks.contains(&l)
            }
            _ => false,
        };
        let text = match (&self.text, self.ranks.len()) {
            (Some(t), n) if n > 1 => {
                let ranks = tchrun::job_record::stacks::rank_list(&self.ranks);
                format!("[ranks {ranks}] {t}")
            }
            _ => self.raw,
        };
        Shown {
            text,
            to_stderr: self.to_stderr,
            progress,
        }
    }
}

/// Where the shown lines appear.
trait Screen: Send + Sync {
    fn show(&self, line: &Shown);
    /// The run is over: leave the terminal clean.
    fn finish(&self) {}
}

/// Plain lines: stdout to stdout, stderr to stderr (a pipe, a file, a batch log).
struct Plain;

impl Screen for Plain {
    fn show(&self, line: &Shown) {
        if line.to_stderr {
            errln!("{}", line.text);
        } else {
            outln!("{}", line.text);
        }
    }
}

/// A terminal: the lowest rank's progress is one line rewritten in place; other lines go
/// above it.
struct Redraw {
    /// True while a progress line is on screen.
    shown: Mutex<bool>,
}

impl Screen for Redraw {
    fn show(&self, line: &Shown) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = std::io::stdout().lock();
        if line.progress {
            let _ = write!(out, "\r\x1b[2K{}", line.text);
            *shown = true;
        } else {
            if *shown {
                let _ = write!(out, "\r\x1b[2K");
                *shown = false;
            }
            let _ = out.flush();
            if line.to_stderr {
                errln!("{}", line.text);
            } else {
                let _ = writeln!(out, "{}", line.text);
            }
        }
        let _ = out.flush();
    }

    fn finish(&self) {
        if *self.shown.lock().unwrap_or_else(|e| e.into_inner()) {
            outln!(); // keep the last progress line, end it
        }
    }
}

/// The ranks' lines on tchrun's terminal: folded, then shown.
pub struct Console {
    fold: Mutex<Fold>,
    screen: Box<dyn Screen>,
}

impl Console {
    /// The console of a job of `world_size` ranks whose lines `selection` picks: redrawn in
    /// place when stdout is a terminal, plain lines otherwise.
    pub fn new(selection: &Selection, world_size: usize) -> Console {
        use std::io::IsTerminal;
        let screen: Box<dyn Screen> = if std::io::stdout().is_terminal() {
            Box::new(Redraw {
                shown: Mutex::new(false),
            })
        } else {
            Box::new(Plain)
        };
        Console {
            fold: Mutex::new(Fold::new(selection, world_size, FOLD_WINDOW)),
            screen,
        }
    }

    /// A line a process printed.
    pub fn line(&self, line: &str, to_stderr: bool) {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        for s in fold.push(line, to_stderr, Instant::now()) {
            self.screen.show(&s);
        }
    }

    /// Shows the lines that waited long enough (called often while the job runs).
    pub fn tick(&self) {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        for s in fold.due(Instant::now()) {
            self.screen.show(&s);
        }
    }

    /// The run is over: every line still waiting, then a clean terminal.
    pub fn finish(&self) {
        let mut fold = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        for s in fold.drain() {
            self.screen.show(&s);
        }
        self.screen.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(shown: &[Shown]) -> Vec<&str> {
        shown.iter().map(|s| s.text.as_str()).collect()
    }

    #[test]
    fn lines_of_every_selected_rank_fold_at_once_and_keep_their_order() {
        let t = Instant::now();
        let mut f = Fold::new(&Selection::All, 4, FOLD_WINDOW);
        assert!(f.push("a:0 epoch 1/2: loss 1", false, t).is_empty());
        assert!(
            f.push("a:0 next", false, t).is_empty(),
            "waits behind the first"
        );
        for r in [2, 1] {
            assert!(f
                .push(&format!("b:{r} epoch 1/2: loss 1"), false, t)
                .is_empty());
        }
        let shown = f.push("b:3 epoch 1/2: loss 1", false, t);
        assert_eq!(texts(&shown), ["[ranks 0-3] epoch 1/2: loss 1"]);
        // "next" of rank 0 alone, shown after the window with its prefix.
        assert!(f.due(t + FOLD_WINDOW / 2).is_empty());
        assert_eq!(texts(&f.due(t + FOLD_WINDOW)), ["a:0 next"]);
    }

    #[test]
    fn the_default_shows_rank_0_at_once_and_waits_for_warnings_of_the_others() {
        let t = Instant::now();
        let mut f = Fold::new(&Selection::default(), 3, FOLD_WINDOW);
        assert_eq!(texts(&f.push("a:0 hello", false, t)), ["a:0 hello"]);
        assert!(f.push("a:1 warning: slow disk", true, t).is_empty());
        assert!(f.push("a:0 warning: slow disk", true, t).is_empty());
        let later = t + Duration::from_millis(600);
        let shown = f.due(later);
        assert_eq!(texts(&shown), ["[ranks 0-1] warning: slow disk"]);
        assert!(shown[0].to_stderr);
    }

    #[test]
    fn a_rank_that_repeats_a_line_starts_a_new_one_and_other_words_pass_through() {
        let t = Instant::now();
        let mut f = Fold::new(&Selection::parse("0,1").expect("parses"), 2, FOLD_WINDOW);
        assert!(f.push("a:0 same", false, t).is_empty());
        assert!(f.push("a:0 same", false, t).is_empty());
        assert!(f.push("mpirun noticed something", true, t).is_empty());
        assert_eq!(texts(&f.push("a:1 same", false, t)), ["[ranks 0-1] same"]);
        assert_eq!(
            f.drain().len(),
            2,
            "the repeat and mpirun's line, at the end"
        );
        // A stdout and a stderr line of the same words are not one line.
        assert!(f.push("a:0 x", false, t).is_empty());
        assert!(f.push("a:1 x", true, t).is_empty());
        assert_eq!(texts(&f.drain()), ["a:0 x", "a:1 x"]);
    }

    #[test]
    fn progress_is_the_lowest_ranks_progress_line_folded_or_not() {
        let t = Instant::now();
        let p = Progress {
            epoch: 1,
            epochs: 2,
            iter: 3,
            iters: 10,
            loss: 1.5,
            lr: 0.1,
            images_per_s: 100.0,
            eta: Duration::from_secs(5),
        }
        .write();
        let mut f = Fold::new(&Selection::All, 2, FOLD_WINDOW);
        f.push(&format!("a:0 {p}"), false, t);
        let shown = f.push(&format!("a:1 {p}"), false, t);
        assert!(shown[0].progress && shown[0].text.starts_with("[ranks 0-1] epoch 1/2"));
        // `--console 1`: rank 1's progress is the one rewritten.
        let mut f = Fold::new(&Selection::parse("1").expect("parses"), 2, FOLD_WINDOW);
        assert!(f.push(&format!("a:1 {p}"), false, t)[0].progress);
        // Unfolded progress lines of two ranks: rank 0's is rewritten, rank 1's scrolls.
        let mut f = Fold::new(&Selection::All, 2, FOLD_WINDOW);
        let other = p.replace("loss 1.5000", "loss 1.6000");
        assert!(f.push(&format!("a:0 {p}"), false, t).is_empty());
        assert!(f.push(&format!("a:1 {other}"), false, t).is_empty());
        let shown: Vec<bool> = f.drain().iter().map(|s| s.progress).collect();
        assert_eq!(shown, [true, false]);
        let mut f = Fold::new(&Selection::default(), 2, FOLD_WINDOW);
        assert!(!f.push("a:0 trained", false, t)[0].progress);
    }
}
