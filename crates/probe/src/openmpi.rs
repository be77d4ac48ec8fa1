//! Where Open MPI is on this node, without loading it: `tchrun-worker` loads `libmpi.so.40`
//! at run time only when it was started under MPI (`worker/src/comm/mpi.rs` tries
//! `libmpi_candidates` in order), and the launcher refuses `--launcher mpirun` before launch
//! when `missing` names something (exit 2), instead of ranks that cannot start.
//! Open MPI 4.x and 5.x share the soname and ABI; `module load openmpi` puts `mpirun` on
//! `PATH` and its `lib/` on `LD_LIBRARY_PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The soname of Open MPI 4.x and 5.x's library.
pub const LIBMPI: &str = "libmpi.so.40";

/// The program that starts MPI ranks.
pub const MPIRUN: &str = "mpirun";

/// The search path variable (`tchrun::env::PATH`).
const PATH: &str = "PATH";

/// The system's library folders the dynamic loader searches after its cache.
const SYSTEM_DIRS: &[&str] = &[
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib",
    "/usr/lib",
];

/// The loader's cache of the system's libraries.
const LD_SO_CACHE: &str = "/etc/ld.so.cache";

fn split(v: Option<OsString>) -> Vec<PathBuf> {
    v.map(|p| {
        std::env::split_paths(&p)
            .filter(|d| !d.as_os_str().is_empty())
            .collect()
    })
    .unwrap_or_default()
}

/// `mpirun` on `PATH` (a regular file; a program covered by `/dev/null` is not one).
pub fn mpirun(get: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    split(get(PATH))
        .into_iter()
        .map(|d| d.join(MPIRUN))
        .find(|p| p.is_file())
}

/// The `lib` folders of Open MPI's installation prefixes: `$OPAL_PREFIX` and the one
/// `mpirun` lives in (`PREFIX/bin/mpirun`, links followed).
fn prefix_libs(get: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = get("OPAL_PREFIX").map(PathBuf::from).into_iter().collect();
    if let Some(m) = mpirun(get) {
        for p in [Some(m.clone()), m.canonicalize().ok()]
            .into_iter()
            .flatten()
        {
            if let Some(prefix) = p.parent().and_then(Path::parent) {
                prefixes.push(prefix.to_path_buf());
            }
        }
    }
    let mut libs = Vec::new();
    for p in prefixes {
        for l in ["lib", "lib64"] {
            let d = p.join(l);
            if !libs.contains(&d) {
                libs.push(d);
            }
        }
    }
    libs
}

/// What the worker passes to `dlopen`, in order: the bare soname first (the loader's own
/// search: `LD_LIBRARY_PATH`, its cache, the system folders), then `libmpi.so.40` in the
/// prefixes of `prefix_libs` that hold it.
pub fn libmpi_candidates(get: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut c = vec![PathBuf::from(LIBMPI)];
    c.extend(
        prefix_libs(get)
            .into_iter()
            .map(|d| d.join(LIBMPI))
            .filter(|p| p.is_file()),
    );
    c
}

/// The paths of `libmpi.so.40` the loader's cache names.
fn cached() -> Vec<PathBuf> {
    let Ok(bytes) = std::fs::read(LD_SO_CACHE) else {
        return Vec::new();
    };
    let suffix = format!("/{LIBMPI}");
    bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| s.starts_with('/') && s.ends_with(&suffix))
        .map(PathBuf::from)
        .collect()
}

/// Where `libmpi.so.40` is, as the worker's `dlopen` would find it (for messages and the
/// launcher's check; the worker asks the loader itself).
pub fn find_libmpi(get: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let dirs = split(get("LD_LIBRARY_PATH"));
    let in_dirs = |dirs: &[PathBuf]| dirs.iter().map(|d| d.join(LIBMPI)).find(|p| p.is_file());
    in_dirs(&dirs)
        .or_else(|| cached().into_iter().find(|p| p.is_file()))
        .or_else(|| {
            let sys: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
            in_dirs(&sys)
        })
        .or_else(|| in_dirs(&prefix_libs(get)))
}

/// What of Open MPI this node lacks for `--launcher mpirun`, or `None` when both `mpirun`
/// and `libmpi.so.40` are there.
pub fn missing(get: &dyn Fn(&str) -> Option<OsString>) -> Option<String> {
    let no_mpirun = mpirun(get).is_none();
    let no_lib = find_libmpi(get).is_none();
    let what = match (no_mpirun, no_lib) {
        (false, false) => return None,
        (true, true) => format!("{MPIRUN} is not on PATH and {LIBMPI} is not found"),
        (true, false) => format!("{MPIRUN} is not on PATH"),
        (false, true) => format!(
            "{LIBMPI} is not found (looked in LD_LIBRARY_PATH, {LD_SO_CACHE}, the system's \
             library folders and beside {MPIRUN})"
        ),
    };
    Some(format!("no Open MPI (4.x or 5.x) on this node: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    #[test]
    fn a_prefix_install_is_found_beside_mpirun() {
        let t = tempfile::tempdir().unwrap();
        let prefix = t.path().join("openmpi-5.0");
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::create_dir_all(prefix.join("lib")).unwrap();
        std::fs::write(prefix.join("bin/mpirun"), b"").unwrap();
        let empty = t.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let get = env(&[("PATH", &prefix.join("bin"))]);
        assert_eq!(mpirun(&get), Some(prefix.join("bin/mpirun")));
        // No library yet: only the bare soname for the loader.
        assert_eq!(libmpi_candidates(&get), vec![PathBuf::from(LIBMPI)]);
        std::fs::write(prefix.join("lib").join(LIBMPI), b"").unwrap();
        assert_eq!(
            libmpi_candidates(&get),
            vec![PathBuf::from(LIBMPI), prefix.join("lib").join(LIBMPI)]
        );
        assert!(find_libmpi(&get).is_some());
        assert_eq!(missing(&get), None);
        let none = env(&[("PATH", &empty)]);
        let m = missing(&none).unwrap();
        assert!(m.contains("mpirun is not on PATH"), "{m}");
    }
}
