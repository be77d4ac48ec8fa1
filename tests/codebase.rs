//! The codebase's own rules (issue 27), checked on every run so they stay true: no function
//! over 150 lines and no file over 600 lines before its `#[cfg(test)]` module in the crates'
//! sources, no import circle of any length among a crate's files (edges from the paths a file
//! uses: `use`s, `pub use` re-exports followed to where an item is defined, `crate::`/`super::`
//! paths in code; not `mod` declarations), and `ARCHITECTURE.md` names
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

/// A file's unit tests, as they start at one of its lines.
#[derive(Debug, PartialEq)]
enum UnitTests {
    /// `#[cfg(test)] mod tests;`: the tests are in another file; these two lines are not code.
    Declared,
    /// `#[cfg(test)] mod tests { ... }`: the tests come last; the file's code ends here.
    Inline,
}

/// Whether the unit tests start at line `i` of `lines`. Only a `#[cfg(test)]` module counts:
/// another `#[cfg(test)]` item (a test helper among the code) is code.
fn unit_tests_at(lines: &[&str], i: usize) -> Option<UnitTests> {
    if lines.get(i).map(|l| l.trim()) != Some("#[cfg(test)]") {
        return None;
    }
    let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
    if !next.starts_with("mod ") {
        return None;
    }
    Some(if next.ends_with(';') {
        UnitTests::Declared
    } else {
        UnitTests::Inline
    })
}

/// The file's lines without its unit tests (`unit_tests_at`): an inline `#[cfg(test)] mod tests
/// { ... }` ends the count (it comes last); a `#[cfg(test)] mod tests;` is two lines skipped.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut n = 0;
    let mut i = 0;
    while i < lines.len() {
        match unit_tests_at(&lines, i) {
            Some(UnitTests::Declared) => {
                i += 2;
                continue;
            }
            Some(UnitTests::Inline) => break,
            None => {}
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
    // A test helper among the code is code; only a test module ends or skips lines.
    assert_eq!(code_lines("a\n#[cfg(test)]\nfn helper() {}\nb\n"), 4);
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

/// What follows a file's inline unit-test module (`unit_tests_at`) other than blank lines: the
/// size count and the finders stop reading there, so code after it would go unseen.
fn code_after_unit_tests(text: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut at = (0..lines.len()).find(|&i| unit_tests_at(&lines, i) == Some(UnitTests::Inline))?;
    // Each module's closing brace is the first line after it that is `}` at column 0; more test
    // modules may follow it.
    loop {
        let end = (at + 2..lines.len()).find(|&i| lines[i] == "}")?;
        let next = (end + 1..lines.len()).find(|&i| !lines[i].trim().is_empty())?;
        if unit_tests_at(&lines, next) != Some(UnitTests::Inline) {
            return Some(next + 1);
        }
        at = next;
    }
}

#[test]
fn an_inline_unit_test_module_comes_last_in_its_file() {
    assert_eq!(
        code_after_unit_tests(
            "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\nfn b() {}\n"
        ),
        Some(6),
        "the finder sees code after a test module"
    );
    assert_eq!(
        code_after_unit_tests("fn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n\n"),
        None
    );
    assert_eq!(
        code_after_unit_tests("#[cfg(test)]\nmod a {\n}\n#[cfg(test)]\nmod b {\n}\nfn c() {}\n"),
        Some(7),
        "a second test module does not hide what follows it"
    );
    let mut after = Vec::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            if let Some(line) = code_after_unit_tests(&text) {
                let rel = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
                after.push(format!("{rel}:{line}"));
            }
        }
    }
    assert!(
        after.is_empty(),
        "code after the unit-test module (move the module to the end of its file):\n{}",
        after.join("\n")
    );
}

/// A module's path inside its crate: `["train", "ema"]` for `train/ema.rs`, `[]` for the root.
type ModPath = Vec<String>;

/// A name a `use` binds (`*` for a glob) and the path it was written with.
#[derive(Debug, Clone)]
struct Import {
    path: Vec<String>,
    name: String,
}

/// What one file refers to: the names its `use`s bind and every other path in its code.
#[derive(Debug, Default)]
struct FileRefs {
    rel: String,
    imports: Vec<Import>,
    paths: Vec<Vec<String>>,
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// The tokens of blanked code: identifiers, `::` and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let word = |x: char| x.is_alphanumeric() || x == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if word(c[i]) {
            let s = i;
            while i < c.len() && word(c[i]) {
                i += 1;
            }
            out.push(c[s..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c[i].is_whitespace() {
                out.push(c[i].to_string());
            }
            i += 1;
        }
    }
    out
}

/// Reads the use tree at `t[*i..]` under `prefix`, pushing each name it binds.
fn use_tree(t: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Import>) {
    let mut path = prefix.to_vec();
    while let Some(w) = t.get(*i).map(String::as_str) {
        match w {
            "{" => {
                *i += 1;
                while *i < t.len() && t[*i] != "}" {
                    let at = *i;
                    use_tree(t, i, &path, out);
                    if t.get(*i).is_some_and(|x| x == ",") || *i == at {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                *i += 1;
                out.push(Import {
                    path,
                    name: "*".to_string(),
                });
                return;
            }
            "::" => *i += 1,
            w if is_ident(w) => {
                *i += 1;
                // `a::{self, b}` binds `a` itself.
                if !(w == "self" && !path.is_empty()) {
                    path.push(w.to_string());
                }
                match t.get(*i).map(String::as_str) {
                    Some("::") => continue,
                    Some("as") => {
                        let name = t.get(*i + 1).cloned().unwrap_or_default();
                        *i += 2;
                        out.push(Import { path, name });
                    }
                    _ => {
                        let name = path.last().cloned().unwrap_or_default();
                        out.push(Import { path, name });
                    }
                }
                return;
            }
            _ => return,
        }
    }
}

/// The code of a file without its tests (`unit_tests_at`): comments and strings blanked, an
/// inline `#[cfg(test)] mod tests { ... }` ends it, a `#[cfg(test)] mod tests;` is skipped.
fn production_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let (mut in_block, mut in_str) = (false, false);
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        match unit_tests_at(&lines, i) {
            Some(UnitTests::Declared) => {
                i += 2;
                continue;
            }
            Some(UnitTests::Inline) => break,
            None => {}
        }
        out.push_str(&code_of(lines[i], &mut in_block, &mut in_str));
        out.push('\n');
        i += 1;
    }
    out
}

/// The `use`s and paths of a file's production code.
fn file_refs(rel: &str, text: &str) -> FileRefs {
    let t = tokens(&production_code(text));
    let mut refs = FileRefs {
        rel: rel.to_string(),
        ..FileRefs::default()
    };
    let mut k = 0;
    while k < t.len() {
        let before = if k == 0 { ";" } else { t[k - 1].as_str() };
        if t[k] == "use" && matches!(before, ";" | "{" | "}" | "]" | ")" | "pub") {
            k += 1;
            use_tree(&t, &mut k, &[], &mut refs.imports);
            continue;
        }
        if is_ident(&t[k]) && before != "::" && t.get(k + 1).is_some_and(|x| x == "::") {
            let mut path = vec![t[k].clone()];
            while t.get(k + 1).is_some_and(|x| x == "::")
                && t.get(k + 2).is_some_and(|x| is_ident(x))
            {
                path.push(t[k + 2].clone());
                k += 2;
            }
            refs.paths.push(path);
        }
        k += 1;
    }
    refs
}

/// The module path of a file from its path under the crate's `src/` (`main.rs` beside a
/// `lib.rs` is a crate of its own).
fn mod_path(rel: &str, has_lib: bool) -> ModPath {
    if rel == "lib.rs" || (rel == "main.rs" && !has_lib) {
        return Vec::new();
    }
    if rel == "main.rs" {
        return vec!["<main>".to_string()];
    }
    let mut p: ModPath = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if p.last().is_some_and(|l| l == "mod") {
        p.pop();
    }
    p
}

/// A crate's files by module path, from (path under `src/`, text) pairs; modules declared
/// `#[cfg(test)] mod x;` and what lies under them are left out.
fn crate_files(sources: &[(String, String)]) -> BTreeMap<ModPath, FileRefs> {
    let has_lib = sources.iter().any(|(r, _)| r == "lib.rs");
    let mut test_only = Vec::new();
    for (rel, text) in sources {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for i in 0..lines.len() {
            if unit_tests_at(&lines, i) != Some(UnitTests::Declared) {
                continue;
            }
            let decl = lines[i + 1].strip_prefix("mod ").unwrap_or_default();
            let mut p = mod_path(rel, has_lib);
            p.push(decl.trim_end_matches(';').trim().to_string());
            test_only.push(p);
        }
    }
    sources
        .iter()
        .map(|(rel, text)| (mod_path(rel, has_lib), rel, text))
        .filter(|(p, _, _)| !test_only.iter().any(|t| p.starts_with(t)))
        .map(|(p, rel, text)| (p, file_refs(rel, text)))
        .collect()
}

/// The file that defines what `path` names when written in module `from`, and whether it
/// names a module itself; `None` for other crates' paths and local items.
fn resolve(
    files: &BTreeMap<ModPath, FileRefs>,
    from: &[String],
    path: &[String],
    depth: usize,
) -> Option<(ModPath, bool)> {
    if depth > 16 || path.is_empty() {
        return None;
    }
    let child = |m: &[String], s: &str| -> ModPath {
        let mut c = m.to_vec();
        c.push(s.to_string());
        c
    };
    let imported = |m: &[String], s: &str| -> Option<Vec<String>> {
        let f = files.get(m)?;
        f.imports
            .iter()
            .find(|i| i.name == s)
            .map(|i| i.path.clone())
    };
    let (mut cur, mut rest) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.to_vec(), &path[1..]),
        "super" => {
            let (mut cur, mut rest) = (from.to_vec(), path);
            while rest.first().is_some_and(|s| s == "super") {
                cur.pop()?;
                rest = &rest[1..];
            }
            (cur, rest)
        }
        first if files.contains_key(&child(from, first)) => (child(from, first), &path[1..]),
        first => {
            let mut p = imported(from, first)?;
            p.extend_from_slice(&path[1..]);
            return resolve(files, from, &p, depth + 1);
        }
    };
    while let Some(seg) = rest.first() {
        if files.contains_key(&child(&cur, seg)) {
            cur = child(&cur, seg);
            rest = &rest[1..];
            continue;
        }
        // An item of `cur`: defined there, or brought in by one of its `use`s.
        return match imported(&cur, seg) {
            Some(p) => resolve(files, &cur, &p, depth + 1),
            None => Some((cur, false)),
        };
    }
    Some((cur, true))
}

/// The import edges between a crate's files (by their path under `src/`), each with the
/// first path that makes it. A path naming a module makes no edge (what is used through it
/// does); a glob does.
fn import_edges(files: &BTreeMap<ModPath, FileRefs>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, refs) in files {
        let uses = refs.imports.iter().map(|i| (&i.path, i.name == "*"));
        let paths = refs.paths.iter().map(|p| (p, false));
        for (p, glob) in uses.chain(paths) {
            let Some((to, is_mod)) = resolve(files, m, p, 0) else {
                continue;
            };
            if to == *m || (is_mod && !glob) {
                continue;
            }
            let to = files[&to].rel.clone();
            let why = p.join("::") + if glob { "::*" } else { "" };
            let out = edges.entry(refs.rel.clone()).or_default();
            out.entry(to).or_insert(why);
        }
    }
    edges
}

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn cycles<T>(edges: &BTreeMap<String, BTreeMap<String, T>>) -> Vec<Vec<String>> {
    struct Tarjan<'a, T> {
        edges: &'a BTreeMap<String, BTreeMap<String, T>>,
        index: BTreeMap<&'a str, (usize, usize)>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a, T> Tarjan<'a, T> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flat_map(|m| m.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[v].1.min(self.index[w].1);
                    self.index.get_mut(v).expect("visited").1 = low;
                } else if self.on_stack.contains(w) {
                    let low = self.index[v].1.min(self.index[w].0);
                    self.index.get_mut(v).expect("visited").1 = low;
                }
            }
            if self.index[v].0 == self.index[v].1 {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.found.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

#[test]
fn the_cycle_finder_finds_a_three_file_circle_through_re_exports() {
    let src = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let sources = [
        src("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\npub use c::C;\n"),
        src("a.rs", "use crate::b::B;\npub struct A;\n"),
        src("b/mod.rs", "mod inner;\npub use self::inner::B;\n"),
        src(
            "b/inner.rs",
            "pub struct B;\nfn f() {\n    crate::C::new();\n}\n",
        ),
        src("c.rs", "pub struct C;\nfn g() {\n    let _ = super::a::A;\n}\n"),
        src(
            "d.rs",
            "use super::{a::{self, A}, b};\n// crate::d::x\nfn h() {\n    let _ = \"crate::c::C\";\n}\n#[cfg(test)]\nmod tests {\n    use crate::d::*;\n}\n",
        ),
    ];
    let files = crate_files(&sources);
    let edges = import_edges(&files);
    let of = |f: &str| edges.get(f).map(|m| m.keys().cloned().collect::<Vec<_>>());
    assert_eq!(of("d.rs"), Some(vec!["a.rs".to_string()]), "{edges:?}");
    assert_eq!(of("lib.rs"), Some(vec!["c.rs".to_string()]), "{edges:?}");
    assert_eq!(
        cycles(&edges),
        vec![vec!["a.rs", "b/inner.rs", "c.rs"]],
        "{edges:?}"
    );
    // Cut one edge and the circle is gone.
    let mut cut = edges.clone();
    cut.get_mut("c.rs")
        .expect("c.rs has an edge")
        .remove("a.rs");
    assert!(cycles(&cut).is_empty(), "{cut:?}");
}

/// Import circles known today, which must only shrink: each a crate's `src/` and the sorted
/// files of one strongly connected component. The test fails on a circle not listed here
/// and on a listed one that no longer exists (delete its line); a circle that loses a file
/// is a changed line. Most are a folder's `mod.rs` that calls its children and holds what
/// they share (`super::X`): moving the shared part into a leaf file of its own cuts them.
/// When a folder moves to another crate, its line moves with it (the key names the crate).
const KNOWN_CYCLES: &[&str] = &[];

#[test]
fn no_import_cycle_among_a_crates_files() {
    let mut found = BTreeMap::new();
    for root in source_roots() {
        let mut paths = Vec::new();
        rust_files(&root, &mut paths);
        let sources: Vec<(String, String)> = paths
            .iter()
            .map(|f| {
                let rel = f.strip_prefix(&root).expect("under its root");
                let text = std::fs::read_to_string(f).expect("read a source file");
                (rel.display().to_string(), text)
            })
            .collect();
        let edges = import_edges(&crate_files(&sources));
        let name = root
            .strip_prefix(repo())
            .unwrap_or(&root)
            .display()
            .to_string();
        for scc in cycles(&edges) {
            let mut why = Vec::new();
            for a in &scc {
                for (b, path) in edges.get(a).into_iter().flatten() {
                    if scc.contains(b) {
                        why.push(format!("    {a} -> {b} ({path})"));
                    }
                }
            }
            found.insert(format!("{name}: {}", scc.join(" ")), why.join("\n"));
        }
    }
    let known: BTreeSet<&str> = KNOWN_CYCLES.iter().copied().collect();
    let new: Vec<String> = found
        .iter()
        .filter(|(k, _)| !known.contains(k.as_str()))
        .map(|(k, why)| format!("{k}\n{why}"))
        .collect();
    let gone: Vec<&&str> = KNOWN_CYCLES
        .iter()
        .filter(|k| !found.contains_key(**k))
        .collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "import cycles (files of one strongly connected component, then its edges):\n{}\n\
         allow-listed cycles that no longer exist (remove them from KNOWN_CYCLES):\n{gone:?}",
        new.join("\n")
    );
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

/// The lines of `text` (before its `#[cfg(test)] mod`) where a `format!("--…")` is an
/// argument being built: handed to `.arg(`, `.args(`, `.push(`, `.extend(`, opening a list
/// (`vec![`, `[`), or alone on its line inside a list opened by a line ending in `[`. A
/// command line for another process is derived from its clap group (`tchrun::argv`), so a
/// flag's spelling is its `#[arg]` alone (issue 47). Messages naming a flag are not argv, nor
/// is a format string with a space in it (`"--recipe {}"`: words for people; one argument
/// never holds a flag and its value apart).
fn hand_built_argv(text: &str) -> Vec<(usize, String)> {
    const AT: &str = "format!(\"--";
    const BUILDS: &[&str] = &[".arg(", ".args(", ".push(", ".extend(", "["];
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut in_list = false;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if t == "#[cfg(test)]" && next.starts_with("mod ") && !next.ends_with(';') {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let mut rest = *line;
        let mut found = false;
        while let Some(k) = rest.find(AT) {
            let before = rest[..k].trim_end();
            rest = &rest[k + AT.len()..];
            let literal = rest.split('"').next().unwrap_or("");
            let built =
                BUILDS.iter().any(|b| before.ends_with(b)) || (in_list && before.is_empty());
            found |= built && !literal.contains(' ');
        }
        if found {
            out.push((i + 1, t.to_string()));
        }
        if t.ends_with('[') {
            in_list = true;
        } else if t.starts_with(']') {
            in_list = false;
        }
    }
    out
}

#[test]
fn the_argv_finder_finds_hand_built_flags_and_not_messages() {
    let text = r#"fn a(v: &mut Vec<String>, c: &mut Command, n: u32) {
    v.push(format!("--nodes={n}"));
    c.arg(format!("--json={}", p.display()));
    let w = vec![format!("--phase={}", x)];
    v.extend([
        "--mpi=pmix".into(),
        format!("--ntasks={n}"),
    ]);
    let e = JobError::invalid(format!("--hostfile {e}"));
    out.push((format!("--{name}"), was, is, fix));
    let words = vec![format!("--recipe {}", r)];
    // v.push(format!("--in-a-comment"));
}
#[cfg(test)]
mod tests {
    fn t() { v.push(format!("--in-a-test")); }
}
"#;
    let found: Vec<usize> = hand_built_argv(text).iter().map(|(n, _)| *n).collect();
    assert_eq!(found, [2, 3, 4, 7]);
}

#[test]
fn no_hand_formatted_flag_in_a_command_line_outside_argv() {
    let mut found = Vec::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for f in files {
            let rel = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
            if rel == "src/argv.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("read a source file");
            for (n, line) in hand_built_argv(&text) {
                found.push(format!("{rel}:{n}: {line}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a flag formatted by hand into a command line: derive the argv from the flags' clap \
         group instead (`tchrun::argv::argv`, `argv_changed`, `flag`; `named` for a flag whose \
         name is data):\n{}",
        found.join("\n")
    );
}

/// The `TCHRUN_*` variables still read by more than one `#[arg]` (issue 47: each variable one
/// declaration, a shared group flattened where several commands take it). The list only
/// shrinks: a variable declared twice that is not in it fails, and so does one in it that is
/// declared once now.
const KNOWN_DUPLICATE_ENVS: &[&str] = &[
    "TCHRUN_CONSOLE",
    "TCHRUN_DEVICE",
    "TCHRUN_DRY_RUN",
    "TCHRUN_IFNAME",
    "TCHRUN_LOG_DIR",
    "TCHRUN_MAX_IMAGE_PIXELS",
    "TCHRUN_MODEL",
    "TCHRUN_NODES",
    "TCHRUN_OUTPUT",
    "TCHRUN_PROCS_PER_NODE",
    "TCHRUN_SEED",
    "TCHRUN_SKIP_BAD_IMAGES",
    "TCHRUN_WORKER",
];

/// The `env = "TCHRUN_..."` of a file's `#[arg]`s outside its tests and comments: each
/// variable's name, once per declaration.
fn arg_envs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    // Inside an inline test module: its braces open so far.
    let mut test_module: Option<usize> = None;
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if let Some(open) = test_module {
            let open = (open + line.matches('{').count()).saturating_sub(line.matches('}').count());
            // The `mod x {` line (next after the attribute) opens it; its last `}` ends it.
            test_module = (open > 0).then_some(open);
            continue;
        }
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            test_module = Some(0);
            continue;
        }
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = *line;
        while let Some(at) = rest.find("env = \"TCHRUN_") {
            let name = &rest[at + "env = \"".len()..];
            let end = name.find('"').unwrap_or(name.len());
            out.push(name[..end].to_string());
            rest = &name[end..];
        }
    }
    out
}

#[test]
fn each_tchrun_variable_is_on_one_arg() {
    assert_eq!(
        arg_envs("#[arg(long, env = \"TCHRUN_A\")]\n// env = \"TCHRUN_B\"\n#[cfg(test)]\nmod tests {\nfn f() {\n#[arg(env = \"TCHRUN_C\")]\n}\n}\n#[arg(\n  env = \"TCHRUN_A\",\n)]"),
        ["TCHRUN_A", "TCHRUN_A"],
        "the finder counts declarations, not comments or tests"
    );
    let mut count: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for root in source_roots() {
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            for name in arg_envs(&text) {
                let at = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
                count.entry(name).or_default().push(at);
            }
        }
    }
    let twice: BTreeMap<&String, &Vec<String>> =
        count.iter().filter(|(_, v)| v.len() > 1).collect();
    let known: BTreeSet<&str> = KNOWN_DUPLICATE_ENVS.iter().copied().collect();
    let new: Vec<String> = twice
        .iter()
        .filter(|(k, _)| !known.contains(k.as_str()))
        .map(|(k, v)| format!("{k}: {v:?}"))
        .collect();
    let gone: Vec<&&str> = KNOWN_DUPLICATE_ENVS
        .iter()
        .filter(|k| !twice.contains_key(&k.to_string()))
        .collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "TCHRUN_* variables on more than one #[arg] (give each one declaration: a shared \
         #[derive(clap::Args)] group):\n{}\nlisted in KNOWN_DUPLICATE_ENVS but declared once now \
         (remove them):\n{gone:?}",
        new.join("\n")
    );
}
