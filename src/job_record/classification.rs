//! `failure.json`'s `classification` (and each earlier attempt's): what kind of failure ended
//! the job, typed, written as the words the summary prints ("out of memory", "hang"). Words a
//! tchrun does not know (an older or newer writer's) read back as `Other` and are written back
//! as they were: a file never becomes unreadable for its classification.
use crate::driver_log::FailureKind;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What kind of failure ended the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    /// A rank failed, of the kind its failure record names (or its log's words suggest); its
    /// words are the kind's (`FailureKind::classification`: "error" for `Internal`).
    Rank(FailureKind),
    /// The job hung: the heartbeat watch stopped it.
    Hang,
    /// The ranks never started (mpirun or srun failed).
    LaunchError,
    /// A rank was killed by a signal and left no record of why.
    KilledBySignal,
    /// Words this tchrun does not know, kept as written.
    Other(String),
}

impl Classification {
    /// The words on disk and in the summary.
    pub fn as_str(&self) -> &str {
        match self {
            Classification::Rank(k) => k.classification(),
            Classification::Hang => "hang",
            Classification::LaunchError => "launch error",
            Classification::KilledBySignal => "killed by signal",
            Classification::Other(s) => s,
        }
    }

    /// The classification these words name (`Other` when none does).
    pub fn parse(words: &str) -> Classification {
        let known = [
            Classification::Hang,
            Classification::LaunchError,
            Classification::KilledBySignal,
        ];
        let mut all = FailureKind::ALL
            .into_iter()
            .map(Classification::Rank)
            .chain(known);
        all.find(|c| c.as_str() == words)
            .unwrap_or_else(|| Classification::Other(words.to_string()))
    }
}

impl From<FailureKind> for Classification {
    fn from(k: FailureKind) -> Self {
        Classification::Rank(k)
    }
}

impl From<&str> for Classification {
    fn from(words: &str) -> Self {
        Classification::parse(words)
    }
}

impl From<String> for Classification {
    fn from(words: String) -> Self {
        Classification::parse(&words)
    }
}

impl PartialEq<&str> for Classification {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Classification {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl fmt::Display for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Classification {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Classification {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Classification::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each classification's words read back as it; words no tchrun wrote read back as
    /// themselves and are written back unchanged.
    #[test]
    fn the_words_read_back_and_unknown_words_are_kept() {
        let mut all: Vec<Classification> = FailureKind::ALL
            .into_iter()
            .map(Classification::from)
            .collect();
        all.extend([
            Classification::Hang,
            Classification::LaunchError,
            Classification::KilledBySignal,
        ]);
        for c in &all {
            let json = serde_json::to_string(c).expect("serialises");
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            let back: Classification = serde_json::from_str(&json).expect("reads back");
            assert_eq!(&back, c, "{json}");
        }
        assert_eq!(Classification::Rank(FailureKind::Internal), "error");
        assert_eq!(
            Classification::parse("out of memory"),
            Classification::Rank(FailureKind::OutOfMemory)
        );
        let newer: Classification =
            serde_json::from_str("\"gpu fell off the bus\"").expect("reads");
        assert_eq!(newer, Classification::Other("gpu fell off the bus".into()));
        assert_eq!(
            serde_json::to_string(&newer).expect("writes"),
            "\"gpu fell off the bus\""
        );
    }

    /// A `failure.json` whose classification this tchrun does not know still reads, whole.
    #[test]
    fn a_summary_with_unknown_words_reads() {
        use crate::job_record::{FailureSummary, Record};
        let t = tempfile::tempdir().expect("tempdir");
        let mut s = FailureSummary::hang("stuck".into(), None);
        s.write(t.path()).expect("writes");
        let path = t.path().join("failure.json");
        let text = std::fs::read_to_string(&path).expect("reads");
        assert!(text.contains("\"classification\": \"hang\""), "{text}");
        std::fs::write(&path, text.replace("\"hang\"", "\"a newer word\"")).expect("writes");
        let back = FailureSummary::read(t.path())
            .expect("reads")
            .expect("a summary");
        s.classification = Classification::Other("a newer word".into());
        assert_eq!(back, s);
    }
}
