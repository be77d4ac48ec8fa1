//! `ranks.json`: the rank table (rank → host, local rank, device, driver log, status), written
//! by the launcher when a job starts and completed when it ends; each row names its attempt.
use serde::{Deserialize, Serialize};

/// One rank of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// The attempt of the job this row belongs to (1 unless it restarted: `--max-restarts`).
    pub attempt: u32,
    pub rank: u32,
    pub host: String,
    pub local_rank: u32,
    pub device: String,
    pub log: String,
    pub status: String,
    /// How rank 0's address was chosen, as the rank logged it (`10.0.0.1 (eth0), reached by
    /// all 4 ranks; this rank: ...`); absent until the rank got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_record::Record;

    #[test]
    fn the_table_reads_back_as_written() {
        let t = tempfile::tempdir().unwrap();
        let rows = vec![RankRow {
            attempt: 2,
            rank: 0,
            host: "vm".into(),
            local_rank: 0,
            device: "cpu".into(),
            log: "/o/logs/70_driver_log_0".into(),
            status: "exited 0".into(),
            bootstrap: None,
        }];
        rows.write(t.path()).unwrap();
        let text = std::fs::read_to_string(t.path().join("ranks.json")).unwrap();
        assert!(
            text.starts_with("[\n  {\n    \"attempt\": 2,\n    \"rank\": 0,"),
            "{text}"
        );
        assert_eq!(Vec::<RankRow>::read(t.path()).unwrap(), Some(rows));
    }
}
