//! The codebase's own rules (issue 27), checked on every run so they stay true: no function
//! over 150 lines and no file over 600 lines before its `#[cfg(test)]` module in the crates'
//! sources, no import cycle between a crate's top-level modules, and `ARCHITECTURE.md` names
//! every source file.
mod common;
use common::repo;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 150;
const MAX_FILE_LINES: usize = 600;

/// Every crate's source folder: the root crate, the two binaries and `crates/*`.
fn source_roots() -> Vec<PathBuf> {
    let r = repo();
    let mut roots = vec![r.join("src"), r.join("launcher/src"), r.join("worker/src")];
    if let Ok(rd) = std::fs::read_dir(r.join("crates")) {
        let mut more: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path().join("src"))
            .filter(|p| p.is_dir())
            .collect();
        more.sort();
        roots.extend(more);
    }
    roots
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a line with comments, strings and char literals blanked (braces inside them
/// do not count). `in_block`/`in_str` carry a block comment or string over lines.
fn code_of(line: &str, in_block: &mut bool, in_str: &mut bool) -> String {
    let b: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if *in_block {
            if c == '*' && next == Some('/') {
                *in_block = false;
                i += 2;
            } else {
                i += 1;
            }
            continue;
        }
        if *in_str {
            if c == '\\' {
                i += 2;
                continue;
            }
            if c == '"' {
                *in_str = false;
            }
            i += 1;
            continue;
        }
        match (c, next) {
            ('/', Some('/')) => break,
            ('/', Some('*')) => {
                *in_block = true;
                i += 2;
            }
            ('"', _) => {
                *in_str = true;
                i += 1;
            }
            ('\'', Some('\\')) => {
                // An escaped char literal: skip to its closing quote.
                let close = b[i + 2..].iter().position(|&x| x == '\'');
                i += close.map(|k| k + 3).unwrap_or(1);
            }
            ('\'', Some(_)) if b.get(i + 2) == Some(&'\'') => i += 3,
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let mut words = t.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        let w = *w;
        if w.starts_with("pub") || matches!(w, "const" | "async" | "unsafe" | "extern" | "\"C\"") {
            words.next();
        } else {
            break;
        }
    }
    if words.next() != Some("fn") {
        return None;
    }
    let name: String = words
        .next()?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// (name, first line, lines) of every function in `text`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let (mut in_block, mut in_str) = (false, false);
    let mut depth = 0i64;
    let mut open: Vec<(String, usize, i64)> = Vec::new();
    let mut done = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let was_in_literal = in_block || in_str;
        let code = code_of(line, &mut in_block, &mut in_str);
        if !was_in_literal {
            if let Some(name) = fn_name(line) {
                if !code.trim_end().ends_with(';') {
                    open.push((name, n + 1, depth));
                }
            }
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if open.last().is_some_and(|(_, _, d)| *d == depth) {
                        if let Some((name, start, _)) = open.pop() {
                            done.push((name, start, n + 1 - start + 1));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    done
}

/// The file's lines without its unit tests: an inline `#[cfg(test)] mod tests { ... }` ends the
/// count (it comes last); a `#[cfg(test)] mod tests;` in another file is two lines skipped.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut n = 0;
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
            if next.starts_with("mod ") && next.ends_with(';') {
                i += 2;
                continue;
            }
            break;
        }
        n += 1;
        i += 1;
    }
    n
}

#[test]
fn the_function_finder_measures_what_it_should() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '{';\n}\n// fn b() {\npub(crate) fn c(\n    x: u8,\n) -> u8 {\n    if x > 0 { 1 } else { 0 }\n}\n";
    let f = functions(text);
    assert_eq!(
        f,
        vec![("a".to_string(), 1, 4), ("c".to_string(), 6, 5)],
        "{text}"
    );
    assert_eq!(code_lines("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(code_lines("a\n#[cfg(test)]\nmod tests;\nb\n"), 2);
}

#[test]
fn no_function_over_150_lines_and_no_file_over_600() {
    let mut over = Vec::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            let rel = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
            let lines = code_lines(&text);
            if lines > MAX_FILE_LINES {
                over.push(format!(
                    "{rel}: {lines} lines before #[cfg(test)] (at most {MAX_FILE_LINES})"
                ));
            }
            for (name, start, n) in functions(&text) {
                if n > MAX_FN_LINES {
                    over.push(format!(
                        "{rel}:{start}: fn {name} is {n} lines (at most {MAX_FN_LINES})"
                    ));
                }
            }
        }
    }
    assert!(over.is_empty(), "split these:\n{}", over.join("\n"));
}

/// The crate modules `text` refers to (`crate::x`, `use crate::{x, y::z}`).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            for item in inner.split(',') {
                let m = ident(item.trim());
                if !m.is_empty() {
                    out.insert(m);
                }
            }
        } else {
            let m = ident(rest);
            if !m.is_empty() {
                out.insert(m);
            }
        }
    }
    out
}

#[test]
fn no_import_cycle_between_a_crates_modules() {
    let mut cycles = Vec::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in files {
            let rel = f.strip_prefix(&root).expect("under its root");
            let top = rel
                .components()
                .next()
                .map(|c| {
                    c.as_os_str()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .unwrap_or_default();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("read a source file");
            let code = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
            for m in crate_refs(code) {
                if m != top {
                    edges.entry(top.clone()).or_default().insert(m);
                }
            }
        }
        let reaches = |from: &str, to: &str| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![from.to_string()];
            while let Some(x) = stack.pop() {
                for y in edges.get(&x).into_iter().flatten() {
                    if y == to {
                        return true;
                    }
                    if seen.insert(y.clone()) {
                        stack.push(y.clone());
                    }
                }
            }
            false
        };
        for (a, bs) in &edges {
            for b in bs {
                if a < b && reaches(b, a) {
                    cycles.push(format!("{}: {a} <-> {b}", root.display()));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn architecture_names_every_source_file() {
    let arch = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut missing = Vec::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for f in files {
            let rel = f.strip_prefix(&root).expect("under its root");
            let name = rel.display().to_string();
            // A folder's `mod.rs` is named by the folder; a crate's root by the crate.
            let named = if name == "lib.rs" || name == "main.rs" {
                true
            } else if let Some(dir) = name.strip_suffix("/mod.rs") {
                arch.contains(&format!("`{dir}/`")) || arch.contains(&format!("`{name}`"))
            } else {
                arch.contains(&format!("`{name}`"))
            };
            if !named {
                missing.push(f.strip_prefix(repo()).unwrap_or(&f).display().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these files (as `path/from/src.rs`, a folder's mod.rs \
         as `folder/`):\n{}",
        missing.join("\n")
    );
}
