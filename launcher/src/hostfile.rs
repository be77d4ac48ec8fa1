//! OpenMPI hostfiles (`host [slots=N] [max_slots=N]`, `#` comments): the launcher's pre-flight
//! reads them to check `--nodes` against the hosts.
use std::path::{Path, PathBuf};

/// A host of a hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub slots: Option<u32>,
}

impl Host {
    /// The host as a hostfile line (without the newline): `name` or `name slots=N`.
    pub fn line(&self) -> String {
        match self.slots {
            Some(n) => format!("{} slots={n}", self.name),
            None => self.name.clone(),
        }
    }
}

/// A hostfile line that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: {why}")]
pub struct HostfileError {
    pub path: PathBuf,
    pub line: usize,
    pub why: String,
}

/// Parses OpenMPI's hostfile syntax: `host [slots=N] [max_slots=N]`, `#` comments.
pub fn parse_hostfile(path: &Path, text: &str) -> Result<Vec<Host>, HostfileError> {
    let mut hosts: Vec<Host> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |why: String| HostfileError {
            path: path.to_path_buf(),
            line: i + 1,
            why,
        };
        let mut parts = line.split_whitespace();
        let name = parts.next().unwrap_or_default().to_string();
        if name.contains('=') {
            return Err(err(format!("expected a host name first, got '{name}'")));
        }
        let mut slots = None;
        for p in parts {
            match p.split_once('=') {
                Some(("slots", v)) | Some(("max_slots", v)) | Some(("max-slots", v)) => {
                    let n: u32 = v
                        .parse()
                        .map_err(|_| err(format!("'{p}': slots must be a positive integer")))?;
                    if n == 0 {
                        return Err(err(format!("'{p}': slots must be a positive integer")));
                    }
                    if p.starts_with("slots") {
                        slots = Some(n);
                    }
                }
                _ => return Err(err(format!("unknown field '{p}' (expected slots=N)"))),
            }
        }
        if let Some(h) = hosts.iter_mut().find(|h| h.name == name) {
            // OpenMPI adds up repeated hosts.
            let sum = h.slots.unwrap_or(1).checked_add(slots.unwrap_or(1));
            h.slots = Some(sum.ok_or_else(|| {
                err(format!(
                    "host '{name}': its slots add up to more than {}",
                    u32::MAX
                ))
            })?);
        } else {
            hosts.push(Host { name, slots });
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfiles() {
        let p = Path::new("hf");
        let h = parse_hostfile(
            p,
            "# c\nnode1 slots=2\nnode2 max_slots=4 slots=3\n\nnode1\n",
        )
        .expect("valid");
        assert_eq!(
            h,
            vec![
                Host {
                    name: "node1".into(),
                    slots: Some(3)
                },
                Host {
                    name: "node2".into(),
                    slots: Some(3)
                }
            ]
        );
        let e = parse_hostfile(p, "node1 slots=x").expect_err("bad");
        assert_eq!(e.line, 1);
        assert!(parse_hostfile(p, "node1 cpus=2").is_err());
        assert!(parse_hostfile(p, "slots=2").is_err());
    }
}
