//! The points of a sweep, pure: `--param NAME=V1,V2` lists and `--param-file` lines to points
//! (their flags and a short readable name each), and the flags a sweep sets itself, which no
//! point may vary. Knows no file system and no parser of `train`'s flags.
use serde::{Deserialize, Serialize};

/// Flags the sweep sets for every run itself (each run's `--output`, its resume) or that
/// would make the runs share a file: no point may vary them, nor may the flags after `--`
/// give them.
pub const FIXED: &[(&str, &str)] = &[
    (
        "output",
        "each run's --output is DIR/<name> (the sweep's --output)",
    ),
    (
        "output-dir",
        "each run's --output is DIR/<name> (the sweep's --output)",
    ),
    ("log-dir", "each run keeps its logs in DIR/<name>/logs"),
    (
        "resume",
        "re-running the sweep resumes its interrupted runs itself",
    ),
    (
        "overwrite",
        "a sweep keeps its finished runs; use another --output to start over",
    ),
    (
        "script",
        "the sweep writes one array script, DIR/sweep.sbatch",
    ),
    (
        "submit",
        "it is the sweep's own flag: tchrun sweep --sbatch --submit",
    ),
    (
        "dry-run",
        "a sweep has no dry run; --sbatch without --submit writes the script only",
    ),
];

/// Why `name` cannot vary, if it cannot.
pub fn fixed(name: &str) -> Option<&'static str> {
    FIXED.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// One `--param NAME=V1,V2,...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Param {
    /// The flag's long name without dashes (`lr`, `batch-size`).
    pub name: String,
    pub values: Vec<String>,
}

/// Parses `--param`'s value, naming what is wrong.
pub fn parse_param(s: &str) -> Result<Param, String> {
    let Some((name, values)) = s.split_once('=') else {
        return Err(format!(
            "--param {s:?}: expected NAME=V1,V2,... (a flag of `tchrun train` without its dashes, \
             e.g. lr=0.1,0.05)"
        ));
    };
    let name = name.trim().trim_start_matches('-').to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(format!(
            "--param {s:?}: {name:?} is not a flag name (lowercase letters, digits and '-', \
             e.g. lr or batch-size)"
        ));
    }
    if let Some(why) = fixed(&name) {
        return Err(format!(
            "--param {name}: --{name} cannot vary in a sweep: {why}"
        ));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        return Err(format!(
            "--param {name}: an empty value in {s:?}; give the values separated by commas, \
             e.g. {name}=0.1,0.05"
        ));
    }
    Ok(Param { name, values })
}

/// One run of the sweep: the flags it adds to the common ones, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// The run's folder in the sweep's `--output`.
    pub name: String,
    /// The flags (`--lr=0.1`), after the flags every run gets.
    pub flags: Vec<String>,
    /// Where the flags came from, for messages: `--param lr=0.1, batch-size=16` or
    /// `--param-file F line 3`.
    pub origin: String,
}

/// A flag of a point: its name (no dashes) and value (None for a switch).
pub fn flag_pairs(flags: &[String]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut i = 0;
    while i < flags.len() {
        let f = &flags[i];
        if let Some(rest) = f.strip_prefix("--") {
            match rest.split_once('=') {
                Some((n, v)) => out.push((n.to_string(), Some(v.to_string()))),
                None => match flags.get(i + 1).filter(|v| !v.starts_with("--")) {
                    Some(v) => {
                        out.push((rest.to_string(), Some(v.clone())));
                        i += 1;
                    }
                    None => out.push((rest.to_string(), None)),
                },
            }
        } else if let Some((_, Some(v))) = out.last_mut() {
            // A second value of the flag before (rare): kept in the name.
            v.push('+');
            v.push_str(f);
        }
        i += 1;
    }
    out
}

/// A value as a part of a folder name: a path's last component, characters other than
/// letters, digits, `.`, `+` and `-` as `-`, at most 24 characters.
fn value_part(v: &str) -> String {
    let base = v.trim_end_matches('/').rsplit('/').next().unwrap_or(v);
    let s: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".+-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(24)
        .collect();
    if s.is_empty() {
        "x".into()
    } else {
        s
    }
}

/// The short readable name of a point's flags: `lr0.1_batch-size16`, a switch by its name.
pub fn name_of(flags: &[String]) -> String {
    let parts: Vec<String> = flag_pairs(flags)
        .into_iter()
        .map(|(n, v)| match v {
            Some(v) => format!("{n}{}", value_part(&v)),
            None => n,
        })
        .collect();
    let mut name = parts.join("_");
    if name.is_empty() {
        name = "run".into();
    }
    // Folder names stay short; the index added by `unique_names` tells cut names apart.
    name.chars().take(80).collect()
}

/// Makes the names unique (and never `logs` or hidden), appending `-<n>` where needed;
/// `taken` are names already in use (earlier points of an extended sweep).
pub fn unique_names(points: &mut [Point], taken: &[String]) {
    let mut used: Vec<String> = taken.to_vec();
    for p in points.iter_mut() {
        let base = p.name.trim_start_matches('.').to_string();
        let base = if base.is_empty() || base == "logs" {
            format!("run-{base}")
        } else {
            base
        };
        let mut name = base.clone();
        let mut n = 2;
        while used.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        used.push(name.clone());
        p.name = name;
    }
}

/// The grid's points: every combination, the first `--param` varying slowest.
pub fn grid(params: &[Param]) -> Vec<Point> {
    let mut points = vec![Point {
        name: String::new(),
        flags: Vec::new(),
        origin: String::new(),
    }];
    for p in params {
        let mut next = Vec::with_capacity(points.len() * p.values.len());
        for base in &points {
            for v in &p.values {
                let mut q = base.clone();
                q.flags.push(tchrun::argv::named(&p.name, v));
                if !q.origin.is_empty() {
                    q.origin.push_str(", ");
                }
                q.origin.push_str(&format!("{}={v}", p.name));
                next.push(q);
            }
        }
        points = next;
    }
    for p in &mut points {
        p.name = name_of(&p.flags);
        p.origin = format!("--param {}", p.origin);
    }
    points
}

/// `--param-file`'s lines (one run's flags each, shell words; blank lines and `#` comments
/// skipped) as points, each line's flags checked against the flags a sweep sets itself.
pub fn file_points(file: &str, text: &str) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let at = format!("--param-file {file} line {}", i + 1);
        let flags = shell_words::split(l).map_err(|e| format!("{at}: {e}: {l:?}"))?;
        for (n, _) in flag_pairs(&flags) {
            if let Some(why) = fixed(&n) {
                return Err(format!("{at}: --{n} cannot vary in a sweep: {why}"));
            }
        }
        if let Some(w) = flags.iter().find(|f| !f.starts_with('-')) {
            if flags.first() == Some(w) {
                return Err(format!(
                    "{at}: {w:?} is not a flag; each line holds the flags of one run, e.g. --lr 0.1 --batch-size 32"
                ));
            }
        }
        points.push(Point {
            name: name_of(&flags),
            flags,
            origin: at,
        });
    }
    if points.is_empty() {
        return Err(format!(
            "--param-file {file}: no runs in it; write one run's flags a line, e.g. --lr 0.1 --batch-size 32"
        ));
    }
    Ok(points)
}

/// Every line of the file combined with every point of the grid (either may be absent).
pub fn combine(file: Option<Vec<Point>>, grid_points: Vec<Point>) -> Vec<Point> {
    let Some(lines) = file else {
        return grid_points;
    };
    if grid_points.len() == 1 && grid_points[0].flags.is_empty() {
        return lines;
    }
    let mut out = Vec::new();
    for l in &lines {
        for g in &grid_points {
            let mut flags = l.flags.clone();
            flags.extend(g.flags.iter().cloned());
            out.push(Point {
                name: name_of(&flags),
                flags,
                origin: format!("{}, {}", l.origin, g.origin),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_and_refuse_what_cannot_vary() {
        let p = parse_param("lr=0.1, 0.05").expect("ok");
        assert_eq!(p.name, "lr");
        assert_eq!(p.values, ["0.1", "0.05"]);
        assert_eq!(
            parse_param("--batch-size=16").expect("ok").name,
            "batch-size"
        );
        assert!(parse_param("lr")
            .unwrap_err()
            .contains("expected NAME=V1,V2"));
        assert!(parse_param("lr=0.1,,2")
            .unwrap_err()
            .contains("an empty value"));
        assert!(parse_param("LR=1")
            .unwrap_err()
            .contains("is not a flag name"));
        let e = parse_param("output=a,b").unwrap_err();
        assert!(e.contains("--param output: --output cannot vary"), "{e}");
        assert!(parse_param("resume=x")
            .unwrap_err()
            .contains("--resume cannot vary"));
    }

    #[test]
    fn the_grid_is_every_combination_with_readable_unique_names() {
        let params = [
            parse_param("lr=0.1,0.05").expect("ok"),
            parse_param("batch-size=16,32").expect("ok"),
        ];
        let mut g = grid(&params);
        unique_names(&mut g, &[]);
        let names: Vec<&str> = g.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lr0.1_batch-size16",
                "lr0.1_batch-size32",
                "lr0.05_batch-size16",
                "lr0.05_batch-size32"
            ]
        );
        assert_eq!(g[1].flags, ["--lr=0.1", "--batch-size=32"]);
        assert_eq!(g[1].origin, "--param lr=0.1, batch-size=32");
        // A model directory's path is named by its last component; clashes get an index.
        let mut g = grid(&[parse_param("model=/m/a/r18,/n/b/r18/").expect("ok")]);
        unique_names(&mut g, &["x".into()]);
        assert_eq!(g[0].name, "modelr18");
        assert_eq!(g[1].name, "modelr18-2");
        let mut g = grid(&[parse_param("opt=sgd").expect("ok")]);
        unique_names(&mut g, &["optsgd".into()]);
        assert_eq!(g[0].name, "optsgd-2");
    }

    #[test]
    fn param_file_lines_are_runs() {
        let text = "# lr and batch\n--lr 0.1 --batch-size 16\n\n--lr=0.2 --no-hflip\n";
        let pts = file_points("f.txt", text).expect("ok");
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].name, "lr0.1_batch-size16");
        assert_eq!(pts[1].name, "lr0.2_no-hflip");
        assert_eq!(pts[1].origin, "--param-file f.txt line 4");
        let e = file_points("f.txt", "--lr 1 --output x\n").unwrap_err();
        assert!(e.contains("line 1: --output cannot vary"), "{e}");
        assert!(file_points("f.txt", "# none\n")
            .unwrap_err()
            .contains("no runs"));
        assert!(file_points("f.txt", "lr 0.1\n")
            .unwrap_err()
            .contains("is not a flag"));
        let both = combine(Some(pts), grid(&[parse_param("seed=1,2").expect("ok")]));
        assert_eq!(both.len(), 4);
        assert_eq!(both[3].flags, ["--lr=0.2", "--no-hflip", "--seed=2"]);
    }
}
