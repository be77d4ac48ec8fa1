//! Where an installed `tchrun-worker` finds libtorch: the `torch` package of the environment it
//! was installed into (the wheel puts both binaries in the environment's `bin/`; venvs and
//! conda environments alike keep packages in `lib/pythonX.Y/site-packages`). The wheel's
//! `$ORIGIN`-relative RUNPATH is `runpath()`; the launcher's pre-flight reads the same places
//! (`env_torch`) and refuses a torch of another series before any rank starts, where the
//! dynamic loader would otherwise fail with a missing library or symbol.

use std::path::{Path, PathBuf};

/// The torch series the binaries are built for (tch 0.24 binds libtorch 2.11's API).
pub const TORCH_SERIES: &str = "2.11";

/// The Python versions torch 2.11 ships wheels for, in RUNPATH order (`t`: free-threaded).
pub const PYTHONS: &[&str] = &["3.10", "3.11", "3.12", "3.13", "3.14", "3.13t", "3.14t"];

/// `torch/lib` of an environment, relative to its `bin/`, one per Python version.
pub fn torch_lib_dirs() -> Vec<String> {
    PYTHONS
        .iter()
        .map(|v| format!("../lib/python{v}/site-packages/torch/lib"))
        .collect()
}

/// The RUNPATH of an installed binary (`patchelf --set-rpath`): `$ORIGIN/` + each of
/// `torch_lib_dirs`, colon-separated.
pub fn runpath() -> String {
    torch_lib_dirs()
        .iter()
        .map(|d| format!("$ORIGIN/{d}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the environment of a `bin/` folder holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvTorch {
    /// Not an environment (no `../lib/python3.*`): a build tree, whose binaries carry an
    /// absolute RUNPATH; nothing to check.
    NotAnEnv,
    /// The first `torch/lib` of `torch_lib_dirs` that holds libtorch, and its version.
    Found { dir: PathBuf, version: String },
    /// An environment without torch.
    Missing { env: PathBuf },
}

/// The torch the binaries in `bin` load, as the dynamic loader would pick it.
pub fn env_torch(bin: &Path) -> EnvTorch {
    let Some(env) = bin.parent() else {
        return EnvTorch::NotAnEnv;
    };
    let has_python = std::fs::read_dir(env.join("lib"))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("python3"))
        })
        .unwrap_or(false);
    if !has_python {
        return EnvTorch::NotAnEnv;
    }
    for d in torch_lib_dirs() {
        let lib = bin.join(&d);
        if lib.join("libtorch_cpu.so").is_file() {
            let torch = lib.parent().map(Path::to_path_buf).unwrap_or(lib.clone());
            let version = std::fs::read_to_string(torch.join("version.py"))
                .ok()
                .and_then(|t| version_of(&t))
                .unwrap_or_else(|| "unknown".into());
            return EnvTorch::Found {
                dir: normalize(&torch),
                version,
            };
        }
    }
    EnvTorch::Missing {
        env: env.to_path_buf(),
    }
}

/// `bin/../lib/...` without the `..` (for messages).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `__version__` of torch's `version.py`.
pub fn version_of(version_py: &str) -> Option<String> {
    version_py.lines().find_map(|l| {
        l.strip_prefix("__version__ = ")
            .map(|v| v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
    })
}

/// Whether `version` (e.g. `2.11.0+cu130`) is of `TORCH_SERIES`.
pub fn is_supported(version: &str) -> bool {
    let mut parts = version.split('.');
    let series = TORCH_SERIES.split('.');
    series.into_iter().all(|s| parts.next() == Some(s))
}

/// The environment's torch cannot serve these binaries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TorchMismatch {
    #[error(
        "tchrun {tchrun} is built for torch {TORCH_SERIES} but this environment has torch {found} \
         ({dir}); fix: `pip install 'torch=={TORCH_SERIES}.*'` in this environment, or install \
         tchrun into an environment with torch {TORCH_SERIES}",
        tchrun = crate::VERSION,
        dir = dir.display()
    )]
    Version { found: String, dir: PathBuf },
    #[error(
        "no torch in the environment {env} (tchrun-worker loads libtorch from \
         lib/pythonX.Y/site-packages/torch/lib there); fix: `pip install 'torch=={TORCH_SERIES}.*'` \
         in this environment",
        env = env.display()
    )]
    Missing { env: PathBuf },
}

/// `Ok` when the binaries in `bin` will find a torch of `TORCH_SERIES` (or are not installed
/// in an environment).
pub fn check(bin: &Path) -> Result<(), TorchMismatch> {
    match env_torch(bin) {
        EnvTorch::NotAnEnv => Ok(()),
        EnvTorch::Found { version, .. } if is_supported(&version) => Ok(()),
        EnvTorch::Found { version, dir } => Err(TorchMismatch::Version {
            found: version,
            dir,
        }),
        EnvTorch::Missing { env } => Err(TorchMismatch::Missing { env }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(version: Option<&str>, py: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("bin")).unwrap();
        let site = t.path().join(format!("lib/python{py}/site-packages"));
        std::fs::create_dir_all(&site).unwrap();
        if let Some(v) = version {
            std::fs::create_dir_all(site.join("torch/lib")).unwrap();
            std::fs::write(site.join("torch/lib/libtorch_cpu.so"), b"").unwrap();
            std::fs::write(
                site.join("torch/version.py"),
                format!("from typing import Optional\n__version__ = '{v}'\ngit_version = 'x'\n"),
            )
            .unwrap();
        }
        t
    }

    #[test]
    fn versions_of_the_series() {
        assert!(is_supported("2.11.0"));
        assert!(is_supported("2.11.0+cu130"));
        assert!(is_supported("2.11.1+cpu"));
        assert!(!is_supported("2.1.0"));
        assert!(!is_supported("2.10.0"));
        assert!(!is_supported("2.110.0"));
        assert!(!is_supported("unknown"));
    }

    #[test]
    fn the_environments_torch_is_checked() {
        let ok = env_with(Some("2.11.0+cu130"), "3.12");
        assert_eq!(check(&ok.path().join("bin")), Ok(()));
        let old = env_with(Some("2.10.0"), "3.11");
        let e = check(&old.path().join("bin")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("torch 2.10.0") && text.contains("torch==2.11.*"),
            "{text}"
        );
        assert!(!text.contains(".."), "{text}");
        let none = env_with(None, "3.10");
        assert!(matches!(
            check(&none.path().join("bin")),
            Err(TorchMismatch::Missing { .. })
        ));
        // A build tree: no lib/python3.* beside bin/.
        let tree = tempfile::tempdir().unwrap();
        assert_eq!(check(&tree.path().join("release")), Ok(()));
    }

    #[test]
    fn the_runpath_covers_every_python() {
        let r = runpath();
        assert!(r.starts_with("$ORIGIN/../lib/python3.10/site-packages/torch/lib:"));
        assert_eq!(r.split(':').count(), PYTHONS.len());
    }
}
