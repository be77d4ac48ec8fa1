//! The records a job leaves in its log directory for the user, `tchrun logs` and the next
//! attempt: `failure.json` ([`failure::FailureSummary`]), `ranks.json` ([`ranks::RankRow`])
//! and `restarts.json` ([`restarts::Attempt`]). Each is one typed struct whose one reader and
//! one writer are [`Record`]'s, so that every binary that reads a record reads what was
//! written.
//! Owns the JSON shapes (field names and order are documented); knows nothing of how a job is
//! launched or supervised.
pub mod cause;
pub mod classification;
pub mod failure;
pub mod hang;
pub mod heartbeat;
pub mod memory;
mod per_rank;
pub mod ranks;
mod record;
pub mod restarts;
pub mod stacks;
pub mod status;

pub use cause::Cause;
pub use classification::Classification;
pub use failure::FailureSummary;
pub use hang::HangVerdict;
pub use heartbeat::Heartbeat;
pub use ranks::RankRow;
pub use record::{Record, RecordError};
pub use restarts::{Attempt, DroppedHost};
pub use status::JobStatus;

impl Record for FailureSummary {
    const FILE: &'static str = crate::files::FAILURE_JSON;
}

/// The rank table, one row a rank.
impl Record for Vec<RankRow> {
    const FILE: &'static str = crate::files::RANKS_JSON;
}

/// The attempts that were restarted, oldest first.
impl Record for Vec<Attempt> {
    const FILE: &'static str = crate::files::RESTARTS_JSON;
}
