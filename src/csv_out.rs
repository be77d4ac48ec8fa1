//! The one CSV writer of every CSV tchrun writes (`score`'s `scores.csv`, `evaluate`'s
//! `scores.csv` and `confusion_matrix.csv`): the `csv` crate's RFC 4180 quoting (commas, quotes,
//! newlines), cells a spreadsheet will not run as formulas, names that are not UTF-8 written
//! lossily but visibly (U+FFFD), and the file written atomically.
use std::path::Path;

/// A CSV that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct CsvError {
    pub path: String,
    pub why: String,
}

/// A text cell that a spreadsheet will not run as a formula: a leading `=`, `+`, `-`, `@`, tab
/// or carriage return gets a `'` before it (OWASP's "CSV injection" advice). Numbers are not
/// text cells: write them as they are.
pub fn cell(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    }
}

/// A path (or a name from a path) as a cell: lossily decoded (bytes that are not UTF-8 become
/// U+FFFD, visibly), then `cell`.
pub fn path_cell(p: &Path) -> String {
    cell(&p.to_string_lossy())
}

/// The CSV text of `header` and `rows`, each text cell made safe by the caller (`cell`).
pub fn to_bytes(
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> Result<Vec<u8>, csv::Error> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    w.write_record(header)?;
    for r in rows {
        w.write_record(&r)?;
    }
    w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// Writes `header` and `rows` to `path` atomically (`files::write_atomic_with`).
pub fn write(
    path: &Path,
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> Result<(), CsvError> {
    let err = |why: String| CsvError {
        path: path.display().to_string(),
        why,
    };
    let fill = |tmp: &Path| -> Result<(), CsvError> {
        let file = std::fs::File::create(tmp).map_err(|e| err(e.to_string()))?;
        let mut w = csv::WriterBuilder::new()
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(std::io::BufWriter::new(file));
        w.write_record(header).map_err(|e| err(e.to_string()))?;
        for r in rows {
            w.write_record(&r).map_err(|e| err(e.to_string()))?;
        }
        w.flush().map_err(|e| err(e.to_string()))
    };
    crate::files::write_atomic_with(path, fill, |e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_quoted_and_formula_safe() {
        let rows = vec![
            vec![cell("=1+2"), cell("a,b"), cell("say \"hi\"")],
            vec![cell("line\nbreak"), cell("@x"), cell("+-")],
            vec![cell("-3"), cell("é😀"), cell("plain")],
        ];
        let text = String::from_utf8(to_bytes(&["a", "b", "c"], rows).unwrap()).unwrap();
        assert_eq!(
            text,
            "a,b,c\n'=1+2,\"a,b\",\"say \"\"hi\"\"\"\n\"line\nbreak\",'@x,'+-\n'-3,é😀,plain\n"
        );
    }

    #[test]
    fn non_utf8_names_are_visible() {
        use std::os::unix::ffi::OsStrExt;
        let p = Path::new(std::ffi::OsStr::from_bytes(b"cat/\xffimg.png"));
        assert_eq!(path_cell(p), "cat/\u{FFFD}img.png");
    }
}
