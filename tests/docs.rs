//! The documents cite tests that exist: every `tests/FILE.rs::NAME` in a Markdown file of the
//! repository (its root and docs/) names a file of `tests/` that defines `fn NAME`, so a renamed
//! or removed test cannot leave a document pointing at nothing.
mod common;
use common::*;

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
    // The Markdown files of the root and of docs/.
    let mut docs: Vec<std::path::PathBuf> = [root.clone(), root.join("docs")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(
        docs.iter().any(|d| d.ends_with("RELIABILITY.md")),
        "{docs:?}"
    );
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        let name = doc.file_name().map(|n| n.to_string_lossy().into_owned());
        for (d, file, test) in citations(&name.unwrap_or_default(), &text) {
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
