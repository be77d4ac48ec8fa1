//! The driver log's header: `tchrun driver log`, `key: value` lines (one line each, escaped),
//! `---`.

/// The first line of every driver log.
pub const MAGIC: &str = "tchrun driver log";
/// The line that ends the header.
pub const HEADER_END: &str = "---";

/// A driver log that does not follow the contract.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DriverLogError {
    #[error("not a tchrun driver log (its first line is not '{MAGIC}')")]
    NotADriverLog,
    #[error("the driver log header ends before '{HEADER_END}'")]
    UnterminatedHeader,
    #[error("the driver log header lacks '{0}'")]
    MissingKey(&'static str),
    #[error("the driver log header has an invalid '{key}': {value:?}")]
    InvalidValue { key: &'static str, value: String },
}

/// The header of a driver log: who the rank is, where it runs, what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub host: String,
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub pid: u32,
    pub device: String,
    pub backend: String,
    pub started_by: String,
    /// tchrun's version.
    pub tchrun: String,
    /// libtorch's version.
    pub torch: String,
    pub command: String,
    /// RFC 3339 time the log was opened.
    pub started: String,
}

/// Header values are one line each: backslashes, newlines and carriage returns are escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            c => s.push(c),
        }
    }
    s
}

fn unescape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            s.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => s.push('\n'),
            Some('r') => s.push('\r'),
            Some(other) => s.push(other),
            None => s.push('\\'),
        }
    }
    s
}

impl Header {
    /// The header as written at the top of the log, `---` line included.
    pub fn write(&self) -> String {
        format!(
            "{MAGIC}\nhost: {}\nrank: {}\nlocal_rank: {}\nworld_size: {}\npid: {}\ndevice: {}\n\
             backend: {}\nstarted_by: {}\ntchrun: {}\ntorch: {}\ncommand: {}\nstarted: {}\n{HEADER_END}\n",
            escape(&self.host),
            self.rank,
            self.local_rank,
            self.world_size,
            self.pid,
            escape(&self.device),
            escape(&self.backend),
            escape(&self.started_by),
            escape(&self.tchrun),
            escape(&self.torch),
            escape(&self.command),
            escape(&self.started),
        )
    }

    /// Reads the header at the start of `text`; returns it and the body after `---`.
    pub fn parse(text: &str) -> Result<(Header, &str), DriverLogError> {
        let mut rest = text;
        let mut next_line = || -> Option<&str> {
            if rest.is_empty() {
                return None;
            }
            let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
            rest = after;
            Some(line)
        };
        if next_line() != Some(MAGIC) {
            return Err(DriverLogError::NotADriverLog);
        }
        let mut fields = std::collections::BTreeMap::new();
        loop {
            match next_line() {
                None => return Err(DriverLogError::UnterminatedHeader),
                Some(HEADER_END) => break,
                Some(line) => {
                    if let Some((k, v)) = line.split_once(": ") {
                        fields.insert(k.to_string(), unescape(v));
                    } else if let Some(k) = line.strip_suffix(':') {
                        fields.insert(k.to_string(), String::new());
                    }
                }
            }
        }
        let body = rest;
        let text = |key: &'static str| -> Result<String, DriverLogError> {
            fields
                .get(key)
                .cloned()
                .ok_or(DriverLogError::MissingKey(key))
        };
        fn num<T: std::str::FromStr>(key: &'static str, v: String) -> Result<T, DriverLogError> {
            v.trim()
                .parse()
                .map_err(|_| DriverLogError::InvalidValue { key, value: v })
        }
        Ok((
            Header {
                host: text("host")?,
                rank: num("rank", text("rank")?)?,
                local_rank: num("local_rank", text("local_rank")?)?,
                world_size: num("world_size", text("world_size")?)?,
                pid: num("pid", text("pid")?)?,
                device: text("device")?,
                backend: text("backend")?,
                started_by: text("started_by")?,
                tchrun: text("tchrun")?,
                torch: text("torch")?,
                command: text("command")?,
                started: text("started")?,
            },
            body,
        ))
    }
}
