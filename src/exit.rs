//! Exit codes (the design's table) and the error kinds that map to them, one exhaustive match.

/// Process exit codes of `tchrun` and `tchrun-worker`.
pub mod code {
    /// The job succeeded.
    pub const OK: i32 = 0;
    /// A rank failed in a way no other code describes (worker-internal; the launcher reports 4).
    pub const INTERNAL: i32 = 1;
    /// Invalid input, found before anything started.
    pub const INVALID_INPUT: i32 = 2;
    /// The launch itself failed (mpirun/srun could not start the ranks): see `70_mpi_log`.
    pub const LAUNCH_FAILED: i32 = 3;
    /// A rank failed (crashed, was killed, lost its peers).
    pub const RANK_FAILED: i32 = 4;
    /// Training diverged: the loss became NaN or infinite.
    pub const DIVERGED: i32 = 5;
    /// Interrupted by SIGINT (Ctrl-C).
    pub const INTERRUPTED_INT: i32 = 130;
    /// Interrupted by SIGTERM.
    pub const INTERRUPTED_TERM: i32 = 143;
}

/// What went wrong, as far as the exit code is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Flags, model directory, image directories, hostfile: refused before any rank starts.
    InvalidInput,
    /// mpirun/srun/local spawn could not start the ranks.
    LaunchFailed,
    /// A rank failed at run time (communication error, crash, signal, I/O).
    RankFailed,
    /// The training loss became NaN/inf on some rank.
    Diverged,
    /// SIGINT received.
    InterruptedInt,
    /// SIGTERM received.
    InterruptedTerm,
}

impl ErrorKind {
    /// The documented exit code of this kind.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::InvalidInput => code::INVALID_INPUT,
            ErrorKind::LaunchFailed => code::LAUNCH_FAILED,
            ErrorKind::RankFailed => code::RANK_FAILED,
            ErrorKind::Diverged => code::DIVERGED,
            ErrorKind::InterruptedInt => code::INTERRUPTED_INT,
            ErrorKind::InterruptedTerm => code::INTERRUPTED_TERM,
        }
    }

    /// How the launcher reads a worker's exit code: the codes that carry meaning pass through,
    /// everything else means "a rank failed".
    pub fn from_worker_exit(code: i32) -> Option<ErrorKind> {
        match code {
            code::OK => None,
            code::INVALID_INPUT => Some(ErrorKind::InvalidInput),
            code::DIVERGED => Some(ErrorKind::Diverged),
            _ => Some(ErrorKind::RankFailed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        assert_eq!(ErrorKind::InvalidInput.exit_code(), 2);
        assert_eq!(ErrorKind::LaunchFailed.exit_code(), 3);
        assert_eq!(ErrorKind::RankFailed.exit_code(), 4);
        assert_eq!(ErrorKind::Diverged.exit_code(), 5);
        assert_eq!(ErrorKind::InterruptedInt.exit_code(), 130);
        assert_eq!(ErrorKind::InterruptedTerm.exit_code(), 143);
    }

    #[test]
    fn worker_codes_map() {
        assert_eq!(ErrorKind::from_worker_exit(0), None);
        assert_eq!(
            ErrorKind::from_worker_exit(2),
            Some(ErrorKind::InvalidInput)
        );
        assert_eq!(ErrorKind::from_worker_exit(5), Some(ErrorKind::Diverged));
        assert_eq!(ErrorKind::from_worker_exit(1), Some(ErrorKind::RankFailed));
        assert_eq!(
            ErrorKind::from_worker_exit(137),
            Some(ErrorKind::RankFailed)
        );
    }
}
