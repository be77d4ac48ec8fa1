//! The documents cite tests that exist: every `tests/FILE.rs::NAME` in a Markdown file of the
//! repository (its root and `docs/`) names a file of `tests/` that defines `fn NAME`, so a
//! renamed or removed test cannot leave a document pointing at nothing. And their links hold:
//! every relative link names a file that exists, and its `#anchor` a heading of that file.
mod common;
use common::*;
use std::path::{Path, PathBuf};

/// The Markdown files of the repository's root and of `docs/`, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = [root.to_path_buf(), root.join("docs")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs
}

/// `docs/x.md` for a document under `root`.
fn shown(root: &Path, doc: &Path) -> String {
    doc.strip_prefix(root)
        .unwrap_or(doc)
        .to_string_lossy()
        .into_owned()
}

/// `(document, file, test)` for every `tests/FILE.rs::NAME` in `text`.
fn citations(doc: &str, text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("tests/") {
        rest = &rest[i + "tests/".len()..];
        let file: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '/' || *c == '.')
            .collect();
        let Some(file) = file.strip_suffix("::").or(Some(file.as_str())) else {
            continue;
        };
        if !file.ends_with(".rs") {
            continue;
        }
        let after = &rest[file.len()..];
        let Some(after) = after.strip_prefix("::") else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push((doc.to_string(), file.to_string(), name));
        }
    }
    out
}

#[test]
fn citation_parser_finds_file_and_test() {
    let c = citations(
        "X.md",
        "see `tests/trainer.rs::nan_loss_stops_every_rank_with_exit_5`, and tests/faults.rs, \
         and (tests/bad_data.rs::a_b)",
    );
    assert_eq!(
        c,
        vec![
            (
                "X.md".to_string(),
                "trainer.rs".to_string(),
                "nan_loss_stops_every_rank_with_exit_5".to_string()
            ),
            (
                "X.md".to_string(),
                "bad_data.rs".to_string(),
                "a_b".to_string()
            ),
        ]
    );
}

#[test]
fn every_test_cited_in_the_documents_exists() {
    let root = repo();
    let docs = documents(&root);
    assert!(
        docs.iter().any(|d| d.ends_with("RELIABILITY.md")),
        "{docs:?}"
    );
    assert!(
        docs.iter().any(|d| d.ends_with("docs/training.md")),
        "{docs:?}"
    );
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        for (d, file, test) in citations(&shown(&root, doc), &text) {
            let source =
                std::fs::read_to_string(root.join("tests").join(&file)).unwrap_or_default();
            checked += 1;
            if !source.contains(&format!("fn {test}(")) {
                missing.push(format!(
                    "{d} cites tests/{file}::{test}, which does not exist"
                ));
            }
        }
    }
    assert!(checked > 5, "only {checked} citations found in {docs:?}");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The text outside fenced code blocks (a link-like `](` in a shell command is no link).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of the inline links and images in `text`: `[..](TARGET)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn link_parser_and_anchors() {
    assert_eq!(
        links("see [a](docs/a.md), ![img](b.png) and [c](../C.md#x-y) (not this)"),
        vec!["docs/a.md", "b.png", "../C.md#x-y"]
    );
    assert_eq!(
        anchors("# T\n\n```sh\n# not a heading\n```\n## Large datasets: the `--x` index\n"),
        vec!["t", "large-datasets-the---x-index"]
    );
}

#[test]
fn every_relative_link_in_the_documents_exists() {
    let root = repo();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = read(&doc);
        let dir = doc.parent().expect("a document's folder");
        for target in links(&prose(&text)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                dir.join(path)
            };
            let name = shown(&root, &doc);
            if path.starts_with('/') || !file.exists() {
                broken.push(format!("{name}: ({target}): no file {}", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if !anchors(&read(&file)).iter().any(|a| a == anchor) {
                    broken.push(format!("{name}: ({target}): no heading #{anchor}"));
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} links found");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
